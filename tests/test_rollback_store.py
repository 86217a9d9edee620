"""Rollback repair on MemTX's store (issue #20): the memory view, the MemTX additions it needs (one transaction
spanning a repair, reinstate, erase, clone) and the store left unchanged when a repair refuses."""

from __future__ import annotations

import pytest

from lab.provenance.errors import LifecycleError, LineageCycleError, MissingProvenanceError, RepairError
from lab.provenance.repair import MemoryRecord, MemTXMemory, PlannerRules, repair
from lab.provenance.repair.cases import make_case
from lab.provenance.repair.evaluate import run_failed, run_oracle
from lab.provenance.repair.runner import StepRecord
from lab.provenance.txn import MemTXStore, State
from tests.memtx_support import rec


def test_memory_lives_in_memtx_with_its_lifecycle():
    s = MemTXMemory()
    assert isinstance(s.txn, MemTXStore)
    s.write(MemoryRecord("a", "k:1/x", 1, 0, session="r", step="s0"))
    s.write(MemoryRecord("b", "k:1/x", 2, 5, session="r", step="s1"))
    assert s.resolve("k:1/x").id == "b" and s.get("a").status == "superseded"
    assert s.txn.state("a") == State.SUPERSEDED and s.txn.record("b").entity == "k:1" and s.txn.record("b").attribute == "x"
    s.write(MemoryRecord("c", "k:1/x", 3, 2, session="r", step="s2"))  # a replayed write at an older time does not win
    assert s.resolve("k:1/x").id == "b" and s.get("c").status == "superseded"
    s.set_status("b", "deactivated", "read a fault")
    assert s.txn.state("b") == State.QUARANTINED and s.resolve("k:1/x") is None
    s.set_status("a", "active", "superseder removed")  # reactivation of a superseded record
    assert s.resolve("k:1/x").id == "a" and s.get("a").value == 1
    s.set_status("b", "active", "re-derived identical")  # and of a deactivated one
    assert s.get("b").status == "active" and s.resolve("k:1/x").id == "b"
    s.set_status("b", "quarantined", "poisoned")
    s.set_status("a", "deleted", "about someone else")
    a, b = s.get("a"), s.get("b")
    assert (a.status, a.value, b.status, b.value) == ("deleted", None, "quarantined", 2)  # ids kept; only deletion erases
    assert s.txn.state("a") == State.REVOKED and s.txn.record("a").value is None
    assert [h[1] for h in s.txn.history("a")][-2:] == [State.COMMITTED, State.REVOKED]
    assert any(e["op"] == "erase" and e["record"] == "a" for e in s.txn.audit())
    with pytest.raises(RepairError, match="'b' cannot go from quarantined to active"):
        s.set_status("b", "active", "x")
    with pytest.raises(RepairError, match="status"):
        s.set_status("a", "gone", "x")
    with pytest.raises(RepairError, match="exists already"):
        s.write(MemoryRecord("a", "k:1/x", 9, 9))


def test_memtx_reinstate_refuses_a_revoked_ancestor_and_atomic_rolls_back():
    store = MemTXStore()
    for rid, parents in (("p", ()), ("c", ("p",))):
        tx = store.begin("a")
        tx.stage(rec(rid, ent=rid, val=rid, parents=parents, typ="summary" if parents else "belief"))
        assert tx.commit().committed
    store.transition("c", "quarantined", reason="held")
    store.retract("p")  # the cascade leaves the quarantined summary quarantined
    assert store.state("c") == State.QUARANTINED
    with pytest.raises(LifecycleError, match="ancestor 'p'"):
        store.reinstate("c", reason="back")
    before = store.dump()
    with pytest.raises(RuntimeError):
        with store.atomic():
            store.erase("c", reason="gone")
            with store.atomic():
                store.request_revocation("p")
            raise RuntimeError("refused")
    assert store.dump() == before and store.record("c").value == "c"
    with store.atomic():  # an inner failure undoes only the inner block
        with pytest.raises(KeyError):
            with store.atomic():
                store.erase("c", reason="inner")
                raise KeyError("inner")
        store.request_revocation("c")
    assert store.record("c").value == "c" and store.pending() == {"c"}
    assert store.clone().dump() == store.dump()


def _failed(case):
    failed = run_failed(case)
    return failed, failed.env.copy(), failed.store.copy()


@pytest.mark.parametrize("bad", ["unknown_id", "no_source", "cycle", "midway"])
def test_refused_repair_leaves_the_memtx_store_unchanged(bad, monkeypatch):
    case = make_case("shop", "stale", 4, seed=1)
    failed, env, store = _failed(case)
    trace, faulty = failed.trace.copy(), dict(case.faulty)
    if bad == "unknown_id":
        faulty, err, name = {"prior/nothing": "stale"}, RepairError, "prior/nothing"
    elif bad == "no_source":
        trace.steps[2].reads.append("ghost/record")
        err, name = MissingProvenanceError, trace.steps[2].step
    elif bad == "cycle":  # a step that claims to have made, from a derived memory, the memory it was derived from
        first = next(s for s in trace.steps if s.kind == "derive" and any(r in store for r in s.reads) and any(p in store for p in s.produces))
        made, read = next(p for p in first.produces if p in store), next(r for r in first.reads if r in store)
        trace.steps.append(StepRecord("loop", "derive", 99, reads=[made], produces=[read]))
        err, name = LineageCycleError, None
    else:  # a failure after the plan's memory ops were applied, in the middle of the replay
        import lab.provenance.repair.replay as rp

        real = rp.execute_step
        calls = []

        def flaky(*a, **k):
            calls.append(1)
            if len(calls) == 1:  # the plan's memory ops are applied by now
                raise MissingProvenanceError("replay lost a record", step="injected")
            return real(*a, **k)

        monkeypatch.setattr(rp, "execute_step", flaky)
        err, name = MissingProvenanceError, "injected"
    before, db, journal = store.txn.dump(), env.state(), list(env.journal)
    with pytest.raises(err) as e:
        repair(case.program, trace, store, env, faulty, PlannerRules())
    if name is not None:
        assert e.value.step == name
    if bad == "cycle":
        assert {made, read} <= set(e.value.cycle) and read in str(e.value)
    assert store.txn.dump() == before and env.state() == db and list(env.journal) == journal


def test_repair_on_postgresql(pg_server):
    case = make_case("airline", "stale", 3, seed=1)
    failed = run_failed(case)
    oracle = run_oracle(case)
    store = MemTXMemory(store=failed.store.txn.clone(pg_server.fresh_database("rollback_pg")))
    assert store.txn.db.name == "postgresql" and store.active() == failed.store.active()
    before = store.txn.dump()
    with pytest.raises(RepairError):
        repair(case.program, failed.trace, store, failed.env.copy(), {"prior/nothing": "stale"})
    assert store.txn.dump() == before
    env = failed.env.copy()
    res = repair(case.program, failed.trace, store, env, dict(case.faulty), PlannerRules())
    assert res.answer == oracle.trace.answer and env.outcome() == oracle.env.outcome()
    assert store.active() == oracle.store.active()
    fid = next(iter(case.faulty))
    assert store.txn.state(fid) == State.QUARANTINED and store.get(fid).status == "deactivated"
    store.close()


def test_followup_is_a_what_if_that_leaves_the_store_unchanged():
    from lab.provenance.repair.runner import followup

    case = make_case("support", "derived", 2, seed=1)
    failed = run_failed(case)
    before, db = failed.store.txn.dump(), failed.env.state()
    assert followup(case.program, failed.env, failed.store) is not None
    assert failed.store.txn.dump() == before and failed.env.state() == db
