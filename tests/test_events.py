"""The shared event log: append-only, ordered, idempotent appends, readable across processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from lab.events import EventLog, EventLogError


def test_append_tail_and_filters(tmp_path):
    with EventLog(tmp_path / "ev.db") as log:
        assert log.last_seq() == 0
        a = log.append("alpha", "job.started", "alpha/1", {"state": "running"}, at=10.0)
        b = log.append("beta", "job.completed", "beta/7", {"exit_code": 0}, at=11.0)
        c = log.append("alpha", "job.completed", "alpha/1", {"exit_code": 0}, at=12.0)
        assert (a, b, c) == (1, 2, 3) and log.last_seq() == 3
        assert [e.seq for e in log.tail()] == [1, 2, 3]
        assert [e.seq for e in log.tail(1)] == [2, 3]
        assert [e.key for e in log.tail(kinds=["job.completed"])] == ["beta/7", "alpha/1"]
        assert [e.kind for e in log.tail(key="alpha/1")] == ["job.started", "job.completed"]
        assert log.tail(0, limit=1)[0].payload == {"state": "running"} and log.tail(0, limit=1)[0].time == 10.0


def test_dedupe_makes_append_idempotent(tmp_path):
    with EventLog(tmp_path / "ev.db") as log:
        first = log.append("alpha", "job.completed", "alpha/1", {"n": 1}, dedupe="alpha/1/completed")
        again = log.append("alpha", "job.completed", "alpha/1", {"n": 2}, dedupe="alpha/1/completed")
        assert first == again == 1 and log.last_seq() == 1 and log.tail()[0].payload == {"n": 1}


def test_rows_cannot_be_changed_or_deleted(tmp_path):
    path = tmp_path / "ev.db"
    with EventLog(path) as log:
        log.append("alpha", "x", "k")
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE events SET kind = 'y'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM events")


def test_another_process_sees_appends_and_follow_streams_them(tmp_path):
    path = tmp_path / "ev.db"
    log = EventLog(path)
    code = f"from lab.events import EventLog\nlog = EventLog({str(path)!r})\nfor i in range(5): log.append('p', 'tick', str(i), {{'i': i}})\n"
    subprocess.run([sys.executable, "-c", code], check=True)
    got = list(log.follow(0, poll_s=0.01, timeout_s=0.2))
    assert [e.payload["i"] for e in got] == [0, 1, 2, 3, 4]


def test_bad_payload_and_bad_file(tmp_path):
    with EventLog(tmp_path / "ev.db") as log:
        with pytest.raises(EventLogError, match="payload is not JSON"):
            log.append("a", "k", "x", {"f": object()})
        assert log.last_seq() == 0  # nothing half-written
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all, just text" * 100)
    with pytest.raises(EventLogError, match="cannot open as an event log"):
        EventLog(junk)
