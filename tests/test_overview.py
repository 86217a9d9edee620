"""lab.overview: what the JupyterLab side panel shows, read from real testbeds, event logs and services."""

from __future__ import annotations

import socket
import subprocess
import sqlite3
import time

import pytest

from lab import overview
from lab.events import EventLog
from lab.hpc import testbed as testbed_module
from lab.hpc.continuation import Continuations, ContinuationService
from lab.training.monitor import KIND_RUN, KIND_STATUS, KIND_STEP


def test_state_file_name_is_the_testbeds():
    assert overview.STATE_FILE == testbed_module.STATE_FILE


def test_discover_finds_logs_and_never_writes_a_foreign_database(tmp_path):
    foreign = tmp_path / "a" / "other.db"
    foreign.parent.mkdir()
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE things (x)")
    before = foreign.read_bytes()
    (tmp_path / "a" / "notes.sqlite").write_text("not a database")
    log = tmp_path / "a" / "b" / "events.sqlite"
    log.parent.mkdir()
    EventLog(log).close()
    deep = tmp_path / "1" / "2" / "3" / "4" / "events.sqlite"
    deep.parent.mkdir(parents=True)
    EventLog(deep).close()
    found = overview.discover([tmp_path], max_depth=3)
    assert found.logs == [log] and found.testbeds == []  # the deep one is past max_depth
    assert foreign.read_bytes() == before
    assert overview.discover([tmp_path / "missing"]).logs == []


def _status(log: EventLog, run: str, pid: int, state: str = "heartbeat", step: int = 3) -> None:
    log.append(run, KIND_STATUS, run, {"rank": 0, "state": state, "step": step, "pid": pid, "host": socket.gethostname()})


def test_a_run_whose_process_is_gone_is_dead_at_once(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    with EventLog(tmp_path / "events.sqlite") as log:
        for run, pid in (("killed", gone.pid), ("alive", subprocess.os.getpid())):
            log.append(run, KIND_RUN, run, {"config": {"steps": 10}, "world_size": 1})
            log.append(run, KIND_STEP, run, {"step": 3, "loss": 2.5})
            _status(log, run, pid)
        log.append("done", KIND_RUN, "done", {"config": {"steps": 3}, "world_size": 1})
        _status(log, "done", gone.pid, state="finished")
    runs = {r.run_id: r for r in overview.snapshot([tmp_path]).runs}
    assert (runs["killed"].state, runs["killed"].alive) == ("dead", False)  # heartbeat still fresh: only the pid says so
    assert (runs["alive"].state, runs["alive"].alive, runs["alive"].step, runs["alive"].loss) == ("running", True, 3, 2.5)
    assert runs["done"].state == "finished"  # a finished run is not dead because its process has exited
    assert runs["killed"].steps == 10


@pytest.mark.slurm
def test_sites_and_a_continuation_service_are_read_through_the_facets(tmp_path, testbed):
    db = tmp_path / "lab.db"
    service = ContinuationService(db, {s.name: s.scheduler() for s in testbed.sites})
    try:
        service.poll_queues()
    finally:
        service.close()
    cont = Continuations(db)
    cont.watch_job("alpha", "999")
    cont.register("alpha/999", "json:dumps")
    cont.close()
    ov = overview.snapshot([tmp_path, testbed.dir], now=time.time())
    assert ov.errors == []
    assert [(s.name, s.state, s.pending, s.running, s.total_cpus) for s in ov.sites] == [
        ("alpha", "up", 0, 0, 2), ("beta", "up", 0, 0, 1)]
    [svc] = ov.services
    assert svc.log == str(db) and svc.sites == {"alpha": "live", "beta": "live"} and svc.state == "live" and svc.waiting == 1
    late = overview.snapshot([tmp_path], now=time.time() + 3600)
    assert late.services[0].state == "stale" and late.services[0].sites == {"alpha": "stale", "beta": "stale"}
