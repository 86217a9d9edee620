"""Event-driven continuation: batch jobs do not block the agent (Diamond Agent, continuation skill).

Two halves share one SQLite file, the lab's :class:`~lab.events.EventLog`:

* :class:`ContinuationService` (``python -m lab.hpc.continuation serve --sites DIR --db FILE``)
  runs outside the kernel. It polls every watched job on every site
  (:meth:`~lab.hpc.schedulers.base.Scheduler.status`) and appends one event per
  state change: ``job.started``, ``job.completed``, ``job.failed``, ``job.cancelled``,
  ``job.timeout``; for watched transfer tasks (with a backend that can poll them from this
  process, e.g. Globus) ``transfer.succeeded`` / ``transfer.failed``; ``site.unavailable`` /
  ``site.available`` when a site stops or
  starts answering, and ``site.queue`` samples of every site's queue for live
  dashboards. Job events carry a dedupe key (``site/job/state``), so a restarted
  service never writes one twice, and watches live in the database, so none is lost.
* :class:`Continuations` runs in the agent (the kernel). :meth:`~Continuations.register`
  stores "when job K reaches one of these states, call ``module:function``";
  :meth:`~Continuations.resume_ready` calls each handler whose event has arrived.

Exactly once: a continuation's handler runs inside a ``BEGIN IMMEDIATE``
transaction (one per batch of ready continuations, see :meth:`Continuations.resume_ready`)
that first re-checks the continuation is still waiting, then marks
it done and appends a ``continuation.resumed`` event. Two resumers (or a
restarted kernel) cannot both run it; a crash before the commit leaves it
(and the rest of its batch) waiting, so it runs again later. Effects outside the database (submitting the
next job) should use the continuation id as their idempotency key
(:attr:`ContinuationRecord.id`), which :mod:`lab.hpc.skills` does.

At scale (issue #16): the service asks each site only for its watched jobs (on Slurm one
``squeue -u USER -j ID,...`` call, then the completion records for jobs squeue has forgotten,
see :mod:`lab.hpc.schedulers.slurm_poll`), at most once per site per ``site_min_interval_s``;
a due queue sample serves that second's job poll. The sites are asked in parallel (one worker
thread per site; only the service's own thread writes the database), each again as soon as it is
due; a slow whole-queue sample spaces the next one out (``sample_share``). A burst of transitions
is one ``INSERT`` (:meth:`~lab.events.EventLog.append_many`) and one ``UPDATE``; the resumer
commits ready continuations in batches (``resume_batch_s``), not one transaction each. Retention: :meth:`Continuations.compact`
(``python -m lab.hpc.continuation compact``) trims the log into an archive; the rule stored
with the log (:data:`RETENTION_QUERY`) keeps every event a waiting continuation or a watched
job or transfer still needs, so a continuation pending across a compaction still resumes,
exactly once. Submissions made under an idempotency key are kept in
:attr:`Continuations.submissions` (:class:`Submissions`).

Times are epoch seconds (UTC).
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lab import LabError
from lab.events import Event, EventLog
from lab.hpc.errors import ContinuationError, HPCError, SchedulerError  # ContinuationError: defined in lab.hpc.errors, re-exported here
from lab.hpc.schedulers.base import TERMINAL_STATES, JobState, Scheduler

__all__ = [
    "DECISION_EVENTS", "ContinuationError", "ContinuationRecord", "Continuations", "ContinuationService", "Submission",
    "Submissions", "main", "resolve_handler",
]

#: The events a continuation waits for unless told otherwise: the job's fate, or a transfer's.
DECISION_EVENTS = ("job.completed", "job.failed", "job.cancelled", "job.timeout", "transfer.succeeded", "transfer.failed")
_STATE_EVENT = {
    JobState.RUNNING: "job.started",
    JobState.COMPLETED: "job.completed",
    JobState.FAILED: "job.failed",
    JobState.CANCELLED: "job.cancelled",
    JobState.TIMEOUT: "job.timeout",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS watches (
    site TEXT NOT NULL, job_id TEXT NOT NULL, last_state TEXT NOT NULL DEFAULT 'pending',
    active INTEGER NOT NULL DEFAULT 1, created REAL NOT NULL,
    PRIMARY KEY (site, job_id)
);
CREATE TABLE IF NOT EXISTS transfer_watches (
    task_id TEXT PRIMARY KEY, site TEXT NOT NULL, active INTEGER NOT NULL DEFAULT 1, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS continuations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, kinds TEXT NOT NULL, handler TEXT NOT NULL,
    args TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'waiting', created REAL NOT NULL,
    event_seq INTEGER, resumed REAL, result TEXT, error TEXT
);
CREATE INDEX IF NOT EXISTS continuations_waiting ON continuations(state, key);
CREATE TABLE IF NOT EXISTS submissions (key TEXT PRIMARY KEY, site TEXT NOT NULL, job_id TEXT NOT NULL, created REAL NOT NULL);
"""

