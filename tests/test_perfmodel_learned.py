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
from lab.training.perfmodel.predict import (Calibration, LearnedPredictor, compute_calls, one_rank_per_host, single_tier,
                                            tp_allreduce_s, tp_calls)
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
    with pytest.raises(ValueError, match="comm row 2 .*time_s = -1"):
        CommModel(rows[:2] + [dict(rows[2], time_s=-1.0)])


def test_comm_curve_is_made_non_decreasing_pooling_noisy_sizes_by_repeats():
    # 4 KiB's mean sits above 16 KiB's (a noisy size): the two are pooled, weighted by their repeats (3 and 1)
    rows = [{"collective": "all_reduce", "world": 2, "tier": "loopback", "bytes": b, "time_s": t, "times_s": [t] * n}
            for b, t, n in ((1024, 1e-4, 2), (4096, 4e-4, 3), (16384, 2e-4, 1), (65536, 8e-4, 2))]
    c = CommModel(rows).curves[("all_reduce", 2, "loopback")]
    pooled = (3 * 4e-4 + 1 * 2e-4) / 4
    assert c.times.tolist() == pytest.approx([1e-4, pooled, pooled, 8e-4])
    assert np.all(np.diff(c.times) >= 0)
    # above the largest size: the slope of the two largest measured means
    assert c(65536 + 1000) == pytest.approx(8e-4 + 1000 * (8e-4 - 2e-4) / (65536 - 16384))


@pytest.mark.parametrize("kw", [dict(), dict(pp=2), dict(pp=3, n_layer=4)])
def test_measured_stage_module_holds_the_decomposition_parameters(kw):
    cfg = PerfConfig(**({"n_layer": 3, "d_model": 32, "n_head": 4, "seq_len": 16, "vocab_size": 50} | kw))
    want = stage_parameters(cfg)
    got = [sum(p.numel() for p in StageModule(cfg, s).parameters()) for s in range(cfg.pp)]
    assert got == want


def _stub_predictor(per_flop: float = 0.0):
    """Every primitive 1 ms (+ ``per_flop`` s a FLOP), every collective 0.5 ms, engine overhead 0.1 ms."""
    prims = PrimitiveModel({}, 1e-4, "cpu")
    prims.predict = lambda kind, direction, precision, features, flops, nbytes: 1e-3 + per_flop * flops
    prims.predict_many = lambda kind, direction, precision, items: [1e-3 + per_flop * f for _, f, _ in items]
    rows = [{"collective": c, "world": 2, "tier": tier, "bytes": b, "time_s": 5e-4}
            for c in ("all_reduce", "send_recv") for b in (1, 10**9) for tier in ("loopback", "fast", "slow")]
    return LearnedPredictor(prims, CommModel(rows))


def test_every_compute_operator_has_a_primitive_and_the_predictor_composes():
    cfg = PerfConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=40, tp=2, pp=2, dp=1, n_micro_batches=2)
    kinds = {features_of(o, cfg)[0] for o in decompose(cfg) if not o.is_collective}
    assert kinds == {"embedding", "position_embedding", "layernorm", "linear", "attention", "gelu", "residual",
                     "cross_entropy", "optimizer_step"}

    p = _stub_predictor().predict(cfg)  # every primitive 1 ms, every collective 0.5 ms, engine overhead 0.1 ms
    n_fwd = [sum(1 for o in decompose(cfg) if o.stage == s and o.phase == "micro_batch" and not o.is_collective)
             for s in range(2)]
    n_comm_fwd = [sum(o.calls for o in decompose(cfg) if o.stage == s and o.is_collective and o.phase == "micro_batch"
                      and o.fwd_bytes > 0) for s in range(2)]
    assert p.plan.fwd == pytest.approx([n * 1e-3 + c * 5e-4 for n, c in zip(n_fwd, n_comm_fwd)])
    assert p.prediction_s < 1.0


