"""A throwaway local PostgreSQL server for tests, the benchmark and the notebook.

Uses Debian's ``postgresql`` package (``/usr/lib/postgresql/<major>/bin/initdb`` and ``pg_ctl``; ``make test``
installs it). initdb and pg_ctl refuse to run as root, so as root they run as the ``postgres`` system user the
package creates (through ``runuser``). The cluster lives in a temporary folder, listens on 127.0.0.1 only, with
``trust`` authentication for the ``postgres`` role, and is removed on :meth:`LocalPostgres.stop`.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from lab.provenance.errors import BackendUnavailableError

__all__ = ["LocalPostgres", "pg_bin"]


def pg_bin() -> Path:
    """The folder of Debian's PostgreSQL server binaries (newest major). Raises :class:`BackendUnavailableError`."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise BackendUnavailableError("Debian's postgresql is not installed (make postgresql, or apt-get install postgresql)", field="pg_ctl")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """Start a private PostgreSQL server; ``dsn`` connects to it. Use as a context manager.

    Parameters
    ----------
    port : int, optional
        Default: a free port on 127.0.0.1.
    max_connections : int
    """

    def __init__(self, port: int | None = None, *, max_connections: int = 60):
        self.bin = pg_bin()
        self.port = port or _free_port()
        self.max_connections = max_connections
        self.root = Path(tempfile.mkdtemp(prefix="memtx-pg-"))
        self.data = self.root / "data"
        self._as_postgres = os.geteuid() == 0
        self.started = False

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def start(self) -> "LocalPostgres":
        """initdb and start; raises :class:`BackendUnavailableError` with the server's own message on failure."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        r = self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C")
        if r.returncode:
            raise BackendUnavailableError(f"initdb failed: {r.stderr.strip()[-500:]}", field="initdb")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} -c max_connections={self.max_connections} -c fsync=on -c synchronous_commit=on"
        r = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts, "-w", "-t", "60", "start")
        if r.returncode:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise BackendUnavailableError(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log[-500:]}", field="pg_ctl")
        self.started = True
        return self

    def stop(self) -> None:
        if self.started:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def fresh_database(self, name: str) -> str:
        """Create an empty database ``name`` and return its DSN."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until(pred, timeout_s: float = 10.0) -> bool:
    end = time.time() + timeout_s
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False
