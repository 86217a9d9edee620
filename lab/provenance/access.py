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
    **and** ``attributes["revoked"] = True`` (plus ``revoked_reason``, ``revoked_at``). Revocation
    travels along the relations that carry content (``derived_from``, ``summarises``, ``used``,
    ``generated``): a summary or derivation of a revoked record is revoked with it. It does **not**
    travel along ``supports``: a claim supported by a revoked record and by another, surviving one
    stays readable on the survivor (the rollback-repair paper's independent-support check, arXiv
    2608.10502); a record whose *every* lineage parent is revoked is revoked. Exact definitions:
    :mod:`lab.provenance.lineage`. (``valid=False`` alone, from :meth:`ProvenanceGraph.invalidate`, is
    not a revocation: readers are not refused, but the record, and whatever loses all its support with
    it, is not used, and what carries its content is marked for re-derivation:
    :func:`lab.provenance.lineage.standing`.)

Efficiency and freshness
------------------------
Effective labels and revocation come from the graph's *inherited index*
(:meth:`ProvenanceGraph.indexed`), which every write to the graph brings up to date in the same
transaction (the changed nodes and all their descendants are recomputed from their ancestor
closure, in topological order, strongly connected components merged). A check therefore reads
one row per candidate, and a revocation or a grant change takes effect on the very next call,
from this process or any other writing the same file. :meth:`ProvenanceGraph.lineage_closure` plus
:func:`lab.provenance.lineage.inherited_rows` compute the same rows from scratch (the tests compare
them), and :meth:`AccessPolicy.filter` takes either.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from lab.provenance.errors import AccessError  # defined in errors.py; importable from here as before
from lab.provenance.graph import Node, NodeType, ProvenanceGraph
from lab.provenance.lineage import Inherited, principal_scopes, read_decision

__all__ = ["AccessError", "AccessPolicy"]