#: What a compaction of the event log must keep for this module: the events of every continuation
#: still waiting, and of every job or transfer still watched (its next event is still to come).
RETENTION_QUERY = (
    "SELECT key FROM continuations WHERE state = 'waiting' "
    "UNION SELECT site || '/' || job_id FROM watches WHERE active = 1 "
    "UNION SELECT 'transfer/' || task_id FROM transfer_watches WHERE active = 1"
)


def job_key(site: str, job_id: str) -> str:
    """The event key of a job: ``"site/job_id"``."""
    return f"{site}/{job_id}"


def transfer_key(task_id: str) -> str:
    """The event key of a transfer task: ``"transfer/task_id"``."""
    return f"transfer/{task_id}"


def transfer_event(status) -> str | None:
    """``transfer.succeeded`` / ``transfer.failed`` for a finished :class:`~lab.hpc.transfer.TransferStatus`, else None."""
    if status.ok:
        return "transfer.succeeded"
    return "transfer.failed" if status.done else None


@dataclass(frozen=True)
class ContinuationRecord:
    id: int
    key: str
    kinds: tuple[str, ...]
    handler: str
    args: dict[str, Any]
    state: str  # waiting | done | error
    event_seq: int | None
    result: Any
    error: str | None


def resolve_handler(handler: str) -> Callable:
    """The function a continuation handler names (``"package.module:function"``), imported.

    Raises
    ------
    ContinuationError
        Not of that form, not importable, or not callable.
    """
    module, _, name = handler.partition(":")
    if not module or not name:
        raise ContinuationError(f"handler {handler!r} must be 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ContinuationError(f"handler {handler!r} cannot be imported: {exc}") from None
    if not callable(fn):
        raise ContinuationError(f"handler {handler!r} is not callable")
    return fn


_resolve = resolve_handler  # the old private name


@dataclass(frozen=True)
class Submission:
    """A submission made under an idempotency key: where it went."""

    key: str
    site: str
    job_id: str
    created: float


class Submissions:
    """Submissions by idempotency key, in the continuation database (table ``submissions``).

    A caller that may retry (a skill, a continuation whose id is the key) looks the key up
    before submitting and records it after, so a job is submitted at most once per key.
    Obtain one as :attr:`Continuations.submissions`.
    """

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def get(self, key: str) -> Submission | None:
        """The submission recorded under ``key``, or None."""
        row = self._conn.execute("SELECT key, site, job_id, created FROM submissions WHERE key = ?", (key,)).fetchone()
        return None if row is None else Submission(row[0], row[1], row[2], row[3])

    def record(self, key: str, site: str, job_id: str) -> Submission:
        """Record that ``key`` was submitted to ``site`` as ``job_id``; the first record wins (returned)."""
        self._conn.execute("INSERT OR IGNORE INTO submissions(key, site, job_id, created) VALUES (?, ?, ?, ?)", (key, site, str(job_id), time.time()))
        return self.get(key)


class _Store:
    def __init__(self, db: str | Path):
        self.log = EventLog(db)
        self.conn: sqlite3.Connection = self.log.connection  # one connection: events and state commit together
        self.conn.executescript(_SCHEMA)
        self.log.retain("hpc.continuations", RETENTION_QUERY)
        self.log.retain("hpc.job_submitted", kind="job.submitted")  # who submitted which job: the skills check it

    def close(self) -> None:
        self.log.close()


class Continuations:
    """The agent's side: register continuations and resume those whose event has arrived.

    Parameters
    ----------
    db : path
        The shared database (the service's ``--db``).
    resume_batch_s : float
        Seconds of handlers one resume transaction may hold (see :meth:`resume_ready`); 0: one
        transaction per continuation.
    """

    def __init__(self, db: str | Path, *, resume_batch_s: float = 0.05):
        self._store = _Store(db)
        self.log = self._store.log
        self.submissions = Submissions(self._store.conn)
        self._lock = threading.Lock()
        self.resume_batch_s = float(resume_batch_s)

    def close(self) -> None:
        self._store.close()

    def watch_job(self, site: str, job_id: str) -> None:
        """Ask the service to watch a job (idempotent)."""
        self._store.conn.execute("INSERT OR IGNORE INTO watches(site, job_id, created) VALUES (?, ?, ?)", (site, str(job_id), time.time()))

    def watch_transfer(self, site: str, task_id: str) -> None:
        """Ask the service to watch a transfer task to ``site`` (idempotent); its end arrives as
        ``transfer.succeeded`` / ``transfer.failed`` with key :func:`transfer_key`."""
        self._store.conn.execute("INSERT OR IGNORE INTO transfer_watches(task_id, site, created) VALUES (?, ?, ?)", (str(task_id), site, time.time()))

    def register(self, key: str, handler: str, *, on: tuple[str, ...] = DECISION_EVENTS, args: Mapping[str, Any] | None = None) -> int:
        """Store a continuation: when an event of one of the kinds ``on`` arrives for ``key``,
        call ``handler`` (``"package.module:function"``, resolvable after a restart) as
        ``handler(event, continuation, **args)``. Returns the continuation id.

        For a job, ``key`` is :func:`job_key` (``"site/job_id"``); also :meth:`watch_job` it.

        Raises
        ------
        ContinuationError
            The handler cannot be imported or ``args`` is not JSON.
        """
        resolve_handler(handler)
        try:
            body = json.dumps(dict(args or {}), sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ContinuationError(f"continuation args for {key!r} are not JSON: {exc}") from None
        cur = self._store.conn.execute(
            "INSERT INTO continuations(key, kinds, handler, args, created) VALUES (?, ?, ?, ?, ?)",
            (key, json.dumps(list(on)), handler, body, time.time()),
        )
        return int(cur.lastrowid)

    def get(self, continuation_id: int) -> ContinuationRecord:
        row = self._store.conn.execute(
            "SELECT id, key, kinds, handler, args, state, event_seq, result, error FROM continuations WHERE id = ?", (continuation_id,)
        ).fetchone()
        if row is None:
            raise ContinuationError(f"no continuation {continuation_id}")
        return self._record(row)

    @staticmethod
    def _record(row) -> ContinuationRecord:
        return ContinuationRecord(
            id=row[0], key=row[1], kinds=tuple(json.loads(row[2])), handler=row[3], args=json.loads(row[4]),
            state=row[5], event_seq=row[6], result=json.loads(row[7]) if row[7] is not None else None, error=row[8],
        )

    def count(self, state: str = "waiting") -> int:
        """How many continuations are in ``state`` (``waiting``, ``done`` or ``error``): one ``COUNT``, no records built."""
        return int(self._store.conn.execute("SELECT COUNT(*) FROM continuations WHERE state = ?", (state,)).fetchone()[0])

    def waiting(self) -> list[ContinuationRecord]:
        rows = self._store.conn.execute(
            "SELECT id, key, kinds, handler, args, state, event_seq, result, error FROM continuations WHERE state = 'waiting' ORDER BY id"
        ).fetchall()
        return [self._record(r) for r in rows]

    def _first_event(self, rec: ContinuationRecord) -> Event | None:
        events = self.log.tail(0, kinds=list(rec.kinds), key=rec.key, limit=1)
        return events[0] if events else None

    def resume_ready(self) -> list[ContinuationRecord]:
        """Run every waiting continuation whose event has arrived, each exactly once; returns them as resumed.

        A handler that raises is recorded (state ``error``, a ``continuation.error`` event) and
        not retried; the others go on.

        The ready continuations are found with one query (with their records and events) and resumed
        in batches: one ``BEGIN IMMEDIATE`` ... ``COMMIT`` holds the handlers run within
        :attr:`resume_batch_s` seconds (at least one), not one transaction each, so a burst of
        hundreds of ended jobs costs a few commits and the write lock is released between batches
        for the service. A crash before a batch's commit leaves all its continuations waiting (they
        run again: effects outside the database use the continuation id as idempotency key).
        """
        resumed = []
        with self._lock:
            # one query finds every waiting continuation whose first awaited event is there
            # (not one query per waiting continuation: thousands wait at once at scale)
            ready = self._store.conn.execute(
                "SELECT c.id, c.key, c.kinds, c.handler, c.args, c.state, c.event_seq, c.result, c.error, "
                "e.seq, e.time, e.source, e.kind, e.key, e.payload FROM "
                "(SELECT c.id AS cid, MIN(e.seq) AS seq FROM continuations c JOIN events e ON e.key = c.key "
                " WHERE c.state = 'waiting' AND e.kind IN (SELECT value FROM json_each(c.kinds)) GROUP BY c.id) r "
                "JOIN continuations c ON c.id = r.cid JOIN events e ON e.seq = r.seq ORDER BY c.id"
            ).fetchall()
            items = [(self._record(r[:9]), Event(r[9], r[10], r[11], r[12], r[13], json.loads(r[14]))) for r in ready]
            i = 0
            while i < len(items):
                batch, i = self._resume_batch(items, i)
                resumed += batch
        return resumed

    def _resume_batch(self, items: list[tuple[ContinuationRecord, Event]], start: int) -> tuple[list[ContinuationRecord], int]:
        """Resume ``items[start:]`` in one transaction until :attr:`resume_batch_s` has passed (at
        least one); returns the resumed records and the index of the first item not handled. The
        batch is re-checked, marked and logged with one statement each, not one per continuation."""
        conn, done, errors, events = self._store.conn, [], [], []
        conn.execute("BEGIN IMMEDIATE")
        began, i = time.monotonic(), start
        try:
            chunk = items[start:start + 500]
            ids = json.dumps([rec.id for rec, _ in chunk])
            still = {r[0] for r in conn.execute(
                "SELECT id FROM continuations WHERE state = 'waiting' AND id IN (SELECT value FROM json_each(?))", (ids,))}
            for rec, event in chunk:
                if i > start and time.monotonic() - began >= self.resume_batch_s:
                    break
                i += 1
                if rec.id not in still:  # another resumer got it first
                    continue
                try:
                    result = resolve_handler(rec.handler)(event, rec, **rec.args)
                    body = json.dumps(result)
                except Exception as exc:  # the handler's own failure: recorded, not retried
                    errors.append([event.seq, time.time(), f"{type(exc).__name__}: {exc}", rec.id])
                    events.append(("continuations", "continuation.error", rec.key, {"id": rec.id, "error": str(exc)}, f"continuation/{rec.id}"))
                    continue
                now = time.time()
                done.append((replace(rec, state="done", event_seq=event.seq, result=json.loads(body)), now, body))
                events.append(("continuations", "continuation.resumed", rec.key,
                               {"id": rec.id, "event_seq": event.seq, "event_kind": event.kind, "latency_s": now - event.time},
                               f"continuation/{rec.id}"))
            if done:
                conn.execute(
                    "UPDATE continuations SET state = 'done', event_seq = json_extract(u.value, '$[0]'), resumed = json_extract(u.value, '$[1]'), "
                    "result = json_extract(u.value, '$[2]') FROM json_each(?) u WHERE continuations.id = json_extract(u.value, '$[3]')",
                    (json.dumps([[r.event_seq, now, body, r.id] for r, now, body in done]),),
                )
            if errors:
                conn.execute(
                    "UPDATE continuations SET state = 'error', event_seq = json_extract(u.value, '$[0]'), resumed = json_extract(u.value, '$[1]'), "
                    "error = json_extract(u.value, '$[2]') FROM json_each(?) u WHERE continuations.id = json_extract(u.value, '$[3]')",
                    (json.dumps(errors),),
                )
            self.log.append_many(events)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return [r for r, _, _ in done], i

    def compact(self, archive: str | Path, *, before: float, vacuum: bool = False):
        """Trim the event log (see :meth:`lab.events.EventLog.compact`) of events older than ``before``
        (epoch seconds), keeping every event a waiting continuation, a watched job or transfer, or an
        open training run still needs. Returns the :class:`~lab.events.CompactionReport`."""
        with self._lock:  # not while this process is resuming
            return self.log.compact(archive, before=before, vacuum=vacuum)

    def run(self, stop: threading.Event, poll_s: float = 0.1) -> None:
        """Resume continuations as their events arrive until ``stop`` is set (e.g. in a kernel thread)."""
        while not stop.is_set():
            self.resume_ready()
            stop.wait(poll_s)


class ContinuationService:
    """Watches jobs on all sites and appends their state changes to the event log.

    Parameters
    ----------
    db : path
        The shared database.
    schedulers : mapping of site name to Scheduler
    transfer : TransferBackend, optional
        Where watched transfer tasks are polled (e.g. a :class:`~lab.hpc.transfer.GlobusTransfer`,
        whose task ids any process can poll; a :class:`~lab.hpc.transfer.LocalTransfer` only knows
        the tasks of its own process).
    poll_s : float
        Seconds between polls of the watched jobs and transfers (a site is still asked at most
        once per ``site_min_interval_s``).
    queue_every_s : float or None
        Seconds between ``site.queue`` events (each site's pending and running jobs, idle and
        total CPUs, and its active jobs as :class:`~lab.hpc.schedulers.base.JobStatus` JSON under
        ``jobs``), written only when the queue changed (counts, a job's state or estimated start) or
        ``heartbeat_s`` passed; None: off.
        Live dashboards read them. A sample lists the site's whole queue (every user's jobs), so
        it is the one call whose cost grows with the queue; the job polls in between ask only for
        the watched jobs (:meth:`~lab.hpc.schedulers.slurm.SlurmScheduler.status`).
    site_min_interval_s : float
        At most one scheduler query (a job poll or a queue sample: one ``squeue`` on Slurm) per
        site per this many seconds, start to start (a query is never overlapped by the next). A
        scheduler with a ``listing_interval_s`` (:class:`~lab.hpc.schedulers.slurm.SlurmScheduler`)
        has it raised to this value, so the limit also holds for each ``squeue`` / ``sacct`` call. When a queue sample is due, the watched jobs' states are taken
        from it (and from the completion records, ``completed_status``, for jobs it no longer
        lists) instead of a second ``squeue``.
    sample_share : float
        The share of a site's time its queue samples may take: after a sample that took ``d``
        seconds, the next is due ``max(queue_every_s, d / sample_share)`` after it began. A sample
        lists the whole queue and slows down with it (``squeue --json`` took 5-7.5 s when four sites ended
        hundreds of jobs at once on a 2-core VM, issue #16; the ``squeue -O`` listing used since is cheaper
        but still grows with the queue), and while it runs the site's watched
        jobs wait (it is the site's one query of that second); idle sites keep ``queue_every_s``.
        Each sample's ``every_s`` says the interval in force, so readers judge staleness by it.

    Attributes
    ----------
    query_times : dict of site name to list of float
        ``time.monotonic()`` of each scheduler query per site (the last 10,000), for checking the rate.
    """

    def __init__(
        self,
        db: str | Path,
        schedulers: Mapping[str, Scheduler],
        *,
        transfer=None,
        poll_s: float = 0.5,
        queue_every_s: float | None = 5.0,
        heartbeat_s: float = 30.0,
        site_min_interval_s: float = 1.0,
        sample_share: float = 0.1,
    ):
        self._store = _Store(db)
        self.log = self._store.log
        self.schedulers = dict(schedulers)
        self.transfer = transfer
        self.poll_s = poll_s
        self.queue_every_s, self.heartbeat_s = queue_every_s, heartbeat_s
        self._available = {name: True for name in self.schedulers}
        self._last_queue: dict[str, tuple[tuple, float]] = {}
        self.site_min_interval_s = float(site_min_interval_s)
        self._next_query: dict[str, float] = {}  # site -> monotonic time of its next allowed query
        self._queue_due: set[str] = set()
        self.query_times: dict[str, list[float]] = {name: [] for name in self.schedulers}
        self._samples: dict = {}
        self.sample_share = float(sample_share)
        self._next_sample: dict[str, float] = {}  # site -> monotonic time its next queue sample is due
        self._sample_every: dict[str, float] = {}  # site -> its current sample interval (queue_every_s, or stretched)
        self._pool: ThreadPoolExecutor | None = None  # one worker per site, made on the first poll of several sites
        self._watch_rowid = 0  # the newest watch read_records has looked up
        for sched in self.schedulers.values():  # the rate holds at the command, not only at the query (see _query)
            if hasattr(sched, "listing_interval_s"):
                sched.listing_interval_s = max(float(sched.listing_interval_s), self.site_min_interval_s)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._store.close()

    def _mark(self, site: str, available: bool, error: str = "") -> list[int]:
        if self._available.get(site, True) == available:
            return []
        self._available[site] = available
        return [self.log.append(site, "site.available" if available else "site.unavailable", site, {"error": error} if error else {})]

    def _query(self, site: str, fn, *args):
        """Run one scheduler query for ``site``; the next may start ``site_min_interval_s`` after this
        one *began*, once it has ended (start to start: a query that took 1.6 s under load is followed
        at once, not 1 s later, which added a second to the site's latency, issue #16). The scheduler's
        own guard (``listing_interval_s``, raised to the same interval in ``__init__``) keeps its
        squeue/sacct calls that far apart whatever the jitter of their start inside the query."""
        times = self.query_times.setdefault(site, [])
        began = time.monotonic()
        times.append(began)
        del times[:-10000]
        try:
            return fn(*args)
        finally:
            self._next_query[site] = max(began + self.site_min_interval_s, time.monotonic())

    def _write_sample(self, site: str, q) -> list[int]:
        """Append the ``site.queue`` event for sample ``q`` if the queue changed (or the heartbeat is due)."""
        now = time.time()
        # a job starting, ending or getting a new estimated start is a change too
        jobs = tuple((j.job_id, j.state.value, j.start_time) for j in q.jobs)
        state = (q.pending, q.running, q.idle_cpus, q.total_cpus, jobs)
        last = self._last_queue.get(site)
        if last is not None and last[0] == state and now - last[1] < self.heartbeat_s:
            return []
        payload = {"pending": q.pending, "running": q.running, "idle_cpus": q.idle_cpus, "total_cpus": q.total_cpus, "time": q.time,
                   "jobs": [j.model_dump(mode="json", exclude_none=True) for j in q.jobs],
                   # an unchanged queue is written again after heartbeat_s: a reader knows when silence means stopped
                   "every_s": self._sample_every.get(site, self.queue_every_s), "heartbeat_s": self.heartbeat_s}
        self._last_queue[site] = (state, now)
        return [self.log.append(site, "site.queue", site, payload, at=q.time)]

    def poll_queues(self, sites: list[str] | None = None) -> list[int]:
        """Append a ``site.queue`` event for each site (of ``sites``, default all) whose queue changed
        (or whose heartbeat is due)."""
        appended, self._samples = [], {}
        for site, sched in self.schedulers.items():
            if sites is not None and site not in sites:
                continue
            try:
                q = self._query(site, sched.queue)
            except SchedulerError as exc:
                appended += self._mark(site, False, str(exc))
                continue
            appended += self._mark(site, True)
            self._samples[site] = q
            appended += self._write_sample(site, q)
        return appended

    def poll_transfers(self) -> list[int]:
        """Append ``transfer.succeeded`` / ``transfer.failed`` for watched transfer tasks that ended."""
        if self.transfer is None:
            return []
        conn, appended = self._store.conn, []
        for task_id, site in conn.execute("SELECT task_id, site FROM transfer_watches WHERE active = 1").fetchall():
            try:
                status = self.transfer.status(task_id)
            except HPCError as exc:  # unknown task or service error: report once, stop watching
                status, kind = None, "transfer.failed"
                payload = {"task_id": task_id, "error": str(exc)}
            else:
                kind = transfer_event(status)
                payload = status.model_dump(mode="json") if kind else None
            if kind is None:
                continue
            appended.append(self.log.append(site, kind, transfer_key(task_id), payload, dedupe=f"{transfer_key(task_id)}/{kind}"))
            conn.execute("UPDATE transfer_watches SET active = 0 WHERE task_id = ?", (task_id,))
        return appended

    def _due(self, site: str) -> bool:
        return time.monotonic() >= self._next_query.get(site, 0.0)

    def next_due_s(self) -> float:
        """Seconds until some site may be queried again (0 if one may be now)."""
        if not self.schedulers:
            return self.poll_s
        return max(0.0, min(self._next_query.get(s, 0.0) for s in self.schedulers) - time.monotonic())

    def _ask_site(self, site: str, ids: list[str], sample: bool):
        """One site's scheduler work for a poll (no database access: it runs in a worker thread):
        the queue sample if ``sample`` (whose listing then serves the job poll, the completion records
        the jobs it no longer lists), else one job poll. Returns ``(sample or None, statuses)``."""
        sched = self.schedulers[site]
        if not sample:
            return None, self._query(site, sched.status, ids)
        began = time.monotonic()
        try:
            q = self._query(site, sched.queue)
        finally:  # the next sample: queue_every_s later, or later still if this one took long
            every = max(self.queue_every_s or 0.0, (time.monotonic() - began) / self.sample_share if self.sample_share > 0 else 0.0)
            self._sample_every[site] = every
            self._next_sample[site] = began + every
        if not ids:
            return q, {}
        recorded = getattr(sched, "recorded_ends", None)  # ended jobs the listing may still show as COMPLETING
        statuses = recorded(ids) if recorded is not None else {}
        active = {j.job_id: j for j in q.jobs}
        statuses.update({i: active[i] for i in ids if i in active and i not in statuses})
        rest = [i for i in ids if i not in statuses]
        if rest:
            completed = getattr(sched, "completed_status", None)
            statuses.update(completed(rest) if completed is not None else sched.status(rest))
        return q, statuses

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.schedulers)), thread_name_prefix="continuation-site")
        return self._pool

    def _plan(self, busy: set[str] = frozenset()) -> tuple[list[tuple[str, list[str], bool]], dict[str, list[tuple[str, str]]]]:
        """The sites to ask now (``(site, watched ids, sample?)``, none of ``busy``) and each site's watched ``(job_id, last_state)``."""
        if self.queue_every_s is not None:
            now = time.monotonic()
            # (not for a site in flight: its sample's end sets when the next is due)
            self._queue_due |= {s for s in self.schedulers if s not in busy and now >= self._next_sample.get(s, 0.0)}
        due_queue = {s for s in self._queue_due if s in self.schedulers and s not in busy and self._due(s)}
        self._queue_due -= due_queue
        if not due_queue and not any(s not in busy and self._due(s) for s in self.schedulers):
            return [], {}  # no site may be asked now: the watches are not even read
        rows = self._store.conn.execute("SELECT site, job_id, last_state FROM watches WHERE active = 1 ORDER BY site, job_id").fetchall()
        by_site: dict[str, list[tuple[str, str]]] = {}
        for site, job_id, last in rows:
            by_site.setdefault(site, []).append((job_id, last))
        work = [(site, [j for j, _ in by_site.get(site, [])], site in due_queue) for site in self.schedulers
                if site not in busy and (site in due_queue or (site in by_site and self._due(site)))]
        return work, by_site

    def _apply(self, site: str, jobs: list[tuple[str, str]], result) -> list[int]:
        """Write one site's answer (from :meth:`_run_ask`): availability, queue sample, transitions."""
        sample, statuses, error = result
        if error is not None:
            return self._mark(site, False, str(error))
        appended = self._mark(site, True)
        if sample is not None:
            self._samples[site] = sample
            appended += self._write_sample(site, sample)
        return appended + self._write_transitions(site, {j: statuses.get(j) for j, _ in jobs})

    def poll_once(self) -> list[int]:
        """Poll every site with active watches once (and the queues when due), each site at most once
        per ``site_min_interval_s``; returns the seqs appended.

        The sites are asked at the same time (one worker thread per site: their ``squeue`` calls
        overlap instead of queueing behind each other, so a poll takes as long as the slowest site,
        not the sum of all). Each site's answer is written as soon as it arrives, in this thread
        (the only one that touches the database): its availability, its queue sample, then its
        jobs' transitions in one transaction. (:meth:`serve` does not even wait for the slowest:
        each site is asked again as soon as it is due.)"""
        appended = self.poll_transfers()
        work, by_site = self._plan()
        self._samples = {}
        if len(work) == 1:
            results = [(work[0][0], self._run_ask(*work[0]))]
        else:
            pool = self._executor()
            futures = {pool.submit(self._run_ask, *w): w[0] for w in work}
            results = ((futures[f], f.result()) for f in as_completed(futures))
        for site, result in results:
            appended += self._apply(site, by_site.get(site, []), result)
        return appended

    def _run_ask(self, site: str, ids: list[str], sample: bool):
        try:
            sample_q, statuses = self._ask_site(site, ids, sample)
        except SchedulerError as exc:
            return None, {}, exc
        return sample_q, statuses, None

    def _write_transitions(self, site: str, statuses: Mapping) -> list[int]:
        """Append the events of the watched jobs whose state changed and update their watches: one
        transaction of three statements however many changed (hundreds end in one second at scale).

        Each job's last state is read in the same transaction, not taken from when the query was
        planned: the completion records are read every poll while a site's query is in flight, and
        an answer that arrives after its job's end was written must not reopen the watch."""
        asked = [j for j, st in statuses.items() if st is not None and st.state not in (JobState.UNKNOWN, JobState.PENDING)]
        if not asked:
            return []
        conn = self._store.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = conn.execute(
                "SELECT job_id, last_state FROM watches WHERE site = ? AND active = 1 AND job_id IN (SELECT value FROM json_each(?))",
                (site, json.dumps(asked)),
            ).fetchall()
            seqs = self._append_transitions(site, [(j, last, statuses[j]) for j, last in sorted(current) if statuses[j].state.value != last])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return seqs

    def _append_transitions(self, site: str, changed: list[tuple[str, str, Any]]) -> list[int]:
        """Within the caller's transaction: the events of ``changed`` ``(job_id, last_state, status)`` and their watches' update."""
        if not changed:
            return []
        events, updates = [], []
        for job_id, last, st in changed:
            key = job_key(site, job_id)
            payload = {
                "site": site, "job_id": job_id, "state": st.state.value, "exit_code": st.exit_code,
                "submit_time": st.submit_time, "start_time": st.start_time, "end_time": st.end_time,
            }
            if st.state in TERMINAL_STATES and last == JobState.PENDING.value:  # it ran between two polls
                events.append((site, "job.started", key, payload | {"state": "running"}, f"{key}/running"))
            events.append((site, _STATE_EVENT[st.state], key, payload, f"{key}/{st.state.value}"))
            updates.append([st.state.value, 0 if st.state in TERMINAL_STATES else 1, site, job_id])
        seqs = self.log.append_many(events)
        self._store.conn.execute(
            "UPDATE watches SET last_state = json_extract(u.value, '$[0]'), active = json_extract(u.value, '$[1]') "
            "FROM json_each(?) u WHERE watches.site = json_extract(u.value, '$[2]') AND watches.job_id = json_extract(u.value, '$[3]')",
            (json.dumps(updates),),
        )
        return seqs

    def read_records(self) -> list[int]:
        """Write the end of every watched job whose completion record its site appended since the last
        call (the jobcomp file read from where it stopped, :meth:`~lab.hpc.schedulers.slurm.SlurmScheduler.new_ends`:
        no controller call, so not bound by ``site_min_interval_s``, and a call costs what was appended,
        not what is watched); returns the seqs appended. :meth:`serve` does this every ``poll_s``,
        between the sites' queries: a job's end is written within a poll of Slurm recording it, instead
        of waiting for the site's next ``squeue`` turn (issue #16: with 2,000 jobs that wait and the
        squeue call itself were most of the latency). Records of jobs nobody watches are dropped; a job
        watched since the last call (e.g. only after it ended and squeue forgot it) is looked up in its
        site's records at once (``recorded_ends``), not at the site's next query."""
        appended = []
        fresh: dict[str, list[str]] = {}
        for rowid, site, job_id in self._store.conn.execute(
                "SELECT rowid, site, job_id FROM watches WHERE rowid > ? AND active = 1 ORDER BY rowid", (self._watch_rowid,)):
            self._watch_rowid = max(self._watch_rowid, rowid)
            fresh.setdefault(site, []).append(job_id)
        for site, sched in self.schedulers.items():
            ends = {}
            try:
                if fresh.get(site) and getattr(sched, "recorded_ends", None) is not None:
                    ends.update(sched.recorded_ends(fresh[site], lookup=False))
                if getattr(sched, "new_ends", None) is not None:
                    ends.update(sched.new_ends())
            except (SchedulerError, OSError):
                continue
            if ends:
                appended += self._write_transitions(site, ends)
        return appended

    def serve(self, stop: threading.Event | None = None) -> None:
        """Poll until ``stop`` is set (or SIGTERM/SIGINT when run as a program).

        Each site is asked again as soon as it is due (``site_min_interval_s`` after its last
        query ended), whether or not the other sites have answered: a site whose controller is
        slow (a whole-queue sample under load takes seconds) delays only its own jobs."""
        stop = stop or threading.Event()
        pool = self._executor()
        inflight: dict[str, tuple[Future, list[tuple[str, str]]]] = {}
        try:
            while not stop.is_set():
                started = time.monotonic()
                for site in [s for s, (f, _) in inflight.items() if f.done()]:
                    future, jobs = inflight.pop(site)
                    self._apply(site, jobs, future.result())
                self.poll_transfers()
                self.read_records()
                work, by_site = self._plan(busy=set(inflight))
                for w in work:
                    inflight[w[0]] = (pool.submit(self._run_ask, *w), by_site.get(w[0], []))
                # the next round when a site answers or is due again, but not sooner than poll_s after this one began
                wait_s = max(self.poll_s - (time.monotonic() - started), self.next_due_s(), 0.01)
                if inflight:
                    wait([f for f, _ in inflight.values()], timeout=wait_s, return_when=FIRST_COMPLETED)
                    stop.wait(max(0.0, min(wait_s, self.poll_s - (time.monotonic() - started))))
                else:
                    stop.wait(wait_s)
        finally:
            for site, (future, jobs) in inflight.items():  # let the queries in flight finish and write what they found
                self._apply(site, jobs, future.result())

