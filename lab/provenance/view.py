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

A node's *agent* (the ``agents`` facet) is its owner; an agent node's is its own id. Its *scopes*
are its own labels, or :data:`PUBLIC` when it has none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lab.provenance.access import AccessPolicy
from lab.provenance.gate import GateDecision
from lab.provenance.graph import Node, NodeType, ProvenanceGraph
from lab.provenance.trust import path_trusts

__all__ = ["PUBLIC", "LABEL_CHARS", "explorer_elements", "neighbourhood", "describe", "visible_ids"]

#: The scope shown for nodes without labels (readable by anyone).
PUBLIC = "(public)"
#: Node labels are cut to this many characters.
LABEL_CHARS = 32


def _short(node: Node) -> str:
    text = " ".join(node.text.split()) or node.id
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _agent_of(node: Node) -> str:
    if node.type == NodeType.AGENT:
        return node.id
    return node.owner or ""


def _scopes_of(node: Node) -> list[str]:
    return sorted(node.labels) or [PUBLIC]


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
        facet values), ``time_range`` (``[min, max]`` or ``[0, 0]`` when empty), ``agent``,
        ``run``, ``total`` (nodes before truncation) and ``truncated``.
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
        agents.add(who)
        scopes.update(sc)
        types.add(n.type.value)
        nodes.append(
            {
                "data": {
                    "id": n.id,
                    "type": n.type.value,
                    "label": _short(n),
                    "text": n.text,
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
