"""lab.provenance.view (explorer elements, neighbourhood, describe) and the ProvenanceExplorer widget (Python side)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lab.provenance import Edge, Node, ProvenanceGraph
from lab.provenance.access import AccessPolicy
from lab.provenance.errors import UnknownNodeError
from lab.provenance.gate import ActionGate
from lab.provenance.trust import path_trusts
from lab.provenance.view import PUBLIC, describe, explorer_elements, neighbourhood, visible_ids
from widgets.provenance_explorer import ProvenanceExplorer

BUNDLE = Path(__file__).resolve().parents[1] / "widgets" / "provenance_explorer.js"


def small_graph() -> ProvenanceGraph:
    """s1 (finance, 0.9) -> m1 (0.8) -> c1 (0.5) -> x1 ; s2 (public, 0.5) -> c1 ; agents alice, bob."""
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="alice", type="agent", run="r1", time=0.0),
            Node(id="bob", type="agent", run="r1", time=0.0),
            Node(id="s1", type="source", text="bank statement", trust=0.9, labels=frozenset({"finance"}), owner="alice", run="r1", time=1.0),
            Node(id="s2", type="source", text="public web page " * 5, trust=0.5, owner="alice", run="r1", time=2.0),
            Node(id="m1", type="memory", text="balance summary", trust=0.8, owner="alice", run="r1", time=3.0),
            Node(id="c1", type="claim", text="can afford", trust=0.5, owner="alice", run="r1", time=4.0),
            Node(id="x1", type="action", text="book flight", owner="alice", run="r1", time=5.0),
            Node(id="other", type="source", run="r2", time=9.0),
        ]
    )
    g.add_edges(
        [
            Edge(src="m1", dst="s1", relation="derived_from"),
            Edge(src="c1", dst="m1", relation="derived_from"),
            Edge(src="s2", dst="c1", relation="supports"),
            Edge(src="c1", dst="x1", relation="supports"),
            Edge(src="x1", dst="alice", relation="attributed_to"),
        ]
    )
    return g


def by_id(elements):
    return {n["data"]["id"]: n["data"] for n in elements["nodes"]}


def test_elements_counts_facets_and_trust():
    g = small_graph()
    els = explorer_elements(g, run="r1")
    json.dumps(els)  # JSON-ready for the front end
    nodes = by_id(els)
    assert set(nodes) == {"alice", "bob", "s1", "s2", "m1", "c1", "x1"}
    assert len(els["edges"]) == 5
    assert {e["data"]["relation"] for e in els["edges"]} == {"derived_from", "supports", "attributed_to"}
    assert els["types"] == ["action", "agent", "claim", "memory", "source"]
    assert els["agents"] == ["alice", "bob"]
    assert els["scopes"] == [PUBLIC, "finance"]
    assert els["time_range"] == [0.0, 5.0]
    assert not els["truncated"] and els["total"] == 7
    assert nodes["m1"]["trust"] == pytest.approx(0.9 * 0.8)
    assert nodes["c1"]["trust"] == pytest.approx(0.9 * 0.8 * 0.5)
    assert nodes["x1"]["trust"] == pytest.approx(path_trusts(g, ["x1"])["x1"])
    assert len(nodes["s2"]["label"]) <= 32 and nodes["s2"]["label"].endswith("…")
    assert nodes["bob"]["label"] == "bob"  # no text: the id
    assert all(n["eligible"] and n["reason"] == "" for n in nodes.values())  # no agent given
    assert len(explorer_elements(g)["nodes"]) == 8  # whole graph
    assert explorer_elements(g, max_nodes=3)["truncated"]


def test_eligibility_reasons_for_an_agent_without_grants_and_with_one():
    g = small_graph()
    nodes = by_id(explorer_elements(g, run="r1", agent="bob"))
    assert not nodes["s1"]["eligible"]
    assert nodes["s1"]["reason"] == "missing label 'finance' (carried by the record itself)"
    assert nodes["m1"]["reason"] == "missing label 'finance' (carried by ancestor 's1')"
    assert not nodes["x1"]["eligible"] and "ancestor 's1'" in nodes["x1"]["reason"]
    assert nodes["s2"]["eligible"] and nodes["s2"]["reason"] == ""
    policy = AccessPolicy(g)
    policy.grant("bob", "finance")
    assert all(n["eligible"] for n in by_id(explorer_elements(g, run="r1", agent="bob", policy=policy)).values())
    policy.revoke_source("s2", "retracted")
    nodes = by_id(explorer_elements(g, run="r1", agent="bob", policy=policy))
    assert nodes["c1"]["reason"] == "revoked: ancestor 's2' is revoked"
    assert nodes["s2"]["trust"] == 0.0 and nodes["s2"]["valid"] is False


def test_gate_decisions_on_actions_and_describe():
    g = small_graph()
    decision = ActionGate(g).decide("alice", "high", ["c1"], now=10.0)
    nodes = by_id(explorer_elements(g, run="r1", decisions={"x1": decision}))
    assert nodes["x1"]["gate"] == decision.decision.value == "block"
    assert nodes["x1"]["gate_reasons"] == decision.reasons
    assert nodes["c1"]["gate"] == ""
    d = describe(g, "x1", agent="bob", decisions={"x1": decision})
    assert d["id"] == "x1" and d["type"] == "action" and d["text"] == "book flight"
    assert d["eligible"] is False and "finance" in d["reason"]
    assert d["gate"]["decision"] == "block" and d["parents"] == ["c1"] and d["versions"] == 1
    assert d["trust"] == pytest.approx(0.36)
    assert describe(g, "s2", agent="bob")["reason"] == "readable"
    assert describe(g, "s2")["eligible"] is None
    assert neighbourhood(g, "m1") == {"ancestors": ["s1"], "descendants": ["c1", "x1"]}
    with pytest.raises(UnknownNodeError):
        neighbourhood(g, "nope")


def test_visible_ids_rule():
    els = explorer_elements(small_graph(), run="r1")
    assert len(visible_ids(els)) == 7
    assert visible_ids(els, {"types": ["source"]}) == ["s1", "s2"]
    assert visible_ids(els, {"scopes": ["finance"]}) == ["s1"]
    assert visible_ids(els, {"agents": ["bob"]}) == ["bob"]
    assert visible_ids(els, time_max=2.5) == ["alice", "bob", "s1", "s2"]


def test_widget_selection_updates_highlight_and_detail_in_python():
    g = small_graph()
    w = ProvenanceExplorer(g, run="r1", agent="bob")
    assert BUNDLE.exists() and "render" in BUNDLE.read_text()
    assert len(w.elements["nodes"]) == 7
    assert w.highlight == {"ancestors": [], "descendants": []} and w.detail == {}
    w.selected = "m1"  # what a click in the browser does
    assert w.highlight == {"ancestors": ["s1"], "descendants": ["c1", "x1"]}
    assert w.detail["id"] == "m1" and w.detail["eligible"] is False
    assert "ancestor 's1'" in w.detail["reason"]
    w.selected = "nope"
    assert w.highlight == {"ancestors": [], "descendants": []} and "error" in w.detail
    w.selected = ""
    assert w.detail == {}


def test_widget_filters_and_time_round_trip():
    w = ProvenanceExplorer(small_graph(), run="r1")
    assert w.filters == {"types": w.elements["types"], "agents": ["alice", "bob"], "scopes": [PUBLIC, "finance"]}
    state = w.get_state()
    assert state["filters"] == w.filters and state["time_max"] is None
    # a front-end message setting the traits, as the checkboxes and the scrubber send them
    w.set_state({"filters": {"types": ["claim"], "agents": ["alice"], "scopes": [PUBLIC]}, "time_max": 4.5, "selected": "c1"})
    assert w.filters["types"] == ["claim"] and w.time_max == 4.5
    assert visible_ids(w.elements, w.filters, w.time_max) == ["c1"]
    assert w.highlight["ancestors"] == ["m1", "s1", "s2"] and w.detail["id"] == "c1"
    assert w.get_state()["filters"]["agents"] == ["alice"]


def test_widget_syncs_the_visible_ids_python_computes():
    w = ProvenanceExplorer(small_graph(), run="r1")
    assert w.visible == visible_ids(w.elements) and len(w.visible) == 7
    assert "visible" in w.get_state() and w.get_state()["visible"] == w.visible
    # what the front end sends when a checkbox is unticked or the scrubber moves: Python answers with `visible`
    w.set_state({"filters": {"types": ["source", "memory"], "agents": ["alice"], "scopes": [PUBLIC, "finance"]}})
    assert w.visible == ["s1", "s2", "m1"]
    w.set_state({"time_max": 2.5})
    assert w.visible == ["s1", "s2"] == visible_ids(w.elements, w.filters, w.time_max)
    w.time_max = None
    w.refresh()  # filters reset: everything visible again
    assert w.visible == [n["data"]["id"] for n in w.elements["nodes"]]


def test_front_end_has_no_visibility_rule_of_its_own():
    """The rule lives in lab.provenance.view.visible_ids only: the ESM toggles classes from `visible`."""
    src = (BUNDLE.parent / "js" / "provenance_explorer" / "src" / "index.js").read_text()
    assert "applyVisibility" not in src and 'model.get("visible")' in src
    assert 'model.get("time_max")' not in src.split("function applyVisible")[1].split("function ")[0]
    bundle = BUNDLE.read_text()
    assert '.get("visible")' in bundle and "__labExplorers" in bundle  # the committed bundle is built from it


def test_five_thousand_nodes_build_quickly():
    g = ProvenanceGraph()
    nodes, edges = [Node(id="agent", type="agent")], []
    for i in range(1000):
        nodes += [
            Node(id=f"s{i}", type="source", trust=0.9, time=i, labels=frozenset({"secret"}) if i % 10 == 0 else frozenset(), run="r"),
            Node(id=f"m{i}", type="memory", time=i + 0.1, owner="agent", run="r"),
            Node(id=f"c{i}", type="claim", time=i + 0.2, owner="agent", run="r"),
            Node(id=f"x{i}", type="action", time=i + 0.3, owner="agent", run="r"),
            Node(id=f"n{i}", type="memory", time=i + 0.4, owner="agent", run="r"),
        ]
        edges += [
            Edge(src=f"m{i}", dst=f"s{i}", relation="derived_from"),
            Edge(src=f"c{i}", dst=f"m{i}", relation="derived_from"),
            Edge(src=f"c{i}", dst=f"x{i}", relation="supports"),
            Edge(src=f"n{i}", dst=f"c{i}", relation="derived_from"),
        ]
        if i:
            edges.append(Edge(src=f"m{i}", dst=f"m{i - 1}", relation="derived_from"))  # a long chain
    g.add_nodes(nodes)
    g.add_edges(edges)
    start = time.perf_counter()
    els = explorer_elements(g, run="r", agent="agent")
    elapsed = time.perf_counter() - start
    assert len(els["nodes"]) == 5000 and len(els["edges"]) == len(edges)
    assert elapsed < 10, elapsed  # sanity bound only
    nodes = by_id(els)
    assert not nodes["m999"]["eligible"]  # the chain reaches back to s0 (secret)
    assert nodes["s1"]["eligible"]
