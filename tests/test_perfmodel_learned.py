"""The learned half of the performance model: regressors, the comm curves, the predictor, the measured runner.

No test times anything against a threshold: the regressor tests fit on a synthetic sweep with a known
answer and on the committed sampler file (measurements taken once, by ``benchmarks.perfmodel``).
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lab.training.perfmodel import PerfConfig, decompose, stage_parameters
from lab.training.perfmodel.comm import CommModel
from lab.training.perfmodel.parallel import StageModule, measure_steps
from lab.training.perfmodel.predict import LearnedPredictor
from lab.training.perfmodel.profile import features_of
from lab.training.perfmodel.regress import PrimitiveModel, fit_primitives

SAMPLES = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "perfmodel_samples_cpu.json"


def _synthetic(held_out, Ns=(32, 64, 96, 160, 224, 320, 448)):
    """Linear-kernel samples with a known time: 20 us launch + FLOPs at 40 GFLOP/s, 25 % slower when
    ``n`` is not a multiple of 64 (a blocking effect a linear base cannot see)."""
    rows = []
    for N in Ns:
        for k in (48, 80, 144, 208, 288):
            for n in (64, 100, 192, 250, 384):
                if (N, k, n) == held_out:
                    continue
                flops = 2.0 * N * k * n
                t = 20e-6 + flops / 40e9 * (1.0 if n % 64 == 0 else 1.25)
                rows.append({"kind": "linear", "direction": "fwd", "features": {"N": N, "k": k, "n": n, "bias": 1},
                             "flops": flops, "bytes": 4.0 * (N * k + k * n + N * n), "time_s": t, "times_s": [t]})
    return {"device": "cpu", "precision": "fp32", "engine_overhead_s": 0.0, "samples": rows}


def test_regressor_interpolates_a_held_out_shape_on_a_known_function():
    held = (128, 176, 250)  # none of N, k is in the sweep: interpolation
    model = fit_primitives(_synthetic(held))
    N, k, n = held
    flops = 2.0 * N * k * n
    truth = 20e-6 + flops / 40e9 * 1.25
    got = model.predict("linear", "fwd", "fp32", {"N": N, "k": k, "n": n, "bias": 1}, flops, 4.0 * (N * k + k * n + N * n))
    assert abs(got - truth) / truth < 0.05           # stated tolerance: 5 %
    base = model.linear_base_only().predict("linear", "fwd", "fp32", {"N": N, "k": k, "n": n, "bias": 1}, flops,
                                            4.0 * (N * k + k * n + N * n))
    assert abs(base - truth) > abs(got - truth)       # the trees learn the blocking effect the base misses
    reg = model.regressors[("linear", "fwd", "fp32")]
    assert reg.family in ("random_forest", "gradient_boosting") and reg.n_validation > 0
    assert set(reg.validation_mape) >= {"linear_base", "random_forest[0]", "gradient_boosting[0]"}


def test_regressor_held_out_measured_shape_within_tolerance():
    samples = json.loads(SAMPLES.read_text())  # required: committed by benchmarks.perfmodel --part sample
    rows = [s for s in samples["samples"] if s["kind"] == "linear" and s["direction"] == "fwd"]
    # hold out the median-sized measured shape (an interior point of the sweep), fit on the rest
    rows.sort(key=lambda s: s["flops"])
    held = rows[len(rows) // 2]
    rest = [s for s in samples["samples"] if s is not held and s["kind"] == "linear"]
    model = fit_primitives({**samples, "samples": rest})
    got = model.predict("linear", "fwd", samples["precision"], held["features"], held["flops"], held["bytes"])
    assert abs(got - held["time_s"]) / held["time_s"] < 0.30  # stated tolerance: 30 % on a shared 2-core machine


def test_missing_regressor_names_the_key():
    model = fit_primitives(_synthetic(None, Ns=(32,)))
    with pytest.raises(KeyError, match="gelu"):
        model.predict("gelu", "fwd", "fp32", {"N": 1, "n": 1}, 1.0, 1.0)
    with pytest.raises(ValueError, match="no samples"):
        fit_primitives({"samples": []})


def test_comm_curve_interpolates_in_log_log_and_refuses_unknown_tiers():
    rows = [{"collective": "all_reduce", "world": 2, "tier": "loopback", "bytes": b, "time_s": 1e-4 + b / 1e9}
            for b in (1024, 4096, 16384, 65536)]
    m = CommModel(rows)
    assert m.time("all_reduce", 2, 4096) == pytest.approx(1e-4 + 4096 / 1e9)
    mid = m.time("all_reduce", 2, 8192)
    assert 1e-4 + 4096 / 1e9 < mid < 1e-4 + 16384 / 1e9
    assert m.time("all_reduce", 1, 4096) == 0.0 and m.time("all_reduce", 2, 0) == 0.0
    assert m.time("all_reduce", 2, 131072) == pytest.approx(1e-4 + 131072 / 1e9, rel=1e-6)  # alpha-beta extrapolation
    a, beta = m.curves[("all_reduce", 2, "loopback")].alpha_beta()
    assert a == pytest.approx(1e-4, rel=1e-3) and beta == pytest.approx(1e9, rel=1e-3)
    with pytest.raises(KeyError, match="slow"):
        m.time("all_reduce", 2, 4096, "slow")
    with pytest.raises(ValueError, match="two"):
        CommModel(rows[:1])


@pytest.mark.parametrize("kw", [dict(), dict(pp=2), dict(pp=3, n_layer=4)])
def test_measured_stage_module_holds_the_decomposition_parameters(kw):
    cfg = PerfConfig(**({"n_layer": 3, "d_model": 32, "n_head": 4, "seq_len": 16, "vocab_size": 50} | kw))
    want = stage_parameters(cfg)
    got = [sum(p.numel() for p in StageModule(cfg, s).parameters()) for s in range(cfg.pp)]
    assert got == want


def test_every_compute_operator_has_a_primitive_and_the_predictor_composes():
    cfg = PerfConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=40, tp=2, pp=2, dp=1, n_micro_batches=2)
    kinds = {features_of(o, cfg)[0] for o in decompose(cfg) if not o.is_collective}
    assert kinds == {"embedding", "position_embedding", "layernorm", "linear", "attention", "gelu", "residual",
                     "cross_entropy", "optimizer_step"}

    prims = PrimitiveModel({}, 1e-4, "cpu")  # every primitive 1 ms, every collective 0.5 ms, engine overhead 0.1 ms
    prims.predict = lambda kind, direction, precision, features, flops, nbytes: 1e-3
    prims.predict_many = lambda kind, direction, precision, items: [1e-3] * len(items)
    rows = [{"collective": c, "world": 2, "tier": "loopback", "bytes": b, "time_s": 5e-4}
            for c in ("all_reduce", "send_recv") for b in (1, 10**9)]
    p = LearnedPredictor(prims, CommModel(rows)).predict(cfg)
    n_fwd = [sum(1 for o in decompose(cfg) if o.stage == s and o.phase == "micro_batch" and not o.is_collective)
             for s in range(2)]
    n_comm_fwd = [sum(o.calls for o in decompose(cfg) if o.stage == s and o.is_collective and o.phase == "micro_batch"
                      and o.fwd_bytes > 0) for s in range(2)]
    assert p.plan.fwd == pytest.approx([n * 1e-3 + c * 5e-4 for n, c in zip(n_fwd, n_comm_fwd)])
    assert p.prediction_s < 1.0


def test_measured_tensor_parallel_step_runs_and_reports_its_parts():
    cfg = PerfConfig(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=40, tp=2, n_micro_batches=2)
    times, ranks = measure_steps(cfg, steps=2, warmup=1, detail=True, timeout_s=120)
    assert len(times) == 2 and all(t > 0 for t in times)
    part = ranks[0]["parts"][0]
    assert len(part["fwd_s"]) == len(part["bwd_s"]) == 2 and part["tp_comm_s"] > 0 and len(part["block_fwd_s"]) == 2
    assert math.isfinite(part["update_s"])


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "perfmodel.json"


def test_committed_benchmark_is_consistent_and_reproduced_by_its_model():
    """The committed run (required): >= 16 configurations, MAPEs recomputed from its rows, and the explorer's
    refit of the chosen regressors on the committed samples gives the committed predictions again."""
    from lab.training.perfmodel.explore import Explorer

    res = json.loads(RESULTS.read_text())
    rows = res["configs"]
    assert len(rows) >= 16
    for r in rows:
        assert {"config", "predicted_s", "measured_s", "error", "roofline_s"} <= set(r)
        assert r["error"] == pytest.approx((r["predicted_s"] - r["measured_s"]) / r["measured_s"])
    assert res["mape"] == pytest.approx(np.mean([abs(r["error"]) for r in rows]) * 100)
    assert res["roofline_mape"] == pytest.approx(np.mean([abs(r["roofline_error"]) for r in rows]) * 100)
    assert {"stage_fwd_max", "stage_bwd_max", "overall"} <= set(res["components"])
    layouts = {(r["config"]["dp"], r["config"]["tp"], r["config"]["pp"]) for r in rows}
    assert {(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)} <= layouts
    ex = Explorer(RESULTS.parent)
    for r in rows[:3] + [r for r in rows if r["config"]["pp"] == 2][:1]:
        cfg = PerfConfig.model_validate(r["config"])
        got = ex.predict(cfg, "local", r["tier"])
        # Not bit for bit: the refit's base (scipy's nnls) and log features go through this CPU's BLAS and
        # SIMD kernels, which moved predictions by up to 0.11 % between the benchmark's machine and CI's.
        # 0.5 % is far inside the model's error and below what another split's regressor choice gives
        # (the benchmark's seeds 1 and 2 move these predictions by a median 1.5 %).
        assert got.prediction.total_s == pytest.approx(r["predicted_s"], rel=5e-3)
        assert got.measured_s == r["measured_s"]
