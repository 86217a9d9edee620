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

:class:`Calibration` is the in-situ correction: an operator timed alone runs faster than the same operator
inside a training step (its weights and inputs stay in cache, the allocator hands back the block the last
call freed instead of fresh pages, the other rank on the machine does not compete for cache and memory
bandwidth), and a shared machine's speed drifts between the sampler's session and the runs'. Real steps
of a few *calibration* configurations, drawn from the sampler's grid and never from the validation set
and measured in the validation runs' session, give per number of ranks sharing the machine a multiplier
for the optimizer update and, for forward and backward, a multiplier or a multiplier plus seconds per
operator call (whichever predicts the calibration runs better, leave one out). The tensor-parallel
all-reduces get the same choice of forms and the pipeline sends seconds per send: inside a step each of
them also waits for the slower rank of its pair and for a rank woken from compute, which the
back-to-back curves of :mod:`.comm` do not see. The DP collectives keep their measured curves.
The calibration is not in Zhang et al.: their GPU kernels, timed in isolation (Sec. III-B), predict
the step within about 5 % without one. Without a calibration the predictor is their method as is.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import nnls

from lab.training.perfmodel.comm import CommModel
from lab.training.perfmodel.compose import StepPrediction, compose
from lab.training.perfmodel.config import PerfConfig
from lab.training.perfmodel.hardware import Hardware
from lab.training.perfmodel.operators import Operator, decompose
from lab.training.perfmodel.profile import features_of
from lab.training.perfmodel.regress import PrimitiveModel

__all__ = ["Calibration", "LearnedPredictor", "Placement", "compute_calls", "local_hardware", "one_rank_per_host",
           "placement_of", "single_tier", "tp_allreduce_s", "tp_calls"]

#: ``placement(op) -> tier`` of a collective operator.
Placement = Callable[[Operator], str]


def single_tier(tier: str = "loopback") -> Placement:
    """Every collective on one tier (all ranks in one namespace)."""
    return lambda op: tier


def one_rank_per_host(fast: str = "fast", slow: str = "slow") -> Placement:
    """Ranks ``r`` on host ``r`` (a :class:`lab.training.netns.ShapedNetwork` with one rank per host): any
    group of two or more ranks crosses the slow tier."""
    return lambda op: slow if op.group_size > 1 else fast


def placement_of(tier: str) -> Placement:
    """The placement of a run measured on ``tier``: every rank on loopback (``"loopback"``), or one rank per
    host of a :class:`lab.training.netns.ShapedNetwork`, every group crossing ``tier`` (``"slow"``)."""
    return single_tier("loopback") if tier == "loopback" else one_rank_per_host(slow=tier)


#: The measured components a calibration compares, and the keys each one gives: the compute directions
#: from runs without tensor parallelism (where a stage's forward and backward are compute only), the TP
#: all-reduce's from runs with it.
_CALIBRATED = {"stage_fwd_max": "fwd", "stage_bwd_max": "bwd", "update": "update"}
_CALIBRATED_TP = {"tp_allreduce": "tp_comm"}
#: Keys with a per-call offset (seconds per operator call) beside the multiplier.
_AFFINE = ("fwd", "bwd", "tp_comm")


def tp_allreduce_s(pred: StepPrediction, config: PerfConfig, wait_s: float = 0.0) -> float:
    """Seconds of TP all-reduce per step on the stage with the most (all micro-batches, both directions),
    less ``wait_s`` per call (pass the calibration's ``tp_wait_s`` to get the all-reduces alone, which is
    what the measured runs' ``tp_allreduce`` holds)."""
    by = pred.plan.by_operator
    t = max(sum(t for (st, name, _), t in by.items() if st == s and name.startswith("tp_allreduce"))
            for s in range(config.pp)) * config.n_micro_batches
    return t - wait_s * tp_calls(config) if wait_s else t


