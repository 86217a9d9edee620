"""MemTX store (lab.provenance.txn) on both backends: snapshot reads, conflicts, write skew, the pipeline's
reasons, the gate, the typed cascade, the audit log, bad input, the provenance-graph mirror."""

from __future__ import annotations

import pytest

from lab.provenance.errors import (
    BackendUnavailableError,
    DerivationCycleError,
    LifecycleError,
    PermissionWideningError,
    RecordSchemaError,
    TransactionStateError,
    UnknownRecordError,
    UnknownToolError,
)
from lab.provenance.graph import ProvenanceGraph
from lab.provenance.txn import TRANSITIONS, Features, MemTXStore, PostgresBackend, Reason, State, Tier
from tests.memtx_support import backend_where, rec, store  # noqa: F401  (fixtures; pg_server comes from conftest)


def _commit_one(store, r, tier=Tier.LOW, agent="a"):
    tx = store.begin(agent, tier=tier)
    tx.stage(r)
    return tx.commit()


def test_lifecycle_lists_only_its_transitions():
    assert set(TRANSITIONS) == set(State) and len(State) == 8
    assert TRANSITIONS[State.REVOKED] == frozenset()
    assert State.COMMITTED not in TRANSITIONS[State.TENTATIVE]  # never skips validation


def test_snapshot_reads_and_first_committer_wins(store):
    _commit_one(store, rec("v1", val="confirmed"))
    t1 = store.begin("a")
    t2 = store.begin("b")
    assert [v.value for v in t1.read("res:1", "status")] == ["confirmed"]
    t2.stage(rec("v2", val="cancelled", auth=0.8))
    t1.stage(rec("v3", val="rebooked", auth=0.8))
    assert t2.commit().committed
    # t1 still reads its snapshot (v1 committed, v2 invisible), plus its own staging
    assert {v.id: v.state for v in t1.read("res:1", "status")} == {"v1": State.COMMITTED, "v3": State.TENTATIVE}
    res = t1.commit()
    assert not res.committed and res.outcomes[0].reason == Reason.STALE_LATE_WRITE and res.outcomes[0].detail["rival"] == "v2"
    assert store.state("v2") == State.COMMITTED and store.state("v1") == State.SUPERSEDED and store.state("v3") == State.QUARANTINED
    fresh = store.begin("c")
    assert [v.id for v in fresh.read("res:1", "status")] == ["v2"]


def test_write_skew_permitted_under_si_refused_with_read_validation(store):
    # on-call invariant "at least one of x.on, y.on is true": each tx reads both and turns a different one off
    for validate, expect_second in ((False, True), (True, False)):
        x, y = f"x{validate}", f"y{validate}"
        _commit_one(store, rec(f"{x}0", ent=x, attr="on", val=True))
        _commit_one(store, rec(f"{y}0", ent=y, attr="on", val=True))
        t1, t2 = store.begin("a", validate_reads=validate), store.begin("b", validate_reads=validate)
        for t in (t1, t2):
            assert [v.value for v in t.read(x, "on") + t.read(y, "on")] == [True, True]
        t1.stage(rec(f"{x}1", ent=x, attr="on", val=False))
        t2.stage(rec(f"{y}1", ent=y, attr="on", val=False))
        assert t1.commit().committed
        r2 = t2.commit()
        assert r2.committed is expect_second
        if not expect_second:  # the later committer read x, which t1 changed after t2's snapshot
            assert r2.outcomes[0].reason == Reason.READ_WRITE_CONFLICT and r2.outcomes[0].detail in ({"read": f"{x}0"}, {"slot": f"{x}.on", "record": f"{x}1"})
        on = [v.value for v in store.begin("c").read(x, "on") + store.begin("c").read(y, "on")]
        assert on == ([False, False] if expect_second else [False, True])  # SI: both off (write skew); validated: one stays on


