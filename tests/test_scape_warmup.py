"""DGC-style sparsity warm-up (Lin et al., ICLR 2018, Sec. 3.3) and SCAPE's sparsity_warmup option."""

from __future__ import annotations

import os

import pytest
import torch

from lab.training.errors import OptimizerConfigError
from lab.training.optim import SCAPE, ScapeConfig
from lab.training.optim.warmup import dgc_warmup_sparsity, dgc_warmup_stages
from tests.gloo_support import run_ranks


def test_schedule_against_hand_computed_values():
    # target 99%, 400 warm-up steps: 4 stages of 100 steps at 1 - 4^-1, 1 - 4^-2, 1 - 4^-3, then min(1 - 4^-4, 0.99)
    assert dgc_warmup_stages(0.99) == 4 and dgc_warmup_stages(0.9) == 2 and dgc_warmup_stages(0.75) == 1
    got = {t: dgc_warmup_sparsity(t, 0.99, 400) for t in (1, 100, 101, 200, 201, 300, 301, 400, 401, 3000)}
    assert got == {1: 0.75, 100: 0.75, 101: 0.9375, 200: 0.9375, 201: 0.984375, 300: 0.984375,
                   301: 0.99, 400: 0.99, 401: 0.99, 3000: 0.99}
    # target 90%: 2 stages (75%, 90%); DGC's own 99.9% with 4 stages: 75, 93.75, 98.4375, 99.609375, then 99.9
    assert [dgc_warmup_sparsity(t, 0.9, 10) for t in range(1, 12)] == [0.75] * 5 + [0.9] * 6
    assert [dgc_warmup_sparsity(t, 0.999, 4, stages=4) for t in range(1, 6)] == [0.75, 0.9375, 0.984375, 0.99609375, 0.999]
    # a gentler factor and more stages than needed: the last ones sit at the target
    assert [dgc_warmup_sparsity(t, 0.75, 3, factor=0.5, stages=3) for t in (1, 2, 3, 4)] == [0.5, 0.75, 0.75, 0.75]
    assert dgc_warmup_sparsity(1, 0.99, 0) == 0.99  # no warm-up
    assert dgc_warmup_sparsity(1, 0.5, 100) == 0.5  # already below the first stage: the target


@pytest.mark.parametrize("kw, field", [(dict(step=0), "step"), (dict(target=1.0), "sparsity"),
                                       (dict(warmup_steps=-1), "sparsity_warmup"), (dict(factor=1.0), "sparsity_warmup_factor"),
                                       (dict(stages=0), "stages")])
def test_schedule_refuses_bad_arguments_by_name(kw, field):
    args = dict(step=1, target=0.99, warmup_steps=10, factor=0.25, stages=None) | kw
    with pytest.raises(OptimizerConfigError, match=field):
        dgc_warmup_sparsity(**args)


def _sizes_k(sizes, sparsity):
    return sum(max(1, min(n, round((1 - sparsity) * n))) for n in sizes)


def _params(sizes, seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n)) for n in sizes]


