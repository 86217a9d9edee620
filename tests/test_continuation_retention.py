"""Event-log retention: a compaction keeps what continuations and open runs need, archives the rest,
is atomic, and a continuation pending across a prune still resumes exactly once (langgraph #8531:
pruning a checkpointer's writes lost a pending resume). Also the public submissions store (#16 seam).
"""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest

from lab.events import EventLog, EventLogError, archived_events
from lab.hpc.continuation import Continuations, job_key

HANDLER = "tests.continuation_handlers:record"
REPO = Path(__file__).resolve().parents[1]


def _fill(log: EventLog, n_jobs: int, *, t0: float = 1000.0, skip_completion: tuple[int, ...] = ()) -> None:
    """What a service writes in a day: queue samples and finished jobs, all old."""
    for i in range(n_jobs):
        key = job_key("alpha", str(i))
        log.append("alpha", "job.submitted", key, {"job_id": str(i)}, at=t0 + i)
        log.append("alpha", "job.started", key, {"state": "running"}, dedupe=f"{key}/running", at=t0 + i + 0.5)
        if i not in skip_completion:
            log.append("alpha", "job.completed", key, {"exit_code": 0}, dedupe=f"{key}/completed", at=t0 + i + 1)
        log.append("alpha", "site.queue", "alpha", {"pending": i, "running": 1, "jobs": [{"job_id": str(i)}] * 20}, at=t0 + i + 0.2)


def test_prune_while_a_continuation_is_pending_then_it_resumes_exactly_once(tmp_path):
    db, archive, calls = tmp_path / "lab.db", tmp_path / "archive.db", tmp_path / "calls.txt"
    cont = Continuations(db)
    pending = cont.register(job_key("alpha", "7"), HANDLER, args={"path": str(calls), "tag": "pending"})
    done = cont.register(job_key("alpha", "3"), HANDLER, args={"path": str(calls), "tag": "done"})
    cont.watch_job("alpha", "8")  # a job still watched: its events so far must stay too
    _fill(cont.log, 40, skip_completion=(7,))
    assert [r.id for r in cont.resume_ready()] == [done]  # job 3's continuation is over: its events are no longer needed
    # job 7 ends; its event arrives (old, like everything else) but nobody has resumed it yet
    cont.log.append("alpha", "job.completed", job_key("alpha", "7"), {"exit_code": 0}, dedupe="alpha/7/completed", at=1007.0)
    cont2 = Continuations(db)  # e.g. an operator's compaction from another connection
    cont2.log.append("alpha", "job.completed", job_key("alpha", "99"), {}, at=5000.0)  # a new event, kept by age
    before = cont2.log.last_seq()
    report = cont2.compact(archive, before=4000.0)
    assert report.dropped > 0 and report.kept_needed > 0
    left = {(e.key, e.kind) for e in cont2.log.tail()}
    # the pending continuation's job and the watched job keep every event; job.submitted is kept whole
    assert {(job_key("alpha", "7"), k) for k in ("job.submitted", "job.started", "job.completed")} <= left
    assert {(job_key("alpha", "8"), k) for k in ("job.started", "job.completed")} <= left
    assert (job_key("alpha", "3"), "job.completed") not in left and (job_key("alpha", "12"), "job.started") not in left
    assert (job_key("alpha", "12"), "job.submitted") in left
    assert not any(k == "site.queue" for _, k in left) and (job_key("alpha", "99"), "job.completed") in left
    # what was dropped is in the archive, each once, with its seq
    arch = archived_events(archive)
    assert len(arch) == report.dropped and len({e.seq for e in arch}) == len(arch)
    assert [e.kind for e in archived_events(archive, key=job_key("alpha", "3"))] == ["job.started", "job.completed"]
    # seq numbers are not reused after a compaction
    assert cont2.log.append("x", "tick", "x") == before + 1
    # the pending continuation resumes, exactly once, even with two resumers and a second prune
    got = cont2.resume_ready() + cont.resume_ready()
    assert [r.id for r in got] == [pending]
    cont2.compact(archive, before=6000.0)
    assert cont.resume_ready() == [] and cont2.resume_ready() == []
    assert calls.read_text().splitlines() == [f"{done} job.completed alpha/3 done", f"{pending} job.completed alpha/7 pending"]
    resumed = [e for e in cont2.log.tail(kinds=["continuation.resumed"]) if e.payload["id"] == pending]
    assert len(resumed) == 1
    cont.close()
    cont2.close()


