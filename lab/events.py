"""The lab's one durable event log: SQLite (WAL), append-only, tail and subscribe.

Continuation services, training runs and widgets share it: a producer
:meth:`EventLog.append`\\ s events, any number of readers in other processes
:meth:`~EventLog.tail` them from a sequence number or :meth:`~EventLog.follow`
new ones as they arrive. Rows are never updated, so a reader that
remembers the last ``seq`` it handled can resume after a crash without losing
or repeating an event (only :meth:`EventLog.compact` removes rows, see Retention). One file per log; safe for several processes (WAL mode,
``busy_timeout``).

An :class:`Event` has ``seq`` (int, increasing), ``time`` (epoch seconds, UTC),
``source`` (who wrote it, e.g. a site name), ``kind`` (e.g. ``"job.completed"``),
``key`` (what it is about, e.g. ``"alpha/42"``) and a JSON ``payload``. An optional
``dedupe`` string makes an append idempotent: a second append with the same
``dedupe`` returns the first event's ``seq`` and writes nothing.

Retention: rows are only ever removed by :meth:`EventLog.compact`, which drops old
events into an archive (another SQLite file of the same columns) and keeps every
event that something still needs. What is needed is written in the database itself,
in the ``event_retention`` table (name -> an SQL query giving the ``key`` s to keep), so
any process that compacts the file honours it: :mod:`lab.hpc.continuation` registers the
keys of waiting continuations and watched jobs and transfers, and the log itself keeps the
events of training runs still open (``train.*`` events of a run with a rank whose latest
``train.status`` is not finished, stopped or failed). ``seq`` numbers are never reused, so
a reader's cursor stays valid across a compaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import LabError

__all__ = ["CompactionReport", "Event", "EventLog", "EventLogError", "TRAINING_TERMINAL", "archived_events"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    time    REAL    NOT NULL,
    source  TEXT    NOT NULL,
    kind    TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    payload TEXT    NOT NULL,
    dedupe  TEXT    UNIQUE
);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, seq);
CREATE INDEX IF NOT EXISTS events_key ON events(key, seq);
CREATE TRIGGER IF NOT EXISTS events_append_only_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;
CREATE TABLE IF NOT EXISTS event_retention (name TEXT PRIMARY KEY, query TEXT, kind TEXT, CHECK ((query IS NULL) <> (kind IS NULL)));
"""

_DELETE_TRIGGER = """CREATE TRIGGER IF NOT EXISTS events_append_only_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END;"""

#: The ``train.status`` states after which a training run is over (as :data:`lab.training.monitor.TERMINAL`).
TRAINING_TERMINAL = ("finished", "stopped", "failed")

# the keys of training runs still open: a run (key of its train.* events) with no train.status at all,
# or with a rank whose latest train.status is not terminal
_OPEN_RUNS = f"""
SELECT DISTINCT key FROM events WHERE kind = 'train.run' AND key NOT IN (SELECT key FROM events WHERE kind = 'train.status')
UNION
SELECT s.key FROM events s WHERE s.kind = 'train.status'
  AND s.seq = (SELECT MAX(t.seq) FROM events t WHERE t.kind = 'train.status' AND t.key = s.key
               AND COALESCE(json_extract(t.payload, '$.rank'), 0) = COALESCE(json_extract(s.payload, '$.rank'), 0))
  AND COALESCE(json_extract(s.payload, '$.state'), '') NOT IN ({",".join(repr(t) for t in TRAINING_TERMINAL)})
"""

_ARCHIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, time REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
    key TEXT NOT NULL, payload TEXT NOT NULL, dedupe TEXT, archived REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_key ON events(key, seq);
