"""The typed memory-to-action graph of a run, built deterministically from trace ids.

Nodes: the run's **steps** (``step`` nodes, id ``<run>/<step>`` or ``<run>/<step>@r<g>`` for a replayed
generation, with ``kind``), its **records** (``source`` tool results, ``claim``, ``answer``, ``effect``) and the
**memory** records of the store (including what prior sessions left). Edges (``kind`` attribute of a
``networkx.MultiDiGraph`` edge ``src -> dst``):

============ ======================= ==========================================================================
kind         src -> dst              from
============ ======================= ==========================================================================
``cite``     step -> record          the step read the record (``StepRecord.reads``)
``produce``  step -> record          the step made the record (``StepRecord.produces``)
``update``   step -> memory          the step's write replaced this active record of the same key
``supersede`` memory -> memory       the new record superseded the old one
``derive``   memory -> record        a memory written from a tool result, or derived from the records its step read
``support``  record -> memory/claim  an earlier record (not the one it was written from) states the same value;
                                     ``token``, the supporter's ``field`` and ``path`` and the
                                     ``target_field`` / ``target_entity`` / ``target_path`` it backs are kept (the independent-support check decides
                                     whether the support counts)
============ ======================= ==========================================================================

(Dependency-guided rollback repair, arXiv 2608.10502, stage 1: edges cite, support, produce, update, derive,
supersede, built from trace ids, not inferred by a model.) ``support`` is the one value-matched relation: a
record's value (a claim's input values) found as a leaf of an earlier record's content, exact string match of
scalars (booleans, ``None`` and one-character strings are not evidence).

Raises
------
MissingProvenanceError
    A step cites or produces an id that is neither a trace record nor a memory record of the store.
LineageCycleError
    The dependency edges (cite, produce, derive) close a cycle; ``cycle`` lists it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import networkx as nx

from lab.provenance.errors import LineageCycleError, MissingProvenanceError
from lab.provenance.repair.runner import Trace
from lab.provenance.repair.store import MemTXMemory

__all__ = ["build_graph", "step_node", "leaves", "DEPENDENCY"]

#: Edge kinds along which a fault flows downstream.
DEPENDENCY = ("cite", "produce", "derive")


def step_node(run: str, step: str, generation: int = 0) -> str:
    """The graph id of a step execution."""
    return f"{run}/{step}" + (f"@r{generation}" if generation else "")


def leaves(value: Any, path: str = "") -> list[tuple[str, str]]:
    """``(field name, string form)`` of every scalar leaf of a JSON value that can serve as evidence."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in leaves(v, str(k))]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v, path)]
    if value is None or isinstance(value, bool):
        return []
    text = str(int(value)) if isinstance(value, float) and value == int(value) else str(value)
    return [(path, text)] if len(text) >= 2 else []