def test_calibration_finds_a_known_multiplier_and_per_call_offset_and_scales_compute_not_collectives():
    bare = _stub_predictor(per_flop=1e-8)
    cfgs = [PerfConfig(n_layer=L, d_model=d, n_head=2, seq_len=s, vocab_size=40, n_micro_batches=2)
            for L, d, s in ((1, 32, 8), (2, 64, 16), (3, 96, 32), (2, 128, 8))]
    preds = [bare.predict(c) for c in cfgs]
    calls = [compute_calls(c) for c in cfgs]
    # forward: 2x the prediction + 40 us a call (the affine form fits it exactly, leave-one-out error 0);
    # backward 1.5x; update 0.4x, 0.5x, 0.9x (always multiplicative: the median, 0.5)
    runs = [(c, {"stage_fwd_max": 2.0 * p.max_fwd_s + 4e-5 * n, "stage_bwd_max": 1.5 * p.max_bwd_s,
                 "update": k * p.update_s}) for c, p, n, k in zip(cfgs[:3], preds, calls, (0.4, 0.5, 0.9))]
    cal = Calibration.fit(bare, runs)
    f = cal.factors[1]
    assert cal.forms[1]["fwd"] == "affine" and cal.loo_mape[1]["fwd"]["affine"] < 1e-6 < cal.loo_mape[1]["fwd"]["multiplicative"]
    assert f["fwd"] == pytest.approx(2.0, rel=1e-6) and f["fwd_op_s"] == pytest.approx(4e-5, rel=1e-6)
    assert f["update"] == pytest.approx(0.5) and cal.forms[1]["update"] == "multiplicative" and cal.n_runs == {1: 3}
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal
    # a held-out configuration: the calibrated prediction follows the same law
    p = LearnedPredictor(bare.primitives, bare.comm, cal).predict(cfgs[3])
    assert p.max_fwd_s == pytest.approx(2.0 * preds[3].max_fwd_s + 4e-5 * calls[3], rel=1e-6)
    assert p.max_bwd_s == pytest.approx(1.5 * preds[3].max_bwd_s, rel=1e-6)
    assert p.update_s == pytest.approx(0.5 * preds[3].update_s)
    # a world with no entry takes the largest calibrated world below it; none below: no correction
    cal2 = Calibration({1: {"fwd": 3.0, "bwd": 1.5, "update": 0.5}, 2: {"fwd": 5.0, "bwd": 1.0, "update": 1.0}})
    assert cal2.factor(4, "fwd") == 5.0 and cal2.factor(1, "fwd") == 3.0
    assert Calibration().factor(1, "bwd") == 1.0 and Calibration().factor(1, "bwd_op_s") == 0.0
    assert Calibration().factor(2, "pp_send_s") == 0.0
    # no calibration is the identity: the same step as an empty one, the regressors' own times
    pp = cfgs[0].model_copy(update={"pp": 2, "n_layer": 2})
    assert bare.predict(pp).plan.by_operator == LearnedPredictor(bare.primitives, bare.comm, Calibration()).predict(pp).plan.by_operator
    # TP 2 (two ranks, world-1 factors): the all-reduces keep their measured 0.5 ms, the compute is calibrated
    tp = cfgs[0].model_copy(update={"tp": 2})
    b2 = bare.predict(tp).plan.by_operator
    c2 = LearnedPredictor(bare.primitives, bare.comm, cal).predict(tp).plan.by_operator
    for key, t in b2.items():
        if key[1].startswith("tp_allreduce"):
            want = t
        elif key[1] == "optimizer_step":
            want = 0.5 * t
        else:  # by_operator sums an operator over its layers: calls x layers
            n = sum(o.calls for o in decompose(tp) if (o.stage, o.name) == key[:2])
            want = (2.0 * t + 4e-5 * n) if key[2] == "fwd" else 1.5 * t
        assert c2[key] == pytest.approx(want, rel=1e-6), key


