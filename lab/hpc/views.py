"""The tables the queue dashboards show, as typed rows: per-job rows of a site's queue, and what each site
showed a placement decision.

A widget only draws a :class:`Table`: each cell carries its display text *and* its sort key, computed
here, so that a click on a header sorts durations as durations ("45 min" before "2.0 h"), job ids as
numbers ("9" before "10") and puts unknown values last, whichever way the column is sorted.
:meth:`Table.view` is that ordering and filtering (by the row's group, e.g. the job state, and by text);
the browser table applies the same rule to the same keys.

Job rows come from two sources, with the same columns:

* a live :class:`~lab.hpc.schedulers.base.SiteQueue` (:func:`jobs_from_queue`): for Slurm that is
  ``squeue --json``, where a pending job's ``start_time`` is the backfill scheduler's expected start,
  the value ``squeue --start`` prints (none until the backfill has planned the job);
* a trace replay (:func:`jobs_from_replay`): the jobs pending and running at a time ``t`` of a
  :class:`~lab.hpc.queue.QueueReplay`, whose start is the one the trace recorded (what happened, not an
  estimate).

Times are epoch seconds (UTC), durations seconds; clock times are shown in UTC.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from lab.hpc.schedulers.base import JobState, JobStatus, SiteQueue

__all__ = [
    "Cell",
    "Column",
    "JobRow",
    "Row",
    "Table",
    "candidate_table",
    "decision_table",
    "event_table",
    "default_order",
    "format_duration",
    "job_id_key",
    "job_table",
    "jobs_from_queue",
    "jobs_from_replay",
]

StartKind = Literal["estimate", "started", "trace", "unknown"]
_ACTIVE = (JobState.PENDING, JobState.RUNNING)


def format_duration(seconds: float | None) -> str:
    """``seconds`` as a short duration: ``"45 s"``, ``"12.5 min"``, ``"3.2 h"``, ``"2.1 d"`` (``"?"`` for None/NaN)."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "?"
    s = float(seconds)
    sign, s = ("-" if s < 0 else ""), abs(s)
    if s < 60:
        return f"{sign}{s:.0f} s"
    if s < 3600:
        return f"{sign}{s / 60:.1f} min"
    if s < 86400 * 2:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} d"


