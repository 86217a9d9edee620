"""DDP communication hooks and the GIFT transform (lab.training.comm.hooks, lab.training.comm.gift).

Single-process tests drive the hooks with a stand-in bucket (no process group: a world of one); the
slow test runs real 2-process gloo DDP with every hook.
"""

from __future__ import annotations

import math
import re
import os

import pytest
import torch
from torch import nn

from lab import LabError
from lab.training import GiftError, HookError, TrainingError
from lab.training.comm import (
    HOOKS,
    CodecHookState,
    CommHookState,
    ErrorFeedback,
    ErrorFeedbackState,
    GiftHookState,
    MeasureErrorState,
    KroneckerWhitening,
    LayerSelector,
    Whitening,
    codec_hook,
    error_feedback_wrapper,
    get_codec,
    get_hook,
)
from lab.training.comm.gift import euclidean_roundtrip, gift_roundtrip, relative_error, saturation_rates
from lab.training.comm.hooks import bucket_layout
from lab.training.comm.hooks.base import FlatBucket
from tests.gloo_support import run_ranks


FakeBucket = FlatBucket  # the hooks called outside DDP


def spd(d, cond, seed=0, rotate=True):
    """A (d, d) float64 SPD matrix with eigenvalues logspace(0, -log10(cond)) and a random (or identity) basis."""
    gen = torch.Generator().manual_seed(seed)
    lam = torch.logspace(0, -math.log10(cond), d, dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=gen))[0] if rotate else torch.eye(d, dtype=torch.float64)
    return (q * lam) @ q.T, q, lam


def eig_power(a, p):
    lam, v = torch.linalg.eigh(a)
    return (v * lam.pow(p)) @ v.T


# -- the transform -----------------------------------------------------------------------------------


def test_full_rank_whitening_is_the_exact_inverse_square_root_pair():
    a, _, _ = spd(12, 1e3)
    w = Whitening.from_covariance(a, rank=12, damping=0.0)
    assert w.rank == 12 and w.dim == 12
    eye = torch.eye(12, dtype=torch.float64)
    assert torch.allclose(w.matrix(-0.5) @ w.matrix(0.5), eye, atol=1e-5)
    assert torch.allclose(w.matrix(0.5) @ w.matrix(0.5), a, rtol=0, atol=1e-6)
    assert torch.allclose(w.matrix(-0.5), eig_power(a, -0.5), rtol=1e-4, atol=1e-4)
    g = torch.randn(5, 12)
    assert torch.allclose(w.unwhiten(w.whiten(g)), g, rtol=0, atol=1e-4)
    assert torch.allclose(w.whiten(g).double(), g.double() @ eig_power(a, -0.5), rtol=1e-4, atol=1e-3)


def test_kronecker_whitening_is_the_two_sided_transform_by_hand():
    """B^{-1/2} G A^{-1/2} and back (paper Eq. 14-17, symmetric roots), and the left-hand EF rebase."""
    a, _, _ = spd(6, 1e3, seed=1)
    b, _, _ = spd(4, 1e2, seed=2)
    b2, _, _ = spd(4, 1e4, seed=3)
    wa, wb, wb2 = (Whitening.from_covariance(m, rank=m.shape[0], damping=0.0) for m in (a, b, b2))
    k = KroneckerWhitening(wa, wb)
    assert k.dim == 6 and k.rank == 6 and k.condition_number == pytest.approx(wa.condition_number * wb.condition_number)
    g = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    u = k.whiten(g)
    assert torch.allclose(u.double(), eig_power(b, -0.5) @ g.double() @ eig_power(a, -0.5), rtol=1e-4, atol=1e-3)
    assert torch.allclose(k.unwhiten(u), g, rtol=0, atol=1e-4)
    r = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    moved = KroneckerWhitening(wa, wb2).rebase_output(r, wb)  # keeps B^{1/2} R: B2^{1/2} moved == B^{1/2} r
    assert torch.allclose((eig_power(b2, 0.5) @ moved.double()), eig_power(b, 0.5) @ r.double(), rtol=1e-4, atol=1e-3)
    assert torch.allclose(k.rebase_output(r, None).double(), eig_power(b, -0.5) @ r.double(), rtol=1e-4, atol=1e-3)
    with pytest.raises(GiftError, match="output-side whitening of dim 4"):
        k.whiten(torch.randn(5, 6))
    with pytest.raises(GiftError, match="two Whitening factors"):
        KroneckerWhitening(wa, None)


def test_low_rank_plus_scalar_residual_by_hand():
    # A = Q diag(8, 4, 2, 1, 1, 0.5) Q^T, no damping, keep r = 2: the complement gets c = mean(2, 1, 1, 0.5) = 1.125
    lam = torch.tensor([8.0, 4.0, 2.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))[0]
    a = (q * lam) @ q.T
    w = Whitening.from_covariance(a, rank=2, damping=0.0)
    assert w.rank == 2 and w.residual == pytest.approx(1.125)
    assert torch.allclose(w.eigenvalues.double(), lam[:2], rtol=1e-6)
    for p in (-0.5, 0.5, 1.0):
        approx = torch.tensor([8.0**p, 4.0**p] + [1.125**p] * 4, dtype=torch.float64)
        expected = (q * approx) @ q.T  # the same eigenvectors, the tail replaced by c^p
        assert torch.allclose(w.matrix(p), expected, atol=1e-5), p
        g = torch.randn(3, 6)  # k = 2 <= d / 2: apply() uses the low-rank form c^p g + ((g U) (lam^p - c^p)) U^T
        assert torch.allclose(w.apply(g, p).double(), g.double() @ expected, atol=1e-5), p
    # the approximate A^{-1/2} and A^{1/2} share the basis: exact inverses for r < d too
    assert torch.allclose(w.matrix(-0.5) @ w.matrix(0.5), torch.eye(6, dtype=torch.float64), atol=1e-6)
    # keeping every eigenpair gives the exact powers; the truncation error is on the tail only
    assert torch.allclose(Whitening.from_covariance(a, rank=6, damping=0.0).matrix(0.5), eig_power(a, 0.5), atol=1e-5)
    tail = q[:, 2:]
    assert torch.allclose(tail.T @ w.matrix(1.0) @ tail, 1.125 * torch.eye(4, dtype=torch.float64), atol=1e-5)


def test_damping_and_diag_residual():
    a = torch.diag(torch.tensor([1.0, 0.0], dtype=torch.float64))
    w = Whitening.from_covariance(a, rank=2, damping=0.1)  # + 0.1 * mean(diag) = 0.05
    assert torch.allclose(w.matrix(1.0), torch.diag(torch.tensor([1.05, 0.05], dtype=torch.float64)), atol=1e-6)
    # the artifact's variant: A_hat = U diag(lam) U^T + diag(max(diag(A_d - low rank), floor)), exact powers of A_hat
    a, _, _ = spd(8, 1e2, seed=1)
    w = Whitening.from_covariance(a, rank=3, damping=1e-3, residual="diag")
    ad = a + 1e-3 * a.diagonal().mean() * torch.eye(8, dtype=torch.float64)
    lam, v = torch.linalg.eigh(ad)
    low = (v[:, -3:] * lam[-3:]) @ v[:, -3:].T
    a_hat = low + torch.diag((ad.diagonal() - low.diagonal()).clamp_min(1e-3 * a.diagonal().mean()))
    assert w.rank == 8
    assert torch.allclose(w.matrix(1.0), a_hat, atol=1e-6)
    assert torch.allclose(w.matrix(-0.5), eig_power(a_hat, -0.5), rtol=1e-4, atol=1e-4)


