"""AdamS and SCAPE (lab.training.optim): hand-computed steps, masks one step late, frozen coordinates,
byte accounting, error feedback, and a real 2-process gloo run."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch
import torch.distributed as dist

import lab
from lab.training.errors import TrainingError
from lab.training.optim import SCAPE, AdamS, OptimizerConfigError, ScapeError
from tests.gloo_support import run_ranks

torch.set_num_threads(1)


def _param(values) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor(values, dtype=torch.float32))


def _set_grad(p: torch.Tensor, values) -> None:
    p.grad = torch.tensor(values, dtype=torch.float32).view_as(p)


# --------------------------------------------------------------------------- AdamS


def test_adams_two_steps_by_hand_without_bias_correction():
    # beta1 = 0.9, beta2 = 0.75 (sqrt(1 - beta2) = 0.5), lr = 0.1, eps = 0, no weight decay.
    p = _param([1.0, -2.0, 0.5])
    opt = AdamS([p], lr=0.1, betas=(0.9, 0.75), eps=0.0, weight_decay=0.0, bias_correction=False)
    # step 1: g1 = [1, -2, 4]; m0 = 0 -> v1 = 0.25 g1^2, sqrt(v1) = [0.5, 1, 2]
    #         m1 = 0.1 g1 = [0.1, -0.2, 0.4]; m1 / sqrt(v1) = [0.2, -0.2, 0.2]
    #         p1 = p0 - 0.1 [0.2, -0.2, 0.2] = [0.98, -1.98, 0.48]
    _set_grad(p, [1.0, -2.0, 4.0])
    opt.step()
    assert p.detach().tolist() == pytest.approx([0.98, -1.98, 0.48], abs=1e-7)
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.1, -0.2, 0.4], abs=1e-7)
    # step 2: g2 = [0.1, 0.2, -0.4]; v2 = 0.75 m1^2 + 0.25 g2^2 = [0.01, 0.04, 0.16], sqrt = [0.1, 0.2, 0.4]
    #         m2 = 0.9 m1 + 0.1 g2 = [0.1, -0.16, 0.32]; m2 / sqrt(v2) = [1.0, -0.8, 0.8]
    #         p2 = p1 - 0.1 [1.0, -0.8, 0.8] = [0.88, -1.90, 0.40]
    _set_grad(p, [0.1, 0.2, -0.4])
    opt.step()
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.1, -0.16, 0.32], abs=1e-7)
    assert p.detach().tolist() == pytest.approx([0.88, -1.90, 0.40], abs=1e-6)


def test_adams_two_steps_by_hand_with_bias_correction_like_the_official_code():
    # beta1 = 0.5, beta2 = 0.75, lr = 0.1, eps = 0; c_t = 1 - 0.5^t: c1 = 0.5, c2 = 0.75.
    p = _param([1.0, -2.0, 0.5])
    opt = AdamS([p], lr=0.1, betas=(0.5, 0.75), eps=0.0, weight_decay=0.0)  # bias_correction=True default
    # step 1: g1 = [1, -2, 4]; m1 = 0.5 g1 = [0.5, -1, 2]; m1 / c1 = g1; sqrt(v1) = 0.5 |g1|
    #         update = g1 / (0.5 |g1|) = 2 sign(g1); p1 = p0 - 0.2 sign(g1) = [0.8, -1.8, 0.3]
    _set_grad(p, [1.0, -2.0, 4.0])
    opt.step()
    assert p.detach().tolist() == pytest.approx([0.8, -1.8, 0.3], abs=1e-7)
    # step 2: g2 = [1, 0, -2]; m1 / c2 = [2/3, -4/3, 8/3]
    #         v2 = 0.75 (m1/c2)^2 + 0.25 g2^2 = [1/3 + 1/4, 4/3 + 0, 16/3 + 1] = [7/12, 4/3, 19/3]
    #         sqrt(v2) = [0.76376262, 1.15470054, 2.51661148]
    #         m2 = 0.5 m1 + 0.5 g2 = [0.75, -0.5, 0]; m2 / c2 = [1, -2/3, 0]
    #         update = [1 / 0.76376262, (-2/3) / 1.15470054, 0] = [1.30930734, -0.57735027, 0]
    #         p2 = p1 - 0.1 update = [0.66906927, -1.74226497, 0.3]
    _set_grad(p, [1.0, 0.0, -2.0])
    opt.step()
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.75, -0.5, 0.0], abs=1e-7)
    assert p.detach().tolist() == pytest.approx([0.66906927, -1.74226497, 0.3], abs=1e-6)
    assert opt.state[p]["step"] == 2


def test_adams_weight_decay_is_decoupled():
    p0 = [1.0, -2.0, 0.5]
    grads = [[1.0, -2.0, 4.0], [0.3, 0.2, -0.4]]
    a, b = _param(p0), _param(p0)
    opt_a = AdamS([a], lr=0.1, weight_decay=0.0)
    opt_b = AdamS([b], lr=0.1, weight_decay=0.5)  # lr * wd = 0.05
    prev_a, prev_b = a.detach().clone(), b.detach().clone()
    for g in grads:
        _set_grad(a, g)
        _set_grad(b, g)
        opt_a.step()
        opt_b.step()
        # weight decay never enters m (or the denominator): the moments are bit-identical
        assert torch.equal(opt_a.state[a]["exp_avg"], opt_b.state[b]["exp_avg"])
        # p_b(t) = 0.95 p_b(t-1) - lr u_t with the same u_t as in a: p_a(t) - p_a(t-1) = -lr u_t
        expected_b = 0.95 * prev_b + (a.detach() - prev_a)
        assert torch.allclose(b.detach(), expected_b, atol=1e-7)
        prev_a, prev_b = a.detach().clone(), b.detach().clone()
    # with a zero gradient only the decay acts: p <- p (1 - lr wd)
    c = _param(p0)
    opt_c = AdamS([c], lr=0.1, weight_decay=0.5)
    _set_grad(c, [0.0, 0.0, 0.0])
    opt_c.step()
    assert torch.equal(c.detach(), torch.tensor(p0) * (1 - 0.1 * 0.5))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(lr=-1.0), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(betas=(1.0, 0.9)), "betas[0]"),
        (dict(betas=(0.9, -0.1)), "betas[1]"),
        (dict(betas=(0.9,)), "betas"),
        (dict(eps=-1e-8), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
    ],
)
def test_adams_rejects_bad_hyperparameters_by_name(kwargs, name):
    with pytest.raises(OptimizerConfigError) as err:
        AdamS([_param([1.0])], **kwargs)
    assert err.value.param == name and name in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, TrainingError) and isinstance(err.value, lab.LabError)
    with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("]", r"\]")):
        AdamS([{"params": [_param([1.0])], **kwargs}])


def test_adams_state_dict_round_trip():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = AdamS(model.parameters(), lr=0.01)
    x = torch.randn(5, 4)
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    twin = copy.deepcopy(model)
    opt2 = AdamS(twin.parameters(), lr=0.5)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert opt2.param_groups[0]["lr"] == 0.01
    for m, o in ((model, opt), (twin, opt2)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- SCAPE, single process


def test_scape_mask_is_used_one_step_late_and_unmasked_coordinates_are_frozen():
    # one tensor of 10 coordinates at 90% sparsity: k = 1 coordinate per sparse step
    p = _param([0.0] * 10)
    opt = SCAPE([p], lr=0.1, betas=(0.9, 0.95), weight_decay=0.1, sparsity=0.9)
    assert dist.is_initialized() is False and opt.world_size == 1 and opt.k == 1

    # step 1 (dense warm-up): every coordinate moves; m1 = 0.1 g1, so the mask for step 2 is {0}
    _set_grad(p, [5.0, 4.0] + [1.0] * 8)
    before = p.detach().clone()
    opt.step()
    assert (p.detach() != before).all()
    assert opt.last_stats.dense and opt.mask(p) is None
    assert opt.mask(p, "next").nonzero().flatten().tolist() == [0]

    # step 2: coordinate 1 has by far the largest gradient, but the mask was fixed by m1 -> only 0 moves
    _set_grad(p, [-5.0, 9.0] + [1.0] * 8)
    before = p.detach().clone()
    opt.step()
    moved = (p.detach() != before).nonzero().flatten().tolist()
    assert moved == [0]
    assert torch.equal(p.detach()[1:], before[1:])  # frozen: bit-identical (no update, no weight decay)
    assert opt.last_values.tolist() == [-5.0]  # only the masked value is in the buffer
    # m2[0] = 0.9 * 0.5 + 0.1 * (-5) = -0.05 ; m2[1] = 0.4 stays frozen (its 9.0 was never sent)
    m = opt.state[p]["exp_avg"]
    assert m[0].item() == pytest.approx(-0.05, abs=1e-7) and m[1].item() == pytest.approx(0.4, abs=1e-7)
    assert opt.mask(p).nonzero().flatten().tolist() == [0]
    assert opt.mask(p, "next").nonzero().flatten().tolist() == [1]  # |m2| is now largest at 1

    # step 3: the mask computed at step 2 ({1}) is applied
    _set_grad(p, [100.0] * 10)
    before = p.detach().clone()
    opt.step()
    assert (p.detach() != before).nonzero().flatten().tolist() == [1]
    assert opt.last_values.tolist() == [100.0]
    assert opt.mask_coverage() == pytest.approx(0.2)  # coordinates 0 and 1 (dense step 1 does not count)
    assert [s.mask_changed for s in opt.history] == [None, None, 1.0]


def test_scape_bytes_per_step_at_90_percent():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 10)  # n = 100 + 10 = 110 float32 coordinates: dense payload 440 bytes
    opt = SCAPE(model.parameters(), lr=0.01, sparsity=0.9, scope="shard")
    assert opt.numel == 110 and opt.k == 11
    assert opt.dense_bytes_per_step == 440
    assert opt.value_bytes_per_step == 44 == 4 * opt.k  # exactly 10% of the dense values
    # stated overhead: the mask all_gather, a bitmask of the 110 owned coordinates (14 bytes) beats
    # 11 int32 indices (44 bytes); sent once per refresh
    assert opt.mask_encoding == "bitmask" and opt.mask_bytes_per_refresh == 14
    assert opt.bytes_sent_per_step == 44 + 14
    x = torch.randn(8, 10)
    for t in range(1, 4):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        s = opt.last_stats
        assert s.step == t and s.dense == (t == 1)
        assert s.value_bytes == (440 if t == 1 else 44) and s.k == (110 if t == 1 else 11)
        assert s.mask_bytes == 14 and s.mask_encoding == "bitmask" and s.dense_bytes == 440
        assert s.wire_bytes_estimate == 0.0  # world size 1: nothing travels
    assert opt.last_values.shape == (11,)
    assert opt.bytes_per_step()["ratio_to_dense"] == pytest.approx(58 / 440)

    # other mask wire formats and sync schemes
    kw = dict(lr=0.01, sparsity=0.9, scope="shard")
    assert SCAPE(model.parameters(), mask_encoding="indices", **kw).bytes_sent_per_step == 44 + 44
    assert SCAPE(model.parameters(), mask_sync="local", **kw).bytes_sent_per_step == 44
    assert SCAPE(model.parameters(), mask_refresh_interval=2, **kw).bytes_sent_per_step == 44 + 7
    # 99%: k = 1 value (4 bytes); 1 int32 index (4 bytes) beats the 14-byte bitmask
    o99 = SCAPE(model.parameters(), lr=0.01, sparsity=0.99, scope="shard")
    assert (o99.k, o99.mask_encoding, o99.bytes_sent_per_step) == (1, "indices", 8)
    # per tensor: weight 100 -> 10, bias 10 -> 1
    assert SCAPE(model.parameters(), lr=0.01, sparsity=0.9).k == 11


def test_scape_error_feedback_accumulates_the_unsent_mass_exactly():
    p = _param([0.0] * 6)
    opt = SCAPE([p], lr=0.01, sparsity=0.8, error_feedback=True)  # k = round(0.2 * 6) = 1
    grads = [
        [3.0, 1.0, 2.0, -1.0, 0.0, 1.0],  # dense: everything sent, residual stays 0
        [1.0, 2.0, -3.0, 4.0, 1.0, 0.0],
        [2.0, -1.0, 1.0, 1.0, 5.0, 2.0],
        [-1.0, 3.0, 0.0, 2.0, 1.0, 1.0],
        [0.0, 1.0, 1.0, -2.0, 2.0, 4.0],
    ]
    residual = torch.zeros(6)
    sent_total = torch.zeros(6)
    for t, g in enumerate(grads, start=1):
        _set_grad(p, g)
        mask = opt.mask(p, "next")
        opt.step()
        e = torch.tensor(g) + residual
        if t == 1:
            assert opt.last_values.tolist() == g and torch.equal(opt.residual(p), torch.zeros(6))
            continue
        (j,) = mask.nonzero().flatten().tolist()
        assert opt.last_values.tolist() == [e[j].item()]  # the masked coordinate carries its old residual
        residual = e.clone()
        residual[j] = 0.0
        sent_total[j] += e[j]
        assert torch.equal(opt.residual(p), residual)
    # conservation: sent + unsent = every gradient of the sparse steps, exactly
    assert torch.equal(sent_total + opt.residual(p), torch.tensor(grads[1:]).sum(0))


def test_scape_without_sparsity_is_dense_adams_bit_for_bit():
    torch.manual_seed(1)
    a = torch.nn.Linear(6, 5)
    b = copy.deepcopy(a)
    opt_a = AdamS(a.parameters(), lr=0.02, weight_decay=0.1)
    opt_b = SCAPE(b.parameters(), lr=0.02, weight_decay=0.1, sparsity=0.0)
    for _ in range(4):
        x = torch.randn(7, 6)
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            m(x).sin().sum().backward()
            o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
        assert torch.equal(opt_a.state[pa]["exp_avg"], opt_b.state[pb]["exp_avg"])


def test_scape_zero_gradient_treatment_moves_unmasked_coordinates_about_092_lr():
    # the trap: with g = 0, v = beta2 m^2 and the update is beta1 m / sqrt(beta2 m^2) = 0.923 sign(m)
    p = _param([0.0] * 10)
    opt = SCAPE([p], lr=0.1, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, bias_correction=False,
                sparsity=0.9, unmasked="zero_grad")
    _set_grad(p, [5.0, -4.0, 3.0, -2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    opt.step()
    before = p.detach().clone()
    _set_grad(p, [1.0] * 10)
    opt.step()  # mask {0}: coordinates 1..9 see a zero gradient
    drift = (p.detach() - before)[1:]
    sign_m = torch.tensor([-1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.allclose(drift, -0.1 * (0.9 / math.sqrt(0.95)) * sign_m, atol=1e-6)


def test_scape_exploration_is_deterministic_and_raises_coverage():
    def run(explore: float, seed: int = 3) -> tuple[SCAPE, list[list[int]]]:
        p = _param([0.0] * 200)
        opt = SCAPE([p], lr=0.01, sparsity=0.95, explore=explore, seed=seed)  # k = 10
        gen = torch.Generator().manual_seed(0)
        base = torch.randn(200, generator=gen).abs() * torch.linspace(3.0, 0.1, 200)  # a fixed pecking order
        masks = []
        for _ in range(12):
            p.grad = base + 0.01 * torch.randn(200, generator=gen)
            opt.step()
            nxt = opt.mask(p, "next").nonzero().flatten().tolist()
            assert len(nxt) == 10  # explored slots never duplicate top-k ones
            masks.append(nxt)
        return opt, masks

    plain, _ = run(0.0)
    explored, masks = run(0.5)
    _, masks_again = run(0.5)
    assert masks == masks_again  # seeded: every rank draws the same coordinates
    assert explored.mask_coverage() == len(set().union(*masks[:-1])) / 200  # the last mask is not used yet
    assert explored.mask_coverage() > plain.mask_coverage()
    assert plain.mask_coverage() <= 0.1  # the pure top-|m| mask locks in


def test_scape_random_mask_covers_coordinates_like_independent_draws():
    """explore=1.0: every slot random, so after T sparse steps a coordinate was missed with probability
    (1 - k/n)^T, whatever |m| says (the pecking order of the test above no longer matters)."""
    n, k_frac, steps = 5000, 0.1, 20
    p = _param([0.0] * n)
    opt = SCAPE([p], lr=0.01, sparsity=1 - k_frac, explore=1.0, seed=11)
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(n, generator=gen).abs() * torch.linspace(3.0, 0.1, n)
    first_half = []
    for t in range(steps + 1):  # step 1 is dense; steps 2..21 use 20 random masks
        p.grad = base + 0.01 * torch.randn(n, generator=gen)
        opt.step()
        if t >= 1:
            m = opt.mask(p).nonzero().flatten()
            assert m.numel() == round(k_frac * n)
            first_half.append(int((m < n // 2).sum()))
    expected = 1 - (1 - k_frac) ** steps  # 0.878
    assert abs(opt.mask_coverage() - expected) < 0.02
    assert abs(sum(first_half) / (steps * k_frac * n) - 0.5) < 0.03  # large-|m| half not favoured


@pytest.mark.parametrize(
    ("kwargs", "other"),
    [
        (dict(error_feedback=True, explore=0.25), dict(sparsity=0.5)),
        # momentum correction: the accumulators and last-update steps travel; a checkpoint of it needs them
        (dict(explore=0.5, momentum_correction=True), dict(sparsity=0.75, explore=0.5)),
    ],
)
def test_scape_state_dict_round_trip_keeps_mask_and_coverage(kwargs, other):
    torch.manual_seed(2)
    model = torch.nn.Linear(8, 4)
    opt = SCAPE(model.parameters(), lr=0.01, sparsity=0.75, **kwargs)
    xs = [torch.randn(6, 8) for _ in range(6)]
    for x in xs[:3]:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    twin = copy.deepcopy(model)
    opt2 = SCAPE(twin.parameters(), lr=0.01, sparsity=0.75, **kwargs)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert opt2.mask_coverage() == opt.mask_coverage()
    for x in xs[3:]:
        for m, o in ((model, opt), (twin, opt2)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ScapeError, match="layout"):
        SCAPE(copy.deepcopy(model).parameters(), **other).load_state_dict(opt.state_dict())


def _momentum_corrected_reference(grads, *, lr, beta1, beta2, eps, wd, k, masking, bias_correction):
    """DGC momentum correction on AdamS, coordinate by coordinate in plain floats (the equations of
    lab.training.optim.scape's docstring), one rank, one tensor, top-k |m| masks used one step late."""
    n = len(grads[0])
    p, m, u, v, last = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    sent = [0.0] * n
    history = []
    mask = None
    for t, g in enumerate(grads, start=1):
        if t == 1:  # the dense step: plain AdamS (with the official bias correction)
            c = (1 - beta1) if bias_correction else 1.0
            for j in range(n):
                mh = m[j] / c
                d = math.sqrt(beta2 * mh * mh + (1 - beta2) * g[j] ** 2) + eps
                p[j] *= 1 - lr * wd
                m[j] = beta1 * m[j] + (1 - beta1) * g[j]
                p[j] -= lr * (m[j] / c) / d
                last[j] = 1
                u[j] = 0.0 if masking else m[j]
        else:
            for j in range(n):
                u[j] = beta1 * u[j] + (1 - beta1) * g[j]
                if not bias_correction:
                    c = 1.0
                else:
                    c = 1 - beta1 ** ((t - last[j]) if masking else t)
                v[j] += u[j] / c
            for j in mask:
                V, tau = v[j], t - last[j]
                sent[j] += V
                v[j] = 0.0
                if masking:
                    u[j] = 0.0
                m_bar = V / tau
                d = max(math.sqrt(beta2 * m[j] ** 2 + (1 - beta2) * m_bar**2), abs(m_bar)) + eps
                p[j] = p[j] * (1 - lr * wd) ** tau - lr * V / d
                m[j], last[j] = m_bar, t
        mask = sorted(sorted(range(n), key=lambda j: -abs(m[j]))[:k])
        history.append(list(p))
    return history, m, v, sent


@pytest.mark.parametrize("masking", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_scape_momentum_correction_matches_the_equations_by_hand(masking, bias_correction):
    # irregular values: no two |m| tie, so the top-k masks are unambiguous
    grads = [
        [3.1, -1.3, 2.2, 0.57, -4.3, 1.51],
        [1.07, 2.53, -3.11, 4.02, 1.19, -0.23],
        [2.29, -1.37, 1.21, 1.13, 5.03, 2.17],
        [-1.41, 3.05, 0.31, 2.71, 1.43, 1.09],
        [0.13, 1.61, 1.17, -2.37, 2.03, 4.19],
        [1.73, -2.11, 0.53, 0.79, -1.09, 3.01],
        [0.47, 0.83, -1.67, 3.23, 0.29, -0.11],
    ]
    hp = dict(lr=0.05, beta1=0.6, beta2=0.95, eps=1e-8, wd=0.1)
    p = _param([0.0] * 6)
    opt = SCAPE([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], weight_decay=hp["wd"],
                bias_correction=bias_correction, sparsity=2 / 3, mask_sync="local",
                momentum_correction=True, momentum_masking=masking)
    assert opt.k == 2
    ref, m_ref, v_ref, sent = _momentum_corrected_reference(grads, k=2, masking=masking, bias_correction=bias_correction, **hp)
    sent_by_opt = torch.zeros(6)
    for g, want in zip(grads, ref):
        _set_grad(p, g)
        nxt = opt.mask(p, "next")
        opt.step()
        if nxt is not None:
            sent_by_opt[nxt] += opt.last_values
        assert p.detach().tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx(m_ref, rel=1e-5, abs=1e-6)
    assert opt.state[p]["momentum_accum"].tolist() == pytest.approx(v_ref, rel=1e-5, abs=1e-6)
    # nothing lost: what was sent plus what waits in the accumulator is every step's (corrected) momentum
    assert (sent_by_opt + opt.state[p]["momentum_accum"]).tolist() == pytest.approx([a + b for a, b in zip(sent, v_ref)], rel=1e-5)
    assert opt.mask_coverage() > 0.5  # the catch-up rotates the mask: frozen coordinates get their turn


def test_scape_momentum_correction_without_sparsity_is_adams_with_the_momentum_in_the_normalizer():
    # k = n, no masking: mean_k u_k is the global first moment, tau = 1, V = m_t; the update is AdamS's with
    # g_t**2 replaced by m_t**2 in the denominator (the global gradient never travels), floored at |m_t|
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(5))
    opt = SCAPE([p], lr=0.02, betas=(0.8, 0.9), weight_decay=0.0, bias_correction=False, sparsity=0.0,
                momentum_correction=True, momentum_masking=False)
    q, m = p.detach().clone(), torch.zeros(5)
    for t in range(1, 6):
        g = torch.randn(5)
        p.grad = g.clone()
        opt.step()
        m_prev = m.clone()
        m = 0.8 * m + 0.2 * g
        denom = (0.9 * m_prev**2 + 0.1 * (g if t == 1 else m) ** 2).sqrt()  # step 1 is the dense AdamS step
        q = q - 0.02 * m / ((denom if t == 1 else torch.maximum(denom, m.abs())) + 1e-8)
        assert torch.allclose(p.detach(), q, atol=1e-6), t


def test_scape_dense_m_ablation_keeps_dense_adams_moment_and_moves_only_masked_coordinates():
    torch.manual_seed(5)
    p = torch.nn.Parameter(torch.randn(12))
    q = torch.nn.Parameter(p.detach().clone())
    opt = SCAPE([p], lr=0.03, weight_decay=0.1, sparsity=0.75, explore=0.5, mask_sync="local", unmasked="freeze_dense_m")
    ref = AdamS([q], lr=0.03, weight_decay=0.1)
    for t in range(1, 7):
        g = torch.randn(12)
        p.grad, q.grad = g.clone(), g.clone()
        before = p.detach().clone()
        mask = opt.mask(p, "next")
        opt.step()
        ref.step()
        assert torch.equal(opt.state[p]["exp_avg"], ref.state[q]["exp_avg"])  # m is dense AdamS's, exactly
        moved = p.detach() != before
        if t > 1:
            assert not moved[~mask].any() and moved[mask].all()
            assert opt.last_stats.k == 12 and opt.last_stats.value_bytes == 48  # every value travelled
        else:
            assert torch.equal(p.detach(), q.detach())
    with pytest.raises(OptimizerConfigError) as err:
        SCAPE([_param([1.0, 2.0])], unmasked="freeze_dense_m", error_feedback=True)
    assert err.value.param == "unmasked"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(sparsity=1.0), "sparsity"),
        (dict(sparsity=-0.1), "sparsity"),
        (dict(scope="row"), "scope"),
        (dict(mask_sync="broadcast"), "mask_sync"),
        (dict(mask_encoding="rle"), "mask_encoding"),
        (dict(mask_refresh_interval=0), "mask_refresh_interval"),
        (dict(dense_steps=0), "dense_steps"),
        (dict(unmasked="decay"), "unmasked"),
        (dict(explore=1.5), "explore"),
        (dict(mask_score="m_ef"), "mask_score"),  # needs error feedback
        (dict(mask_score="m_ef", error_feedback=True, mask_sync="local"), "mask_score"),
        (dict(momentum_correction=1), "momentum_correction"),
        (dict(momentum_correction=True, error_feedback=True), "momentum_correction"),
        (dict(momentum_correction=True, unmasked="zero_grad"), "momentum_correction"),
        (dict(momentum_masking="yes"), "momentum_masking"),
        (dict(mask_score="accum"), "mask_score"),  # needs momentum correction
        (dict(mask_score="accum", momentum_correction=True, mask_sync="local"), "mask_score"),
        (dict(lr=-0.1), "lr"),
        (dict(betas=(0.9, 1.0)), "betas[1]"),
    ],
)
def test_scape_rejects_bad_options_by_name(kwargs, name):
    with pytest.raises(OptimizerConfigError) as err:
        SCAPE([_param([1.0, 2.0])], **kwargs)
    assert err.value.param == name and isinstance(err.value, ValueError)