def test_calibration_of_the_tp_allreduce_comes_from_tp_runs_and_scales_only_it():
    bare = _stub_predictor()
    tp = PerfConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=40, n_micro_batches=2, tp=2)
    pb = bare.predict(tp)
    tp_s = tp_allreduce_s(pb, tp)
    # 0.5 ms a call: every TP all-reduce call of the decomposition, in each direction it moves bytes, per micro-batch
    calls = sum(o.calls * ((o.fwd_bytes > 0) + (o.bwd_bytes > 0)) for o in decompose(tp)
                if o.name.startswith("tp_allreduce"))
    assert calls >= 4 * tp.n_layer and tp_s == pytest.approx(5e-4 * calls * tp.n_micro_batches)
    # the steps: the all-reduces 5x, and 0.3 ms of waiting for the other rank at every call
    truth = Calibration({2: {"tp_comm": 5.0, "tp_wait_s": 3e-4}})
    step = LearnedPredictor(bare.primitives, bare.comm, truth).predict(tp).total_s
    assert step > LearnedPredictor(bare.primitives, bare.comm, Calibration({2: {"tp_comm": 5.0}})).predict(tp).total_s
    cal = Calibration.fit(bare, [(tp, {"tp_allreduce": 4.0 * tp_s, "overall": step}),
                                 (tp, {"tp_allreduce": 6.0 * tp_s, "overall": step}),
                                 (tp, {"tp_allreduce": 5.0 * tp_s, "overall": step})])
    # the three runs share one shape: the multiplier (their median) wins; the affine form cannot tell calls from
    # time; the wait is solved from the steps once the multiplier is in place
    assert cal.factors == {2: {"tp_comm": pytest.approx(5.0), "tp_comm_op_s": 0.0,
                               "tp_wait_s": pytest.approx(3e-4, rel=1e-6)}} and cal.factor(2, "fwd") == 1.0
    assert cal.forms[2]["tp_comm"] == "multiplicative" and cal.forms[2]["tp_wait_s"] == "additive"
    assert cal.n_runs == {2: 3}
    # the component the runs measure (the all-reduces alone) leaves the waits out
    pw = LearnedPredictor(bare.primitives, bare.comm, cal).predict(tp)
    assert tp_allreduce_s(pw, tp, cal.factor(2, "tp_wait_s")) == pytest.approx(5.0 * tp_s, rel=1e-6)
    assert tp_allreduce_s(pw, tp) == pytest.approx(5.0 * tp_s + 3e-4 * tp_calls(tp), rel=1e-6)
    with pytest.raises(ValueError, match="overall"):
        Calibration.fit(bare, [(tp, {"tp_allreduce": tp_s})])
    cal = Calibration({2: {"tp_comm": 5.0, "tp_comm_op_s": 0.0}})
    # an affine TP correction: seconds added per call, only in the directions that move bytes
    aff = LearnedPredictor(bare.primitives, bare.comm, Calibration({2: {"tp_comm": 1.0, "tp_comm_op_s": 1e-4}}))
    by_aff = aff.predict(tp).plan.by_operator
    ops = decompose(tp)
    for (st, name, d), t in pb.plan.by_operator.items():
        if name.startswith("tp_allreduce"):
            n = sum(o.calls for o in ops if (o.stage, o.name) == (st, name) and (o.fwd_bytes if d == "fwd" else o.bwd_bytes) > 0)
            assert by_aff[(st, name, d)] == pytest.approx(t + 1e-4 * n), (st, name, d)
    assert tp_allreduce_s(aff.predict(tp), tp) == pytest.approx(tp_s + 1e-4 * tp_calls(tp))
    assert any(o.name.startswith("tp_allreduce") and o.bwd_bytes == 0 for o in ops)  # the rule is exercised
    pc = LearnedPredictor(bare.primitives, bare.comm, cal).predict(tp)
    assert tp_allreduce_s(pc, tp) == pytest.approx(5.0 * tp_s)
    for key, t in pb.plan.by_operator.items():
        assert pc.plan.by_operator[key] == pytest.approx(5.0 * t if key[1].startswith("tp_allreduce") else t), key