def test_whitening_edges_and_errors():
    w = Whitening.from_covariance(torch.zeros(4, 4))  # no inputs seen: identity
    g = torch.randn(2, 4)
    assert w.rank == 0 and torch.equal(w.whiten(g), g) and torch.equal(w.unwhiten(g), g)
    flat = Whitening.from_covariance(spd(5, 10)[0], rank=2).to_flat()
    back = Whitening.from_flat(flat, 5, 2)
    assert flat.numel() == back.flat_numel == 5 * 2 + 2 + 1 and torch.equal(back.to_flat(), flat)
    for bad in (torch.zeros(3, 4), torch.zeros(3), torch.full((2, 2), math.nan)):
        with pytest.raises(GiftError):
            Whitening.from_covariance(bad)
    for kw in ({"rank": 0}, {"rank": 2.0}, {"damping": -1.0}, {"residual": "block"}):
        with pytest.raises(GiftError):
            Whitening.from_covariance(torch.eye(3), **kw)
    with pytest.raises(GiftError, match="dim 5"):
        back.whiten(torch.zeros(2, 4))
    assert issubclass(GiftError, HookError) and issubclass(HookError, TrainingError) and issubclass(HookError, LabError)


FORMATS = ["fp8_e4m3", "fp8_e5m2", "nvfp4"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_whitening_gains_nothing_when_the_whitened_gradient_is_isotropic(fmt):
    """G = Z A^{1/2} with i.i.d. Z (cond(A) = 1e5): G A^{-1/2} = Z is isotropic, FP8's rounding error is
    isotropic too, and mapping back with A^{1/2} scales error and signal alike: no gain (measured ~1.1x
    with the damping). A >= 2x gain on this gradient is not achievable; see the next test."""
    a, _, _ = spd(256, 1e5)
    z = torch.randn(64, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    g = (z @ eig_power(a, 0.5)).float()
    codec, w = get_codec(fmt), Whitening.from_covariance(a, rank=256, damping=1e-3)
    ratio = relative_error(euclidean_roundtrip(codec, g), g) / relative_error(gift_roundtrip(codec, g, w), g)
    assert 0.8 < ratio < 1.4


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rank", [32, 256])
def test_gift_whitening_cuts_low_precision_error_at_least_2x_on_an_anisotropic_layer_gradient(fmt, rank):
    """A linear layer's gradient from n = 32 inputs of dimension 256 with covariance cond 1e5 (rotated):
    G = delta^T X, X = W A^{1/2}; A estimated from the same inputs (what the hook sees when it refreshes
    at that step). G's rows lie in the inputs' span, so whitening concentrates them and A^{1/2} shrinks
    the rounding error off that span. Error measured in ORIGINAL coordinates, same format both ways."""
    gen = torch.Generator().manual_seed(2)
    a, _, _ = spd(256, 1e5)
    x = torch.randn(32, 256, dtype=torch.float64, generator=gen) @ eig_power(a, 0.5)
    g = (torch.randn(32, 64, dtype=torch.float64, generator=gen).T @ x).float()
    codec = get_codec(fmt)
    w = Whitening.from_covariance(x.T @ x / 32, rank=rank, damping=1e-3)
    euclid = relative_error(euclidean_roundtrip(codec, g), g)
    gift = relative_error(gift_roundtrip(codec, g, w), g)
    assert euclid / gift >= 2.0, (euclid, gift)
    # the error FP8 makes in Euclidean coordinates is the format's (e4m3 ~2.7%, e5m2 ~5.3%, nvfp4 ~9.5%)
    assert {"fp8_e4m3": 0.02, "fp8_e5m2": 0.04, "nvfp4": 0.07}[fmt] < euclid < {"fp8_e4m3": 0.035, "fp8_e5m2": 0.065, "nvfp4": 0.12}[fmt]


# -- error feedback ----------------------------------------------------------------------------------


def test_error_feedback_carries_the_quantization_residual_exactly():
    codec, ef = get_codec("fp8_e4m3"), ErrorFeedback()
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(50, generator=gen) * 10.0 ** torch.randn(50, generator=gen) for _ in range(6)]
    sent, total_g, bound = torch.zeros(50, dtype=torch.float64), torch.zeros(50, dtype=torch.float64), torch.zeros(50)
    for g in grads:
        prev = ef.residuals.get("w", torch.zeros(50))
        x = ef.compensate("w", g)
        assert torch.equal(x, g + prev)
        q = codec.decode(codec.encode(x), 50)
        ef.update("w", x, q)
        assert torch.equal(ef.residuals["w"], x - q)  # exactly what the codec dropped
        sent += q.double()
        total_g += g.double()
        bound += x.abs() * 2.0**-23  # float32 rounding of g + r and of x - q: half an ulp each
    # telescoping: everything sent plus the residual still held is everything computed
    assert bool(((sent + ef.residuals["w"].double() - total_g).abs() <= bound.double()).all())


def _linear_with_grad(out_f=6, in_f=5, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f)
    lin.weight.grad = torch.randn(out_f, in_f) * torch.logspace(0, -3, in_f)
    lin.bias.grad = torch.randn(out_f)
    return lin


def test_fp8_hook_sends_codec_bytes_and_returns_the_decoded_average():
    lin = _linear_with_grad()
    params = list(lin.parameters())
    for name, codec in (("fp8", get_codec("fp8_e4m3")), ("nvfp4", get_codec("nvfp4"))):
        state, hook = get_hook(name, model=lin, measure_error=True)
        bucket = FakeBucket(params)
        out = hook(state, bucket).wait()
        expected = torch.cat([codec.decode(codec.encode(p.grad), p.numel()) for p in params])
        assert out.dtype == bucket.buffer().dtype and torch.equal(out, expected)
        rec = state.history[-1]
        assert rec.payload_bytes == sum(codec.nbytes(p.numel()) for p in params) and rec.extra_bytes == 0
        assert rec.fp32_bytes == 4 * sum(p.numel() for p in params) and rec.buckets == 1 and state.step == 1
        assert rec.rel_error == pytest.approx(relative_error(expected, bucket.buffer()), rel=1e-6)
        assert set(rec.per_param) == {"weight", "bias"}


def test_fp8_ef_hook_feeds_back_the_residual():
    lin = _linear_with_grad()
    state, hook = get_hook("fp8_ef", fmt="e5m2", model=lin)
    codec = get_codec("fp8_e5m2")
    g = lin.weight.grad.reshape(-1).clone()
    first = hook(state, FakeBucket([lin.weight])).wait()
    r1 = state.error_feedback.residuals["weight"]
    assert torch.equal(first, codec.decode(codec.encode(g), g.numel())) and torch.equal(r1, g - first)
    second = hook(state, FakeBucket([lin.weight])).wait()
    assert torch.equal(second, codec.decode(codec.encode(g + r1), g.numel()))
    assert torch.allclose(first + second + state.error_feedback.residuals["weight"], 2 * g, atol=1e-6)


def _ef_model_steps(steps=6):
    """A small MLP and, per step, its gradients (fixed seed): the input of the wrapper tests."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(8, 16, generator=gen) * torch.logspace(0, -2, 16) for _ in range(steps)]
    return model, xs


def _run_buckets(model, state, hook, xs):
    """Every step through the hook as two buckets (first two parameters, then the rest); the outputs."""
    outs = []
    for x in xs:
        model.zero_grad()
        model(x).pow(2).sum().backward()
        ps = list(model.parameters())
        outs.append(hook(state, FakeBucket(ps[:2], 0, False)).wait())
        outs.append(hook(state, FakeBucket(ps[2:], 1, True)).wait())
    return outs


@pytest.mark.parametrize("name, kw, codec_name", [("fp8_ef", {"fmt": "e5m2"}, "fp8_e5m2"),
                                                   ("nvfp4", {"error_feedback": True}, "nvfp4")])
def test_error_feedback_wrapper_sends_q_of_g_plus_the_carried_residual(name, kw, codec_name):
    model, xs = _ef_model_steps()
    state, hook = get_hook(name, model=model, measure_error=True, **kw)
    assert isinstance(state, MeasureErrorState) and isinstance(state.inner, ErrorFeedbackState)
    assert hook.__name__ == "measure_error_error_feedback_codec_hook"
    outs = _run_buckets(model, state, hook, xs)
    # by hand: x = g + r, q = Q(x), r <- x - q per parameter; a world of one returns q
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    codec, r, carried = get_codec(codec_name), {}, 0
    for t, x in enumerate(xs):
        ref.zero_grad()
        ref(x).pow(2).sum().backward()
        ps = list(ref.parameters())
        err_sq = sent_sq = ref_sq = 0.0
        for b, group in enumerate((ps[:2], ps[2:])):
            expected = []
            for p in group:
                g = p.grad.reshape(-1)
                xk = g + r[id(p)] if id(p) in r else g
                q = codec.decode(codec.encode(xk), g.numel())
                one = codec.decode(codec.encode(g), g.numel())
                carried += int(not torch.equal(q, one))
                r[id(p)] = xk - q
                expected.append(q)
                err_sq += float(((one - g).double() ** 2).sum())
                sent_sq += float(((q - g).double() ** 2).sum())
                ref_sq += float((g.double() ** 2).sum())
            assert torch.equal(outs[2 * t + b], torch.cat(expected)), (t, b)
        rec = state.history[t]  # measured against the uncompensated gradient (the wrapper is outside the EF)
        assert rec.rel_error == pytest.approx(math.sqrt(err_sq / ref_sq), rel=1e-9)
        assert rec.sent_rel_error == pytest.approx(math.sqrt(sent_sq / ref_sq), rel=1e-9)
    assert carried > 0  # the residual changed what was sent (a wrapper that drops it fails the equality above)
    names = dict(zip((id(p) for p in ref.parameters()), (n for n, _ in model.named_parameters())))
    for pid, res in r.items():
        assert torch.equal(state.error_feedback.residuals[names[pid]], res)


def test_wrapped_hooks_are_bit_identical_to_the_flag_path_gift_keeps():
    """GIFT with no layer selected sends every parameter Euclidean through its own flag path
    (``euclidean_error_feedback``, ``measure_error``): the wrapped codec hook gives the same bits."""
    model, xs = _ef_model_steps()
    state, hook = get_hook("fp8_ef", model=model, measure_error=True)
    wrapped = _run_buckets(model, state, hook, xs)
    model2, _ = _ef_model_steps()
    gstate, ghook = get_hook("gift_fp8", model=model2, layers=[], reselect_every=None, euclidean_error_feedback=True,
                             measure_error=True)
    flagged = _run_buckets(model2, gstate, ghook, xs)
    assert all(torch.equal(a, b) for a, b in zip(wrapped, flagged))
    for a, b in zip(state.history, gstate.history):
        assert (a.err_sq, a.sent_err_sq, a.euclid_err_sq, a.ref_sq) == (b.err_sq, b.sent_err_sq, b.euclid_err_sq, b.ref_sq)
        assert a.payload_bytes == b.payload_bytes and a.err_sq > 0
    assert all(a.sent_err_sq != a.err_sq for a in list(state.history)[1:])  # the residual is in what was sent
    for n, res in state.error_feedback.residuals.items():
        assert torch.equal(res, gstate.error_feedback.residuals[n])
    assert state.summary()["steps"] == len(xs)  # accounting read through the wrapper states


def test_wrappers_refuse_gift_a_wrong_state_and_a_non_float32_bucket():
    model = Tiny()
    gstate, _ = get_hook("gift_fp8", model=model)
    with pytest.raises(HookError, match="cannot wrap GIFT"):
        ErrorFeedbackState(gstate)
    with pytest.raises(HookError, match="CodecHookState"):
        MeasureErrorState(CommHookState())
    lin = _linear_with_grad()
    with pytest.raises(HookError, match="ErrorFeedbackState"):
        error_feedback_wrapper(codec_hook)(CodecHookState("fp8_e4m3"), FakeBucket([lin.weight]))
    state = ErrorFeedbackState(CodecHookState("fp8_e4m3"))
    with pytest.raises(HookError, match="float32"):
        error_feedback_wrapper(codec_hook)(state, FakeBucket([lin.weight], grads=[lin.weight.grad.to(torch.bfloat16)]))
    with pytest.raises(HookError, match="unexpected keyword"):
        get_hook("fp8", error_feedback=True)  # "fp8_ef" is that


def test_fp32_hook_and_bucket_layout():
    lin = _linear_with_grad()
    state, hook = get_hook("fp32")
    bucket = FakeBucket(list(lin.parameters()))
    before = bucket.buffer().clone()
    assert torch.equal(hook(state, bucket).wait(), before)
    assert state.history[-1].payload_bytes == 4 * before.numel()
    layout = bucket_layout(bucket)
    assert [(off, n) for _, off, n, _ in layout] == [(0, 30), (30, 6)]


def test_registry_errors():
    assert set(HOOKS) == {"fp32", "bf16", "fp8", "fp8_ef", "nvfp4", "gift_fp8", "gift_nvfp4"}
    with pytest.raises(HookError, match="unknown hook"):
        get_hook("powersgd")
    with pytest.raises(GiftError, match="model"):
        get_hook("gift_fp8")
    with pytest.raises(HookError, match="unexpected keyword"):
        get_hook("fp8", bogus=1)
    with pytest.raises(HookError, match="fp32"):
        CodecHookState("fp32")
    with pytest.raises(GiftError, match="no candidate"):
        get_hook("gift_fp8", model=nn.Conv1d(2, 2, 1))
    with pytest.raises(GiftError, match="not candidate"):
        get_hook("gift_fp8", model=nn.Linear(2, 2), layers=["fc9"])
    with pytest.raises(GiftError, match="track"):
        get_hook("gift_fp8", model=nn.Linear(2, 2), select_by="gain", track="selected")
    for kw in ({"n_eigenpairs": 0}, {"ema": 1.0}, {"refresh_every": 0}, {"select_k": 0}, {"select_by": "random"}, {"select_warmup": 0}):
        with pytest.raises(GiftError):
            get_hook("gift_fp8", model=nn.Linear(2, 2), **kw)
    with pytest.raises(GiftError, match="statistics must be 'all_reduce' or 'rank0', got 'mean'"):
        get_hook("gift_fp8", model=nn.Linear(2, 2), statistics="mean")
    with pytest.raises(GiftError, match="needs broadcast_factors=True"):
        get_hook("gift_fp8", model=nn.Linear(2, 2), statistics="rank0", broadcast_factors=False)


# -- selection ---------------------------------------------------------------------------------------


def test_saturation_rates_by_hand():
    x = torch.tensor([448.0, 1e-9, 0.0, 1.0])  # e4m3, amax 448 -> scale 1: 448 is at the top, 1e-9 flushes to 0
    codec = get_codec("fp8_e4m3")
    assert saturation_rates(codec, codec.encode(x), x) == (0.25, 0.25)
    x = torch.tensor([6.0, 5.9, 1e-12, 0.0] + [1.0] * 12)  # nvfp4: 6 and 5.9 round to the code 6
    codec = get_codec("nvfp4")
    up, low = saturation_rates(codec, codec.encode(x), x)
    assert up == pytest.approx(2 / 16) and low == pytest.approx(1 / 16)


def test_layer_selector_scores_and_schedule():
    sel = LayerSelector(["a", "b", "c"], select_by="saturation", k=1, warmup=2, every=3)
    assert [s for s in range(12) if sel.due(s)] == [2, 5, 8, 11]
    sel.observe("a", upper=0.1, lower=0.0, euclid_err=0.03)
    sel.observe("b", upper=0.2, lower=0.1, euclid_err=0.02)
    sel.observe("b", upper=0.0, lower=0.1, euclid_err=0.02)  # mean 0.1 + 0.1
    assert sel.select(2) == ("b",)  # c unobserved: never selected
    assert sel.history[-1]["scores"] == {"a": pytest.approx(0.1), "b": pytest.approx(0.2), "c": None}
    assert float(sel.window.abs().sum()) == 0.0
    gain = LayerSelector(["a", "b", "c"], select_by="gain", threshold=1.5, warmup=1, every=None)
    gain.observe("a", euclid_err=0.03, gift_err=0.01)
    gain.observe("b", euclid_err=0.03, gift_err=0.03)
    gain.observe("c", euclid_err=0.03, gift_err=0.015)
    assert gain.select(1) == ("a", "c") and not gain.collecting(1) and gain.collecting(0)
    top = LayerSelector(["a", "b"], select_by="gain", k=2, warmup=1)
    top.observe("a", euclid_err=0.03, gift_err=0.02)
    top.observe("b", euclid_err=0.03, gift_err=0.04)  # GIFT worse: never selected, even with room in the top k
    assert top.select(1) == ("a",) and top.history[-1]["scores"]["b"] == pytest.approx(0.75)
    err = LayerSelector(["a", "b"], select_by="error", k=0.5, warmup=1)
    err.observe("a", euclid_err=0.02)
    err.observe("b", euclid_err=0.02)
    assert err.select(1) == ("a",)  # tie: the earlier candidate
    fixed = LayerSelector(["a", "b"], initial=["b"], warmup=None, every=4)
    assert fixed.selected == ("b",) and [s for s in range(9) if fixed.due(s)] == [4, 8]


# -- GIFT state, single process ---------------------------------------------------------------------


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("ema_per, old_weight", [("refresh", 0.5), ("step", 0.25)])
def test_gift_state_tracks_the_input_covariance_with_ema_and_refresh_period(ema_per, old_weight):
    model = Tiny()
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], refresh_every=2, ema=0.5, ema_per=ema_per, n_eigenpairs=4,
                           damping=0.0, reselect_every=None, collect="refresh", bias=False)
    assert state.layers == ("fc1", "fc2") and state.selected == ("fc1",)
    xs = [torch.randn(5, 4) for _ in range(3)]
    for step, x in enumerate(xs):
        with torch.no_grad():  # evaluation passes never count
            model(torch.randn(7, 4) * 100)
        model.zero_grad()
        model(x).sum().backward()
        assert state.tracker.count("fc1") == (5 if step % 2 == 0 else 0)  # collected on refresh steps only
        hook(state, FakeBucket(list(model.parameters()))).wait()
    a0, a2 = xs[0].double().T @ xs[0].double() / 5, xs[2].double().T @ xs[2].double() / 5
    expected = old_weight * a0 + (1 - old_weight) * a2  # b = ema per refresh, or ema ** 2 (two steps elapsed)
    assert state.refreshes == 2 and state.step == 3
    assert torch.allclose(state._cov["fc1"], expected, atol=1e-5)
    assert torch.allclose(state.whitening["fc1"].matrix(1.0), expected, atol=1e-4)
    state.close()
    model(torch.randn(2, 4)).sum().backward()
    assert state.tracker.count("fc1") == 0  # hooks removed


def test_gift_collects_every_forward_between_refreshes_by_default():
    model = Tiny()
    state, hook = get_hook("gift_fp8", model=model, layers=["fc2"], refresh_every=3, ema=0.0, damping=0.0,
                           reselect_every=None, bias=False)
    xs = [torch.randn(4 + t, 4) for t in range(4)]
    for x in xs:
        model.zero_grad()
        model(x).sum().backward()
        hook(state, FakeBucket(list(model.parameters()))).wait()
    h = [torch.relu(model.fc1(x)).detach().double() for x in xs[1:]]  # fc2's inputs at steps 1..3 (fc1 unchanged)
    expected = sum(a.T @ a for a in h) / sum(a.shape[0] for a in h)
    assert state.refreshes == 2 and torch.allclose(state._cov["fc2"], expected, atol=1e-5)


def test_refresh_warmup_refreshes_every_step_first():
    model = Tiny()
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], refresh_every=5, refresh_warmup=3, ema=0.0,
                           reselect_every=None)
    refreshed = []
    for _ in range(7):
        model.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        before = state.refreshes
        hook(state, FakeBucket(list(model.parameters()))).wait()
        refreshed.append(state.refreshes > before)
    assert refreshed == [True, True, True, False, False, True, False]  # steps 0, 1, 2 (warm-up), then 5
    with pytest.raises(GiftError, match="refresh_warmup must be an int >= 0"):
        get_hook("gift_fp8", model=model, refresh_warmup=-1)


def test_gift_hook_sends_whitened_selected_weights_with_error_feedback():
    model = Tiny()
    x = torch.randn(6, 4) @ torch.diag(torch.tensor([10.0, 1.0, 0.1, 0.01]))
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=4, measure_error=True, reselect_every=None,
                           bias=False, output_side=False)
    model(x).sum().backward()  # the forward hooks collect A (step 0 is a refresh step)
    codec = get_codec("fp8_e4m3")
    params = list(model.parameters())
    bucket = FakeBucket(params)
    grads = [p.grad.clone() for p in params]
    out = hook(state, bucket).wait()
    w = state.whitening["fc1"]
    u = w.whiten(grads[0])
    dec = codec.decode(codec.encode(u), u.numel()).view(u.shape)
    assert torch.equal(out[:32], w.unwhiten(dec).reshape(-1))  # fc1.weight: GIFT
    assert torch.equal(state.gift_error_feedback.residuals["fc1"], u - dec)  # EF in whitened coordinates
    for (start, stop), g in zip([(32, 40), (40, 64), (64, 67)], grads[1:]):  # the rest: Euclidean, no EF
        assert torch.equal(out[start:stop], codec.decode(codec.encode(g), g.numel()))
    rec = state.history[-1]
    assert rec.payload_bytes == sum(codec.nbytes(p.numel()) for p in params)
    assert rec.per_param["fc1.weight"]["path"] == "gift" and rec.per_param["fc2.weight"]["path"] == "euclid"
    table = {r["layer"]: r for r in state.layer_table()}
    assert table["fc1"]["selected"] and not table["fc2"]["selected"]
    assert table["fc1"]["gift_rel_error"] is not None and table["fc2"]["gift_rel_error"] is not None
    # second step: the residual comes back in
    out2 = hook(state, FakeBucket(params, grads=grads)).wait()
    x2 = u + (u - dec)
    dec2 = codec.decode(codec.encode(x2), u.numel()).view(u.shape)
    assert torch.equal(out2[:32], w.unwhiten(dec2).reshape(-1))


def test_output_side_factor_is_refreshed_per_bucket_with_the_steps_own_backward():
    """output_side: B = E[dy dy^T] of fc1's output gradient, refreshed as fc1's bucket is encoded (the
    step's backward is in), and fc1's [G | b] travels as Q(B^{-1/2} [G | b] A^{-1/2}) with EF there."""
    model = Tiny()
    dys = []
    model.fc1.register_forward_hook(lambda m, i, o: (o.register_hook(lambda g: dys.append(g.detach().double())), None)[1])
    x = torch.randn(6, 4) @ torch.diag(torch.tensor([10.0, 1.0, 0.1, 0.01]))
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=9, damping=0.0, measure_error=True,
                           reselect_every=None)
    assert state.output_side == ("fc1", "fc2") and state.out_tracker.dims == {"fc1": 8, "fc2": 3}
    model(x).sum().backward()
    params = list(model.parameters())
    grads = [p.grad.clone() for p in params]
    out_b0 = hook(state, FakeBucket(params[2:], index=0, last=False)).wait()  # fc2 first, as DDP orders buckets
    assert set(state.out_whitening) == {"fc2"} and set(state.whitening) == {"fc1", "fc2"}
    out = hook(state, FakeBucket(params[:2], index=1, last=True)).wait()
    assert set(state.out_whitening) == {"fc1", "fc2"} and state.refreshes == 1
    assert torch.allclose(state._out_cov["fc1"], dys[0].T @ dys[0] / 6, atol=1e-5)
    codec, k = get_codec("fp8_e4m3"), state.transform("fc1")
    assert isinstance(k, KroneckerWhitening) and k.output is state.out_whitening["fc1"]
    _assert_fc1_sent_jointly(state, k, grads, out)
    assert torch.equal(out_b0[:24], codec.decode(codec.encode(grads[2]), 24))  # fc2 not selected: Euclidean
    # a state with output-side factors is refused by a hook without them, before anything loads
    plain, _ = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=9, reselect_every=None, output_side=False)
    with pytest.raises(HookError, match="'fc2' has a \\(3, 3\\) output-side covariance, this hook's is absent"):
        plain.load_state_dict(state.state_dict())
    assert plain.step == 0 and plain._out_cov == {}
    state.close()


class TinyLM(nn.Module):
    """Two embeddings summed into one stream (like the GPT), then a linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.tok_emb, self.pos_emb, self.head = nn.Embedding(7, 4), nn.Embedding(3, 4), nn.Linear(4, 7, bias=False)

    def embedding_layers(self):
        return {"tok_emb": (self.tok_emb, self.tok_emb), "pos_emb": (self.pos_emb, self.tok_emb)}

    def forward(self, idx):
        return self.head(self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1])))


