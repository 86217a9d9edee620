"""Forward simulation of a site's EASY-backfill scheduler from its live queue: when would a new job start?

What ``sbatch --test-only`` answers live, computed from what a site shows at submit time
(its running jobs' starts, sizes and requested walltimes, its pending queue in order): the
scheduler is simulated forward with no further arrivals, the new job (the *probe*) appended at
the tail of the queue, until the probe starts.

Scheduler (the rules of :func:`lab.hpc.sim.easy_backfill`: FCFS with EASY backfilling, Lifka
1995; Mu'alem & Feitelson, IEEE TPDS 12(6), 2001, section 2): at every event (a job ending) the
queue is started from the head while the head fits; the head that does not fit gets a
reservation at its *shadow time* (the earliest time enough processors are free, judged from the
running jobs' *planned* ends, i.e. their requested walltimes), and a later job starts at once when
it fits in the free processors and either ends (by its request) before the shadow time or uses no
more than the *extra* processors (free at the shadow time beyond the head's need).

Jobs *really* end at their expected end, which may differ from the plan: the per-site
walltime-overestimate correction (:class:`EasyForecaster`, ``ratio_quantile``: a percentile of the
run/requested ratios of the site's jobs that ended before submit time) shortens them, as users
over-ask (Theta's and HPC2N's median ratios are 0.45-0.8).

Because the probe is last in the queue and backfill goes in queue order, the probe changes
nothing before it starts: :func:`simulate_queue` runs the queue once without it, recording after
every scheduling pass the free processors, the head's shadow time and extra processors, and
:meth:`QueueForecast.probe_start` finds, for any probe, the first pass at which it would have
started. One simulation serves every probe at that site and time.

:class:`HistoryBlendPredictor` is what the replay's ``earliest_completion`` uses. On the replay's validation
seeds (1-8, earlier weeks only) :class:`EasyForecaster` scored worse than the simpler conservative plan it
uses instead (mean / p90 extra 2,189 s / 5,250 s without correction and pending jobs held to the next
release, 2,635-10,073 s with a ratio correction or pending jobs started at once, against 1,572 s / 4,399 s):
the traces' schedulers are not FCFS, and a forward simulation without arrivals cannot see the new work that
takes a hole first, which is where the site's own history helps.

Times are seconds on any common clock (epoch seconds in the replay), sizes processors.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lab.hpc.errors import ReplayError
from lab.hpc.sim import SiteObservation, qbets_bound

__all__ = ["QueueForecast", "simulate_queue", "EasyForecastConfig", "EasyForecaster", "history_waits", "HistoryBlendConfig", "HistoryBlendPredictor"]

_INF = float("inf")


@dataclass(frozen=True)
class QueueForecast:
    """The simulated scheduling passes of one site's queue (no probe), from :func:`simulate_queue`.

    Attributes
    ----------
    times : numpy.ndarray of float, shape (k,)
        Pass times, increasing (the first is the submission time).
    free : numpy.ndarray of int, shape (k,)
        Processors free after the pass started what it could.
    shadow : numpy.ndarray of float, shape (k,)
        The waiting head's shadow time after the pass (inf when nothing waits: the probe would be the head).
    extra : numpy.ndarray of int, shape (k,)
        Extra processors left at the shadow time after the pass's backfills (unused when nothing waits).
    queue_empty : numpy.ndarray of bool, shape (k,)
        Whether every pending job has started by the end of the pass.
    capacity : int
    """

    times: np.ndarray
    free: np.ndarray
    shadow: np.ndarray
    extra: np.ndarray
    queue_empty: np.ndarray
    capacity: int

    def probe_start(self, processors: int, requested_s: float) -> float:
        """When a probe of ``processors`` asking ``requested_s`` seconds, submitted last, would start.

        At the first pass where it fits in the free processors and either nothing waits before it (it is
        the head) or it does not delay the head's reservation (ends by its request before the shadow
        time, or fits in the extra processors). Seconds on the forecast's clock; inf when it never
        starts (larger than the machine).
        """
        p = int(processors)
        if p <= 0:
            raise ReplayError(f"a probe needs at least one processor, not {processors}")
        if p > self.capacity:
            return _INF
        fits = self.free >= p
        ok = fits & (self.queue_empty | (self.times + float(requested_s) <= self.shadow) | (self.extra >= p))
        k = np.flatnonzero(ok)
        return float(self.times[k[0]]) if len(k) else _INF


def simulate_queue(
    t: float,
    capacity: int,
    running_planned_end,
    running_end,
    running_processors,
    pending_processors,
    pending_requested,
    pending_run,
    *,
    start_pending: bool = True,
) -> QueueForecast:
    """Simulate EASY backfill forward from ``t`` with no arrivals (the probe left out; see the module docstring).

    Parameters
    ----------
    t : float
        Submission time, seconds.
    capacity : int
        Processors of the machine.
    running_planned_end, running_end : array_like of float, shape (r,)
        Per running job: the end the scheduler plans with (start + requested walltime) and the end it is
        expected to really have; both are clipped to at least ``t``.
    running_processors : array_like of int, shape (r,)
    pending_processors : array_like of int, shape (q,)
        The pending queue in scheduling order (FCFS: submission order). Jobs larger than the machine are dropped.
    pending_requested, pending_run : array_like of float, shape (q,)
        Their requested walltimes (what the scheduler plans with) and expected run times, seconds.
    start_pending : bool
        Whether the pass at ``t`` itself may start pending jobs. False: the live scheduler has just
        declined to start them in the processors free now (they are held, or wait for priority the queue
        order does not show), so they are first considered at the next release; the probe may still
        backfill at ``t``.

    Returns
    -------
    QueueForecast

    Raises
    ------
    ReplayError
        Arrays of different lengths, or a non-positive capacity.
    """
    capacity = int(capacity)
    if capacity <= 0:
        raise ReplayError(f"capacity must be positive, not {capacity}")
    r_plan = np.maximum(np.asarray(running_planned_end, dtype=np.float64).reshape(-1), t).tolist()
    r_end = np.maximum(np.asarray(running_end, dtype=np.float64).reshape(-1), t).tolist()
    r_p = np.asarray(running_processors).reshape(-1).astype(np.int64).tolist()
    q_p = np.asarray(pending_processors).reshape(-1).astype(np.int64)
    q_req = np.asarray(pending_requested, dtype=np.float64).reshape(-1)
    q_run = np.asarray(pending_run, dtype=np.float64).reshape(-1)
    if not (len(r_plan) == len(r_end) == len(r_p)):
        raise ReplayError(f"running arrays differ in length: planned {len(r_plan)}, end {len(r_end)}, processors {len(r_p)}")
    if not (len(q_p) == len(q_req) == len(q_run)):
        raise ReplayError(f"pending arrays differ in length: processors {len(q_p)}, requested {len(q_req)}, run {len(q_run)}")
    keep = (q_p > 0) & (q_p <= capacity)
    q_p, q_req, q_run = q_p[keep].tolist(), np.nan_to_num(q_req[keep], nan=0.0).tolist(), np.nan_to_num(q_run[keep], nan=0.0).tolist()

    free = capacity - int(sum(r_p))
    running: dict[int, tuple[float, int]] = {}  # id -> (planned end, processors)
    ends: list[tuple[float, int]] = []  # heap of (real end, id)
    for i, (pl, e, p) in enumerate(zip(r_plan, r_end, r_p)):
        running[i] = (pl, p)
        heapq.heappush(ends, (e, i))
    nid = len(running)
    queue = list(range(len(q_p)))
    out_t, out_free, out_shadow, out_extra, out_empty = [], [], [], [], []

    def launch(j: int, now: float) -> None:
        nonlocal free, nid
        free -= q_p[j]
        running[nid] = (now + q_req[j], q_p[j])
        heapq.heappush(ends, (now + max(min(q_run[j], q_req[j]) if q_req[j] > 0 else q_run[j], 0.0), nid))
        nid += 1

    now = float(t)
    first = True
    while True:
        if not first:
            if not ends:
                break
            now = ends[0][0]
            while ends and ends[0][0] <= now:
                _, i = heapq.heappop(ends)
                free += running.pop(i)[1]
        shadow, extra = _INF, 0
        if queue and (start_pending or not first):
            while queue and q_p[queue[0]] <= free:
                launch(queue.pop(0), now)
        if queue:
            need = q_p[queue[0]]
            avail = free
            for pl, p in sorted(running.values()):
                avail += p
                if avail >= need:
                    shadow, extra = max(pl, now), avail - need
                    break
            if start_pending or not first:
                kept = [queue[0]]
                for j in queue[1:]:
                    p = q_p[j]
                    if p <= free and (now + q_req[j] <= shadow or p <= extra):
                        if not now + q_req[j] <= shadow:
                            extra -= p
                        launch(j, now)
                    else:
                        kept.append(j)
                queue = kept
        out_t.append(now)
        out_free.append(free)
        out_shadow.append(shadow)
        out_extra.append(extra)
        out_empty.append(not queue)
        first = False
    return QueueForecast(
        times=np.asarray(out_t, dtype=np.float64),
        free=np.asarray(out_free, dtype=np.int64),
        shadow=np.asarray(out_shadow, dtype=np.float64),
        extra=np.asarray(out_extra, dtype=np.int64),
        queue_empty=np.asarray(out_empty, dtype=bool),
        capacity=capacity,
    )


class EasyForecastConfig(BaseModel):
    """Settings of :class:`EasyForecaster`, validated (unknown fields refused).

    ``ratio_quantile`` None: jobs run their full request (no correction); a percentile: the
    walltime-overestimate correction ``r`` (that percentile of the site's run/requested ratios over jobs
    that ended in the telemetry window, clipped to ``ratio_clip``; 1 with fewer than ``min_jobs``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio_quantile: float | None = Field(None, gt=0, lt=100)
    ratio_clip: tuple[float, float] = (0.05, 1.0)
    min_jobs: int = Field(10, ge=1)
    start_pending: bool = Field(False, description="the pass at submit time may start pending jobs (see simulate_queue)")
    down_penalty_s: float = Field(6 * 3600.0, ge=0, description="a site known to be down is not expected back before t + this")
    qbets_quantile: float | None = Field(None, gt=0, lt=100, description="floor (QBETS bound on this percentile of recent waits) where the probe does not fit now")
    qbets_confidence: float = Field(0.95, gt=0, lt=1)
    busy_margin: float = Field(0.0, ge=0, le=1, description="a fits-now start is trusted only if the probe leaves this share of the machine free (0: always)")


class EasyForecaster:
    """Predict a probe's start at a site from a :class:`lab.hpc.sim.SiteObservation` by forward-simulating EASY backfill.

    The same interface as :class:`lab.hpc.sim.QueuePredictor` (``plan``, ``predict_start``, ``params``), so the
    replay's ``earliest_completion`` can use either.

    1. ``r`` (``ratio_quantile``): the site's walltime-overestimate correction from its history known at submit
       time; running jobs are expected to end at ``max(start + r x requested, t + 60 s)``, pending jobs to run
       ``r x requested``; the scheduler plans with the full requests.
    2. :func:`simulate_queue` from the pending queue in submission order (``start_pending``).
    3. The probe's start: :meth:`QueueForecast.probe_start` with its requested walltime.
    4. A site known to be down: the simulation starts ``down_penalty_s`` later.
    5. Optionally a QBETS floor (Nurmi et al., JSSPP 2007) where the probe does not fit now.

    Raises
    ------
    ReplayError
        A setting is unknown or invalid (the message names the field).
    """

    def __init__(self, config: EasyForecastConfig | None = None, **settings):
        if config is not None and settings:
            raise ReplayError(f"EasyForecaster: give config or keyword settings, not both (got {sorted(settings)})")
        if config is None:
            try:
                config = EasyForecastConfig(**settings)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ReplayError(f"EasyForecaster: field {'.'.join(str(x) for x in err['loc']) or '?'!r}: {err['msg']} (got {err.get('input')!r})") from None
        self.config = config

    def __repr__(self) -> str:
        return f"EasyForecaster({self.config!r})"

    def params(self) -> dict:
        """The settings (JSON-ready), with ``model="easy_forward_simulation"``."""
        return {"model": "easy_forward_simulation", **self.config.model_dump(mode="json")}

    def ratio(self, obs: SiteObservation) -> float:
        """The correction ``r`` (1 when ``ratio_quantile`` is None)."""
        c = self.config
        if c.ratio_quantile is None:
            return 1.0
        return obs.telemetry.median_ratio(c.ratio_clip, 1.0, c.min_jobs, c.ratio_quantile)

    def plan(self, obs: SiteObservation) -> QueueForecast:
        """The simulated passes of ``obs``'s queue (steps 1, 2 and 4)."""
        c = self.config
        t = obs.time + (c.down_penalty_s if obs.down else 0.0)
        r = self.ratio(obs)
        req_run = np.nan_to_num(obs.running_requested, nan=0.0)
        planned = obs.running_start + req_run
        real = np.maximum(obs.running_start + r * req_run, t + 60.0)
        req_pend = np.nan_to_num(obs.pending_requested, nan=0.0)
        return simulate_queue(
            t, obs.capacity, np.maximum(planned, t + 60.0), real, obs.running_processors,
            obs.pending_processors, req_pend, r * req_pend, start_pending=c.start_pending,
        )

    def predict_start(self, obs: SiteObservation, processors: int, requested_time: float, *, profile: QueueForecast | None = None) -> float:
        """Predicted start (epoch seconds) of a probe of ``processors`` asking ``requested_time`` seconds
        (pass ``profile=self.plan(obs)`` to reuse one simulation for several probes)."""
        c = self.config
        fc = self.plan(obs) if profile is None else profile
        start = fc.probe_start(processors, requested_time)
        if c.busy_margin > 0 and start <= obs.time and obs.free - processors < c.busy_margin * obs.capacity:
            # a tight fit now: the free processors are few enough that an arrival may take them first; plan it as not fitting
            later = fc.times[fc.times > obs.time]
            masked = QueueForecast(later, fc.free[fc.times > obs.time], fc.shadow[fc.times > obs.time], fc.extra[fc.times > obs.time], fc.queue_empty[fc.times > obs.time], fc.capacity)
            start = masked.probe_start(processors, requested_time) if len(later) else start
        if c.qbets_quantile is not None and obs.free < processors:
            bound = qbets_bound(obs.telemetry.waits, c.qbets_quantile, c.qbets_confidence)
            if bound is not None and math.isfinite(bound):
                start = max(start, obs.time + bound)
        return float(start)


# --------------------------------------------------------------------------------------------- the site's own history


def history_waits(telemetry, t: float, capacity: int, processors: int, duration: float, *, lookback_s: float = 7 * 86400.0, step_s: float = 600.0):
    """How long the same probe would have waited, submitted every ``step_s`` seconds over the last
    ``lookback_s`` seconds before ``t``, in the site's recorded busy profile (what its monitoring saw;
    everything used lies before ``t``). Vectorised over the submission grid.

    A probe submitted at ``t'`` starts at the first ``c >= t'`` from which ``busy + processors <= capacity``
    (and the site is not known down) holds for ``duration`` seconds, all before ``t``; where no such
    ``c`` exists before ``t`` the wait is censored at ``t - duration - t'`` (it waited at least that long).

    Parameters
    ----------
    telemetry : lab.hpc.sim.Telemetry
        ``profile_times``, ``profile_busy``, ``profile_down`` (the recorded past).
    t : float
        Submission time now, seconds.
    capacity, processors : int
    duration : float
        Seconds the probe must run (its request).
    lookback_s, step_s : float

    Returns
    -------
    (fit, waits, censored, free) : four numpy arrays of shape (m,)
        Whether the probe fitted in the processors free at ``t'`` (bool), the waits (float seconds),
        whether each is censored (bool) and the processors free at ``t'`` (int; 0 while known down).
        Empty without a recorded profile.
    """
    times = np.asarray(telemetry.profile_times, dtype=np.float64)
    empty = (np.zeros(0, dtype=bool), np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64))
    if not len(times) or duration <= 0:
        return empty
    ok = (np.asarray(telemetry.profile_busy) + int(processors) <= int(capacity)) & ~np.asarray(telemetry.profile_down, dtype=bool)
    ends = np.append(times[1:], t)  # the recorded past stops at t
    first = max(float(times[0]), t - lookback_s)
    subs = np.arange(t - duration - step_s, first - 1e-9, -step_s)[::-1]
    if not len(subs):
        return empty
    # maximal ok runs [a, b)
    edges = np.diff(np.concatenate([[0], ok.astype(np.int8), [0]]))
    a = times[np.flatnonzero(edges == 1)]
    b = ends[np.flatnonzero(edges == -1) - 1]
    seg = np.searchsorted(times, subs, side="right") - 1
    fit = ok[seg]
    # inside a run: the run holding t' (its end b); it serves when b - t' >= duration
    run_of = np.searchsorted(a, subs, side="right") - 1
    inside_end = np.where(fit & (run_of >= 0), b[np.clip(run_of, 0, None)], -np.inf) if len(b) else np.full(len(subs), -np.inf)
    zero = inside_end - subs >= duration
    # otherwise the first later run long enough
    long_ = np.flatnonzero(b - a >= duration)
    la = a[long_]
    k = np.searchsorted(la, subs, side="right")
    nxt = np.where(k < len(la), la[np.clip(k, 0, len(la) - 1)], np.inf) if len(la) else np.full(len(subs), np.inf)
    waits = np.where(zero, 0.0, nxt - subs)
    censored = ~zero & ~np.isfinite(nxt)
    waits = np.where(censored, np.maximum(t - duration - subs, 0.0), waits)
    down = np.asarray(telemetry.profile_down, dtype=bool)[seg]
    free = np.where(down, 0, np.maximum(int(capacity) - np.asarray(telemetry.profile_busy)[seg], 0)).astype(np.int64)
    return fit, waits, censored, free


