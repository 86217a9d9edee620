"""Queue replay: the state of a site's batch queue at any time, from a workload trace.

A trace gives, per job, its submission time, wait and run time, so the queue
at time ``t`` is fully determined (the replay shows what happened, it does
not re-schedule):

* pending: submitted, not started -- ``submit <= t < start`` with ``start = submit + wait``;
* running: ``start <= t < end`` with ``end = start + run_time``;
* busy processors: the sum of running jobs' processors; free = max(capacity - busy, 0), and
  ``over_capacity_processors`` = max(busy - capacity, 0) says when and by how much the trace
  holds more than the machine (free is never negative; :meth:`QueueReplay.capacity_violations`
  lists the intervals);
* queue depth: the pending job count, and ``pending_processors``, the processors they asked for.

:class:`QueueReplay` answers these for many times at once with sorted event
arrays and :func:`numpy.searchsorted` (``O(log n)`` per time after an
``O(n log n)`` set-up), so a 1,000-point timeline of the 23,911-job Theta 2022
trace takes about a millisecond. :func:`naive_snapshots` is the plain-Python
loop over jobs it replaces (benchmark baseline and test oracle).

All times are seconds since the Unix epoch (UTC) as float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from lab.hpc.errors import ArgumentError, ReplayError
from lab.hpc.swf import SWFTrace

__all__ = ["QueueReplay", "QueueSnapshot", "WAIT_BIN_EDGES", "WAIT_BIN_LABELS", "naive_snapshots"]

_MIN, _HOUR, _DAY = 60.0, 3600.0, 86400.0
#: Default wait-time histogram edges in seconds (the last bin is open-ended).
WAIT_BIN_EDGES = np.array([0, _MIN, 10 * _MIN, _HOUR, 2 * _HOUR, 4 * _HOUR, 8 * _HOUR, 12 * _HOUR, _DAY, 2 * _DAY, 4 * _DAY, 7 * _DAY, np.inf])
#: Human-readable labels for :data:`WAIT_BIN_EDGES`, one per bin.
WAIT_BIN_LABELS = ("<1m", "1-10m", "10m-1h", "1-2h", "2-4h", "4-8h", "8-12h", "12h-1d", "1-2d", "2-4d", "4-7d", ">7d")

SNAPSHOT_COLUMNS = ("time", "pending", "running", "busy_processors", "free_processors", "over_capacity_processors", "utilization", "pending_processors")


@dataclass(frozen=True)
class QueueSnapshot:
    """Queue state at one time.

    Attributes
    ----------
    time : float
        Seconds since the Unix epoch (UTC).
    pending, running : int
        Job counts (queue depth is ``pending``).
    busy_processors : int
        Processors (nodes on Theta) held by running jobs.
    free_processors : int or None
        The rest of the capacity, ``max(capacity - busy, 0)``: never negative; None when the
        capacity is unknown.
    utilization : float
        ``busy_processors / capacity`` (NaN when the capacity is unknown); above 1 exactly when
        ``over_capacity_processors > 0``.
    pending_processors : int
        Processors of the pending jobs (allocated where the trace records it, else requested).
    over_capacity_processors : int or None
        ``max(busy - capacity, 0)``: processors the running jobs hold beyond the machine (the trace
        over-subscribes it: clock skew between start and end records, or a job larger than the
        header's machine, which :func:`~lab.hpc.swf.read_swf` warns about); None when the capacity is unknown.
    """

    time: float
    pending: int
    running: int
    busy_processors: int
    free_processors: int | None
    utilization: float
    pending_processors: int
    over_capacity_processors: int | None = None

    @property
    def over_capacity(self) -> bool:
        """True when the running jobs hold more processors than the capacity (why free is 0 while utilization > 1)."""
        return bool(self.over_capacity_processors)

    @property
    def datetime(self) -> pd.Timestamp:
        return pd.Timestamp(self.time, unit="s", tz="UTC")


class QueueReplay:
    """Replay a trace's queue: snapshots, pending/running job lists, wait-time distributions.

    Parameters
    ----------
    trace : SWFTrace
        From :func:`lab.hpc.swf.read_swf` or :func:`~lab.hpc.swf.load_trace`.
    capacity : int, optional
        Processors of the machine, a positive integer; default the header's ``MaxProcs``,
        else its ``MaxNodes`` (whichever is positive), else unknown.
    unknown_wait : {"exclude", "zero"}
        Jobs whose wait is unknown (-1) are left out of the replay (default) or, for
        logs whose submit times are really start times (NASA iPSC/860, per its header
        note), taken to start when submitted. Jobs with unknown submit or run time,
        or unknown processors (both allocated and requested), are always left out;
        ``excluded`` counts them.
    name : str, optional
        Site name for displays; default the trace file's name.

    Raises
    ------
    ReplayError
        No job can be replayed (e.g. a trace without wait times and ``unknown_wait="exclude"``);
        the message counts the jobs missing each quantity.
    ArgumentError
        ``capacity`` is not a positive integer, or ``unknown_wait`` is not one of its choices (the
        error names the argument; it is also a ValueError).

    Notes
    -----
    Processors are the trace's ``allocated_processors``, or ``requested_processors``
    where the allocation is unknown. A replay sees only the trace's jobs: near the
    trace's first day the queue is still filling (jobs submitted before it are
    missing) and after the last submission it only drains.
    """

    def __init__(
        self,
        trace: SWFTrace,
        *,
        capacity: int | None = None,
        unknown_wait: Literal["exclude", "zero"] = "exclude",
        name: str | None = None,
    ):
        if unknown_wait not in ("exclude", "zero"):
            raise ArgumentError("QueueReplay", "unknown_wait", unknown_wait, "must be 'exclude' or 'zero'")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity <= 0):
            raise ArgumentError("QueueReplay", "capacity", capacity, "must be a positive integer number of processors")
        self.trace = trace
        self.name = name or trace.name.removesuffix(".swf")
        jobs = trace.jobs
        submit = trace.submit_epoch()
        wait = jobs["wait_time"].to_numpy(dtype="float64", na_value=np.nan)
        if unknown_wait == "zero":
            wait = np.where(np.isnan(wait), 0.0, wait)
        run = jobs["run_time"].to_numpy(dtype="float64", na_value=np.nan)
        procs = jobs["allocated_processors"].to_numpy(dtype="float64", na_value=np.nan)
        procs = np.where(np.isnan(procs), jobs["requested_processors"].to_numpy(dtype="float64", na_value=np.nan), procs)
        missing = {"submit time": np.isnan(submit), "wait time": np.isnan(wait), "run time": np.isnan(run), "processors": np.isnan(procs)}
        keep = ~np.logical_or.reduce(list(missing.values()))
        self.excluded = int((~keep).sum())
        if not keep.any():
            counts = ", ".join(f"{int(m.sum())} without {what}" for what, m in missing.items() if m.any())
            hint = ""
            if unknown_wait == "exclude" and missing["wait time"].all():
                hint = "; if its submit times are start times (as in the NASA iPSC log), pass unknown_wait='zero'"
            raise ReplayError(f"trace {trace.name!r}: none of its {len(jobs)} jobs can be replayed ({counts}){hint}")
        self._rows = np.flatnonzero(keep)  # positions in trace.jobs
        self.submit = submit[keep]
        self.start = self.submit + wait[keep]
        self.end = self.start + run[keep]
        self.wait = wait[keep]
        self.processors = procs[keep].astype(np.int64)
        header = trace.header
        if capacity is None:
            capacity = next((c for c in (header.max_procs, header.max_nodes) if c is not None and c > 0), None)
        self.capacity = None if capacity is None else int(capacity)

        by_submit = np.argsort(self.submit, kind="stable")
        by_start = np.argsort(self.start, kind="stable")
        by_end = np.argsort(self.end, kind="stable")
        self._submit_sorted = self.submit[by_submit]
        self._start_sorted = self.start[by_start]
        self._end_sorted = self.end[by_end]
        zero = np.zeros(1, dtype=np.int64)
        self._procs_by_submit = np.concatenate([zero, np.cumsum(self.processors[by_submit])])
        self._procs_by_start = np.concatenate([zero, np.cumsum(self.processors[by_start])])
        self._procs_by_end = np.concatenate([zero, np.cumsum(self.processors[by_end])])
        self._wait_by_start = self.wait[by_start]

    def __len__(self) -> int:
        return len(self.submit)

    def __repr__(self) -> str:
        return f"QueueReplay({self.name!r}, jobs={len(self)}, excluded={self.excluded}, capacity={self.capacity})"

    @property
    def first_submit(self) -> float:
        """Earliest submission, epoch seconds."""
        return float(self._submit_sorted[0])

    @property
    def last_end(self) -> float:
        """Latest job end, epoch seconds."""
        return float(self._end_sorted[-1])

    @property
    def span(self) -> float:
        """``last_end - first_submit``, seconds."""
        return self.last_end - self.first_submit

    def snapshots(self, times) -> pd.DataFrame:
        """Queue state at each of ``times``.

        Parameters
        ----------
        times : array_like of float, shape (m,)
            Epoch seconds (UTC), in any order.

        Returns
        -------
        pandas.DataFrame
            ``m`` rows, columns :data:`SNAPSHOT_COLUMNS` (``time`` float64 epoch seconds; counts
            int64; ``free_processors`` and ``over_capacity_processors`` Int64, both >= 0 and
            ``<NA>`` when the capacity is unknown; ``utilization`` float64, in [0, 1] except where
            ``over_capacity_processors > 0`` says the trace over-subscribes the machine, NaN if
            the capacity is unknown).

        Raises
        ------
        ArgumentError
            A time is not a number, or is NaN or infinite (the error names ``times`` and the first bad values).
        """
        t = _times("QueueReplay.snapshots", "times", times)
        n_sub = np.searchsorted(self._submit_sorted, t, side="right")
        n_start = np.searchsorted(self._start_sorted, t, side="right")
        n_end = np.searchsorted(self._end_sorted, t, side="right")
        busy = self._procs_by_start[n_start] - self._procs_by_end[n_end]
        if self.capacity is None:
            free = pd.array(np.zeros(len(t), dtype=np.int64), dtype="Int64")
            free[:] = pd.NA
            over = free.copy()
            utilization = np.full(len(t), np.nan)
        else:
            free = pd.array(np.maximum(self.capacity - busy, 0), dtype="Int64")
            over = pd.array(np.maximum(busy - self.capacity, 0), dtype="Int64")
            utilization = busy / self.capacity
        return pd.DataFrame(
            {
                "time": t,
                "pending": n_sub - n_start,
                "running": n_start - n_end,
                "busy_processors": busy,
                "free_processors": free,
                "over_capacity_processors": over,
                "utilization": utilization,
                "pending_processors": self._procs_by_submit[n_sub] - self._procs_by_start[n_start],
            }
        )

    def snapshot(self, t: float) -> QueueSnapshot:
        """Queue state at one time ``t`` (epoch seconds); see :meth:`snapshots`."""
        df = self.snapshots([t])
        free, over = df["free_processors"].iloc[0], df["over_capacity_processors"].iloc[0]
        return QueueSnapshot(
            time=float(df["time"].iloc[0]),
            pending=int(df["pending"].iloc[0]),
            running=int(df["running"].iloc[0]),
            busy_processors=int(df["busy_processors"].iloc[0]),
            free_processors=None if pd.isna(free) else int(free),
            utilization=float(df["utilization"].iloc[0]),
            pending_processors=int(df["pending_processors"].iloc[0]),
            over_capacity_processors=None if pd.isna(over) else int(over),
        )

    def timeline(self, n: int = 1000, *, start: float | None = None, end: float | None = None) -> pd.DataFrame:
        """:meth:`snapshots` at ``n`` evenly spaced times from ``start`` to ``end`` (default: the trace's span)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ArgumentError("QueueReplay.timeline", "n", n, "must be an integer >= 1")
        start = self.first_submit if start is None else float(_times("QueueReplay.timeline", "start", start)[0])
        end = self.last_end if end is None else float(_times("QueueReplay.timeline", "end", end)[0])
        return self.snapshots(np.linspace(start, end, n))

    def capacity_violations(self) -> pd.DataFrame:
        """Intervals in which the running jobs hold more processors than the capacity.

        Real traces have them (clock skew between the scheduler's start and end records,
        or nodes outside ``MaxProcs``); the replay reports them instead of clipping.

        Returns
        -------
        pandas.DataFrame
            One row per maximal interval over capacity (back-to-back intervals are merged):
            ``start``, ``end`` (epoch seconds), ``busy_processors`` (int, the interval's peak) and
            ``duration_s``; empty when the capacity is unknown or never exceeded.
        """
        events = np.unique(np.concatenate([self.start, self.end]))
        columns = {"start": [], "end": [], "busy_processors": [], "duration_s": []}
        if self.capacity is None or len(events) < 2:
            return pd.DataFrame(columns)
        busy = self.snapshots(events[:-1])["busy_processors"].to_numpy()
        over = busy > self.capacity
        # runs of consecutive event intervals over capacity
        edges = np.diff(np.concatenate([[0], over.astype(np.int8), [0]]))
        first, last = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)  # run k covers [first[k], last[k])
        peak = np.array([busy[a:b].max() for a, b in zip(first, last)], dtype=np.int64)
        return pd.DataFrame(
            {
                "start": events[first],
                "end": events[last],
                "busy_processors": peak,
                "duration_s": events[last] - events[first],
            }
        )

    def _job_table(self, idx: np.ndarray, since: str, since_times: np.ndarray, t: float) -> pd.DataFrame:
        jobs = self.trace.jobs.iloc[self._rows[idx]]
        return pd.DataFrame(
            {
                "job_id": jobs["job_id"].to_numpy(),
                "submitted": pd.to_datetime(self.submit[idx], unit="s", utc=True),
                since: t - since_times[idx],
                "processors": self.processors[idx],
                "requested_time_s": jobs["requested_time"].to_numpy(dtype="float64", na_value=np.nan),
                "wait_s": self.wait[idx],
                "run_time_s": self.end[idx] - self.start[idx],
            }
        )

    def pending_jobs(self, t: float, limit: int | None = None) -> pd.DataFrame:
        """Jobs pending at ``t``, longest-waiting first.

        Returns
        -------
        pandas.DataFrame
            Columns ``job_id``, ``submitted`` (UTC datetime), ``waited_s`` (seconds waited so far at ``t``),
            ``processors``, ``requested_time_s``, ``wait_s`` (the job's whole wait, as the trace records it),
            ``run_time_s``; at most ``limit`` rows.
        """
        idx = np.flatnonzero((self.submit <= t) & (self.start > t))
        idx = idx[np.argsort(self.submit[idx], kind="stable")][:limit]
        return self._job_table(idx, "waited_s", self.submit, t)

    def running_jobs(self, t: float) -> pd.DataFrame:
        """Jobs running at ``t``, earliest start first: the columns of :meth:`pending_jobs`, with
        ``running_s`` (seconds since the job started) in place of ``waited_s``."""
        idx = np.flatnonzero((self.start <= t) & (self.end > t))
        idx = idx[np.argsort(self.start[idx], kind="stable")]
        return self._job_table(idx, "running_s", self.start, t)

    def wait_times(self, t0: float, t1: float) -> np.ndarray:
        """Waits (seconds, float64) of the jobs that started in ``[t0, t1)``, in start order."""
        lo, hi = np.searchsorted(self._start_sorted, [t0, t1], side="left")
        return self._wait_by_start[lo:hi]

    def wait_histogram(self, t0: float, t1: float, edges=WAIT_BIN_EDGES) -> np.ndarray:
        """Counts of jobs started in ``[t0, t1)`` per wait bin (``edges`` in seconds, default :data:`WAIT_BIN_EDGES`).

        Returns an int64 array of ``len(edges) - 1`` counts. Raises
        :class:`~lab.hpc.errors.ArgumentError` naming ``edges`` unless they are at least two
        increasing numbers.
        """
        try:
            bins = np.asarray(edges, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ArgumentError("QueueReplay.wait_histogram", "edges", edges, "must be numbers (seconds)") from None
        if len(bins) < 2 or np.isnan(bins).any() or not (np.diff(bins) > 0).all():
            raise ArgumentError("QueueReplay.wait_histogram", "edges", edges, "must be at least two strictly increasing numbers (seconds)")
        counts, _ = np.histogram(self.wait_times(t0, t1), bins=bins)
        return counts.astype(np.int64)


def _times(where: str, field: str, values) -> np.ndarray:
    """``values`` as a flat float64 array of finite epoch seconds, else :class:`ArgumentError` naming ``field``."""
    try:
        t = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ArgumentError(where, field, values, "must be numbers (epoch seconds)") from None
    if not np.isfinite(t).all():
        raise ArgumentError(where, field, values, f"must be finite epoch seconds; got {t[~np.isfinite(t)][:3].tolist()}")
    return t


def naive_snapshots(submit, wait, run, processors, times) -> list[tuple[int, int, int, int]]:
    """Plain-Python reference replay: for each time, loop over every job.

    Parameters are sequences of floats (epoch seconds / seconds / processors) of equal length.
    Returns ``(pending, running, busy_processors, pending_processors)`` per time. Used as the
    benchmark baseline and as the oracle the vectorized :class:`QueueReplay` is tested against.
    """
    jobs = list(zip(submit, wait, run, processors))
    out = []
    for t in times:
        pending = running = busy = pending_procs = 0
        for s, w, r, p in jobs:
            start = s + w
            if s <= t < start:
                pending += 1
                pending_procs += p
            elif start <= t < start + r:
                running += 1
                busy += p
        out.append((pending, running, busy, pending_procs))
    return out
