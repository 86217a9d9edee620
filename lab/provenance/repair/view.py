"""A repair drawn in the provenance explorer: the repaired run as a :class:`~lab.provenance.graph.ProvenanceGraph`
and the marks that show what the repair did.

:func:`to_provenance_graph` writes a run's typed memory-to-action graph (after repair) into the provenance
store: steps become ``action`` nodes, tool results and effects ``source``, memory records ``memory``, claims and
answers ``claim``; ``cite`` -> ``used``, ``produce`` -> ``generated``, ``derive`` -> ``derived_from``, ``support``
-> ``supports``, ``supersede`` -> ``invalidated_by``; the original kind is kept in ``attributes["repair_kind"]``.
:func:`repair_overlay` says which nodes were deactivated (faded), which steps were replayed (a purple
border) and which records and edges form the support path that kept a record (a green halo), and
:func:`apply_repair` adds those marks, with their legend entries and styles, to
:func:`lab.provenance.view.explorer_elements` output (``ProvenanceExplorer(graph, repair=overlay)``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from lab.provenance.graph import Edge, Node, NodeType, ProvenanceGraph, Relation
from lab.provenance.repair.graph import build_graph
from lab.provenance.repair.replay import RepairResult

__all__ = ["REPAIR_ENCODING", "to_provenance_graph", "repair_overlay", "apply_repair"]

#: Legend entries and cytoscape styles of the repair marks.
REPAIR_ENCODING = {
    "repair_deactivated": {"border": "dashed", "color": "#999999", "meaning": "faded: deactivated, quarantined or deleted by the repair", "style": {"opacity": 0.3}},
    "repair_replayed": {"border": "solid", "color": "#7b2fbe", "meaning": "purple border: step replayed by the repair", "style": {"border-color": "#7b2fbe", "border-width": 6}},
    "repair_support": {"border": "solid", "color": "#00a651", "meaning": "green halo: the independent support path that kept a record",
                       "style": {"underlay-color": "#00a651", "underlay-opacity": 0.6, "underlay-padding": 7}, "edge_style": {"line-color": "#00a651", "target-arrow-color": "#00a651", "width": 3}},
}

_TYPES = {"step": NodeType.ACTION, "source": NodeType.SOURCE, "effect": NodeType.SOURCE, "memory": NodeType.MEMORY, "claim": NodeType.CLAIM, "answer": NodeType.CLAIM}
_RELATIONS = {"cite": Relation.USED, "produce": Relation.GENERATED, "derive": Relation.DERIVED_FROM, "support": Relation.SUPPORTS, "supersede": Relation.INVALIDATED_BY}


def _text(d: Mapping[str, Any]) -> str:
    if d["type"] == "step":
        return f"{d['kind']} {d['spec']}" + (f" (replay {d['generation']})" if d.get("generation") else "")
    if d["type"] == "memory":
        return f"{d['key']} = {d['value']!r} [{d['status']}]"
    c = d.get("content")
    return c if isinstance(c, str) else repr(c)[:400]


def to_provenance_graph(result: RepairResult, path: str = ":memory:") -> ProvenanceGraph:
    """The repaired run (``result.trace`` over ``result.store``) as a :class:`ProvenanceGraph` (module docstring).

    A node's ``valid`` is ``False`` for a memory record that is not active or superseded; a node's time is its
    step's logical time (replayed steps one past the original's).
    """
    g = build_graph(result.trace, result.store)
    pg = ProvenanceGraph(path)
    with pg.transaction():
        for n, d in g.nodes(data=True):
            t = float(d.get("time", 0)) + (0.5 if d.get("generation") else 0.0)
            valid = d["type"] != "memory" or d["status"] in ("active", "superseded")
            pg.add_node(Node(id=n, type=_TYPES[d["type"]], text=_text(d), time=max(t, -1000.0), trust=float(d.get("trust", 1.0)), valid=valid, run=result.trace.run,
                             attributes={"repair_kind": d.get("kind", d["type"]), **({"status": d["status"], "key": d["key"]} if d["type"] == "memory" else {})}))
        seen = set()
        for u, v, d in g.edges(data=True):
            rel = _RELATIONS.get(d["kind"])
            if rel is None or (u, v, rel) in seen:
                continue
            seen.add((u, v, rel))
            attrs = {"repair_kind": d["kind"], **({"token": d["token"]} if "token" in d else {})}
            if rel == Relation.SUPPORTS and g.nodes[v]["type"] not in ("memory", "claim", "answer"):
                continue
            pg.add_edge(Edge(src=u, dst=v, relation=rel, time=float(g.nodes[v].get("time", 0)), attributes=attrs), verify_writer=False)
    return pg


def repair_overlay(result: RepairResult) -> dict[str, Any]:
    """``{"nodes": {id: [marks]}, "edges": [[src, dst], ...]}`` of a repair (module docstring)."""
    marks: dict[str, list[str]] = {}
    for r in result.store.records():
        if r.status in ("deactivated", "quarantined", "deleted"):
            marks.setdefault(r.id, []).append("repair_deactivated")
    edges = []
    if result.plan is not None:
        for e in result.plan.entries.values():
            if e.op == "invalidate":
                marks.setdefault(e.node, []).append("repair_deactivated")
            if e.op == "preserve" and e.support:
                for n in e.support:
                    marks.setdefault(n, []).append("repair_support")
                edges.append(list(e.support))
    for s in result.trace.steps:
        if s.generation:
            marks.setdefault(f"{result.trace.run}/{s.step}@r{s.generation}", []).append("repair_replayed")
    return {"nodes": {k: sorted(set(v)) for k, v in marks.items()}, "edges": edges}


def apply_repair(elements: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of explorer ``elements`` with the repair marks of ``overlay`` on its nodes and support edges,
    and :data:`REPAIR_ENCODING` in its ``encoding["borders"]`` (so the legend lists them)."""
    els = copy.deepcopy(dict(elements))
    marks = overlay.get("nodes", {})
    for n in els.get("nodes", []):
        extra = marks.get(n["data"]["id"], [])
        if extra:
            n["data"]["marks"] = list(n["data"].get("marks", [])) + [m for m in extra if m not in n["data"].get("marks", [])]
    path = {tuple(e) for e in overlay.get("edges", [])}
    for e in els.get("edges", []):
        if (e["data"]["source"], e["data"]["target"]) in path:
            e["data"]["marks"] = ["repair_support"]
    enc = els.setdefault("encoding", {})
    enc["borders"] = {**enc.get("borders", {}), **REPAIR_ENCODING}
    return els