def test_pipeline_reasons_in_order(store):
    r = _commit_one(store, rec("e1", conf=0.3, auth=0.5, valid_from=10**6))
    assert r.outcomes[0].reason == Reason.EVIDENCE_INSUFFICIENT  # evidence is checked before validity
    assert _commit_one(store, rec("e2", conf=0.3, auth=0.95)).committed  # high authority overrides low confidence
    assert _commit_one(store, rec("e3", ent="f", valid_from=10**6)).outcomes[0].reason == Reason.NOT_YET_VALID
    assert _commit_one(store, rec("e4", ent="g", valid_to=2)).outcomes[0].reason == Reason.VALIDITY_EXPIRED
    # semantic conflict: lower authority aborts, higher supersedes, equal from another source quarantines
    assert _commit_one(store, rec("c1", ent="h", val="A", auth=0.7)).committed
    assert _commit_one(store, rec("c2", ent="h", val="B", auth=0.5)).outcomes[0].reason == Reason.LOWER_AUTHORITY
    assert _commit_one(store, rec("c3", ent="h", val="C", auth=0.9)).committed and store.state("c1") == State.SUPERSEDED
    eq = _commit_one(store, rec("c4", ent="h", val="D", auth=0.9, src="email"))
    assert eq.outcomes[0].reason == Reason.EQUAL_AUTHORITY_CONFLICT and store.state("c4") == State.QUARANTINED
    # temporally disjoint values coexist: q1 valid until t, q2 (lower authority, other value) from t on
    t = store.now() + 3
    assert _commit_one(store, rec("q1", ent="q", val="A", auth=0.9, valid_to=t)).committed
    while store.now() < t:
        _commit_one(store, rec(f"tick{store.now()}", ent="tick"))
    assert _commit_one(store, rec("q2", ent="q", val="B", auth=0.2, valid_from=t)).committed
    assert store.state("q1") == State.COMMITTED
    # dependency stability: pending revocation, revoked parent, another transaction's tentative parent
    assert _commit_one(store, rec("p1", ent="k")).committed
    store.request_revocation("p1")
    assert _commit_one(store, rec("d1", ent="k2", typ="summary", parents=["p1"])).outcomes[0].reason == Reason.ANCESTOR_PENDING_REVOCATION
    store.retract("p1")
    assert _commit_one(store, rec("d2", ent="k3", typ="summary", parents=["p1"])).outcomes[0].reason == Reason.DERIVED_FROM_REVOKED
    other = store.begin("b")
    other.stage(rec("t1", ent="m"))
    dirty = _commit_one(store, rec("d3", ent="m2", typ="summary", parents=["t1"]))
    assert dirty.outcomes[0].reason == Reason.ANCESTOR_UNSTABLE
    assert all(o.reason is not None or o.state in (State.COMMITTED, State.ACTION_SAFE) for o in dirty.outcomes)


def test_abort_repairs_dirty_derivations_with_the_cascade(store):
    undone = []
    store.register_tool("hold_seat", irreversible=False, run=lambda a: None, compensate=undone.append)
    writer = store.begin("a")
    writer.stage(rec("w1", ent="seat"))
    reader = store.begin("b", isolation="raw_read")  # a dirty reader (raw-read sees tentative records)
    assert [v.id for v in reader.read("seat")] == ["w1"]
    reader.stage(rec("w1-copy", ent="seat-copy", typ="shared_copy", parents=["w1"]))
    call = writer.call_tool("hold_seat", {"seat": "3A"}, uses=["w1"], entity="seat")
    assert call.decision.allowed  # reversible tools pass the gate
    report = writer.abort()
    assert store.state("w1") == State.REVOKED and store.state("w1-copy") == State.QUARANTINED
    assert report.compensated == [call.action] and undone == [{"seat": "3A"}]
    assert set(report.roots) == {"w1", call.action}
    ops = [a["op"] for a in store.audit()]
    assert "abort" in ops and "compensate" in ops and "cascade" in ops
    with pytest.raises(TransactionStateError):
        writer.stage(rec("late"))


