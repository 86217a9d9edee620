"""View models of the execution graph for explorers (the logic behind ``widgets.ProvenanceExplorer``).

Everything a graph explorer shows is computed here, in plain ``lab`` code, as JSON-ready dicts:

:func:`explorer_elements`
    cytoscape-ready ``nodes`` and ``edges`` of one run (or the whole graph) with each node's path
    trust, its eligibility for an agent (and the reason when it is not eligible) and the action
    gate's decision for actions that have one; plus the facets a front end filters on (``types``,
    ``agents``, ``scopes``) and the ``time_range``. Batch calls only: one
    :func:`~lab.provenance.trust.path_trusts` pass and one :meth:`AccessPolicy.eligible` pass serve
    every node, so 5,000 nodes take well under a second or two.
:func:`neighbourhood`
    the lineage ancestors and descendants of one node (two recursive SQL queries).
:func:`describe`
    the fields of one node with its trust, eligibility reason and gate decision.
:func:`visible_ids`
    which node ids a set of filters and a time limit leave visible (the one copy of that rule:
    ``widgets.ProvenanceExplorer`` syncs its result as ``visible`` and the browser only shows those).
:func:`legend`, :func:`counter`
    what the shapes, colours and borders drawn mean (only those actually drawn, each with how many
    nodes carry it and how many of them are shown), and how many nodes and edges the filters leave shown.
:func:`search`
    the nodes whose id, label, tool call or text contain a query, best matches first, with the snippet.
:func:`time_label`
    the time slider's reading with its unit (:mod:`lab.provenance.timeline` for the clock and the
    span-tree timeline of a run's steps).

Node labels are :func:`lab.provenance.labels.node_label` (a tool call's name and key arguments, not its
raw JSON); the full text stays in ``text``. How each type is drawn (:data:`NODE_ENCODING`) and what the
borders mean (:data:`BORDER_ENCODING`) are defined here once: the front end styles its nodes and draws its
legend from them.

A node's *agent* (the ``agents`` facet) is its owner; an agent node's is its own id. Its *scopes*
are its own labels, or :data:`PUBLIC` when it has none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lab.provenance.access import AccessPolicy
from lab.provenance.gate import GateDecision
from lab.provenance.graph import Node, NodeType, ProvenanceGraph
from lab.provenance.labels import node_label, tool_call
from lab.provenance.timeline import format_time, time_axis
from lab.provenance.trust import path_trusts

__all__ = [
    "PUBLIC",
    "NODE_ENCODING",
    "BORDER_ENCODING",
    "explorer_elements",
    "neighbourhood",
    "describe",
    "visible_ids",
    "legend",
    "counter",
    "search",
    "time_label",
]

#: The scope shown for nodes without labels (readable by anyone).
PUBLIC = "(public)"

#: How each node type is drawn (a cytoscape shape and fill colour) and what it stands for.
NODE_ENCODING: dict[str, dict[str, str]] = {
    "agent": {"shape": "diamond", "color": "#6a3d9a", "meaning": "agent (a principal: assistant, user)"},
    "source": {"shape": "round-rectangle", "color": "#1f77b4", "meaning": "source (a tool result, a document)"},
    "memory": {"shape": "ellipse", "color": "#17becf", "meaning": "memory (a stored record)"},
    "claim": {"shape": "hexagon", "color": "#ff7f0e", "meaning": "claim (what the agent said, with support)"},
    "action": {"shape": "rectangle", "color": "#d62728", "meaning": "action (a write tool call)"},
}
#: Border and fill marks beyond the type, keyed by what sets them (the front end's styles use these keys).
#: ``trust`` is a colour ramp from ``color`` (path trust 0) to ``color_high`` (1).
BORDER_ENCODING: dict[str, dict[str, Any]] = {
    "trust": {"border": "solid", "color": "#d62728", "color_high": "#2ca02c", "meaning": "border colour: path trust 0 (red) to 1 (green)"},
    "ineligible": {"border": "solid", "color": "#999999", "fill": "#cccccc", "meaning": "grey: the agent may not read it (hover: why)"},
    "invalid": {"border": "dashed", "color": "#555555", "meaning": "dashed border: invalidated or revoked"},
    "gate_block": {"border": "double", "color": "#bb0000", "meaning": "double red border: the gate blocks this action"},
    "gate_allow": {"border": "double", "color": "#008800", "meaning": "double green border: the gate allows this action"},
    "gate_confirm": {"border": "double", "color": "#ee9900", "meaning": "double orange border: the gate asks to confirm or verify"},
}


def _json_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments as JSON-ready values (anything else as its string)."""
    import json

    try:
        json.dumps(args)
        return dict(args)
    except (TypeError, ValueError):
        return {str(k): v if isinstance(v, str | int | float | bool) or v is None else str(v) for k, v in args.items()}


