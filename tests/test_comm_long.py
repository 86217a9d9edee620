"""benchmarks.comm_long: the committed tuning read as the long runs' settings, and the gap table by hand."""

from __future__ import annotations

import json

import pytest

from benchmarks import comm_long


def _tuning(tmp_path):
    def entry(v, lr, kw):
        return {"best_variant": v, "best_lr": lr, "variants": {v: {"optimizer_kwargs": kw}, "other": {"optimizer_kwargs": {}}}}

    path = tmp_path / "comm.json"
    path.write_text(json.dumps({"training_detail": {"tuning": {
        "adams": entry("beta1_0.7", 1e-3, {"betas": [0.7, 0.95]}),
        "scape90": entry("random", 1.2e-2, {"explore": 1.0, "mask_sync": "local"}),
        "scape99": entry("explore", 3.2e-2, {"explore": 0.2, "betas": [0.5, 0.95]})}}}))
    return path


def test_settings_are_the_committed_tuned_ones(tmp_path):
    m = comm_long._committed_methods(_tuning(tmp_path), warmup_steps=300)
    assert list(m) == ["adams", "scape90", "scape99", "nvfp4", "scape99_warmup"]
    assert {k: v for k, v in m["nvfp4"].items() if k not in ("comm", "comm_kwargs", "source")} == \
        {k: v for k, v in m["adams"].items() if k != "source"}
    assert (m["nvfp4"]["comm"], m["nvfp4"]["comm_kwargs"]) == ("nvfp4", {})
    assert (m["adams"]["optimizer"], m["adams"]["lr"], m["adams"]["optimizer_kwargs"]) == ("adams", 1e-3, {"betas": (0.7, 0.95)})
    assert m["scape90"]["optimizer_kwargs"] == {"sparsity": 0.9, "explore": 1.0, "mask_sync": "local"}
    assert m["scape99_warmup"]["optimizer_kwargs"] == {**m["scape99"]["optimizer_kwargs"], "sparsity_warmup": 300}
    assert m["scape99_warmup"]["lr"] == m["scape99"]["lr"] == 3.2e-2
    assert "variant explore, lr 0.032" in m["scape99"]["source"]
    with pytest.raises(FileNotFoundError, match="--part training"):
        comm_long._committed_methods(tmp_path / "missing.json", 300)


def test_gap_is_paired_by_seed_by_hand():
    val = {"adams": {0: {250: 2.0, 500: 1.6}, 1: {250: 2.2, 500: 1.8}},
           "scape99": {0: {250: 2.2, 500: 1.68}, 1: {250: 2.42, 500: 1.8}}}
    out = comm_long.summarize(val, [0, 1])
    assert out["checkpoints"] == [250, 500]
    assert out["val_loss"]["scape99"]["500"] == [1.68, 1.8]
    g250, g500 = out["gap"]["scape99"]["250"], out["gap"]["scape99"]["500"]
    assert g250["per_seed"] == pytest.approx([0.1, 0.1]) and g250["mean"] == pytest.approx(0.1)
    assert g500["per_seed"] == pytest.approx([0.05, 0.0]) and g500["mean"] == pytest.approx(0.025)
    lo, hi = g500["ci95"]  # two seeds: mean +- t(0.975, 1) * sd / sqrt(2) = 0.025 +- 12.706 * 0.025
    assert lo == pytest.approx(0.025 - 12.7062 * 0.025, rel=1e-4) and hi == pytest.approx(0.025 + 12.7062 * 0.025, rel=1e-4)
    assert "adams" not in out["gap"]


def test_the_committed_long_run_holds_what_the_readme_quotes():
    path = comm_long.COMMITTED
    lr = json.loads(path.read_text())["long_run"]
    assert lr["steps"] >= 3000 and len(lr["seeds"]) >= 3
    assert {"adams", "scape90", "scape99", "scape99_warmup"} <= set(lr["val_loss"])
    last = str(lr["checkpoints"][-1])
    assert int(last) == lr["steps"]
    for m, by_step in lr["gap"].items():  # every gap is recomputable from the per-seed losses
        for t, g in by_step.items():
            ours, dense = lr["val_loss"][m][t], lr["val_loss"][lr.get("gap_reference", {}).get(m, "adams")][t]
            assert g["per_seed"] == pytest.approx([(a - b) / b for a, b in zip(ours, dense)]), (m, t)
            assert g["ci95"][0] <= g["mean"] <= g["ci95"][1]
    assert lr["bytes_vs_dense"]["scape90"] <= 0.11 and lr["bytes_vs_dense"]["scape99"] <= 0.02