def tp_calls(config: PerfConfig, ops=None) -> int:
    """TP all-reduce calls per step (int) on the stage with the most: every micro-batch, each direction
    that moves bytes (the calls :meth:`LearnedPredictor.time_fn` adds ``tp_comm_op_s`` to). ``ops``:
    ``decompose(config)``, passed when already made."""
    ops = decompose(config) if ops is None else ops
    return max(sum(o.calls * ((o.fwd_bytes > 0) + (o.bwd_bytes > 0)) for o in ops
                   if o.stage == s and o.name.startswith("tp_allreduce")) for s in range(config.pp)) * config.n_micro_batches


def compute_calls(config: PerfConfig, ops=None) -> int:
    """Compute-operator calls per micro-batch (int) on the stage with the most; forward and backward make
    the same calls (each gets ``fwd_op_s`` / ``bwd_op_s``). ``ops``: ``decompose(config)``, when already made."""
    ops = decompose(config) if ops is None else ops
    return max(sum(o.calls for o in ops if o.stage == s and not o.is_collective and o.phase == "micro_batch")
               for s in range(config.pp))


def _multiplicative(rows):
    return statistics.median(m / p for p, _, m in rows), 0.0


def _affine(rows):
    """``(f, c) >= 0`` minimising the relative squared error of ``f * predicted + c * calls``."""
    a = np.array([[p / m, n / m] for p, n, m in rows])
    coef, _ = nnls(a, np.ones(len(rows)))
    return float(coef[0]), float(coef[1])


def _fit_key(rows, affine: bool) -> tuple[float, float, str, dict[str, float]]:
    """Fit one key's ``(multiplier, offset per call)``; the form (multiplicative, or affine where allowed and
    there are >= 3 runs) with the lower leave-one-out MAPE over ``rows`` wins, multiplicative on a tie."""
    forms = {"multiplicative": _multiplicative}
    if affine and len(rows) >= 3:
        forms["affine"] = _affine
    scores: dict[str, float] = {}
    if len(rows) >= 2:
        for name, fn in forms.items():
            errs = []
            for i, (p, n, m) in enumerate(rows):
                f, c = fn(rows[:i] + rows[i + 1:])
                errs.append(abs(f * p + c * n - m) / m * 100)
            scores[name] = float(np.mean(errs))
    best = min(scores, key=lambda k: (scores[k], k != "multiplicative")) if scores else "multiplicative"
    f, c = forms[best](rows)
    return f, c, best, scores


#: The additive waits (seconds per call), fitted per tier where a tier has calibration runs.
#: Solved in this order: DP-only runs first, so a TP or PP calibration run with ``dp > 1`` is solved with the
#: gradient-sync wait already in place (its residual is not charged twice).
_WAITS = ("dp_wait_s", "tp_wait_s", "pp_send_s")




def _solve_wait(bare: "LearnedPredictor", cal: "Calibration", cfg: PerfConfig, measured_s: float,
                key: str = "pp_send_s", tier: str = "loopback", hi: float = 0.01) -> float:
    """The seconds added to each call of ``key``'s collective (``"pp_send_s"``: each PP send, ``"tp_wait_s"``:
    each TP all-reduce, ``"dp_wait_s"``: each stage's gradient sync) on ``tier``, in ``[0, hi]``, whose calibrated
    step time is ``measured_s`` (bisection: the simulated step only grows with the calls' time); an end of the
    bracket when none inside reaches it. This is the step's whole residual after the calibration so far (waits for
    the other rank, bubbles the schedule does not see, imbalance), charged to those calls."""
    w = cfg.dp * cfg.tp * cfg.pp
    placement = placement_of(tier)

    def step(k: float) -> float:
        f = {ww: dict(v) for ww, v in cal.factors.items()}
        tf = {t: {ww: dict(v) for ww, v in per.items()} for t, per in cal.tier_factors.items()}
        (f if tier == "loopback" else tf.setdefault(tier, {})).setdefault(w, {})[key] = k
        c = Calibration(f, tier_factors=tf)
        return LearnedPredictor(bare.primitives, bare.comm, c).predict(cfg, placement).total_s

    lo, up = 0.0, hi
    if step(lo) >= measured_s:
        return lo
    if step(up) <= measured_s:
        return up
    for _ in range(40):
        mid = (lo + up) / 2
        lo, up = (mid, up) if step(mid) < measured_s else (lo, mid)
    return (lo + up) / 2