def test_scape_rejects_unsupported_parameters():
    with pytest.raises(ScapeError, match="dtype"):
        SCAPE([_param([1.0]), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))])
    with pytest.raises(ScapeError, match="contiguous"):
        SCAPE([torch.nn.Parameter(torch.zeros(3, 4).t())])
    opt = SCAPE([_param([1.0, 2.0])])
    with pytest.raises(ScapeError, match="after construction"):
        opt.add_param_group({"params": [_param([3.0])]})


# --------------------------------------------------------------------------- a real 2-process gloo run

_CONFIGS = {
    # name: (SCAPE options, whether a single-process run on the concatenated batch must match)
    "tensor_ef_explore": (dict(sparsity=0.5, error_feedback=True, explore=0.25, seed=7), True),
    "shard_indices": (dict(sparsity=0.75, scope="shard", mask_encoding="indices"), False),
    "tensor_local": (dict(sparsity=0.75, mask_sync="local"), True),
    "tensor_m_ef": (dict(sparsity=0.75, error_feedback=True, mask_score="m_ef"), False),
    "tensor_momentum_correction": (dict(sparsity=0.75, momentum_correction=True, explore=0.5, seed=3), True),
    "tensor_accum": (dict(sparsity=0.75, momentum_correction=True, mask_score="accum", mask_encoding="indices"), False),
}
_STEPS = 6
_B = 6  # rows per rank