def test_embedding_factor_is_collected_in_the_backward():
    """A take() between forward and backward (where DDP's hook refreshes) has the inputs, not the stream gradient."""
    from lab.training.comm.gift import CovarianceTracker

    model = TinyLM()
    tr = CovarianceTracker({"head": [model.head]}, lambda _n: True,
                           {n: (src, m.embedding_dim) for n, (m, src) in model.embedding_layers().items()})
    idx = torch.randint(0, 7, (2, 3), generator=torch.Generator().manual_seed(1))
    out = model(idx)
    assert tr.count("head") == 6 and tr.count("tok_emb") == 0 and tr.count("pos_emb") == 0
    tr.take(["head", "tok_emb", "pos_emb"])
    gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(gy)
    stream = (gy @ model.head.weight).detach().reshape(-1, 4)  # dL/dx for x = tok_emb(idx) + pos_emb(pos)
    sums = tr.unpack(tr.take(["tok_emb", "pos_emb"]), ["tok_emb", "pos_emb"])
    for name in ("tok_emb", "pos_emb"):
        s, n = sums[name]
        assert n == 6 and torch.allclose(s, stream.T @ stream, atol=1e-6)
    with torch.no_grad():
        model(idx)  # evaluation passes never count
    assert tr.count("tok_emb") == 0
    tr.close()


