"""What a record inherits along its lineage: effective labels, revocation and path trust.

Pure functions over an ancestor closure (no SQL here). :class:`~lab.provenance.graph.ProvenanceGraph`
uses them to keep its *inherited index* (one row per node) current on every write, and
:mod:`lab.provenance.access` / :mod:`lab.provenance.trust` use them on ad-hoc closures.

Definitions (MAP-Graph, arXiv 2608.10509; the exact formulas are this project's reading):

effective labels
    ``labels(n) ∪ ⋃ labels(a)`` over the lineage ancestors ``a`` of ``n``, each label with the
    node that carries it (the record itself when it does, else the first ancestor found in
    sorted-parent order). A reader needs **every** label.
revoked_by
    ``n`` itself if ``attributes["revoked"]`` is true, else the first revoked ancestor, else ``None``.
factor(n)
    the node's own ``trust``, or 0 when it is invalid or revoked.
path_trust(n)
    ``max`` over lineage paths from a root (a node without lineage parents) to ``n`` of the product
    of the factors on the path, both ends included; 0 inside a root-less cycle.
"""

from __future__ import annotations

import graphlib
import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import networkx as nx

if TYPE_CHECKING:  # graph.py imports this module; Node is only a type here
    from lab.provenance.graph import Node

__all__ = ["LineageClosure", "Inherited", "factor", "propagate", "path_trusts_over"]


@dataclass(frozen=True)
class LineageClosure:
    """The current nodes of an ancestor closure, its lineage edges (``parents[child]`` sorted) and
    the stored version of each node (empty when the closure was not read from a store)."""

    nodes: dict[str, Node]
    parents: dict[str, list[str]]
    versions: dict[str, int] = field(default_factory=dict)

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

    ``labels``: effective label -> the node carrying it; ``revoked_by``: the node itself or a
    revoked ancestor (``None``: not revoked); ``path_trust`` in [0, 1].
    """

    labels: dict[str, str]
    revoked_by: str | None
    path_trust: float = 0.0


def factor(node: Node) -> float:
    """The node's own multiplicative trust: ``trust``, or 0 if invalid or revoked."""
    if not node.valid or node.attributes.get("revoked", False):
        return 0.0
    return float(node.trust)


def path_trusts_over(closure: LineageClosure) -> dict[str, float]:
    """Path trust of every node of the closure: a max-product Dijkstra from the roots
    (factors are <= 1, so extending a path never raises its value; cycles are harmless)."""
    best: dict[str, float] = {n: 0.0 for n in closure.nodes}
    children: dict[str, list[str]] = {n: [] for n in closure.nodes}
    heap: list[tuple[float, str]] = []
    for n, ps in closure.parents.items():
        for p in ps:
            children[p].append(n)
        if not ps:
            best[n] = factor(closure.nodes[n])
            heap.append((-best[n], n))
    heapq.heapify(heap)
    done: set[str] = set()
    while heap:
        neg, n = heapq.heappop(heap)
        if n in done:
            continue
        done.add(n)
        for c in children[n]:
            val = -neg * factor(closure.nodes[c])
            if val > best[c] and c not in done:
                best[c] = val
                heapq.heappush(heap, (-val, c))
    return best


def propagate(closure: LineageClosure) -> dict[str, Inherited]:
    """Effective labels (with a carrier per label), revocation and path trust of every node of the
    closure: one pass in topological order (a strongly connected component shares one result)."""
    trusts = path_trusts_over(closure)
    out: dict[str, Inherited] = {}
    for comp in closure.topological_components():
        members = set(comp)
        labels: dict[str, str] = {}
        revoked_by: str | None = None
        for n in comp:  # the component's own labels first (in a DAG: the record's own)
            node = closure.nodes[n]
            for lab in sorted(node.labels):
                labels.setdefault(lab, n)
            if revoked_by is None and node.attributes.get("revoked", False):
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
        for n in comp:
            out[n] = Inherited(labels, revoked_by, trusts[n])
    return out
