"""lab.cleanup.after_exit: what a process started is stopped and its folders removed however it ends (here: SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from lab.cleanup import CleanupError, after_exit


def _wait_until(condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def test_a_killed_owner_still_gets_its_processes_stopped_and_folders_removed(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    # registered the instant it is spawned, maybe before its exec (a command line read then is still pytest's)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    folder = tmp_path / "scratch"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "f.txt").write_text("x")
    watchdog = after_exit(owner=owner.pid, processes=[child], paths=[folder], grace_s=1.0)
    time.sleep(1.0)
    assert child.poll() is None and folder.exists()  # nothing happens while the owner lives
    owner.send_signal(signal.SIGKILL)  # no atexit, no finally: only the watchdog can clean up
    owner.wait()
    assert _wait_until(lambda: child.poll() is not None), "the owner's process was not stopped"
    assert child.returncode == -signal.SIGTERM
    assert _wait_until(lambda: not folder.exists()), "the owner's folder was not removed"
    assert watchdog.wait(timeout=30) == 0


def test_refuses_a_process_that_is_not_running():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    with pytest.raises(CleanupError, match=f"process {done.pid} is not running"):
        after_exit(processes=[done])
    with pytest.raises(CleanupError, match="grace_s"):
        after_exit(grace_s=-1)