def test_gate_and_typed_cascade(store):
    refunds = []
    store.register_tool("refund", irreversible=True, run=refunds.append)
    store.register_tool("email", irreversible=False, run=lambda a: None, compensate=lambda a: None)
    tx = store.begin("a", tier=Tier.EXTERNAL_ACTION)
    tx.stage(rec("b1", ent="order:7", attr="refundable", val=True, auth=0.95))
    refused = tx.call_tool("refund", {"order": 7}, uses=["b1"], entity="order:7")
    assert not refused.decision.allowed and Reason.TENTATIVE_OUTSIDE_SNAPSHOT in refused.decision.reasons and refunds == []
    assert tx.commit().committed and store.state("b1") == State.ACTION_SAFE
    _commit_one(store, rec("b2", ent="order:8", attr="refundable", val=True))  # committed, not action-safe
    t2 = store.begin("a", tier=Tier.EXTERNAL_ACTION)
    assert Reason.NO_ACTION_SAFE_PREMISE in t2.gate("refund", uses=["b2"]).reasons
    ok = t2.call_tool("refund", {"order": 7}, uses=["b1"], entity="order:7")
    assert ok.decision.allowed and refunds == [{"order": 7}]
    mail = t2.call_tool("email", {"to": "x"}, uses=["b1"])
    for i, typ in enumerate(["summary", "profile", "index_entry", "shared_copy", "belief"]):
        _commit_one(store, rec(f"d{i}", ent=f"o{i}", typ=typ, parents=["b1"]))
    _commit_one(store, rec("dd", ent="o9", typ="belief", parents=["d0"]))  # grandchild through a summary
    store.request_revocation("b1")
    assert Reason.PREMISE_INVALIDATED in store.begin("a").gate("refund", uses=["d4"]).reasons
    report = store.retract("b1")
    st = store.states()
    assert st["b1"] == State.REVOKED
    assert [st[f"d{i}"] for i in range(5)] == [State.QUARANTINED] * 4 + [State.REVOKED]
    assert st["dd"] == State.REVOKED  # the cascade is transitive
    assert report.leaked == [ok.action] and report.compensated == [mail.action]
    assert store.effects()[ok.action]["status"] == "leaked" and store.effects()[mail.action]["status"] == "compensated"
    assert "b1" not in store.pending()
    # G3 holds: nothing committed keeps a revoked ancestor
    assert not any(st[r] in (State.COMMITTED, State.ACTION_SAFE) for r in store.descendants("b1"))
    leaked = [a for a in store.audit(ok.action) if a["op"] == "leaked_irreversible_effect"]
    assert leaked and leaked[0]["tool"] == "refund"


def test_cascade_off_and_summary_skipping_variants_break_g3(backend_where):
    for features, broken in ((Features().without("cascade_summaries"), "s"), (Features().without("cascade"), "b")):
        s = MemTXStore(backend_where, features=features)
        _commit_one(s, rec(f"{broken}-root", ent=f"{broken}-e"))
        _commit_one(s, rec(f"{broken}-s", ent=f"{broken}-e2", typ="summary", parents=[f"{broken}-root"]))
        _commit_one(s, rec(f"{broken}-b", ent=f"{broken}-e3", typ="belief", parents=[f"{broken}-root"]))
        s.retract(f"{broken}-root")
        st = s.states()
        live = {r for r in (f"{broken}-s", f"{broken}-b") if st[r] in (State.COMMITTED, State.ACTION_SAFE)}
        assert live == ({f"{broken}-s"} if broken == "s" else {f"{broken}-s", f"{broken}-b"})
        s.close()


def _snapshot(store):
    return store.states(), store.now(), len(store.audit())


def test_bad_input_is_typed_and_changes_nothing(store):
    _commit_one(store, rec("root", scope="private", owner="a"))
    before = _snapshot(store)
    tx = store.begin("a")
    with pytest.raises(RecordSchemaError) as e:
        tx.stage(rec("x1", typ="rumour"))
    assert e.value.record == "x1" and e.value.field == "type"
    with pytest.raises(RecordSchemaError) as e:
        tx.stage(rec("x2", auth=1.5))
    assert e.value.field == "evidence.authority"
    with pytest.raises(RecordSchemaError) as e:
        store.transition("root", "believed", reason="x")
    assert e.value.field == "state" and e.value.record == "root"
    with pytest.raises(LifecycleError) as e:
        store.transition("root", "tentative", reason="x")
    assert e.value.record == "root"
    with pytest.raises(DerivationCycleError) as e:
        tx.stage_many([rec("c1", parents=["c2"], ent="z"), rec("c2", parents=["c1"], ent="z2")])
    assert e.value.field == "derived_from" and e.value.record in ("c1", "c2")
    with pytest.raises(DerivationCycleError):
        tx.stage(rec("self", parents=["self"]))
    with pytest.raises(PermissionWideningError) as e:
        tx.stage(rec("leak", typ="summary", parents=["root"], scope="shared"))
    assert e.value.record == "leak" and e.value.field == "permission"
    with pytest.raises(UnknownRecordError) as e:
        tx.stage(rec("orphan", parents=["nope"]))
    assert e.value.record == "orphan"
    with pytest.raises(RecordSchemaError):
        tx.stage(rec("root"))  # id in use
    with pytest.raises(UnknownToolError):
        tx.gate("launch_missiles")
    with pytest.raises(UnknownRecordError):
        store.retract("nope")
    assert _snapshot(store) == before


