"""The lab's one durable event log: SQLite (WAL), append-only, tail and subscribe.

Continuation services, training runs and widgets share it: a producer
:meth:`EventLog.append`\\ s events, any number of readers in other processes
:meth:`~EventLog.tail` them from a sequence number or :meth:`~EventLog.follow`
new ones as they arrive. Rows are never updated or deleted, so a reader that
remembers the last ``seq`` it handled can resume after a crash without losing
or repeating an event. One file per log; safe for several processes (WAL mode,
``busy_timeout``).

An :class:`Event` has ``seq`` (int, increasing), ``time`` (epoch seconds, UTC),
``source`` (who wrote it, e.g. a site name), ``kind`` (e.g. ``"job.completed"``),
``key`` (what it is about, e.g. ``"alpha/42"``) and a JSON ``payload``. An optional
``dedupe`` string makes an append idempotent: a second append with the same
``dedupe`` returns the first event's ``seq`` and writes nothing.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import LabError

__all__ = ["Event", "EventLog", "EventLogError"]

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
        except sqlite3.DatabaseError as exc:
            raise EventLogError(f"{self.path}: cannot open as an event log: {exc}") from None

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