@dataclass(frozen=True)
class Calibration:
    """In-situ corrections of the predicted seconds, per ranks sharing the machine.

    ``factors[world]`` holds any of ``"fwd"``, ``"bwd"``, ``"update"``, ``"tp_comm"`` (multipliers) and
    ``"fwd_op_s"``, ``"bwd_op_s"``, ``"tp_comm_op_s"``, ``"tp_wait_s"``, ``"pp_send_s"``, ``"dp_wait_s"`` (seconds
    per call or sync): in a run of ``world`` ranks on this machine (dp x tp x pp; the shaped tiers' namespaces
    share the same cores) a forward operator's regressor time ``t`` becomes ``fwd * t + calls * fwd_op_s``, a
    backward one's likewise, the optimizer step's ``update * t``, a TP all-reduce's measured-curve time
    ``tp_comm * t + calls * (tp_comm_op_s + tp_wait_s)``, a PP send's ``t + calls * pp_send_s``, a stage's gradient
    all-reduce (all its buckets) ``t + dp_wait_s``. The three waits are not rates (the same on a slow link): the
    measured collectives are the last-arriving rank's (min over ranks), and the step also waits for the later
    rank; in fact each is whatever the TP, PP or DP calibration runs' steps leave unexplained. With
    ``overlap_grad_sync=True`` the gradient-sync wait is part of the all-reduce time that the composition overlaps
    with the backward. A key missing at ``world`` comes from the largest calibrated world below it that has it
    (none: multiplier 1, offset 0): a run of 8 ranks takes the 2-rank corrections, on any tier, which nothing here
    measured. ``forms[world][key]`` says which form was fitted and ``loo_mape[world][key]`` each form's
    leave-one-out error over the calibration runs (%), which chose it. ``tier_factors[tier][world]`` holds the
    waits (``"tp_wait_s"``, ``"pp_send_s"``, ``"dp_wait_s"``) fitted on runs across a shaped ``tier`` (one rank
    per host): a collective on that tier takes them in place of the loopback ones.
    """

    factors: dict[int, dict[str, float]] = field(default_factory=dict)
    n_runs: dict[int, int] = field(default_factory=dict)
    forms: dict[int, dict[str, str]] = field(default_factory=dict)
    loo_mape: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    tier_factors: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)

    def factor(self, world: int, key: str, tier: str | None = None) -> float:
        """The value of ``key`` (see the class) at ``world`` ranks: a plain multiplier, or seconds for the
        keys ending in ``_s``; for a wait on ``tier``, that tier's value where it was fitted."""
        if tier is not None and key in _WAITS:
            per = self.tier_factors.get(tier, {})
            below = [w for w in per if w <= world and key in per[w]]
            if below:
                return per[max(below)][key]
        below = [w for w in self.factors if w <= world and key in self.factors[w]]
        return self.factors[max(below)][key] if below else (0.0 if key.endswith("_s") else 1.0)

    @classmethod
    def fit(cls, predictor: "LearnedPredictor", runs: Iterable[tuple[PerfConfig, dict]]) -> "Calibration":
        """Fit every key per world from ``runs``: the update multiplicatively (median ratio measured /
        predicted), forward, backward and the TP all-reduce in the form that wins leave-one-out, then the
        waits: per run with ``dp > 1`` (``tp == pp == 1``) the seconds per gradient sync, then per run with
        ``tp > 1`` (and ``pp == 1``) the seconds per TP all-reduce, then per run with ``pp > 1`` the seconds per send,
        each in ``[0, 10 ms]`` and making the calibrated step its measured step (bisection; a run no value in the
        bracket fits gets the bracket's end), the median over runs. A run with ``tp > 1`` gives only the TP keys,
        one with ``pp > 1`` only the PP key. Runs across a shaped tier give only that tier's waits, solved last
        (on top of everything loopback gave).

        Parameters
        ----------
        predictor : LearnedPredictor
            Uncalibrated (its own calibration is ignored).
        runs : iterable of (PerfConfig, dict) or (PerfConfig, dict, str)
            Each configuration with its measured components (seconds) and its tier (default
            ``"loopback"``; another tier: one rank per host across it, and ``overall`` is all it needs):
            ``stage_fwd_max``, ``stage_bwd_max`` and ``update`` where ``tp == pp == 1`` (and ``overall``
            where also ``dp > 1``), ``tp_allreduce`` and ``overall`` where ``tp > 1``, ``overall`` where
            ``pp > 1``
            (:func:`benchmarks.perfmodel._summarise_run`'s keys).

        Raises
        ------
        ValueError
            A run lacks one of those components or has one that is not a positive finite number, or is
            a ZeRO-1 run (its update holds an all-gather the update multiplier would absorb); the message
            names the configuration and the component.
        """
        bare = LearnedPredictor(predictor.primitives, predictor.comm)
        rows: dict[int, dict[str, list[tuple[float, int, float]]]] = {}
        n_runs: dict[int, int] = {}
        runs = [(cfg, m, tier[0] if tier else "loopback") for cfg, m, *tier in runs]
        shaped = [r for r in runs if r[2] != "loopback"]
        runs = [(cfg, m) for cfg, m, tier in runs if tier == "loopback"]
        for cfg, _ in runs + [(c, m) for c, m, _ in shaped]:
            if cfg.zero1:
                raise ValueError(f"calibration run {cfg.model_dump(mode='json')}: zero1 = True; calibrate on "
                                 "runs without ZeRO-1 (the update multiplier is for the optimizer step alone)")
        for cfg, measured in runs:
            if cfg.pp > 1:
                continue
            ops = decompose(cfg)
            pred = bare.predict(cfg)
            world = cfg.dp * cfg.tp * cfg.pp
            if cfg.tp > 1:
                comps, got = _CALIBRATED_TP, {"tp_allreduce": tp_allreduce_s(pred, cfg)}
            else:
                comps = _CALIBRATED
                got = {"stage_fwd_max": pred.max_fwd_s, "stage_bwd_max": pred.max_bwd_s, "update": pred.update_s}
            per = rows.setdefault(world, {})
            for comp, key in comps.items():
                m = measured.get(comp)
                if not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
                    raise ValueError(f"calibration run {cfg.model_dump(mode='json')}: measured {comp} = {m!r}, "
                                     "not a positive number of seconds")
                calls = tp_calls(cfg, ops) if key == "tp_comm" else compute_calls(cfg, ops)
                per.setdefault(key, []).append((got[comp], calls, float(m)))
            n_runs[world] = n_runs.get(world, 0) + 1
        factors: dict[int, dict[str, float]] = {}
        forms: dict[int, dict[str, str]] = {}
        loo: dict[int, dict[str, dict[str, float]]] = {}
        for w, per in rows.items():
            factors[w], forms[w], loo[w] = {}, {}, {}
            for key, r in per.items():
                f, c, form, scores = _fit_key(r, key in _AFFINE)
                factors[w][key] = f
                if key in _AFFINE:
                    factors[w][f"{key}_op_s"] = c
                forms[w][key], loo[w][key] = form, scores
        # then the waits, each run's seconds per call making its calibrated step (compute and TP all-reduce
        # as fitted above) its measured step, the median over runs per world: DP runs' per gradient sync
        # (the wait for the later rank, once per step at the sync), then TP runs' per TP all-reduce (the
        # critical path waits for the later rank at every call, which the last-arriving rank's all-reduce
        # time leaves out), then PP runs' per PP send (with the other waits in place)
        tier_factors: dict[str, dict[int, dict[str, float]]] = {}
        tiers = ["loopback"] + sorted({t for _, _, t in shaped})
        for tier in tiers:
            group_runs = runs if tier == "loopback" else [(c, m) for c, m, t in shaped if t == tier]
            for key in _WAITS:
                ks: dict[int, list[float]] = {}
                for cfg, measured in group_runs:
                    if not {"pp_send_s": cfg.pp > 1, "tp_wait_s": cfg.tp > 1 and cfg.pp == 1,
                            "dp_wait_s": cfg.dp > 1 and cfg.tp == 1 and cfg.pp == 1}[key]:
                        continue
                    m = measured.get("overall")
                    if not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
                        raise ValueError(f"calibration run {cfg.model_dump(mode='json')} ({tier}): measured "
                                         f"overall = {m!r}, not a positive number of seconds")
                    world = cfg.dp * cfg.tp * cfg.pp
                    cal = cls(factors, tier_factors=tier_factors)
                    ks.setdefault(world, []).append(_solve_wait(bare, cal, cfg, float(m), key, tier))
                    if key == "pp_send_s" or tier != "loopback":  # the loopback TP and DP runs counted above
                        n_runs[world] = n_runs.get(world, 0) + 1
                for w, k in ks.items():
                    dest = factors if tier == "loopback" else tier_factors.setdefault(tier, {})
                    dest.setdefault(w, {})[key] = statistics.median(k)
                    if tier == "loopback":
                        forms.setdefault(w, {})[key] = "additive"
        return cls(factors, n_runs, forms, loo, tier_factors)

    def to_json(self) -> dict:
        """Plain JSON types (world keys as strings), the inverse of :meth:`from_json`."""
        return {"factors": {str(w): f for w, f in self.factors.items()},
                "n_runs": {str(w): n for w, n in self.n_runs.items()},
                "forms": {str(w): f for w, f in self.forms.items()},
                "loo_mape": {str(w): f for w, f in self.loo_mape.items()},
                "tier_factors": {t: {str(w): f for w, f in per.items()} for t, per in self.tier_factors.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        """From :meth:`to_json`'s dict (``forms``, ``loo_mape``, ``n_runs`` and ``tier_factors`` optional).

        Raises
        ------
        KeyError
            ``d`` has no ``"factors"``.
        """
        return cls({int(w): dict(f) for w, f in d["factors"].items()},
                   {int(w): n for w, n in d.get("n_runs", {}).items()},
                   {int(w): dict(f) for w, f in d.get("forms", {}).items()},
                   {int(w): {k: dict(v) for k, v in f.items()} for w, f in d.get("loo_mape", {}).items()},
                   {t: {int(w): dict(f) for w, f in per.items()} for t, per in d.get("tier_factors", {}).items()})


class LearnedPredictor:
    """Step time from the fitted primitives and the measured collectives.

    Parameters
    ----------
    primitives : PrimitiveModel
    comm : CommModel
    calibration : Calibration, optional
        In-situ corrections: multipliers and per-call seconds of the compute operators and the TP
        all-reduces, seconds per PP send (default none: the regressors' isolated times and the
        collectives' back-to-back curves).
    """

    def __init__(self, primitives: PrimitiveModel, comm: CommModel, calibration: Calibration | None = None):
        self.primitives, self.comm, self.calibration = primitives, comm, calibration

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
        world = config.dp * config.tp * config.pp
        cal = self.calibration if self.calibration is not None else Calibration()  # none: factors 1, offsets 0
        scale = {k: cal.factor(world, k) for k in ("fwd", "bwd", "update", "tp_comm", "fwd_op_s", "bwd_op_s",
                                                    "tp_comm_op_s")}

        def fn(op: Operator, direction: str) -> float:
            nbytes = op.fwd_bytes if direction == "fwd" else op.bwd_bytes
            if op.is_collective:
                tier = placement(op)
                t = op.calls * self.comm.time(op.collective, op.group_size, nbytes, tier)
                calls = op.calls if nbytes > 0 else 0  # a direction that moves nothing sends nothing
                if op.name.startswith("tp_allreduce"):
                    return t * scale["tp_comm"] + calls * (scale["tp_comm_op_s"] + cal.factor(world, "tp_wait_s", tier))
                if op.name == "pp_p2p":
                    return t + calls * cal.factor(world, "pp_send_s", tier)
                if op.name == "dp_allreduce" and calls:
                    return t + cal.factor(world, "dp_wait_s", tier)
                return t
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
            if op.phase != "micro_batch":
                return t * scale["update"]
            return t * scale[direction] + op.calls * scale[f"{direction}_op_s"]
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
