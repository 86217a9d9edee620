"""What a record inherits along its lineage: effective labels, revocation, standing and path trust.

Pure functions over an ancestor closure (no SQL here). :class:`~lab.provenance.graph.ProvenanceGraph`
uses them to keep its *inherited index* (one row per node) current on every write, and
:mod:`lab.provenance.access` / :mod:`lab.provenance.trust` / :mod:`lab.provenance.gate` read that index
(or call these on an ad-hoc closure, :meth:`ProvenanceGraph.lineage_closure`).

Definitions (MAP-Graph, arXiv 2608.10509, and the rollback-repair paper, arXiv 2608.10502; the exact
formulas are this project's reading):

carrying and supporting relations
    ``derived_from``, ``summarises``, ``used`` and ``generated`` **carry** content from parent to child
    (:data:`CARRYING`): a summary holds its sources' facts, an action consumed its inputs, a record an
    action generated holds what the action used. ``supports`` does **not** carry: the supporting record is
    a justification the claim cites, one of possibly several independent ones.
effective labels
    ``labels(n) ∪ ⋃ labels(a)`` over all lineage ancestors ``a`` of ``n`` (every relation), each label with
    the node that carries it (the record itself when it does, else the first ancestor found in
    sorted-parent order). A reader needs **every** label (most restrictive).
revoked_by
    ``n`` itself if ``attributes["revoked"]`` is true; else the revocation of a revoked **carrying** parent
    (what a summary or derivation of a revoked record holds is revoked with it); else, when **every**
    lineage parent of ``n`` is revoked, the first one's (a claim whose only supports are revoked loses
    them all). A claim with a surviving support through a ``supports`` edge is *not* revoked: the
    rollback-repair paper's independent-support check. ``None`` otherwise.
invalidated_by
    ``n`` itself if it is invalid (``valid=False``: :meth:`ProvenanceGraph.invalidate`, a superseded or
    deleted record); else, when ``n`` is not revoked and **every** lineage parent is gone (invalid,
    unsupported or revoked), the cause of the first invalid one (its ``invalidated_by``): ``n`` has lost
    all support and is not returned. ``None`` otherwise.
rederive
    For a record that still stands: the invalidated records it holds content of, i.e. the
    ``invalidated_by`` of every **carrying** parent that is gone by invalidation, plus the ``rederive`` of
    every carrying parent (sorted, no repeats). A summary that cites an invalidated source is kept, at the
    trust its surviving supports give, and marked for re-derivation. ``supports`` edges pass no mark.
    (Invalidation is thus revocation's soft twin: the two differ only on a record that *carries* the
    removed one while other supports survive, revoked and unreadable vs marked and readable.)
factor(n)
    the node's own ``trust``, or 0 when it is invalid or revoked.
writer caps
    ``owner_trust(n)``: the factor of ``n``'s owner (its writer) when the owner is an agent node of the
    graph, else 1 (the recorder, e.g. an ingest, vouches for it). ``edge_trust(c, p)``: the best factor of
    the writers of the lineage edges from ``p`` to ``c`` (an edge without writer, or with one that is not
    an agent node: 1).
path_trust(n)
    ``max`` over lineage paths from a root (a node without lineage parents) to ``n`` of the product of the
    steps on the path: a root contributes ``factor(r) · owner_trust(r)``, each further node ``c`` reached
    from ``p`` contributes ``factor(c) · min(owner_trust(c), edge_trust(c, p))``. Hence a record never has
    more trust than its writer's trust times its best evidence, a bare claim (no parents) has at most its
    writer's trust, and an edge carries no more trust than whoever wrote it. 0 inside a root-less cycle
    (the graph refuses cycles; stores written before that may hold some).
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import networkx as nx

if TYPE_CHECKING:  # graph.py imports this module; Node is only a type here
    from lab.provenance.graph import Node

__all__ = [
    "CARRYING",
    "LineageClosure",
    "Inherited",
    "factor",
    "principal_scopes",
    "read_decision",
    "standing",
    "path_trusts_over",
    "propagate",
    "inherited_rows",
]

#: Lineage relations that carry content, hence revocation and the re-derivation mark, from parent to child.
CARRYING: frozenset[str] = frozenset({"derived_from", "summarises", "used", "generated"})


@dataclass(frozen=True)
class LineageClosure:
    """An ancestor closure: its current nodes and lineage edges, with what the writer caps need.

    Parameters
    ----------
    nodes : dict of str to Node
        The current version of every node of the closure.
    parents : dict of str to list of str
        ``parents[child]``: the child's lineage parents inside the closure, sorted.
    versions : dict of str to int, optional
        The stored version of each node (empty when the closure was not read from a store).
    relations : dict of (str, str) to frozenset of str, optional
        ``relations[(child, parent)]``: the relations of the lineage edges between them. A pair missing
        here counts as carrying (the conservative reading, for closures built by hand).
    edge_trust : dict of (str, str) to float, optional
        ``edge_trust[(child, parent)]``: the best factor of those edges' writers; missing: 1.
    owner_trust : dict of str to float, optional
        ``owner_trust[node]``: the factor of the node's owner (its writer); missing: 1.
    """

    nodes: dict[str, Node]
    parents: dict[str, list[str]]
    versions: dict[str, int] = field(default_factory=dict)
    relations: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    edge_trust: dict[tuple[str, str], float] = field(default_factory=dict)
    owner_trust: dict[str, float] = field(default_factory=dict)

    def carries(self, child: str, parent: str) -> bool:
        """Whether some lineage edge from ``parent`` to ``child`` is carrying (:data:`CARRYING`).

        Parameters
        ----------
        child, parent : str
        """
        rels = self.relations.get((child, parent))
        return True if rels is None else bool(rels & CARRYING)

    def step(self, child: str, parent: str) -> float:
        """The factor a path gains entering ``child`` from ``parent``: ``factor(child) · min(owner_trust(child),
        edge_trust(child, parent))``.

        Parameters
        ----------
        child, parent : str
            A lineage edge of the closure.
        """
        cap = min(self.owner_trust.get(child, 1.0), self.edge_trust.get((child, parent), 1.0))
        return factor(self.nodes[child]) * cap

    def root_value(self, node_id: str) -> float:
        """What a root contributes: ``factor(root) · owner_trust(root)``.

        Parameters
        ----------
        node_id : str
        """
        return factor(self.nodes[node_id]) * self.owner_trust.get(node_id, 1.0)

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


class Inherited(NamedTuple):
    """What lineage gives one node (a named tuple: built once per candidate on every retrieval).

    Attributes
    ----------
    labels : dict of str to str
        Effective label -> the node carrying it.
    revoked_by : str or None
        The node itself or the revoked ancestor that revokes it (``None``: not revoked).
    path_trust : float
        In [0, 1]; see the module docstring.
    invalidated_by : str or None
        The node itself when invalid, or the invalidated ancestor whose loss leaves it without any support.
    rederive : tuple of str
        Invalidated records it carries content of (sorted): re-derive it.
    """

    labels: dict[str, str]
    revoked_by: str | None
    path_trust: float = 0.0
    invalidated_by: str | None = None
    rederive: tuple[str, ...] = ()


def factor(node: Node) -> float:
    """The node's own multiplicative trust.

    Parameters
    ----------
    node : Node

    Returns
    -------
    float
        ``node.trust``, or 0 if the node is invalid or revoked (``attributes["revoked"]``).
    """
    if not node.valid or node.attributes.get("revoked", False):
        return 0.0
    return float(node.trust)


def principal_scopes(agent: Node) -> frozenset[str]:
    """The scopes an agent (principal) holds: its own id plus ``attributes["scopes"]`` (its grants).

    Parameters
    ----------
    agent : Node
        An agent node (the type is the caller's to check).
    """
    return frozenset({agent.id, *agent.attributes.get("scopes", [])})


def read_decision(node_id: str, inherited: Inherited, scopes: frozenset[str]) -> tuple[bool, str]:
    """May a principal holding ``scopes`` read ``node_id``? (MAP-Graph's hard authorization.)

    Parameters
    ----------
    node_id : str
    inherited : Inherited
        The node's inherited row.
    scopes : frozenset of str
        The principal's scopes (:func:`principal_scopes`).

    Returns
    -------
    (bool, str)
        ``(True, "readable")`` or ``(False, reason)``: revocation first (``revoked: it is revoked`` /
        ``revoked: ancestor 'S' is revoked``), then the first missing label in sorted order with the node
        carrying it.
    """
    if inherited.revoked_by is not None:
        where = "it is revoked" if inherited.revoked_by == node_id else f"ancestor {inherited.revoked_by!r} is revoked"
        return False, f"revoked: {where}"
    for lab in sorted(inherited.labels):
        if lab not in scopes:
            carrier = inherited.labels[lab]
            where = "the record itself" if carrier == node_id else f"ancestor {carrier!r}"
            return False, f"missing label {lab!r} (carried by {where})"
    return True, "readable"


def standing(node_id: str, node: Node, inherited: Inherited) -> str | None:
    """Why a readable record is not to be used at all, or ``None`` when it stands.

    Parameters
    ----------
    node_id : str
    node : Node
        Its current version.
    inherited : Inherited
        Its inherited row.

    Returns
    -------
    str or None
        ``"invalidated (superseded)"`` for an invalid record; ``"unsupported: every support is invalidated
        (ancestor 'S')"`` for one whose every lineage parent is gone; ``None`` otherwise. (A record marked
        for re-derivation, ``inherited.rederive``, still stands: callers decide what the mark means.)
    """
    if not node.valid:
        return "invalidated (superseded)"
    if inherited.invalidated_by is not None and inherited.invalidated_by != node_id:
        return f"unsupported: every support is invalidated (ancestor {inherited.invalidated_by!r})"
    return None


def path_trusts_over(closure: LineageClosure) -> dict[str, float]:
    """Path trust of every node of the closure, computed from scratch (the inherited index holds the same).

    A max-product Dijkstra from the roots: every step is <= 1, so extending a path never raises its value
    and the first time a node is settled its value is final (cycles are harmless).

    Parameters
    ----------
    closure : LineageClosure

    Returns
    -------
    dict of str to float
        Node id -> path trust in [0, 1].
    """
    best: dict[str, float] = {n: 0.0 for n in closure.nodes}
    children: dict[str, list[str]] = {n: [] for n in closure.nodes}
    heap: list[tuple[float, str]] = []
    for n, ps in closure.parents.items():
        for p in ps:
            children[p].append(n)
        if not ps:
            best[n] = closure.root_value(n)
            heap.append((-best[n], n))
    heapq.heapify(heap)
    done: set[str] = set()
    while heap:
        neg, n = heapq.heappop(heap)
        if n in done:
            continue
        done.add(n)
        for c in children[n]:
            val = -neg * closure.step(c, n)
            if val > best[c] and c not in done:
                best[c] = val
                heapq.heappush(heap, (-val, c))
    return best


def _gone(inh: Inherited) -> bool:
    return inh.revoked_by is not None or inh.invalidated_by is not None


def propagate(closure: LineageClosure) -> dict[str, Inherited]:
    """Effective labels (with a carrier per label), revocation, standing and path trust of every node of
    the closure: one pass in topological order (a strongly connected component, possible only in stores
    written before cycles were refused, shares one result).

    Parameters
    ----------
    closure : LineageClosure

    Returns
    -------
    dict of str to Inherited
    """
    trusts = path_trusts_over(closure)
    out: dict[str, Inherited] = {}
    nodes, parents = closure.nodes, closure.parents
    for comp in closure.topological_components():
        if len(comp) == 1:  # a DAG's components: the record and its parents
            n = comp[0]
            external = [(n, p) for p in parents[n]]
        else:  # a cycle in a store written before cycles were refused: one result for all of it
            members = set(comp)
            external = [(n, p) for n in comp for p in parents[n] if p not in members]
        labels: dict[str, str] = {}
        revoked_by: str | None = None
        for n in comp:  # the component's own labels first (in a DAG: the record's own)
            node = nodes[n]
            if node.labels:
                for lab in sorted(node.labels):
                    labels.setdefault(lab, n)
            if revoked_by is None and node.attributes.get("revoked", False):
                revoked_by = n
        if not external:
            for n in comp:
                own_invalid = n if not nodes[n].valid else None
                out[n] = Inherited(labels, revoked_by, trusts[n], own_invalid, ())
            continue
        ins = [out[p] for _, p in external]
        for inh in ins:
            for lab, carrier in inh.labels.items():
                labels.setdefault(lab, carrier)
        if revoked_by is None:
            revoked_by = next((inh.revoked_by for (n, p), inh in zip(external, ins) if inh.revoked_by is not None and closure.carries(n, p)), None)
        if revoked_by is None and all(inh.revoked_by is not None for inh in ins):
            revoked_by = ins[0].revoked_by
        lost: str | None = None
        if revoked_by is None and all(_gone(inh) for inh in ins):
            lost = next(inh.invalidated_by for inh in ins if inh.invalidated_by is not None)
        marks: tuple[str, ...] = ()
        if revoked_by is None and lost is None and any(inh.invalidated_by is not None or inh.rederive for inh in ins):
            rederive: set[str] = set()
            for (n, p), inh in zip(external, ins):
                if closure.carries(n, p):
                    if inh.invalidated_by is not None:
                        rederive.add(inh.invalidated_by)
                    rederive.update(inh.rederive)
            marks = tuple(sorted(rederive))
        for n in comp:
            own_invalid = n if not nodes[n].valid else None
            out[n] = Inherited(labels, revoked_by, trusts[n], own_invalid or lost, () if own_invalid else marks)
    return out


def inherited_rows(closure: LineageClosure, ids: Mapping[str, object] | list[str]) -> dict[str, tuple[Node, Inherited]]:
    """``{id: (node, inherited)}`` for ``ids`` computed from scratch over ``closure``: the same shape
    :meth:`ProvenanceGraph.indexed` reads from the index, e.g. for :meth:`AccessPolicy.filter`.

    Parameters
    ----------
    closure : LineageClosure
        Covering every id.
    ids : list of str
    """
    inh = propagate(closure)
    return {i: (closure.nodes[i], inh[i]) for i in ids}
