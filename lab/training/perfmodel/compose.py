"""Composition of per-operator times into the time of one training step (pipeline schedule + syncs).

Source: Zhang et al., arXiv 2509.22832 (HiPC 2025), Sec. III-C, the runtime equation::

    T = (m - 1 + pp) x (max_s F_s + max_s B_s) + first-stage grad sync + max_s update_s

with ``F_s`` / ``B_s`` the forward / backward time of one micro-batch on stage ``s`` (compute, TP
all-reduces and the stage's PP sends), ``m`` micro-batches per step. The equation holds for both the
all-forward-all-backward (GPipe) and the non-interleaved 1F1B schedule (Narayanan et al. 2021, Sec. 2.2:
the same bubble ``(pp - 1)(F + B)``; 1F1B differs in activation memory, not in time) when the stages are
balanced; with unbalanced stages it is an upper bound (every slot charged the slowest stage), which
:func:`simulate_pipeline` replaces by the exact event schedule.

Gradient sync: the first stage finishes its last backward last, so its DP all-reduce is the one on the
critical path (the others hide behind it). Without overlap it is fully exposed. With overlap (``DDP``
bucketing, Li et al. 2020, Sec. 3.2.3), gradients are assumed to become ready uniformly over the last
micro-batch's backward ``B_0`` of stage 0, in ``k`` equal buckets each all-reduced as soon as it is ready,
one at a time; the exposed time after the backward ends is then exactly ``max(C / k, C - B_0 (k - 1) / k)``
for a total sync time ``C`` (compute-bound: only the last bucket shows; communication-bound: the sync
starts after the first bucket and runs back to back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from lab.training.perfmodel.config import PerfConfig
from lab.training.perfmodel.operators import Operator

__all__ = ["Schedule", "StagePlan", "StepPrediction", "stage_times", "exposed_grad_sync", "compose",
           "pipeline_order", "simulate_pipeline", "Slot"]

Schedule = Literal["1f1b", "afab"]
#: ``time_fn(op, direction) -> seconds`` for one call sequence of an operator (all its ``calls``).
TimeFn = Callable[[Operator, str], float]


@dataclass(frozen=True)
class StagePlan:
    """Per-stage times in seconds (index = stage).

    Attributes
    ----------
    fwd, bwd : list of float
        One micro-batch's forward / backward on each stage (compute + TP collectives + PP send).
    grad_sync : list of float
        Each stage's DP gradient all-reduce (0 without DP).
    grad_buckets : list of int
        Buckets (all-reduce calls) of each stage's gradient sync.
    update : list of float
        Each stage's optimizer step (+ ZeRO-1 all-gather).
    by_operator : dict
        ``(stage, name, direction) -> seconds`` summed over layers, per micro-batch for
        ``micro_batch`` operators (the stacked-bar breakdown).
    """

    fwd: list[float]
    bwd: list[float]
    grad_sync: list[float]
    grad_buckets: list[int]
    update: list[float]
    by_operator: dict = field(default_factory=dict)


def stage_times(ops: Sequence[Operator], time_fn: TimeFn, pp: int) -> StagePlan:
    """Sum operator times per stage and phase.

    Parameters
    ----------
    ops : sequence of Operator
        From :func:`lab.training.perfmodel.operators.decompose`.
    time_fn : callable
        ``time_fn(op, "fwd" | "bwd") -> seconds`` (``grad_sync`` / ``update`` operators are asked ``"fwd"``).
    pp : int
        Pipeline stages.
    """
    fwd, bwd, sync, upd, buckets = [0.0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp, [1] * pp
    by: dict = {}
    for op in ops:
        if op.phase == "micro_batch":
            for direction, acc in (("fwd", fwd), ("bwd", bwd)):
                t = float(time_fn(op, direction))
                acc[op.stage] += t
                key = (op.stage, op.name, direction)
                by[key] = by.get(key, 0.0) + t
        else:
            t = float(time_fn(op, "fwd"))
            (sync if op.phase == "grad_sync" else upd)[op.stage] += t
            if op.phase == "grad_sync":
                buckets[op.stage] = op.calls
            key = (op.stage, op.name, "fwd")
            by[key] = by.get(key, 0.0) + t
    return StagePlan(fwd, bwd, sync, buckets, upd, by)


def exposed_grad_sync(sync_s: float, last_bwd_s: float, n_buckets: int, overlap: bool) -> float:
    """Part of a stage's gradient all-reduce not hidden behind its last backward.

    Parameters
    ----------
    sync_s : float
        Total all-reduce time ``C`` of the stage's gradients (seconds).
    last_bwd_s : float
        Backward time ``B`` of the stage's last micro-batch (seconds).
    n_buckets : int
        Buckets ``k`` (>= 1).
    overlap : bool
        False: the sync starts after the backward, all of ``C`` is exposed.

    Returns
    -------
    float
        ``C`` without overlap, else ``max(C / k, C - B (k - 1) / k)`` (module docstring).
    """
    if not overlap or sync_s <= 0.0:
        return sync_s
    k = max(1, int(n_buckets))
    return max(sync_s / k, sync_s - last_bwd_s * (k - 1) / k)


@dataclass(frozen=True)
class Slot:
    """One forward or backward of one micro-batch on one stage in a simulated schedule (seconds)."""

    stage: int
    micro_batch: int
    kind: Literal["F", "B"]
    start: float
    end: float


def pipeline_order(schedule: Schedule, stage: int, pp: int, m: int) -> list[tuple[str, int]]:
    """The order of ``("F" | "B", micro_batch)`` one stage executes.

    ``afab``: all ``m`` forwards, then all backwards (GPipe). ``1f1b``: ``min(pp - 1 - stage, m)`` warm-up
    forwards, then alternate one forward and one backward, then the remaining backwards (PipeDream-Flush,
    Narayanan et al. 2021, Fig. 4 top).
    """
    if schedule == "afab":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected '1f1b' or 'afab'")
    w = min(pp - 1 - stage, m)
    order = [("F", j) for j in range(w)]
    for i in range(m - w):
        order += [("F", w + i), ("B", i)]
    return order + [("B", j) for j in range(m - w, m)]


def simulate_pipeline(fwd: Sequence[float], bwd: Sequence[float], m: int, schedule: Schedule = "1f1b") -> list[Slot]:
    """Event-exact timeline of one step's forwards and backwards.

    ``F(s, j)`` starts when stage ``s`` is free and ``F(s - 1, j)`` has ended; ``B(s, j)`` when stage ``s``
    is free and ``B(s + 1, j)`` has ended (the last stage's ``B(j)`` follows its own ``F(j)`` by order).
    Transfer time is inside ``fwd`` / ``bwd`` (the sender's ``pp_p2p``).

    Parameters
    ----------
    fwd, bwd : sequence of float
        Seconds per micro-batch on each stage (``len == pp``).
    m : int
        Micro-batches.
    schedule : {"1f1b", "afab"}

    Returns
    -------
    list of Slot
        ``2 * pp * m`` slots; the makespan is ``max(s.end)``.
    """
    pp = len(fwd)
    orders = [pipeline_order(schedule, s, pp, m) for s in range(pp)]
    pos, free = [0] * pp, [0.0] * pp
    done: dict[tuple[str, int, int], float] = {}
    slots: list[Slot] = []
    while len(slots) < 2 * pp * m:
        progressed = False
        for s in range(pp):
            if pos[s] == len(orders[s]):
                continue
            kind, j = orders[s][pos[s]]
            dep = ("F", s - 1, j) if kind == "F" else ("B", s + 1, j)
            if (kind == "F" and s == 0) or (kind == "B" and s == pp - 1):
                ready = 0.0
            elif dep in done:
                ready = done[dep]
            else:
                continue
            start = max(free[s], ready)
            end = start + (fwd[s] if kind == "F" else bwd[s])
            done[(kind, s, j)], free[s] = end, end
            slots.append(Slot(s, j, kind, start, end))
            pos[s] += 1
            progressed = True
        if not progressed:  # cannot happen for the two schedules above; guards a bad order
            raise RuntimeError("pipeline schedule deadlocked")
    return slots


@dataclass(frozen=True)
class StepPrediction:
    """Predicted time of one training step (seconds) and its components (paper Table IX's rows).

    Attributes
    ----------
    total_s : float
    pipeline_s : float
        Forward/backward part: ``(m - 1 + pp)(max F + max B)`` (closed form) or the simulated makespan.
    max_fwd_s, max_bwd_s : float
        Slowest stage's forward / backward of one micro-batch (Stage_Fwd_Max, Stage_Bwd_Max).
    grad_sync_s, grad_sync_exposed_s : float
        First stage's DP all-reduce, total and the part left exposed by overlap.
    update_s : float
        Slowest stage's optimizer step (+ all-gather).
    plan : StagePlan
    slots : list of Slot or None
        The simulated timeline (``method="simulate"``).
    """

    total_s: float
    pipeline_s: float
    max_fwd_s: float
    max_bwd_s: float
    grad_sync_s: float
    grad_sync_exposed_s: float
    update_s: float
    schedule: str
    method: str
    overlap_grad_sync: bool
    plan: StagePlan
    slots: list[Slot] | None = None

    def components(self) -> dict[str, float]:
        """``{"stage_fwd_max", "stage_bwd_max", "pipeline", "grad_sync", "update", "total"}`` in seconds."""
        return {"stage_fwd_max": self.max_fwd_s, "stage_bwd_max": self.max_bwd_s, "pipeline": self.pipeline_s,
                "grad_sync": self.grad_sync_exposed_s, "update": self.update_s, "total": self.total_s}


def compose(config: PerfConfig, ops: Sequence[Operator], time_fn: TimeFn, *, schedule: Schedule = "1f1b",
            method: Literal["closed_form", "simulate"] = "closed_form", overlap_grad_sync: bool = False) -> StepPrediction:
    """Step time from per-operator times.

    Parameters
    ----------
    config : PerfConfig
    ops : sequence of Operator
        ``decompose(config)``.
    time_fn : callable
        ``time_fn(op, "fwd" | "bwd") -> seconds`` (a roofline, or later the learned regressors).
    schedule : {"1f1b", "afab"}
        Pipeline schedule; both give the same closed form (module docstring).
    method : {"closed_form", "simulate"}
        ``closed_form``: the paper's equation. ``simulate``: :func:`simulate_pipeline`, then each stage's
        exposed sync after its own last backward, ``T = max_s(end_s + exposed_s) + max update``.
    overlap_grad_sync : bool
        Overlap the DP all-reduce with the last backward (:func:`exposed_grad_sync`).

    Returns
    -------
    StepPrediction

    Raises
    ------
    ValueError
        Unknown ``schedule`` or ``method``.
    """
    if schedule not in ("1f1b", "afab"):
        raise ValueError(f"unknown pipeline schedule {schedule!r}; expected '1f1b' or 'afab'")
    plan = stage_times(ops, time_fn, config.pp)
    m, pp = config.n_micro_batches, config.pp
    fmax, bmax = max(plan.fwd), max(plan.bwd)
    exposed = [exposed_grad_sync(plan.grad_sync[s], plan.bwd[s], plan.grad_buckets[s], overlap_grad_sync)
               for s in range(pp)]
    update = max(plan.update)
    slots = None
    if method == "closed_form":
        pipeline = (m - 1 + pp) * (fmax + bmax)
        sync_on_path = exposed[0]
        total = pipeline + sync_on_path + update
    elif method == "simulate":
        slots = simulate_pipeline(plan.fwd, plan.bwd, m, schedule)
        pipeline = max(sl.end for sl in slots)
        ends = [max(sl.end for sl in slots if sl.stage == s) for s in range(pp)]
        finish = max(ends[s] + exposed[s] for s in range(pp))
        sync_on_path = finish - pipeline
        total = finish + update
    else:
        raise ValueError(f"unknown method {method!r}; expected 'closed_form' or 'simulate'")
    return StepPrediction(total, pipeline, fmax, bmax, plan.grad_sync[0], sync_on_path, update, schedule,
                          method, overlap_grad_sync, plan, slots)
