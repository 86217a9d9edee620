"""Hard authorization over the execution graph: inherited permission scopes and revocation.

MAP-Graph (arXiv 2608.10509) separates *hard authorization* ("may this principal use this
record?") from graded trust (:mod:`lab.provenance.trust`). This module answers the first
question, before any ranking.

Definitions
-----------
principal scopes
    An agent (a principal) holds its own id as a scope plus every scope granted to it with
    :meth:`AccessPolicy.grant`. Grants are stored on the agent node itself
    (``attributes["scopes"]``, a sorted list) through :meth:`ProvenanceGraph.update_node`, so they
    persist and every grant or revocation of a grant is a version in the node's history.
    Delegation (``acted_on_behalf_of``) and ownership confer **no** scopes.
effective labels
    ``effective_labels(n) = labels(n) ∪ ⋃ labels(a) for a in ancestors(n)`` along the lineage
    (:data:`lab.provenance.graph.LINEAGE`). A record is readable only by a principal holding
    **every** label in that set (most-restrictive propagation: a summary of a private source
    is as private as the source). An empty set means public.
revocation
    :meth:`AccessPolicy.revoke_source` writes a new version of the source with ``valid=False``
    **and** ``attributes["revoked"] = True`` (plus ``revoked_reason``, ``revoked_at``). A node
    is *revoked* when it or any lineage ancestor has ``attributes["revoked"]`` true. (``valid=False``
    alone, e.g. from :meth:`ProvenanceGraph.invalidate`, is not a revocation: it only zeroes trust.)

Efficiency and freshness
------------------------
Effective labels and revocation come from the graph's *inherited index*
(:meth:`ProvenanceGraph.indexed`), which every write to the graph brings up to date in the same
transaction (the changed nodes and all their descendants are recomputed from their ancestor
closure, in topological order, strongly connected components merged). A check therefore reads
one row per candidate, and a revocation or a grant change takes effect on the very next call,
from this process or any other writing the same file. :func:`lineage_closure` plus
:func:`lab.provenance.lineage.propagate` compute the same from scratch (the tests compare them).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from lab.provenance.errors import ProvenanceError, UnknownNodeError
from lab.provenance.graph import Node, NodeType, ProvenanceGraph
from lab.provenance.lineage import Inherited, LineageClosure, propagate

__all__ = ["AccessError", "LineageClosure", "lineage_closure", "AccessPolicy"]


class AccessError(ProvenanceError, ValueError):
    """An access-policy call on the wrong kind of node (e.g. granting a scope to a non-agent)."""


def lineage_closure(graph: ProvenanceGraph, node_ids: Iterable[str]) -> LineageClosure:
    """The requested nodes and all their lineage ancestors (:meth:`ProvenanceGraph.lineage_closure`).

    Raises :class:`UnknownNodeError` if a requested id is not in the graph.
    """
    return graph.lineage_closure(node_ids)


class AccessPolicy:
    """Principals' scopes, revocation and the hard read filter over one :class:`ProvenanceGraph`.

    Examples
    --------
    >>> policy = AccessPolicy(graph)                    # doctest: +SKIP
    >>> policy.grant("bob", "finance")                  # doctest: +SKIP
    >>> ok, why = policy.can_read("bob", "m1")          # doctest: +SKIP
    >>> eligible, excluded = policy.eligible("bob", candidates)  # then rank ``eligible`` only
    """

    def __init__(self, graph: ProvenanceGraph):
        self.graph = graph

    # -- principals

    def _agent(self, agent: str) -> Node:
        node = self.graph.node(agent)
        if node.type != NodeType.AGENT:
            raise AccessError(f"{agent!r} is a {node.type.value}, not an agent (principal)")
        return node

    def scopes(self, agent: str) -> frozenset[str]:
        """The scopes ``agent`` holds: its own id plus its grants."""
        node = self._agent(agent)
        return frozenset({agent, *node.attributes.get("scopes", [])})

    def _set_grants(self, agent: str, scopes: set[str], reason: str) -> None:
        node = self._agent(agent)
        self.graph.update_node(agent, reason=reason, attributes={**node.attributes, "scopes": sorted(scopes)})

    def grant(self, agent: str, scope: str) -> None:
        """Let ``agent`` read records labelled ``scope`` (a new version of the agent node)."""
        current = set(self._agent(agent).attributes.get("scopes", []))
        if scope not in current:
            self._set_grants(agent, current | {scope}, f"grant {scope}")

    def revoke_grant(self, agent: str, scope: str) -> None:
        """Withdraw a scope granted to ``agent`` (its implicit own-id scope cannot be withdrawn)."""
        current = set(self._agent(agent).attributes.get("scopes", []))
        if scope in current:
            self._set_grants(agent, current - {scope}, f"revoke grant {scope}")

    # -- revocation

    def revoke_source(self, source_id: str, reason: str) -> Node:
        """Revoke a source: a new version with ``valid=False`` and ``attributes["revoked"]=True``,
        ``revoked_reason`` and ``revoked_at`` (epoch seconds). Every descendant is excluded at once."""
        node = self.graph.node(source_id)
        if node.type != NodeType.SOURCE:
            raise AccessError(f"{source_id!r} is a {node.type.value}, not a source")
        attrs = {**node.attributes, "revoked": True, "revoked_reason": reason, "revoked_at": time.time()}
        return self.graph.update_node(source_id, reason=f"revoked: {reason}", valid=False, attributes=attrs)

    # -- queries

    def effective_labels(self, node_id: str) -> frozenset[str]:
        """The node's labels united with every lineage ancestor's (empty: public)."""
        return frozenset(self.graph.indexed([node_id])[node_id][1].labels)

    def revoked(self, node_id: str) -> bool:
        """Whether the node or any lineage ancestor is revoked."""
        return self.graph.indexed([node_id])[node_id][1].revoked_by is not None

    @staticmethod
    def _decide(node_id: str, inh: Inherited, scopes: frozenset[str]) -> tuple[bool, str]:
        if inh.revoked_by is not None:
            where = "it is revoked" if inh.revoked_by == node_id else f"ancestor {inh.revoked_by!r} is revoked"
            return False, f"revoked: {where}"
        for lab in sorted(inh.labels):
            if lab not in scopes:
                carrier = inh.labels[lab]
                where = "the record itself" if carrier == node_id else f"ancestor {carrier!r}"
                return False, f"missing label {lab!r} (carried by {where})"
        return True, "readable"

    def can_read(self, agent: str, node_id: str) -> tuple[bool, str]:
        """``(True, "readable")`` or ``(False, reason)``: the first reason, revocation checked first,
        then the missing labels in sorted order, each with the node that carries it."""
        scopes = self.scopes(agent)
        return self._decide(node_id, self.graph.indexed([node_id])[node_id][1], scopes)

    def eligible(self, agent: str, candidate_ids: Iterable[str], *, closure: LineageClosure | None = None) -> tuple[list[str], dict[str, str]]:
        """Split candidates into ``(eligible, excluded)`` for ``agent``, in the candidates' order.

        This is the hard filter that runs **before** any ranking (MAP-Graph): callers rank only
        ``eligible``; ``excluded`` maps each refused id to the same reason :meth:`can_read` gives.
        One read of the inherited index serves all candidates; ``closure`` (a
        :func:`lineage_closure` covering them) computes from scratch instead.
        """
        scopes = self.scopes(agent)
        ids = list(dict.fromkeys(candidate_ids))
        if closure is not None:
            inherited = propagate(closure)
        else:
            inherited = {i: inh for i, (_, inh) in self.graph.indexed(ids).items()}
        ok: list[str] = []
        excluded: dict[str, str] = {}
        for i in ids:
            allowed, reason = self._decide(i, inherited[i], scopes)
            if allowed:
                ok.append(i)
            else:
                excluded[i] = reason
        return ok, excluded