def test_calibration_of_the_pp_sends_solves_for_the_measured_step():
    bare = _stub_predictor()
    pp = PerfConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=40, n_micro_batches=3, pp=2)
    truth = Calibration({2: {"pp_send_s": 2e-4}})
    target = LearnedPredictor(bare.primitives, bare.comm, truth).predict(pp).total_s
    # the sends are on the critical path: 0.2 ms more each lengthens the step
    assert target > bare.predict(pp).total_s + 2e-4
    # a wait per send, in the directions that send: stage 0 sends activations forward, stage 1 gradients back
    b0 = bare.predict(pp).plan.by_operator
    b1 = LearnedPredictor(bare.primitives, bare.comm, truth).predict(pp).plan.by_operator
    assert b1[(0, "pp_p2p", "fwd")] == pytest.approx(b0[(0, "pp_p2p", "fwd")] + 2e-4)
    assert b1[(0, "pp_p2p", "bwd")] == b0[(0, "pp_p2p", "bwd")] == 0.0
    assert b1[(1, "pp_p2p", "bwd")] == pytest.approx(b0[(1, "pp_p2p", "bwd")] + 2e-4)
    assert b1[(1, "pp_p2p", "fwd")] == 0.0
    cal = Calibration.fit(bare, [(pp, {"overall": target})])
    assert cal.factors == {2: {"pp_send_s": pytest.approx(2e-4, rel=1e-6)}} and cal.n_runs == {2: 1}
    # a step already slower without any wait than measured: 0; one no wait up to 10 ms reaches: 10 ms
    assert Calibration.fit(bare, [(pp, {"overall": 1e-6})]).factors[2]["pp_send_s"] == 0.0
    assert Calibration.fit(bare, [(pp, {"overall": 1e3})]).factors[2]["pp_send_s"] == 0.01
    with pytest.raises(ValueError, match="overall"):
        Calibration.fit(bare, [(pp, {"overall": -1.0})])
    with pytest.raises(ValueError, match="zero1"):
        Calibration.fit(bare, [(pp.model_copy(update={"pp": 1, "dp": 2, "zero1": True}),
                                {"stage_fwd_max": 1e-3, "stage_bwd_max": 1e-3, "update": 1e-3})])


def test_calibration_of_the_gradient_sync_solves_one_wait_per_step():
    bare = _stub_predictor()
    dp = PerfConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=40, n_micro_batches=2, dp=2,
                    bucket_cap_mb=0.01)  # several buckets: the wait is once per sync, not per bucket
    assert next(o for o in decompose(dp) if o.name == "dp_allreduce").calls > 1
    truth = Calibration({2: {"dp_wait_s": 3e-4}})
    p0, p1 = bare.predict(dp), LearnedPredictor(bare.primitives, bare.comm, truth).predict(dp)
    assert p1.grad_sync_s == pytest.approx(p0.grad_sync_s + 3e-4) and p1.total_s == pytest.approx(p0.total_s + 3e-4)
    assert p1.max_fwd_s == p0.max_fwd_s and p1.update_s == p0.update_s
    # fitted on top of the compute corrections from the same run's components; the TP and PP runs' keys untouched
    measured = {"stage_fwd_max": p0.max_fwd_s, "stage_bwd_max": p0.max_bwd_s, "update": p0.update_s, "overall": p1.total_s}
    cal = Calibration.fit(bare, [(dp, measured)])
    assert cal.factors[2]["dp_wait_s"] == pytest.approx(3e-4, rel=1e-6) and cal.n_runs == {2: 1}
    assert cal.forms[2]["dp_wait_s"] == "additive" and "tp_wait_s" not in cal.factors[2]
    # PP 2 x DP 2: each stage's sync waits, the stages' syncs run side by side, so the step grows by one wait
    ppdp = dp.model_copy(update={"pp": 2, "n_micro_batches": 3})
    q0, q1 = bare.predict(ppdp), LearnedPredictor(bare.primitives, bare.comm, truth).predict(ppdp)
    assert q1.total_s == pytest.approx(q0.total_s + 3e-4) and q1.grad_sync_s == pytest.approx(q0.grad_sync_s + 3e-4)
    # the benchmark compares the all-reduce alone with the measured (last-arriving rank's) sync
    from benchmarks.perfmodel import _predicted_components
    assert _predicted_components(p1, dp, 0.0, 3e-4)["grad_sync"] == pytest.approx(p0.grad_sync_s)
    # another tier without DP runs of its own takes loopback's wait; a step already slower than measured gets 0
    assert truth.factor(2, "dp_wait_s", "slow") == 3e-4
    assert Calibration.fit(bare, [(dp, {**measured, "overall": 1e-6})]).factors[2]["dp_wait_s"] == 0.0
    with pytest.raises(ValueError, match="overall"):
        Calibration.fit(bare, [(dp, {**measured, "overall": float("nan")})])


