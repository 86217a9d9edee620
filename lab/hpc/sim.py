"""Trace-driven site models for replaying placement decisions offline.

A site is a workload trace plus a capacity. This module turns it into what a
placement replay needs:

:func:`easy_backfill`
    FCFS with EASY backfilling (Lifka 1995; Mu'alem & Feitelson, IEEE TPDS 2001):
    start times for a log that records none (the NASA Ames iPSC/860 log, whose
    submit times are start times).
:class:`SiteTimeline`
    The machine's busy-processor step profile from the jobs' real (or simulated)
    starts and ends, with downtimes inferred from the log (nothing running while
    jobs wait); :meth:`~SiteTimeline.probe_start` inserts a probe job into
    that real schedule without delaying any background job (the ground truth of
    when a probe submitted at ``t`` could have run); :meth:`~SiteTimeline.observe`
    is everything a placement policy may see at ``t``: pending jobs (processors,
    requested walltimes), running jobs (start, processors, requested walltimes,
    but not their ends), busy and free processors, whether the site is down, and
    :class:`Telemetry` of the past (run/requested ratios and waits of ended jobs,
    the arrival stream, the recorded busy profile before ``t``).
:class:`QueuePredictor`
    A start-time predictor that sees only an observation: running jobs end after
    their requested walltime times the site's median run/requested ratio (or its
    median given how long they have already run), the pending jobs are planned
    in FCFS order with conservative-backfill reservations of that expected
    length, and the probe takes the earliest hole left. It is calibrated from the
    site's past telemetry; it never looks at the trace's real starts or ends of
    unfinished jobs.
:func:`earliest_fit`
    The shared primitive: the earliest time at or after ``t`` from which a step
    profile stays "ok" for ``duration`` seconds.

Units: times are seconds (epoch seconds, UTC, for traces; any origin for arrays),
durations seconds, sizes processors (nodes on Theta, as its trace counts them).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from scipy.stats import binom

from lab.hpc.errors import ReplayError
from lab.hpc.swf import SWFTrace

__all__ = [
    "easy_backfill",
    "earliest_fit",
    "Telemetry",
    "SiteObservation",
    "SiteTimeline",
    "PlannedProfile",
    "QueuePredictor",
    "QueuePredictorConfig",
    "qbets_bound",
    "NASA_REQUEST_FACTOR",
    "WALLTIME_BUCKETS_S",
    "DOWNTIME_MIN_S",
    "DOWNTIME_MIN_PENDING",
    "synthesize_requests",
]

DAY = 86400.0
_HOUR = 3600.0
#: Requested walltime assumed for logs without one (NASA iPSC/860): run time times this factor, rounded
#: up to a standard walltime (:data:`WALLTIME_BUCKETS_S`). Users over-ask: Theta's and HPC2N's logs show
#: a median run/requested ratio of 0.45-0.8. Rounding up to a bucket, as users do, keeps the request from
#: encoding the run time exactly (a fixed factor would let a predictor read off every job's end).
NASA_REQUEST_FACTOR = 2.0
#: Standard walltime requests, seconds: 5, 15, 30 min, 1, 2, 4, 8, 12, 18, 24 h (beyond: multiples of 6 h).
WALLTIME_BUCKETS_S = np.array([300, 900, 1800, 3600, 7200, 14400, 28800, 43200, 64800, 86400], dtype=np.float64)
#: A machine with nothing running while at least :data:`DOWNTIME_MIN_PENDING` jobs wait, for at least
#: this long, is taken to be down (maintenance): any waiting job fits an empty machine. (One lone job
#: waiting on an idle machine is more likely held by its user or a dependency.)
DOWNTIME_MIN_S = _HOUR
DOWNTIME_MIN_PENDING = 2


def synthesize_requests(run_time, factor: float = NASA_REQUEST_FACTOR) -> np.ndarray:
    """Requested walltimes (seconds) for a log that records none: ``factor * run_time`` rounded up to the
    next of :data:`WALLTIME_BUCKETS_S` (beyond 24 h, to a multiple of 6 h). Shape as ``run_time``."""
    want = factor * np.asarray(run_time, dtype=np.float64)
    k = np.searchsorted(WALLTIME_BUCKETS_S, want, side="left")
    beyond = np.ceil(want / (6 * _HOUR)) * 6 * _HOUR
    return np.where(k < len(WALLTIME_BUCKETS_S), WALLTIME_BUCKETS_S[np.minimum(k, len(WALLTIME_BUCKETS_S) - 1)], beyond)


# --------------------------------------------------------------------------------------------- EASY backfill


def easy_backfill(submit, requested_time, run_time, processors, capacity: int) -> np.ndarray:
    """Start times under first-come-first-served scheduling with EASY backfilling.

    The queue is kept in submission order. Whenever a job arrives or ends, the
    scheduler starts queued jobs from the head while they fit. If the head does
    not fit it gets a reservation at its *shadow time*: the earliest time at which
    enough processors are free, judged from the running jobs' requested
    walltimes (expected end ``max(start + requested_time, now)``). A later job may
    then start at once (backfill) if it fits in the free processors and either
    ends, by its requested walltime, no later than the shadow time, or uses no
    more than the *extra* processors (those free at the shadow time beyond the
    head's need), so it never delays the head. Jobs really run ``run_time``.

    Parameters
    ----------
    submit : array_like of float, shape (n,)
        Submission times, seconds (any origin).
    requested_time : array_like of float, shape (n,)
        Requested walltimes, seconds (what the scheduler plans with).
    run_time : array_like of float, shape (n,)
        Actual run times, seconds (>= 0).
    processors : array_like of int, shape (n,)
        Processors each job holds, 1..capacity.
    capacity : int
        Processors of the machine.

    Returns
    -------
    numpy.ndarray of float64, shape (n,)
        Start times in the input's order (``>= submit``).

    Raises
    ------
    ReplayError
        Arrays of different lengths, non-finite or negative values, or a job
        larger than the machine.
    """
    submit = np.asarray(submit, dtype=np.float64).reshape(-1)
    req = np.asarray(requested_time, dtype=np.float64).reshape(-1)
    run = np.asarray(run_time, dtype=np.float64).reshape(-1)
    procs = np.asarray(processors).reshape(-1)
    n = len(submit)
    if not (len(req) == len(run) == len(procs) == n):
        raise ReplayError(f"arrays differ in length: submit {n}, requested_time {len(req)}, run_time {len(run)}, processors {len(procs)}")
    capacity = int(capacity)
    if capacity <= 0:
        raise ReplayError(f"capacity must be positive, not {capacity}")
    for label, x in (("submit", submit), ("requested_time", req), ("run_time", run)):
        if not np.isfinite(x).all():
            raise ReplayError(f"{label} has non-finite values")
    if (req < 0).any() or (run < 0).any():
        raise ReplayError("requested_time and run_time must be >= 0 seconds")
    procs = procs.astype(np.int64)
    if (procs <= 0).any() or (procs > capacity).any():
        bad = procs[(procs <= 0) | (procs > capacity)][:3].tolist()
        raise ReplayError(f"processors must be in 1..capacity={capacity}; got {bad}")

    start = [float("nan")] * n
    order = np.argsort(submit, kind="stable").tolist()
    sub_l, req_l, run_l, p_l = submit.tolist(), req.tolist(), run.tolist(), procs.tolist()
    queue: deque[int] = deque()
    ends: list[tuple[float, int]] = []  # heap of (actual end, job) of running jobs
    running: dict[int, None] = {}  # running jobs (insertion ordered)
    free = capacity
    i = 0
    inf = float("inf")

    def launch(j: int, t: float) -> None:
        nonlocal free
        start[j] = t
        free -= p_l[j]
        running[j] = None
        heapq.heappush(ends, (t + run_l[j], j))

    while i < n or queue or ends:
        t_arr = sub_l[order[i]] if i < n else inf
        t_end = ends[0][0] if ends else inf
        t = min(t_arr, t_end)
        if t == inf:  # jobs queued, none running, none arriving: cannot happen (every job fits an empty machine)
            raise AssertionError("EASY simulation stalled")
        while ends and ends[0][0] <= t:
            _, j = heapq.heappop(ends)
            free += p_l[j]
            del running[j]
        while i < n and sub_l[order[i]] <= t:
            queue.append(order[i])
            i += 1
        # FCFS from the head
        while queue and p_l[queue[0]] <= free:
            launch(queue.popleft(), t)
        if len(queue) < 2:
            continue
        # reservation for the head: shadow time and extra processors, from requested walltimes
        head = queue[0]
        need = p_l[head]
        expected = sorted((max(start[j] + req_l[j], t), p_l[j]) for j in running)
        avail = free
        shadow, extra = inf, 0
        for e, p in expected:
            avail += p
            if avail >= need:
                shadow, extra = e, avail - need
                break
        # backfill the rest of the queue without delaying the head's reservation
        kept = [head]
        for j in list(queue)[1:]:
            p = p_l[j]
            if p <= free:
                if t + req_l[j] <= shadow:
                    launch(j, t)
                    continue
                if p <= extra:
                    extra -= p
                    launch(j, t)
                    continue
            kept.append(j)
        queue = deque(kept)
    return np.asarray(start, dtype=np.float64)


# --------------------------------------------------------------------------------------------- profile search


def earliest_fit(times, ok, t: float, duration: float, *, chunk: int = 2048) -> float:
    """Earliest ``c >= t`` such that a step profile is "ok" throughout ``[c, c + duration)``.

    Parameters
    ----------
    times : array_like of float, shape (K,)
        Segment starts, strictly increasing, ``times[0] <= t``; segment ``k`` is
        ``[times[k], times[k+1])`` and the last one extends to infinity.
    ok : array_like of bool, shape (K,)
        Whether each segment admits the job (e.g. ``busy + procs <= capacity``).
    t : float
        Earliest allowed start, seconds.
    duration : float
        Seconds the job needs (``<= 0`` asks only that ``c`` lie in an ok segment).
    chunk : int
        Segments examined per vectorized step (doubles until an answer is found).

    Returns
    -------
    float
        The start, or ``inf`` if the profile never stays ok that long.
    """
    times = np.asarray(times, dtype=np.float64)
    ok = np.asarray(ok, dtype=bool)
    K = len(times)
    k0 = int(np.searchsorted(times, t, side="right")) - 1
    if k0 < 0:
        raise ReplayError(f"earliest_fit: t={t} precedes the profile's first segment ({times[0] if K else 'empty profile'})")
    duration = max(float(duration), 0.0)
    lo, carry = k0, None  # carry: start of an ok run that reaches the previous chunk's end
    while lo < K:
        hi = min(lo + chunk, K)
        seg_ok = ok[lo:hi]
        st = times[lo:hi]
        en = times[lo + 1 : hi + 1] if hi < K else np.append(times[lo + 1 : hi], np.inf)
        prev = np.empty_like(seg_ok)
        prev[0] = carry is not None
        prev[1:] = seg_ok[:-1]
        nxt = np.empty_like(seg_ok)
        nxt[:-1] = seg_ok[1:]
        nxt[-1] = False
        rs_idx = np.flatnonzero(seg_ok & ~prev)
        re_idx = np.flatnonzero(seg_ok & ~nxt)
        run_start = st[rs_idx]
        if seg_ok[0] and carry is not None:  # the first run continues one from the previous chunk
            run_start = np.concatenate([[carry], run_start])
        if lo == k0 and len(run_start) and seg_ok[0] and carry is None:
            run_start[0] = max(run_start[0], t)
        run_end = en[re_idx]  # the last one is truncated at the chunk's end when it reaches it (hi < K)
        if duration > 0:
            feasible = np.flatnonzero(run_end - run_start >= duration)
        else:
            feasible = np.arange(len(run_start))
        if len(feasible):
            return float(max(run_start[feasible[0]], t))
        carry = float(run_start[-1]) if (len(run_start) and seg_ok[-1]) else None
        lo = hi
        chunk *= 2
    return float("inf")


# --------------------------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class Telemetry:
    """A site's past, as seen at the observation time ``t``, within a trailing window.

    Attributes
    ----------
    ratios : numpy.ndarray of float
        ``run_time / requested_time`` of the jobs that ended in ``[t - window_s, t)``
        (jobs with a positive request only).
    waits : numpy.ndarray of float
        Those jobs' waits, seconds.
    window_s : float
        The trailing window, seconds.
    arrival_submit, arrival_processors, arrival_requested, arrival_run : numpy.ndarray
        Every job submitted in ``[t - window_s, t)`` (the arrival stream), in submission
        order: epoch seconds, processors, requested seconds, and run seconds where the
        job had ended by ``t`` (NaN otherwise: not yet known).
    profile_times, profile_busy, profile_down : numpy.ndarray
        The site's busy-processor profile over ``[t - window_s, t)`` (segment starts,
        busy processors, and whether the site was known to be down), which the
        monitoring of a live site records; everything before ``t`` is known at ``t``.
    """

    ratios: np.ndarray
    waits: np.ndarray
    window_s: float
    arrival_submit: np.ndarray = field(default_factory=lambda: np.zeros(0))
    arrival_processors: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    arrival_requested: np.ndarray = field(default_factory=lambda: np.zeros(0))
    arrival_run: np.ndarray = field(default_factory=lambda: np.zeros(0))
    profile_times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    profile_busy: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    profile_down: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def past_probe_waits(self, t: float, processors: int, duration: float, capacity: int, *, lookback_s: float = 7 * DAY, step_s: float = 3600.0) -> tuple[np.ndarray, np.ndarray]:
        """How long a probe of ``processors`` x ``duration`` s would have waited, submitted every ``step_s``
        seconds over the last ``lookback_s`` seconds before ``t``, in the recorded profile.

        Returns ``(waits, censored)``: seconds, and True where the probe would not have finished by ``t``
        (then the wait is only known to exceed the value given, ``t - duration - t'``).
        """
        if len(self.profile_times) == 0:
            return np.zeros(0), np.zeros(0, dtype=bool)
        times = np.concatenate([self.profile_times, [t]])
        ok = np.concatenate([(self.profile_busy + processors <= capacity) & ~self.profile_down, [False]])  # after t: unknown
        first = max(float(self.profile_times[0]), t - lookback_s)
        subs = np.arange(t - step_s, first - 1e-9, -step_s)[::-1]
        waits, censored = np.empty(len(subs)), np.zeros(len(subs), dtype=bool)
        for i, s in enumerate(subs.tolist()):
            c = earliest_fit(times, ok, s, duration)
            if np.isfinite(c):
                waits[i] = c - s
            else:
                waits[i], censored[i] = max(t - duration - s, 0.0), True
        return waits, censored

    def median_ratio(self, clip: tuple[float, float] = (0.05, 1.0), default: float = 1.0, min_jobs: int = 10, quantile: float = 50.0) -> float:
        """Median (or the ``quantile``-th percentile of the) run/requested ratio, clipped to ``clip``;
        ``default`` with fewer than ``min_jobs`` jobs."""
        if len(self.ratios) < min_jobs:
            return float(default)
        return float(np.clip(np.percentile(self.ratios, quantile), *clip))


@dataclass(frozen=True)
class SiteObservation:
    """What a placement policy may know about one site at time ``time`` (no future, no run times of unfinished jobs).

    Arrays are float64 seconds (epoch) / int64 processors; pending jobs in submission order,
    running jobs in start order. ``down`` is what ``sinfo`` would show during maintenance:
    the site runs nothing while jobs wait (see :class:`SiteTimeline`); ``free`` is then 0.
    """

    site: str
    time: float
    capacity: int
    busy: int
    down: bool
    pending_submit: np.ndarray
    pending_processors: np.ndarray
    pending_requested: np.ndarray
    running_start: np.ndarray
    running_processors: np.ndarray
    running_requested: np.ndarray
    telemetry: Telemetry = field(repr=False)

    @property
    def free(self) -> int:
        """Processors idle and usable: ``max(capacity - busy, 0)``, 0 when down; never negative
        (:attr:`over_capacity` says when the trace holds more than the machine)."""
        return 0 if self.down else max(self.capacity - self.busy, 0)

    @property
    def over_capacity(self) -> int:
        """Processors the running jobs hold beyond the capacity, ``max(busy - capacity, 0)`` (the
        trace over-subscribes the machine: clock skew, or a job larger than it)."""
        return max(self.busy - self.capacity, 0)

    @property
    def n_pending(self) -> int:
        return len(self.pending_submit)

    @property
    def n_running(self) -> int:
        return len(self.running_start)


class SiteTimeline:
    """A site's real schedule as a busy-processor step profile, with probe insertion and observations.

    Parameters
    ----------
    submit, start, end : array_like of float, shape (n,)
        Per job, epoch seconds (UTC); ``submit <= start <= end``.
    processors : array_like of int, shape (n,)
    requested_time : array_like of float, shape (n,)
        Requested walltimes, seconds (NaN where unknown).
    capacity : int
        Processors of the machine.
    name : str
    timezone : str
        IANA zone of the site's wall clock (for aligning rounds by time of week).
    downtime_min_s : float or None
        Intervals of at least this many seconds in which nothing runs while at least
        :data:`DOWNTIME_MIN_PENDING` jobs are pending are taken as downtime (maintenance):
        a working scheduler would have started one of the waiting jobs, as any of them
        fits an empty machine. No probe runs across them. None: no downtime.

    Attributes
    ----------
    times, busy_profile : numpy.ndarray
        The step profile: ``busy_profile[k]`` processors are busy on ``[times[k], times[k+1])``
        (``times[0] = -inf``; the last segment is open).
    down_profile : numpy.ndarray of bool
        Segments inside a downtime.
    downtimes : numpy.ndarray, shape (m, 2)
        Downtime intervals ``[start, end)``, epoch seconds.

    Notes
    -----
    The busy profile counts the jobs' processors on ``[start, end)``. Real logs can
    over-subscribe the capacity briefly (clock skew); a probe never fits there.
    """

    def __init__(
        self,
        submit,
        start,
        end,
        processors,
        requested_time,
        capacity: int,
        *,
        name: str = "site",
        timezone: str = "UTC",
        downtime_min_s: float | None = DOWNTIME_MIN_S,
    ):
        self.submit = np.asarray(submit, dtype=np.float64).reshape(-1)
        self.start = np.asarray(start, dtype=np.float64).reshape(-1)
        self.end = np.asarray(end, dtype=np.float64).reshape(-1)
        self.processors = np.asarray(processors).reshape(-1).astype(np.int64)
        self.requested_time = np.asarray(requested_time, dtype=np.float64).reshape(-1)
        n = len(self.submit)
        if not all(len(a) == n for a in (self.start, self.end, self.processors, self.requested_time)):
            raise ReplayError(f"site {name!r}: submit, start, end, processors and requested_time must have the same length")
        if n == 0:
            raise ReplayError(f"site {name!r}: no jobs")
        if not (np.isfinite(self.submit).all() and np.isfinite(self.start).all() and np.isfinite(self.end).all()):
            raise ReplayError(f"site {name!r}: submit, start and end must be finite")
        if (self.start < self.submit).any() or (self.end < self.start).any():
            raise ReplayError(f"site {name!r}: need submit <= start <= end for every job (first offender: job index {int(np.flatnonzero((self.start < self.submit) | (self.end < self.start))[0])})")
        self.capacity = int(capacity)
        if self.capacity <= 0:
            raise ReplayError(f"site {name!r}: capacity must be positive, not {capacity}")
        self.name, self.timezone, self.downtime_min_s = name, timezone, downtime_min_s
        self.wait = self.start - self.submit
        self.run_time = self.end - self.start

        # busy profile: segment k = [times[k], times[k+1]), times[0] = -inf (idle before the first job).
        # Submissions are breakpoints too, so that "pending" is constant on every segment.
        events = np.unique(np.concatenate([self.submit, self.start, self.end]))
        self._submit_sorted = np.sort(self.submit)
        self._start_sorted = np.sort(self.start)
        self._end_sorted = np.sort(self.end)
        zero = np.zeros(1, dtype=np.int64)
        self._cum_start = np.concatenate([zero, np.cumsum(self.processors[np.argsort(self.start, kind="stable")])])
        self._cum_end = np.concatenate([zero, np.cumsum(self.processors[np.argsort(self.end, kind="stable")])])
        self.times = np.concatenate([[-np.inf], events])
        self.busy_profile = np.concatenate([[0], self.busy(events)]).astype(np.int64)
        pending = np.concatenate([[0], self.pending_count(events)])
        self.down_profile, self.downtimes = self._downtimes(pending, downtime_min_s)

        # for observations: pending/running are found by masks; telemetry by end order
        self._by_end = np.argsort(self.end, kind="stable")
        self._by_submit = np.argsort(self.submit, kind="stable")
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.run_time / self.requested_time
        self._ratio_by_end = ratio[self._by_end]
        self._wait_by_end = self.wait[self._by_end]

    def _downtimes(self, pending: np.ndarray, min_s: float | None) -> tuple[np.ndarray, np.ndarray]:
        idle_waiting = (self.busy_profile == 0) & (pending >= DOWNTIME_MIN_PENDING)
        idle_waiting[-1] = False  # the open last segment has nothing pending
        down = np.zeros_like(idle_waiting)
        if min_s is None or not idle_waiting.any():
            return down, np.zeros((0, 2))
        edges = np.diff(np.concatenate([[0], idle_waiting.astype(np.int8), [0]]))
        first, last = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # runs [first, last)
        t0, t1 = self.times[first], self.times[last]
        keep = (t1 - t0) >= min_s
        for a, b in zip(first[keep], last[keep]):
            down[a:b] = True
        return down, np.stack([t0[keep], t1[keep]], axis=1)

    # ----------------------------------------------------------------------------------------- construction

    @classmethod
    def from_trace(
        cls,
        trace: SWFTrace,
        *,
        name: str | None = None,
        capacity: int | None = None,
        timezone: str | None = None,
        request_factor: float = NASA_REQUEST_FACTOR,
        downtime_min_s: float | None = DOWNTIME_MIN_S,
    ) -> "SiteTimeline":
        """Build a site from an SWF trace.

        Jobs without submit time, run time or processors are left out. Capacity
        defaults to the header's ``MaxProcs`` (else ``MaxNodes``); the time zone to
        the header's ``TimeZoneString`` (else UTC).

        A log without wait times (all unknown; NASA iPSC/860, whose submit times are
        start times) is rescheduled with :func:`easy_backfill`, with requests from
        :func:`synthesize_requests` (``request_factor`` x run time, rounded up to a
        standard walltime) where the log has none. Otherwise the log's real starts
        are used, and an unknown request is taken as the run time (ratio 1).
        """
        jobs = trace.jobs
        submit = trace.submit_epoch()
        wait = jobs["wait_time"].to_numpy(dtype="float64", na_value=np.nan)
        run = jobs["run_time"].to_numpy(dtype="float64", na_value=np.nan)
        procs = jobs["allocated_processors"].to_numpy(dtype="float64", na_value=np.nan)
        procs = np.where(np.isnan(procs) | (procs <= 0), jobs["requested_processors"].to_numpy(dtype="float64", na_value=np.nan), procs)
        req = jobs["requested_time"].to_numpy(dtype="float64", na_value=np.nan)
        header = trace.header
        if capacity is None:
            capacity = next((c for c in (header.max_procs, header.max_nodes) if c is not None and c > 0), None)
            if capacity is None:
                raise ReplayError(f"trace {trace.name!r}: capacity unknown (no MaxProcs/MaxNodes); pass capacity=")
        simulate = bool(np.isnan(wait).all())
        keep = ~(np.isnan(submit) | np.isnan(run) | np.isnan(procs) | (procs <= 0))
        if not simulate:
            keep &= ~np.isnan(wait)
        if not keep.any():
            raise ReplayError(f"trace {trace.name!r}: no job has submit time, run time and processors")
        submit, run, procs, req, wait = submit[keep], run[keep], procs[keep].astype(np.int64), req[keep], wait[keep]
        if simulate:
            procs = np.minimum(procs, capacity)
            req = np.where(np.isnan(req), synthesize_requests(run, request_factor), req)
            start = easy_backfill(submit, req, run, procs, capacity)
        else:
            req = np.where(np.isnan(req), run, req)
            start = submit + wait
        tz = timezone or header.time_zone_string or "UTC"
        return cls(
            submit, start, start + run, procs, req, capacity, name=name or trace.name.removesuffix(".swf"), timezone=tz, downtime_min_s=downtime_min_s
        )

    # ----------------------------------------------------------------------------------------- ground truth

    def __len__(self) -> int:
        return len(self.submit)

    def __repr__(self) -> str:
        return f"SiteTimeline({self.name!r}, jobs={len(self)}, capacity={self.capacity}, downtimes={len(self.downtimes)})"

    def busy(self, t) -> np.ndarray:
        """Processors held by jobs running at ``t`` (``start <= t < end``), int64, same shape as ``t``."""
        t = np.asarray(t, dtype=np.float64)
        return self._cum_start[np.searchsorted(self._start_sorted, t, side="right")] - self._cum_end[np.searchsorted(self._end_sorted, t, side="right")]

    def pending_count(self, t) -> np.ndarray:
        """Jobs pending at ``t`` (``submit <= t < start``), int64, same shape as ``t``."""
        t = np.asarray(t, dtype=np.float64)
        return np.searchsorted(self._submit_sorted, t, side="right") - np.searchsorted(self._start_sorted, t, side="right")

    def is_down(self, t) -> np.ndarray:
        """Whether ``t`` falls in a downtime, bool, same shape as ``t``."""
        t = np.asarray(t, dtype=np.float64)
        return self.down_profile[np.searchsorted(self.times, t, side="right") - 1]

    def known_down(self, t) -> np.ndarray:
        """Whether, at ``t``, the site is known to be down: ``t`` falls in a downtime that has already
        lasted ``downtime_min_s`` seconds (a downtime is only recognised once it has lasted that long:
        before, the site looks idle). Bool, same shape as ``t``. This, not :meth:`is_down` (which knows
        the whole interval in hindsight), is what :meth:`observe` reports."""
        t = np.asarray(t, dtype=np.float64)
        if not len(self.downtimes):
            return np.zeros(t.shape, dtype=bool)
        k = np.searchsorted(self.downtimes[:, 0], t, side="right") - 1
        kk = np.clip(k, 0, None)
        a, b = self.downtimes[kk, 0], self.downtimes[kk, 1]
        return (k >= 0) & (t < b) & (t - a >= (self.downtime_min_s or 0.0))

    def free(self, t) -> np.ndarray:
        """Usable idle processors at ``t``: ``max(capacity - busy, 0)``, 0 during a downtime; never
        negative (:meth:`over_capacity` says where the trace over-subscribes the machine)."""
        return np.where(self.is_down(t), 0, np.maximum(self.capacity - self.busy(t), 0))

    def over_capacity(self, t) -> np.ndarray:
        """Processors held beyond the capacity at ``t``: ``max(busy - capacity, 0)``, int64, same shape as ``t``."""
        return np.maximum(self.busy(t) - self.capacity, 0)

    def probe_start(self, t_submit: float, processors: int, runtime: float) -> float:
        """Earliest start of a probe inserted into the real schedule without delaying any job.

        The smallest ``t >= t_submit`` such that ``busy(t') + processors <= capacity``
        and the site is not down, for every ``t'`` in ``[t, t + runtime)``.

        Parameters
        ----------
        t_submit : float
            Epoch seconds.
        processors : int
            1..capacity.
        runtime : float
            Seconds the probe runs.

        Returns
        -------
        float
            Epoch seconds.
        """
        if processors <= 0 or processors > self.capacity:
            raise ReplayError(f"a probe needs 1..{self.capacity} processors at site {self.name!r}, not {processors}")
        ok = (self.busy_profile + processors <= self.capacity) & ~self.down_profile
        return earliest_fit(self.times, ok, float(t_submit), float(runtime))

    # ----------------------------------------------------------------------------------------- information bounds

    def submitted_profile(
        self, t: float, *, running_end: Literal["real", "requested"] = "real", pending: Literal["real", "none"] = "real"
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The busy profile from ``t`` on of the jobs submitted by ``t`` only, told some of their real future.

        Not what a policy may see (:meth:`observe` is): it reads the trace's hindsight, to bound what a predictor
        of the present queue could reach at best. Jobs submitted after ``t`` are left out, so the profile differs
        from the real one (:attr:`busy_profile`) only by work that did not exist at ``t``.

        Parameters
        ----------
        t : float
            Submission time, epoch seconds.
        running_end : {"real", "requested"}
            Jobs running at ``t`` end at their real end, or at their start + requested walltime (at least
            ``t + 60`` s, as :class:`QueuePredictor` plans; the real end where the request is unknown).
        pending : {"real", "none"}
            Jobs pending at ``t`` run at their real start and end (the scheduler's real order and their real
            run times), or are left out.

        Returns
        -------
        (times, busy, down) : numpy arrays of shape (K,)
            Segment starts (float, increasing, ``times[0] == t``; segment ``k`` is ``[times[k], times[k+1])``,
            the last one open), processors busy on each (int64) and whether it lies in a downtime (bool, from
            :attr:`downtimes`: maintenance windows are taken as known).

        Raises
        ------
        ReplayError
            ``running_end`` or ``pending`` is not one of the values above.
        """
        if running_end not in ("real", "requested"):
            raise ReplayError(f"submitted_profile: running_end must be 'real' or 'requested', not {running_end!r}")
        if pending not in ("real", "none"):
            raise ReplayError(f"submitted_profile: pending must be 'real' or 'none', not {pending!r}")
        t = float(t)
        run = np.flatnonzero((self.start <= t) & (self.end > t))
        end_run = self.end[run]
        if running_end == "requested":
            req = self.requested_time[run]
            end_run = np.where(np.isfinite(req), np.maximum(self.start[run] + np.nan_to_num(req), t + 60.0), end_run)
        starts, ends, procs = [np.full(len(run), t)], [end_run], [self.processors[run]]
        if pending == "real":
            pend = np.flatnonzero((self.submit <= t) & (self.start > t))
            starts.append(self.start[pend])
            ends.append(self.end[pend])
            procs.append(self.processors[pend])
        s, e, p = np.concatenate(starts), np.concatenate(ends), np.concatenate(procs)
        edges = self.downtimes.ravel() if len(self.downtimes) else np.zeros(0)
        times = np.unique(np.concatenate([[t], s, e, edges[edges > t]]))
        zero = np.zeros(1, dtype=np.int64)
        cum_s = np.concatenate([zero, np.cumsum(p[np.argsort(s, kind="stable")])])
        cum_e = np.concatenate([zero, np.cumsum(p[np.argsort(e, kind="stable")])])
        busy = cum_s[np.searchsorted(np.sort(s), times, side="right")] - cum_e[np.searchsorted(np.sort(e), times, side="right")]
        return times, busy.astype(np.int64), self.is_down(times)

    def clairvoyant_start(self, t: float, processors: int, duration: float, *, profile: tuple | None = None, **given) -> float:
        """Earliest start of a probe submitted at ``t`` in :meth:`submitted_profile` (no job delayed): the start a
        predictor that knew the jobs' futures as ``given`` says, but not the jobs still to come, would predict.

        ``duration`` is the seconds the hole must last (the probe's run time or its request); ``profile`` a
        :meth:`submitted_profile` to reuse for several probes (then ``given`` is ignored); ``given`` its
        ``running_end`` and ``pending``. Epoch seconds, inf when no hole is ever long enough. With nothing
        submitted after ``t`` this is :meth:`probe_start` (the ground truth).

        Raises
        ------
        ReplayError
            ``processors`` is outside 1..capacity, or ``given`` is invalid.
        """
        if processors <= 0 or processors > self.capacity:
            raise ReplayError(f"a probe needs 1..{self.capacity} processors at site {self.name!r}, not {processors}")
        times, busy, down = self.submitted_profile(t, **given) if profile is None else profile
        return earliest_fit(times, (busy + int(processors) <= self.capacity) & ~down, float(t), float(duration))

    # ----------------------------------------------------------------------------------------- what a policy sees

    def observe(self, t: float, *, telemetry_window_s: float = 14 * DAY) -> SiteObservation:
        """The site as a policy may see it at ``t`` (epoch seconds).

        Pending jobs (``submit <= t < start``) with processors and requested
        walltimes; running jobs (``start <= t < end``) with start, processors and
        requested walltimes but not their ends; busy processors; whether the site
        is known to be down (:meth:`known_down`: only once the downtime has lasted
        ``downtime_min_s``; before, nothing at ``t`` tells it from an idle machine);
        and telemetry of jobs that ended in ``[t - telemetry_window_s, t)``
        (run/requested ratios, waits).
        """
        t = float(t)
        pend = np.flatnonzero((self.submit <= t) & (self.start > t))
        pend = pend[np.lexsort((pend, self.submit[pend]))]
        run = np.flatnonzero((self.start <= t) & (self.end > t))
        run = run[np.argsort(self.start[run], kind="stable")]
        lo, hi = np.searchsorted(self.end[self._by_end], [t - telemetry_window_s, t], side="left")
        ratios = self._ratio_by_end[lo:hi]
        ratios = ratios[np.isfinite(ratios)]
        a_lo, a_hi = np.searchsorted(self._submit_sorted, [t - telemetry_window_s, t], side="left")
        arr = self._by_submit[a_lo:a_hi]
        k_lo = max(int(np.searchsorted(self.times, t - telemetry_window_s, side="right")) - 1, 0)
        k_hi = int(np.searchsorted(self.times, t, side="left"))
        p_times = self.times[k_lo:k_hi].copy()
        if len(p_times):
            p_times[0] = max(p_times[0], t - telemetry_window_s)
        # a downtime is known once it has lasted downtime_min_s; only that part of it counts
        known = self.downtimes[self.downtimes[:, 0] + (self.downtime_min_s or 0.0) <= t] if len(self.downtimes) else self.downtimes
        p_down = np.zeros(len(p_times), dtype=bool)
        for a, b in known:
            p_down |= (p_times >= a) & (p_times < b)
        telemetry = Telemetry(
            ratios=ratios,
            waits=self._wait_by_end[lo:hi],
            window_s=float(telemetry_window_s),
            arrival_submit=self.submit[arr],
            arrival_processors=self.processors[arr],
            arrival_requested=self.requested_time[arr],
            arrival_run=np.where(self.end[arr] <= t, self.run_time[arr], np.nan),
            profile_times=p_times,
            profile_busy=self.busy_profile[k_lo:k_hi],
            profile_down=p_down,
        )
        return SiteObservation(
            site=self.name,
            time=t,
            capacity=self.capacity,
            busy=int(self.processors[run].sum()),
            down=bool(self.known_down(t)),
            pending_submit=self.submit[pend],
            pending_processors=self.processors[pend],
            pending_requested=self.requested_time[pend],
            running_start=self.start[run],
            running_processors=self.processors[run],
            running_requested=self.requested_time[run],
            telemetry=telemetry,
        )

    # ----------------------------------------------------------------------------------------- scheduler latency

    def dispatch_latency(self, quantile: float = 5.0) -> float | None:
        """The site's scheduling latency: the ``quantile``-th percentile of its real positive waits, seconds.

        The shortest waits a job ever sees are the scheduler's cycle plus launch
        overhead (Theta's Cobalt: tens of seconds; HPC2N's Maui: about a second).
        None when the trace has no positive wait (all zero, or simulated
        from a log without waits, where the caller must choose a value).
        """
        w = self.wait[self.wait > 0]
        return float(np.percentile(w, quantile)) if len(w) else None


# --------------------------------------------------------------------------------------------- predictor


class PlannedProfile:
    """Planned free processors from ``times[0]`` on: segment starts ``times`` (the last segment is open), ``free`` per segment."""

    def __init__(self, times: np.ndarray, free: np.ndarray, capacity: int):
        self.times, self.free, self.capacity = np.asarray(times, dtype=np.float64), np.asarray(free, dtype=np.int64), int(capacity)

    def earliest_start(self, processors: int, duration: float, not_before: float | None = None) -> float:
        """Earliest start (epoch seconds, ``>= not_before``) at which ``processors`` stay free for ``duration`` seconds."""
        if processors > self.capacity:
            return float("inf")
        t = float(self.times[0]) if not_before is None else max(float(not_before), float(self.times[0]))
        return earliest_fit(self.times, self.free >= processors, t, max(float(duration), 1.0))

    def reserve(self, t0: float, t1: float, processors: int) -> None:
        """Take ``processors`` off ``[t0, t1)``."""
        for x in (t0, t1):
            k = int(np.searchsorted(self.times, x, side="left"))
            if k == len(self.times) or self.times[k] != x:
                self.times = np.insert(self.times, k, x)
                self.free = np.insert(self.free, k, self.free[k - 1])
        lo, hi = np.searchsorted(self.times, [t0, t1], side="left")
        self.free[lo:hi] -= processors


def qbets_bound(waits, quantile: float, confidence: float = 0.95) -> float | None:
    """QBETS' upper confidence bound on the ``quantile``-th percentile of a site's waits (Nurmi, Brevik &
    Wolski, "QBETS: Queue Bounds Estimation from Time Series", JSSPP 2007, section 3).

    With the ``n`` waits sorted, the bound is the ``k``-th smallest, ``k`` the least index with
    ``P(Binomial(n, q) < k) >= confidence``: the true ``q``-quantile lies below it with that confidence
    (a distribution-free order-statistic bound).

    Parameters
    ----------
    waits : array_like of float, shape (n,)
        Recent waits, seconds.
    quantile : float
        Percent, 0 < quantile < 100.
    confidence : float
        0 < confidence < 1.

    Returns
    -------
    float or None
        Seconds; None when ``n`` is too small for a bound at that confidence.
    """
    w = np.sort(np.asarray(waits, dtype=np.float64)[np.isfinite(np.asarray(waits, dtype=np.float64))])
    n, q = len(w), float(quantile) / 100.0
    if n == 0:
        return None
    # P(X < k) = P(X <= k - 1) for X ~ Binomial(n, q), k = 1..n
    hit = np.flatnonzero(binom.cdf(np.arange(n), n, q) >= confidence)
    if not len(hit):
        return None
    return float(w[int(hit[0])])  # k = hit + 1 -> the k-th smallest is w[k - 1]


class QueuePredictorConfig(BaseModel):
    """A :class:`QueuePredictor`'s settings, validated (unknown fields refused).

    The defaults are the plan specified before any evaluation (median, now, requested).
    ``ratio_quantile`` is the per-site walltime-overestimate correction: the percentile of recent
    run/requested ratios a job's request is scaled by (50: the median).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio_clip: tuple[float, float] = Field((0.05, 1.0), description="run/requested ratio kept within [lo, hi]")
    ratio_quantile: float = Field(50.0, gt=0, lt=100, description="percentile of past run/requested ratios used as r")
    default_ratio: float = Field(1.0, gt=0, description="r when fewer than min_jobs jobs ended in the window")
    min_jobs: int = Field(10, ge=1)
    running_end: Literal["median", "conditional", "requested"] = "median"
    pending_start: Literal["now", "next_release"] = "now"
    pending_duration: Literal["expected", "requested"] = Field("expected", description="pending jobs planned for r x request, or their full request (Slurm's own plan)")
    probe_duration: Literal["requested", "expected"] = "requested"
    arrivals: Literal["none", "previous_day", "previous_week"] = "none"
    arrival_horizon_s: float = Field(DAY, gt=0)
    history: Literal["none", "floor", "qbets"] = "none"
    history_quantile: float = Field(50.0, gt=0, lt=100)
    history_confidence: float = Field(0.95, gt=0, lt=1, description="QBETS' confidence level")
    history_lookback_s: float = Field(7 * DAY, gt=0)
    down_penalty_s: float = Field(6 * _HOUR, ge=0)
    fits_now: bool = Field(False, description="a probe that fits in the processors free now is predicted to start now")

    @field_validator("ratio_clip")
    @classmethod
    def _clip_ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not (0 < v[0] <= v[1]):
            raise ValueError(f"need 0 < lo <= hi, got {v}")
        return v


class QueuePredictor:
    """Predict a probe's start at a site from a :class:`SiteObservation` only.

    1. ``r`` = the ``ratio_quantile``-th percentile (default: the median) of the site's run/requested
       ratios over jobs that ended in the telemetry window, clipped to ``ratio_clip``
       (``default_ratio`` when fewer than ``min_jobs`` jobs ended): the per-site walltime-overestimate correction.
    2. Running jobs' expected ends (``running_end``):
       ``"median"``: ``max(start + r * requested, t)``;
       ``"conditional"``: ``start + requested * m``, with ``m`` the median ratio of the
       past jobs whose ratio exceeds the job's elapsed fraction ``(t - start) / requested``
       (it has already run that long); where fewer than ``min_jobs`` past jobs ran
       that long, the requested end, and at least ``t + 60 s``;
       ``"requested"``: ``start + requested`` (what Slurm's own plan assumes).
    3. Pending jobs, in submission (FCFS) order, each get a conservative-backfill
       reservation (a forward simulation of the site's scheduler from its pending queue): the
       earliest hole of ``r * requested`` seconds (``pending_duration="expected"``) or of the
       full request (``"requested"``, as ``sbatch --test-only`` plans) in the planned profile,
       no earlier than ``t`` (``pending_start="now"``) or, with ``"next_release"``, than
       the first expected end of a running job (the live scheduler has just declined to
       start them in the processors free now; with nothing running they are left out).
    4. Optionally (``arrivals="previous_day"`` or ``"previous_week"``) the jobs that will
       arrive in the next ``arrival_horizon_s`` seconds are forecast as a replay of those
       that arrived one day (week) earlier: each is planned, in arrival order, at the
       earliest hole at or after its shifted arrival time, for its real run time where it
       has ended (else ``r * requested``).
    5. The probe takes the earliest hole of its own duration after them (it delays nobody):
       its requested walltime (``probe_duration="requested"``) or ``r`` times it.
    6. A site that is known to be down is not expected back before ``t + down_penalty_s``.
    7. Optionally the prediction is floored by the site's history: ``history="floor"``: the
       ``history_quantile``-th percentile of the waits the same probe would have had, submitted
       hourly over the last ``history_lookback_s`` seconds, in the site's recorded busy profile
       (:meth:`Telemetry.past_probe_waits`); ``history="qbets"``: QBETS' upper bound
       (:func:`qbets_bound`, confidence ``history_confidence``) on that percentile of the real
       waits of the jobs that ended in the telemetry window, applied only when the probe does not
       fit in the processors free now.
    8. Optionally (``fits_now=True``) a probe that fits in the processors free now (the site not known
       to be down) is predicted to start now, as a scheduler starts (backfills) a job that fits at once;
       the plan of steps 2-7 is used only for sites where it does not fit. (The plan reserves holes for
       every pending job first, which on a large machine whose queue waits for big allocations wrongly
       delays a small probe the real scheduler would backfill.)

    Parameters
    ----------
    config : QueuePredictorConfig, optional
        The settings; or give them as keyword arguments (not both).
    **settings
        Fields of :class:`QueuePredictorConfig`.

    Raises
    ------
    ReplayError
        A setting is unknown or invalid (the message names the field), or both ``config`` and keywords are given.
    """

    def __init__(self, config: QueuePredictorConfig | None = None, **settings):
        if config is not None and settings:
            raise ReplayError(f"QueuePredictor: give config or keyword settings, not both (got {sorted(settings)})")
        if config is None:
            try:
                config = QueuePredictorConfig(**settings)
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(x) for x in err["loc"]) or "?"
                raise ReplayError(f"QueuePredictor: field {where!r}: {err['msg']} (got {err.get('input')!r})") from None
        self.config = config

    def __getattr__(self, name: str):
        cfg = self.__dict__.get("config")
        if cfg is not None and name in QueuePredictorConfig.model_fields:
            return getattr(cfg, name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"QueuePredictor({', '.join(f'{k}={v!r}' for k, v in self.config.model_dump().items() if v != QueuePredictorConfig.model_fields[k].default)})"

    def params(self) -> dict:
        """The predictor's settings (JSON-ready)."""
        return self.config.model_dump(mode="json")

    def ratio(self, obs: SiteObservation) -> float:
        """The run/requested ratio ``r`` (step 1)."""
        return obs.telemetry.median_ratio(self.ratio_clip, self.default_ratio, self.min_jobs, self.ratio_quantile)

    def expected_ends(self, obs: SiteObservation) -> np.ndarray:
        """Expected end (epoch seconds, ``>= t``) of each running job (step 2)."""
        t = obs.time
        req = np.nan_to_num(obs.running_requested, nan=0.0)
        if self.running_end == "median":
            return np.maximum(obs.running_start + self.ratio(obs) * req, t)
        if self.running_end == "requested":
            return np.maximum(obs.running_start + req, t + 60.0)
        past = np.sort(obs.telemetry.ratios)
        with np.errstate(divide="ignore", invalid="ignore"):
            elapsed = np.where(req > 0, (t - obs.running_start) / req, np.inf)
        k = np.searchsorted(past, elapsed, side="right")  # past[k:] ran longer than this job has so far
        m = len(past) - k
        enough = m >= self.min_jobs
        lo = np.clip(k + (m - 1) // 2, 0, max(len(past) - 1, 0))
        hi = np.clip(k + m // 2, 0, max(len(past) - 1, 0))
        cond = 0.5 * (past[lo] + past[hi]) if len(past) else np.zeros(len(req))
        ends = np.where(enough, obs.running_start + req * cond, obs.running_start + req)
        return np.maximum(ends, t + 60.0)

    def plan(self, obs: SiteObservation) -> PlannedProfile:
        """The planned free-processor profile after the running and pending jobs (steps 1-3)."""
        r, cap = self.ratio(obs), obs.capacity
        t = obs.time + (self.down_penalty_s if obs.down else 0.0)
        ends = np.maximum(self.expected_ends(obs), t)
        later = ends > t
        ev, inv = np.unique(ends[later], return_inverse=True)
        released = np.zeros(len(ev), dtype=np.int64)
        np.add.at(released, inv.reshape(-1), obs.running_processors[later])
        freed_now = int(obs.running_processors[~later].sum())
        times = np.concatenate([[t], ev])
        free = cap - obs.busy + freed_now + np.concatenate([[0], np.cumsum(released)])
        profile = PlannedProfile(times, free, cap)
        if self.pending_start == "next_release":
            if not len(ev):
                return profile
            not_before = float(ev[0])
        else:
            not_before = t
        scale = r if self.pending_duration == "expected" else 1.0
        durations = np.maximum(scale * np.nan_to_num(obs.pending_requested, nan=0.0), 1.0)
        for p, d in zip(obs.pending_processors.tolist(), durations.tolist()):
            if p > cap:
                continue  # can never run here
            c = profile.earliest_start(p, d, not_before)
            profile.reserve(c, c + d, p)
        if self.arrivals != "none":
            shift = DAY if self.arrivals == "previous_day" else 7 * DAY
            tel = obs.telemetry
            arrive = tel.arrival_submit + shift
            sel = np.flatnonzero((arrive >= obs.time) & (arrive < obs.time + self.arrival_horizon_s))
            run = np.where(np.isnan(tel.arrival_run[sel]), r * np.nan_to_num(tel.arrival_requested[sel], nan=0.0), tel.arrival_run[sel])
            for a, p, d in zip(arrive[sel].tolist(), tel.arrival_processors[sel].tolist(), np.maximum(run, 1.0).tolist()):
                if p > cap:
                    continue
                c = profile.earliest_start(p, d, max(a, t))
                profile.reserve(c, c + d, p)
        return profile

    def probe_duration_s(self, obs: SiteObservation, requested_time: float) -> float:
        """Seconds the probe's hole must last (step 4)."""
        return float(requested_time) * (self.ratio(obs) if self.probe_duration == "expected" else 1.0)

    def predict_start(self, obs: SiteObservation, processors: int, requested_time: float, *, profile: PlannedProfile | None = None) -> float:
        """Predicted start (epoch seconds) of a probe of ``processors`` asking ``requested_time`` seconds.

        Pass ``profile=self.plan(obs)`` to reuse one plan for several probes at the same site and time.
        """
        if self.fits_now and obs.free >= processors:
            return float(obs.time)
        profile = self.plan(obs) if profile is None else profile
        d = self.probe_duration_s(obs, requested_time)
        start = profile.earliest_start(processors, d)
        if self.history == "floor":
            waits, _ = obs.telemetry.past_probe_waits(obs.time, processors, d, obs.capacity, lookback_s=self.history_lookback_s)
            if len(waits):
                start = max(start, obs.time + float(np.percentile(waits, self.history_quantile)))
        elif self.history == "qbets" and obs.free < processors:
            bound = qbets_bound(obs.telemetry.waits, self.history_quantile, self.history_confidence)
            if bound is not None:
                start = max(start, obs.time + bound)
        return start