def test_every_output_side_factor_is_complete_before_its_weight_gradient_is():
    """DDP hands a bucket to the hook once its gradients are accumulated: by then the backward hooks
    must have collected the output-gradient rows of every layer in it (the GPT's embeddings read the
    stream's gradient, which precedes both embedding backwards; tok_emb's own output gradient can come
    after pos_emb's backward)."""
    from lab.training.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=40, n_layer=2, d_model=8, n_head=2, block_size=8))
    state, _ = get_hook("gift_fp8", model=model, output_side_max=32)
    assert len(state.output_side) == 8 and "head" not in state.output_side  # the head's 40 outputs > 32
    assert set(state.out_tracker.dims) == {*state.output_side, "tok_emb", "pos_emb"}
    seen = {}
    for name in state.out_tracker.dims:
        weight = state._layer_param[name] if name in state._layer_param else getattr(model, name).weight
        weight.register_post_accumulate_grad_hook(
            lambda p, name=name: (seen.setdefault(name, state.out_tracker.count(name)), None)[1])
    idx = torch.randint(0, 40, (3, 8), generator=torch.Generator().manual_seed(0))
    model(idx, idx)[1].backward()
    assert seen == dict.fromkeys(state.out_tracker.dims, 24)  # 3 x 8 rows each, all in before the weight's gradient
    state.close()


