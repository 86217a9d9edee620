"""Graded trust over the execution graph: multiplicative path trust and independent support.

MAP-Graph (arXiv 2608.10509) reranks eligible records by similarity × multiplicative path trust
and gates risky actions on evidence strength. The paper gives no exact formulas; the definitions
chosen here are:

factor(n)
    A node's own ``trust`` (sources: their reliability; derived records default to 1.0), or **0**
    when the node is invalid (``valid=False``) or revoked (``attributes["revoked"]``; see
    :mod:`lab.provenance.access`). This applies to every node type, so an invalidated summary
    also stops carrying trust.
writer caps
    ``owner_trust(n)``: the factor of the agent that owns (wrote) ``n``; ``edge_trust(c, p)``: the factor
    of the agent that wrote the lineage edge ``p -> c``; 1 for the recorder (no writer, or a writer
    that is not an agent node). See :mod:`lab.provenance.lineage`.
path_trust(n)
    ``max`` over lineage paths ``r -> ... -> n`` from a root ``r`` (a node with no lineage parents,
    normally a source) of the product of its steps: ``factor(r) · owner_trust(r)`` for the root, then
    ``factor(c) · min(owner_trust(c), edge_trust(c, p))`` for each node ``c`` entered from ``p``. So a
    record's trust never exceeds its writer's trust times its best evidence, a bare claim (no
    evidence) has no more than its writer's own trust, and no edge lends more trust than its writer
    has. Two algorithms give it, chosen by the function called, never by an optional argument:
    :func:`path_trusts` reads the inherited index every write keeps current (O(1) per node);
    :func:`lab.provenance.lineage.path_trusts_over` recomputes it over a lineage closure by a
    max-product Dijkstra (steps are <= 1, so extending a path never raises its value).
source ancestry(p)
    The sources among ``p`` and its ancestors. A record with none is *ungrounded*: it rests on no
    evidence and supports nothing (an agent's bare claim is not evidence, whatever its trust).
    Revoked or invalid sources stay in the ancestry: sharing *any* source makes two supporters
    dependent (conservative).
independent_supports(n, min_trust)
    The largest number of direct supporters (lineage parents of ``n``) whose source ancestries
    are non-empty and pairwise disjoint and whose ``path_trust`` is ``>= min_trust`` and ``> 0``.
    Exact search (maximum independent set on the "shares a source" conflict graph, per connected
    component).
record_trust(n, mode)
    ``"max"`` (default): the single best supporter, ``factor(n) · max_p path_trust(p) · min(owner_trust(n),
    edge_trust(n, p))`` (equal to ``path_trust(n)`` when ``min_trust`` filters nothing); ``"noisy_or"``:
    ``factor(n) · owner_trust(n) · (1 − Π_{p∈I} (1 − path_trust(p) · edge_trust(n, p)))`` maximized over
    sets ``I`` of pairwise independent supporters with path trust ``>= min_trust`` (independent sources
    justify the noisy-or; the writer's cap stays outside it; here an ungrounded supporter counts as its
    own origin, so that ``noisy_or >= max``). A node without parents gets ``factor(n) · owner_trust(n)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import networkx as nx

from lab.provenance.errors import TrustError  # defined in errors.py; importable from here as before
from lab.provenance.graph import NodeType, ProvenanceGraph
from lab.provenance.lineage import LineageClosure, factor, path_trusts_over

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


def path_trusts(graph: ProvenanceGraph, node_ids: Iterable[str]) -> dict[str, float]:
    """:func:`path_trust` of many nodes at once, read from the graph's inherited index (kept current on
    every write; one query). To recompute it from scratch instead, call
    :func:`lab.provenance.lineage.path_trusts_over` on ``graph.lineage_closure(node_ids)``.

    Parameters
    ----------
    graph : ProvenanceGraph
    node_ids : iterable of str

    Returns
    -------
    dict of str to float
        Node id -> path trust in [0, 1].

    Raises
    ------
    UnknownNodeError
        An id is not in the graph.
    """
    return {i: inh.path_trust for i, (_, inh) in graph.indexed(node_ids).items()}


def path_trust(graph: ProvenanceGraph, node_id: str) -> float:
    """The best product of steps along any lineage path from a root to ``node_id`` (module docstring).

    Parameters
    ----------
    graph : ProvenanceGraph
    node_id : str

    Raises
    ------
    UnknownNodeError
    """
    return path_trusts(graph, [node_id])[node_id]


def _ancestry(closure: LineageClosure, node_id: str, *, origins: bool = False) -> frozenset[str]:
    """The sources among ``node_id`` and its ancestors; with ``origins``, an ungrounded record's roots
    instead of nothing (its own origin, for combining trust; never for counting evidence)."""
    seen, stack = {node_id}, [node_id]
    while stack:
        for p in closure.parents[stack.pop()]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    sources = frozenset(n for n in seen if closure.nodes[n].type == NodeType.SOURCE)
    if sources or not origins:
        return sources
    return frozenset({n for n in seen if not closure.parents[n]} or {node_id})


def source_ancestry(graph: ProvenanceGraph, node_id: str) -> frozenset[str]:
    """The sources ``node_id`` rests on (itself included if it is one); empty for an ungrounded record.

    Parameters
    ----------
    graph : ProvenanceGraph
    node_id : str

    Raises
    ------
    UnknownNodeError
    """
    return _ancestry(graph.lineage_closure([node_id]), node_id)


def _supporters(graph: ProvenanceGraph, node_id: str, min_trust: float, *, origins: bool = False):
    """The closure, its path trusts, the supporters of ``node_id`` with path trust ``> 0`` and ``>= min_trust``
    (grounded ones only unless ``origins``) and their ancestries."""
    closure = graph.lineage_closure([node_id])
    pts = path_trusts_over(closure)
    anc = {p: _ancestry(closure, p, origins=origins) for p in closure.parents[node_id]}
    sup = [p for p in closure.parents[node_id] if anc[p] and pts[p] > 0 and pts[p] >= min_trust]
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
    """A largest set of direct supporters with non-empty, pairwise disjoint source ancestries and path
    trust ``>= min_trust`` (ties broken toward the higher summed path trust).

    Parameters
    ----------
    graph : ProvenanceGraph
    node_id : str
    min_trust : float
        In [0, 1]; supporters below it do not count.

    Returns
    -------
    list of str
        Sorted supporter ids.

    Raises
    ------
    UnknownNodeError
    TrustError
        More than :data:`MAX_EXACT` mutually dependent supporters.
    """
    _, pts, sup, anc = _supporters(graph, node_id, min_trust)
    return _best_sets(sup, anc, lambda s: (len(s), sum(pts[p] for p in s)))


def independent_supports(graph: ProvenanceGraph, node_id: str, *, min_trust: float = 0.0) -> int:
    """How many independent supporters ``node_id`` has (the size of :func:`independent_support_set`).

    Parameters
    ----------
    graph : ProvenanceGraph
    node_id : str
    min_trust : float

    Raises
    ------
    UnknownNodeError, TrustError
    """
    return len(independent_support_set(graph, node_id, min_trust=min_trust))


def record_trust(graph: ProvenanceGraph, node_id: str, *, mode: str = "max", min_trust: float = 0.0) -> float:
    """Trust of a record from its support (module docstring).

    Parameters
    ----------
    graph : ProvenanceGraph
    node_id : str
    mode : {"max", "noisy_or"}
        The best single supporter, or a noisy-or over the best set of independent supporters.
    min_trust : float
        Supporters with less path trust do not count.

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    TrustError
        An unknown ``mode``, or too many mutually dependent supporters.
    UnknownNodeError
    """
    if mode not in ("max", "noisy_or"):
        raise TrustError(f"unknown mode {mode!r}: use 'max' or 'noisy_or'")
    closure, pts, sup, anc = _supporters(graph, node_id, min_trust, origins=True)
    if not closure.parents[node_id]:
        return closure.root_value(node_id)
    if mode == "max":
        return max((pts[p] * closure.step(node_id, p) for p in sup), default=0.0)
    own = factor(closure.nodes[node_id]) * closure.owner_trust.get(node_id, 1.0)

    def lent(p: str) -> float:
        return pts[p] * closure.edge_trust.get((node_id, p), 1.0)

    picked = _best_sets(sup, anc, lambda s: 1.0 - math.prod(1.0 - lent(p) for p in s))
    return own * (1.0 - math.prod(1.0 - lent(p) for p in picked))
