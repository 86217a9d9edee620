"""Dependency-guided rollback repair (lab.provenance.repair, issue #20): runner, graph, planner, replay, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.provenance.errors import IrreversibleEffectError, LineageCycleError, MissingProvenanceError, RepairError
from lab.provenance.repair import PAPER, MemoryRecord, MemTXMemory, PlannerRules, repair
from lab.provenance.repair.cases import make_case
from lab.provenance.repair.envs import shop_env
from lab.provenance.repair.evaluate import method_fn, run_failed, run_oracle, score_case
from lab.provenance.repair.graph import build_graph
from lab.provenance.repair.runner import Program, StepRecord, StepSpec, Trace, run_program

OURS = PlannerRules()


def _repair(case, rules=OURS):
    failed = run_failed(case)
    env, store = failed.env.copy(), failed.store.copy()
    return failed, env, store, repair(case.program, failed.trace, store, env, dict(case.faulty), rules)


def test_graph_has_the_six_typed_edges():
    case = make_case("shop", "poisoned", 3, seed=1)
    failed = run_failed(case)
    g = build_graph(failed.trace, failed.store)
    kinds = {d["kind"] for *_, d in g.edges(data=True)}
    assert kinds == {"cite", "produce", "update", "supersede", "derive", "support"}
    fid = next(iter(case.faulty))
    # the poisoned price is cited by the derivation of the quote and superseded the catalogue price
    assert any(d["kind"] == "supersede" for _, _, d in g.out_edges(fid, data=True))
    sup = [d for _, _, d in g.edges(data=True) if d["kind"] == "support"]
    assert all({"token", "field", "target_field", "target_entity"} <= set(d) for d in sup)


@pytest.mark.parametrize(
    "domain,failure,idx,op",
    [("shop", "poisoned", 13, "quarantine"), ("airline", "stale", 3, "deactivate"), ("support", "misattributed", 8, "delete"), ("shop", "derived", 10, "deactivate")],
)
def test_repair_recovers_answer_state_and_memory(domain, failure, idx, op):
    case = make_case(domain, failure, idx, seed=1)
    oracle = run_oracle(case)
    failed, env, store, res = _repair(case)
    assert failed.trace.answer != oracle.trace.answer or env.outcome() != oracle.env.outcome()
    assert res.answer == oracle.trace.answer
    assert env.outcome() == oracle.env.outcome()
    assert store.active() == oracle.store.active()
    for fid in case.faulty:
        assert res.plan.entries[fid].op == op and store.get(fid).status != "active"
    assert 0 < len(res.replayed) < len(case.program.steps) / 3
    row = score_case(case, method_fn("", OURS))
    assert row.recovered and row.benign_kept == 1.0 and row.claim_fn == 0 and not row.recurred


def test_paper_rule_over_preserves_through_a_spurious_support_path():
    # the planted price equals the order's total: the paper's "any trusted support" keeps the wrong claim
    case = make_case("shop", "poisoned", 3, seed=1)
    oracle = run_oracle(case)
    _, _, _, paper = _repair(case, PAPER)
    kept = [e for e in paper.plan.entries.values() if e.type == "claim" and e.op == "preserve"]
    assert kept and paper.answer != oracle.trace.answer
    _, _, _, ours = _repair(case)
    assert ours.answer == oracle.trace.answer
    assert all(e.op != "preserve" or "identical" in e.why for e in ours.plan.entries.values() if e.type == "claim")


def test_replay_does_not_reread_the_failed_runs_own_effects():
    # replaying from the first tainted step re-reads reservations whose bags the failed run already updated:
    # the replay must see the recorded results (and undo the effects first), not count the bag twice
    case = make_case("airline", "stale", 3, seed=1)
    row = score_case(case, method_fn("", OURS.model_copy(update={"replay": "suffix"})))
    assert row.recovered and not row.refused


def test_poisoned_diagnosis_expands_to_the_same_tool_result_read_twice():
    case = make_case("shop", "poisoned", 13, seed=1)  # two requests read the same planted review
    _, _, store, res = _repair(case)
    extra = [n for n, e in res.plan.entries.items() if "same tool result" in e.why]
    assert extra and all(store.get(n).status == "quarantined" for n in extra)
    assert not score_case(case, method_fn("", OURS.model_copy(update={"expand": False}))).recovered


def test_irreversible_effect_is_reported_not_hidden():
    case = next(make_case("support", "poisoned", i, seed=1) for i in range(2, 200, 12) if any(s.tool == "send_email" for s in make_case("support", "poisoned", i, seed=1).program.steps))
    _, env, _, res = _repair(case)
    assert res.irreversible and any(e.op == "irreversible" for e in res.plan.entries.values())
    assert any(e.id in res.irreversible for e in env.journal)


def test_compensation_and_irreversible_tools():
    env = shop_env(0)
    order = next(iter(env.db["orders"]))
    before = env.db["orders"][order]["ship_to"]
    env.call("update_shipping", {"order_id": order, "address": "1 New St"}, effect_id="e1")
    env.compensate("e1")
    assert env.db["orders"][order]["ship_to"] == before and not env.journal
    cust = next(iter(env.db["customers"]))
    env.call("refund_payment", {"customer_id": cust, "amount": 5}, effect_id="e2")
    with pytest.raises(IrreversibleEffectError, match="e2"):
        env.compensate("e2")
    with pytest.raises(RepairError, match="nope"):
        env.call("update_shipping", {"order_id": "nope", "address": "x"})


def test_unknown_faulty_id_refused_and_store_unchanged():
    case = make_case("shop", "stale", 4, seed=1)
    failed = run_failed(case)
    env, store = failed.env.copy(), failed.store.copy()
    before, db = store.txn.dump(), env.state()
    with pytest.raises(RepairError, match="prior/nothing") as e:
        repair(case.program, failed.trace, store, env, {"prior/nothing": "stale"})
    assert e.value.step == "prior/nothing"
    with pytest.raises(RepairError, match="unknown failure type"):
        repair(case.program, failed.trace, store, env, {next(iter(case.faulty)): "cosmic"})
    assert store.txn.dump() == before and env.state() == db


def test_read_without_recorded_source_names_the_step_and_leaves_store():
    case = make_case("shop", "stale", 4, seed=1)
    failed = run_failed(case)
    trace = failed.trace.copy()
    trace.steps[2].reads.append("ghost/record")
    store = failed.store.copy()
    before = store.txn.dump()
    with pytest.raises(MissingProvenanceError) as e:
        repair(case.program, trace, store, failed.env.copy(), dict(case.faulty))
    assert e.value.step == trace.steps[2].step and "ghost/record" in str(e.value)
    assert store.txn.dump() == before


def test_dependency_cycle_is_refused():
    store = MemTXMemory()
    store.write(MemoryRecord("m1", "a/x", 1, 0, session="r", step="s1"))
    store.write(MemoryRecord("m2", "b/y", 2, 1, session="r", step="s2"))
    trace = Trace("r", "shop", [StepRecord("s1", "derive", 0, reads=["m2"], produces=["m1"]), StepRecord("s2", "derive", 1, reads=["m1"], produces=["m2"])])
    with pytest.raises(LineageCycleError) as e:
        build_graph(trace, store)
    assert set(e.value.cycle) == {"m1", "m2"}


def test_missing_key_in_a_run_names_step_and_key():
    prog = Program("r", "shop", (StepSpec("s0", "claim", inputs=("cust:x/card",), template="{0}"),))
    with pytest.raises(MissingProvenanceError, match="s0.*cust:x/card"):
        run_program(prog, shop_env(0), MemTXMemory())


def test_committed_benchmark_results_have_the_issue_keys():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "rollback.json"
    assert path.is_file(), "benchmarks/results/rollback.json is committed (python -m benchmarks.rollback --out ...)"
    d = json.loads(path.read_text())
    for part in ("methods", "stress"):
        for name in ("ours", "paper", "delete_source", "full_reset", "full_replay", "answer_only", "ours_no_support", "ours_no_selective"):
            assert {"recovery", "recurrence", "faulty_removed", "benign_kept", "claim_f1", "replay_fraction"} <= set(d[part][name])
    assert d["config"]["n"] == 150 and d["methods"]["ours"]["n"] == 150 and d["stress"]["ours"]["n"] == 50
