"""The stress test's conversion of real tau-bench trajectories into replayable policies (issue #20)."""

from __future__ import annotations

import pytest

from lab.provenance.repair import MEMORY_REPLAY, PlannerRules
from lab.provenance.repair.evaluate import method_fn, run_oracle, score_case
from lab.provenance.repair.runner import run_program
from lab.provenance.repair.store import MemTXMemory
from lab.provenance.repair.taubench import _stress_env, load_trajectories, program_from_trajectory, stress_cases


@pytest.fixture(scope="module")
def trajectories():
    return load_trajectories()


def test_program_reproduces_the_recorded_run(trajectories):
    t = trajectories[0]
    program, results, readers = program_from_trajectory(t, "tau-airline/task0/trial0")
    kinds = {s.kind for s in program.steps}
    assert {"fetch", "action", "claim", "answer"} <= kinds
    trace = run_program(program, _stress_env(results), MemTXMemory())
    recorded = [tc["function"]["name"] for m in t["traj"] for tc in (m.get("tool_calls") or []) if tc["function"]["name"] not in ("think", "calculate", "transfer_to_human_agents", "list_all_airports")]
    ran = [program.step(s.step).tool for s in trace.steps if s.kind in ("fetch", "action")]
    assert ran == recorded
    # the booking's arguments are bound to what the agent read (payment ids, flight numbers), not constants
    assert readers and any(k.startswith("user:") for k in readers)


def test_stress_cases_recovered_by_ours(trajectories):
    cases = stress_cases(4, seed=0, trajectories=trajectories)
    assert [c.failure for c in cases] == ["poisoned", "stale", "misattributed", "derived"]
    for c in cases:
        assert c.meta["value"] != c.meta["wrong"]
        row = score_case(c, method_fn("", MEMORY_REPLAY))
        assert row.recovered and row.faulty_removed == 1.0 and row.benign_kept == 1.0, c.id
        assert run_oracle(c).trace.answer is not None
        validated = score_case(c, method_fn("", PlannerRules()))
        # the known gap of the validated rules: a derived fault's calculation is deactivated, not re-derived
        assert validated.recovered == (c.failure != "derived") and validated.answer_ok and validated.state_ok, c.id
    rows = [score_case(c, method_fn("delete_source")) for c in cases]
    assert not any(r.recovered for r in rows)
