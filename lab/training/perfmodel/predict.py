"""The learned step-time predictor: fitted operator regressors + measured collectives, composed per schedule.

``LearnedPredictor(primitives, comm).predict(config, placement)`` decomposes ``config``
(:func:`.operators.decompose`), times every compute operator with its regressor
(:class:`.regress.PrimitiveModel`) and every collective with the measured curve of its tier
(:class:`.comm.CommModel`), and composes them with :func:`.compose.compose` (the event simulation of the
1F1B schedule by default; the paper's closed form with ``method="closed_form"``). The autograd engine's
fixed cost per backward call (measured by the sampler; each sampled backward is one call) is taken out of
every operator's backward and charged once per stage backward (on the stage's first operator).

:func:`local_hardware` describes this machine for the roofline baseline (:mod:`.roofline`): peak FLOP/s of a
large single-thread matmul, memory bandwidth of a large copy and the link from the measured send/recv
curve, each labelled ``measured`` — the roofline gets this machine's own best rates, not a datasheet's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from lab.training.perfmodel.comm import CommModel
from lab.training.perfmodel.compose import StepPrediction, compose
from lab.training.perfmodel.config import PerfConfig
from lab.training.perfmodel.hardware import Hardware
from lab.training.perfmodel.operators import Operator, decompose
from lab.training.perfmodel.profile import features_of
from lab.training.perfmodel.regress import PrimitiveModel

__all__ = ["LearnedPredictor", "Placement", "local_hardware", "single_tier", "one_rank_per_host"]

#: ``placement(op) -> tier`` of a collective operator.
Placement = Callable[[Operator], str]


def single_tier(tier: str = "loopback") -> Placement:
    """Every collective on one tier (all ranks in one namespace)."""
    return lambda op: tier


def one_rank_per_host(fast: str = "fast", slow: str = "slow") -> Placement:
    """Ranks ``r`` on host ``r`` (a :class:`lab.training.netns.ShapedNetwork` with one rank per host): any
    group of two or more ranks crosses the slow tier."""
    return lambda op: slow if op.group_size > 1 else fast


class LearnedPredictor:
    """Step time from the fitted primitives and the measured collectives.

    Parameters
    ----------
    primitives : PrimitiveModel
    comm : CommModel
    """

    def __init__(self, primitives: PrimitiveModel, comm: CommModel):
        self.primitives, self.comm = primitives, comm

    def _batch(self, config: PerfConfig, ops) -> dict:
        """Every compute operator's time, one regressor call per (kind, direction) (trees predict in batches)."""
        todo: dict = {}
        for op in ops:
            if op.is_collective:
                continue
            kind, feats = features_of(op, config)
            for direction in (("fwd", "bwd") if op.phase == "micro_batch" else ("fwd",)):
                flops = op.fwd_flops if direction == "fwd" else op.bwd_flops
                nbytes = op.fwd_bytes if direction == "fwd" else op.bwd_bytes
                key = (kind, direction, tuple(sorted(feats.items())), flops, nbytes)
                todo.setdefault((kind, direction), {})[key] = (feats, flops, nbytes)
        cache = {}
        for (kind, direction), items in todo.items():
            keys = list(items)
            times = self.primitives.predict_many(kind, direction, config.precision, [items[k] for k in keys])
            cache.update(zip(keys, times))
        return cache

    def time_fn(self, config: PerfConfig, placement: Placement | None = None, ops=None):
        """``time_fn(op, direction) -> seconds`` for :func:`.compose.compose` (memoised per operator shape;
        ``ops``, when given, are predicted up front in one batch per regressor)."""
        placement = placement or single_tier()
        cache: dict = self._batch(config, ops) if ops is not None else {}
        firsts: set = set()
        seen_stages: set = set()

        def fn(op: Operator, direction: str) -> float:
            nbytes = op.fwd_bytes if direction == "fwd" else op.bwd_bytes
            if op.is_collective:
                return op.calls * self.comm.time(op.collective, op.group_size, nbytes, placement(op))
            flops = op.fwd_flops if direction == "fwd" else op.bwd_flops
            kind, feats = features_of(op, config)
            key = (kind, direction, tuple(sorted(feats.items())), flops, nbytes)
            if key not in cache:
                cache[key] = self.primitives.predict(kind, direction, config.precision, feats, flops, nbytes)
            t = op.calls * cache[key]
            if direction == "bwd" and op.phase == "micro_batch":
                eo = self.primitives.engine_overhead_s
                if self.primitives.includes_engine_overhead:  # one call's fixed cost out of each operator
                    t = max(t - op.calls * eo, 0.1 * t)
                tag = (op.stage, op.name, op.layer)
                if op.stage not in seen_stages:
                    seen_stages.add(op.stage)
                    firsts.add(tag)
                if tag in firsts:
                    t += self.primitives.engine_overhead_s
            return t
        return fn

    def predict(self, config: PerfConfig, placement: Placement | None = None, **compose_kw) -> StepPrediction:
        """Predicted step of ``config``; ``compose_kw`` as :func:`.compose.compose` (default
        ``method="simulate"``, ``schedule="1f1b"``). The elapsed prediction time is in ``.prediction_s``."""
        t0 = time.perf_counter()
        kw = {"method": "simulate", "schedule": "1f1b"} | compose_kw
        ops = decompose(config)
        pred = compose(config, ops, self.time_fn(config, placement, ops), **kw)
        object.__setattr__(pred, "prediction_s", time.perf_counter() - t0)
        return pred