def test_calibration_fits_a_shaped_tiers_own_waits_on_top_of_loopbacks():
    bare = _stub_predictor()
    tp = PerfConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=40, n_micro_batches=2, tp=2)
    pp = tp.model_copy(update={"tp": 1, "pp": 2, "n_micro_batches": 3})
    truth = Calibration({2: {"tp_wait_s": 1e-4, "pp_send_s": 2e-4}},
                        tier_factors={"slow": {2: {"tp_wait_s": 5e-4, "pp_send_s": 5e-5}}})
    learned = LearnedPredictor(bare.primitives, bare.comm, truth)
    step = {(c.tp, tier): learned.predict(c, single_tier() if tier == "loopback" else one_rank_per_host()).total_s
            for c in (tp, pp) for tier in ("loopback", "slow")}
    # the slow tier's waits apply to its collectives only: the loopback step of the same config differs
    assert step[(2, "slow")] > step[(2, "loopback")] and step[(1, "slow")] < step[(1, "loopback")]
    tp_s = tp_allreduce_s(bare.predict(tp), tp)
    runs = [(tp, {"tp_allreduce": tp_s, "overall": step[(2, "loopback")]}), (pp, {"overall": step[(1, "loopback")]}),
            (tp, {"overall": step[(2, "slow")]}, "slow"), (pp, {"overall": step[(1, "slow")]}, "slow")]
    cal = Calibration.fit(bare, runs)
    assert cal.factors[2]["tp_wait_s"] == pytest.approx(1e-4, rel=1e-6)
    assert cal.factors[2]["pp_send_s"] == pytest.approx(2e-4, rel=1e-6)
    assert cal.tier_factors == {"slow": {2: {"tp_wait_s": pytest.approx(5e-4, rel=1e-6),
                                             "pp_send_s": pytest.approx(5e-5, rel=1e-5)}}}
    assert cal.n_runs == {2: 4}
    # a tier without its own waits (and every non-wait key) takes loopback's
    assert cal.factor(2, "tp_wait_s", "fast") == cal.factor(2, "tp_wait_s") == cal.factors[2]["tp_wait_s"]
    assert cal.factor(2, "tp_comm", "slow") == cal.factor(2, "tp_comm")
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json()))) == cal


@pytest.mark.parametrize("bad", [{"stage_fwd_max": 1e-3, "stage_bwd_max": 1e-3},
                                 {"stage_fwd_max": 1e-3, "stage_bwd_max": -1.0, "update": 1e-3},
                                 {"stage_fwd_max": float("nan"), "stage_bwd_max": 1e-3, "update": 1e-3}])
