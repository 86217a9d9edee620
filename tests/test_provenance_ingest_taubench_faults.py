"""tau-bench ingest against broken input and for what the user said (issue #15, findings 6 and 9).

6. A tool result that looks like JSON but is cut is never a trusted source: refused (naming the run, message
   and path) or, if asked, kept as an unparsed observation with trust 0; a cut file names the trajectory it was
   reading; the store is unchanged after a refused ingest.
9. User messages are sources (owned by the user, with the user's scope), and every action has a lineage path
   or is flagged unsupported.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from lab import data
from lab.provenance import IngestError, NodeType, ProvenanceGraph, Relation
from lab.provenance.access import AccessPolicy
from lab.provenance.gate import ActionGate
from lab.provenance.ingest import ingest_taubench
from lab.provenance.ingest.taubench import USER_TRUST
from lab.provenance.trust import path_trust


@pytest.fixture(scope="module")
def trajectories() -> list[dict]:
    return json.loads(Path(data.fetch("tau_bench_airline_trajectories")).read_text())


def _run(t: dict) -> str:
    return f"tau-airline/task{t['task_id']}/trial{t['trial']}"


def _snapshot(g: ProvenanceGraph) -> tuple:
    versions = {n.id: [(v, reason, n2.model_dump(mode="json")) for v, reason, n2 in g.history(n.id)] for n in g.nodes()}
    return versions, [e.model_dump(mode="json") for e in g.edges()]


def _cut_result(trajectories: list[dict]) -> dict:
    """Trajectory 2 with its tool result at message 5 (947 characters of JSON) cut to 473."""
    bad = copy.deepcopy(trajectories[2])
    content = bad["traj"][5]["content"]
    assert bad["traj"][5]["role"] == "tool" and len(content) == 947 and content.startswith("{")
    bad["traj"][5]["content"] = content[:473]
    return bad


# -- 6. a cut tool result, a cut file


def test_a_cut_tool_result_is_refused_and_nothing_is_written(tmp_path, trajectories):
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_taubench(graph, runs=[0])
    before = _snapshot(graph)
    path = tmp_path / "trajs.json"
    path.write_text(json.dumps([trajectories[1], trajectories[3], _cut_result(trajectories)]))  # two good runs first
    with pytest.raises(IngestError) as info:
        ingest_taubench(graph, path)
    e, run = info.value, _run(trajectories[2])
    assert (e.file, e.path) == (str(path), "[2].traj[5].content")
    assert f"tool result of 'get_user_details' (run {run!r}, message 5) looks like JSON but does not parse" in str(e)
    assert "of 473" in str(e)
    assert _snapshot(graph) == before  # neither the good runs before it nor any of the cut one
    assert ingest_taubench(graph, runs=[0]).already_present


def test_a_cut_tool_result_can_be_kept_as_an_untrusted_observation(tmp_path, trajectories):
    path = tmp_path / "trajs.json"
    path.write_text(json.dumps([_cut_result(trajectories)]))
    graph = ProvenanceGraph()
    ingest_taubench(graph, path, malformed_results="untrusted")
    sid = f"{_run(trajectories[2])}/msg5"
    node = graph.node(sid)
    assert node.type == NodeType.SOURCE and node.trust == 0.0 and len(node.text) == 473
    assert node.attributes["unparsed"].startswith("looks like JSON but does not parse: Unterminated string")
    assert path_trust(graph, sid) == 0.0
    # whatever rests on the cut result alone has no trust either
    only_on_it = [d for d in graph.descendants(sid) if graph.parents(d) == [sid]]
    assert all(path_trust(graph, d) == 0.0 for d in only_on_it)
    # every well-formed result of the same run is still a trusted source
    others = [n for n in graph.nodes("source") if n.attributes.get("tool") and n.id != sid]
    assert others and all(n.trust == 1.0 and "unparsed" not in n.attributes for n in others)
    with pytest.raises(ValueError, match="malformed_results"):
        ingest_taubench(graph, path, malformed_results="ignore")


def test_every_shipped_json_tool_result_parses(trajectories):
    # the refusal costs nothing on the real file: each of its JSON-looking tool results parses
    results = [m["content"] or "" for t in trajectories for m in t["traj"] if m["role"] == "tool"]
    looks = [c for c in results if c.lstrip()[:1] in ("{", "[")]
    assert (len(results), len(looks)) == (1164, 847)
    for c in looks:
        json.loads(c)


def _file(trajs: list[dict]) -> tuple[str, list[int]]:
    """The list as JSON text, and the byte offset where each trajectory starts."""
    parts = [json.dumps(t) for t in trajs]
    starts, at = [], 1
    for p in parts:
        starts.append(at)
        at += len(p.encode()) + 2
    return "[" + ", ".join(parts) + "]", starts


def test_a_cut_file_names_the_trajectory_it_was_reading(tmp_path, trajectories):
    graph = ProvenanceGraph(tmp_path / "runs.db")
    ingest_taubench(graph, runs=[0])
    before = _snapshot(graph)
    text, starts = _file(trajectories[:6])
    path = tmp_path / "cut.json"
    path.write_bytes(text.encode()[: starts[4] + 5000])  # cut inside trajectory [4]
    with pytest.raises(IngestError) as info:
        ingest_taubench(graph, path)
    msg = str(info.value)
    assert info.value.path == "[4]"
    assert f"not valid JSON in trajectory [4] (it starts at byte {starts[4]}, line 1, column {starts[4] + 1}; " in msg
    assert f"the last complete trajectory is [3] ({_run(trajectories[3])})" in msg
    assert "Unterminated string" in msg or "Expecting" in msg
    assert _snapshot(graph) == before
    # cut right after a whole trajectory and its comma: the list is not closed
    path.write_bytes(text.encode()[: starts[2]])
    with pytest.raises(IngestError, match=rf"ends before the list of trajectories is closed \(cut short\?\); the last complete trajectory is \[1\] \({_run(trajectories[1])}\)"):
        ingest_taubench(graph, path)
    # a missing comma between two trajectories
    path.write_text("[" + json.dumps(trajectories[0]) + " " + json.dumps(trajectories[1]) + "]")
    with pytest.raises(IngestError, match=r"after trajectory \[0\]: expected ',' or '\]' at byte"):
        ingest_taubench(graph, path)
    assert _snapshot(graph) == before


# -- 9. what the user said is evidence; every action has a lineage path or is flagged


def test_user_messages_are_sources_of_the_user(trajectories):
    g = ProvenanceGraph()
    ingest_taubench(g, runs=[82])
    run = _run(trajectories[82])
    users = [n for n in g.nodes("source", run=run) if n.attributes.get("role") == "user"]
    said = [(k, m["content"]) for k, m in enumerate(trajectories[82]["traj"]) if m["role"] == "user"]
    assert [(n.attributes["message_index"], n.text) for n in users] == said and len(said) == 7
    scope = frozenset({f"user:{trajectories[82]['info']['task']['user_id']}"})
    for n in users:
        assert (n.owner, n.labels, n.trust) == (f"{run}/user", scope, USER_TRUST)
        assert [e.dst for e in g.edges(src=n.id, relation=Relation.ATTRIBUTED_TO)] == [f"{run}/user"]
    # the user's words are private to the user: an assistant without the scope may not read them
    policy = AccessPolicy(g)
    assert not policy.can_read(f"{run}/agent", users[0].id)[0]
    policy.grant(f"{run}/agent", next(iter(scope)))
    assert policy.can_read(f"{run}/agent", users[0].id)[0]
    # the user's choice of flight (msg 13) is part of the booking's lineage
    assert f"{run}/msg13" in g.parents(f"{run}/msg16/call0")


def test_the_users_word_alone_is_enough_for_low_risk_not_for_high(trajectories):
    g = ProvenanceGraph()
    ingest_taubench(g, runs=[82])
    run = _run(trajectories[82])
    policy = AccessPolicy(g)
    policy.grant(f"{run}/agent", "user:sophia_silva_7557")
    gate = ActionGate(g, policy)
    said = [f"{run}/msg13"]  # "I'll go with Flight HAT271, please."
    assert gate.decide(f"{run}/agent", "low", said, now=20).decision.value == "allow"
    assert gate.decide(f"{run}/agent", "high", said, now=20).decision.value == "block"


def test_every_action_has_a_lineage_path_or_is_flagged(tmp_path, trajectories):
    g = ProvenanceGraph()
    report = ingest_taubench(g)
    actions = g.nodes("action")
    assert len(actions) == 250
    unsupported = [a.id for a in actions if not g.parents(a.id)]
    assert unsupported == [a.id for a in actions if a.attributes.get("unsupported")] == [] and report.unsupported == 0
    # the three that traced to no source before: a user-given reservation id, one without a digit, and one the
    # agent read back from its own booking
    parents = {a: sorted(p.removeprefix(a.rsplit("/", 2)[0] + "/") for p in g.parents(a)) for a in (
        "tau-airline/task26/trial1/msg10/call0", "tau-airline/task41/trial2/msg8/call0", "tau-airline/task0/trial3/msg36/call0")}
    assert parents["tau-airline/task26/trial1/msg10/call0"] == ["msg3", "msg7"]  # IFOYYZ: said by the user, then looked up
    assert parents["tau-airline/task0/trial3/msg36/call0"] == ["msg31"]  # HATHAU: the result of the agent's own booking
    assert all(g.node(f"tau-airline/task41/trial2/{p}").attributes.get("role") == "user" for p in parents["tau-airline/task41/trial2/msg8/call0"])
    # an action whose arguments nothing earlier holds is flagged, and counted
    t = copy.deepcopy(trajectories[82])
    t["traj"][16]["tool_calls"][0]["function"]["arguments"] = json.dumps({"reservation_id": "ZZZZZZ"})
    t["traj"][16]["tool_calls"][0]["function"]["name"] = "cancel_reservation"
    if t["traj"][17].get("name"):
        t["traj"][17]["name"] = "cancel_reservation"
    path = tmp_path / "t.json"
    path.write_text(json.dumps([t]))
    g2 = ProvenanceGraph()
    report = ingest_taubench(g2, path)
    action = g2.node(f"{_run(t)}/msg16/call0")
    assert report.unsupported == 1 and action.attributes["unsupported"] is True and g2.parents(action.id) == []
