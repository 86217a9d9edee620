"""The live half of benchmarks.placement runs end to end on four real Slurm sites (a short configuration)."""

from __future__ import annotations

import pytest

from benchmarks.placement_live import run_live

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_live_benchmark_short_run(tmp_path):
    result = run_live(rounds=2, period_s=6.0, warmup_s=4.0, compress=120.0, drain_timeout_s=90.0, workdir=tmp_path)
    assert set(result) >= {"rounds", "jobs", "nontrivial_share", "policies", "best_fixed_site", "continuation", "inputs"}
    assert result["rounds"] >= 1 and result["jobs"] == 4 * result["rounds"]
    assert set(result["policies"]) == {"least_pending", "earliest_completion", "idle_first", "fixed:theta22", "fixed:theta23", "fixed:hpc2n", "fixed:nasa"}
    fixed = {p: m["mean_extra_s"]["value"] for p, m in result["policies"].items() if p.startswith("fixed:")}
    assert min(fixed.values()) >= 0 and result["best_fixed_site"] == min(fixed, key=fixed.get).split(":")[1]
    assert len(result["per_round"]) == result["rounds"] and result["earliest_completion_vs_least_pending"]["rounds_differ"] >= 0
    for rnd in result["per_round"]:  # every policy's extra is its chosen site's completion minus the fastest
        comp = rnd["completion_after_decision_s"]
        assert rnd["extra_s"]["earliest_completion"] == pytest.approx(comp[rnd["chosen"]["earliest_completion"]] - min(comp.values()), abs=0.02)
        assert set(rnd["shown"]) == set(comp)
    cont = result["continuation"]
    assert cont["n"] >= 4 * result["rounds"] and 0 <= cont["median_s"] < 5.0  # probe end -> agent resumed, seconds