"""


class EventLogError(LabError):
    """The log cannot be opened or written (not a database, read-only, bad payload)."""


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    source: str
    kind: str
    key: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class CompactionReport:
    """What :meth:`EventLog.compact` did: events dropped (and archived), kept because needed, left."""

    dropped: int
    kept_needed: int
    remaining: int
    archive: Path | None
    first_seq: int | None  # the dropped range (None when nothing was dropped)
    last_seq: int | None


def archived_events(archive: str | Path, *, key: str | None = None) -> list[Event]:
    """The events an :meth:`EventLog.compact` moved into ``archive``, in ``seq`` order (one ``key`` only if given).

    Raises :class:`EventLogError` if the file is not such an archive.
    """
    path = Path(archive)
    if not path.is_file():
        raise EventLogError(f"{path}: no such archive")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            sql, args = "SELECT seq, time, source, kind, key, payload FROM events", []
            if key is not None:
                sql, args = sql + " WHERE key = ?", [key]
            rows = conn.execute(sql + " ORDER BY seq", args).fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise EventLogError(f"{path}: not an event archive: {exc}") from None
    return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]


def connect(path: Path, *, timeout_s: float = 30.0) -> sqlite3.Connection:
    """A connection in WAL mode with a busy timeout, autocommit off (explicit transactions).

    When several processes open a new file at once, SQLite can answer "database is locked" to
    the switch into WAL mode without waiting (the busy timeout does not cover it): that is
    retried for up to ``timeout_s`` seconds."""
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    deadline, delay = time.monotonic() + timeout_s, 0.01
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                conn.close()
                raise
            time.sleep(delay)
            delay = min(0.2, delay * 2)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


class EventLog:
    """An append-only event log in one SQLite file.

    Parameters
    ----------
    path : str or pathlib.Path
        The database file (created with its folder if missing).

    Raises
    ------
    EventLogError
        The file exists but is not a SQLite database of this schema.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = connect(self.path)
            self._conn.executescript(_SCHEMA)
            self._conn.execute("INSERT OR IGNORE INTO event_retention(name, query) VALUES ('training.open_runs', ?)", (_OPEN_RUNS,))
        except sqlite3.DatabaseError as exc:
            raise EventLogError(f"{self.path}: cannot open as an event log: {exc}") from None

    @property
    def connection(self) -> sqlite3.Connection:
        """The log's connection, for a module that keeps its own tables in the same file and must
        commit them together with events (one ``BEGIN IMMEDIATE`` ... ``COMMIT``), as
        :mod:`lab.hpc.continuation` does."""
        return self._conn

    def retain(self, name: str, query: str | None = None, *, kind: str | None = None) -> None:
        """Register (or replace) a retention rule, stored in the file so every process that compacts
        honours it: either ``query``, SQL over this database returning one column of event keys whose
        events :meth:`compact` must never drop (e.g. the keys of continuations still waiting), or
        ``kind``, an event kind never dropped (e.g. ``job.submitted``, the record of who submitted what).

        Raises :class:`EventLogError` if not exactly one of them is given or the query does not run.
        """
        if (query is None) == (kind is None):
            raise EventLogError(f"retention rule {name!r}: give a query or a kind (one of them)")
        if query is not None:
            try:
                self._conn.execute(f"SELECT * FROM ({query}) LIMIT 0")
            except sqlite3.Error as exc:
                raise EventLogError(f"retention rule {name!r}: the query does not run: {exc}") from None
        self._conn.execute(
            "INSERT INTO event_retention(name, query, kind) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET query = excluded.query, kind = excluded.kind",
            (name, query, kind),
        )

    def kept_kinds(self) -> set[str]:
        """The event kinds retention rules keep whole (see :meth:`retain`)."""
        return {r[0] for r in self._conn.execute("SELECT kind FROM event_retention WHERE kind IS NOT NULL")}

    def needed_keys(self) -> set[str]:
        """The keys every retention rule asks to keep (see :meth:`retain`)."""
        keys: set[str] = set()
        for name, query in self._conn.execute("SELECT name, query FROM event_retention WHERE query IS NOT NULL ORDER BY name").fetchall():
            try:
                keys.update(str(r[0]) for r in self._conn.execute(query) if r[0] is not None)
            except sqlite3.Error as exc:  # a rule that cannot run must stop the compaction, not be skipped
                raise EventLogError(f"{self.path}: retention rule {name!r} fails: {exc}") from None
        return keys

    def compact(
        self,
        archive: str | Path,
        *,
        before: float | None = None,
        up_to_seq: int | None = None,
        kinds: Iterable[str] | None = None,
        keep_keys: Iterable[str] = (),
        vacuum: bool = False,
        _after_archive=None,
    ) -> CompactionReport:
        """Drop old events, first copying them into ``archive``; keep every event still needed.

        An event is dropped when it is older than ``before`` (epoch seconds) and/or has
        ``seq <= up_to_seq`` (at least one bound is required), is of one of ``kinds`` (all kinds
        if None), and its key is neither in ``keep_keys`` nor returned by a retention rule
        (:meth:`retain`; e.g. a continuation still waiting for its job's event, a run still open),
        and its kind is not one a retention rule keeps whole.

        Atomicity: the log's write lock is held throughout (``BEGIN IMMEDIATE``), so no event or
        continuation can be added between choosing what to keep and dropping the rest. The dropped
        rows are first committed to the archive (``INSERT OR IGNORE`` by ``seq``, synchronous=FULL),
        then deleted here in one transaction: a crash leaves the log as it was (the archive may
        already hold copies; compacting again does not repeat them) or compacted, never half.

        Parameters
        ----------
        archive : path
            An SQLite file (created if missing) with table ``events`` (the log's columns plus
            ``archived``, epoch seconds). May be shared by successive compactions.
        vacuum : bool
            Also ``VACUUM`` the log afterwards to return the freed pages to the file system.

        Returns
        -------
        CompactionReport

        Raises
        ------
        EventLogError
            Neither bound given, the archive cannot be written, or a retention rule fails (nothing dropped).
        """
        if before is None and up_to_seq is None:
            raise EventLogError("compact: give before (epoch seconds) or up_to_seq")
        archive = Path(archive)
        if archive.resolve() == self.path.resolve():
            raise EventLogError(f"compact: the archive {archive} is the log itself")
        archive.parent.mkdir(parents=True, exist_ok=True)
        conn = self._conn
        where, args = [], []
        if before is not None:
            where.append("time < ?")
            args.append(float(before))
        if up_to_seq is not None:
            where.append("seq <= ?")
            args.append(int(up_to_seq))
        if kinds is not None:
            kinds = list(kinds)
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args += kinds
        conn.execute("BEGIN IMMEDIATE")
        try:
            kept_kinds = sorted(self.kept_kinds())
            if kept_kinds:
                where.append(f"kind NOT IN ({','.join('?' * len(kept_kinds))})")
                args += kept_kinds
            keep = self.needed_keys() | {str(k) for k in keep_keys}
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS _keep_keys (key TEXT PRIMARY KEY)")
            conn.execute("DELETE FROM temp._keep_keys")
            conn.executemany("INSERT OR IGNORE INTO temp._keep_keys(key) VALUES (?)", ((k,) for k in keep))
            cond = " AND ".join(where)
            kept = conn.execute(f"SELECT COUNT(*) FROM events WHERE {cond} AND key IN (SELECT key FROM temp._keep_keys)", args).fetchone()[0]
            rows = conn.execute(
                f"SELECT seq, time, source, kind, key, payload, dedupe FROM events WHERE {cond} AND key NOT IN (SELECT key FROM temp._keep_keys) ORDER BY seq",
                args,
            ).fetchall()
            if rows:
                try:
                    arch = sqlite3.connect(archive, timeout=30.0, isolation_level=None)
                    try:
                        arch.execute("PRAGMA synchronous=FULL")
                        arch.executescript(_ARCHIVE_SCHEMA)
                        arch.execute("BEGIN IMMEDIATE")
                        now = time.time()
                        arch.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (r + (now,) for r in rows))
                        arch.execute("COMMIT")
                    finally:
                        arch.close()
                except sqlite3.Error as exc:
                    raise EventLogError(f"compact: cannot write the archive {archive}: {exc}") from None
                if _after_archive is not None:  # tests: a crash between the archive and the log
                    _after_archive()
                conn.execute("DROP TRIGGER events_append_only_delete")
                conn.executemany("DELETE FROM events WHERE seq = ?", ((r[0],) for r in rows))
                conn.execute(_DELETE_TRIGGER)
            conn.execute("DELETE FROM temp._keep_keys")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if rows and vacuum:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
        remaining = int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        return CompactionReport(
            dropped=len(rows), kept_needed=int(kept), remaining=remaining, archive=archive if rows else None,
            first_seq=rows[0][0] if rows else None, last_seq=rows[-1][0] if rows else None,
        )

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def append(self, source: str, kind: str, key: str, payload: dict[str, Any] | None = None, *, dedupe: str | None = None, at: float | None = None) -> int:
        """Append one event; returns its ``seq`` (the existing one if ``dedupe`` was seen before).

        Raises :class:`EventLogError` if ``payload`` is not JSON-serialisable.
        """
        try:
            body = json.dumps(payload or {}, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise EventLogError(f"event {kind!r} for {key!r}: payload is not JSON: {exc}") from None
        when = time.time() if at is None else at
        cur = self._conn.execute(
            "INSERT INTO events(time, source, kind, key, payload, dedupe) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(dedupe) DO NOTHING",
            (when, source, kind, key, body, dedupe),
        )
        if cur.rowcount == 1:
            return int(cur.lastrowid)
        return int(self._conn.execute("SELECT seq FROM events WHERE dedupe = ?", (dedupe,)).fetchone()[0])

    def append_many(self, events: Iterable[tuple]) -> list[int]:
        """Append several events with one SQL statement; returns their ``seq`` s in the order given.

        Each item is ``(source, kind, key, payload)`` optionally followed by ``dedupe`` and ``at``,
        as the arguments of :meth:`append` (an item whose ``dedupe`` was seen before, also earlier
        in the same call, gets the existing ``seq`` and writes nothing). One statement, not one per
        event: a burst of hundreds of events (jobs ending in the same second) is one step for
        SQLite and holds the write lock for as long as one insert of that many rows.

        Raises :class:`EventLogError` if a payload is not JSON-serialisable (nothing is written).
        """
        rows = []
        for item in events:
            source, kind, key, payload, dedupe, at = (tuple(item) + (None, None))[:6]
            try:
                body = json.dumps(payload or {}, sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise EventLogError(f"event {kind!r} for {key!r}: payload is not JSON: {exc}") from None
            rows.append([time.time() if at is None else float(at), source, kind, key, body, dedupe])
        if not rows:
            return []
        cur = self._conn.execute(
            "INSERT INTO events(time, source, kind, key, payload, dedupe) "
            "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
            "json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]') "
            "FROM json_each(?) WHERE true ORDER BY json_each.key ON CONFLICT(dedupe) DO NOTHING RETURNING seq, dedupe",
            (json.dumps(rows),),
        )
        returned = cur.fetchall()
        inserted_dedupes = {d for _, d in returned if d is not None}
        new_seqs = iter(sorted(seq for seq, _ in returned))  # one writer: consecutive seqs in insertion order
        seqs: list[int | None] = []
        first_of: set[str] = set()
        for row in rows:
            dedupe = row[5]
            if dedupe is None or (dedupe in inserted_dedupes and dedupe not in first_of):
                if dedupe is not None:
                    first_of.add(dedupe)
                seqs.append(int(next(new_seqs)))
            else:
                seqs.append(None)
        missing = sorted({row[5] for row, seq in zip(rows, seqs) if seq is None})
        if missing:
            known = dict(self._conn.execute("SELECT dedupe, seq FROM events WHERE dedupe IN (SELECT value FROM json_each(?))", (json.dumps(missing),)))
            seqs = [int(known[row[5]]) if seq is None else seq for row, seq in zip(rows, seqs)]
        return seqs

    def last_seq(self) -> int:
        """The newest event's ``seq`` (0 for an empty log)."""
        return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])

    def tail(self, after: int = 0, *, kinds: list[str] | None = None, key: str | None = None, limit: int | None = None) -> list[Event]:
        """Events with ``seq > after`` in order, optionally only some ``kinds`` or one ``key``."""
        sql, args = "SELECT seq, time, source, kind, key, payload FROM events WHERE seq > ?", [after]
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += list(kinds)
        if key is not None:
            sql += " AND key = ?"
            args.append(key)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [Event(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in self._conn.execute(sql, args)]

    def follow(self, after: int = 0, *, kinds: list[str] | None = None, poll_s: float = 0.2, timeout_s: float | None = None) -> Iterator[Event]:
        """Yield events after ``after`` as they are appended (by any process), polling every ``poll_s``
        seconds; stops after ``timeout_s`` seconds without a new event (never, if None)."""
        last, idle_since = after, time.monotonic()
        while True:
            batch = self.tail(last, kinds=kinds)
            for event in batch:
                last = event.seq
                yield event
            if batch:
                idle_since = time.monotonic()
            elif timeout_s is not None and time.monotonic() - idle_since > timeout_s:
                return
            else:
                time.sleep(poll_s)