def test_calibration_refuses_a_run_without_a_positive_component(bad):
    cfg = PerfConfig(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=40)
    missing = next(k for k in ("stage_fwd_max", "stage_bwd_max", "update")
                   if not (isinstance(bad.get(k), float) and bad[k] > 0))
    with pytest.raises(ValueError, match=missing):
        Calibration.fit(_stub_predictor(), [(cfg, bad)])


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
    assert res["uncalibrated_mape"] == pytest.approx(np.mean([abs(r["uncalibrated_error"]) for r in rows]) * 100)
    # the calibration: refit from its own runs gives the committed factors; no calibration run is a validation shape
    shapes = lambda c: (c["d_model"], c["seq_len"], c["vocab_size"])  # noqa: E731
    cal_runs = res["calibration_runs"]
    assert len(cal_runs) >= 16 and not {shapes(r["config"]) for r in cal_runs} & {shapes(r["config"]) for r in rows}
    assert {(r["config"]["dp"], r["config"]["tp"], r["config"]["pp"]) for r in cal_runs} == \
        {(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)}
    if any(r["tier"] != "loopback" for r in rows):  # shaped validation runs come with shaped calibration runs
        assert {(r["config"]["tp"], r["config"]["pp"]) for r in cal_runs if r["tier"] == "slow"} == {(2, 1), (1, 2)}
    layouts = {(r["config"]["dp"], r["config"]["tp"], r["config"]["pp"]) for r in rows}
    assert {(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)} <= layouts
    ex = Explorer(RESULTS.parent)
    refit = Calibration.fit(ex.learned, [(PerfConfig.model_validate(r["config"]), r["measured"], r["tier"])
                                         for r in cal_runs])
    assert ex.learned.calibration is ex.calibration and refit.n_runs == ex.calibration.n_runs
    for w, f in refit.factors.items():
        assert f == pytest.approx(ex.calibration.factors[w], rel=5e-3)
    for t, per in refit.tier_factors.items():
        for w, f in per.items():
            assert f == pytest.approx(ex.calibration.tier_factors[t][w], rel=5e-3, abs=1e-6)
    slow = [r for r in rows if r["tier"] != "loopback"]
    for r in rows[:3] + [r for r in rows if r["config"]["pp"] == 2][:1] + [r for r in rows if r["config"]["tp"] == 2][:1] + slow:
        cfg = PerfConfig.model_validate(r["config"])
        got = ex.predict(cfg, "local", r["tier"])
        # Not bit for bit: the refit's base (scipy's nnls) and log features go through this CPU's BLAS and
        # SIMD kernels, which moved predictions by up to 0.11 % between the benchmark's machine and CI's.
        # 0.5 % is far inside the model's error and below what another split's regressor choice gives
        # (the benchmark's seeds 1 and 2 move these predictions by a median 1.5 %).
        assert got.prediction.total_s == pytest.approx(r["predicted_s"], rel=5e-3)
        assert got.measured_s == r["measured_s"]


def test_benchmark_runs_take_each_component_median_over_passes():
    from benchmarks.perfmodel import CALIBRATION_CONFIGS, CONFIGS, SHAPED_CONFIGS, _median_of_passes

    passes = [{"overall": 3.0, "update": 1.0, "steps_s": [3.0, 3.1]}, {"overall": 1.0, "update": 5.0, "steps_s": [1.0]},
              {"overall": 2.0, "update": 2.0, "steps_s": [2.0]}]
    got = _median_of_passes(passes)
    # component by component, each its own median (not necessarily all from one pass)
    assert got["overall"] == 2.0 and got["update"] == 2.0 and got["overall_per_pass"] == [3.0, 1.0, 2.0]
    assert got["steps_s"] == [3.0, 3.1, 1.0, 2.0]
    passes[2]["update"] = 9.0
    assert _median_of_passes(passes)["update"] == 5.0 and _median_of_passes(passes)["overall"] == 2.0
    # the calibration set and the validation set share no (d, s, V) shape
    shape = lambda c: (c.d_model, c.seq_len, c.vocab_size)  # noqa: E731
    assert not {shape(c) for c in CALIBRATION_CONFIGS} & {shape(c) for c in CONFIGS + SHAPED_CONFIGS}


def test_noise_floor_recovers_a_known_spread_and_refuses_ragged_passes():
    from benchmarks.perfmodel import noise_floor_mape

    rng = np.random.default_rng(3)
    mu = np.exp(rng.uniform(-5.0, -2.0, 300))  # true step times, 7 ms .. 135 ms
    for sigma in (0.05, 0.15):
        x = mu[:, None] * (1.0 + sigma * rng.standard_normal((300, 3)))
        truth = float(np.mean(np.abs(np.median(x, axis=1) - mu) / mu) * 100)  # what an oracle scores
        got = noise_floor_mape(x.tolist())
        assert got["passes"] == 3 and got["mape"] == pytest.approx(truth, rel=0.12)
        assert got["pairwise_rel_diff_percent"] == pytest.approx(2 / np.sqrt(np.pi) * sigma * 100, rel=0.12)
    # identical passes: no noise, floor 0
    assert noise_floor_mape([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])["mape"] == 0.0
    with pytest.raises(ValueError, match="same number"):
        noise_floor_mape([[1.0, 1.1, 0.9], [1.0, 1.1]])
    with pytest.raises(ValueError, match=">= 2"):
        noise_floor_mape([[1.0], [2.0]])
