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
    assert nodes["s2"]["label"] == "public web page public web\npage public web page public…"  # two lines, cut at words
    assert nodes["s2"]["text"] == "public web page " * 5  # the full text travels too (the detail panel)
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
    policy.revoke_source("s1", "forged")
    nodes = by_id(explorer_elements(g, run="r1", agent="bob", policy=policy))
    assert nodes["m1"]["reason"] == "revoked: ancestor 's1' is revoked"  # derived from it
    # the view shows exactly the policy's verdicts (revocation's rules are lab.provenance.access's)
    _, excluded = policy.eligible("bob", list(nodes))
    assert {i: d["reason"] for i, d in nodes.items() if not d["eligible"]} == excluded
    assert nodes["s2"]["trust"] == 0.0 and nodes["s2"]["valid"] is False and "invalid" in nodes["s2"]["marks"]


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
    start = time.perf_counter()
    rows = timeline(g, [n["data"]["id"] for n in els["nodes"]])["rows"]
    assert len(rows) == 5000 and time.perf_counter() - start < 10  # sanity bound only (next steps by bisection)
    # the owner "agent" is not in run r: every row is a root, in time order; m0 lasts until c0 starts
    assert [r["id"] for r in rows[:3]] == ["s0", "m0", "c0"] and rows[1]["end"] == 0.2 and {r["depth"] for r in rows} == {0}


# -- readable labels, legend, counter, search, time axis and timeline (lab.provenance.labels / view / timeline)

from lab.provenance.ingest import ingest_spans, ingest_taubench  # noqa: E402
from lab.provenance.labels import LINE_CHARS, key_arguments, node_label, tool_call  # noqa: E402
from lab.provenance.timeline import format_duration, format_time, nice_ticks, timeline  # noqa: E402
from lab.provenance.view import BORDER_ENCODING, NODE_ENCODING, counter, legend, search, time_label  # noqa: E402

RUN32 = "tau-airline/task32/trial1"
RUN0 = "tau-airline/task0/trial0"
SPANS = Path(__file__).resolve().parent / "data" / "openinference_spans.json"


@pytest.fixture(scope="module")
def tau():
    """All 200 tau-bench airline trajectories, ingested once."""
    g = ProvenanceGraph()
    ingest_taubench(g)
    return g


def test_labels_of_real_tau_bench_runs_name_the_tool_and_its_key_arguments(tau):
    labels = {n.id.removeprefix(RUN32 + "/"): node_label(n) for n in tau.nodes(run=RUN32)}
    assert labels["msg16/call0"].split("\n")[0] == "book_reservation"  # the tool, not 'book_reservation({"cabin"…'
    assert labels["msg16/call0"].split("\n")[1].startswith("user_id=sophia_silva")  # the identifier first
    assert labels["msg16/call0"].endswith(" +10")  # the 10 other arguments are counted, shown in the detail panel
    assert labels["msg7"] == "get_user_details result\nuser_id=sophia_silva_7557"
    assert labels["msg11"] == "search_direct_flight result\norigin=ORD, destination=PHL +1"
    assert labels["user"] == "user sophia_silva_7557" and labels["agent"] == "assistant"
    claim = tau.node(f"{RUN32}/msg18/claim")
    first, second = labels["msg18/claim"].split("\n")
    assert " ".join(claim.text.split()).startswith(f"{first} {second.rstrip('…')}")  # the text's first words, cut at a word
    errors = {n.id: node_label(n) for n in tau.nodes(run=RUN0) if n.text.startswith("Error")}
    assert errors == {f"{RUN0}/msg21": "book_reservation error\nError: payment amount does…"}
    # every label of every run: at most two lines of LINE_CHARS, never raw JSON
    for n in tau.nodes():
        label = node_label(n)
        lines = label.split("\n")
        assert len(lines) <= 2 and all(len(line) <= LINE_CHARS for line in lines), (n.id, label)
        assert '{"' not in label and "[{" not in label, (n.id, label)
        if n.type.value == "action":
            assert lines[0] == n.attributes["tool"], (n.id, label)


def test_key_arguments_and_tool_calls_from_text():
    args = {"cabin": "economy", "reservation_id": "HATHAT", "flights": [{"x": 1}]}
    assert key_arguments(args, limit=60) == "reservation_id=HATHAT, cabin=economy +1"  # identifiers first, lists counted
    assert key_arguments(args) == "reservation_id=HATHAT +2"  # whole pairs only, within LINE_CHARS
    assert key_arguments({}) == ""
    assert key_arguments({"flights": [1, 2]}) == "1 argument"  # nothing scalar to show
    long = key_arguments({"thought": "a very long thought " * 5})
    assert long.startswith("thought=a very long") and long.endswith("…") and len(long) <= LINE_CHARS
    # a node without attributes: the text `name({...})` is read as a call (an OpenInference action's text)
    n = Node(id="a", type="action", text='issue_refund({"order_id": "ORDER7781", "amount": 20})')
    assert tool_call(n) == ("issue_refund", {"order_id": "ORDER7781", "amount": 20})
    assert node_label(n) == "issue_refund\norder_id=ORDER7781, amount=20"
    assert tool_call(Node(id="b", type="claim", text="f(1)")) is None


