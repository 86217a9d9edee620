"""The sampler: each primitive of a training step timed alone, forward and backward apart, over a shape sweep.

Zhang et al., arXiv 2509.22832, Sec. III-B: every operator is micro-benchmarked in isolation over a sweep
of the shapes real models give it, forward and backward recorded separately, and the regressors
(:mod:`.regress`) interpolate between the sampled shapes. Here the shapes come from a sweep of *model
configurations* (:func:`sample_configs`: hidden size, heads, sequence, micro-batch, vocabulary, TP degree
drawn from grids that exclude the benchmark's validation values), each decomposed by
:func:`.operators.decompose`; every distinct (kind, shape) is timed once.

Timing (:func:`time_call`): on CPU ``time.perf_counter`` around each call (the wall time a step sees,
dispatcher overhead included); on CUDA, CUDA events with a synchronize. Warm-up calls first, then at
least ``min_repeats`` calls and about ``target_s`` seconds; the sample is the median. Forward is timed
with autograd recording (as in training); backward is one ``torch.autograd.backward`` over the retained
graph into preallocated parameter gradients (the measured runs' gradient buffers accumulate in place).
Each backward call pays the autograd engine's fixed start cost once; the sampler measures it
(:func:`engine_overhead`) and stores it so the model can charge it once per stage backward instead of
once per operator.

Run in its own process (``python -m lab.training.perfmodel.profile --out FILE``), apart from the
validation runs of :mod:`.parallel`; the output is a JSON file (:func:`load_samples`).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from lab.training.perfmodel import primitives as P
from lab.training.perfmodel.config import PerfConfig
from lab.training.perfmodel.operators import Operator, decompose
from lab.training.perfmodel.parallel import StageModule, _flat_grads, make_optimizer

__all__ = ["features_of", "sample_configs", "time_call", "engine_overhead", "profile_configs", "load_samples",
           "DTYPES", "SAMPLE_GRID"]

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: The sampler's sweep. The benchmark's validation configurations use d in {64, 128, 192, 256},
#: s in {32, 64, 128} and V = 512, none of which is here: every validation shape is interpolated.
SAMPLE_GRID = {"d_model": [48, 80, 112, 144, 176, 208, 240, 288], "seq_len": [24, 40, 56, 80, 112, 160, 208],
               "micro_batch": [1, 2, 3, 4], "vocab_size": [256, 768], "tp": [1, 2], "head_dim": [16, 32]}


def features_of(op: Operator, cfg: PerfConfig) -> tuple[str, dict[str, float]] | None:
    """The primitive kind and shape features that time ``op`` of ``decompose(cfg)``; None for collectives.

    Returns
    -------
    (kind, features) or None
        ``kind`` from :data:`.primitives.KIND_OF`; ``features`` the shape dimensions (ints) of that kind:
        linear ``N, k, n, bias``; attention ``b, s, h_local, d_head``; layernorm / residual ``N, d``;
        gelu ``N, n``; embedding ``N, v_local, d, tp``; position_embedding ``b, s, d``; cross_entropy
        ``N, v_local, tp``; optimizer_step ``n_params, n_tensors, stage_kind`` (0 only, 1 first, 2 middle,
        3 last).

    Raises
    ------
    KeyError
        An operator name with no primitive (``rope`` is not in the measured GPT).
    """
    if op.is_collective:
        return None
    kind = P.KIND_OF[op.name]
    b, s, d, t, f = cfg.micro_batch, cfg.seq_len, cfg.d_model, cfg.tp, cfg.ffn_mult
    N, vl = b * s, cfg.padded_vocab // t
    bias = int(cfg.bias)
    if kind == "linear":
        k, n, bb = {"qkv_linear": (d, 3 * d // t, bias), "attn_out_linear": (d // t, d, bias),
                    "ffn_up_linear": (d, f * d // t, bias), "ffn_down_linear": (f * d // t, d, bias),
                    "vocab_linear": (d, vl, 0)}[op.name]
        return kind, {"N": N, "k": k, "n": n, "bias": bb}
    if kind == "attention":
        return kind, {"b": b, "s": s, "h_local": cfg.n_head // t, "d_head": d // cfg.n_head}
    if kind in ("layernorm", "residual"):
        return kind, {"N": N, "d": d}
    if kind == "gelu":
        return kind, {"N": N, "n": f * d // t}
    if kind == "embedding":
        return kind, {"N": N, "v_local": vl, "d": d, "tp": t}
    if kind == "position_embedding":
        return kind, {"b": b, "s": s, "d": d}
    if kind == "cross_entropy":
        return kind, {"N": N, "v_local": vl, "tp": t}
    # optimizer_step: count the stage's tensors as StageModule holds them on TP rank 0
    mod = _stage_shapes(cfg, op.stage)
    sk = 0 if cfg.pp == 1 else (1 if op.stage == 0 else (3 if op.stage == cfg.pp - 1 else 2))
    return kind, {"n_params": sum(mod), "n_tensors": len(mod), "stage_kind": sk}


def _stage_shapes(cfg: PerfConfig, stage: int) -> list[int]:
    with torch.device("meta"):
        mod = StageModule(cfg, stage, 0, None)
    return [p.numel() for p in mod.parameters()]


def sample_configs(n: int, seed: int = 0, grid: dict | None = None) -> list[PerfConfig]:
    """``n`` distinct model configurations drawn from ``grid`` (default :data:`SAMPLE_GRID`), pp 1.

    A few are drawn again with ``pp = 2`` so the optimizer step is sampled on first and last stages.
    """
    g = grid or SAMPLE_GRID
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        d, hd, t = rng.choice(g["d_model"]), rng.choice(g["head_dim"]), rng.choice(g["tp"])
        if d % hd or (d // hd) % t:
            continue
        key = (d, hd, t, rng.choice(g["seq_len"]), rng.choice(g["micro_batch"]), rng.choice(g["vocab_size"]),
               rng.choice([1, 1, 2]), rng.choice([1, 2, 3]))
        if key in seen:
            continue
        seen.add(key)
        d, hd, t, s, b, V, pp, L = key
        out.append(PerfConfig(n_layer=max(L, pp), d_model=d, n_head=d // hd, seq_len=s, vocab_size=V,
                              micro_batch=b, tp=t, pp=pp))
    return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, *, warmup: int = 2, min_repeats: int = 5, target_s: float = 0.05,
              max_repeats: int = 50, before=None) -> list[float]:
    """Seconds of each timed call of ``fn()`` (``before()`` runs untimed before each call).

    Returns
    -------
    list of float
        At least ``min_repeats`` times; more until about ``target_s`` seconds were spent (``max_repeats``).
    """
    for _ in range(warmup):
        if before:
            before()
        fn()
    _sync(device)
    times: list[float] = []
    while len(times) < min_repeats or (sum(times) < target_s and len(times) < max_repeats):
        if before:
            before()
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def engine_overhead(device: torch.device, repeats: int = 200) -> float:
    """Median seconds of one ``backward`` call through a one-node graph (the autograd engine's fixed cost)."""
    x = torch.zeros(1, device=device, requires_grad=True)
    y = x * 2.0
    g = torch.ones(1, device=device)
    return statistics.median(time_call(lambda: y.backward(g, retain_graph=True), device, warmup=10,
                                       min_repeats=repeats, target_s=0.0))


def _leaf(*shape, dtype, device, grad=True):
    t = torch.randn(*shape, dtype=dtype, device=device)
    return t.requires_grad_(grad)


def _case(kind: str, f: dict, dtype, device):
    """``(forward, params, inputs)``: a closure running the primitive on fresh leaves of shape ``f``."""
    L = lambda *s, grad=True: _leaf(*s, dtype=dtype, device=device, grad=grad)  # noqa: E731
    if kind == "linear":
        x, w = L(f["N"], f["k"]), L(f["n"], f["k"])
        bb = L(f["n"]) if f["bias"] else None
        return (lambda: P.linear(x, w, bb)), [w] + ([bb] if bb is not None else []), [x]
    if kind == "attention":
        c = f["h_local"] * f["d_head"]
        x = L(f["b"], f["s"], 3 * c)
        return (lambda: P.attention(x, f["h_local"])), [], [x]
    if kind == "layernorm":
        x, w, bb = L(f["N"], f["d"]), L(f["d"]), L(f["d"])
        return (lambda: P.layernorm(x, w, bb)), [w, bb], [x]
    if kind == "gelu":
        x = L(f["N"], f["n"])
        return (lambda: P.gelu(x)), [], [x]
    if kind == "residual":
        x, y = L(f["N"], f["d"]), L(f["N"], f["d"])
        return (lambda: P.residual(x, y)), [], [x, y]
    if kind == "embedding":
        vfull = f["v_local"] * f["tp"]
        idx = torch.randint(0, vfull, (1, f["N"]), device=device)
        w = L(f["v_local"], f["d"])
        return (lambda: P.embedding(idx, w, 0, f["tp"])), [w], []
    if kind == "position_embedding":
        tok, w = L(f["b"], f["s"], f["d"]), L(f["s"], f["d"])
        return (lambda: P.position_embedding(tok, w)), [w], [tok]
    if kind == "cross_entropy":
        vfull = f["v_local"] * f["tp"]
        x = L(f["N"], f["v_local"])
        tgt = torch.randint(0, vfull, (f["N"],), device=device)
        return (lambda: P.cross_entropy(x, tgt, 0, f["tp"], None)), [], [x]
    raise KeyError(kind)


def _time_compute(kind, f, dtype, device, opts) -> dict[str, list[float]]:
    fwd, params, inputs = _case(kind, f, dtype, device)
    for p in params:
        p.grad = torch.zeros_like(p)
    fwd_t = time_call(fwd, device, **opts)
    out = fwd()
    g = torch.ones((), dtype=out.dtype, device=device) if out.dim() == 0 else torch.randn_like(out)

    def clear():
        for x in inputs:
            x.grad = None
    bwd_t = time_call(lambda: out.backward(g, retain_graph=True), device, before=clear, **opts)
    return {"fwd": fwd_t, "bwd": bwd_t}


def _time_optimizer(cfg: PerfConfig, stage: int, dtype, device, opts) -> list[float]:
    mod = StageModule(cfg, stage, 0, None, dtype).to(device)
    buf = _flat_grads(mod)
    buf.normal_()
    opt = make_optimizer(list(mod.parameters()))

    def step():
        opt.step()
        buf.zero_()
    return time_call(step, device, **opts)


def profile_configs(configs: list[PerfConfig], *, device: str | torch.device = "cpu", precision: str = "fp32",
                    progress: bool = True, **time_opts) -> dict:
    """Time every distinct (kind, shape) of ``configs``.

    Parameters
    ----------
    configs : list of PerfConfig
        Their ``precision`` is replaced by ``precision``.
    device : str or torch.device
    precision : str
    progress : bool
        tqdm bar over the configurations.
    **time_opts
        :func:`time_call`'s ``warmup``, ``min_repeats``, ``target_s``.

    Returns
    -------
    dict
        ``{"device", "host", "torch", "precision", "engine_overhead_s", "samples": [...]}``; each sample
        ``{"kind", "direction", "features", "flops", "bytes", "time_s" (median), "times_s"}``.
    """
    from tqdm import tqdm

    device = torch.device(device)
    dtype = DTYPES[precision]
    opts = {"warmup": 2, "min_repeats": 5, "target_s": 0.04} | time_opts
    torch.manual_seed(0)
    done: set = set()
    samples = []
    it = tqdm(configs, desc="profiling primitives", disable=not progress)
    for cfg in it:
        cfg = cfg.model_copy(update={"precision": precision})
        for op in decompose(cfg):
            kf = features_of(op, cfg)
            if kf is None:
                continue
            kind, f = kf
            key = (kind, tuple(sorted(f.items())))
            if key in done:
                continue
            done.add(key)
            if kind == "optimizer_step":
                times = {"fwd": _time_optimizer(cfg, op.stage, dtype, device, opts)}
            else:
                times = _time_compute(kind, f, dtype, device, opts)
            for direction, ts in times.items():
                samples.append({"kind": kind, "direction": direction, "features": f,
                                "flops": op.fwd_flops if direction == "fwd" else op.bwd_flops,
                                "bytes": op.fwd_bytes if direction == "fwd" else op.bwd_bytes,
                                "time_s": statistics.median(ts), "times_s": ts})
    return {"device": str(device), "host": platform.node(), "torch": torch.__version__, "precision": precision,
            "threads": torch.get_num_threads(), "engine_overhead_s": engine_overhead(device), "samples": samples}


def load_samples(path: str | Path) -> dict:
    """Read a sampler output file (:func:`profile_configs`'s dict)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Profile the GPT step's primitives over a shape sweep.")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--configs", type=int, default=60, help="model configurations drawn from SAMPLE_GRID")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = profile_configs(sample_configs(a.configs, a.seed), device=a.device, precision=a.precision)
    res["sample_seed"] = a.seed
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res), encoding="utf-8")
    tmp.replace(a.out)
    print(f"{len(res['samples'])} samples -> {a.out}")


if __name__ == "__main__":
    main()
