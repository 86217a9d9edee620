"""Graded trust over the execution graph: multiplicative path trust and independent support.

MAP-Graph (arXiv 2608.10509) reranks eligible records by similarity × multiplicative path trust
and gates risky actions on evidence strength. The paper gives no exact formulas; the definitions
chosen here are:

factor(n)
    A node's own ``trust`` (sources: their reliability; derived records default to 1.0), or **0**
    when the node is invalid (``valid=False``) or revoked (``attributes["revoked"]``; see
    :mod:`lab.provenance.access`). This applies to every node type, so an invalidated summary
    also stops carrying trust.
path_trust(n)
    ``max`` over lineage paths ``r -> ... -> n`` from a root ``r`` (a node with no lineage parents,
    normally a source) of ``Π factor(v)`` for every ``v`` on the path, both ends included. Hence
    ``path_trust(root) = factor(root)`` and ``path_trust(n) = factor(n) · max_p path_trust(p)``
    over the lineage parents ``p``. Computed as a max-product Dijkstra over the ancestor closure
    (factors are <= 1, so extending a path never raises its value; cycles are harmless). A node
    inside a parent-less cycle has no root and gets 0.
source ancestry(p)
    The sources among ``p`` and its ancestors; if there are none, the roots of its closure
    (so an ungrounded memory counts as its own origin). Revoked or invalid sources stay in the
    ancestry: sharing *any* source makes two supporters dependent (conservative).
independent_supports(n, min_trust)
    The largest number of direct supporters (lineage parents of ``n``) whose source ancestries
    are pairwise disjoint and whose ``path_trust`` is ``>= min_trust`` and ``> 0``. Exact search
    (maximum independent set on the "shares a source" conflict graph, per connected component).
record_trust(n, mode)
    ``"max"`` (default): ``factor(n) · max_p path_trust(p)``, i.e. the single best supporter
    (equal to ``path_trust(n)``); ``"noisy_or"``: ``factor(n) · (1 − Π_{p∈I} (1 − path_trust(p)))``
    maximized over sets ``I`` of pairwise independent supporters with path trust ``>= min_trust``
    (independent sources justify the noisy-or). A node without parents gets ``factor(n)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import networkx as nx

from lab.provenance.access import lineage_closure
from lab.provenance.errors import ProvenanceError
from lab.provenance.graph import NodeType, ProvenanceGraph
from lab.provenance.lineage import LineageClosure, factor
from lab.provenance.lineage import path_trusts_over as _path_trusts

__all__ = [
    "TrustError",
    "factor",
    "path_trusts",
    "path_trust",
    "source_ancestry",
    "independent_support_set",
    "independent_supports",
    "record_trust",
]

#: Above this many supporters in one conflict component the exact search refuses.
MAX_EXACT = 24


class TrustError(ProvenanceError, ValueError):
    """A trust query that cannot be answered as asked (unknown mode, too many supporters)."""


def path_trusts(graph: ProvenanceGraph, node_ids: Iterable[str], *, closure: LineageClosure | None = None) -> dict[str, float]:
    """:func:`path_trust` of many nodes at once, read from the graph's inherited index (kept current
    on every write); with ``closure`` (a :func:`~lab.provenance.access.lineage_closure` covering
    them) computed from scratch by a max-product Dijkstra instead."""
    ids = list(node_ids)
    if closure is None:
        return {i: inh.path_trust for i, (_, inh) in graph.indexed(ids).items()}
    best = _path_trusts(closure)
    return {i: best[i] for i in ids}


def path_trust(graph: ProvenanceGraph, node_id: str) -> float:
    """The best product of node factors along any lineage path from a root to ``node_id``."""
    return path_trusts(graph, [node_id])[node_id]


def _ancestry(closure: LineageClosure, node_id: str) -> frozenset[str]:
    seen, stack = {node_id}, [node_id]
    while stack:
        for p in closure.parents[stack.pop()]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    sources = {n for n in seen if closure.nodes[n].type == NodeType.SOURCE}
    return frozenset(sources or {n for n in seen if not closure.parents[n]} or {node_id})


def source_ancestry(graph: ProvenanceGraph, node_id: str) -> frozenset[str]:
    """The sources ``node_id`` rests on (itself included if it is one); see the module docstring."""
    return _ancestry(lineage_closure(graph, [node_id]), node_id)


def _supporters(graph: ProvenanceGraph, node_id: str, min_trust: float):
    closure = lineage_closure(graph, [node_id])
    pts = _path_trusts(closure)
    sup = [p for p in closure.parents[node_id] if pts[p] > 0 and pts[p] >= min_trust]
    anc = {p: _ancestry(closure, p) for p in sup}
    return closure, pts, sup, anc


def _best_sets(sup: list[str], anc: dict[str, frozenset[str]], score) -> list[str]:
    """The independent set maximizing ``score(set)`` (exact, per conflict component; ``score`` must
    be additive over disjoint components in the sense that the best overall is the union of bests)."""
    conflict = nx.Graph()
    conflict.add_nodes_from(sup)
    for i, a in enumerate(sup):
        for b in sup[i + 1 :]:
            if anc[a] & anc[b]:
                conflict.add_edge(a, b)
    chosen: list[str] = []
    for comp in nx.connected_components(conflict):
        members = sorted(comp)
        if len(members) > MAX_EXACT:
            raise TrustError(f"{len(members)} mutually dependent supporters: exact search is capped at {MAX_EXACT}")
        best: tuple = (score([]), [])

        def search(k: int, picked: list[str]) -> None:
            nonlocal best
            if k == len(members):
                s = score(picked)
                if s > best[0]:
                    best = (s, list(picked))
                return
            m = members[k]
            if all(not conflict.has_edge(m, q) for q in picked):
                picked.append(m)
                search(k + 1, picked)
                picked.pop()
            search(k + 1, picked)

        search(0, [])
        chosen.extend(best[1])
    return sorted(chosen)


def independent_support_set(graph: ProvenanceGraph, node_id: str, *, min_trust: float = 0.0) -> list[str]:
    """A largest set of direct supporters with pairwise disjoint source ancestries and path trust
    ``>= min_trust`` (ties broken toward the higher summed path trust)."""
    _, pts, sup, anc = _supporters(graph, node_id, min_trust)
    return _best_sets(sup, anc, lambda s: (len(s), sum(pts[p] for p in s)))


def independent_supports(graph: ProvenanceGraph, node_id: str, *, min_trust: float = 0.0) -> int:
    """How many independent supporters ``node_id`` has (see :func:`independent_support_set`)."""
    return len(independent_support_set(graph, node_id, min_trust=min_trust))


def record_trust(graph: ProvenanceGraph, node_id: str, *, mode: str = "max", min_trust: float = 0.0) -> float:
    """Trust of a record from its support: ``"max"`` (best single supporter) or ``"noisy_or"``
    (over the best set of independent supporters); multiplied by the record's own factor."""
    if mode not in ("max", "noisy_or"):
        raise TrustError(f"unknown mode {mode!r}: use 'max' or 'noisy_or'")
    closure, pts, sup, anc = _supporters(graph, node_id, min_trust)
    own = factor(closure.nodes[node_id])
    if not closure.parents[node_id]:
        return own
    if mode == "max":
        return own * max((pts[p] for p in sup), default=0.0)
    picked = _best_sets(sup, anc, lambda s: 1.0 - math.prod(1.0 - pts[p] for p in s))
    return own * (1.0 - math.prod(1.0 - pts[p] for p in picked))
