"""A run's steps on a time line: the span tree with timings that trace viewers draw beside a graph.

Langfuse's trace view and Arize Phoenix's span tree show one row per observation (span), nested under
the span that started it, with a bar from its start to its end on a shared time axis. An execution graph
holds the same steps as nodes; :func:`timeline` lays them out that way:

Rows
    one per node, in a tree: an agent under the agent it ``acted_on_behalf_of``; a record or action under
    its owner agent; a tool result under the tool call (action) that ``generated`` it. Rows are in
    pre-order, siblings by start time (then the graph's order), with their ``depth`` in the tree.
Start
    the node's ``time``.
End (``until`` says which rule gave it)
    ``"span end"``: ``attributes["end_time"]`` when the node carries one (a span's end, same clock as
    ``time``); ``"result"``: for a tool call, the time of the first record it ``generated`` (the call lasts
    until its result comes back); ``"next step"``: otherwise the next later time of any step in the run
    (the step is the agent's latest until the next one); ``"last step"``: the run's last step lasts one
    message on a message clock, and is an instant (ends where it starts) in seconds. An agent's row spans its rows below it (``"children"``); one with none is an instant at its own time
    (``"no steps"``).

The clock (:func:`time_axis`): tau-bench trajectories carry no timestamps, and their ingest sets a node's
``time`` to its **message index** (``attributes["message_index"]``): the unit is then ``message``, counted
from the trajectory's start. Otherwise times are seconds; epoch seconds (from 1e8 s, 1973, on) are shown
as seconds since the run's first step (``+1.250 s``), others as they are.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from lab.provenance.graph import Node, NodeType, ProvenanceGraph, Relation
from lab.provenance.labels import node_label

__all__ = ["EPOCH_FROM", "time_axis", "format_time", "format_duration", "nice_ticks", "timeline"]

#: Times from this many seconds on are epoch seconds (shown relative to the run's first step).
EPOCH_FROM = 1e8


def time_axis(nodes: Iterable[Node]) -> dict[str, Any]:
    """The clock of ``nodes``' times (module docstring), JSON-ready.

    Returns
    -------
    dict
        ``unit`` (``"message"`` or ``"s"``), ``name`` (what the axis measures, for its title),
        ``origin`` (the time shown as 0: ``0`` for messages and plain seconds, the first time for epoch
        seconds), ``epoch`` (bool), ``origin_utc`` (ISO 8601 of the origin for epoch seconds, else ``""``),
        ``step`` (the slider's step in time units: 1 message, else 0 for continuous), ``range``
        (``[first, last]`` time, ``[0, 0]`` for no nodes).
    """
    nodes = list(nodes)
    times = [float(n.time) for n in nodes]
    lo, hi = (min(times), max(times)) if times else (0.0, 0.0)
    if any("message_index" in n.attributes for n in nodes):
        return {"unit": "message", "name": "message index in the trajectory (no timestamps)", "origin": 0.0, "epoch": False,
                "origin_utc": "", "step": 1.0, "range": [lo, hi]}
    if times and lo >= EPOCH_FROM:
        iso = datetime.fromtimestamp(lo, UTC).isoformat(timespec="milliseconds")
        return {"unit": "s", "name": f"seconds since the run's first step ({iso})", "origin": lo, "epoch": True,
                "origin_utc": iso, "step": 0.0, "range": [lo, hi]}
    return {"unit": "s", "name": "time (s)", "origin": 0.0, "epoch": False, "origin_utc": "", "step": 0.0, "range": [lo, hi]}


def _number(x: float) -> str:
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.3f}".rstrip("0").rstrip(".") if abs(x) >= 0.001 else f"{x:.3g}"


def format_time(axis: dict[str, Any], t: float) -> str:
    """Time ``t`` on ``axis``: ``"message 14"``, ``"+1.25 s"`` (epoch, since the first step) or ``"3.5 s"``."""
    if axis["unit"] == "message":
        return f"message {_number(t)}"
    if axis["epoch"]:
        return f"+{_number(t - axis['origin'])} s"
    return f"{_number(t)} s"


def _tick(axis: dict[str, Any], t: float) -> str:
    """A tick's label: the message index alone (the axis title names the unit), else as :func:`format_time`."""
    return _number(t) if axis["unit"] == "message" else format_time(axis, t)


def format_duration(axis: dict[str, Any], d: float) -> str:
    """A duration on ``axis``: ``"2 messages"``, ``"1 message"``, ``"0.25 s"``."""
    if axis["unit"] == "message":
        return f"{_number(d)} message{'' if d == 1 else 's'}"
    return f"{_number(d)} s"


def nice_ticks(lo: float, hi: float, count: int = 6, integer: bool = False) -> list[float]:
    """About ``count`` round tick values (steps 1, 2 or 5 times a power of ten) covering ``[lo, hi]``.

    Integer steps when ``integer`` (message indices). ``[lo]`` when ``hi <= lo``.
    """
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / max(1, count - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9) * step
    out, t = [], first
    while t <= hi + 1e-9 * step:
        out.append(round(t, 12))
        t += step
    return out


def timeline(graph: ProvenanceGraph, node_ids: Sequence[str]) -> dict[str, Any]:
    """The rows of a span-tree timeline of ``node_ids`` (normally one run's nodes), JSON-ready.

    Parameters
    ----------
    graph : ProvenanceGraph
    node_ids : sequence of str
        The nodes to lay out (the explorer's nodes; the rules read only edges between them).

    Returns
    -------
    dict
        ``rows``: list of ``{id, type, label (one line), depth, parent, start, end, duration, until,
        left, width, start_label, duration_label}`` in display order (module docstring), ``left`` and
        ``width`` the bar's position as fractions of the axis (``width`` 0 for an instant: the widget
        draws a tick); ``axis`` (:func:`time_axis`, plus ``start`` and ``end`` of the drawn span and its
        ``ticks`` as ``[{"at": fraction, "label": str}]``, a message tick labelled by its index alone, a
        seconds tick as ``"+2 s"`` or ``"2 s"``).

    Raises
    ------
    UnknownNodeError
        An id the graph does not hold.
    """
    nodes = [graph.node(i) for i in node_ids]
    order = {n.id: k for k, n in enumerate(nodes)}
    axis = time_axis(nodes)
    times = sorted({float(n.time) for n in nodes})

    generated: dict[str, list[str]] = {}
    result_of: dict[str, str] = {}
    boss: dict[str, str] = {}
    for e in graph.edges(relation=Relation.GENERATED):
        if e.src in order and e.dst in order:
            generated.setdefault(e.src, []).append(e.dst)
            result_of.setdefault(e.dst, e.src)
    for e in graph.edges(relation=Relation.ACTED_ON_BEHALF_OF):
        if e.src in order and e.dst in order and e.src != e.dst:
            boss.setdefault(e.src, e.dst)

    def own_end(n: Node) -> tuple[float, str]:
        start = float(n.time)
        end = n.attributes.get("end_time")
        if isinstance(end, int | float) and not isinstance(end, bool) and end >= start:
            return float(end), "span end"
        results = [float(graph_node.time) for graph_node in (by_id[d] for d in generated.get(n.id, [])) if graph_node.time >= start]
        if results:
            return min(results), "result"
        k = bisect.bisect_right(times, start)
        if k < len(times):
            return times[k], "next step"
        return start + axis["step"], "last step"

    by_id = {n.id: n for n in nodes}

    def parent(n: Node) -> str | None:
        if n.type == NodeType.AGENT:
            p = boss.get(n.id)
        elif n.id in result_of:
            p = result_of[n.id]
        else:
            p = n.owner if n.owner in by_id and n.owner != n.id else None
        return p

    parents = {n.id: parent(n) for n in nodes}
    # break cycles (an agent acting for one acting for it): such a node becomes a root
    for nid in list(parents):
        seen, cur = {nid}, parents[nid]
        while cur is not None:
            if cur in seen:
                parents[nid] = None
                break
            seen.add(cur)
            cur = parents[cur]
    children: dict[str | None, list[str]] = {}
    for n in nodes:
        children.setdefault(parents[n.id], []).append(n.id)

    span: dict[str, tuple[float, float, str]] = {}

    def compute(nid: str) -> tuple[float, float, str]:
        if nid in span:
            return span[nid]
        n = by_id[nid]
        kids = children.get(nid, [])
        if n.type == NodeType.AGENT:
            ranges = [compute(k) for k in kids]
            if ranges:
                span[nid] = (min(r[0] for r in ranges), max(r[1] for r in ranges), "children")
            else:
                span[nid] = (float(n.time), float(n.time), "no steps")
        else:
            for k in kids:
                compute(k)
            end, until = own_end(n)
            span[nid] = (float(n.time), end, until)
        return span[nid]

    for n in nodes:
        compute(n.id)
    t0 = min((s[0] for s in span.values()), default=0.0)
    t1 = max((s[1] for s in span.values()), default=0.0)
    if t1 <= t0:
        t1 = t0 + (axis["step"] or 1.0)
    scale = t1 - t0

    rows: list[dict[str, Any]] = []

    def visit(nid: str, depth: int) -> None:
        n = by_id[nid]
        start, end, until = span[nid]
        rows.append(
            {
                "id": nid,
                "type": n.type.value,
                "label": " · ".join(node_label(n).split("\n")),
                "depth": depth,
                "parent": parents[nid] or "",
                "start": start,
                "end": end,
                "duration": end - start,
                "until": until,
                "left": (start - t0) / scale,
                "width": (end - start) / scale,
                "start_label": format_time(axis, start),
                "duration_label": format_duration(axis, end - start),
            }
        )
        for k in sorted(children.get(nid, []), key=lambda k: (span[k][0], order[k])):
            visit(k, depth + 1)

    for root in sorted(children.get(None, []), key=lambda k: (span[k][0], order[k])):
        visit(root, 0)
    origin = axis["origin"]
    ticks = nice_ticks(t0 - origin, t1 - origin, integer=axis["unit"] == "message")
    axis = {
        **axis,
        "start": t0,
        "end": t1,
        "ticks": [{"at": (t + origin - t0) / scale, "label": _tick(axis, t + origin)} for t in ticks if 0 <= (t + origin - t0) / scale <= 1 + 1e-9],
    }
    return {"rows": rows, "axis": axis}