def test_bad_connection_string_is_typed():
    with pytest.raises(BackendUnavailableError) as e:
        PostgresBackend("postgresql://nobody@127.0.0.1:1/none", connect_timeout_s=2)
    assert e.value.field == "dsn" and "127.0.0.1:1" in str(e.value)
    with pytest.raises(BackendUnavailableError):
        MemTXStore("/nonexistent-folder/x/memtx.db")


def test_transitions_are_mirrored_to_the_provenance_graph(store, tmp_path):
    _commit_one(store, rec("g1"))
    _commit_one(store, rec("g2", ent="e2", typ="summary", parents=["g1"]))
    store.retract("g1")
    graph = ProvenanceGraph(tmp_path / "prov.db")
    n = store.mirror(graph)
    assert n == sum(len(store.history(r)) for r in ("g1", "g2"))
    assert graph.node("g1").attributes["lifecycle"] == "revoked" and graph.node("g2").attributes["lifecycle"] == "quarantined"
    assert [e.dst for e in graph.edges(src="g2")] == ["g1"]
    assert len(graph.history("g1")) == len(store.history("g1"))
    assert store.mirror(graph) == 0  # idempotent
    graph.close()


def test_private_records_are_read_by_owner_and_readers_only(store):
    tx = store.begin("alice")
    tx.stage(rec("card", ent="u1", attr="card", val="4111", scope="private", owner="alice", readers=("support",)))
    tx.commit()
    assert [v.id for v in store.begin("alice").read("u1")] == ["card"]
    assert [v.id for v in store.begin("support").read("u1")] == ["card"]
    assert store.begin("mallory").read("u1") == []


def test_a_quarantined_record_keeps_its_pipeline_reason(store):
    _commit_one(store, rec("base", ent="z", val="A", auth=0.7))
    _commit_one(store, rec("rival", ent="z", val="B", auth=0.7, src="other"))
    assert store.history("rival")[-1][1:] == (State.QUARANTINED, "equal_authority_conflict")
    assert any(a["op"] == "transition" and a["record"] == "rival" and a["reason"] == "equal_authority_conflict" for a in store.audit("rival"))


def test_explorer_shows_lifecycle_and_cascade(tmp_path):
    from lab.provenance.txn.view import lifecycle_elements
    from widgets.provenance_explorer import ProvenanceExplorer

    store = MemTXStore(":memory:")
    store.register_tool("hold", irreversible=False, run=lambda a: None, compensate=lambda a: None)
    _commit_one(store, rec("b", ent="e"))
    _commit_one(store, rec("s", ent="e2", typ="summary", parents=["b"]))
    act = store.begin("a").call_tool("hold", {"seat": 1}, uses=["s"]).action
    graph = ProvenanceGraph(tmp_path / "g.db")
    widget = ProvenanceExplorer(graph, memtx=store)
    report = store.retract("b")
    widget.refresh()
    labels = {n["data"]["id"]: n["data"]["text"] for n in widget.elements["nodes"]}
    assert labels["b"].startswith("[revoked]") and labels["s"].startswith("[quarantined]") and labels[act].startswith("[compensated]")
    assert "invalid" in next(n for n in widget.elements["nodes"] if n["data"]["id"] == "s")["data"]["marks"]
    els = lifecycle_elements(store, graph, report)
    data = {n["data"]["id"]: n["data"] for n in els["nodes"]}
    assert data["s"]["faded"] and data["s"]["lifecycle"] == "quarantined" and data[act]["effect"] == "compensated"
    assert [s["record"] for s in els["cascade"]["steps"]] == ["b", "s", act]
    graph.close()