def _data(steps: int, world: int):
    gen = torch.Generator().manual_seed(123)
    return [(torch.randn(world * _B, 8, generator=gen), torch.randn(world * _B, 4, generator=gen)) for _ in range(steps)]


def _model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4)


def _worker(rank: int, world: int, outdir: str) -> None:
    data = [(x[rank * _B : (rank + 1) * _B], y[rank * _B : (rank + 1) * _B]) for x, y in _data(_STEPS, world)]
    out: dict[str, object] = {}
    # dense AdamS on all_reduce-averaged gradients
    model = _model()
    opt = AdamS(model.parameters(), lr=0.05, weight_decay=0.1)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        opt.step()
    out["adams"] = [p.detach().clone() for p in model.parameters()]
    # SCAPE: plain backward on the local replica, SCAPE does the only gradient collective
    for name, (kw, _) in _CONFIGS.items():
        model = _model()
        opt = SCAPE(model.parameters(), lr=0.05, weight_decay=0.1, **kw)
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.synchronize()
        out[name] = {
            "params": [p.detach().clone() for p in model.parameters()],
            "exp_avg": [opt.state[p]["exp_avg"].clone() for p in model.parameters()],
            "masks": [opt.mask(p) for p in model.parameters()],
            "stats": [s.as_dict() for s in opt.history],
            "coverage": opt.mask_coverage(),
            "world": opt.world_size,
        }
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


