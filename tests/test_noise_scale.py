"""lab.training.noise_scale: the estimators by hand and on draws with a known covariance, a codec's added
variance and Eqs. 1-3, bad input; benchmarks.comm_noise end to end (quick) and the committed figures."""

import json
import math

import pytest
import torch

from lab.training.errors import DataConfigError
from lab.training.noise_scale import codec_noise, noise_scale


def test_two_batches_by_hand():
    # g1 = (1, 0), g2 = (3, 0): mean (2, 0); sampling_var = (1 + 1) / (2 - 1) = 2; |G|^2 = 4 - 2 / 2 = 3
    ns = noise_scale([torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])], batch_size=4)
    assert ns.sampling_var == pytest.approx(2.0) and ns.grad_sq == pytest.approx(3.0)
    assert ns.trace_sigma == pytest.approx(8.0) and ns.b_simple == pytest.approx(8 / 3)
    assert ns.minibatch_sq == pytest.approx((1 + 9) / 2) == ns.grad_sq + ns.sampling_var
    # a codec that adds (0, 1) to every gradient: codec_var 1, e^2 = 2 / 10
    cn = codec_noise([torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])], lambda g: g + torch.tensor([0.0, 1.0]), ns)
    assert cn.codec_var == pytest.approx(1.0) and cn.rel_error == pytest.approx(math.sqrt(0.2))
    assert cn.ratio_to_sampling == pytest.approx(0.5) and cn.effective_batch_fraction == pytest.approx(1 / 1.5)
    # Eq. 1: e^2 (1 + B / B_simple) = 0.2 (1 + 4 * 3 / 8) = 0.5; Eq. 2: B* = (8/3)(1/0.2 - 1) = 32/3; Eq. 3: 1.2
    assert 0.2 * (1 + 4 / ns.b_simple) == pytest.approx(cn.ratio_to_sampling)
    assert cn.batch_where_equal == pytest.approx(32 / 3) and cn.steps_factor == pytest.approx(1.2)


def test_estimates_recover_a_known_covariance_and_signal():
    # per-example gradients G + z, z ~ N(0, diag(s^2)); minibatch means of B examples: tr(Sigma) = sum s^2
    gen = torch.Generator().manual_seed(0)
    d, b, k = 200, 8, 4000
    G = torch.linspace(-1, 1, d, dtype=torch.float64)
    s = torch.linspace(0.5, 2.0, d, dtype=torch.float64)
    grads = [G + s * torch.randn(d, generator=gen, dtype=torch.float64) / math.sqrt(b) for _ in range(k)]
    ns = noise_scale(grads, b)
    assert ns.trace_sigma == pytest.approx(float((s**2).sum()), rel=0.03)
    assert ns.grad_sq == pytest.approx(float((G**2).sum()), rel=0.05)
    assert ns.b_simple == pytest.approx(float((s**2).sum() / (G**2).sum()), rel=0.06)


def test_dict_gradients_are_one_flat_vector():
    a = {"w": torch.tensor([[1.0, 0.0]]), "b": torch.tensor([0.0])}
    c = {"w": torch.tensor([[3.0, 0.0]]), "b": torch.tensor([0.0])}
    assert noise_scale([a, c], 4) == noise_scale([torch.tensor([1.0, 0, 0]), torch.tensor([3.0, 0, 0])], 4)


def test_noise_swamping_the_signal_gives_an_infinite_scale():
    ns = noise_scale([torch.tensor([1.0]), torch.tensor([-1.0])], 2)  # mean 0: |G|^2 estimate -1
    assert ns.grad_sq < 0 and ns.b_simple == math.inf
    assert codec_noise([torch.tensor([1.0]), torch.tensor([-1.0])], lambda g: g * 1.1, ns).batch_where_equal == math.inf


def test_bad_input_is_refused_naming_it():
    one = torch.ones(3)
    with pytest.raises(DataConfigError, match=">= 2 minibatch gradients, got 1"):
        noise_scale([one], 4)
    with pytest.raises(DataConfigError, match="batch_size must be >= 1, got 0"):
        noise_scale([one, one], 0)
    with pytest.raises(DataConfigError, match=r"different sizes: \[2, 3\]"):
        noise_scale([one, torch.ones(2)], 4)
    with pytest.raises(DataConfigError, match="minibatch gradient 1 has a non-finite value"):
        noise_scale([one, torch.tensor([1.0, math.nan, 1.0])], 4)
    ns = noise_scale([one, 2 * one], 4)
    with pytest.raises(DataConfigError, match="3 gradients, but the noise scale came from 2"):
        codec_noise([one, one, one], lambda g: g, ns)
    with pytest.raises(DataConfigError, match="changed gradient 0's size from 3 to 2"):
        codec_noise([one, one], lambda g: g[:2], ns)


@pytest.mark.timeout(300)
def test_quick_noise_part_end_to_end(tmp_path):
    from benchmarks import comm

    out = tmp_path / "comm.json"
    comm.main(["--out", str(out), "--quick", "--part", "noise"])
    n = json.loads(out.read_text())["noise"]
    assert n["protocol"]["capture_steps"] == [1] and n["protocol"]["n_batches"] == 32
    row = n["by_step"]["1"]
    errs = {c: row["codecs"][c]["rel_error"] for c in ("bf16", "fp8_e4m3", "fp8_e5m2", "nvfp4")}
    assert errs["bf16"] < errs["fp8_e4m3"] < errs["fp8_e5m2"] < errs["nvfp4"] < 0.2  # the formats' order of precision
    for c, v in row["codecs"].items():  # Eq. 1 holds for the estimates; Eq. 3 is 1 + e^2
        assert v["ratio_to_sampling"] == pytest.approx(v["rel_error"] ** 2 * (1 + row["batch_size"] / row["b_simple"]), rel=1e-9)
        assert v["steps_factor"] == pytest.approx(1 + v["rel_error"] ** 2)


def test_committed_noise_part_holds_what_the_readme_quotes():
    from benchmarks.comm_noise import COMMITTED

    n = json.loads(COMMITTED.read_text())["noise"]
    assert n["protocol"]["capture_steps"] == [1, 20, 50, 100, 200, 400] and n["protocol"]["ranks"] == 2
    fair_lr = json.loads(COMMITTED.read_text())["training_fair"]["methods"]["fp32"]["tuning"]["best_lr"]
    assert n["protocol"]["lr"] == fair_lr
    readme = (COMMITTED.parents[2] / "README.md").read_text()
    lo, hi = n["b_simple_range"]
    assert f"{lo:.1f} to {hi:.0f}" in readme
    nv = n["summary"]["nvfp4"]
    assert f"{100 * nv['max_ratio_to_sampling']:.0f}%" in readme
    assert f"{100 * (nv['max_steps_factor'] - 1):.2f}%" in readme
