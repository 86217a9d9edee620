"""benchmarks.comm --quick: the JSON schema of issue 6 and relations that must hold on real runs.

One quick run (tiny GPT on the Shakespeare text, a few steps; three 2-rank torchrun jobs) feeds every
test here. Timings are not asserted.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import comm

pytestmark = pytest.mark.slow

CODEC_KEYS = ("rel_l2", "rel_l2_selected_layers", "cosine", "bytes", "encode_decode_speed_ratio")
TRAIN_KEYS = ("train_loss", "val_loss", "bytes_per_step", "step_s", "ranks", "steps", "lr", "bytes_vs_dense")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("comm")
    out = tmp / "comm.json"
    comm.main(["--out", str(out), "--quick", "--workdir", str(tmp / "runs")])
    return json.loads(out.read_text())


def test_top_level_schema(result):
    assert result["benchmark"] == "comm"
    assert result["machine"]["torch"].startswith("2.13.0")
    assert result["inputs"]["quick"] is True
    for key in ("codecs", "codecs_detail", "training", "training_detail", "goals", "goals_met"):
        assert key in result, key
    assert set(result["goals_met"]) == set(result["goals"])
    for name in ("gift_selected_layers_2x", "gift_whole_model_1.5x", "gift_val_within_1pct_of_fp32",
                 "scape90_bytes", "scape90_val", "scape99_bytes", "scape99_val"):
        assert name in result["goals"], name


def test_bytes_curve_rows_and_part_merge(result, tmp_path):
    b = result["bytes_curve"]
    for row in b["rows"]:
        for key in ("n_eigenpairs", "refresh_every", "refresh_warmup", "selection", "bytes_fraction", "rel_l2_ratio_vs_fp8"):
            assert key in row, key
        assert row["bytes_fraction"] >= b["references"]["fp8_e4m3"]["bytes_fraction"]  # side bytes only add
        if not row["selected"]:
            assert row["bytes_fraction"] == b["references"]["fp8_e4m3"]["bytes_fraction"] and row["rel_l2_ratio_vs_fp8"] == 1.0
    assert b["references"]["bf16"]["bytes_fraction"] == 0.5
    # the main configuration again with its factors by subspace iteration: same layers, same bytes
    sub = [r for r in b["rows"] if r["varied"] == "eigensolver"]
    main = next(r for r in b["rows"] if r["varied"] == "main")
    assert [r["eigensolver"] for r in sub] == ["subspace"] and main["eigensolver"] == "eigh"
    assert sub[0]["selected"] == main["selected"] and sub[0]["bytes_fraction"] == main["bytes_fraction"]
    # one part re-run alone is merged: the other parts' keys and goals stay
    out = tmp_path / "comm.json"
    out.write_text(json.dumps(result))
    merged = comm.merge_part(out, {"benchmark": "comm", "bytes_curve": {"rows": []}, "goals": {"x": {"met": True}}}, "bytes_curve")
    assert merged["bytes_curve"] == {"rows": []} and merged["training"] == result["training"]
    assert merged["goals"]["x"]["met"] is True and set(result["goals"]) <= set(merged["goals"])


def test_codecs_keys_and_exact_sizes(result):
    codecs = result["codecs"]
    expected = {"fp32", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_b128", "nvfp4", "fp8_ef", "gift_fp8", "gift_nvfp4"}
    assert expected <= set(codecs)
    for name, entry in codecs.items():
        for key in CODEC_KEYS:
            assert key in entry, (name, key)
        assert entry["encode_decode_speed_ratio"] > 0
    detail = result["codecs_detail"]
    n = detail["model"]["n_params"]
    n_tensors = len([r for r in detail["per_layer"] if r["step"] == detail["capture_steps"][0]])  # Linear weights only
    assert codecs["fp32"]["bytes"] == 4 * n
    # one FP32 scale per parameter tensor: n codes plus 4 bytes per tensor (more tensors than Linear weights)
    assert codecs["fp8_e4m3"]["bytes"] > n + 4 * n_tensors and (codecs["fp8_e4m3"]["bytes"] - n) % 4 == 0
    assert 0.25 <= codecs["fp8_e4m3"]["bytes"] / codecs["fp32"]["bytes"] < 0.26
    assert codecs["fp8_e5m2"]["bytes"] == codecs["fp8_e4m3"]["bytes"] == codecs["gift_fp8"]["bytes"] == codecs["fp8_ef"]["bytes"]
    assert codecs["fp8_e4m3_b128"]["bytes"] > codecs["fp8_e4m3"]["bytes"]
    assert codecs["nvfp4"]["bytes"] == codecs["gift_nvfp4"]["bytes"] < 0.6 * codecs["fp8_e4m3"]["bytes"]
    assert codecs["gift_fp8"]["side_bytes_per_step"] > 0


def test_codec_errors_follow_the_formats(result):
    c = result["codecs"]
    assert c["fp32"]["rel_l2"] == 0.0 and c["fp32"]["cosine"] == pytest.approx(1.0)
    # rounding error is set by the mantissa: e4m3 (3 bits) about half of e5m2 (2 bits); NVFP4 worse still
    assert 0.015 < c["fp8_e4m3"]["rel_l2"] < 0.035
    assert 1.6 < c["fp8_e5m2"]["rel_l2"] / c["fp8_e4m3"]["rel_l2"] < 2.6
    assert c["nvfp4"]["rel_l2"] > c["fp8_e5m2"]["rel_l2"]
    for name in ("fp8_e4m3", "fp8_e5m2", "nvfp4", "gift_fp8"):
        assert 0.99 < c[name]["cosine"] < 1.0
    # error feedback: the error of the SUM over a window is smaller than plain FP8's on the same window
    last = str(result["codecs_detail"]["capture_steps"][-1])
    window = c["fp8_ef"]["by_step"][last]
    assert window["fp8_ef"]["rel_l2"] < window["fp8"]["rel_l2"]


def test_per_layer_picture_and_selection(result):
    detail = result["codecs_detail"]
    rows = detail["per_layer"]
    steps = detail["capture_steps"]
    layers = {r["layer"] for r in rows}
    assert {"head", "tok_emb", "pos_emb"} <= layers and len(rows) == len(layers) * len(steps)
    assert detail["gift"]["output_side"] is True
    for r in rows:  # factors exist from step 1 on: inputs from its forward, output gradients from its backward
        assert r["fp8_e4m3"] > 0 and r["gift_fp8"] > 0
        assert r["gift_gain_fp8"] == pytest.approx(r["fp8_e4m3"] / r["gift_fp8"])
    assert detail["selection_rule"]["name"] == comm.MAIN_RULE
    assert set(detail["profile"]["initial_selection"]) == set(comm._RULES)
    for step, entry in detail["by_step"].items():
        assert set(entry["rules"]) == set(comm._RULES)
        for rule in entry["rules"].values():
            assert set(rule["selected"]) <= layers
    g = result["goals"]["gift_whole_model_1.5x"]
    assert set(g["by_step"]) == {str(s) for s in steps} and isinstance(g["met"], bool)


def test_training_keys_and_relations(result):
    t = result["training"]
    assert {"fp32", "fp8", "scape90", "adams"} <= set(t)
    for name, entry in t.items():
        for key in TRAIN_KEYS:
            assert key in entry, (name, key)
        assert entry["ranks"] == 2 and entry["steps"] == result["inputs"]["train_steps"]
        assert math.isfinite(entry["val_loss"]) and math.isfinite(entry["train_loss"])
    assert t["fp32"]["val_loss"] == t["adams"]["val_loss"] and t["fp32"]["same_run_as"] == "adams"
    assert t["fp32"]["bytes_vs_dense"] == pytest.approx(1.0)
    # FP8: one byte per value plus a 4-byte scale per parameter tensor
    assert 0.25 <= t["fp8"]["bytes_per_step"] / t["fp32"]["bytes_per_step"] < 0.27
    # the same data and seed: a few FP8 steps move the loss by far less than training does
    assert abs(t["fp8"]["val_loss"] - t["fp32"]["val_loss"]) < 0.02


def test_scape_bytes(result):
    s = result["training"]["scape90"]
    assert 0 < s["mask_coverage"] <= 1
    b = s["bytes_breakdown"]
    assert b["mask_sync"] == "local" and b["mask_bytes_per_sparse_step"] == 0
    assert b["dense_steps"] == 1
    assert 0.09 < b["k_fraction"] <= 0.11 and b["steady_state_bytes_vs_dense"] <= 0.11
    steps = s["steps"]
    # every step's bytes: one dense step (4 n), then k values of 4 bytes
    assert s["bytes_vs_dense"] == pytest.approx((1 + (steps - 1) * b["k_fraction"]) / steps, rel=1e-6)


def test_committed_full_run_reports_the_tuned_best_variant_and_consistent_goals():
    """benchmarks/results/comm.json (the full run): every SCAPE variant and dense beta1 has its own tuned grid, the
    reported row is the lowest validation loss over variants and rates, and the goals follow the rows."""
    from pathlib import Path

    full = json.loads((Path(comm.__file__).parent / "results" / "comm.json").read_text())
    assert full["inputs"]["quick"] is False and full["inputs"]["part"] == "all"
    t, tuning = full["training"], full["training_detail"]["tuning"]
    for name in ("adams", "scape90", "scape99"):
        variants = tuning[name]["variants"]
        if name == "adams":
            assert set(variants) == {f"beta1_{b:g}" for b in full["inputs"]["adams_beta1s"]}
        else:  # the full run's variants, and those tuned later alone (--part training_variants)
            assert set(full["inputs"][f"{name}_variants"]) <= set(variants) <= set(getattr(comm.FULL, f"{name}_variants"))
        best = min(variants, key=lambda v: variants[v]["val_loss"])
        assert tuning[name]["best_variant"] == best == t[name]["variant"]
        for v in variants.values():
            grid = {float(lr): r["val_loss"] for lr, r in v["grid"].items()}
            assert v["val_loss"] == min(grid.values()) == grid[v["best_lr"]]
        assert t[name]["val_loss"] == variants[best]["val_loss"]
    # FP8 and GIFT train with dense AdamS's tuned rate and beta1
    dense_kwargs = tuning["adams"]["variants"][t["adams"]["variant"]]["optimizer_kwargs"]
    for name in ("fp8", "fp8_ef", "gift_fp8", "gift_fp8_rank0"):
        assert t[name]["lr"] == t["adams"]["lr"] and t[name]["optimizer_kwargs"] == dense_kwargs
    for name, sparsity in (("scape90", 0.9), ("scape99", 0.99)):
        assert t[name]["optimizer_kwargs"]["sparsity"] == sparsity
        gap = t[name]["val_loss"] / t["adams"]["val_loss"] - 1
        assert full["goals"][f"{name}_val"]["relative_gap"] == pytest.approx(gap)
    gains = full["codecs"]["gift_fp8"]["gain_whole_by_step"]
    assert full["goals"]["gift_whole_model_1.5x"]["met"] == (min(gains.values()) >= 1.5)
    assert {"1", "5", "10", "20"} <= set(gains)  # the early steps, where stale factors hurt most, are measured
    # GIFT in training: the configuration the codec study measured, with the covariances all-reduced or rank 0's
    gift, rank0 = t["gift_fp8"], t["gift_fp8_rank0"]
    assert gift["comm_kwargs"] == full["training_detail"]["gift_kwargs"]
    assert rank0["comm_kwargs"] == {**gift["comm_kwargs"], "statistics": "rank0"}
    assert gift["comm_kwargs"]["output_side"] is full["codecs_detail"]["gift"]["output_side"] is True
    assert t["fp8"]["bytes_per_step"] < rank0["bytes_per_step"] < gift["bytes_per_step"]
    layers = {r["layer"] for r in full["codecs_detail"]["per_layer"]}
    assert {"tok_emb", "pos_emb", "head"} <= layers


def test_committed_bytes_curve_follows_the_hooks_byte_accounting_and_its_goals():
    """benchmarks/results/comm.json's bytes_curve (issue #23 item 2): every row's bytes are the FP8 payload plus
    the hook's side bytes (side_bytes_per_refresh of the selected layers' factors, times the schedule's refreshes),
    and the goals are read off the main row."""
    from pathlib import Path

    from lab.training.comm.gift import RefreshSchedule, side_bytes_per_refresh

    full = json.loads((Path(comm.__file__).parent / "results" / "comm.json").read_text())
    b = full["bytes_curve"]
    model, steps = b["model"], b["settings"]["train_steps"]
    dims = {r["layer"]: r["factor_dims"] for r in b["per_layer_main_config"]}
    assert {"head", "tok_emb", "pos_emb"} <= set(dims)
    for row in b["rows"]:
        refreshes = RefreshSchedule(row["refresh_every"], row["refresh_warmup"]).count(steps)
        keep = None if row.get("output_side", True) else 1  # the input-side rows send no B
        side = side_bytes_per_refresh([d for n in row["selected"] for d in dims[n][:keep]], row["n_eigenpairs"], "rank0") if row["selected"] else 0
        assert row["refreshes"] == refreshes and row["side_bytes_per_refresh"] == side
        assert row["bytes_fraction"] == pytest.approx((model["fp8_bytes_per_step"] + side * refreshes / steps) / model["fp32_bytes_per_step"])
    varied = {r["varied"] for r in b["rows"]}
    assert {"main", "n_eigenpairs", "refresh_every", "refresh_warmup", "selection"} <= varied
    assert {r["selection"] for r in b["rows"] if r["varied"] == "selection"} == {"all", "gain_threshold", "saturation_top25"}
    main = b["main"]
    assert 0 < main["n_selected"] < len(dims)  # the rule selects: not every layer
    # the subspace eigensolver (the hook's eigensolver="subspace") gives the main configuration's codec error
    sub = next(r for r in b["rows"] if r["varied"] == "eigensolver")
    assert sub["eigensolver"] == "subspace" and sub["selected"] == main["selected"]
    assert sub["rel_l2_ratio_vs_fp8_selected"] == pytest.approx(main["rel_l2_ratio_vs_fp8_selected"], rel=0.05)
    assert sub["rel_l2_ratio_vs_fp8"] == pytest.approx(main["rel_l2_ratio_vs_fp8"], rel=0.05)
    g = b["goals"]
    assert g["gift_bytes_goal_bytes_le_0.27"]["met"] == (main["bytes_fraction"] <= 0.27)
    assert g["gift_bytes_goal_selected_2x"]["met"] == (main["rel_l2_ratio_vs_fp8_selected"] >= 2.0)
    assert g["gift_bytes_goal_whole_1.5x"]["met"] == (main["rel_l2_ratio_vs_fp8"] >= 1.5)
    assert b["references"]["bf16"]["bytes_fraction"] == 0.5 and b["references"]["bf16"]["rel_l2_ratio_vs_fp8"] > 10
    # factor_dims lists the input side first ([x; 1] with a bias), then B: the input-side rows keep the first
    from lab.training.model import GPT, GPTConfig
    gpt = GPT(GPTConfig(vocab_size=dims["head"][-1], **b["settings"]["train_model"]))
    for name, m in gpt.linear_layers().items():
        assert dims[name] == [m.in_features + (m.bias is not None), m.out_features], name
    # the paper's input-side form: the same layers, fewer side bytes (no B), and the README's figures
    inp = {r["selection"]: r for r in b["rows"] if r["varied"] == "output_side"}
    assert set(inp) == {"budget", "all"} and not any(r["output_side"] for r in inp.values())
    assert inp["budget"]["selected"] == main["selected"] and inp["budget"]["bytes_fraction"] < main["bytes_fraction"]
    both_all = next(r for r in b["rows"] if r["varied"] == "selection" and r["selection"] == "all")
    assert inp["all"]["rel_l2_ratio_vs_fp8"] < both_all["rel_l2_ratio_vs_fp8"]  # B helps on this model
    # factors on the period from step 1: some capture does worse than Euclidean FP8
    stale = [r for r in b["rows"] if r["varied"] == "refresh_warmup_all_layers"]
    assert stale and all(r["n_selected"] == len(dims) and r["refresh_warmup"] < main["refresh_warmup"] for r in stale)
    for r in stale:
        assert r["rel_l2_ratio_vs_fp8_min"] == min(r["by_capture"]["rel_l2_ratio_vs_fp8"]) < 1.0
    # the oracle over every layer set: none meets the three goals; its best rows are consistent with them
    f = b["layer_set_frontier"]
    assert f["n_subsets"] == 2 ** len(dims) - 1 and f["n_feasible"] == len(f["feasible"]) == 0
    bw, bs = f["best_whole_with_selected_goal"], f["best_selected_with_whole_goal"]
    assert bw["rel_l2_ratio_vs_fp8_selected"] >= 2.0 and bw["rel_l2_ratio_vs_fp8"] < 1.5 and bw["bytes_fraction"] <= 0.27
    assert bs["rel_l2_ratio_vs_fp8"] >= 1.5 and bs["rel_l2_ratio_vs_fp8_selected"] < 2.0 and bs["bytes_fraction"] <= 0.27
    assert bw["rel_l2_ratio_vs_fp8"] >= main["rel_l2_ratio_vs_fp8"] - 1e-9  # the rule's choice is one of the sets
    assert f["whole_ceiling_without"]["embeddings"] < 1.75 < f["whole_ceiling_all"]
    readme = (Path(comm.__file__).parent.parent / "README.md").read_text()
    quoted = [f["n_subsets"], bw["rel_l2_ratio_vs_fp8"], bs["rel_l2_ratio_vs_fp8_selected"],
              f["whole_ceiling_without"]["embeddings"], inp["all"]["rel_l2_ratio_vs_fp8"], both_all["rel_l2_ratio_vs_fp8"],
              inp["budget"]["rel_l2_ratio_vs_fp8_selected"], min(stale[0]["by_capture"]["rel_l2_ratio_vs_fp8"])]
    for x in quoted:
        text = f"{x:,}" if isinstance(x, int) else f"{x:.2f}x"
        assert text in readme, text


def test_time_profile_part_replaces_only_the_profile(tmp_path):
    out = tmp_path / "comm.json"
    old = {"benchmark": "comm", "time": {"0.75": {"fp32": {"step_s": 0.27}}},
           "time_detail": {"profile": {"fp8": 1}, "runs": {"0.75": {"x": 1}}, "calibration": {"t": 2}}, "goals": {}}
    out.write_text(json.dumps(old))
    merged = comm.merge_part(out, {"benchmark": "comm", "time_detail": {"profile": {"fp8": 2}}, "goals": {}}, "time_profile")
    assert merged["time"] == old["time"]
    assert merged["time_detail"] == {"profile": {"fp8": 2}, "runs": {"0.75": {"x": 1}}, "calibration": {"t": 2}}


def test_fold_variants_rechooses_the_best_variant():
    from benchmarks import comm

    doc = {"training": {"fp32": {"bytes_per_step": 100.0}, "scape99": {"val_loss": 2.5, "variant": "explore"}},
           "training_detail": {"runs": {"r0": {}}, "run_order": ["r0"], "tuning": {"scape99": {
               "best_variant": "explore", "best_lr": 0.03,
               "variants": {"explore": {"val_loss": 2.5, "best_lr": 0.03}}}}}}
    worse = {"tuning": {"scape99": {"mc": {"val_loss": 2.6, "best_lr": 1e-3}}},
             "ablations": {"scape99": {"dense_m": {"val_loss": 2.0, "best_lr": 1e-2}}},  # lower, but never the row
             "rows": {"scape99": {"mc": {"val_loss": 2.6, "bytes_per_step": 2.0, "variant": "mc"}}},
             "runs": {"r1": {}}, "run_order": ["r1"]}
    comm.fold_variants(doc, worse)
    t = doc["training_detail"]["tuning"]["scape99"]
    assert set(t["variants"]) == {"explore", "mc"} and t["best_variant"] == "explore"
    assert t["ablations"] == {"dense_m": {"val_loss": 2.0, "best_lr": 1e-2}}
    assert doc["training"]["scape99"]["variant"] == "explore" and doc["training_detail"]["run_order"] == ["r0", "r1"]
    better = {"tuning": {"scape99": {"mc2": {"val_loss": 2.4, "best_lr": 2e-4}}},
              "rows": {"scape99": {"mc2": {"val_loss": 2.4, "bytes_per_step": 2.0, "variant": "mc2"}}},
              "runs": {"r2": {}}, "run_order": ["r2"]}
    comm.fold_variants(doc, better)
    assert (t["best_variant"], t["best_lr"]) == ("mc2", 2e-4)
    assert doc["training"]["scape99"]["variant"] == "mc2" and doc["training"]["scape99"]["bytes_vs_dense_fp32_run"] == 0.02
