"""Why a Euclidean low-precision codec does not hurt this training, and at what batch it would: the gradient
noise scale and each codec's added variance along the fair table's dense fp32 run.

    python -m benchmarks.comm --out FILE.json --part noise

Issue 23 item 3 asks for a regime where Euclidean low precision hurts. The fair table (``training_fair``)
finds none among E4M3, E5M2 and NVFP4 at 400 steps; this part says why in numbers
(:mod:`lab.training.noise_scale`). It trains the fair table's dense fp32 configuration (dense AdamS at its
beta1 and tuned rate, the training part's model, batch and schedule, the test plays held out) in one process,
emulating the ``W`` ranks of a DDP step exactly (each rank's batch of the step, their gradients averaged, as
fp32 all-reduce does). At each capture step, at the step's weights and before its update, it takes ``K``
extra minibatch gradients of one rank's batch size ``B`` (windows drawn by their own sampler seed) and
reports the simple noise scale ``B_simple`` and, per codec (each parameter tensor coded alone, as the hooks
send it), its relative error ``e``, its variance over the sampling variance ``rho = e^2 (1 + B / B_simple)``,
the effective batch fraction ``1 / (1 + rho)``, the batch ``B*`` at which its noise would equal the
sampling noise, and the noise-scale model's bound on the steps it costs at any batch, ``1 + e^2``.

JSON (``noise``): ``protocol`` (model, ``batch_size`` B, ``ranks``, ``n_batches`` K, ``lr``, ``steps``,
``capture_steps``, codecs, source of the configuration), ``by_step`` (step -> ``loss``, ``b_simple``,
``grad_sq``, ``sampling_var``, ``trace_sigma``, ``codecs``: name -> ``rel_error``, ``codec_var``,
``ratio_to_sampling``, ``effective_batch_fraction``, ``batch_where_equal``, ``steps_factor``), ``summary`` (per
codec: the largest ``ratio_to_sampling`` and ``steps_factor``, the smallest ``batch_where_equal`` over the
captures) and ``wall_s``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from lab.training.noise_scale import codec_noise, noise_scale

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "benchmarks" / "results" / "comm.json"
CODECS = ("bf16", "fp8_e4m3", "fp8_e5m2", "nvfp4")
CAPTURE_STEPS = (1, 20, 50, 100, 200, 400)
N_BATCHES = 32
PROBE_SEED = 7919  # the extra windows' sampler seed (no training step draws from it)


def _fp32_setting(path: Path) -> tuple[float, dict, str]:
    """The fair table's fp32 rate and dense AdamS keywords, and where they came from."""
    from benchmarks.comm_fair import configurations

    if not path.is_file():
        raise FileNotFoundError(f"{path}: run `python -m benchmarks.comm --part training_fair` first (its fp32 rate is the input)")
    fair = json.loads(path.read_text()).get("training_fair")
    if not fair:
        raise KeyError(f"{path} has no training_fair block: run `python -m benchmarks.comm --part training_fair` first")
    lr = float(fair["methods"]["fp32"]["tuning"]["best_lr"])
    kw = configurations(path)["fp32"]["optimizer_kwargs"]
    return lr, kw, f"{path.name} training_fair.methods.fp32 (lr {lr:.3g}) and its optimizer_kwargs"


