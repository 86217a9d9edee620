"""Ingest of real tau-bench trajectories and of an OpenInference / OTel GenAI span export."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from lab import data
from lab.provenance import ContentConflictError, DuplicateNodeError, IngestError, NodeType, ProvenanceGraph, Relation
from lab.provenance.access import AccessPolicy
from lab.provenance.ingest import ingest_spans, ingest_taubench
from lab.provenance.graph import Difference
from lab.provenance.ingest._runs import Verdict, verdict
from lab.provenance.ingest.taubench import USER_TRUST, WRITE_TOOLS

SPANS = Path(__file__).parent / "data" / "openinference_spans.json"
RUN = "tau-airline/task32/trial1"  # index 82 of the file: get_user_details, search_direct_flight, book_reservation


@pytest.fixture(scope="module")
def trajectories() -> list[dict]:
    return json.loads(Path(data.fetch("tau_bench_airline_trajectories")).read_text())


def _types(g: ProvenanceGraph, run: str | None = None) -> Counter:
    return Counter(n.type.value for n in g.nodes(run=run))


def _relations(g: ProvenanceGraph) -> Counter:
    return Counter(e.relation.value for e in g.edges())


def test_one_trajectory_by_hand(trajectories):
    t = trajectories[82]
    # by hand from the JSON: 20 messages; 3 tool calls (msgs 6, 10, 16) and their 3 results (msgs 7, 11, 17);
    # 7 user messages (1, 3, 5, 9, 13, 15, 19), each a source attributed to the user; one write (book_reservation
    # at msg 16); text replies at msgs 2, 4, 8, 12, 14, 18, of which 2 and 4 repeat nothing of an earlier source
    # (msg 1 says "May 26" without a year), so 4 claims (8, 12, 14, 18).
    assert (t["task_id"], t["trial"], len(t["traj"])) == (32, 1, 20)
    g = ProvenanceGraph()
    report = ingest_taubench(g, runs=[82])
    assert report.model_dump() == {
        "runs": 1, "agents": 2, "sources": 10, "claims": 4, "actions": 1, "memories": 0, "versions": 0, "edges": 30, "steps": 0, "unsupported": 0,
        "run_ids": [RUN], "extended": 0, "extended_ids": [], "present": 0, "present_ids": [], "empty": 0, "empty_ids": [], "already_present": False,
    }
    assert _types(g) == {"agent": 2, "source": 10, "claim": 4, "action": 1}
    assert _relations(g) == {"acted_on_behalf_of": 1, "attributed_to": 12, "supports": 12, "used": 4, "generated": 1}
    p = RUN + "/"
    book = g.node(p + "msg16/call0")
    assert book.attributes["tool"] == "book_reservation" and book.text.startswith("book_reservation({")
    # the booking used the user details (the payment id, the dob), the flight search (the flight number), and the
    # user's own words: the email holding her user id (msg 5) and her choice of flight (msg 13)
    used = {e.dst: e.attributes["values"] for e in g.edges(src=book.id, relation=Relation.USED)}
    assert used == {p + "msg7": ["1957-10-05", "credit_card_4196779"], p + "msg11": ["HAT271"], p + "msg5": ["sophia_silva_7557"], p + "msg13": ["HAT271"]}
    assert [e.dst for e in g.edges(src=book.id, relation=Relation.GENERATED)] == [p + "msg17"]
    assert g.edges(src=p + "agent", relation=Relation.ACTED_ON_BEHALF_OF)[0].dst == p + "user"
    supports = {(e.src, e.dst) for e in g.edges(relation=Relation.SUPPORTS)}
    assert supports == {
        (p + "msg5", p + "msg8/claim"),
        (p + "msg7", p + "msg8/claim"),
        (p + "msg11", p + "msg12/claim"),
        (p + "msg7", p + "msg14/claim"),
        (p + "msg9", p + "msg14/claim"),  # "the Visa ending in 7238"
        (p + "msg11", p + "msg14/claim"),
        (p + "msg13", p + "msg14/claim"),  # "Flight HAT271"
        (p + "msg7", p + "msg18/claim"),
        (p + "msg9", p + "msg18/claim"),
        (p + "msg11", p + "msg18/claim"),
        (p + "msg13", p + "msg18/claim"),
        (p + "msg17", p + "msg18/claim"),
    }
    e = g.edges(src=p + "msg11", dst=p + "msg12/claim")[0]
    assert e.attributes["tokens"] == ["114", "161", "174", "HAT139", "HAT271", "HAT289", "ORD", "PHL"]
    # labels: user data is scoped to the user, flight search results are public; claims inherit
    scope = frozenset({"user:sophia_silva_7557"})
    assert g.node(p + "msg7").labels == scope and g.node(p + "msg17").labels == scope
    assert g.node(p + "msg11").labels == frozenset() and g.node(p + "msg12/claim").labels == frozenset()
    assert g.node(p + "msg14/claim").labels == scope
    assert g.node(p + "msg7").trust == 1.0 and g.node(p + "msg7").owner == p + "agent"
    assert g.node(p + "msg17").time == 17.0
    assert p + "msg7" in g.ancestors(p + "msg18/claim")
    # what the user said: a source owned by the user, with her scope, trusted less than the airline's records
    said = g.node(p + "msg13")
    assert (said.type, said.text, said.owner, said.labels, said.trust) == (NodeType.SOURCE, t["traj"][13]["content"], p + "user", scope, USER_TRUST)
    assert said.attributes == {"role": "user", "message_index": 13}
    assert [e.dst for e in g.edges(src=said.id, relation=Relation.ATTRIBUTED_TO)] == [p + "user"]
    users = [n for n in g.nodes("source") if n.attributes.get("role") == "user"]
    assert [n.attributes["message_index"] for n in users] == [k for k, m in enumerate(t["traj"]) if m["role"] == "user"] == [1, 3, 5, 9, 13, 15, 19]


def test_full_file(trajectories):
    writes = sum(1 for t in trajectories for m in t["traj"] for c in m.get("tool_calls") or [] if c["function"]["name"] in WRITE_TOOLS)
    tool_messages = sum(1 for t in trajectories for m in t["traj"] if m["role"] == "tool")
    user_messages = sum(1 for t in trajectories for m in t["traj"] if m["role"] == "user" and (m["content"] or "").strip())
    g = ProvenanceGraph()
    report = ingest_taubench(g)
    assert (report.runs, report.agents, report.sources, report.actions) == (200, 400, tool_messages + user_messages, writes)
    assert (tool_messages, user_messages, writes) == (1164, 1490, 250)
    types = _types(g)
    assert types == {"agent": 400, "source": 1164 + 1490, "action": 250, "claim": report.claims}
    assert 0 < report.claims <= sum(1 for t in trajectories for m in t["traj"] if m["role"] == "assistant" and m.get("content"))
    rel = _relations(g)
    assert sum(rel.values()) == report.edges
    assert rel["acted_on_behalf_of"] == 200 and rel["attributed_to"] == report.claims + report.actions + user_messages
    assert rel["generated"] == 250  # every write call has its result
    assert len(g.runs()) == 200


def _write(tmp_path: Path, trajs: list) -> Path:
    path = tmp_path / "trajs.json"
    path.write_text(json.dumps(trajs))
    return path


@pytest.mark.parametrize(
    "mutate, where, reason",
    [
        (lambda t: t.pop("traj"), "[1].traj", "missing 'traj'"),
        (lambda t: t["traj"][3].pop("role"), "[1].traj[3].role", "message without 'role'"),
        (
            lambda t: t["traj"][16]["tool_calls"][0]["function"].__setitem__("arguments", "{bad"),
            "[1].traj[16].tool_calls[0].function.arguments",
            "function.arguments is not valid JSON: Expecting property name enclosed in double quotes (char 1)",
        ),
        (
            lambda t: t["traj"][17].__setitem__("tool_call_id", "call_nope"),
            "[1].traj[17].tool_call_id",
            "tool_call_id 'call_nope' matches no earlier tool call",
        ),
    ],
)
def test_malformed_is_all_or_nothing(tmp_path, trajectories, mutate, where, reason):
    bad = copy.deepcopy(trajectories[82])
    mutate(bad)
    path = _write(tmp_path, [trajectories[0], bad])  # the first one is fine and is written first
    g = ProvenanceGraph()
    with pytest.raises(IngestError) as info:
        ingest_taubench(g, path)
    assert str(info.value) == f"{path} at {where}: {reason}"
    assert (info.value.file, info.value.path) == (str(path), where)
    assert len(g) == 0 and g.edges() == []
    ingest_taubench(g, path, runs=[0])  # the graph is still usable
    assert len(g.runs()) == 1


def test_spans_fixture():
    g = ProvenanceGraph()
    report = ingest_spans(g, SPANS)
    assert report.model_dump() == {
        "runs": 1, "agents": 2, "sources": 4, "claims": 1, "actions": 1, "memories": 2, "versions": 0, "edges": 17, "steps": 2, "unsupported": 0, "run_ids": ["t1"],
        "extended": 0, "extended_ids": [], "present": 0, "present_ids": [], "empty": 0, "empty_ids": [], "already_present": False,
    }
    assert _types(g) == {"agent": 2, "source": 4, "claim": 1, "action": 1 + 2, "memory": 2}  # a write and two generic steps
    assert _relations(g) == {"acted_on_behalf_of": 1, "attributed_to": 10, "supports": 2, "used": 1, "generated": 1, "derived_from": 2}
    assert g.edges(src="t1/s2", relation="acted_on_behalf_of")[0].dst == "t1/s1"
    # the LLM put doc-17 and the memory in its prompt, not doc-42 nor the CHAIN output: a claim supported by both
    assert {e.src for e in g.edges(dst="t1/s6/claim", relation="supports")} == {"t1/s3/doc0", "t1/memory/mem-7"}
    assert g.node("t1/s3/doc1").attributes["document_id"] == "doc-42" and g.node("t1/s3/doc1").attributes["score"] == 0.35
    assert g.node("t1/s8").type == NodeType.ACTION and g.node("t1/s7/output").type == NodeType.SOURCE  # tool.write
    assert [e.dst for e in g.edges(src="t1/s8", relation="used")] == ["t1/s7/output"]
    assert {e.dst for e in g.edges(src="t1/memory/mem-8", relation="derived_from")} == {"t1/s7/output", "t1/s8/output"}
    assert g.node("t1/memory/mem-8").owner == "t1/s1" and g.node("t1/s6/claim").owner == "t1/s2"
    assert g.node("t1/s3/doc0").time == 1740823202.0  # 2025-03-01T10:00:02Z
    assert "t1/s10/claim" not in g  # ungrounded LLM output: no claim, a generic step
    steps = {n.id: (n.text, n.attributes["span_kind"], n.attributes["write"]) for n in g.nodes("action") if n.attributes["write"] is False}
    assert steps == {"t1/s5": ("CHAIN format_prompt", "CHAIN", False), "t1/s10": ("LLM ChatCompletion", "LLM", False)}
    assert g.node("t1/s10").attributes["output"] == "Goodbye!" and g.node("t1/s10").owner == "t1/s1"
    # attributes the mapping does not use are kept on the node
    assert g.node("t1/s1").attributes["span_attributes"] == {"graph.node.id": "support_agent", "user.id": "u-42"}
    assert g.node("t1/s1").attributes["end_time"] == 1740823209.0
    assert g.node("t1/s7/output").attributes["span_attributes"] == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup_order", "gen_ai.tool.call.id": "call_1", "gen_ai.tool.type": "function"}


def test_spans_malformed_is_all_or_nothing(tmp_path):
    spans = json.loads(SPANS.read_text())
    del spans[2]["attributes"]["retrieval"]["documents"][0]["document"]["id"]
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(spans))
    g = ProvenanceGraph()
    with pytest.raises(IngestError) as info:
        ingest_spans(g, path)
    assert str(info.value) == f"{path} at [2].attributes.retrieval.documents.0.document.id: retrieved document without an id"
    assert len(g) == 0 and g.edges() == []
    spans = json.loads(SPANS.read_text())
    spans[3]["attributes"].pop("gen_ai.memory.record.id")
    with pytest.raises(IngestError, match=r"^<spans> at \[3\]\.attributes\.gen_ai\.memory\.record\.id: search_memory span without"):
        ingest_spans(g, spans)
    assert len(g) == 0


# -- re-ingesting: the same content is a no-op that says so, other content under the same ids a typed error


def _snapshot(g: ProvenanceGraph) -> tuple:
    """Every node version and every edge, as stored."""
    versions = {n.id: [(v, reason, n2.model_dump(mode="json")) for v, reason, n2 in g.history(n.id)] for n in g.nodes()}
    return versions, [e.model_dump(mode="json") for e in g.edges()]


def test_readme_snippet_runs_twice_in_the_same_folder(tmp_path):
    # the README's snippet, run twice in one folder: the second process reopens runs.db and ingests again
    graph = ProvenanceGraph(tmp_path / "runs.db")
    first = ingest_taubench(graph)
    AccessPolicy(graph).grant(RUN + "/agent", "user:sophia_silva_7557")  # a later version of an ingested node
    before = _snapshot(graph)
    graph.close()
    graph = ProvenanceGraph(tmp_path / "runs.db")
    again = ingest_taubench(graph)
    assert (first.runs, first.present, first.already_present) == (200, 0, False)
    assert again.already_present and (again.present, again.present_ids) == (200, first.run_ids)
    assert again.model_dump(exclude={"present", "present_ids", "already_present"}) == {
        "runs": 0, "agents": 0, "sources": 0, "claims": 0, "actions": 0, "memories": 0, "versions": 0, "edges": 0, "steps": 0, "unsupported": 0, "run_ids": [],
        "extended": 0, "extended_ids": [], "empty": 0, "empty_ids": [],
    }
    assert _snapshot(graph) == before and (len(graph), len(graph.edges())) == (3935, 5883)
    AccessPolicy(graph).grant(RUN + "/agent", "user:sophia_silva_7557")  # the rest of the snippet is idempotent too
    assert len(graph.history(RUN + "/agent")) == 2


def test_reingest_skips_the_runs_stored_already(tmp_path, trajectories):
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_taubench(graph, runs=[0, 82])
    before = (len(graph), len(graph.edges()))
    again = ingest_taubench(graph, runs=[82, 0])  # the same graph object, the runs in another order
    assert again.already_present and again.present_ids == [RUN, "tau-airline/task0/trial0"] and again.runs == 0
    assert (len(graph), len(graph.edges())) == before
    graph.close()
    graph = ProvenanceGraph(tmp_path / "runs.db")  # reopened, as another process would
    mixed = ingest_taubench(graph, runs=[0, 5, 82])  # one new run among two stored ones: only it is written
    new = f"tau-airline/task{trajectories[5]['task_id']}/trial{trajectories[5]['trial']}"
    assert (mixed.runs, mixed.run_ids, mixed.present_ids, mixed.already_present) == (1, [new], ["tau-airline/task0/trial0", RUN], False)
    assert (len(graph), len(graph.edges())) == (before[0] + mixed.agents + mixed.sources + mixed.claims + mixed.actions, before[1] + mixed.edges)
    assert ingest_taubench(graph, runs=[82, 82]).present_ids == [RUN, RUN]  # a run named twice is stored once


@pytest.mark.parametrize(
    "mutate, node, field",
    [
        (lambda t: t["traj"][11].__setitem__("content", t["traj"][11]["content"].replace("HAT271", "HAT999")), RUN + "/msg11", "text"),
        (lambda t: t["info"]["task"].__setitem__("user_id", "mallory_1"), RUN + "/user", "text"),
    ],
)
def test_other_content_under_stored_ids_is_an_error(tmp_path, trajectories, mutate, node, field):
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_taubench(graph, runs=[0, 82])
    before = _snapshot(graph)
    tampered = copy.deepcopy(trajectories[82])
    mutate(tampered)
    path = _write(tmp_path, [trajectories[5], tampered])  # a new run first: it is not written either
    graph.close()
    graph = ProvenanceGraph(tmp_path / "runs.db")
    with pytest.raises(ContentConflictError) as info:
        ingest_taubench(graph, path)
    e = info.value
    assert isinstance(e, DuplicateNodeError)  # what the ingest raised before, when any id existed
    assert (e.id, e.field, e.run, e.file) == (node, field, RUN, str(path))
    assert str(e).startswith(f"{path}: run {RUN!r} is stored already with other content: node {node!r} has {field} ")
    assert "nothing was written" in str(e)
    assert _snapshot(graph) == before  # nothing of the new run nor of the tampered one, nothing lost


def test_a_run_stored_in_part_is_completed(tmp_path, trajectories):
    # (was test_a_run_stored_in_part_is_an_error) the graph holds one node of the run, exactly as the ingest writes
    # it: the ingest writes exactly the rest, and the graph ends as if the run had been ingested whole
    whole = ProvenanceGraph()
    ingest_taubench(whole, runs=[82])
    graph = ProvenanceGraph(tmp_path / "runs.db")
    graph.add_node(whole.node(RUN + "/agent"))
    report = ingest_taubench(graph, runs=[82])
    assert report.model_dump(include={"runs", "extended", "extended_ids", "agents", "sources", "claims", "actions", "edges", "present", "already_present"}) == {
        "runs": 0, "extended": 1, "extended_ids": [RUN], "agents": 1, "sources": 10, "claims": 4, "actions": 1, "edges": 30, "present": 0, "already_present": False,
    }
    assert _snapshot(graph) == _snapshot(whole)
    assert ingest_taubench(graph, runs=[82]).already_present


def test_a_trajectory_ingested_in_progress_then_whole(tmp_path, trajectories):
    # the trajectory up to its booking call (msg 16), then whole: only the booking's result, the last claim and
    # their edges are new
    path = _write(tmp_path, [{**trajectories[82], "traj": trajectories[82]["traj"][:17]}])
    graph = ProvenanceGraph(tmp_path / "runs.db")
    assert ingest_taubench(graph, path).run_ids == [RUN] and RUN + "/msg17" not in graph
    before = _snapshot(graph)
    report = ingest_taubench(graph, runs=[82])
    assert (report.runs, report.extended_ids, report.sources, report.claims, report.actions, report.already_present) == (0, [RUN], 2, 1, 0, False)
    # msg17 generated by the booking; claim 18 attributed to the agent and supported by msg 7, 9, 11, 13 and 17;
    # the user's last message (19) attributed to the user
    assert report.edges == 1 + 1 + 5 + 1
    whole = ProvenanceGraph()
    ingest_taubench(whole, runs=[82])
    versions, edges = _snapshot(graph)
    assert versions == _snapshot(whole)[0] and sorted(map(json.dumps, edges)) == sorted(map(json.dumps, _snapshot(whole)[1]))
    assert all(versions[n] == v for n, v in before[0].items()) and all(e in edges for e in before[1])  # nothing stored changed
    tampered = copy.deepcopy(trajectories[82])
    tampered["traj"][11]["content"] = tampered["traj"][11]["content"].replace("HAT271", "HAT999")
    graph2 = ProvenanceGraph()
    ingest_taubench(graph2, path)
    before = _snapshot(graph2)
    with pytest.raises(ContentConflictError) as info:  # a stored message with other content: nothing of the extension
        ingest_taubench(graph2, _write(tmp_path, [trajectories[0], tampered]))
    assert (info.value.id, info.value.field) == (RUN + "/msg11", "text") and _snapshot(graph2) == before


def test_verdict_of_a_run():
    # the one rule both ingests use, on a run's (kind, key, difference) triples in planned order
    stored, missing = None, Difference("r/b", None)
    assert verdict([], "r", "f") == Verdict("empty", [])
    assert verdict([("node", "r/a", stored), ("edge", "r/a -x-> r/a", stored)], "r", "f") == Verdict("present", [])
    assert verdict([("node", "r/a", Difference("r/a", None)), ("node", "r/b", missing)], "r", "f") == Verdict("new", [0, 1])
    assert verdict([("node", "r/a", stored), ("node", "r/b", missing), ("node", "r/c", stored)], "r", "f") == Verdict("extend", [1])
    with pytest.raises(ContentConflictError) as info:  # wherever it comes, a differing item is a conflict
        verdict([("node", "r/b", missing), ("node", "r/a", Difference("r/a", "text", "x", "y"))], "r", "f")
    assert (info.value.id, info.value.field, info.value.stored, info.value.given, info.value.run, info.value.file) == ("r/a", "text", "x", "y", "r", "f")
    assert str(info.value) == (
        "f: run 'r' is stored already with other content: node 'r/a' has text 'x' in the graph but 'y' here; nothing was written "
        "(stored records are never overwritten: ingest into another graph or under other run ids)"
    )


_MEMORY_SPANS = [  # the fixture's trace, later: mem-7 is updated, mem-8 deleted
    {"name": "update_memory", "context": {"trace_id": "t1", "span_id": "s11"}, "parent_id": "s1", "start_time": "2025-03-01T10:00:10Z",
     "attributes": {"gen_ai.operation.name": "update_memory", "gen_ai.memory.record.id": "mem-7", "input.value": "Customer prefers phone calls."}},
    {"name": "delete_memory", "context": {"trace_id": "t1", "span_id": "s12"}, "parent_id": "s1", "start_time": "2025-03-01T10:00:11Z",
     "attributes": {"gen_ai.operation.name": "delete_memory", "gen_ai.memory.record.id": "mem-8"}},
]


def test_spans_reingest_is_a_noop(tmp_path):
    spans = json.loads(SPANS.read_text()) + _MEMORY_SPANS
    graph = ProvenanceGraph(tmp_path / "runs.db")
    first = ingest_spans(graph, spans)
    assert first.runs == 1 and [r for _, r, _ in graph.history("t1/memory/mem-8")] == ["created", "delete_memory span s12"]
    before = _snapshot(graph)
    graph.close()
    graph = ProvenanceGraph(tmp_path / "runs.db")
    again = ingest_spans(graph, spans)
    assert again.already_present and (again.runs, again.present_ids, again.edges) == (0, ["t1"], 0)
    assert _snapshot(graph) == before


_GROWN_SPANS = _MEMORY_SPANS + [  # ... and a reply that uses the updated memory
    {"name": "ChatCompletion", "context": {"trace_id": "t1", "span_id": "s13"}, "parent_id": "s1", "start_time": "2025-03-01T10:00:12Z",
     "attributes": {"openinference.span.kind": "LLM", "input.value": "Customer prefers phone calls. Tell them about the refund.",
                    "output.value": "We will call you to confirm your refund."}},
]


def test_spans_grown_export_is_extended(tmp_path):
    # a live trace exported, then exported again after it grew: the second ingest writes only the new spans' writes
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_spans(graph, SPANS)
    grown = json.loads(SPANS.read_text()) + _GROWN_SPANS
    graph.close()
    graph = ProvenanceGraph(tmp_path / "runs.db")
    report = ingest_spans(graph, grown)
    assert report.model_dump() == {
        "runs": 0, "agents": 0, "sources": 0, "claims": 1, "actions": 0, "memories": 0, "versions": 2, "edges": 2, "steps": 0, "unsupported": 0, "run_ids": [],
        "extended": 1, "extended_ids": ["t1"], "present": 0, "present_ids": [], "empty": 0, "empty_ids": [], "already_present": False,
    }
    assert [r for _, r, _ in graph.history("t1/memory/mem-7")] == ["created", "update_memory span s11"]
    assert graph.node("t1/memory/mem-7").text == "Customer prefers phone calls." and graph.node("t1/memory/mem-8").valid is False
    assert [(e.src, e.attributes) for e in graph.edges(dst="t1/s13/claim", relation="supports")] == [("t1/memory/mem-7", {"match": "text"})]
    at_once = ProvenanceGraph()
    assert ingest_spans(at_once, grown).run_ids == ["t1"]
    assert _snapshot(graph) == _snapshot(at_once)  # the same graph as ingesting the grown export at once
    again = ingest_spans(graph, grown)
    assert again.already_present and (again.present_ids, again.extended, again.versions) == (["t1"], 0, 0)
    assert _snapshot(graph) == _snapshot(at_once)


def test_spans_grown_export_with_other_content_is_an_error(tmp_path):
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_spans(graph, SPANS)
    before = _snapshot(graph)
    grown = json.loads(SPANS.read_text()) + _GROWN_SPANS
    grown[2]["attributes"]["retrieval"]["documents"][0]["document"]["score"] = 0.5
    other = {"name": "agent", "context": {"trace_id": "t0", "span_id": "a1"}, "start_time": 1, "attributes": {"openinference.span.kind": "AGENT"}}
    with pytest.raises(ContentConflictError) as info:  # a new trace first: it is not written either
        ingest_spans(graph, [other, *grown])
    assert (info.value.id, info.value.field, info.value.run) == ("t1/s3/doc0", "attributes.score", "t1")
    assert _snapshot(graph) == before


def test_spans_chain_only_trace_is_kept_as_steps():
    # (was test_spans_run_with_nothing_to_write_is_empty: a CHAIN span added nothing) every span is kept, a CHAIN as a
    # generic step; re-ingesting it is a no-op like any other run
    chain = [{"name": "format", "context": {"trace_id": "t2", "span_id": "c1"}, "start_time": 1, "attributes": {"openinference.span.kind": "CHAIN"}}]
    graph = ProvenanceGraph()
    first = ingest_spans(graph, chain)
    assert (first.runs, first.run_ids, first.steps, first.actions, first.empty, first.already_present) == (1, ["t2"], 1, 0, 0, False)
    assert graph.node("t2/c1").attributes["span_kind"] == "CHAIN" and graph.node("t2/c1").type == NodeType.ACTION
    both = json.loads(SPANS.read_text()) + chain
    mixed = ingest_spans(graph, both)
    assert (mixed.run_ids, mixed.present_ids, mixed.empty, mixed.already_present) == (["t1"], ["t2"], 0, False)
    again = ingest_spans(graph, both)
    assert (again.present_ids, again.already_present) == (["t2", "t1"], True)  # in start order


def test_spans_split_over_two_exports(tmp_path):
    # the second export of the trace updates and deletes memories the first one stored; each re-ingest is a no-op
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_spans(graph, SPANS)
    second = ingest_spans(graph, _MEMORY_SPANS)
    assert (second.runs, second.memories, second.versions) == (1, 0, 2) and graph.node("t1/memory/mem-7").text == "Customer prefers phone calls."
    assert graph.node("t1/memory/mem-8").valid is False
    before = _snapshot(graph)
    assert ingest_spans(graph, SPANS).already_present and ingest_spans(graph, _MEMORY_SPANS).already_present
    assert _snapshot(graph) == before
    changed = copy.deepcopy(_MEMORY_SPANS)
    changed[0]["attributes"]["input.value"] = "Customer prefers letters."
    with pytest.raises(ContentConflictError) as info:
        ingest_spans(graph, changed)
    assert (info.value.id, info.value.field, info.value.stored, info.value.given) == ("t1/memory/mem-7", "text", "Customer prefers phone calls.", "Customer prefers letters.")
    assert "version 'update_memory span s11' of node 't1/memory/mem-7' has text" in str(info.value)
    assert _snapshot(graph) == before


def test_spans_other_content_is_an_error(tmp_path):
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_spans(graph, SPANS)
    before = _snapshot(graph)
    spans = json.loads(SPANS.read_text())
    spans[2]["attributes"]["retrieval"]["documents"][0]["document"]["score"] = 0.5
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(spans))
    with pytest.raises(ContentConflictError) as info:
        ingest_spans(graph, path)
    assert (info.value.id, info.value.field, info.value.run, info.value.file) == ("t1/s3/doc0", "attributes.score", "t1", str(path))
    assert _snapshot(graph) == before


def test_ingest_shows_progress_when_asked(tmp_path, capsys):
    quiet = ingest_taubench(ProvenanceGraph(tmp_path / "a.db"), runs=[0, 1, 2])
    shown = ingest_taubench(ProvenanceGraph(tmp_path / "b.db"), runs=[0, 1, 2], progress=True)
    assert shown == quiet
    err = capsys.readouterr().err
    assert "ingesting trajectories: 100%" in err and "3/3" in err
