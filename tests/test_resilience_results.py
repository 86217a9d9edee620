"""The committed resilience benchmark (benchmarks/results/resilience.json) holds what its docs promise."""

from __future__ import annotations

import json
from pathlib import Path

RESULT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "resilience.json"
FIELDS = ("overhead", "recovery_s", "recovery_worst_s", "steps_lost", "bit_identical", "trials")


def test_every_method_reports_the_issue_fields():
    methods = json.loads(RESULT.read_text())["methods"]
    assert set(methods) == {"phoenix", "restart_dcp_1", "restart_dcp_50", "async_dcp", "torchft"}
    for name, m in methods.items():
        for key in FIELDS:
            assert key in m, (name, key)
        if name == "torchft":  # trials = the kills that fired (see the README); 10 were planned
            assert m["kills_planned"] >= 10 and m["trials"] == len(m["failures"]) >= 5, m["trials"]
        else:
            assert m["trials"] >= 10, (name, m["trials"])
        assert m["recovery_worst_s"] >= m["recovery_s"] > 0, name


def test_phoenix_figures_are_consistent_with_its_trials():
    result = json.loads(RESULT.read_text())
    kills = result["phoenix_kills"]["base"]
    assert kills["trials"] == len(kills["failures"]) == result["methods"]["phoenix"]["trials"]
    rec = sorted(f["recovery_s"] for f in kills["failures"])
    assert result["methods"]["phoenix"]["recovery_worst_s"] == rec[-1]
    for f in kills["failures"]:  # the split adds up; every resume came from a committed in-memory generation
        parts = f["detection_s"] + f["rebuild_s"] + f["restore_s"] + f["recompute_s"]
        assert abs(parts - f["recovery_s"]) < 1e-6, f
        # a replay can resume one generation past rank 0's last logged step (its loss all-reduce never ran)
        assert f["restore"] == "memory" and f["generation"] <= f["step"] + f.get("replayed", False)
        assert f["steps_lost"] == max(0, f["step"] - f["generation"])
    assert result["methods"]["phoenix"]["bit_identical"] is True
    sizes = result["phoenix_overhead_by_size"]
    assert sizes["large"]["n_params"] >= 10 * sizes["base"]["n_params"]


def test_overhead_is_measured_at_three_sizes_with_cis_and_its_cpu_accounted():
    result = json.loads(RESULT.read_text())
    sizes = result["phoenix_overhead_by_size"]
    assert list(sizes) == ["base", "mid", "large"]
    for name, s in sizes.items():
        lo, hi = s["overhead_ci95"]
        assert lo <= s["overhead"] <= hi and s["block_pairs"] >= 5, name
        assert s["predicted_overhead"] > 0 and set(s["snapshot_cpu_ms_per_generation"]) == {"copy", "crc", "replicate"}
        cpu = s["process_cpu_ms_per_step"]  # the whole process's CPU, on minus off, and the overhead it predicts
        assert abs(cpu["on"] - cpu["off"] - cpu["delta"]) < 1e-9 and s["predicted_overhead_process_cpu"] > 0, name
        assert len(s["ratios"]) == s["block_pairs"], name
    assert result["methods"]["phoenix"]["overhead"] == sizes["base"]["overhead"]
    for name, x in result["replica_exchange_cost"].items():  # the replica's transfer, outside the thread's clock
        assert x["bytes"] == sizes[name]["snapshot_bytes_per_rank"] and x["user_ms"] + x["system_ms"] > 0, name
    for name, p in result["snapshot_cpu_profile"].items():  # the current recipe costs less CPU than the former
        assert p["after_total_ms"] < p["before_total_ms"], name


def test_both_snapshot_recipes_are_measured_on_the_same_unprotected_baseline():
    result = json.loads(RESULT.read_text())
    shipped, copied = result["phoenix_overhead_by_size"], result["phoenix_overhead_by_size_copy"]
    assert list(shipped) == list(copied) == ["base", "mid", "large"]
    for name in shipped:
        assert shipped[name]["snapshot_write"] == "auto" and copied[name]["snapshot_write"] == "copy"
        assert shipped[name]["param_sha256"] == copied[name]["param_sha256"], name  # the same training, bit for bit
        assert shipped[name]["snapshot_cpu_ms_per_generation"]["copy"] < 0.05  # nothing left to copy
        assert copied[name]["snapshot_cpu_ms_per_generation"]["copy"] > shipped[name]["snapshot_cpu_ms_per_generation"]["crc"] / 2
    kills = result["phoenix_kills"]
    assert all(k["trials"] >= 40 and k["bit_identical"] and k["steps_lost_worst"] == 0 for k in kills.values())


def test_every_fourth_replication_is_measured_against_every_generation_in_the_same_session():
    result = json.loads(RESULT.read_text())
    shipped, every = result["phoenix_overhead_by_size"], result["phoenix_overhead_by_size_every_generation"]
    assert list(shipped) == list(every) == ["base", "mid", "large"]
    for name in shipped:
        assert (shipped[name]["replica_interval"], every[name]["replica_interval"]) == (4, 1), name
        assert shipped[name]["param_sha256"] == every[name]["param_sha256"], name  # the same training, bit for bit
        # the snapshot thread's transfer CPU per generation: one generation in four goes to the peer
        sent, every_sent = (r["snapshot_cpu_ms_per_generation"]["replicate"] for r in (shipped[name], every[name]))
        assert sent < every_sent / 2, (name, sent, every_sent)
    for size, k in result["phoenix_kills"].items():  # replays from a replica up to k + 1 = 5 steps behind
        assert k["replica_interval"] == 4, size
        replayed = [f for f in k["failures"] if f["replayed"]]
        assert replayed and all(f["replayed_from"] < f["generation"] for f in replayed), size
        assert k["replayed_steps_worst"] == max(f["generation"] - f["replayed_from"] for f in replayed) <= 5, size