# --------------------------------------------------------------------------------------------- the combined predictor


class HistoryBlendConfig(BaseModel):
    """Settings of :class:`HistoryBlendPredictor`, validated (unknown fields refused).

    ``base`` holds the :class:`lab.hpc.sim.QueuePredictorConfig` fields of the forward simulation used
    where the probe does not fit now; ``tie_within_s`` is read by the replay's ``earliest_completion``
    (:func:`lab.hpc.placement.earliest_completion`'s ``tie_within_s``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fit_quantile: float = Field(50.0, gt=0, lt=100, description="percentile of the site's past fits-now waits taken as the wait where the probe fits now")
    not_fit: Literal["forecast", "avg"] = Field("forecast", description="where it does not fit: the forward simulation, or its mean with the site's past not-fit mean wait")
    lookback_s: float = Field(7 * 86400.0, gt=0)
    step_s: float = Field(600.0, gt=0)
    min_samples: int = Field(6, ge=1, description="fewer past submissions of the same kind: 0 s (fits now) / the forecast alone (does not fit)")
    tie_within_s: float = Field(0.0, ge=0, description="predicted completions within this of the best count as ties, broken by fewest pending")
    base: dict = Field(default_factory=dict, description="QueuePredictorConfig fields of the forward simulation")


class HistoryBlendPredictor:
    """Predicted start of a probe at a site: the exact "fits now" signal, corrected by the site's own history.

    * The probe fits in the processors free now (the site not known down): a scheduler would start it at
      once, but the hole may not last its walltime (pending jobs and new arrivals take processors first: the
      ground truth delays nobody). Its wait is predicted as the ``fit_quantile``-th percentile of the waits the
      same probe would have had at the site's past submission times when it also fitted at once
      (:func:`history_waits`: every ``step_s`` over the last ``lookback_s``, in the busy profile recorded
      before now).
    * Otherwise: the forward simulation of the site's queue (:class:`lab.hpc.sim.QueuePredictor` with ``base``
      settings; requested walltimes, next release), or with ``not_fit="avg"`` its mean with the mean past wait
      of the same probe at times it did not fit (a history correction of the simulation's missing arrivals).

    The same interface as :class:`lab.hpc.sim.QueuePredictor` (``plan``, ``predict_start``, ``params``).

    Raises
    ------
    ReplayError
        A setting is unknown or invalid (the message names the field).
    """

    def __init__(self, config: HistoryBlendConfig | None = None, **settings):
        from lab.hpc.sim import QueuePredictor

        if config is not None and settings:
            raise ReplayError(f"HistoryBlendPredictor: give config or keyword settings, not both (got {sorted(settings)})")
        if config is None:
            try:
                config = HistoryBlendConfig(**settings)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ReplayError(f"HistoryBlendPredictor: field {'.'.join(str(x) for x in err['loc']) or '?'!r}: {err['msg']} (got {err.get('input')!r})") from None
        self.config = config
        self.base = QueuePredictor(**config.base)
        self.tie_within_s = float(config.tie_within_s)

    def __repr__(self) -> str:
        return f"HistoryBlendPredictor({self.config!r})"

    def params(self) -> dict:
        """The settings (JSON-ready), with ``model="history_blend"``."""
        return {"model": "history_blend", **self.config.model_dump(mode="json")}

    def plan(self, obs: SiteObservation):
        """The forward simulation's plan (reused for every probe at that site and time)."""
        return self.base.plan(obs)

    def predict_start(self, obs: SiteObservation, processors: int, requested_time: float, *, profile=None) -> float:
        """Predicted start, epoch seconds (``profile``: :meth:`plan`'s result, to reuse it)."""
        if not obs.down and obs.free >= processors:
            return self.correct(obs, processors, requested_time, obs.time, fits_now=True)
        start = self.base.predict_start(obs, processors, requested_time, profile=profile)
        return self.correct(obs, processors, requested_time, start, fits_now=False)

    def correct(self, obs: SiteObservation, processors: int, requested_time: float, present_start: float, *, fits_now: bool) -> float:
        """The history correction of a start predicted from the present queue alone (``present_start``, epoch
        seconds): where the probe fits now (``fits_now``), the ``fit_quantile``-th percentile of its past fits-now
        waits (never before ``present_start``); elsewhere ``present_start``, or with ``not_fit="avg"`` its mean
        with the past not-fit mean wait. :meth:`predict_start` applies it to the forward simulation; the replay's
        information bound applies it to a clairvoyant present. Epoch seconds."""
        c = self.config
        fit, waits, _, _ = history_waits(obs.telemetry, obs.time, obs.capacity, processors, requested_time, lookback_s=c.lookback_s, step_s=c.step_s)
        if fits_now:
            past = waits[fit]
            return float(max(present_start, obs.time + (np.percentile(past, c.fit_quantile) if len(past) >= c.min_samples else 0.0)))
        start = present_start
        if c.not_fit == "avg":
            past = waits[~fit]
            if len(past) >= c.min_samples and math.isfinite(start):
                start = 0.5 * (start + obs.time + float(past.mean()))
        return float(start)
