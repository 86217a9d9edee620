"""GIFT at FP8's bytes (issue #23 item 2): the side-byte accounting, the byte-budgeted layer selection,
low-rank factors from one eigendecomposition, the bf16 codec, and a 2-rank gloo run of GIFT with rank-0
low-rank factors on a fixed layer set (replicas bit-identical, side bytes exactly as accounted)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from lab.training import GiftError
from lab.training.comm import get_codec, get_hook
from lab.training.comm.codecs import NonFiniteError
from lab.training.comm.gift import (
    BudgetCandidate,
    RefreshSchedule,
    Whitening,
    budget_selection,
    factor_floats,
    side_bytes_per_refresh,
)
from lab.training.model import GPT, GPTConfig
from tests.gloo_support import run_ranks


def test_side_bytes_by_hand():
    assert factor_floats(129, 8) == 129 * 8 + 8 + 1
    assert factor_floats(5, 8) == 5 * 5 + 5 + 1  # k = min(r, d)
    # rank 0's statistics: a 4-byte header and the float32 factors, per factor
    assert side_bytes_per_refresh([129, 85], 8, "rank0") == 4 * (1 + 129 * 8 + 9) + 4 * (1 + 85 * 8 + 9)
    # all-reduced statistics: the upper triangle and the row count, then the broadcast
    assert side_bytes_per_refresh([10], 4, "all_reduce") == 4 * (55 + 1) + 4 * (40 + 5)
    assert side_bytes_per_refresh([10], 4, "all_reduce", broadcast_factors=False) == 4 * 56
    with pytest.raises(GiftError, match="statistics"):
        side_bytes_per_refresh([10], 4, "gather")
    with pytest.raises(GiftError, match="n_eigenpairs"):
        factor_floats(10, 0)


def _cand(name, err, gain, b):
    return BudgetCandidate(name=name, error_sq=err, gain=gain, bytes_per_step=b)


def test_budget_selection_by_hand():
    cands = [
        _cand("a", 1.0, 4.0, 100.0),   # reduction 0.9375 -> 9.4e-3 per byte
        _cand("b", 10.0, 2.5, 500.0),  # 8.4 -> 1.68e-2 per byte: first
        _cand("c", 50.0, 1.9, 10.0),   # below min_gain: never
        _cand("d", 2.0, 3.0, 450.0),   # 1.78 -> 3.95e-3 per byte: does not fit after b and a
        _cand("e", 0.1, 2.0, 5.0),     # 0.075 -> 1.5e-2 per byte
    ]
    assert budget_selection(cands, 700.0, 2.0) == ("a", "b", "e")  # candidate order kept
    assert budget_selection(cands, 1000.0, 2.0) == ("a", "b", "e")  # d (450) still does not fit in 395
    assert budget_selection(cands, 1100.0, 2.0) == ("a", "b", "d", "e")
    assert budget_selection(cands, 1100.0, 1.5) == ("a", "b", "c", "d", "e")
    assert budget_selection(cands, 0.0) == ()
    with pytest.raises(GiftError, match="duplicate"):
        budget_selection([cands[0], cands[0]], 10.0)
    with pytest.raises(GiftError, match="budget"):
        budget_selection(cands, -1.0)
    with pytest.raises(GiftError, match="min_gain"):
        budget_selection(cands, 1.0, 0.5)


def test_ranks_from_one_eigendecomposition_equal_from_covariance_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 24, generator=gen, dtype=torch.float64) * torch.logspace(0, -2, 24, dtype=torch.float64)
    cov = x.T @ x / 200
    many = Whitening.from_covariance_ranks(cov, (2, 8, 30), damping=0.1)
    for r, w in many.items():
        one = Whitening.from_covariance(cov, r, damping=0.1)
        assert torch.equal(w.basis, one.basis) and torch.equal(w.eigenvalues, one.eigenvalues)
        assert w.residual == one.residual
    assert many[2].rank == 2 and many[30].rank == 24
    g = torch.randn(5, 24, generator=gen)
    assert torch.allclose(many[8].unwhiten(many[8].whiten(g)), g, atol=1e-5)  # low rank: still exact inverses


def _known_spectrum(d: int, lam: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)).Q
    return (q * lam) @ q.T, q


def test_subspace_eigensolver_recovers_a_known_spectrum_and_the_residual_exactly():
    d = 120
    lam = torch.cat([torch.tensor([64.0, 32, 16, 8, 4, 2], dtype=torch.float64), torch.full((d - 6,), 0.01, dtype=torch.float64)])
    cov, q = _known_spectrum(d, lam)
    exact = Whitening.from_covariance(cov, 6, damping=0.0)
    got = Whitening.from_covariance(cov, 6, damping=0.0, eigensolver="subspace", iters=4)
    # gap 2 / 0.01: four power iterations leave the eigenvalues exact to float32
    assert torch.allclose(got.eigenvalues, lam[:6].float(), rtol=1e-6)
    assert torch.allclose(got.eigenvalues, exact.eigenvalues, rtol=1e-6)
    # the same subspace: the singular values of U_got^T U_true are all 1
    sv = torch.linalg.svdvals(got.basis.double().T @ q[:, :6])
    assert torch.allclose(sv, torch.ones(6, dtype=torch.float64), atol=1e-6)
    # c, the mean discarded eigenvalue, from the trace: 0.01 (eigh's mean of the discarded ones agrees)
    assert got.residual == pytest.approx(0.01, rel=1e-6) and exact.residual == pytest.approx(0.01, rel=1e-6)
    g = torch.randn(7, d, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(got.whiten(g), exact.whiten(g), rtol=1e-3, atol=1e-3)
    # deterministic: the same call gives the same bits
    again = Whitening.from_covariance(cov, 6, damping=0.0, eigensolver="subspace", iters=4)
    assert torch.equal(again.to_flat(), got.to_flat())


def test_subspace_warm_start_and_fallback():
    d = 80
    lam = torch.logspace(1, -3, d, dtype=torch.float64)  # no gap: a cold start with 0 iterations is poor
    cov, q = _known_spectrum(d, lam, seed=1)
    cold = Whitening.from_covariance(cov, 4, damping=0.0, eigensolver="subspace", iters=0)
    warm = Whitening.from_covariance(cov, 4, damping=0.0, eigensolver="subspace", iters=0, init=q[:, :12].float())
    # Rayleigh-Ritz on a subspace holding the top eigenvectors is exact (to the float32 init)
    assert torch.allclose(warm.eigenvalues, lam[:4].float(), rtol=1e-5)
    assert float((cold.eigenvalues - lam[:4].float()).abs().max()) > 10 * float((warm.eigenvalues - lam[:4].float()).abs().max())
    # r + oversample >= d / 2, or residual="diag": eigh itself, bit for bit
    small = Whitening.from_covariance(cov, 40, damping=0.1, eigensolver="subspace")
    assert torch.equal(small.to_flat(), Whitening.from_covariance(cov, 40, damping=0.1).to_flat())
    diag = Whitening.from_covariance(cov, 4, damping=0.1, residual="diag", eigensolver="subspace")
    assert torch.equal(diag.to_flat(), Whitening.from_covariance(cov, 4, damping=0.1, residual="diag").to_flat())
    with pytest.raises(GiftError, match="eigensolver"):
        Whitening.from_covariance(cov, 4, eigensolver="lanczos")
    with pytest.raises(GiftError, match="iters"):
        Whitening.from_covariance(cov, 4, eigensolver="subspace", iters=-1)
    with pytest.raises(GiftError, match="init"):
        Whitening.from_covariance(cov, 4, eigensolver="subspace", init=torch.zeros(79, 4))
    from lab.training.comm import GiftConfig

    with pytest.raises(GiftError, match="eigensolver") as e:
        GiftConfig.build(eigensolver="lanczos")
    assert e.value.field == "eigensolver"
    assert GiftConfig.build(eigensolver="subspace", subspace_iters=2).subspace_iters == 2


def test_bf16_codec():
    c = get_codec("bf16")
    x = torch.randn(1001) * torch.logspace(-20, 20, 1001)  # no scale needed: float32's range
    p = c.encode(x)
    assert p.dtype == torch.uint8 and p.numel() == c.nbytes(1001) == 2002
    back = c.decode(p, 1001)
    assert torch.equal(back, x.to(torch.bfloat16).float())
    assert float(((back - x).abs() / x.abs()).max()) <= 2.0 ** -8
    odd = torch.cat([torch.zeros(1, dtype=torch.uint8), p])[1:]  # an unaligned slice of a gathered buffer
    assert torch.equal(c.decode(odd, 1001), back)
    with pytest.raises(NonFiniteError):
        c.encode(torch.tensor([1.0, float("nan")]))


# -- 2-rank gloo: GIFT with rank-0 low-rank factors on a fixed layer set --------------------------------------

_STEPS, _B = 7, 4
_LAYERS = ["head", "blocks.0.mlp.fc", "tok_emb"]
_GIFT = dict(n_eigenpairs=4, damping=0.1, ema=0.5, refresh_every=3, refresh_warmup=1, layers=_LAYERS, reselect_every=None,
             track="selected", statistics="rank0")


def _worker(rank: int, world: int, outdir: str) -> None:
    out = {}
    # gift_subspace: every rank builds its own factors (no broadcast) by warm-started subspace iteration
    subspace = {**_GIFT, "statistics": "all_reduce", "broadcast_factors": False, "eigensolver": "subspace"}
    for run, (hook_name, kw) in {"gift": ("gift_fp8", _GIFT), "bf16": ("bf16", {}),
                                 "gift_subspace": ("gift_fp8", subspace)}.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=16))
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        state, hook = get_hook(hook_name, model=model, **kw)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1)
        for _ in range(_STEPS):
            idx = torch.randint(0, 20, (world * _B, 9), generator=gen)[rank * _B : (rank + 1) * _B]
            opt.zero_grad()
            ddp(idx[:, :-1], idx[:, 1:])[1].backward()
            opt.step()
        out[run] = {"params": [p.detach().clone() for p in model.parameters()],
                    "records": [r.as_dict() for r in state.history],
                    "whitening": {k: (w.dim, w.rank) for k, w in getattr(state, "whitening", {}).items()},
                    "out_whitening": {k: (w.dim, w.rank) for k, w in getattr(state, "out_whitening", {}).items()},
                    "factor_bits": [w.to_flat() for w in getattr(state, "whitening", {}).values()],
                    "out_factor_bits": [w.to_flat() for w in getattr(state, "out_whitening", {}).values()]}
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


@pytest.mark.slow  # ~6 s: two processes, two short DDP trainings
def test_two_rank_gift_low_rank_factors_bit_identical_replicas_and_exact_side_bytes(tmp_path):
    run_ranks(_worker, 2, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for run in ("gift", "bf16", "gift_subspace"):
        for a, b in zip(r0[run]["params"], r1[run]["params"]):
            assert torch.equal(a, b), run  # replicas bit-identical
    for run in ("gift", "gift_subspace"):  # rank 0's factors broadcast, or each rank's own: the same bits
        for a, b in zip(r0[run]["factor_bits"] + r0[run]["out_factor_bits"], r1[run]["factor_bits"] + r1[run]["out_factor_bits"]):
            assert torch.equal(a, b), run
    assert r0["gift_subspace"]["out_whitening"] == {"head": (20, 4), "blocks.0.mlp.fc": (64, 4)}
    # low rank for real: 4 eigenpairs of factors of size 16 (head, no bias), 17 (fc: 16 inputs + bias),
    # 16 (tok_emb's stream); output sides 20 (the head's vocabulary) and 64 (fc's outputs)
    assert r0["gift"]["whitening"] == {"head": (16, 4), "blocks.0.mlp.fc": (17, 4), "tok_emb": (16, 4)}
    assert r0["gift"]["out_whitening"] == {"head": (20, 4), "blocks.0.mlp.fc": (64, 4)}
    dims = [16, 20, 17, 64, 16]  # every factor of the fixed set
    per_refresh = side_bytes_per_refresh(dims, 4, "rank0")
    sched = RefreshSchedule(3, 1)
    for recs in (r0["gift"]["records"], r1["gift"]["records"]):
        assert [r["extra_bytes"] for r in recs] == [per_refresh if sched.due(t) else 0 for t in range(_STEPS)]
    params = list(GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, d_model=16)).parameters())
    assert all(r["payload_bytes"] == 2 * sum(p.numel() for p in params) and r["extra_bytes"] == 0
               for r in r0["bf16"]["records"])


def _frontier_caps():
    """Two identical captures: layers a (gain 2), b (gain 2), tok_emb (gain 1.25), one Euclidean LayerNorm."""
    cfg = "r1_p1_w0"
    layers = {"a": {"ref": 9.0, "fp8": 4.0, "gift": {cfg: 1.0}}, "b": {"ref": 9.0, "fp8": 1.0, "gift": {cfg: 0.25}},
              "tok_emb": {"ref": 9.0, "fp8": 4.0, "gift": {cfg: 2.56}}}
    return cfg, [{"step": s, "layers": layers, "other": {"ln.weight": {"ref": 1.0, "fp8": 1.0}}} for s in (1, 10)]


def test_layer_set_frontier_by_hand():
    """Euclidean squared error 4 + 1 + 4 + 1 = 10. {a, b}: GIFT 1 + .25 + 4 + 1 = 6.25, whole sqrt(1.6), selected
    sqrt(5 / 1.25) = 2; {a, tok_emb}: 1 + 1 + 2.56 + 1 = 5.56, whole sqrt(10 / 5.56), selected sqrt(8 / 3.56);
    all three: bytes 0.28 > 0.27, out of the budget. Ceilings: a or the embeddings left Euclidean, sqrt(10 / 5);
    b, sqrt(10 / 2); none, sqrt(10 / 1)."""
    import math

    from benchmarks.comm_bytes import layer_set_frontier

    cfg, caps = _frontier_caps()
    f = layer_set_frontier(caps, cfg, ("a", "b", "tok_emb"), lambda chosen: 0.25 + 0.01 * len(chosen),
                           max_bytes=0.27, min_selected=2.0, min_whole=1.3)
    assert f["n_subsets"] == 7 and f["n_feasible"] == 0 and f["feasible"] == []
    best = f["best_whole_with_selected_goal"]
    assert best["selected"] == ["a", "b"] and best["bytes_fraction"] == pytest.approx(0.27)
    assert best["rel_l2_ratio_vs_fp8"] == pytest.approx(math.sqrt(1.6))
    assert best["rel_l2_ratio_vs_fp8_selected"] == pytest.approx(2.0)
    conv = f["best_selected_with_whole_goal"]
    assert conv["selected"] == ["a", "tok_emb"]
    assert conv["rel_l2_ratio_vs_fp8"] == pytest.approx(math.sqrt(10 / 5.56))
    assert conv["rel_l2_ratio_vs_fp8_selected"] == pytest.approx(math.sqrt(8 / 3.56))
    c = f["whole_ceiling_without"]
    assert c["a"] == pytest.approx(math.sqrt(2)) and c["embeddings"] == pytest.approx(math.sqrt(2))
    assert c["b"] == pytest.approx(math.sqrt(5)) and f["whole_ceiling_all"] == pytest.approx(math.sqrt(10))
    # a looser whole-model goal makes {a, b} feasible, and it is the only subset that is
    loose = layer_set_frontier(caps, cfg, ("a", "b", "tok_emb"), lambda chosen: 0.25 + 0.01 * len(chosen), min_whole=1.2)
    assert [r["selected"] for r in loose["feasible"]] == [["a", "b"]]


def test_layer_set_frontier_refuses_unknown_layers_and_too_many():
    from benchmarks.comm_bytes import MAX_FRONTIER_LAYERS, layer_set_frontier

    cfg, caps = _frontier_caps()
    with pytest.raises(ValueError, match="'lm_head' is not in the captures"):
        layer_set_frontier(caps, cfg, ("a", "lm_head"), lambda chosen: 0.25)
    with pytest.raises(ValueError, match="2\\^n subsets"):
        layer_set_frontier(caps, cfg, [f"l{i}" for i in range(MAX_FRONTIER_LAYERS + 1)], lambda chosen: 0.25)
