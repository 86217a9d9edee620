"""widgets.TrainingMonitor over runs written by other processes: overlay, resume, a dead rank, a restart."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from lab.training.monitor import RunRecorder
from widgets import TrainingMonitor

WRITER = textwrap.dedent(
    """
    import sys, time
    from lab.training.monitor import RunRecorder
    path, run, world, steps, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    recs = [RunRecorder(path, run, r) for r in range(world)]
    recs[0].run_started(config={"optimizer": "adams", "comm": run, "steps": steps}, world_size=world, n_params=1000)
    for r in recs:
        r.status("started", 0)
    for s in range(1, steps + 1):
        recs[0].step(s, loss=4.0 / s, lr=1e-3, step_s=0.2, compute_s=0.15, comm_s=0.05, bytes_sent=4000 if run == "fp32" else 1004, grad_rel_err=None if run == "fp32" else 0.03)
        if s % 5 == 0:
            recs[0].eval(s, 4.5 / s)
        for r in recs:
            r.status("heartbeat", s)
        if s == die_at:
            recs[0].status("failed", s, error="RuntimeError: Connection reset by peer")
            sys.exit(0)  # rank 1 goes silent: its last word is a heartbeat
    for r in recs:
        r.status("finished", steps, param_sha256="abc")
    """
)


def write_run(path, run, *, world=2, steps=10, die_at=-1):
    subprocess.run([sys.executable, "-c", WRITER, str(path), run, str(world), str(steps), str(die_at)], check=True, timeout=120)


def trace(mon: TrainingMonitor, run: str, column: str):
    d = mon.figure.data[mon._trace_index[(run, column)]]
    return list(d.x), list(d.y)


def test_overlays_runs_from_other_processes_and_follows_new_ones(tmp_path):
    path = tmp_path / "events.sqlite"
    mon = TrainingMonitor(path, heartbeat_timeout_s=60)
    assert "no run" in mon.table.value
    write_run(path, "fp32")
    assert mon.refresh() > 0
    x, y = trace(mon, "fp32", "loss")
    assert x == list(range(1, 11)) and y == pytest.approx([4.0 / s for s in range(1, 11)])
    assert trace(mon, "fp32", "val_loss") == ([5, 10], pytest.approx([0.9, 0.45]))
    assert trace(mon, "fp32", "bytes_sent")[1] == [4000.0] * 10
    assert trace(mon, "fp32", "grad_rel_err") == ([], [])  # fp32 reports no codec error
    write_run(path, "fp8", steps=6)  # a second run appears while the monitor is open
    mon.refresh()
    assert mon.selected == ["fp32", "fp8"] and mon.picker.options == ("fp32", "fp8")
    assert trace(mon, "fp8", "grad_rel_err")[1] == pytest.approx([0.03] * 6)
    assert "finished" in mon.table.value and "6 / 6" in mon.table.value
    mon.selected = ["fp8"]  # the two-way trait hides the other run
    assert mon.picker.value == ("fp8",)
    assert not mon.figure.data[mon._trace_index[("fp32", "loss")]].visible
    assert mon.figure.data[mon._trace_index[("fp8", "loss")]].visible


def test_dead_rank_failed_run_and_a_kernel_restart(tmp_path):
    path = tmp_path / "events.sqlite"
    write_run(path, "fp8", steps=20, die_at=7)
    mon = TrainingMonitor(path, heartbeat_timeout_s=0.5)
    time.sleep(0.6)
    mon.refresh()
    table = mon.table.value
    assert "failed" in table and "Connection reset by peer" in table and "r1 " in table and "dead" in table
    assert trace(mon, "fp8", "loss")[0] == list(range(1, 8))
    # the run is resumed (from a checkpoint at step 5): the rewritten steps replace the old ones
    rec = RunRecorder(path, "fp8", 0)
    for s in range(6, 9):
        rec.step(s, loss=1.0, lr=1e-3, step_s=0.2, compute_s=0.15, comm_s=0.05, bytes_sent=1004, grad_rel_err=0.03)
    mon.refresh()
    x, y = trace(mon, "fp8", "loss")
    assert x == list(range(1, 9)) and y[5:] == [1.0, 1.0, 1.0]
    # "kernel restart": a new monitor on the same file shows the same thing
    again = TrainingMonitor(path, heartbeat_timeout_s=0.5)
    assert trace(again, "fp8", "loss") == (x, y)