def test_legend_lists_only_the_marks_drawn_with_counts_that_follow_the_filters():
    g = small_graph()
    decision = ActionGate(g).decide("alice", "high", ["c1"], now=10.0)
    g.invalidate("s2", reason="retracted")
    els = explorer_elements(g, run="r1", agent="bob", decisions={"x1": decision})
    entries = {(e["kind"], e["key"]): e for e in legend(els)}
    assert [k for k in entries if k[0] == "type"] == [("type", t) for t in NODE_ENCODING if t in els["types"]]
    assert entries["type", "source"]["shape"] == "round-rectangle" and entries["type", "source"]["count"] == 2
    assert {k for k in entries if k[0] == "border"} == {("border", "trust"), ("border", "ineligible"), ("border", "invalid"), ("border", "gate_block")}
    assert entries["border", "gate_block"]["count"] == 1 and entries["border", "gate_block"]["color"] == BORDER_ENCODING["gate_block"]["color"]
    assert entries["border", "invalid"]["count"] == 1  # s2
    ineligible = sum(not n["data"]["eligible"] for n in els["nodes"])
    assert entries["border", "ineligible"]["count"] == ineligible > 0
    assert by_id(els)["x1"]["marks"] == ["ineligible", "gate_block"]
    # no memory, no gate: those marks are not in the legend
    g2 = ProvenanceGraph()
    g2.add_nodes([Node(id="s", type="source", text="x"), Node(id="c", type="claim", text="y")])
    assert [(e["kind"], e["key"]) for e in legend(explorer_elements(g2))] == [("type", "source"), ("type", "claim"), ("border", "trust")]
    # after a filter: every entry's `shown` counts the visible nodes carrying it
    shown = visible_ids(els, {"types": ["source", "action"]})
    after = {(e["kind"], e["key"]): e for e in legend(els, shown)}
    assert after["type", "source"]["shown"] == 2 and after["type", "claim"]["shown"] == 0 and after["type", "claim"]["count"] == 1
    assert after["border", "trust"]["shown"] == 3 and after["border", "gate_block"]["shown"] == 1


def test_counter_follows_the_filters_on_a_real_run(tau):
    els = explorer_elements(tau, run=RUN32)
    full = counter(els, visible_ids(els))
    assert full["nodes_shown"] == full["nodes_total"] == len(els["nodes"]) and full["edges_shown"] == len(els["edges"])
    no_claims = visible_ids(els, {"types": [t for t in els["types"] if t != "claim"]})
    c = counter(els, no_claims)
    claims = sum(n["data"]["type"] == "claim" for n in els["nodes"])
    claim_edges = sum(1 for e in els["edges"] if by_id(els)[e["data"]["source"]]["type"] == "claim" or by_id(els)[e["data"]["target"]]["type"] == "claim")
    assert claims > 0 and c["nodes_shown"] == len(els["nodes"]) - claims
    assert c["edges_shown"] == len(els["edges"]) - claim_edges
    assert c["text"] == f"{c['nodes_shown']} of {len(els['nodes'])} nodes, {c['edges_shown']} of {len(els['edges'])} edges shown"
    # the widget recomputes it when the browser sends new filters or a time limit
    w = ProvenanceExplorer(tau, run=RUN32)
    assert w.counter == full
    w.set_state({"filters": {**w.filters, "types": [t for t in els["types"] if t != "claim"]}})
    assert w.counter == c
    w.set_state({"time_max": 11.0})
    assert w.counter["nodes_shown"] == len(visible_ids(w.elements, w.filters, 11.0)) < c["nodes_shown"]


