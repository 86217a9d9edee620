"""Metric events of training runs: the writer every run uses, and the reader a monitor (or widget) uses.

Every run (:mod:`lab.training.run`) appends events to the lab's shared event log
(:class:`lab.events.EventLog`, one SQLite file, by default ``<run_dir>/../events.sqlite``, so
sibling runs share one file), with ``key`` = the run id and ``source`` = ``"rank<r>"``, and rank 0
writes the same scalars to TensorBoard event files in ``<run_dir>/tb``. Event kinds and payloads:

``train.run`` (rank 0, at every start, including resumes)
    ``config`` (the :class:`~lab.training.run.TrainConfig` as JSON data), ``world_size``,
    ``n_params``, ``vocab_size``, ``device``, ``backend``, ``start_step`` (0, or the checkpoint
    resumed from), ``run_dir``, ``tensorboard_dir``.
``train.step`` (rank 0, every step)
    ``step`` (1-based), ``loss`` (training loss of the step, mean over ranks, nats/token), ``lr``,
    ``step_s`` (wall seconds of forward + backward + optimizer step), ``compute_s`` and ``comm_s``
    (``step_s`` split; see :mod:`lab.training.run` for how communication is timed),
    ``bytes_sent`` (payload bytes this rank handed to gradient collectives in the step; 0 at world
    size 1; None when the comm hook keeps no accounting), ``dense_bytes`` (the fp32 all-reduce
    payload of all gradients, ``4 * n_params``, for comparison), ``grad_rel_err`` (relative L2 error
    the codec reported, or None), ``tokens`` (tokens in the global batch), ``tokens_per_s``,
    and optimizer extras (``scape``: ``k``, ``coverage``, ``mask_changed``).
``train.eval`` (rank 0)
    ``step``, ``val_loss`` (mean over the validation windows, nats/token), ``eval_s``.
``train.checkpoint`` (rank 0)
    ``step``, ``path``.
``train.status`` (every rank)
    ``rank``, ``state`` (``started``, ``heartbeat``, ``finished``, ``stopped``, ``failed``), ``step``
    (steps done), ``pid``, ``host``; ``failed`` adds ``error`` (the exception's type and message)
    and ``traceback``; ``finished``/``stopped`` add ``param_sha256`` (digest of the replica's
    parameters). Heartbeats come from a background thread every ``heartbeat_s`` seconds.

Reading: :class:`RunMonitor` works while runs write from other processes (SQLite WAL); a rank whose
latest status is ``started``/``heartbeat`` older than ``heartbeat_timeout_s`` is reported ``dead``.
A resumed run rewrites the steps between its checkpoint and the crash; readers keep the newest
event of each step.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lab.events import Event, EventLog

__all__ = [
    "KIND_CHECKPOINT",
    "KIND_EVAL",
    "KIND_FAILURE",
    "KIND_SWAP",
    "KIND_RUN",
    "KIND_STATUS",
    "KIND_STEP",
    "MonitorUpdate",
    "RunMonitor",
    "RunRecorder",
    "STEP_COLUMNS",
    "UNITS",
    "ema_smooth",
    "series_frame",
    "write_csv",
]

KIND_RUN, KIND_STEP, KIND_EVAL = "train.run", "train.step", "train.eval"
KIND_CHECKPOINT, KIND_STATUS = "train.checkpoint", "train.status"
KINDS = [KIND_RUN, KIND_STEP, KIND_EVAL, KIND_CHECKPOINT, KIND_STATUS]
#: Hot-swap runs (:mod:`lab.training.resilience`): the coordinator's ``train.failure`` (``rank``,
#: ``worker``, ``pid``, ``kind``: killed/hung/transient/no_spare, ``detail``, ``step``) and
#: ``train.swap`` (``rank``, ``old_worker``, ``old_pid``, ``new_worker``, ``new_pid``, ``generation``
#: resumed from, ``restore``: memory/disk/fresh) events.
KIND_FAILURE, KIND_SWAP = "train.failure", "train.swap"
TERMINAL = ("finished", "stopped", "failed")
#: Columns of :meth:`RunMonitor.metrics` (besides the ``step`` index).
STEP_COLUMNS = ["time", "loss", "lr", "step_s", "compute_s", "comm_s", "bytes_sent", "dense_bytes",
                "grad_rel_err", "tokens", "tokens_per_s", "val_loss"]
_TB_SCALARS = {  # payload key -> TensorBoard tag
    "loss": "train/loss", "lr": "train/lr", "step_s": "time/step_s", "compute_s": "time/compute_s",
    "comm_s": "time/comm_s", "bytes_sent": "comm/bytes_sent", "grad_rel_err": "comm/grad_rel_err",
    "tokens_per_s": "throughput/tokens_per_s",
}


#: Unit of each metric column (``""``: a ratio, no unit), as exported tables and axis titles give them.
UNITS = {"time": "s since the epoch", "loss": "nats/token", "lr": "", "step_s": "s", "compute_s": "s", "comm_s": "s",
         "bytes_sent": "bytes", "dense_bytes": "bytes", "grad_rel_err": "", "tokens": "tokens", "tokens_per_s": "tokens/s",
         "val_loss": "nats/token"}
#: The x column of :func:`series_frame` for each x mode.
X_COLUMNS = {"step": "step", "time": "wall_time_s"}


def ema_smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's scalar smoothing: a debiased exponential moving average, ``weight`` in [0, 1)
    (0: the values themselves). Non-finite values are passed through and do not enter the average.

    Raises
    ------
    ValueError
        ``weight`` outside [0, 1).
    """
    w = float(weight)
    if not 0.0 <= w < 1.0:
        raise ValueError(f"ema_smooth: weight must be in [0, 1), got {weight!r}")
    out, last, n = [], 0.0, 0
    lo, hi = float("inf"), float("-inf")
    for v in values:
        v = float(v)
        if v != v or v in (float("inf"), float("-inf")):
            out.append(v)
            continue
        last, n = last * w + (1.0 - w) * v, n + 1
        lo, hi = min(lo, v), max(hi, v)
        # a weighted mean of the values so far lies within their range: clip the rounding error
        # (a constant series stays exactly constant instead of wobbling in its last digits)
        out.append(min(max(last / (1.0 - w**n), lo), hi))
    return out