def test_settings_take_momentum_correction_at_its_own_rate_when_tuned(tmp_path):
    path = _tuning(tmp_path)
    doc = json.loads(path.read_text())
    doc["training_detail"]["tuning"]["scape99"]["variants"]["momentum_correction_accum"] = {
        "optimizer_kwargs": {"mask_score": "accum", "momentum_correction": True, "betas": [0.5, 0.95]}, "best_lr": 2.5e-4}
    path.write_text(json.dumps(doc))
    m = comm_long._committed_methods(path, warmup_steps=300)
    mc = m["scape99_momentum_correction"]
    assert mc["lr"] == 2.5e-4 and mc["optimizer_kwargs"] == {"sparsity": 0.99, "mask_score": "accum",
                                                            "momentum_correction": True, "betas": (0.5, 0.95)}


def test_merge_long_adds_methods_and_compares_the_dense_rerun():
    val = {"adams": {0: {250: 2.0}, 1: {250: 2.2}}, "scape99": {0: {250: 2.2}, 1: {250: 2.42}}}
    old = {"steps": 250, "seeds": [0, 1], "methods": {"adams": {}, "scape99": {}}, **comm_long.summarize(val, [0, 1]),
           "bytes_vs_dense": {"adams": 1.0, "scape99": 0.01}, "runs": {"a": 1}, "wall_s": 10.0, "notes": ["n"]}
    new_val = {"adams": {0: {250: 2.0}, 1: {250: 2.25}}, "mc": {0: {250: 2.1}, 1: {250: 2.25}}}
    new = {"steps": 250, "seeds": [0, 1], "methods": {"adams": {}, "mc": {}}, **comm_long.summarize(new_val, [0, 1]),
           "bytes_vs_dense": {"adams": 1.0, "mc": 0.02}, "runs": {"b": 2}, "wall_s": 5.0, "methods_run": ["adams", "mc"]}
    out = comm_long.merge_long(old, new)
    assert set(out["methods"]) == {"adams", "scape99", "mc"} and out["runs"] == {"a": 1, "b": 2}
    assert out["val_loss"]["adams"] == old["val_loss"]["adams"] and out["gap"]["scape99"] == old["gap"]["scape99"]
    assert out["val_loss"]["adams_beside_mc"] == new["val_loss"]["adams"] and out["gap_reference"] == {"mc": "adams_beside_mc"}
    assert out["gap"]["mc"]["250"]["per_seed"] == pytest.approx([0.05, 0.0])  # against its own dense re-run
    assert out["adams_rerun_max_abs_diff"] == {"adams_beside_mc": pytest.approx(0.05)} and out["wall_s"] == 15.0
    assert "methods_run" not in out and out["notes"][0] == "n" and "mc" in out["notes"][1]
    assert old["val_loss"].keys() == {"adams", "scape99"}  # the committed block itself is not modified
    assert comm_long.merge_long(old, {**new, "methods_run": None}) is not old  # a full run replaces the block
    assert comm_long.merge_long(old, {**new, "steps": 500})["steps"] == 500


def test_the_committed_momentum_correction_run_holds_what_the_readme_quotes():
    lr = json.loads(comm_long.COMMITTED.read_text())["long_run"]
    gap = lr["gap"]["scape99_momentum_correction"]
    last = gap[str(lr["steps"])]
    # README: SCAPE-99 with momentum correction ends within 3% of dense AdamS on average (+2.7%), every seed
    # at or below +3.0%, at under 2% of dense bytes, and its gap shrinks after step 500
    assert last["mean"] < 0.03 and max(last["per_seed"]) < 0.031 and len(last["per_seed"]) >= 3
    assert lr["bytes_vs_dense"]["scape99_momentum_correction"] <= 0.02
    assert gap["500"]["mean"] > gap["1000"]["mean"] > gap["2000"]["mean"] > last["mean"]
    assert last["mean"] < lr["gap"]["scape99"][str(lr["steps"])]["mean"] / 5