def _measured(value, unit, ref):
    return {"value": float(value), "unit": unit, "source": "measured", "ref": ref}


def local_hardware(comm: CommModel | None = None, *, tier: str = "loopback", world: int = 2,
                   gpus_per_node: int | None = None) -> Hardware:
    """This machine as a :class:`.hardware.Hardware` (one "GPU" = one single-threaded rank).

    Parameters
    ----------
    comm : CommModel, optional
        Its ``send_recv`` curve on ``tier`` gives the link (alpha = smallest message's time, beta from the
        alpha-beta fit); default a 1 GB/s, 50 us estimate.
    tier : str
    world : int
        Ranks per "node" (the node is this namespace, or one host of a ShapedNetwork with ``gpus_per_node=1``).
    gpus_per_node : int, optional
        Default ``world`` (all ranks on one node).
    """
    torch.manual_seed(0)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    best = min(_timeit(lambda: a @ b) for _ in range(5))
    peak = 2 * 1024**3 / best
    x = torch.empty(32 * 2**20 // 4)
    y = torch.empty_like(x)
    y.copy_(x)
    best_c = min(_timeit(lambda: y.copy_(x)) for _ in range(5))
    bw = 2 * x.numel() * 4 / best_c
    ref_p = f"torch.mm 1024x1024 fp32, {torch.get_num_threads()} thread(s), best of 5"
    alpha, beta, lref = 50e-6, 1e9, "estimate: no comm curve given"
    if comm is not None and ("send_recv", 2, tier) in comm.curves:
        curve = comm.curves[("send_recv", 2, tier)]
        alpha, beta = float(curve.times[0]), curve.alpha_beta()[1]
        lref = f"gloo send/recv on the {tier} tier, alpha = smallest message, beta = alpha-beta fit"
    link = {"bandwidth": _measured(beta, "B/s", lref), "latency": _measured(alpha, "s", lref)}
    peaks = {p: _measured(peak, "FLOP/s", ref_p) for p in ("fp32", "tf32", "bf16", "fp16")}
    return Hardware.model_validate({
        "name": "this machine (CPU, one thread per rank)", "system": "local",
        "gpus_per_node": gpus_per_node or world, "peak_flops": peaks,
        "memory_bandwidth": _measured(bw, "B/s", "Tensor.copy_ of 32 MiB fp32, read + write, best of 5"),
        "memory_capacity": _measured(float(2**34), "B", "nominal"),
        "links": {"intra_node": link, "inter_node": link}})


def _timeit(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