def leaf_paths(value: Any, path: str = "") -> list[tuple[str, str]]:
    """``(full path, string form)`` of the scalar leaves :func:`leaves` keeps (``flights/1/flight_number``)."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in leaf_paths(v, f"{path}/{k}" if path else str(k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in leaf_paths(v, f"{path}/{i}" if path else str(i))]
    return [(path, t) for _, t in leaves(value, path)]


def key_path(key: str) -> str:
    """The part of a memory key after its entity (``flights/1/flight_number`` of ``res:X/flights/1/flight_number``)."""
    return key.split("/", 1)[1] if "/" in key else ""


def build_graph(trace: Trace, store: MemTXMemory) -> nx.MultiDiGraph:
    """The typed memory-to-action graph of ``trace`` over ``store`` (module docstring).

    Returns
    -------
    networkx.MultiDiGraph
        Node attributes: ``type`` (``step``/``source``/``claim``/``answer``/``effect``/``memory``), ``time``,
        ``kind`` and ``spec`` for steps, ``key``, ``value``, ``status``, ``trust``, ``session`` for memory,
        ``content``, ``trust`` for trace records; ``entities`` (what a record is about: a memory's key prefix,
        the key prefixes its step wrote for a tool result). Edge attribute ``kind`` (and ``token``, ``field`` on support).
    """
    g = nx.MultiDiGraph(run=trace.run)
    mem = {r.id: r for r in store.records()}
    for r in mem.values():
        g.add_node(r.id, type="memory", time=r.time, key=r.key, field=r.field, value=r.value, status=r.status, trust=r.trust, session=r.session, step=r.step)
    for r in trace.records.values():
        g.add_node(r.id, type=r.type, time=r.time, content=r.content, trust=r.trust, step=r.step, call=r.call)
    for s in trace.steps:
        sid = step_node(trace.run, s.step, s.generation)
        g.add_node(sid, type="step", kind=s.kind, spec=s.step, time=s.time, generation=s.generation, skipped=s.skipped)
        for rid in s.reads + s.produces:
            if rid not in g or g.nodes[rid].get("type") == "step":
                raise MissingProvenanceError(f"run {trace.run}: step {s.step} refers to {rid!r}, which has no recorded source", step=s.step)
        for rid in s.reads:
            g.add_edge(sid, rid, kind="cite")
        for rid in s.produces:
            g.add_edge(sid, rid, kind="produce")
        for new, old in s.supersedes:
            g.add_edge(sid, old, kind="update")
            g.add_edge(new, old, kind="supersede")
        made_mem = [r for r in s.produces if r in mem]
        own = [r for r in s.produces if r not in mem]
        for m in made_mem:
            for src in own + s.reads:
                g.add_edge(m, src, kind="derive")
    for s in trace.steps:  # what a tool result is about: the entities of the keys its step wrote
        ents = {mem[p].key.split("/", 1)[0] for p in s.produces if p in mem}
        for p in s.produces:
            if p not in mem:
                g.nodes[p]["entities"] = sorted(ents)
    for r in mem.values():
        g.nodes[r.id]["entities"] = [r.key.split("/", 1)[0]]
    _support(g, trace, mem)
    dep = nx.DiGraph([(u, v) for u, v, k in g.edges(data="kind") if k in DEPENDENCY])
    try:
        cycle = nx.find_cycle(dep)
    except nx.NetworkXNoCycle:
        return g
    ids = [u for u, _ in cycle]
    raise LineageCycleError(f"run {trace.run}: dependency cycle {' -> '.join(ids + ids[:1])}", cycle=ids, edge=f"{cycle[-1][0]} -> {cycle[-1][1]}")


def _support(g: nx.MultiDiGraph, trace: Trace, mem: dict) -> None:
    index: dict[str, list[tuple[str, str, str, int]]] = defaultdict(list)  # token -> (record id, field, path, time)
    for r in trace.records.values():
        if r.type == "source":
            for path, tok in set(leaf_paths(r.content)):
                index[tok].append((r.id, path.rsplit("/", 1)[-1], path, r.time))
    for m in mem.values():
        for _, tok in set(leaves(m.value, m.field)):
            index[tok].append((m.id, m.field, key_path(m.key), m.time))
    own_source = {}
    for s in trace.steps:
        for p in s.produces:
            own_source[p] = set(s.produces) | set(s.reads)
    targets = [(m.id, m.time, [(m.field, t, m.key.split("/", 1)[0], key_path(m.key)) for _, t in leaves(m.value, m.field)]) for m in mem.values()]
    for s in trace.steps:
        if s.kind == "claim":
            for p in s.produces:
                toks = []
                for rid in s.reads:
                    if rid in mem:
                        toks += [(mem[rid].field, t, mem[rid].key.split("/", 1)[0], key_path(mem[rid].key)) for _, t in leaves(mem[rid].value, mem[rid].field)]
                targets.append((p, s.time, toks))
    for rid, time, toks in targets:
        exclude = own_source.get(rid, set()) | {rid}
        for field, tok, ent, tpath in toks:
            for sup, sfield, spath, stime in index.get(tok, ()):
                if sup not in exclude and stime < time:
                    g.add_edge(sup, rid, kind="support", token=tok, field=sfield, path=spath, target_field=field, target_entity=ent, target_path=tpath)