def test_search_by_id_and_by_text_on_a_real_run(tau):
    els = explorer_elements(tau, run=RUN32)
    by_run_id = search(els, "msg16/call0")  # the id after the run's prefix: exact, first
    assert by_run_id["hits"][0] == {"id": f"{RUN32}/msg16/call0", "field": "id", "snippet": f"{RUN32}/msg16/call0", "exact": True}
    assert search(els, f"{RUN32}/msg16/call0")["hits"][0]["exact"]
    text_ids = {n["data"]["id"] for n in els["nodes"] if "hat271" in n["data"]["text"].lower()}
    hits = search(els, "  HAT271 ")  # case and surrounding whitespace do not matter
    assert hits["query"] == "hat271" and {h["id"] for h in hits["hits"]} >= text_ids and len(text_ids) >= 2
    assert all("hat271" in h["snippet"].lower() for h in hits["hits"])
    order = [h["field"] for h in hits["hits"]]
    assert order == sorted(order, key=["id", "label", "tool call", "text"].index)  # ranked by the field that matched
    first = search(els, "get_user_details")["hits"][0]
    assert (first["id"], first["field"], first["exact"]) == (f"{RUN32}/msg7", "label", False)
    assert first["snippet"].startswith("get_user_details result · user_id=sophia")
    assert search(els, "")["hits"] == [] and search(els, "no such words anywhere")["total"] == 0
    assert len(search(els, "msg", limit=3)["hits"]) == 3 and search(els, "msg", limit=3)["total"] == len(els["nodes"]) - 2  # not the agents
    w = ProvenanceExplorer(tau, run=RUN32)
    w.set_state({"query": "HAT271"})  # what the search box sends
    assert w.hits == hits | {"query": "hat271"}


def test_time_axis_units_and_slider_label(tau):
    els = explorer_elements(tau, run=RUN32)
    assert els["time_axis"]["unit"] == "message" and els["time_axis"]["step"] == 1.0
    last = int(els["time_range"][1])
    assert last == max(int(n.attributes.get("message_index", 0)) for n in tau.nodes(run=RUN32)) >= 18
    assert time_label(els, None) == f"all (message 0 – message {last})"
    assert time_label(els, 11.0) == f"≤ message 11 (of message 0 – message {last})"
    g = ProvenanceGraph()
    ingest_spans(g, SPANS)
    spans = explorer_elements(g, run="t1")
    assert spans["time_axis"]["epoch"] and spans["time_axis"]["unit"] == "s"
    assert spans["time_axis"]["origin_utc"] == "2025-03-01T10:00:00.000+00:00"
    lo, hi = spans["time_range"]
    assert hi - lo == int(hi - lo) >= 5  # whole seconds in the fixture
    assert time_label(spans, lo + 2.5) == f"≤ +2.5 s (of +0 s – +{int(hi - lo)} s)"
    plain = explorer_elements(small_graph(), run="r1")
    assert time_label(plain, 2.5) == "≤ 2.5 s (of 0 s – 5 s)"
    assert format_duration(els["time_axis"], 1) == "1 message" and format_duration(els["time_axis"], 3) == "3 messages"
    assert format_time(spans["time_axis"], spans["time_range"][0] + 0.125) == "+0.125 s"
    assert nice_ticks(7, 30, integer=True) == [10, 15, 20, 25, 30] and nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    w = ProvenanceExplorer(tau, run=RUN32)
    assert w.time_label == f"all (message 0 – message {last})"
    w.set_state({"time_max": 11.0})
    assert w.time_label == f"≤ message 11 (of message 0 – message {last})"