def test_compaction_is_atomic_a_crash_leaves_the_old_log(tmp_path):
    db, archive = tmp_path / "lab.db", tmp_path / "archive.db"
    with EventLog(db) as log:
        _fill(log, 10)
        rows = [(e.seq, e.kind, e.key) for e in log.tail()]

        def crash():
            raise KeyboardInterrupt("killed between the archive and the log")

        with pytest.raises(KeyboardInterrupt):
            log.compact(archive, before=10_000.0, _after_archive=crash)
        assert [(e.seq, e.kind, e.key) for e in log.tail()] == rows  # the old log, whole
        assert log.append("x", "tick", "x") == rows[-1][0] + 1  # and still writable (trigger back, no open transaction)
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            log.connection.execute("DELETE FROM events")
        first = len(archived_events(archive))
        report = log.compact(archive, before=10_000.0, vacuum=True)
        # the archive holds each dropped event once, although the first attempt had already copied them
        assert len(archived_events(archive)) == first == report.dropped == len(rows)
        assert [e.kind for e in log.tail()] == ["tick"] and report.remaining == 1  # the new event is not old


def test_open_training_runs_are_kept(tmp_path):
    with EventLog(tmp_path / "lab.db") as log:
        for run, states in (("run-open", ["started"]), ("run-done", ["started", "finished"]), ("run-2rank", None)):
            log.append("train", "train.run", run, {"world_size": 2}, at=1.0)
            log.append("train", "train.step", run, {"step": 1}, at=2.0)
            for st in states or []:
                log.append("train", "train.status", run, {"rank": 0, "state": st}, at=3.0)
        # two ranks: rank 0 finished, rank 1 still running -> open
        log.append("train", "train.status", "run-2rank", {"rank": 0, "state": "finished"}, at=3.0)
        log.append("train", "train.status", "run-2rank", {"rank": 1, "state": "running"}, at=3.0)
        log.compact(tmp_path / "a.db", before=100.0)
        assert {e.key for e in log.tail()} == {"run-open", "run-2rank"}


def test_bad_compaction_arguments(tmp_path):
    with EventLog(tmp_path / "lab.db") as log:
        with pytest.raises(EventLogError, match="give before"):
            log.compact(tmp_path / "a.db")
        with pytest.raises(EventLogError, match="is the log itself"):
            log.compact(tmp_path / "lab.db", before=1.0)
        with pytest.raises(EventLogError, match="does not run"):
            log.retain("bad", "SELECT nope FROM nowhere")
        with pytest.raises(EventLogError, match="one of them"):
            log.retain("both", "SELECT 1", kind="x")
    with pytest.raises(EventLogError, match="no such archive"):
        archived_events(tmp_path / "missing.db")


def test_public_submissions_store(tmp_path):
    cont = Continuations(tmp_path / "lab.db")
    assert cont.submissions.get("k-1") is None
    first = cont.submissions.record("k-1", "alpha", "42")
    again = cont.submissions.record("k-1", "beta", "7")  # the first record wins
    assert (first.site, first.job_id) == (again.site, again.job_id) == ("alpha", "42")
    cont.close()
    # another process's store sees it (it lives in the shared database)
    other = Continuations(tmp_path / "lab.db")
    assert other.submissions.get("k-1").job_id == "42"
    other.close()


def test_skills_use_only_the_continuation_modules_public_api():
    """skills.py neither reaches into the store's private connection, nor imports private names,
    nor creates tables in the continuation database (issue #16's seam)."""
    tree = ast.parse((REPO / "lab/hpc/skills.py").read_text())
    private = sorted(
        {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "lab.hpc.continuation" for a in n.names if a.name.startswith("_")}
        | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("_store", "_conn")}
    )
    assert private == []
    assert "CREATE TABLE" not in (REPO / "lab/hpc/skills.py").read_text()


def test_compact_command_line(tmp_path, capsys):
    from lab.hpc.continuation import main

    db = tmp_path / "lab.db"
    with EventLog(db) as log:
        _fill(log, 5)
    assert main(["compact", "--db", str(db), "--archive", str(tmp_path / "a.db"), "--older-than-s", "60", "--vacuum"]) == 0
    assert "dropped 15 events" in capsys.readouterr().out  # job.submitted is kept whole (5 of the 20)
    with EventLog(db) as log:
        assert {e.kind for e in log.tail()} == {"job.submitted"}