@pytest.mark.slow  # 3.5 s alone, up to 13 s on the shared 2-core box (two processes import torch)
def test_two_process_gloo_scape_replicas_identical_and_dense_adams_matches_single_process(tmp_path):
    world = 2
    run_ranks(_worker, world, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(world))
    data = _data(_STEPS, world)

    # dense AdamS with averaged gradients == one process on the concatenated batch (equal per-rank batches)
    model = _model()
    opt = AdamS(model.parameters(), lr=0.05, weight_decay=0.1)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for a, b, ref in zip(r0["adams"], r1["adams"], model.parameters()):
        assert torch.equal(a, b)
        assert torch.allclose(a, ref.detach(), atol=1e-6, rtol=1e-5)

    for name, (kw, single_matches) in _CONFIGS.items():
        s0, s1 = r0[name], r1[name]
        assert s0["world"] == s1["world"] == world
        for key in ("params", "exp_avg", "masks"):  # replicas stay bit-identical
            for a, b in zip(s0[key], s1[key]):
                assert torch.equal(a, b), (name, key)
        assert s0["coverage"] == s1["coverage"]
        # the only gradient collective carried k values per sparse step; the masks really travelled
        sparse = [s for s in s0["stats"] if not s["dense"]]
        assert len(sparse) == _STEPS - 1
        assert all(s["value_bytes"] == 4 * s["k"] < s["dense_bytes"] for s in sparse)
        if kw.get("mask_sync") == "local":
            assert all(s["mask_bytes"] == 0 for s in s0["stats"])
        else:
            assert all(s["mask_bytes"] > 0 and s["wire_bytes_estimate"] > s["value_bytes"] for s in sparse)
        if single_matches:  # per-tensor masks do not depend on the world size
            model = _model()
            opt = SCAPE(model.parameters(), lr=0.05, weight_decay=0.1, **kw)
            for x, y in data:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            assert opt.world_size == 1
            for a, ref, mk in zip(s0["params"], model.parameters(), s0["masks"]):
                assert torch.equal(mk, opt.mask(ref)), name
                assert torch.allclose(a, ref.detach(), atol=1e-6, rtol=1e-5), name