def test_gift_hook_whitens_embeddings_with_the_stream_gradient_factor():
    model = TinyLM()
    state, hook = get_hook("gift_fp8", model=model, layers=["tok_emb", "pos_emb"], refresh_every=2, ema=0.0,
                           damping=0.0, n_eigenpairs=4, reselect_every=None, measure_error=True)
    assert state.layers == ("head", "tok_emb", "pos_emb") and state.embeddings == ("tok_emb", "pos_emb")
    assert get_hook("gift_fp8", model=model, embeddings=False)[0].layers == ("head",)
    gen = torch.Generator().manual_seed(0)
    streams = []
    for t in range(3):
        model.zero_grad()
        idx = torch.randint(0, 7, (2 + t, 3), generator=gen)
        out = model(idx)
        gy = torch.randn(out.shape, generator=gen)
        streams.append((gy @ model.head.weight).detach().reshape(-1, 4).double())
        out.backward(gy)
        hook(state, FakeBucket(list(model.parameters()))).wait()  # after the backward, unlike DDP
    expected = sum(g.T @ g for g in streams[1:]) / sum(g.shape[0] for g in streams[1:])  # the refresh at step 2
    assert state.refreshes == 2
    for name in ("tok_emb", "pos_emb"):
        assert torch.allclose(state._cov[name], expected, atol=1e-5)
    # a selected embedding sends Q(G S^{-1/2}) and is mapped back with S^{1/2}
    model.zero_grad()
    model(torch.randint(0, 7, (2, 3), generator=gen)).sum().backward()
    codec, params = get_codec("fp8_e4m3"), list(model.parameters())
    g_tok = params[0].grad.clone()
    state.gift_error_feedback.residuals.clear()
    out = hook(state, FakeBucket(params)).wait()
    w = state.whitening["tok_emb"]
    u = w.whiten(g_tok)
    assert torch.equal(out[: g_tok.numel()], w.unwhiten(codec.decode(codec.encode(u), u.numel()).view(u.shape)).reshape(-1))
    assert state.history[-1].per_param["tok_emb.weight"]["path"] == "gift"
    state.close()


def _assert_fc1_sent_jointly(state, transform, grads, out):
    """Tiny's fc1 [G | b] went out as Q(transform.whiten([G | b])) (weight and bias payloads, own scales),
    mapped back jointly, with the residual kept in the whitened coordinates."""
    codec = get_codec("fp8_e4m3")
    u = transform.whiten(torch.cat([grads[0], grads[1][:, None]], 1))
    dec = torch.cat([codec.decode(codec.encode(u[:, :4].contiguous()), 32).view(8, 4),
                     codec.decode(codec.encode(u[:, 4].contiguous()), 8).view(8, 1)], 1)
    back = transform.unwhiten(dec)
    assert torch.equal(out[:32], back[:, :4].reshape(-1)) and torch.equal(out[32:40], back[:, 4])
    assert torch.equal(state.gift_error_feedback.residuals["fc1"], u - dec)


def test_homogeneous_coordinate_factor_and_joint_weight_bias_encoding():
    """bias=True: A = [[E x x^T, E x], [E x^T, 1]] and [G | b] A^{-1/2} travels as the weight's and the
    bias's payloads (their own scales, the Euclidean sizes), mapped back jointly."""
    model = Tiny()
    x = torch.randn(6, 4) @ torch.diag(torch.tensor([10.0, 1.0, 0.1, 0.01])) + 3.0
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=5, damping=0.0, measure_error=True,
                           reselect_every=None, output_side=False)
    assert state.tracker.dims == {"fc1": 5, "fc2": 9}
    model(x).sum().backward()
    params = list(model.parameters())
    grads = [p.grad.clone() for p in params]
    out = hook(state, FakeBucket(params)).wait()
    xa = torch.cat([x, torch.ones(6, 1)], 1).double()
    assert torch.allclose(state._cov["fc1"], xa.T @ xa / 6, atol=1e-4)
    codec = get_codec("fp8_e4m3")
    _assert_fc1_sent_jointly(state, state.whitening["fc1"], grads, out)
    rec = state.history[-1]
    assert rec.payload_bytes == sum(codec.nbytes(p.numel()) for p in params)
    assert rec.per_param["fc1.bias"]["path"] == "gift" and rec.per_param["fc2.bias"]["path"] == "euclid"
    table = {r["layer"]: r for r in state.layer_table()}
    assert table["fc1"]["gain"] > 1.0  # inputs with a large mean: the constant column is far from isotropic


