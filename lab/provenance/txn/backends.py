"""The two database backends of the MemTX store behind one small interface.

:class:`SQLiteBackend`: the embedded default, one file in WAL mode; a write transaction is ``BEGIN IMMEDIATE``
(one writer at a time, readers never blocked). :class:`PostgresBackend`: a PostgreSQL server through psycopg 3;
a write transaction runs at ``REPEATABLE READ`` (true snapshot isolation: a concurrent update of a row the
transaction also updates raises a serialization failure, which the store answers by re-running the whole
commit on a fresh snapshot). Both keep the same tables (:data:`SCHEMA`); SQL is written with ``?`` and the
PostgreSQL backend rewrites it to ``%s``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab.provenance.errors import BackendUnavailableError

__all__ = ["SCHEMA", "Backend", "SQLiteBackend", "PostgresBackend", "open_backend", "RetryableConflict"]

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS clock (k INTEGER PRIMARY KEY, seq BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, type TEXT NOT NULL, entity TEXT NOT NULL, attribute TEXT NOT NULL,"
    " body TEXT NOT NULL, tx TEXT, created_seq BIGINT NOT NULL, ord BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS records_slot ON records (entity, attribute)",
    "CREATE INDEX IF NOT EXISTS records_tx ON records (tx)",
    "CREATE TABLE IF NOT EXISTS parents (child TEXT NOT NULL, parent TEXT NOT NULL, PRIMARY KEY (child, parent))",
    "CREATE INDEX IF NOT EXISTS parents_parent ON parents (parent)",
    "CREATE TABLE IF NOT EXISTS versions (id TEXT NOT NULL, n INTEGER NOT NULL, seq BIGINT NOT NULL, state TEXT NOT NULL,"
    " reason TEXT NOT NULL, tx TEXT, PRIMARY KEY (id, n))",
    "CREATE INDEX IF NOT EXISTS versions_seq ON versions (seq)",
    "CREATE TABLE IF NOT EXISTS heads (id TEXT PRIMARY KEY, state TEXT NOT NULL, n INTEGER NOT NULL, seq BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS heads_state ON heads (state)",
    "CREATE TABLE IF NOT EXISTS pending (id TEXT PRIMARY KEY, seq BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS txs (id TEXT PRIMARY KEY, agent TEXT NOT NULL, tier TEXT NOT NULL, snapshot BIGINT NOT NULL,"
    " status TEXT NOT NULL, end_seq BIGINT)",
    "CREATE TABLE IF NOT EXISTS audit (seq BIGINT NOT NULL, i INTEGER NOT NULL, op TEXT NOT NULL, record TEXT, detail TEXT NOT NULL,"
    " PRIMARY KEY (seq, i))",
    "CREATE TABLE IF NOT EXISTS effects (id TEXT PRIMARY KEY, tool TEXT NOT NULL, args TEXT NOT NULL, status TEXT NOT NULL)",
]


class RetryableConflict(Exception):
    """The database refused a transaction because a concurrent one changed the same rows (PostgreSQL's
    serialization failure, SQLite's busy timeout): the store re-runs the transaction."""


class Backend:
    """What the store needs from a database: ``write()`` (one atomic, serialised read-write transaction),
    ``read()`` (a consistent read-only one) and ``q(sql, params)`` inside them; ``savepoint()``: a write
    transaction when none is open, else a nested SQL ``SAVEPOINT`` whose changes an exception inside it rolls back
    (the enclosing transaction goes on)."""

    name = "abstract"
    _depth = 0
    _sp = 0

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        if not self._depth:
            with self.write():
                yield
            return
        self._sp += 1
        name = f"lab_sp{self._sp}"
        self.x(f"SAVEPOINT {name}")
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            self.x(f"ROLLBACK TO SAVEPOINT {name}")
            self.x(f"RELEASE SAVEPOINT {name}")
            raise
        self._depth -= 1
        self.x(f"RELEASE SAVEPOINT {name}")

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:  # pragma: no cover - interface
        raise NotImplementedError

    def x(self, sql: str, params: Sequence[Any] = ()) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def init_schema(self) -> None:
        """Create the tables unless they exist (a cheap probe first: opening a store is frequent)."""
        try:
            with self.read():
                if self.q("SELECT seq FROM clock WHERE k = 0"):
                    return
        except Exception:  # no such table yet
            pass
        with self.write():
            for stmt in SCHEMA:
                self.x(stmt)
            if not self.q("SELECT seq FROM clock WHERE k = 0"):
                self.x("INSERT INTO clock VALUES (0, 0)")


class SQLiteBackend(Backend):
    """One SQLite file in WAL mode (``synchronous=NORMAL``: atomic under a process crash or power loss; the last
    commits may be lost on power loss, never half of one).

    Parameters
    ----------
    path : str or Path
        The database file (created if missing); ``":memory:"`` for a throwaway store.
    busy_timeout_s : float
        How long a writer waits for another writer before the store retries.

    Raises
    ------
    BackendUnavailableError
        The file cannot be opened (missing folder, no permission, not a database).
    """

    name = "sqlite"

    def __init__(self, path: str | Path = ":memory:", *, busy_timeout_s: float = 30.0):
        self.path = str(path)
        try:
            self._c = sqlite3.connect(self.path, isolation_level=None, timeout=busy_timeout_s, check_same_thread=False)
            self._c.execute("PRAGMA journal_mode=WAL")
            self._c.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"cannot open SQLite store {self.path}: {exc}", field="path") from None
        self._depth = 0

    def q(self, sql, params=()):
        return self._c.execute(sql, tuple(params)).fetchall()

    def x(self, sql, params=()):
        self._c.execute(sql, tuple(params))

    @contextmanager
    def write(self) -> Iterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            self._c.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise RetryableConflict(str(exc)) from None
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth = 0
            self._c.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            self._c.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._c.execute("ROLLBACK")
            raise RetryableConflict(str(exc)) from None

    @contextmanager
    def read(self) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._c.execute("BEGIN")
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            self._c.execute("COMMIT")

    def close(self) -> None:
        self._c.close()


