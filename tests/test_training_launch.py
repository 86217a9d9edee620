"""Stopping a launched run: every rank ends with torchrun or its handle, and the monitor shows the run stopped.

torchrun starts each rank in its own session, so before lab.training.process a SIGKILLed torchrun left
both ranks training (one went from step 45 to 2,994 until killed by hand). The real-run tests launch the
tiny GPT on 2 gloo ranks (a few seconds of start-up on 2 cores) with far more steps than they get to run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lab.training.model import GPTConfig
from lab.training.monitor import RunMonitor
from lab.training.process import ParentWatch, children_of, pid_alive
from lab.training.run import RunHandle, TrainConfig, launch

ROOT = Path(__file__).resolve().parents[1]


def _wait_gone(pids, timeout_s: float) -> float:
    t0 = time.monotonic()
    while any(pid_alive(p) for p in pids) and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------- ParentWatch alone


def test_parent_watch_ends_an_orphan_whose_main_thread_is_stuck(tmp_path):
    """The parent (a python process) starts a child that ignores SIGTERM (a main thread stuck in C code
    behaves so) and sleeps; SIGKILL of the parent: the child's watchdog records, then ends the process."""
    mark = tmp_path / "orphan.txt"
    child = textwrap.dedent(f"""
        import signal, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from lab.training.process import ParentWatch
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        w = ParentWatch(poll_s=0.1, grace_s=0.5, on_orphan=lambda reason: open({str(mark)!r}, "w").write(reason)).install()
        print("ready", flush=True)
        time.sleep(60)
    """)
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", {child!r}], stdout=sys.stdout)
        print(p.pid, flush=True)
        time.sleep(60)
    """)
    par = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(par.stdout.readline())
        assert par.stdout.readline().strip() == "ready"
        assert children_of(par.pid) == [child_pid] and pid_alive(child_pid)
        par.kill()
        par.wait()
        assert _wait_gone([child_pid], 10) < 5  # poll 0.1 s + grace 0.5 s, on a busy machine
        assert not pid_alive(child_pid)
        assert mark.read_text() == f"parent process (pid {par.pid}) ended"
    finally:
        par.kill()


def test_parent_watch_knows_a_launcher_that_is_already_gone():
    w = ParentWatch(expect_parent=None)
    assert w.parent == os.getppid() and not w.parent_gone()
    w.parent = -1  # as if the parent seen at install had died since
    assert w.parent_gone()


# ---------------------------------------------------------------------------------------------- real runs


def _long_run(root: Path, name: str) -> TrainConfig:
    return TrainConfig(run_dir=root / name, model=GPTConfig.tiny(), steps=100_000, batch_size=4, eval_interval=0,
                       checkpoint_interval=0, heartbeat_s=0.5, tensorboard=False)


def _until_training(handle: RunHandle, mon: RunMonitor, run_id: str, timeout_s: float = 120.0) -> list[int]:
    """Wait until the run has logged 3 steps; return its rank pids (both ranks have a status)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        assert handle.poll() is None, f"run {run_id} ended early (exit {handle.returncode})"
        if len(mon.metrics(run_id)) >= 3 and len(mon.status(run_id)) == handle.nproc:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"run {run_id} logged no steps in {timeout_s} s")
    pids = handle.worker_pids()
    assert len(pids) == handle.nproc and set(pids) == set(mon.status(run_id)["pid"])
    return pids


@pytest.fixture
def root(tmp_path):
    return tmp_path


def test_sigkill_of_torchrun_stops_every_rank_and_the_monitor_says_stopped(root):
    cfg = _long_run(root, "orphaned")
    handle = launch(cfg, 2)
    assert isinstance(handle, subprocess.Popen) and isinstance(handle, RunHandle)
    try:
        while not (root / "events.sqlite").exists():
            assert handle.poll() is None, (root / "orphaned" / "launch.log").read_text()[-3000:]
            time.sleep(0.2)
        mon = RunMonitor(root / "events.sqlite", heartbeat_timeout_s=60)
        pids = _until_training(handle, mon, "orphaned")
        os.kill(handle.pid, signal.SIGKILL)  # what a user kills: torchrun cannot forward anything now
        handle.wait()
        took = _wait_gone(pids, 15)
        assert not any(pid_alive(p) for p in pids), f"ranks {pids} still running {took:.1f} s after torchrun died"
        assert took < 10
        steps = mon.metrics("orphaned").index.max()
        time.sleep(1.0)
        assert mon.metrics("orphaned").index.max() == steps  # nobody is writing steps any more
        status = mon.status("orphaned")
        assert set(status["state"]) == {"stopped"}, status
        assert mon.run_state("orphaned") == "stopped"
        reasons = {e.payload.get("reason") for e in mon.log.tail(0, kinds=["train.status"], key="orphaned") if e.payload["state"] == "stopped"}
        assert reasons == {f"torchrun (pid {handle.pid}) ended"}
    finally:
        handle.kill(record=False)


def test_killing_the_handle_ends_every_rank_and_records_them_stopped(root):
    cfg = _long_run(root, "killed")
    handle = launch(cfg, 2)
    try:
        while not (root / "events.sqlite").exists():
            assert handle.poll() is None, (root / "killed" / "launch.log").read_text()[-3000:]
            time.sleep(0.2)
        mon = RunMonitor(root / "events.sqlite", heartbeat_timeout_s=60)
        pids = _until_training(handle, mon, "killed")
        t0 = time.monotonic()
        handle.kill()  # SIGKILL: neither rank can record anything itself
        assert handle.poll() is not None and not any(pid_alive(p) for p in pids)
        assert time.monotonic() - t0 < 10
        status = mon.status("killed")
        assert set(status["state"]) == {"stopped"} and mon.run_state("killed") == "stopped"
        last = [e.payload for e in mon.log.tail(0, kinds=["train.status"], key="killed")][-2:]
        assert {p["reason"] for p in last} == {"killed (SIGKILL) through the run's handle"}
        assert {p["pid"] for p in last} == set(pids)
    finally:
        handle.kill(record=False)