def main(argv: list[str] | None = None) -> int:
    """``python -m lab.hpc.continuation serve --sites DIR --db FILE [--poll-s S]`` or
    ``python -m lab.hpc.continuation compact --db FILE --archive FILE --older-than-s S [--vacuum]``"""
    from lab.hpc.sites import load_sites

    parser = argparse.ArgumentParser(prog="python -m lab.hpc.continuation", description="watch jobs on all sites; append their events")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--sites", required=True, type=Path, help="folder of site *.toml files")
    serve.add_argument("--db", required=True, type=Path, help="the shared event/continuation database")
    serve.add_argument("--poll-s", type=float, default=0.5, help="seconds between job polls")
    serve.add_argument("--queue-every-s", type=float, default=5.0, help="seconds between site.queue samples (0: off)")
    serve.add_argument("--site-min-interval-s", type=float, default=1.0, help="at most one squeue per site per this many seconds")
    compact = sub.add_parser("compact", help="trim the event log into an archive, keeping what is still needed")
    compact.add_argument("--db", required=True, type=Path)
    compact.add_argument("--archive", required=True, type=Path, help="SQLite archive file (created or appended to)")
    compact.add_argument("--older-than-s", required=True, type=float, help="drop events older than this many seconds")
    compact.add_argument("--vacuum", action="store_true", help="return the freed space to the file system")
    args = parser.parse_args(argv)
    if args.command == "compact":
        try:
            cont = Continuations(args.db)
            report = cont.compact(args.archive, before=time.time() - args.older_than_s, vacuum=args.vacuum)
            cont.close()
        except LabError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"dropped {report.dropped} events into {args.archive}, kept {report.kept_needed} still needed, {report.remaining} remain")
        return 0
    try:
        sites = load_sites(args.sites)
        service = ContinuationService(
            args.db, {name: site.connect() for name, site in sites.items()}, poll_s=args.poll_s, queue_every_s=args.queue_every_s or None,
            site_min_interval_s=args.site_min_interval_s,
        )
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"continuation service: {len(sites)} sites, db {args.db}, pid {__import__('os').getpid()}", flush=True)
    service.serve(stop)
    service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