class PostgresBackend(Backend):
    """A PostgreSQL database through psycopg 3; write transactions at ``REPEATABLE READ``.

    Parameters
    ----------
    dsn : str
        A libpq connection string or URI (``postgresql://user@127.0.0.1:5432/db``).
    connect_timeout_s : int

    Raises
    ------
    BackendUnavailableError
        psycopg is not installed or the server cannot be reached with that DSN (the message names the DSN,
        without its password).
    """

    name = "postgresql"

    def __init__(self, dsn: str, *, connect_timeout_s: int = 5):
        try:
            import psycopg
        except ImportError:  # pragma: no cover - psycopg is a dependency
            raise BackendUnavailableError("psycopg 3 is not installed (pip install 'psycopg[binary]')", field="dsn") from None
        self._psycopg = psycopg
        self.dsn = dsn
        try:
            self._c = psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout_s)
        except (psycopg.Error, ValueError) as exc:
            shown = dsn.split("@")[-1] if "@" in dsn else dsn
            raise BackendUnavailableError(f"cannot connect to PostgreSQL at {shown!r}: {str(exc).strip()}", field="dsn") from None
        self._depth = 0
        self._cur = self._c.cursor()

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")

    def q(self, sql, params=()):
        self._cur.execute(self._sql(sql), tuple(params))
        return self._cur.fetchall() if self._cur.description else []

    def x(self, sql, params=()):
        self._cur.execute(self._sql(sql), tuple(params))

    @contextmanager
    def _tx(self, mode: str) -> Iterator[None]:
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        errors = self._psycopg.errors
        self._cur.execute(f"BEGIN ISOLATION LEVEL REPEATABLE READ {mode}")
        self._depth = 1
        try:
            yield
        except (errors.SerializationFailure, errors.DeadlockDetected, errors.UniqueViolation) as exc:
            self._depth = 0
            self._cur.execute("ROLLBACK")
            raise RetryableConflict(str(exc)) from None
        except BaseException:
            self._depth = 0
            if not self._c.closed:
                self._cur.execute("ROLLBACK")
            raise
        self._depth = 0
        try:
            self._cur.execute("COMMIT")
        except (errors.SerializationFailure, errors.DeadlockDetected) as exc:
            raise RetryableConflict(str(exc)) from None

    def write(self):
        return self._tx("READ WRITE")

    def read(self):
        return self._tx("READ ONLY")

    def close(self) -> None:
        self._c.close()


def open_backend(where: str | Path) -> Backend:
    """A backend from a location: a ``postgresql://`` / ``postgres://`` URI or a ``key=value`` DSN with ``host=``
    or ``dbname=``: PostgreSQL; anything else: an SQLite file path.

    Raises
    ------
    BackendUnavailableError
    """
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")) or ("=" in text and any(k in text for k in ("host=", "dbname="))):
        return PostgresBackend(text)
    return SQLiteBackend(text)


def retrying(fn, *, attempts: int = 200, pause_s: float = 0.002):
    """Run ``fn()`` until it does not raise :class:`RetryableConflict` (backing off a little each time)."""
    for i in range(attempts):
        try:
            return fn()
        except RetryableConflict:
            if i == attempts - 1:
                raise
            time.sleep(pause_s * min(i + 1, 20))
    raise AssertionError("unreachable")