def series_frame(series: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]], *, x: str = "step",
                 smoothing: float = 0.0, smoothed: Collection[str] = ()) -> pd.DataFrame:
    """The points a chart of training runs shows, as one long table (one row per run, metric and point).

    Parameters
    ----------
    series : mapping run id -> metric column -> (x list, y list)
        What is drawn, as :meth:`RunMonitor.series` returns it for each run shown (already thinned to the
        chart's ``max_points``), in the order the rows should come.
    x : {"step", "time"}
        What the x values are: the step (1-based), or wall seconds since the run's first start.
    smoothing : float in [0, 1)
        TensorBoard's smoothing weight the chart draws with (:func:`ema_smooth`).
    smoothed : collection of str
        The metrics drawn smoothed (sparse ones, such as ``val_loss``, are drawn as logged).

    Returns
    -------
    pandas.DataFrame
        Columns ``run_id`` (str), ``metric`` (str), ``unit`` (str, :data:`UNITS`), the x column (``step``,
        int64, or ``wall_time_s``, float64; :data:`X_COLUMNS`), ``value`` (float64, as logged),
        ``smoothed`` (float64: :func:`ema_smooth` of the metric's values with ``smoothing``, NaN where the
        metric is not smoothed or ``smoothing`` is 0) and ``smoothing`` (the weight, float64).

    Raises
    ------
    ValueError
        ``x`` is not ``"step"``/``"time"``, ``smoothing`` outside [0, 1), a metric is not one of
        :data:`STEP_COLUMNS` (named with its run), or a series' x and y differ in length.
    """
    if x not in X_COLUMNS:
        raise ValueError(f"series_frame: x must be 'step' or 'time', got {x!r}")
    w = float(smoothing)
    if not 0.0 <= w < 1.0:
        raise ValueError(f"series_frame: smoothing must be in [0, 1), got {smoothing!r}")
    x_col = X_COLUMNS[x]
    parts = []
    for run_id, columns in series.items():
        for metric, (xs, ys) in columns.items():
            if metric not in UNITS:
                raise ValueError(f"series_frame: run {run_id!r} has unknown metric {metric!r}; choose from {STEP_COLUMNS}")
            if len(xs) != len(ys):
                raise ValueError(f"series_frame: run {run_id!r} metric {metric!r} has {len(xs)} x values but {len(ys)} y values")
            if not len(ys):
                continue
            values = [float(v) for v in ys]
            smooth = ema_smooth(values, w) if w > 0 and metric in smoothed else [float("nan")] * len(values)
            parts.append(pd.DataFrame({"run_id": run_id, "metric": metric, "unit": UNITS[metric], x_col: list(xs),
                                       "value": values, "smoothed": smooth, "smoothing": w}))
    columns = ["run_id", "metric", "unit", x_col, "value", "smoothed", "smoothing"]
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in columns})
    return frame[columns].astype({"run_id": str, "metric": str, "unit": str, x_col: "int64" if x == "step" else "float64",
                                  "value": "float64", "smoothed": "float64", "smoothing": "float64"})


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write ``frame`` (say, :func:`series_frame`'s table) to ``path`` as CSV (UTF-8, a header row, no index,
    floats as the shortest text that reads back the same), atomically: the file is written beside ``path`` and renamed over it, so a
    failure leaves an existing file as it was. Returns the path.

    Raises
    ------
    FileNotFoundError
        ``path``'s folder does not exist (named).
    IsADirectoryError
        ``path`` is a folder.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"write_csv: folder {str(path.parent)!r} does not exist (for {str(path)!r})")
    if path.is_dir():
        raise IsADirectoryError(f"write_csv: {str(path)!r} is a folder, not a file name")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        frame.to_csv(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def open_log(path: str | Path) -> EventLog:
    """The shared :class:`lab.events.EventLog` (which retries the WAL switch when several ranks
    create the file at once). Raises :class:`lab.events.EventLogError` if it cannot be opened."""
    return EventLog(path)


class RunRecorder:
    """Writes one rank's events (and, on rank 0, TensorBoard scalars) for one run.

    Parameters
    ----------
    events_path : str or pathlib.Path
        The shared event log (created if missing).
    run_id : str
        The run's id (the events' ``key``).
    rank : int
    tensorboard_dir : path, optional
        Where rank 0 writes TensorBoard event files; None: no TensorBoard.
    purge_step : int, optional
        On a resume, the first step to be rewritten: TensorBoard then discards the older events of
        this and later steps from the previous attempt.

    Raises
    ------
    lab.events.EventLogError
        The event log cannot be opened.
    """

    def __init__(self, events_path: str | Path, run_id: str, rank: int, *, tensorboard_dir: str | Path | None = None,
                 purge_step: int | None = None):
        self.events_path, self.run_id, self.rank = Path(events_path), run_id, int(rank)
        self.source = f"rank{self.rank}"
        self.log = open_log(self.events_path)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(tensorboard_dir), purge_step=purge_step, flush_secs=5)
        self._hb_stop: threading.Event | None = None
        self._hb_thread: threading.Thread | None = None

    # ----------------------------------------------------------------- writing
    def _append(self, kind: str, payload: dict[str, Any]) -> int:
        return self.log.append(self.source, kind, self.run_id, payload)

    def status(self, state: str, step: int, **extra: Any) -> int:
        """A ``train.status`` event for this rank (``extra`` goes into the payload)."""
        return self._append(KIND_STATUS, {"rank": self.rank, "state": state, "step": int(step), "pid": self.pid,
                                          "host": self.host, **extra})

    def run_started(self, **payload: Any) -> int:
        """The ``train.run`` event (rank 0)."""
        return self._append(KIND_RUN, payload)

    def step(self, step: int, **metrics: Any) -> int:
        """A ``train.step`` event and its TensorBoard scalars (None values are skipped in TensorBoard)."""
        seq = self._append(KIND_STEP, {"step": int(step), **metrics})
        if self.tb is not None:
            for key, tag in _TB_SCALARS.items():
                value = metrics.get(key)
                if value is not None:
                    self.tb.add_scalar(tag, float(value), int(step))
        return seq

    def eval(self, step: int, val_loss: float, **extra: Any) -> int:
        """A ``train.eval`` event and the ``val/loss`` scalar."""
        seq = self._append(KIND_EVAL, {"step": int(step), "val_loss": float(val_loss), **extra})
        if self.tb is not None:
            self.tb.add_scalar("val/loss", float(val_loss), int(step))
            self.tb.flush()
        return seq

    def checkpoint(self, step: int, path: str | Path) -> int:
        return self._append(KIND_CHECKPOINT, {"step": int(step), "path": str(path)})

    # ----------------------------------------------------------------- heartbeat
    def start_heartbeat(self, interval_s: float, step_of: Callable[[], int]) -> None:
        """Append a ``heartbeat`` status every ``interval_s`` seconds from a daemon thread (its own
        database connection), reporting ``step_of()``; :meth:`stop_heartbeat` ends it."""
        self.stop_heartbeat()
        stop = threading.Event()

        def beat() -> None:
            log = open_log(self.events_path)
            try:
                while not stop.wait(interval_s):
                    log.append(self.source, KIND_STATUS, self.run_id,
                               {"rank": self.rank, "state": "heartbeat", "step": int(step_of()), "pid": self.pid, "host": self.host})
            finally:
                log.close()

        self._hb_stop, self._hb_thread = stop, threading.Thread(target=beat, name=f"heartbeat-{self.run_id}-r{self.rank}", daemon=True)
        self._hb_thread.start()

    def stop_heartbeat(self) -> None:
        if self._hb_thread is not None:
            self._hb_stop.set()
            self._hb_thread.join()
            self._hb_thread = self._hb_stop = None

    def close(self) -> None:
        """Stop the heartbeat, flush and close TensorBoard and the log."""
        self.stop_heartbeat()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
            self.tb = None
        self.log.close()


