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
:func:`lineage_closure` loads the ancestor closure of *all* requested nodes with one recursive
SQL query plus one query for their bodies, and effective labels / revocation are propagated once
over that closure in topological order (strongly connected components are merged, so a cyclic
lineage is handled). Nothing is cached between calls: every :meth:`AccessPolicy.can_read` /
:meth:`AccessPolicy.eligible` reads the current graph, so a revocation or a grant change takes
effect on the very next call.
"""

from __future__ import annotations

import graphlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from lab.provenance.errors import ProvenanceError, UnknownNodeError
from lab.provenance.graph import Node, NodeType, ProvenanceGraph

__all__ = ["AccessError", "LineageClosure", "lineage_closure", "AccessPolicy"]


class AccessError(ProvenanceError, ValueError):
    """An access-policy call on the wrong kind of node (e.g. granting a scope to a non-agent)."""


@dataclass(frozen=True)
class LineageClosure:
    """The current nodes of an ancestor closure and its lineage edges (``parents[child]`` sorted)."""

    nodes: dict[str, Node]
    parents: dict[str, list[str]]

    def topological_components(self) -> list[list[str]]:
        """Strongly connected components of the lineage, ancestors first (singletons in a DAG)."""
        try:  # the usual case, a DAG: any topological order will do
            return [[n] for n in graphlib.TopologicalSorter(self.parents).static_order()]
        except graphlib.CycleError:
            pass
        g = nx.DiGraph()
        g.add_nodes_from(self.nodes)
        for child, ps in self.parents.items():
            g.add_edges_from((p, child) for p in ps)
        cond = nx.condensation(g)
        return [sorted(cond.nodes[c]["members"]) for c in nx.lexicographical_topological_sort(cond, key=str)]


def lineage_closure(graph: ProvenanceGraph, node_ids: Iterable[str]) -> LineageClosure:
    """The requested nodes and all their lineage ancestors, in one recursive query.

    Raises :class:`UnknownNodeError` if a requested id is not in the graph.
    """
    ids = list(dict.fromkeys(node_ids))
    conn = graph._conn  # read-only use of the store's connection: one query for the whole closure
    rows = conn.execute(
        "WITH RECURSIVE up(id) AS (SELECT value FROM json_each(?) "
        "UNION SELECT l.parent FROM lineage l JOIN up ON l.child = up.id) "
        "SELECT n.id, n.version, n.body FROM up JOIN nodes n ON n.id = up.id",
        (json.dumps(ids),),
    ).fetchall()
    nodes = {i: graph._parsed(i, version, body) for i, version, body in rows}
    missing = [i for i in ids if i not in nodes]
    if missing:
        raise UnknownNodeError(f"no node {missing[0]!r}")
    parents: dict[str, list[str]] = {i: [] for i in nodes}
    edge_rows = conn.execute(
        "SELECT DISTINCT child, parent FROM lineage WHERE child IN (SELECT value FROM json_each(?)) ORDER BY child, parent",
        (json.dumps(sorted(nodes)),),
    )
    for child, parent in edge_rows:
        if parent in nodes:
            parents[child].append(parent)
    return LineageClosure(nodes, parents)


def _is_revoked(node: Node) -> bool:
    return bool(node.attributes.get("revoked", False))


@dataclass(frozen=True)
class _Inherited:
    labels: dict[str, str]  # label -> the node carrying it (the record itself if it does, else an ancestor)
    revoked_by: str | None  # the record itself or an ancestor that is revoked


def _propagate(closure: LineageClosure) -> dict[str, _Inherited]:
    """Effective labels (with a carrier per label) and revocation, one pass in topological order."""
    out: dict[str, _Inherited] = {}
    for comp in closure.topological_components():
        members = set(comp)
        labels: dict[str, str] = {}
        revoked_by: str | None = None
        for n in comp:  # the component's own labels first (in a DAG: the record's own)
            for lab in sorted(closure.nodes[n].labels):
                labels.setdefault(lab, n)
            if revoked_by is None and _is_revoked(closure.nodes[n]):
                revoked_by = n
        for n in comp:
            for p in closure.parents[n]:
                if p in members:
                    continue
                inh = out[p]
                for lab, carrier in inh.labels.items():
                    labels.setdefault(lab, carrier)
                if revoked_by is None and inh.revoked_by is not None:
                    revoked_by = inh.revoked_by
        result = _Inherited(labels, revoked_by)
        for n in comp:
            out[n] = result
    return out


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
        return frozenset(_propagate(lineage_closure(self.graph, [node_id]))[node_id].labels)

    def revoked(self, node_id: str) -> bool:
        """Whether the node or any lineage ancestor is revoked."""
        return _propagate(lineage_closure(self.graph, [node_id]))[node_id].revoked_by is not None

    @staticmethod
    def _decide(node_id: str, inh: _Inherited, scopes: frozenset[str]) -> tuple[bool, str]:
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
        inh = _propagate(lineage_closure(self.graph, [node_id]))[node_id]
        return self._decide(node_id, inh, scopes)

    def eligible(self, agent: str, candidate_ids: Iterable[str], *, closure: LineageClosure | None = None) -> tuple[list[str], dict[str, str]]:
        """Split candidates into ``(eligible, excluded)`` for ``agent``, in the candidates' order.

        This is the hard filter that runs **before** any ranking (MAP-Graph): callers rank only
        ``eligible``; ``excluded`` maps each refused id to the same reason :meth:`can_read` gives.
        One closure query and one propagation pass serve all candidates (pass ``closure``, from
        :func:`lineage_closure` of the same candidates, to share it with other computations).
        """
        scopes = self.scopes(agent)
        ids = list(dict.fromkeys(candidate_ids))
        inherited = _propagate(closure if closure is not None else lineage_closure(self.graph, ids))
        ok: list[str] = []
        excluded: dict[str, str] = {}
        for i in ids:
            allowed, reason = self._decide(i, inherited[i], scopes)
            if allowed:
                ok.append(i)
            else:
                excluded[i] = reason
        return ok, excluded