def test_training_errors_live_in_lab_training_errors_and_old_imports_still_work():
    import lab.training.errors as errors
    from lab.training.data import DataConfigError
    from lab.training.model import ModelConfigError
    from lab.training.optim import OptimizerConfigError, ScapeError
    from lab.training.optim.adams import OptimizerConfigError as from_adams
    from lab.training.optim.scape import ScapeError as from_scape

    for cls in (DataConfigError, ModelConfigError, OptimizerConfigError, ScapeError, from_adams, from_scape):
        assert cls.__module__ == "lab.training.errors" and cls is getattr(errors, cls.__name__)
        assert issubclass(cls, errors.TrainingError) and cls.__name__ in errors.__all__
    assert issubclass(OptimizerConfigError, ValueError)
    err = OptimizerConfigError("AdamS", "lr", -1.0, ">= 0")
    assert (err.param, err.value, str(err)) == ("lr", -1.0, "AdamS: lr must be >= 0, got -1.0")


def test_scape_config_is_frozen_validated_and_names_the_option():
    import pydantic

    from lab.training.optim.scape import SCAPE, ScapeConfig, ScapeError

    cfg = ScapeConfig.build(sparsity=0.99, explore=0.2)
    with pytest.raises(pydantic.ValidationError):
        cfg.sparsity = 0.5  # frozen
    for kw, param in (({"sparsity": 1.0}, "sparsity"), ({"dense_steps": 0}, "dense_steps"), ({"seed": True}, "seed"),
                      ({"mask_score": "m_ef"}, "mask_score"), ({"explore": 1.5}, "explore")):
        with pytest.raises(OptimizerConfigError, match=f"SCAPE: {param} must be") as info:
            ScapeConfig.build(**kw)
        assert info.value.param == param
    with pytest.raises(ScapeError, match="unknown option"):
        ScapeConfig.build(sparsty=0.9)
    params = [torch.nn.Parameter(torch.randn(50))]
    opt = SCAPE(params, config=cfg)
    assert opt.config is cfg and (opt.sparsity, opt.explore) == (0.99, 0.2)
    assert SCAPE([torch.nn.Parameter(torch.randn(50))], sparsity=0.99, explore=0.2).config == cfg
    with pytest.raises(ScapeError, match="not both"):
        SCAPE(params, sparsity=0.5, config=cfg)