def _agent_of(node: Node) -> str:
    if node.type == NodeType.AGENT:
        return node.id
    return node.owner or ""


def _scopes_of(node: Node) -> list[str]:
    return sorted(node.labels) or [PUBLIC]


def _marks(eligible: bool, valid: bool, gate: str) -> list[str]:
    """The :data:`BORDER_ENCODING` keys besides ``trust`` that a node carries (its classes in the front end)."""
    out = [] if eligible else ["ineligible"]
    if not valid:
        out.append("invalid")
    if gate:
        out.append("gate_confirm" if gate in ("confirm", "verify") else f"gate_{gate}")
    return out


def _gate(decision: GateDecision | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if decision is None:
        return None
    if isinstance(decision, GateDecision):
        return decision.model_dump(mode="json")
    return GateDecision.model_validate(decision).model_dump(mode="json")


def _eligibility(graph: ProvenanceGraph, ids: list[str], agent: str | None, policy: AccessPolicy | None) -> dict[str, str] | None:
    """``None`` without an agent, else ``{id: reason}`` for every excluded id (one batch call)."""
    if agent is None or not ids:
        return None
    policy = policy or AccessPolicy(graph)
    _, excluded = policy.eligible(agent, ids)
    return excluded


def explorer_elements(
    graph: ProvenanceGraph,
    *,
    run: str | None = None,
    agent: str | None = None,
    policy: AccessPolicy | None = None,
    decisions: Mapping[str, GateDecision | Mapping[str, Any]] | None = None,
    max_nodes: int = 5000,
) -> dict[str, Any]:
    """Cytoscape-ready elements of ``graph`` (of one ``run`` if given), JSON-serialisable.

    Parameters
    ----------
    graph : ProvenanceGraph
    run : str, optional
        Only nodes of this run (edges whose both ends are shown).
    agent : str, optional
        The principal whose eligibility is shown (an agent node id); without it every node is eligible.
    policy : AccessPolicy, optional
        Default ``AccessPolicy(graph)``.
    decisions : mapping of action id to GateDecision, optional
        Gate decisions to show on action nodes.
    max_nodes : int
        At most this many nodes (in insertion order); ``truncated`` says whether some were left out.

    Returns
    -------
    dict
        ``nodes``: list of ``{"data": {id, type, label, text, trust, eligible, reason, time, owner,
        agent, labels, scopes, valid, run, gate, gate_reasons}}``; ``edges``: list of
        ``{"data": {id, source, target, relation}}``; ``agents``, ``scopes``, ``types`` (sorted
        facet values), ``time_range`` (``[min, max]`` or ``[0, 0]`` when empty), ``time_axis``
        (:func:`lab.provenance.timeline.time_axis`: the clock's unit), ``encoding`` (``{"types":
        NODE_ENCODING, "borders": BORDER_ENCODING}``), ``agent``, ``run``, ``total`` (nodes before
        truncation) and ``truncated``. A node's ``label`` is :func:`~lab.provenance.labels.node_label`
        (up to two lines), ``tool`` and ``arguments`` its tool call's name and arguments (``""`` and
        ``{}`` for other nodes).
    """
    all_nodes = graph.nodes(run=run)
    total = len(all_nodes)
    shown = all_nodes[: max(0, int(max_nodes))]
    ids = [n.id for n in shown]
    id_set = set(ids)
    trust = path_trusts(graph, ids) if ids else {}
    excluded = _eligibility(graph, ids, agent, policy)
    decisions = decisions or {}

    nodes: list[dict[str, Any]] = []
    agents: set[str] = set()
    scopes: set[str] = set()
    types: set[str] = set()
    for n in shown:
        gate = _gate(decisions.get(n.id)) if n.type == NodeType.ACTION else None
        reason = "" if excluded is None else excluded.get(n.id, "")
        who, sc = _agent_of(n), _scopes_of(n)
        call = tool_call(n)
        agents.add(who)
        scopes.update(sc)
        types.add(n.type.value)
        nodes.append(
            {
                "data": {
                    "id": n.id,
                    "type": n.type.value,
                    "label": node_label(n),
                    "text": n.text,
                    "tool": call[0] if call else "",
                    "arguments": _json_args(call[1]) if call else {},
                    "trust": round(float(trust[n.id]), 6),
                    "eligible": not reason,
                    "reason": reason,
                    "time": float(n.time),
                    "owner": n.owner or "",
                    "agent": who,
                    "labels": sorted(n.labels),
                    "scopes": sc,
                    "valid": n.valid,
                    "run": n.run or "",
                    "gate": gate["decision"] if gate else "",
                    "gate_reasons": gate["reasons"] if gate else [],
                    "marks": _marks(not reason, n.valid, gate["decision"] if gate else ""),
                }
            }
        )
    edges = [
        {"data": {"id": f"{e.src}|{e.relation.value}|{e.dst}", "source": e.src, "target": e.dst, "relation": e.relation.value}}
        for e in graph.edges()
        if e.src in id_set and e.dst in id_set
    ]
    times = [n.time for n in shown]
    return {
        "nodes": nodes,
        "edges": edges,
        "agents": sorted(agents),
        "scopes": sorted(scopes),
        "types": sorted(types),
        "time_range": [float(min(times)), float(max(times))] if times else [0.0, 0.0],
        "time_axis": time_axis(shown),
        "encoding": {"types": NODE_ENCODING, "borders": BORDER_ENCODING},
        "agent": agent or "",
        "run": run or "",
        "total": total,
        "truncated": total > len(shown),
    }


def neighbourhood(graph: ProvenanceGraph, node_id: str) -> dict[str, list[str]]:
    """``{"ancestors": [...], "descendants": [...]}`` of ``node_id`` along the lineage, sorted.

    Raises :class:`~lab.provenance.errors.UnknownNodeError` for an unknown id.
    """
    graph.node(node_id)  # raises for an unknown id
    return {"ancestors": sorted(graph.ancestors(node_id)), "descendants": sorted(graph.descendants(node_id))}


def describe(
    graph: ProvenanceGraph,
    node_id: str,
    *,
    agent: str | None = None,
    policy: AccessPolicy | None = None,
    decisions: Mapping[str, GateDecision | Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The selected node's fields (JSON-ready) plus ``trust`` (path trust), ``eligible`` and
    ``reason`` for ``agent`` (``eligible`` is ``None`` without an agent), ``parents`` and
    ``children`` (direct lineage), ``versions`` and ``gate`` (the decision's dump, or ``None``).

    Raises :class:`~lab.provenance.errors.UnknownNodeError` for an unknown id.
    """
    node = graph.node(node_id)
    out = node.model_dump(mode="json")
    out["labels"] = sorted(node.labels)
    out["trust"] = round(float(path_trusts(graph, [node_id])[node_id]), 6)
    excluded = _eligibility(graph, [node_id], agent, policy)
    out["agent"] = agent or ""
    out["eligible"] = None if excluded is None else node_id not in excluded
    out["reason"] = "" if excluded is None else excluded.get(node_id, "readable")
    out["parents"] = graph.parents(node_id)
    out["children"] = graph.children(node_id)
    out["versions"] = len(graph.history(node_id))
    out["gate"] = _gate((decisions or {}).get(node_id))
    return out


def visible_ids(elements: Mapping[str, Any], filters: Mapping[str, Iterable[str]] | None = None, time_max: float | None = None) -> list[str]:
    """The node ids of ``elements`` that ``filters`` and ``time_max`` leave visible.

    A node is visible when its type is in ``filters["types"]``, its agent in ``filters["agents"]``,
    at least one of its scopes in ``filters["scopes"]`` and its time ``<= time_max``. A facet
    missing from ``filters`` does not filter; ``time_max=None`` does not either.
    """
    filters = filters or {}
    sets = {k: set(filters[k]) for k in ("types", "agents", "scopes") if k in filters and filters[k] is not None}
    out = []
    for el in elements.get("nodes", []):
        d = el["data"]
        if "types" in sets and d["type"] not in sets["types"]:
            continue
        if "agents" in sets and d["agent"] not in sets["agents"]:
            continue
        if "scopes" in sets and not sets["scopes"].intersection(d["scopes"]):
            continue
        if time_max is not None and d["time"] > time_max:
            continue
        out.append(d["id"])
    return out


def legend(elements: Mapping[str, Any], visible: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """What the drawn shapes, colours and borders mean: one entry per mark actually carried by a node.

    Parameters
    ----------
    elements : mapping
        From :func:`explorer_elements`.
    visible : iterable of str, optional
        The ids shown (:func:`visible_ids`); default all.

    Returns
    -------
    list of dict
        ``{"kind": "type" | "border", "key", "meaning", "count", "shown", ...style}``: first the node types
        present (in :data:`NODE_ENCODING` order, with ``shape`` and ``color``), then the border marks present
        (``trust`` whenever there are nodes, then :data:`BORDER_ENCODING`'s others; with ``border``, ``color``
        and ``color_high``/``fill`` where they have one). ``count``: nodes carrying it; ``shown``: how many of
        those are visible. Marks no node carries are left out.
    """
    nodes = [el["data"] for el in elements.get("nodes", [])]
    shown_ids = None if visible is None else set(visible)
    encoding = elements.get("encoding") or {"types": NODE_ENCODING, "borders": BORDER_ENCODING}

    def tally(keys: Iterable[str]) -> tuple[dict[str, int], dict[str, int]]:
        return {k: 0 for k in keys}, {k: 0 for k in keys}

    count_t, shown_t = tally(encoding["types"])
    count_b, shown_b = tally(encoding["borders"])
    for d in nodes:
        on = shown_ids is None or d["id"] in shown_ids
        for table, shown, keys in ((count_t, shown_t, [d["type"]]), (count_b, shown_b, ["trust", *d.get("marks", [])])):
            for k in keys:
                if k in table:
                    table[k] += 1
                    shown[k] += on
    out = [{"kind": "type", "key": k, **encoding["types"][k], "count": c, "shown": shown_t[k]} for k, c in count_t.items() if c]
    out += [{"kind": "border", "key": k, **encoding["borders"][k], "count": c, "shown": shown_b[k]} for k, c in count_b.items() if c]
    return out


def counter(elements: Mapping[str, Any], visible: Iterable[str]) -> dict[str, Any]:
    """How many nodes and edges ``visible`` leaves shown, and the line the explorer prints.

    An edge is shown when both its ends are. Returns ``{"nodes_shown", "nodes_total", "edges_shown",
    "edges_total", "text"}`` (``text``: ``"5 of 17 nodes, 4 of 21 edges shown"``).
    """
    shown = set(visible)
    nodes = [el["data"]["id"] for el in elements.get("nodes", [])]
    edges = [el["data"] for el in elements.get("edges", [])]
    n_shown = sum(i in shown for i in nodes)
    e_shown = sum(e["source"] in shown and e["target"] in shown for e in edges)
    return {
        "nodes_shown": n_shown,
        "nodes_total": len(nodes),
        "edges_shown": e_shown,
        "edges_total": len(edges),
        "text": f"{n_shown} of {len(nodes)} nodes, {e_shown} of {len(edges)} edges shown",
    }


#: Search hits are ranked by the field that matched, in this order.
SEARCH_FIELDS = ("id", "label", "tool call", "text")
#: Characters of context on each side of a hit in its snippet.
SNIPPET_CHARS = 30


def _snippet(text: str, at: int, length: int) -> str:
    """``text`` (whitespace collapsed) around ``text[at:at + length]``, ``…`` where it was cut."""
    lo, hi = max(0, at - SNIPPET_CHARS), min(len(text), at + length + SNIPPET_CHARS)
    return ("…" if lo else "") + text[lo:hi] + ("…" if hi < len(text) else "")


def search(elements: Mapping[str, Any], query: str, *, limit: int = 50) -> dict[str, Any]:
    """The nodes of ``elements`` whose id, label, tool call or text contain ``query`` (case-insensitive).

    Parameters
    ----------
    elements : mapping
        From :func:`explorer_elements`.
    query : str
        Surrounding whitespace ignored; an empty query matches nothing.
    limit : int
        At most this many hits are returned (``total`` counts them all).

    Returns
    -------
    dict
        ``{"query", "total", "hits": [{"id", "field", "snippet", "exact"}]}``: each matching node once, under
        the first of :data:`SEARCH_FIELDS` that matched (``"tool call"``: its tool's name and arguments as
        JSON); an id equal to the query, or to the query after the run's prefix (``msg16/call0`` for
        ``tau-airline/task32/trial1/msg16/call0``), first (``exact``), then by field, then in the
        elements' order. ``snippet``: the matching field around the match.
    """
    import json

    q = " ".join(str(query).split()).lower()
    if not q:
        return {"query": "", "total": 0, "hits": []}
    ranked = []
    for k, el in enumerate(elements.get("nodes", [])):
        d = el["data"]
        nid = d["id"]
        exact = nid.lower() == q or nid.lower().endswith("/" + q)
        fields = {
            "id": nid,
            "label": " · ".join(str(d.get("label", "")).split("\n")),
            "tool call": f"{d['tool']}({json.dumps(d.get('arguments') or {}, sort_keys=True)})" if d.get("tool") else "",
            "text": str(d.get("text", "")),
        }
        for rank, field in enumerate(SEARCH_FIELDS):
            value = " ".join(fields[field].split())
            at = value.lower().find(q)
            if at >= 0:
                ranked.append((not exact, rank, k, {"id": nid, "field": field, "snippet": _snippet(value, at, len(q)), "exact": exact}))
                break
    ranked.sort(key=lambda r: r[:3])
    return {"query": q, "total": len(ranked), "hits": [r[3] for r in ranked[: max(0, int(limit))]]}


def time_label(elements: Mapping[str, Any], time_max: float | None) -> str:
    """The time slider's reading, with its unit: ``"≤ message 14 (of 0–18)"``; ``"all (message 0–18)"`` for ``None``.

    The unit is the elements' ``time_axis`` (:func:`lab.provenance.timeline.time_axis`): message indices for
    tau-bench runs (no timestamps), seconds since the first step for epoch times, else seconds.
    """
    axis = elements.get("time_axis") or time_axis([])
    lo, hi = axis["range"]
    span = f"{format_time(axis, lo)} – {format_time(axis, hi)}"
    if time_max is None:
        return f"all ({span})"
    return f"≤ {format_time(axis, float(time_max))} (of {span})"
