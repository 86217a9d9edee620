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
    for run, (hook_name, kw) in {"gift": ("gift_fp8", _GIFT), "bf16": ("bf16", {})}.items():
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
                    "factor_bits": [w.to_flat() for w in getattr(state, "whitening", {}).values()]}
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))


@pytest.mark.slow  # ~6 s: two processes, two short DDP trainings
def test_two_rank_gift_low_rank_factors_bit_identical_replicas_and_exact_side_bytes(tmp_path):
    run_ranks(_worker, 2, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for run in ("gift", "bf16"):
        for a, b in zip(r0[run]["params"], r1[run]["params"]):
            assert torch.equal(a, b), run  # replicas bit-identical
    for a, b in zip(r0["gift"]["factor_bits"], r1["gift"]["factor_bits"]):
        assert torch.equal(a, b)  # rank 0's factors, broadcast: the same bits on both ranks
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
