"""lab.cleanup.after_exit: what a process started is stopped and its folders removed however it ends (here: SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
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


def test_notebook_02_sites_go_down_when_its_kernel_is_killed_mid_lesson(tmp_path):
    """The teaching notebook starts four Slurm sites in its first cell and stops them in its last. A kernel that dies
    in between (a failed cell in a test run, a user's "kill kernel") must not leave the daemons running: the first
    cell registers the testbed with ``after_exit``. (A failed browser run once left these four sites up for 40 min.)"""
    import json
    import os
    import shutil
    from pathlib import Path

    from jupyter_client.manager import start_new_kernel

    from lab.hpc.testbed import Testbed

    if not shutil.which("slurmctld"):
        pytest.skip("Slurm is not installed (make slurm)")
    root = Path(__file__).resolve().parents[1]
    nb = json.loads((root / "notebooks" / "02_federated_sites.ipynb").read_text())
    first = "".join(nb["cells"][1]["source"])
    assert "after_exit(testbeds=[testbed.dir]" in first
    scratch = Path(tempfile.mkdtemp(prefix="nbk-", dir="/tmp"))  # short: Slurm's sockets live under it
    env = {**os.environ, "TMPDIR": str(scratch)}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(root / "notebooks"), env=env)
    line = None
    try:
        out: list[str] = []
        reply = kc.execute_interactive(first + "\nprint('TESTBED', testbed.dir)", timeout=180,
                                       output_hook=lambda msg: _collect(msg, out))
        assert reply["content"]["status"] == "ok", reply["content"]
        line = next(t for t in "".join(out).splitlines() if t.startswith("TESTBED "))
        testbed = Testbed(line.split(" ", 1)[1])
        assert all(all(d.values()) for d in testbed.status().values()), testbed.status()
        os.kill(km.provisioner.process.pid, signal.SIGKILL)  # no last cell, no atexit
        assert _wait_until(lambda: not any(any(d.values()) for d in testbed.status().values()), timeout_s=90), \
            f"the killed kernel's sites are still up: {testbed.status()}"
        assert _wait_until(lambda: not Path(line.split(" ", 1)[1]).exists(), timeout_s=30)
    finally:
        kc.stop_channels()
        try:
            km.shutdown_kernel(now=True)
        except Exception:
            pass
        if line is not None:  # the notebook's own folder (mkdtemp in /tmp, not under TMPDIR): down if the watchdog was not
            work = Path(line.split(" ", 1)[1]).parent
            Testbed(work / "testbed").down()
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _collect(msg, out):
    if msg["msg_type"] == "stream":
        out.append(msg["content"]["text"])