@dataclass
class MonitorUpdate:
    """What :meth:`RunMonitor.follow` found since a cursor.

    Attributes
    ----------
    cursor : int
        Pass it to the next :meth:`RunMonitor.follow` call.
    events : list of lab.events.Event
        Every new training event, in order.
    steps : pandas.DataFrame
        New ``train.step`` rows: ``run_id``, ``step`` and :data:`STEP_COLUMNS` but ``val_loss``.
    evals : pandas.DataFrame
        New ``train.eval`` rows: ``run_id``, ``step``, ``time``, ``val_loss``.
    runs : set of str
        Run ids that got any new event.
    """

    cursor: int
    events: list[Event] = field(default_factory=list)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    runs: set[str] = field(default_factory=set)


def _step_frame(events: list[Event], run_column: bool) -> pd.DataFrame:
    cols = (["run_id"] if run_column else []) + ["step"] + [c for c in STEP_COLUMNS if c != "val_loss"]
    rows = [{**({"run_id": e.key} if run_column else {}), **{c: e.payload.get(c) for c in cols if c not in ("run_id", "time")},
             "time": e.time} for e in events]
    frame = pd.DataFrame(rows, columns=cols)
    for c in cols:
        if c not in ("run_id", "step"):
            frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
    frame["step"] = frame["step"].astype("int64")
    return frame