def test_weight_and_bias_in_different_buckets_go_euclidean_with_a_warning():
    model = Tiny()
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=4, reselect_every=None)
    model(torch.randn(5, 4)).sum().backward()
    params = list(model.parameters())
    codec = get_codec("fp8_e4m3")
    with pytest.warns(UserWarning, match="fc1's weight and bias are in different DDP buckets"):
        out = hook(state, FakeBucket(params[:1], index=0, last=False)).wait()
    assert torch.equal(out, codec.decode(codec.encode(params[0].grad), 32))
    out = hook(state, FakeBucket(params[1:], index=1, last=True)).wait()
    assert torch.equal(out[:8], codec.decode(codec.encode(params[1].grad), 8))


def test_frozen_bias_leaves_the_weight_whitened_alone():
    model = Tiny()
    model.fc1.bias.requires_grad_(False)
    state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=4, measure_error=True, reselect_every=None)
    assert state.tracker.dims["fc1"] == 4 and state.tracker.dims["fc2"] == 9
    model(torch.randn(5, 4)).sum().backward()
    params = [p for p in model.parameters() if p.requires_grad]
    import warnings as _w

    with _w.catch_warnings():
        _w.simplefilter("error")  # no "different DDP buckets" warning
        hook(state, FakeBucket(params)).wait()
    assert state.history[-1].per_param["fc1.weight"]["path"] == "gift"


def test_state_saved_with_other_factor_sizes_is_refused_before_anything_loads():
    model = Tiny()
    old, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=4, reselect_every=None, bias=False)
    for _ in range(2):
        model.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        hook(old, FakeBucket(list(model.parameters()))).wait()
    new, _ = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=4, reselect_every=None)
    with pytest.raises(HookError, match=r"'fc1' has a \(4, 4\) covariance, this hook's factor is \(5, 5\)"):
        new.load_state_dict(old.state_dict())
    assert new.step == 0 and new._cov == {} and new.whitening == {}  # nothing loaded
    lm = TinyLM()
    saved, _ = get_hook("gift_fp8", model=lm, embeddings=False)
    with pytest.raises(HookError, match="selection window of 1 layers, this hook has 3"):
        get_hook("gift_fp8", model=lm)[0].load_state_dict(saved.state_dict())


def test_covariance_tracker_rejects_a_name_in_both_mappings():
    from lab.training.comm.gift import CovarianceTracker

    model = TinyLM()
    with pytest.raises(GiftError, match="named twice"):
        CovarianceTracker({"head": [model.head]}, lambda _n: True, {"head": (model.tok_emb, 4)})


def test_gift_error_feedback_is_rebased_when_the_factors_change():
    """Sent (original coordinates) + the residual mapped back telescopes to the sum of the gradients,
    across refreshes of A, because R <- R A_old^{1/2} A_new^{-1/2} keeps R A^{1/2} unchanged."""
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(6, 4, generator=gen) * torch.tensor([10.0, 1.0, 0.1, 0.01]) * (1 + t) for t in range(5)]
    for bias, output_side in ((False, False), (True, False), (True, True)):  # bias: [G | b] as one (8, 5) matrix
        gaps = {}
        for rebase in (True, False):
            model = Tiny()
            state, hook = get_hook("gift_fp8", model=model, layers=["fc1"], n_eigenpairs=4, refresh_every=2, ema=0.0,
                                   rebase_error_feedback=rebase, reselect_every=None, bias=bias, output_side=output_side)
            sent, total = torch.zeros(8, 5, dtype=torch.float64), torch.zeros(8, 5, dtype=torch.float64)
            for x in xs:
                model.zero_grad()
                model(x).sum().backward()
                total += torch.cat([model.fc1.weight.grad, model.fc1.bias.grad[:, None]], 1).double()
                out = hook(state, FakeBucket(list(model.parameters()))).wait()
                sent += torch.cat([out[:32].view(8, 4), out[32:40, None]], 1).double()
            assert state.refreshes == 3
            held = state.transform("fc1").unwhiten(state.gift_error_feedback.residuals["fc1"]).double()
            if not bias:  # the bias went Euclidean without error feedback: compare the weight only
                sent, total = sent[:, :4], total[:, :4]
            gaps[rebase] = float((sent + held - total).norm() / total.norm())
        assert gaps[True] < 1e-5 < 1e-3 < gaps[False], (bias, output_side, gaps)


@pytest.mark.parametrize("name", ["fp8_ef", "gift_fp8"])
def test_hook_state_dict_resumes_bit_exactly(name):
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(6, 4, generator=gen) * torch.tensor([10.0, 1.0, 0.1, 0.01]) for _ in range(6)]
    kw = dict(select_warmup=2, reselect_every=2, refresh_every=3, n_eigenpairs=2) if name == "gift_fp8" else {}

    def run(model, state, hook, steps):
        outs = []
        for x in steps:
            model.zero_grad()
            model(x).sum().backward()
            outs.append(hook(state, FakeBucket(list(model.parameters()))).wait())
        return outs

    model = Tiny()
    state, hook = get_hook(name, model=model, **kw)
    straight = run(model, state, hook, xs)
    model = Tiny()
    state, hook = get_hook(name, model=model, **kw)
    first = run(model, state, hook, xs[:4])
    saved = state.state_dict()
    model = Tiny()  # a fresh process: same weights (the hooks never change them here)
    state, hook = get_hook(name, model=model, **kw)
    state.load_state_dict(saved)
    assert state.step == 4
    for a, b in zip(straight, first + run(model, state, hook, xs[4:])):
        assert torch.equal(a, b)
    with pytest.raises(HookError, match="lacks"):
        state.load_state_dict({})


def test_gift_automatic_selection_after_warmup():
    model = Tiny()
    state, hook = get_hook("gift_nvfp4", model=model, select_warmup=2, reselect_every=2, select_k=1,
                           select_by="error", refresh_every=1)
    for _ in range(5):
        model.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        hook(state, FakeBucket(list(model.parameters()))).wait()
    assert [h["step"] for h in state.selector.history] == [2, 4]
    assert all(len(h["selected"]) == 1 for h in state.selector.history)
    assert state.history[0].extra_bytes == 0  # world of one: no side collective


# -- real 2-process gloo DDP ------------------------------------------------------------------------

_STEPS, _B = 6, 8
_GIFT = dict(select_warmup=2, reselect_every=2, refresh_every=2, n_eigenpairs=4)
_RUNS = {  # name -> (hook, kwargs, DDP kwargs)
    "default": (None, {}, {}),
    "fp32": ("fp32", {}, {}),
    "fp8": ("fp8", {}, {}),
    "fp8_e5m2_b16": ("fp8", {"fmt": "e5m2", "block_size": 16}, {}),
    "fp8_ef": ("fp8_ef", {}, {}),
    "nvfp4": ("nvfp4", {}, {}),
    # error feedback and measurement as wrappers, compensating DDP's bucket in place (the gradients' own storage)
    "nvfp4_ef": ("nvfp4", {"error_feedback": True, "measure_error": True}, {"gradient_as_bucket_view": True}),
    "gift_fp8": ("gift_fp8", dict(_GIFT, measure_error=True), {}),
    "gift_fp8_views": ("gift_fp8", dict(_GIFT, fmt="e5m2", select_by="gain", euclidean_error_feedback=True),
                       {"gradient_as_bucket_view": True}),
    "gift_nvfp4": ("gift_nvfp4", dict(_GIFT, layers=["0", "4"], reselect_every=None), {}),
    "gift_fp8_rank0": ("gift_fp8", dict(_GIFT, statistics="rank0"), {}),
}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _data(world):
    gen = torch.Generator().manual_seed(1)
    mix = torch.randn(16, 16, generator=gen) * torch.logspace(0, -2, 16)  # anisotropic inputs
    return [(torch.randn(world * _B, 16, generator=gen) @ mix + 1.0, torch.randn(world * _B, 4, generator=gen))
            for _ in range(_STEPS)]


