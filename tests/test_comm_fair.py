"""benchmarks.comm_fair: the equal-budget learning-rate search by hand and as a property, the fixed
configurations read from the committed tuning, the paired table, and one quick run end to end."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import comm, comm_fair


def _log2_bowl(centre: float):
    return lambda lr: math.log2(lr / centre) ** 2


def test_search_extends_past_an_edge_then_refines_by_hand():
    out = comm_fair.search_lr(_log2_bowl(0.9e-3), start=(2e-3, 4e-3, 8e-3), budget=8)
    # 2e-3 is best and on the low edge -> 1e-3 (edge again) -> 5e-4; now 1e-3 is interior with two one-octave
    # intervals beside it: the better neighbour's (5e-4: 0.72 < 2e-3: 1.33), sqrt(5e-4 * 1e-3); then the wider
    # interval is the upper one, sqrt(1e-3 * 2e-3); then both are half an octave and the better neighbour
    # (7.07e-4: 0.12 < 1.41e-3: 0.43) is the lower one, 1e-3 / 2**0.25 = 8.41e-4, the new best
    r = math.sqrt(2)
    assert out["order"] == pytest.approx([2e-3, 4e-3, 8e-3, 1e-3, 5e-4, 1e-3 / r, 1e-3 * r, 1e-3 / 2 ** 0.25])
    assert out["best_lr"] == pytest.approx(1e-3 / 2 ** 0.25)
    assert out["best_loss"] == pytest.approx(math.log2(1e-3 / 2 ** 0.25 / 0.9e-3) ** 2)
    assert out["best_on_edge"] is False and out["budget"] == 8 == len(out["grid"])
    assert list(out["grid"]) == [f"{x:.6g}" for x in out["order"]]


def test_search_reports_an_edge_when_the_budget_runs_out():
    out = comm_fair.search_lr(lambda lr: lr, start=(2e-3, 4e-3), budget=4)  # always smaller is better
    assert out["order"] == pytest.approx([2e-3, 4e-3, 1e-3, 5e-4])
    assert out["best_on_edge"] is True and out["best_lr"] == pytest.approx(5e-4)


@settings(max_examples=60, deadline=None)
@given(centre_exp=st.floats(-4.0, 4.0), width=st.floats(0.3, 3.0))
def test_search_finds_an_interior_minimum_of_any_log_bowl(centre_exp, width):
    """A loss unimodal in log2(lr): given enough budget to walk to it (one run per factor 2 plus three),
    the search ends with its best interior and within one grid step of the true minimum."""
    centre = 4e-3 * 2 ** centre_exp
    budget = 3 + math.ceil(abs(centre_exp)) + 3
    out = comm_fair.search_lr(lambda lr: (math.log2(lr / centre) / width) ** 2, budget=budget)
    assert out["best_on_edge"] is False
    assert abs(math.log2(out["best_lr"] / centre)) <= 1.0
    assert sorted(out["order"][:3]) == list(comm_fair.START_GRID)


def test_search_refuses_bad_grids_and_budgets():
    with pytest.raises(ValueError, match="two distinct positive"):
        comm_fair.search_lr(abs, start=(1e-3,), budget=3)
    with pytest.raises(ValueError, match="two distinct positive"):
        comm_fair.search_lr(abs, start=(1e-3, -1e-3), budget=3)
    with pytest.raises(ValueError, match="budget 2 is smaller"):
        comm_fair.search_lr(abs, start=(1e-3, 2e-3, 4e-3), budget=2)


def _committed(tmp_path):
    def grid(*lrs):
        return {f"{x:g}": {"val_loss": 2.0} for x in lrs}

    doc = {"training_detail": {
        "gift_kwargs": {"damping": 1.0, "ema": 0.5},
        "tuning": {
            "adams": {"best_variant": "beta1_0.7", "variants": {
                "beta1_0.9": {"optimizer_kwargs": {}, "grid": grid(1, 2, 3)},
                "beta1_0.7": {"optimizer_kwargs": {"betas": [0.7, 0.95]}, "grid": grid(1, 2, 3)}}},
            "scape90": {"best_variant": "random", "variants": {
                "random": {"optimizer_kwargs": {"explore": 1.0, "mask_sync": "local"}, "grid": grid(1, 2, 3, 4)}}},
            "scape99": {"best_variant": "explore", "variants": {
                "explore": {"optimizer_kwargs": {"explore": 0.2, "betas": [0.5, 0.95]}, "grid": grid(1, 2)},
                "topk": {"optimizer_kwargs": {}, "grid": grid(1, 2, 3)}}}}}}
    path = tmp_path / "comm.json"
    path.write_text(json.dumps(doc))
    return path


def test_configurations_are_the_committed_choices(tmp_path):
    c = comm_fair.configurations(_committed(tmp_path))
    assert list(c) == list(comm_fair.METHODS)
    for m in ("fp32", "bf16", "fp8", "gift_fp8"):
        assert c[m]["optimizer"] == "adams" and c[m]["optimizer_kwargs"] == {"betas": (0.7, 0.95)} and c[m]["comm"] == m
    assert c["gift_fp8"]["comm_kwargs"]["damping"] == 1.0 and c["gift_fp8"]["comm_kwargs"]["ema"] == 0.5
    assert c["scape90"]["optimizer_kwargs"] == {"sparsity": 0.9, "explore": 1.0, "mask_sync": "local"}
    assert c["scape99"]["optimizer_kwargs"] == {"sparsity": 0.99, "explore": 0.2, "betas": (0.5, 0.95)}
    # the lower formats: the same dense AdamS, the format on the Euclidean hook and on GIFT (with GIFT's settings)
    assert (c["fp8_e5m2"]["comm"], c["fp8_e5m2"]["comm_kwargs"]) == ("fp8", {"fmt": "e5m2"})
    assert (c["nvfp4"]["comm"], c["nvfp4"]["comm_kwargs"]) == ("nvfp4", {})
    assert c["gift_fp8_e5m2"]["comm"] == "gift_fp8" and c["gift_fp8_e5m2"]["comm_kwargs"] == {**c["gift_fp8"]["comm_kwargs"], "fmt": "e5m2"}
    assert c["gift_nvfp4"]["comm"] == "gift_nvfp4" and c["gift_nvfp4"]["comm_kwargs"] == c["gift_fp8"]["comm_kwargs"]
    assert all(c[m]["optimizer_kwargs"] == c["fp32"]["optimizer_kwargs"] for m in ("fp8_e5m2", "gift_fp8_e5m2", "nvfp4", "gift_nvfp4"))
    # the runs the committed exploration spent: AdamS's beta1 (6), SCAPE's variants (4; 5), none for the codecs
    assert [c[m]["exploratory_runs"] for m in comm_fair.METHODS] == [6, 0, 0, 0, 0, 0, 0, 0, 4, 5]
    assert "variant explore" in c["scape99"]["source"]
    with pytest.raises(FileNotFoundError, match="--part training"):
        comm_fair.configurations(tmp_path / "missing.json")


def test_table_pairs_by_seed_by_hand(tmp_path):
    c = comm_fair.configurations(_committed(tmp_path))
    tuned = {m: {"best_lr": 1e-3, "budget": 7, "best_on_edge": False} for m in ("fp32", "fp8")}
    run = lambda t, v, b: {"test_loss": t, "val_loss": v, "bytes_vs_dense": b}  # noqa: E731
    test = {"fp32": {1: run(2.0, 2.1, 1.0), 2: run(2.2, 2.3, 1.0), 3: run(2.4, 2.5, 1.0)},
            "fp8": {1: run(2.02, 2.1, 0.25), 2: run(2.222, 2.3, 0.25), 3: run(2.4, 2.5, 0.25)}}
    rows = comm_fair.summarize(["fp32", "fp8"], tuned, c, test, [1, 2, 3])
    assert [r["method"] for r in rows] == ["fp32", "fp8"] and "vs_fp32" not in rows[0]
    assert rows[0]["test_loss"]["mean"] == pytest.approx(2.2) and rows[0]["exploratory_runs"] == 6
    lo, hi = rows[0]["test_loss"]["ci95"]  # sd 0.2, t(0.975, 2) = 4.3027
    assert hi - 2.2 == pytest.approx(4.3027 * 0.2 / math.sqrt(3), rel=1e-4) and 2.2 - lo == pytest.approx(hi - 2.2)
    v = rows[1]["vs_fp32"]
    assert v["per_seed"] == pytest.approx([0.01, 0.01, 0.0]) and v["mean"] == pytest.approx(0.02 / 3)
    assert v["ci95"][0] < 0 < v["ci95"][1] and rows[1]["verdict"] == "not distinguishable from fp32"
    assert rows[1]["bytes_vs_dense"] == 0.25
    assert rows[0]["seeds"] == [1, 2, 3] and rows[0]["val_loss"]["per_seed"] == [2.1, 2.3, 2.5]
    vlo, vhi = rows[0]["val_loss_ci95"]  # the same spread as the test loss, around 2.3
    assert (vlo + vhi) / 2 == pytest.approx(2.3) and vhi - vlo == pytest.approx(hi - lo)
    assert comm_fair._verdict([0.01, 0.02]) == "higher than fp32" and comm_fair._verdict([-0.02, -0.01]) == "lower than fp32"


def test_merge_keeps_other_methods_only_when_fp32_reran_identically():
    def block(rows):
        return {"table": rows, "methods": {r["method"]: {} for r in rows}, "runs": {}, "methods_run": [r["method"] for r in rows]}

    old = block([{"method": "fp32", "test_loss": 2.0}, {"method": "fp8", "test_loss": 2.01}])
    same = comm_fair.merge_fair(old, block([{"method": "fp32", "test_loss": 2.0}, {"method": "scape90", "test_loss": 2.2}]))
    assert [r["method"] for r in same["table"]] == ["fp32", "fp8", "scape90"]
    other = comm_fair.merge_fair(old, block([{"method": "fp32", "test_loss": 2.1}, {"method": "scape90", "test_loss": 2.2}]))
    assert [r["method"] for r in other["table"]] == ["fp32", "scape90"]


@pytest.mark.timeout(600)
def test_quick_run_evaluates_the_test_split_only_in_the_test_runs(tmp_path):
    out = tmp_path / "comm.json"
    comm.main(["--out", str(out), "--quick", "--part", "training_fair", "--fair-methods", "fp8", "--workdir", str(tmp_path / "runs")])
    f = json.loads(out.read_text())["training_fair"]
    assert f["methods_run"] == ["fp32", "fp8"] and f["protocol"]["test_plays"] == ["macbeth", "richard_iii", "tempest", "twelfth_night"]
    tuning = {k: v for k, v in f["runs"].items() if k.startswith("tuning/")}
    test = {k: v for k, v in f["runs"].items() if k.startswith("test/")}
    assert len(tuning) == 2 * 3 and len(test) == 2 * 2
    assert all(v["test_loss"] is None for v in tuning.values())  # no choice ever sees the test split
    assert all(math.isfinite(v["test_loss"]) for v in test.values())
    for row in f["table"]:
        assert row["tuning_budget"] == 3 == len(f["methods"][row["method"]]["tuning"]["grid"])
        assert row["test_loss"]["per_seed"] == [test[f"test/{row['method']}_seed{s}"]["test_loss"] for s in (1, 2)]
    fp8 = f["table"][1]
    ref = f["table"][0]["test_loss"]["per_seed"]
    assert fp8["vs_fp32"]["per_seed"] == pytest.approx([(a - b) / b for a, b in zip(fp8["test_loss"]["per_seed"], ref)])
    assert f["floors"]["uniform"] == pytest.approx(math.log(85)) and f["floors"]["unigram"] < f["floors"]["uniform"]


def test_the_committed_fair_table_holds_what_the_readme_quotes():
    f = json.loads(comm_fair.COMMITTED.read_text())["training_fair"]
    assert f["methods_run"] == list(comm_fair.METHODS) and f["protocol"]["budget"] == 8
    assert f["protocol"]["test_seeds"] == [1, 2, 3] and comm_fair.TUNING_SEED not in f["protocol"]["test_seeds"]
    rows = {r["method"]: r for r in f["table"]}
    assert all(r["tuning_budget"] == 8 and not r["best_on_edge"] for r in rows.values())
    for name, r in rows.items():  # every row is recomputable from its runs
        per = [f["runs"][f"test/{name}_seed{s}"]["test_loss"] for s in (1, 2, 3)]
        assert r["test_loss"]["per_seed"] == per and r["seeds"] == [1, 2, 3]
        assert r["val_loss_ci95"] == pytest.approx(comm_fair.t_ci95(r["val_loss"]["per_seed"]))
        assert all(v["test_loss"] is None for k, v in f["runs"].items() if k.startswith(f"tuning/{name}_"))
        assert r["test_loss"]["mean"] < f["floors"]["unigram"] < f["floors"]["uniform"]
    readme = (comm_fair.ROOT / "README.md").read_text()
    assert f"{rows['fp32']['test_loss']['mean']:.3f}" in readme
    for name in ("scape90", "scape99"):
        v = rows[name]["vs_fp32"]
        assert rows[name]["verdict"] == "higher than fp32"
        assert f"+{100 * v['mean']:.1f}% [{100 * v['ci95'][0]:.1f}, {100 * v['ci95'][1]:.1f}]" in readme
    for name in ("bf16", "fp8", "gift_fp8", "fp8_e5m2", "gift_fp8_e5m2", "nvfp4", "gift_nvfp4"):
        assert rows[name]["verdict"] == "not distinguishable from fp32"
        lo, hi = rows[name]["vs_fp32"]["ci95"]
        assert f"[{100 * lo:.1f}, {100 * hi:.1f}]" in readme
    # the four lower formats ran later against the same fp32 test runs (the block says where they come from)
    assert any("fp32's test runs" in n for n in f.get("notes", []))