def test_scape_sends_the_warmup_schedules_k_each_step_and_resumes_bit_exactly():
    sizes = (700, 300)
    params = _params(sizes)
    opt = SCAPE(params, lr=0.01, sparsity=0.99, sparsity_warmup=8)
    assert opt.config.sparsity_warmup == 8 and opt.k == _sizes_k(sizes, 0.99)
    gen = torch.Generator().manual_seed(1)
    grads = [[torch.randn(n, generator=gen) for n in sizes] for _ in range(12)]
    for t, gs in enumerate(grads, start=1):
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
        s = opt.last_stats
        want = sum(sizes) if t == 1 else _sizes_k(sizes, dgc_warmup_sparsity(t, 0.99, 8))
        assert s.k == want and s.value_bytes == 4 * want, t  # step 1 is SCAPE's dense step
        if t > 1:  # the mask has each tensor's own k at this step's sparsity
            assert [int(opt.mask(p).sum()) for p in params] == [_sizes_k((n,), opt.sparsity_at(t)) for n in sizes]
    assert [h.k for h in opt.history][1:] == [250, 63, 63, 16, 16, 10, 10, 10, 10, 10, 10]
    # the same run stopped after 5 steps (mid warm-up) and resumed from its state dict
    params2 = _params(sizes)
    opt2 = SCAPE(params2, lr=0.01, sparsity=0.99, sparsity_warmup=8)
    for gs in grads[:5]:
        for p, g in zip(params2, gs):
            p.grad = g.clone()
        opt2.step()
    saved = opt2.state_dict()
    params3 = [torch.nn.Parameter(p.detach().clone()) for p in params2]
    opt3 = SCAPE(params3, lr=0.01, sparsity=0.99, sparsity_warmup=8)
    opt3.load_state_dict(saved)
    for gs in grads[5:]:
        for p, g in zip(params3, gs):
            p.grad = g.clone()
        opt3.step()
    assert all(torch.equal(a, b) for a, b in zip(params, params3))
    with pytest.raises(Exception, match="layout"):  # a checkpoint of another warm-up is refused
        SCAPE(_params(sizes), lr=0.01, sparsity=0.99, sparsity_warmup=4).load_state_dict(saved)
    # a mask reused for 4 steps is still rebuilt at each stage change (else it would keep the earlier stage's k)
    params4 = _params(sizes)
    opt4 = SCAPE(params4, lr=0.01, sparsity=0.99, sparsity_warmup=8, mask_refresh_interval=4)
    for t, gs in enumerate(grads, start=1):
        for p, g in zip(params4, gs):
            p.grad = g.clone()
        opt4.step()
    assert [h.k for h in opt4.history] == [h.k for h in opt.history]
    assert [t for t, h in enumerate(opt4.history, start=1) if h.mask_bytes] == [1, 2, 4, 5, 6, 9]  # every 4th (1, 5, 9) and before each stage (2, 4, 6)
    # off by default: the target from the first sparse step
    plain = SCAPE(_params(sizes), lr=0.01, sparsity=0.99)
    assert plain.sparsity_at(2) == 0.99 and plain._config() == {k: v for k, v in opt._config().items()
                                                                 if not k.startswith("sparsity_warmup")}


def test_scape_config_validates_the_warmup_options_by_name():
    assert ScapeConfig(sparsity_warmup=100).sparsity_warmup_factor == 0.25
    with pytest.raises(OptimizerConfigError, match="sparsity_warmup"):
        ScapeConfig.build(sparsity_warmup=-1)
    with pytest.raises(OptimizerConfigError, match="sparsity_warmup_factor"):
        ScapeConfig.build(sparsity_warmup=10, sparsity_warmup_factor=0.0)


def _worker(rank: int, world: int, outdir: str) -> None:
    sizes = (500, 300, 200)  # tensor scope: the owners' k differ, and change with the stage
    params = _params(sizes)
    opt = SCAPE(params, lr=0.01, sparsity=0.99, sparsity_warmup=6, mask_encoding="indices")
    gen = torch.Generator().manual_seed(10 + rank)  # each rank its own gradients
    for _ in range(9):
        for p, n in zip(params, sizes):
            p.grad = torch.randn(n, generator=gen)
        opt.step()
    opt.synchronize()
    torch.save({"params": [p.detach() for p in params], "k": [h.k for h in opt.history],
                "mask_bytes": [h.mask_bytes for h in opt.history]}, os.path.join(outdir, f"rank{rank}.pt"))


def test_two_rank_gloo_warmup_keeps_replicas_identical(tmp_path):
    run_ranks(_worker, 2, tmp_path)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert all(torch.equal(a, b) for a, b in zip(r0["params"], r1["params"]))
    sizes = (500, 300, 200)
    assert r0["k"] == [1000] + [_sizes_k(sizes, dgc_warmup_sparsity(t, 0.99, 6)) for t in range(2, 10)]
    assert r0["k"][1:5] == [250, 62, 16, 16] and r0["k"][-1] == 10  # 31 + 19 + 12 at 93.75%: round half to even
    # masks are re-synced at each stage change (indices padded to the largest owner's k of that stage)
    assert all(b > 0 for b in r0["mask_bytes"][:-1])