def _worker(rank: int, world: int, outdir: str) -> None:
    data = [(x[rank * _B : (rank + 1) * _B], y[rank * _B : (rank + 1) * _B]) for x, y in _data(world)]
    out = {}
    for run, (name, kw, ddp_kw) in _RUNS.items():
        model = _mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.002, **ddp_kw)  # several buckets
        state = None
        if name is not None:
            state, hook = get_hook(name, **({"model": model} if name.startswith("gift") else {}), **kw)
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in data:
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        out[run] = {
            "params": [p.detach().clone() for p in model.parameters()],
            "records": [r.as_dict() for r in state.history] if state is not None else None,
            "selections": [(h["step"], h["selected"]) for h in state.selector.history] if hasattr(state, "selector") else None,
            "layers": getattr(state, "layers", None),
            "whitening": {k: (w.dim, w.rank) for k, w in getattr(state, "whitening", {}).items()},
            "out_whitening": {k: (w.dim, w.rank) for k, w in getattr(state, "out_whitening", {}).items()},
            "layer_history": list(getattr(state, "layer_history", [])),
        }
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


@pytest.mark.slow  # ~10 s: two processes import torch and run 9 short DDP trainings
def test_two_process_gloo_ddp_every_hook_keeps_replicas_identical_and_accounts_bytes(tmp_path):
    world = 2
    run_ranks(_worker, world, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(world))
    params = list(_mlp().parameters())
    for run in _RUNS:
        for a, b in zip(r0[run]["params"], r1[run]["params"]):
            assert torch.equal(a, b), run  # replicas bit-identical
    for a, b in zip(r0["fp32"]["params"], r0["default"]["params"]):
        assert torch.equal(a, b)  # our fp32 hook == DDP's own allreduce, bit for bit
    for run in ("fp8", "fp8_e5m2_b16", "fp8_ef", "nvfp4", "nvfp4_ef", "gift_fp8", "gift_fp8_views", "gift_nvfp4",
                "gift_fp8_rank0"):
        drift = max(float((a - b).abs().max()) for a, b in zip(r0[run]["params"], r0["default"]["params"]))
        assert 0 < drift < 0.05, (run, drift)  # low precision changed something, and not much

    codecs = {"fp32": "fp32", "fp8": "fp8_e4m3", "fp8_e5m2_b16": "fp8_e5m2_b16", "fp8_ef": "fp8_e4m3", "nvfp4": "nvfp4",
              "nvfp4_ef": "nvfp4",
              "gift_fp8": "fp8_e4m3", "gift_fp8_views": "fp8_e5m2", "gift_nvfp4": "nvfp4", "gift_fp8_rank0": "fp8_e4m3"}
    for run, codec_name in codecs.items():
        codec = get_codec(codec_name)
        expected = sum(codec.nbytes(p.numel()) for p in params)
        for recs in (r0[run]["records"], r1[run]["records"]):
            assert [r["step"] for r in recs] == list(range(_STEPS))
            assert all(r["payload_bytes"] == expected for r in recs), run
            assert all(r["fp32_bytes"] == 4 * sum(p.numel() for p in params) for r in recs)
            assert max(r["buckets"] for r in recs) >= 2, run  # really several buckets (after DDP's rebuild)
            if not run.startswith("gift"):
                assert all(r["extra_bytes"] == 0 for r in recs)
            if run == "nvfp4_ef":  # measured, with the residual in what was sent from the second step on
                assert all(r["rel_error"] > 0 for r in recs)
                assert all(r["sent_rel_error"] != r["rel_error"] for r in recs[1:])

    # GIFT: side collectives counted exactly; the same selections on both ranks
    dims = {"0": 17, "2": 33, "4": 33}  # in_features + 1: each bias is whitened with its weight
    out_dims = {"0": 32, "2": 32, "4": 4}  # out_features: the output side's B (refreshed bucket by bucket)
    every = list(dims.values()) + list(out_dims.values())
    tri = sum(d * (d + 1) // 2 + 1 for d in every)  # upper triangles + row counts, float32
    factors = sum(d * min(4, d) + min(4, d) + 1 for d in every)  # rank 4 basis + eigenvalues + c, float32
    stats = 3 * len(LayerSelector.FIELDS)  # float64
    for run in ("gift_fp8", "gift_fp8_views"):
        assert r0[run]["selections"] == r1[run]["selections"]
        assert [s for s, _ in r0[run]["selections"]] == [2, 4]
        assert r0[run]["whitening"] == {k: (d, 4) for k, d in dims.items()}
        assert r0[run]["out_whitening"] == {k: (d, 4) for k, d in out_dims.items()}
        extra = [r["extra_bytes"] for r in r0[run]["records"]]
        assert extra == [4 * (tri + factors), 0, 4 * (tri + factors) + 8 * stats, 0, 4 * (tri + factors) + 8 * stats, 0]
    # statistics="rank0": no covariance all-reduce, a header of one float per factor, then rank 0's factors
    assert r0["gift_fp8_rank0"]["selections"] == r1["gift_fp8_rank0"]["selections"]
    assert r1["gift_fp8_rank0"]["whitening"] == r0["gift_fp8"]["whitening"]
    assert r1["gift_fp8_rank0"]["out_whitening"] == r0["gift_fp8"]["out_whitening"]
    for recs in (r0["gift_fp8_rank0"]["records"], r1["gift_fp8_rank0"]["records"]):
        head = 4 * (len(every) + factors)
        assert [r["extra_bytes"] for r in recs] == [head, 0, head + 8 * stats, 0, head + 8 * stats, 0]
    assert r0["gift_nvfp4"]["selections"] == []  # fixed set, never re-selected
    assert [r["extra_bytes"] for r in r0["gift_nvfp4"]["records"]][::2] == [4 * (tri + factors)] * 3
    # the per-layer picture: every candidate measured every step, GIFT path on the selected ones
    hist = r0["gift_fp8"]["layer_history"]
    assert len(hist) == 3 * _STEPS and all(h["euclid_rel_error"] > 0 for h in hist)
    assert all(h["gift_rel_error"] is not None for h in hist)
    chosen = {s: set(sel) for s, sel in r0["gift_fp8"]["selections"]}
    for h in hist:
        active = chosen[4] if h["step"] >= 4 else chosen[2] if h["step"] >= 2 else set()
        assert h["selected"] == (h["layer"] in active)


def _failing_worker(rank: int, world: int, outdir: str) -> None:
    """statistics="rank0": rank 0 fails to build a factor at step 2; every rank must raise, none may hang."""
    from lab.training.comm import gift as gift_mod

    model = _mlp()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.002)
    state, hook = get_hook("gift_fp8", model=model, **dict(_GIFT, statistics="rank0"))
    ddp.register_comm_hook(state, hook)
    if rank == 0:
        real = gift_mod.Whitening.from_covariance.__func__

        def flaky(cls, *a, **kw):
            if state.step == 2:
                raise GiftError("injected failure on rank 0")
            return real(cls, *a, **kw)

        gift_mod.Whitening.from_covariance = classmethod(flaky)
    message = "no error"
    try:
        for x, y in _data(world)[:4]:
            nn.functional.mse_loss(ddp(x[rank * _B : (rank + 1) * _B]), y[rank * _B : (rank + 1) * _B]).backward()
    except Exception as exc:  # noqa: BLE001 - the message is the result
        message = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(outdir, f"fail{rank}.txt"), "w") as fh:
        fh.write(f"{state.step}\n{message}")