class AccessPolicy:
    """Principals' scopes, revocation and the hard read filter over one :class:`ProvenanceGraph`.

    Parameters
    ----------
    graph : ProvenanceGraph
        The store whose agents, labels and inherited index the policy reads and writes.

    Examples
    --------
    >>> policy = AccessPolicy(graph)                    # doctest: +SKIP
    >>> policy.grant("bob", "finance")                  # doctest: +SKIP
    >>> ok, why = policy.can_read("bob", "m1")          # doctest: +SKIP
    >>> eligible, excluded = policy.eligible("bob", candidates)  # then rank ``eligible`` only
    >>> eligible, excluded = policy.filter("bob", graph.indexed(candidates))  # the same, on rows read already
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
        """The scopes ``agent`` holds: its own id plus its grants.

        Parameters
        ----------
        agent : str

        Raises
        ------
        UnknownNodeError
            No such node.
        AccessError
            ``agent`` is not an agent.
        """
        return principal_scopes(self._agent(agent))

    def _set_grants(self, agent: str, scopes: set[str], reason: str) -> None:
        node = self._agent(agent)
        self.graph.update_node(agent, reason=reason, attributes={**node.attributes, "scopes": sorted(scopes)})

    def grant(self, agent: str, scope: str) -> None:
        """Let ``agent`` read records labelled ``scope`` (a new version of the agent node).

        Parameters
        ----------
        agent : str
            An agent node id (else :class:`AccessError`).
        scope : str
            A label.
        """
        current = set(self._agent(agent).attributes.get("scopes", []))
        if scope not in current:
            self._set_grants(agent, current | {scope}, f"grant {scope}")

    def revoke_grant(self, agent: str, scope: str) -> None:
        """Withdraw a scope granted to ``agent`` (its implicit own-id scope cannot be withdrawn).

        Parameters
        ----------
        agent : str
            An agent node id (else :class:`AccessError`).
        scope : str
        """
        current = set(self._agent(agent).attributes.get("scopes", []))
        if scope in current:
            self._set_grants(agent, current - {scope}, f"revoke grant {scope}")

    # -- revocation

    def revoke_source(self, source_id: str, reason: str) -> Node:
        """Revoke a source: a new version with ``valid=False`` and ``attributes["revoked"]=True``,
        ``revoked_reason`` and ``revoked_at`` (epoch seconds).

        From the next read on, every record that carries its content, and every record left with no
        unrevoked lineage parent, is unreadable (module docstring); a claim it merely ``supports`` and
        that has another surviving support stays readable.

        Parameters
        ----------
        source_id : str
            A source node id (else :class:`AccessError`).
        reason : str
            Why; stored as ``revoked_reason`` and in the version's reason.

        Returns
        -------
        Node
            The new version.
        """
        node = self.graph.node(source_id)
        if node.type != NodeType.SOURCE:
            raise AccessError(f"{source_id!r} is a {node.type.value}, not a source")
        attrs = {**node.attributes, "revoked": True, "revoked_reason": reason, "revoked_at": time.time()}
        return self.graph.update_node(source_id, reason=f"revoked: {reason}", valid=False, attributes=attrs)

    # -- queries

    def effective_labels(self, node_id: str) -> frozenset[str]:
        """The node's labels united with every lineage ancestor's (empty: public).

        Parameters
        ----------
        node_id : str

        Raises
        ------
        UnknownNodeError
        """
        return frozenset(self.graph.indexed([node_id])[node_id][1].labels)

    def revoked(self, node_id: str) -> bool:
        """Whether the node is revoked: itself, through a carrying parent, or by losing every parent to
        revocation (module docstring).

        Parameters
        ----------
        node_id : str

        Raises
        ------
        UnknownNodeError
        """
        return self.graph.indexed([node_id])[node_id][1].revoked_by is not None

    def can_read(self, agent: str, node_id: str) -> tuple[bool, str]:
        """Whether ``agent`` may read ``node_id``.

        Parameters
        ----------
        agent : str
            An agent node id.
        node_id : str

        Returns
        -------
        (bool, str)
            ``(True, "readable")`` or ``(False, reason)``: the first reason, revocation checked first,
            then the missing labels in sorted order, each with the node that carries it
            (:func:`lab.provenance.lineage.read_decision`).

        Raises
        ------
        UnknownNodeError, AccessError
            Unknown node, or ``agent`` is not an agent.
        """
        return read_decision(node_id, self.graph.indexed([node_id])[node_id][1], self.scopes(agent))

    def filter(self, agent: str, rows: Mapping[str, tuple[Node, Inherited]]) -> tuple[list[str], dict[str, str]]:
        """The hard filter that runs **before** any ranking (MAP-Graph): split ``rows`` into what ``agent`` may read and what not.

        The one access check of the facet: :meth:`eligible`, the retriever
        (:class:`~lab.provenance.retrieve.Retriever`) and the action gate
        (:class:`~lab.provenance.gate.ActionGate`) all decide through it.

        Parameters
        ----------
        agent : str
            The reading principal (an agent node id).
        rows : mapping of str to (Node, Inherited)
            Candidate id -> its node and inherited row: :meth:`ProvenanceGraph.indexed` (from the index),
            or :func:`lab.provenance.lineage.inherited_rows` (from scratch over a lineage closure).

        Returns
        -------
        eligible : list of str
            The readable ids, in the order of ``rows``.
        excluded : dict of str to str
            Each refused id with the reason :meth:`can_read` gives.

        Raises
        ------
        UnknownNodeError, AccessError
            ``agent`` is unknown or not an agent.
        """
        scopes = self.scopes(agent)
        ok: list[str] = []
        excluded: dict[str, str] = {}
        for i, (_, inh) in rows.items():
            if inh.revoked_by is None and scopes.issuperset(inh.labels):  # the common case, without building a reason
                ok.append(i)
            else:
                excluded[i] = read_decision(i, inh, scopes)[1]
        return ok, excluded

    def eligible(self, agent: str, candidate_ids: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """:meth:`filter` over the candidates' rows of the inherited index (one read serves them all).

        Parameters
        ----------
        agent : str
        candidate_ids : iterable of str

        Returns
        -------
        (list of str, dict of str to str)
            ``(eligible, excluded)`` in the candidates' order (repeats dropped); see :meth:`filter`.

        Raises
        ------
        UnknownNodeError
            An unknown agent or candidate.
        """
        return self.filter(agent, self.graph.indexed(candidate_ids))