def run_noise(settings=None, *, committed: Path = COMMITTED, capture_steps=CAPTURE_STEPS, n_batches: int = N_BATCHES,
              codecs=CODECS) -> dict:
    """The ``noise`` block (see the module docstring)."""
    from benchmarks.comm import FULL, _train_config
    from lab.training.comm.codecs import get_codec
    from lab.training.data import TEST_PLAYS, BatchSampler, TextCorpus
    from lab.training.model import GPT
    from lab.training.run import _make_optimizer, lr_at

    s = settings or FULL
    t0 = time.perf_counter()
    if s.quick:
        lr, kw, source = 3e-3, {}, "quick settings"
        capture_steps = tuple(c for c in capture_steps if c <= s.train_steps) or (s.train_steps,)
    else:
        lr, kw, source = _fp32_setting(committed)
    cfg = _train_config(s, Path("/nonexistent"), "noise", lr, optimizer="adams", optimizer_kwargs=kw,
                        test_plays=list(TEST_PLAYS))
    corpus = TextCorpus(cfg.val_plays, test_plays=cfg.test_plays)
    model_cfg = cfg.model.model_copy(update={"vocab_size": corpus.tokenizer.vocab_size})
    w, b = s.nproc, cfg.batch_size
    sampler = BatchSampler(len(corpus.train_tokens), model_cfg.block_size, b, w, cfg.seed)
    probe = BatchSampler(len(corpus.train_tokens), model_cfg.block_size, b, 1, PROBE_SEED)
    tokens = corpus.train_tokens
    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg)
    model.train()
    opt = _make_optimizer(cfg, model)
    coders = {c: get_codec(c) for c in codecs}
    names = [n for n, _ in model.named_parameters()]

    def grads() -> dict[str, torch.Tensor]:
        return {n: p.grad.detach().to(torch.float32).clone() for n, p in model.named_parameters()}

    def coded(name: str):
        codec = coders[name]
        return lambda g: {n: codec.decode(codec.encode(t.contiguous()), t.numel()).view(t.shape) for n, t in g.items()}

    captures = sorted(set(capture_steps))
    by_step: dict[str, dict] = {}
    for step in tqdm(range(1, max(captures) + 1), desc="noise-scale run", unit="step"):
        lr_s = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr_s
        if step in captures:  # the extra minibatch gradients at this step's weights
            sample = []
            for i in range(n_batches):
                model.zero_grad(set_to_none=True)
                x, y = probe.batch(tokens, step * n_batches + i, 0)
                model(x, y)[1].backward()
                sample.append(grads())
            model.zero_grad(set_to_none=True)
            ns = noise_scale(sample, b)
            by_step[str(step)] = {**dataclasses.asdict(ns), "lr": lr_s,
                                  "codecs": {c: dataclasses.asdict(codec_noise(sample, coded(c), ns)) for c in codecs}}
        loss_sum = 0.0
        for r in range(w):  # the W ranks' batches, averaged as the fp32 all-reduce averages them
            x, y = sampler.batch(tokens, step, r)
            loss = model(x, y)[1] / w
            loss.backward()
            loss_sum += float(loss.detach())
        if step in captures:
            by_step[str(step)]["loss"] = loss_sum
        opt.step()
        opt.zero_grad(set_to_none=True)
    summary = {c: {"max_ratio_to_sampling": max(v["codecs"][c]["ratio_to_sampling"] for v in by_step.values()),
                   "min_effective_batch_fraction": min(v["codecs"][c]["effective_batch_fraction"] for v in by_step.values()),
                   "min_batch_where_equal": min(v["codecs"][c]["batch_where_equal"] for v in by_step.values()),
                   "max_steps_factor": max(v["codecs"][c]["steps_factor"] for v in by_step.values()),
                   "rel_error_range": [min(v["codecs"][c]["rel_error"] for v in by_step.values()),
                                       max(v["codecs"][c]["rel_error"] for v in by_step.values())]}
               for c in codecs}
    finite = [v["b_simple"] for v in by_step.values() if math.isfinite(v["b_simple"])]
    return {
        "protocol": {"model": s.train_model, "batch_size": b, "ranks": w, "n_batches": n_batches, "lr": lr,
                     "optimizer_kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
                     "steps": max(captures), "capture_steps": captures, "codecs": list(codecs), "source": source,
                     "probe_seed": PROBE_SEED, "n_params": sum(p.numel() for p in model.parameters()), "parameters": len(names),
                     "unit": "examples are windows of block_size + 1 tokens; variances in squared gradient units"},
        "by_step": by_step,
        "summary": summary,
        "b_simple_range": [min(finite), max(finite)] if finite else None,
        "wall_s": time.perf_counter() - t0,
    }