def _eval_frame(events: list[Event], run_column: bool) -> pd.DataFrame:
    cols = (["run_id"] if run_column else []) + ["step", "time", "val_loss"]
    rows = [{**({"run_id": e.key} if run_column else {}), "step": int(e.payload["step"]), "time": e.time,
             "val_loss": float(e.payload["val_loss"])} for e in events]
    frame = pd.DataFrame(rows, columns=cols)
    return frame.astype({"step": "int64", "time": "float64", "val_loss": "float64"})


class RunMonitor:
    """Reads training runs from an event log, also while they write from other processes.

    Parameters
    ----------
    events_path : str or pathlib.Path
        The shared event log (created empty if missing, so a monitor may start before its runs).
    heartbeat_timeout_s : float, default 30
        A rank whose latest status is ``started`` or ``heartbeat`` and older than this is ``dead``.
        Keep it a few times the runs' ``heartbeat_s``.

    Examples
    --------
    >>> mon = RunMonitor("runs/events.sqlite")          # doctest: +SKIP
    >>> mon.runs()[["run_id", "state", "last_step"]]    # doctest: +SKIP
    >>> mon.metrics("fp32")[["loss", "val_loss"]]       # doctest: +SKIP
    >>> update = mon.follow(0); update = mon.follow(update.cursor)   # doctest: +SKIP
    """

    def __init__(self, events_path: str | Path, *, heartbeat_timeout_s: float = 30.0):
        self.events_path = Path(events_path)
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.log = open_log(self.events_path)

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> RunMonitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- queries
    def run_ids(self) -> list[str]:
        """Ids of every run with a ``train.run`` event, in order of first start."""
        seen: dict[str, None] = {}
        for e in self.log.tail(0, kinds=[KIND_RUN]):
            seen.setdefault(e.key, None)
        return list(seen)

    def runs(self, *, now: float | None = None) -> pd.DataFrame:
        """One row per run: ``run_id``, ``started`` (epoch s of the first start), ``starts`` (how many
        times it started: resumes count), ``world_size``, ``optimizer``, ``comm``, ``steps`` (target),
        ``last_step`` (newest ``train.step``), ``loss`` (its loss), ``val_loss`` (newest), ``state``
        (see :meth:`run_state`), ``n_params``, ``run_dir``."""
        starts: dict[str, list[Event]] = {}
        for e in self.log.tail(0, kinds=[KIND_RUN]):
            starts.setdefault(e.key, []).append(e)
        rows = []
        for run_id, evs in starts.items():
            last = evs[-1].payload
            cfg = last.get("config", {})
            step_ev = self.log.tail(0, kinds=[KIND_STEP], key=run_id)
            eval_ev = self.log.tail(0, kinds=[KIND_EVAL], key=run_id)
            rows.append({
                "run_id": run_id, "started": evs[0].time, "starts": len(evs), "world_size": last.get("world_size"),
                "optimizer": cfg.get("optimizer"), "comm": cfg.get("comm"), "steps": cfg.get("steps"),
                "last_step": step_ev[-1].payload["step"] if step_ev else 0,
                "loss": step_ev[-1].payload.get("loss") if step_ev else None,
                "val_loss": eval_ev[-1].payload.get("val_loss") if eval_ev else None,
                "state": self.run_state(run_id, now=now), "n_params": last.get("n_params"), "run_dir": last.get("run_dir"),
            })
        return pd.DataFrame(rows, columns=["run_id", "started", "starts", "world_size", "optimizer", "comm", "steps",
                                           "last_step", "loss", "val_loss", "state", "n_params", "run_dir"])

    def config(self, run_id: str) -> dict[str, Any]:
        """The newest ``train.run`` payload of ``run_id`` (config, world size, ...); ``{}`` if none."""
        evs = self.log.tail(0, kinds=[KIND_RUN], key=run_id)
        return evs[-1].payload if evs else {}

    def metrics(self, run_id: str) -> pd.DataFrame:
        """Per-step metrics of ``run_id``, indexed by ``step`` (int), columns :data:`STEP_COLUMNS`
        (float64; ``time`` in epoch seconds, ``val_loss`` NaN at steps without an evaluation).
        Where a resumed run rewrote a step, the newest event wins."""
        steps = _step_frame(self.log.tail(0, kinds=[KIND_STEP], key=run_id), run_column=False)
        evals = _eval_frame(self.log.tail(0, kinds=[KIND_EVAL], key=run_id), run_column=False)
        steps = steps.drop_duplicates("step", keep="last").set_index("step").sort_index()
        evals = evals.drop_duplicates("step", keep="last").set_index("step")["val_loss"]
        steps["val_loss"] = evals.reindex(steps.index).astype("float64")
        return steps[STEP_COLUMNS]

    def series(self, run_id: str, columns: list[str] | tuple[str, ...], *, x: str = "step",
               max_points: int | None = 1000) -> dict[str, tuple[list[float], list[float]]]:
        """What a chart draws for ``run_id``: for each of ``columns`` (of :data:`STEP_COLUMNS`), the
        ``(x, y)`` lists of the steps where the metric has a value, ready to plot.

        ``x``: ``"step"`` (the step number) or ``"time"`` (wall seconds since the run's first
        start). ``max_points``: at most this many points per series (every k-th step, always with
        the newest), so a long run does not grow what a live view resends; None keeps all.

        Raises
        ------
        ValueError
            ``x`` is neither ``"step"`` nor ``"time"``, or a column is not a metric.
        """
        if x not in ("step", "time"):
            raise ValueError(f"series: x must be 'step' or 'time', got {x!r}")
        unknown = [c for c in columns if c not in STEP_COLUMNS]
        if unknown:
            raise ValueError(f"series: unknown metric column(s) {unknown}; choose from {STEP_COLUMNS}")
        m = self.metrics(run_id)
        if x == "time":
            starts = self.log.tail(0, kinds=[KIND_RUN], key=run_id)
            origin = starts[0].time if starts else (float(m["time"].min()) if len(m) else 0.0)
            xs = m["time"] - origin
        else:
            xs = pd.Series(m.index.astype("float64"), index=m.index)
        out: dict[str, tuple[list[float], list[float]]] = {}
        for column in columns:
            y = m[column].dropna()
            if max_points is not None and len(y) > max_points:
                stride = -(-len(y) // int(max_points))
                keep = list(range(len(y) - 1, -1, -stride))[::-1]  # every stride-th, ending at the newest
                y = y.iloc[keep]
            out[column] = (xs.loc[y.index].astype("float64").tolist(), y.astype("float64").tolist())
        return out

    def evals(self, run_id: str) -> pd.Series:
        """Validation loss by step (newest event per step), a float64 Series named ``val_loss``."""
        evals = _eval_frame(self.log.tail(0, kinds=[KIND_EVAL], key=run_id), run_column=False)
        return evals.drop_duplicates("step", keep="last").set_index("step")["val_loss"].sort_index()

    def status(self, run_id: str, *, now: float | None = None) -> pd.DataFrame:
        """Per-rank status of ``run_id``, indexed by ``rank``: ``state`` (``started``/``running`` while
        heartbeats are fresh, ``finished``, ``stopped``, ``failed``, ``dead``, or ``replaced``: its
        process failed and a hot-swap run's spare took the rank, whose own status is pending), ``step`` (steps
        done at the latest status), ``last_seen`` (epoch s), ``age_s`` (seconds since),
        ``pid``, ``host``, ``error`` (for ``failed``), ``param_sha256`` (for ``finished``/``stopped``),
        ``replaced_pids`` (processes that held the rank before a hot swap, oldest first).

        ``now`` (epoch seconds, default the clock) is when to judge heartbeat age."""
        now = time.time() if now is None else float(now)
        latest: dict[int, Event] = {}
        for e in self.log.tail(0, kinds=[KIND_STATUS], key=run_id):
            latest[int(e.payload["rank"])] = e
        replaced_pids: dict[int, list[int]] = {}
        for e in self.log.tail(0, kinds=[KIND_SWAP], key=run_id):
            replaced_pids.setdefault(int(e.payload["rank"]), []).append(e.payload["old_pid"])
        rows = []
        for rank in sorted(latest):
            e = latest[rank]
            state = e.payload["state"]
            age = now - e.time
            if state not in TERMINAL:
                state = "dead" if age > self.heartbeat_timeout_s else ("running" if state == "heartbeat" else "started")
            if state != "finished" and e.payload.get("pid") in replaced_pids.get(rank, ()):
                state = "replaced"  # its process failed and a spare took the rank (its first status is pending)
            rows.append({"rank": rank, "state": state, "step": e.payload.get("step"), "last_seen": e.time, "age_s": age,
                         "pid": e.payload.get("pid"), "host": e.payload.get("host"), "error": e.payload.get("error"),
                         "param_sha256": e.payload.get("param_sha256"), "replaced_pids": replaced_pids.get(rank, [])})
        cols = ["rank", "state", "step", "last_seen", "age_s", "pid", "host", "error", "param_sha256", "replaced_pids"]
        return pd.DataFrame(rows, columns=cols).set_index("rank")

    def swaps(self, run_id: str) -> pd.DataFrame:
        """Hot swaps of ``run_id`` (:mod:`lab.training.resilience`), oldest first: ``time`` (epoch s),
        ``rank`` (logical), ``old_worker``, ``old_pid``, ``new_worker``, ``new_pid`` (which process took
        which rank), ``generation`` (the step resumed from), ``restore``, and the failure's ``kind`` and
        ``detail`` (killed with its signal, hung, ...). Empty for runs without any."""
        failures = {}
        for e in self.log.tail(0, kinds=[KIND_FAILURE], key=run_id):
            failures[(e.payload.get("rank"), e.payload.get("worker"))] = e.payload
        rows = []
        for e in self.log.tail(0, kinds=[KIND_SWAP], key=run_id):
            p = e.payload
            f = failures.get((p["rank"], p["old_worker"]), {})
            rows.append({"time": e.time, "rank": p["rank"], "old_worker": p["old_worker"], "old_pid": p["old_pid"],
                         "new_worker": p["new_worker"], "new_pid": p["new_pid"], "generation": p["generation"],
                         "restore": p["restore"], "kind": f.get("kind"), "detail": f.get("detail")})
        return pd.DataFrame(rows, columns=["time", "rank", "old_worker", "old_pid", "new_worker", "new_pid", "generation",
                                           "restore", "kind", "detail"])

    def run_state(self, run_id: str, *, now: float | None = None) -> str:
        """One word for the whole run: ``failed`` if any rank failed, else ``dead`` if any rank is dead,
        else ``finished``/``stopped`` when every rank of the world is, else ``running``
        (``unknown`` with no status at all)."""
        st = self.status(run_id, now=now)
        if st.empty:
            return "unknown"
        states = set(st["state"])
        world = self.config(run_id).get("world_size") or len(st)
        if "failed" in states:
            return "failed"
        if "dead" in states:
            return "dead"
        for final in ("finished", "stopped"):
            if states == {final} and len(st) >= world:
                return final
        return "running"

    # ----------------------------------------------------------------- incremental
    def follow(self, cursor: int = 0, *, run_id: str | None = None) -> MonitorUpdate:
        """Training events after ``cursor`` (a ``seq``; 0 for everything), without blocking.

        Call again with the returned :attr:`MonitorUpdate.cursor` to get only what is newer: a widget
        polls this on a timer. ``run_id`` restricts it to one run (the cursor still advances past
        other runs' events)."""
        events = self.log.tail(int(cursor), kinds=KINDS)
        new_cursor = events[-1].seq if events else int(cursor)
        if run_id is not None:
            events = [e for e in events if e.key == run_id]
        return MonitorUpdate(
            cursor=new_cursor,
            events=events,
            steps=_step_frame([e for e in events if e.kind == KIND_STEP], run_column=True),
            evals=_eval_frame([e for e in events if e.kind == KIND_EVAL], run_column=True),
            runs={e.key for e in events},
        )