def _walltime(seconds: float | None) -> str:
    """Slurm's ``[D-]HH:MM:SS`` (what ``sbatch -t`` takes), ``"?"`` when unknown."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "?"
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h}:{m:02d}:{s:02d}"


def job_id_key(job_id: str) -> float | str:
    """Sort key of a job id: numeric for Slurm's ``123`` and array ids ``123_4`` (so ``9 < 10 < 10_2 < 11``),
    the id itself otherwise."""
    m = re.fullmatch(r"(\d+)(?:_(\d+))?", str(job_id))
    if not m:
        return str(job_id)
    return int(m.group(1)) + (int(m.group(2)) + 1) / 1e6 if m.group(2) else float(m.group(1))


@dataclass(frozen=True)
class JobRow:
    """One job in a site's queue at one instant (``as_of``).

    Attributes
    ----------
    site, job_id : str
    state : JobState
        ``pending`` or ``running``.
    name, reason : str or None
        The job's name; why it waits (Slurm's ``Resources``, ``Priority``, ...).
    submit_time : float or None
        Epoch seconds.
    waited_s : float or None
        Seconds waited so far: for a pending job ``as_of - submit_time``, for a running one the wait it
        had (``start_time - submit_time``).
    start_time : float or None
        Epoch seconds: for a pending job the estimate (``start_kind="estimate"``: Slurm's backfill plan,
        as ``squeue --start`` shows it) or the start a trace recorded (``"trace"``); for a running job
        when it started (``"started"``); None when nobody knows (``"unknown"``).
    start_kind : {"estimate", "started", "trace", "unknown"}
    walltime_s : float or None
        Walltime asked for (the job's time limit), seconds.
    processors : int or None
        CPUs (Slurm) or processors (trace) the job holds or asks for.
    as_of : float
        When the queue was read (epoch seconds).
    """

    site: str
    job_id: str
    state: JobState
    submit_time: float | None
    waited_s: float | None
    start_time: float | None
    start_kind: StartKind
    walltime_s: float | None
    processors: int | None
    as_of: float
    name: str | None = None
    reason: str | None = None

    @property
    def starts_in_s(self) -> float | None:
        """Seconds from ``as_of`` to the (estimated) start of a pending job; None for a running one or if unknown."""
        if self.state != JobState.PENDING or self.start_time is None:
            return None
        return self.start_time - self.as_of


def _job_row(site: str, j: JobStatus, as_of: float) -> JobRow:
    pending = j.state == JobState.PENDING
    start = j.start_time
    if pending:
        waited = None if j.submit_time is None else max(0.0, as_of - j.submit_time)
        kind: StartKind = "estimate" if start is not None else "unknown"
    else:
        waited = None if j.submit_time is None or start is None else max(0.0, start - j.submit_time)
        kind = "started" if start is not None else "unknown"
    return JobRow(site=site, job_id=str(j.job_id), state=j.state, submit_time=j.submit_time, waited_s=waited, start_time=start,
                  start_kind=kind, walltime_s=None if j.time_limit_s is None else float(j.time_limit_s), processors=j.cpus,
                  as_of=as_of, name=j.name, reason=j.reason)


def jobs_from_queue(queue: SiteQueue, now: float | None = None) -> list[JobRow]:
    """The pending and running jobs of a live queue snapshot, pending first, longest-waiting first.

    Parameters
    ----------
    queue : SiteQueue
        From :meth:`Scheduler.queue` (``squeue --json`` for Slurm), or as the continuation service wrote it.
    now : float, optional
        Epoch seconds the waits are counted to; default ``queue.time`` (when it was read). A later ``now``
        says the jobs have waited that much longer (only true while the site still answers).
    """
    as_of = queue.time if now is None else float(now)
    rows = [_job_row(queue.site, j, as_of) for j in queue.jobs if j.state in _ACTIVE]
    return sorted(rows, key=default_order)


def default_order(r: JobRow):
    """Sort key of the tables' default order: pending first, longest-waiting first (unknown waits last), then by job id."""
    key = job_id_key(r.job_id)
    return (r.state != JobState.PENDING, r.waited_s is None, -(r.waited_s or 0.0), key if isinstance(key, float) else math.inf, str(r.job_id))


def jobs_from_replay(replay, t: float, *, limit: int | None = None, site: str | None = None) -> list[JobRow]:
    """Jobs pending and running at ``t`` (epoch seconds) in a :class:`~lab.hpc.queue.QueueReplay`.

    Pending jobs come first, longest-waiting first, then running jobs, earliest start first; ``limit``
    keeps at most that many of each. ``start_time`` is the start the trace recorded (``start_kind="trace"``);
    ``walltime_s`` the trace's ``requested_time`` (None where unknown); ``site`` defaults to ``replay.name``.
    """
    name = replay.name if site is None else site
    rows: list[JobRow] = []
    for state, table in ((JobState.PENDING, replay.pending_jobs(t, limit=limit)), (JobState.RUNNING, replay.running_jobs(t))):
        if state == JobState.RUNNING and limit is not None:
            table = table.iloc[:limit]
        submitted = table["submitted"].map(lambda ts: ts.timestamp()).to_numpy(dtype=float) if len(table) else np.zeros(0)
        waited = table["waited_s"].to_numpy(dtype=float) if state == JobState.PENDING else table["wait_s"].to_numpy(dtype=float)
        for k, rec in enumerate(table.itertuples(index=False)):
            asked = float(rec.requested_time_s)
            rows.append(JobRow(site=name, job_id=str(int(rec.job_id)), state=state, submit_time=float(submitted[k]),
                               waited_s=float(waited[k]), start_time=float(submitted[k] + rec.wait_s), start_kind="trace",
                               walltime_s=None if math.isnan(asked) else asked, processors=int(rec.processors), as_of=float(t)))
    return rows


# ---- tables: cells with their sort keys --------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A table column: ``key`` (stable name), ``label`` (header text), ``numeric`` (right-aligned, numeric
    sort keys), ``help`` (header tooltip)."""

    key: str
    label: str
    numeric: bool = False
    help: str = ""


@dataclass(frozen=True)
class Cell:
    """What a cell shows (``text``) and how it sorts (``sort``: a number or a string; None: unknown, sorted last)."""

    text: str
    sort: float | str | None


@dataclass(frozen=True)
class Row:
    """One table row: ``id`` (unique), ``group`` (what the group filter matches, e.g. the job state),
    ``cells`` (one per column), ``muted`` (shown greyed: its numbers are not current)."""

    id: str
    group: str
    cells: tuple[Cell, ...]
    muted: bool = False


def _compare_key(sort, descending: bool):
    # unknowns last in both directions; numbers before strings should a column mix them
    if sort is None or (isinstance(sort, float) and math.isnan(sort)):
        return (2, 0)
    if isinstance(sort, str):
        return (1, sort.casefold())
    return (0, -sort if descending else sort)


@dataclass(frozen=True)
class Table:
    """Columns, rows and what to say when there are none.

    ``group_label`` names the rows' groups for the group filter (e.g. ``"state"``); ``empty`` is the
    sentence shown instead of an empty table (why there is nothing); ``caption`` a line above it.
    """

    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    group_label: str = "state"
    empty: str = "nothing to show"
    caption: str = ""
    groups: tuple[str, ...] = field(default=())

    def __post_init__(self):
        keys = [c.key for c in self.columns]
        if len(set(keys)) != len(keys):
            raise ValueError(f"table columns must have distinct keys, got {keys}")
        for row in self.rows:
            if len(row.cells) != len(self.columns):
                raise ValueError(f"row {row.id!r} has {len(row.cells)} cells for {len(self.columns)} columns {keys}")
        if not self.groups:
            object.__setattr__(self, "groups", tuple(dict.fromkeys(r.group for r in self.rows)))

    def column_index(self, key: str) -> int:
        """Position of the column whose ``key`` is ``key``.

        Raises
        ------
        KeyError
            No such column (the message lists the table's column keys).
        """
        for k, c in enumerate(self.columns):
            if c.key == key:
                return k
        raise KeyError(f"no column {key!r} in this table; its columns are {[c.key for c in self.columns]}")

    def view(self, sort: str | None = None, descending: bool = False, group: str = "", text: str = "") -> list[Row]:
        """The rows as the table shows them: those in ``group`` (all if empty) whose cells contain ``text``
        (case-insensitive), sorted stably by column ``sort``'s keys (unknowns last either way)."""
        needle = text.strip().casefold()
        rows = [r for r in self.rows if (not group or r.group == group)
                and (not needle or any(needle in c.text.casefold() for c in r.cells))]
        if sort is not None:
            k = self.column_index(sort)
            rows.sort(key=lambda r: _compare_key(r.cells[k].sort, descending))
        return rows

    def to_json(self) -> dict:
        """Plain JSON for the browser table (``widgets.sortable_table``)."""
        return {
            "columns": [{"key": c.key, "label": c.label, "numeric": c.numeric, "help": c.help} for c in self.columns],
            "rows": [{"id": r.id, "group": r.group, "muted": r.muted, "cells": [c.text for c in r.cells],
                      "sort": [None if c.sort is None or (isinstance(c.sort, float) and math.isnan(c.sort)) else c.sort for c in r.cells]}
                     for r in self.rows],
            "group_label": self.group_label,
            "groups": list(self.groups),
            "empty": self.empty,
            "caption": self.caption,
        }


def _clock(t: float | None, date: bool = False) -> str:
    if t is None:
        return "?"
    return pd.Timestamp(t, unit="s", tz="UTC").strftime("%m-%d %H:%M" if date else "%H:%M:%S")


JOB_COLUMNS = (
    Column("site", "site"),
    Column("job", "job", True, "the scheduler's job id"),
    Column("state", "state"),
    Column("waited", "waited so far", True, "since submission; for a running job, the wait it had"),
    Column("start", "start", True, "pending: estimated start (Slurm's backfill plan, as squeue --start shows it) "
           "or, in a trace replay, the start the trace recorded; running: when it started"),
    Column("walltime", "walltime asked", True, "the job's time limit"),
    Column("procs", "processors", True, "CPUs held or asked for"),
    Column("reason", "why pending", False, "the scheduler's reason"),
    Column("submitted", "submitted (UTC)", True),
)


def _start_text(r: JobRow, dated: bool) -> str:
    if r.start_time is None:
        return "not planned yet" if r.state == JobState.PENDING else "?"
    when = _clock(r.start_time, dated)
    if r.state == JobState.PENDING:
        ahead = r.start_time - r.as_of
        lead = f"in {format_duration(ahead)}" if ahead > 0 else "now"
        return f"{lead} ({when}{', trace' if r.start_kind == 'trace' else ''})"
    return f"{format_duration(r.as_of - r.start_time)} ago ({when})"


def job_table(rows: Iterable[JobRow], *, stale: Mapping[str, str] | None = None, empty: str = "no job pending or running",
              caption: str = "", dated: bool = False, reasons: bool = True) -> Table:
    """Job rows as a :class:`Table` (columns :data:`JOB_COLUMNS`; the group is the job's state).

    ``stale`` maps a site whose numbers are not current to a note (e.g. ``"stale: no sample for 58 s"``):
    its rows are muted and their site cell says so. ``dated`` shows dates with clock times (traces span
    months); ``reasons=False`` leaves out the "why pending" column (traces record none).
    """
    stale = dict(stale or {})
    columns = tuple(c for c in JOB_COLUMNS if reasons or c.key != "reason")
    out = []
    for r in rows:
        note = stale.get(r.site)
        waited = format_duration(r.waited_s)
        if note and r.state == JobState.PENDING and r.waited_s is not None:
            waited = "\u2265 " + waited  # at least that long: the site has not answered since
        cells = {
            "site": Cell(f"{r.site} ({note})" if note else r.site, r.site),
            "job": Cell(r.job_id, job_id_key(r.job_id)),
            "state": Cell(r.state.value, r.state.value),
            "waited": Cell(waited, r.waited_s),
            "start": Cell(_start_text(r, dated), r.start_time),
            "walltime": Cell(_walltime(r.walltime_s), r.walltime_s),
            "procs": Cell("?" if r.processors is None else f"{r.processors:,}", None if r.processors is None else float(r.processors)),
            "reason": Cell(r.reason or "", r.reason),
            "submitted": Cell(_clock(r.submit_time, True), r.submit_time),
        }
        out.append(Row(id=f"{r.site}/{r.job_id}", group=r.state.value, cells=tuple(cells[c.key] for c in columns), muted=bool(note)))
    return Table(columns=columns, rows=tuple(out), group_label="state", empty=empty, caption=caption,
                 groups=(JobState.PENDING.value, JobState.RUNNING.value))


CANDIDATE_COLUMNS = (
    Column("site", "site"),
    Column("eligible", "eligible"),
    Column("pending", "pending", True, "jobs pending at the site"),
    Column("running", "running", True),
    Column("cpus", "idle / total CPUs", True),
    Column("start", "start in", True, "the scheduler's estimated start for this request, after the decision"),
    Column("transfer", "transfer", True, "time to move the input there"),
    Column("walltime", "walltime", True),
    Column("done", "done in", True, "predicted completion, after the decision"),
)


def candidate_table(decision: Mapping | object | None) -> Table:
    """What each site showed a placement decision, one row per site (the chosen one marked with a triangle).

    ``decision``: a :class:`~lab.hpc.placement.PlacementDecision` or its JSON (a ``placement.decision``
    event's payload). Times are seconds after the decision (``decision.time``); a site that was not
    eligible says why. Rows are grouped ``chosen`` / ``eligible`` / ``not eligible``. ``None`` (no decision
    yet) gives an empty table that says so.
    """
    if decision is None:
        return Table(columns=CANDIDATE_COLUMNS, rows=(), group_label="site", caption="what each site showed",
                     empty="no placement yet", groups=("chosen", "eligible", "not eligible"))
    d = decision if isinstance(decision, Mapping) else decision.model_dump(mode="json")
    t0 = float(d["time"])

    def after(t):
        return None if t is None else max(0.0, float(t) - t0)

    rows = []
    for c in d["candidates"]:
        chosen = c["site"] == d["chosen"]
        start_s, done_s = after(c.get("estimated_start")), after(c.get("predicted_completion"))
        idle, total = c.get("idle_cpus"), c.get("total_cpus")
        eligible = bool(c["eligible"])
        transfer = c.get("transfer_s") if eligible else None
        walltime = c.get("walltime_s") or None
        cells = (
            Cell(("\u25b6 " if chosen else "") + c["site"], c["site"]),
            Cell("yes" if eligible else f"no: {c.get('reason') or 'not eligible'}", 0.0 if eligible else 1.0),
            Cell("" if c.get("pending") is None else str(c["pending"]), None if c.get("pending") is None else float(c["pending"])),
            Cell("" if c.get("running") is None else str(c["running"]), None if c.get("running") is None else float(c["running"])),
            Cell("" if idle is None else f"{idle} / {total}", None if idle is None else float(idle)),
            Cell("" if start_s is None else f"+{format_duration(start_s)}", start_s),
            Cell("" if transfer is None else format_duration(transfer), transfer),
            Cell("" if walltime is None else format_duration(walltime), walltime),
            Cell("" if done_s is None else f"+{format_duration(done_s)}", done_s),
        )
        group = "chosen" if chosen else ("eligible" if eligible else "not eligible")
        rows.append(Row(id=c["site"], group=group, cells=cells))
    return Table(columns=CANDIDATE_COLUMNS, rows=tuple(rows), group_label="site", empty="no site was considered",
                 caption=f"what each site showed for {d.get('job', d.get('spec', {}).get('name', 'the job'))} ({d['policy']})",
                 groups=("chosen", "eligible", "not eligible"))


DECISION_COLUMNS = (
    Column("time", "time (UTC)", True),
    Column("job", "job"),
    Column("policy", "policy"),
    Column("chosen", "chosen"),
    Column("eligible", "eligible sites", True),
)


def decision_table(decisions: Iterable[Mapping], *, last: int = 20) -> Table:
    """The newest ``last`` placement decisions (``placement.decision`` payloads with their ``job``), newest first.

    Grouped by policy; ``eligible`` counts the sites that could take the job.
    """
    newest = list(decisions)[-last:][::-1]
    rows = []
    for d in newest:
        eligible = sum(bool(c.get("eligible")) for c in d.get("candidates", []))
        cells = (Cell(_clock(d["time"]), float(d["time"])), Cell(str(d.get("job", "")), str(d.get("job", ""))),
                 Cell(d["policy"], d["policy"]), Cell(d["chosen"], d["chosen"]),
                 Cell(f"{eligible} of {len(d.get('candidates', []))}", float(eligible)))
        rows.append(Row(id=f"{d.get('seq', d['time'])}", group=d["policy"], cells=cells))
    return Table(columns=DECISION_COLUMNS, rows=tuple(rows), group_label="policy", caption="placement decisions",
                 empty="no placement yet: skills.choose_site writes one per decision")


EVENT_COLUMNS = (Column("time", "time (UTC)", True), Column("event", "event"), Column("about", "about"))


def event_table(events: Iterable, *, last: int = 20) -> Table:
    """The newest ``last`` events (:class:`lab.events.Event`: ``seq``, ``time``, ``kind``, ``key``), newest first,
    grouped by kind."""
    newest = list(events)[-last:][::-1]
    rows = tuple(Row(id=str(e.seq), group=e.kind, cells=(Cell(_clock(e.time), float(e.time)), Cell(e.kind, e.kind), Cell(e.key, e.key)))
                 for e in newest)
    return Table(columns=EVENT_COLUMNS, rows=rows, group_label="event", caption="events", empty="no job or site event yet")