def test_timeline_rows_of_a_real_run_are_a_span_tree_with_timings(tau):
    ids = [n.id for n in tau.nodes(run=RUN0)]
    tl = timeline(tau, ids)
    rows = {r["id"]: r for r in tl["rows"]}
    assert sorted(rows) == sorted(ids) and len(tl["rows"]) == len(ids)  # one row per step
    # the tree: user > assistant > steps; a tool result under the call that generated it
    assert rows[f"{RUN0}/user"]["depth"] == 0 and rows[f"{RUN0}/agent"]["parent"] == f"{RUN0}/user"
    assert rows[f"{RUN0}/msg21"]["parent"] == f"{RUN0}/msg20/call0" and rows[f"{RUN0}/msg21"]["depth"] == 3
    assert rows[f"{RUN0}/msg7"]["parent"] == f"{RUN0}/agent" and rows[f"{RUN0}/msg7"]["depth"] == 2
    for n in tau.nodes(run=RUN0):  # everything else under its owner (a user message, if ingested, under the user)
        if n.type.value != "agent" and n.id != f"{RUN0}/msg21" and n.id != f"{RUN0}/msg29":
            assert rows[n.id]["parent"] == n.owner, n.id
    # pre-order, siblings by start: each row's parent comes before it, and the assistant's steps are in time order
    pos = {r["id"]: k for k, r in enumerate(tl["rows"])}
    assert all(pos[r["parent"]] < pos[r["id"]] for r in tl["rows"] if r["parent"])
    steps = [r for r in tl["rows"] if r["parent"] == f"{RUN0}/agent"]
    assert [r["start"] for r in steps] == sorted(r["start"] for r in steps)
    # timings: a call lasts until its result, other steps until the next step of the run, the last one message
    times = sorted({n.time for n in tau.nodes(run=RUN0)})
    after = lambda t: next(u for u in times if u > t)  # noqa: E731
    assert (rows[f"{RUN0}/msg20/call0"]["end"], rows[f"{RUN0}/msg20/call0"]["until"]) == (21.0, "result")
    assert (rows[f"{RUN0}/msg28/call0"]["end"], rows[f"{RUN0}/msg28/call0"]["until"]) == (29.0, "result")
    for sid in ("msg9", "msg10/claim", "msg21"):
        r = rows[f"{RUN0}/{sid}"]
        assert (r["end"], r["until"], r["duration"]) == (after(r["start"]), "next step", after(r["start"]) - r["start"]), sid
        assert r["duration_label"] == f"{int(r['duration'])} message{'s' if r['duration'] != 1 else ''}"
    end = times[-1] + 1
    assert [r["until"] for r in tl["rows"] if r["end"] == end and r["type"] != "agent"] == ["last step"]
    agent = rows[f"{RUN0}/agent"]
    mine = [rows[n.id] for n in tau.nodes(run=RUN0) if n.owner == f"{RUN0}/agent"]
    assert (agent["start"], agent["end"], agent["until"]) == (min(r["start"] for r in mine), max(r["end"] for r in mine), "children")
    # bars as fractions of the drawn axis [first step, last end]
    t0 = min(r["start"] for r in tl["rows"])
    assert tl["axis"]["start"] == t0 and tl["axis"]["end"] == end
    for r in tl["rows"]:
        assert r["left"] == pytest.approx((r["start"] - t0) / (end - t0)) and r["width"] == pytest.approx(r["duration"] / (end - t0))
    ticks = tl["axis"]["ticks"]
    assert all(t["label"].isdigit() for t in ticks) and len(ticks) >= 3  # the index; the axis's name says "message index"
    assert all(t["at"] == pytest.approx((int(t["label"]) - t0) / (end - t0)) for t in ticks)


def test_timeline_of_spans_uses_their_clock_and_an_end_time_when_a_node_has_one():
    g = ProvenanceGraph()
    ingest_spans(g, SPANS)
    tl = timeline(g, [n.id for n in g.nodes(run="t1")])
    rows = {r["id"]: r for r in tl["rows"]}
    top = tl["rows"][0]
    axis = tl["axis"]
    assert top["type"] == "agent" and top["depth"] == 0 and top["start_label"] == f"+{int(top['start'] - axis['origin'])} s"
    assert all(t["label"] == f"+{round(axis['start'] - axis['origin'] + t['at'] * (axis['end'] - axis['start']))} s" for t in axis["ticks"])
    assert rows["t1/s2"]["parent"] == "t1/s1"  # the researcher acted on behalf of the support agent
    assert all(r["start_label"].startswith("+") and r["duration_label"].endswith(" s") for r in tl["rows"])
    g2 = ProvenanceGraph()
    g2.add_nodes([
        Node(id="a", type="agent", time=1e9),
        Node(id="x", type="source", owner="a", time=1e9 + 1, attributes={"end_time": 1e9 + 4.5}),
        Node(id="y", type="claim", owner="a", time=1e9 + 2),
    ])
    rows = {r["id"]: r for r in timeline(g2, ["a", "x", "y"])["rows"]}
    assert (rows["x"]["end"] - 1e9, rows["x"]["until"], rows["x"]["duration_label"]) == (4.5, "span end", "3.5 s")
    assert (rows["y"]["duration"], rows["y"]["until"]) == (0.0, "last step")  # seconds: the last step is an instant
    assert (rows["a"]["start"] - 1e9, rows["a"]["end"] - 1e9) == (1.0, 4.5)
    with pytest.raises(UnknownNodeError):
        timeline(g2, ["nope"])


def test_widget_syncs_legend_timeline_and_a_detail_time_with_its_unit(tau):
    w = ProvenanceExplorer(tau, run=RUN32)
    assert len(w.timeline["rows"]) == len(w.elements["nodes"])
    assert {e["key"] for e in w.legend if e["kind"] == "type"} == set(w.elements["types"])
    w.selected = f"{RUN32}/msg16/call0"
    assert w.detail["time_label"] == "message 16" and w.detail["attributes"]["tool"] == "book_reservation"
    assert w.detail["text"].startswith("book_reservation({")  # the full text, for the detail panel
    state = w.get_state()
    for trait in ("legend", "counter", "time_label", "query", "hits", "timeline"):
        assert trait in state, trait