@pytest.mark.slow  # ~5 s
def test_rank0_statistics_failure_on_rank0_raises_on_every_rank(tmp_path):
    run_ranks(_failing_worker, 2, tmp_path, timeout_s=30, barrier=False)
    step0, msg0 = (tmp_path / "fail0.txt").read_text().split("\n", 1)
    step1, msg1 = (tmp_path / "fail1.txt").read_text().split("\n", 1)
    assert step0 == step1 == "2"
    assert "injected failure on rank 0" in msg0
    assert "rank 0 failed to build the GIFT factors" in msg1


# -- one refresh schedule and EMA for the hook and the benchmark ---------------------------------------


def test_refresh_schedule_and_covariance_ema_by_hand():
    from lab.training.comm.gift import CovarianceEMA, RefreshSchedule

    sched = RefreshSchedule(every=4, warmup=2)
    assert [t for t in range(10) if sched.due(t)] == [0, 1, 4, 8]
    assert [t for t in range(10) if sched.due(t, selecting=t == 3)] == [0, 1, 3, 4, 8]
    assert sched.count(10, lambda t: t in (3, 4)) == 5
    for bad in ({"every": 0}, {"every": True}, {"every": 2, "warmup": -1}):
        with pytest.raises(GiftError, match="refresh_(every|warmup)"):
            RefreshSchedule(**bad)
    a, b = torch.eye(2), 3 * torch.eye(2)
    per_step = CovarianceEMA(0.5, "step")
    per_step.update("x", a, 1)
    assert torch.equal(per_step.update("x", b, 3), (0.25 * a + 0.75 * b).double())  # 0.5 ** (3 - 1)
    per_refresh = CovarianceEMA(0.5, "refresh")
    per_refresh.update("x", a, 1)
    assert torch.equal(per_refresh.update("x", b, 3), (0.5 * a + 0.5 * b).double())
    assert per_refresh.last == {"x": 3} and per_refresh.cov["x"].dtype == torch.float64
    for bad in ({"ema": 1.0}, {"ema": -0.1}, {"ema": 0.5, "per": "epoch"}):
        with pytest.raises(GiftError, match="ema"):
            CovarianceEMA(**bad)


def test_benchmark_study_refreshes_and_averages_exactly_as_the_hook():
    """benchmarks.comm's _Study (what the codec table measures) and GiftHookState on the same model and
    data: the same refresh steps (warm-up, period and the selection steps) and the same covariance EMAs."""
    import dataclasses

    from benchmarks import comm as bench
    from lab.training.data import TextCorpus

    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. "
    corpus = TextCorpus(val_plays=["val"], texts={"train": text * 30, "val": text * 3})
    s = dataclasses.replace(bench.QUICK, gift_refresh_every=4, gift_refresh_warmup=2, gift_ema=0.7)
    selector: list[LayerSelector] = []
    study = bench._Study(corpus, s, seed=0, steps=11, selecting=lambda t: selector[0].due(t))
    first = study.layers[0]
    selector.append(LayerSelector(study.layers, select_by="gain", initial=[first], every=3))
    state, hook = get_hook("gift_fp8", model=study.model, layers=[first], select_by="gain", reselect_every=3,
                           n_eigenpairs=s.gift_rank, damping=0.3, ema=s.gift_ema, ema_per="step",
                           refresh_every=s.gift_refresh_every, refresh_warmup=s.gift_refresh_warmup,
                           output_side=s.gift_output_side, output_side_max=s.gift_output_side_max)
    study_steps, hook_steps = [], []
    for step, refreshed in study:
        if refreshed:
            study_steps.append(step - 1)
        hook(state, FakeBucket([p for p in study.model.parameters() if p.grad is not None])).wait()
        if state._last_refresh and max(state._last_refresh.values()) == step - 1:
            hook_steps.append(step - 1)
        assert set(study.cov) == set(state._cov) and set(study.out_cov) == set(state._out_cov), step
        for mine, theirs in ((study.cov, state._cov), (study.out_cov, state._out_cov)):
            for n in mine:
                assert torch.allclose(mine[n], theirs[n], rtol=1e-6, atol=1e-9), (step, n)
    state.close()
    # warm-up 0, 1; period 4, 8; selections at 3, 6, 9 (the old benchmark test missed these)
    assert study_steps == hook_steps == [0, 1, 3, 4, 6, 8, 9]
    assert study.out_cov and study.cov


def test_train_config_docstring_names_only_hooks_that_exist():
    import re

    from lab.training.run import TrainConfig

    doc = TrainConfig.__doc__
    entry = doc[doc.index("    comm : Fp32Comm"):doc.index("    seed : int")]
    named = re.findall(r'``"([a-z0-9_]+)"``', entry)
    assert named and set(named) <= set(HOOKS), set(named) - set(HOOKS)


def test_gift_eigenpairs_keyword_and_its_deprecated_alias():
    state, _ = get_hook("gift_fp8", model=nn.Linear(4, 4), n_eigenpairs=3)
    assert state.n_eigenpairs == 3 and state.rank == 0  # rank: the process rank, never the eigenpairs
    assert not hasattr(state, "rank_r")
    with pytest.warns(DeprecationWarning, match="n_eigenpairs"):
        old, _ = get_hook("gift_fp8", model=nn.Linear(4, 4), rank=5)  # a comm_kwargs key of earlier runs
    assert old.n_eigenpairs == 5
    with pytest.raises(GiftError, match="n_eigenpairs must be an int >= 1, got 0"):
        get_hook("gift_fp8", model=nn.Linear(4, 4), n_eigenpairs=0)
    with pytest.raises(GiftError, match="disagree"):
        get_hook("gift_fp8", model=nn.Linear(4, 4), n_eigenpairs=3, rank=5)


def test_gift_config_is_frozen_validated_and_names_the_field():
    from pydantic import ValidationError

    from lab.training.comm.gift import GiftConfig

    cfg = GiftConfig(n_eigenpairs=4, layers=["fc1"], refresh_every=2, ema=0.5)
    assert cfg.layers == ("fc1",)
    with pytest.raises(ValidationError):
        cfg.ema = 0.1  # frozen
    for kw, field, text in (({"refresh_warmup": -1}, "refresh_warmup", "refresh_warmup must be an int >= 0, got -1"),
                            ({"damping": True}, "damping", "damping must be a finite float >= 0, got True"),
                            ({"statistics": "mean"}, "statistics", "statistics must be 'all_reduce' or 'rank0', got 'mean'"),
                            ({"include": "("}, "include", "include is not a valid regular expression"),
                            ({"n_eigenpair": 3}, "n_eigenpair", "n_eigenpair is not a GIFT setting"),
                            ({"statistics": "rank0", "broadcast_factors": False}, None, "needs broadcast_factors=True")):
        with pytest.raises(GiftError, match=re.escape(text)) as info:
            GiftConfig.build(**kw)
        assert info.value.field == field
        with pytest.raises(GiftError, match=re.escape(text)):  # the hook validates through the same config
            get_hook("gift_fp8", model=Tiny(), **kw)
    # config= and the same keywords build the same hook; not both at once
    by_config = GiftHookState(Tiny(), config=cfg)
    by_keywords, _ = get_hook("gift_fp8", model=Tiny(), n_eigenpairs=4, layers=["fc1"], refresh_every=2, ema=0.5)
    assert by_config.config == by_keywords.config == cfg
    assert (by_config.n_eigenpairs, by_config.schedule.every, by_config.ema, by_config.selected) == (4, 2, 0.5, ("fc1",))
    with pytest.raises(GiftError, match="not both"):
        GiftHookState(Tiny(), config=cfg, ema=0.1)


def test_benchmark_gift_settings_are_valid_gift_config_fields():
    from benchmarks import comm as bench
    from lab.training.comm.gift import GiftConfig

    for s in (bench.FULL, bench.QUICK):
        kw = bench._gift_kwargs(s, 0.3)
        kw.pop("measure_error")  # an accounting keyword of the hook, not a GIFT setting
        cfg = GiftConfig.build(**kw)
        assert cfg.n_eigenpairs == s.gift_rank and cfg.refresh_warmup == s.gift_refresh_warmup
