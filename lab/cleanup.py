"""Clean up after a process however it ends: a detached watchdog stops what it started and removes its folders.

A dashboard notebook starts things that outlive its kernel unless stopped: Slurm daemons (their own sessions),
a continuation service, ``torchrun`` jobs, temporary folders. ``atexit`` is not enough: a kernel that does not
exit within its manager's grace period (Jupyter's ``shutdown_wait_time``, 5 s) is killed, and a killed process
runs no handler. :func:`after_exit` instead starts ``python -m lab.cleanup``, a watchdog in its own session that
waits for the owner process to end (gone, or a zombie) and then, in order:
terminates the processes given (SIGTERM, then SIGKILL after ``grace_s``; only a process whose start time is
still the one recorded, so a reused pid is left alone), brings the :class:`lab.hpc.testbed.Testbed` folders
down, and removes the paths.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lab import LabError

__all__ = ["CleanupError", "after_exit"]


class CleanupError(LabError, ValueError):
    """A cleanup plan names something that cannot be watched or removed (the field is named)."""


def _started(pid: int) -> str | None:
    """When ``pid`` started (``/proc/<pid>/stat``'s starttime, clock ticks since boot), None if it is gone or a
    zombie: the process's identity, set at fork and kept through exec (a command line changes at exec, so one
    read just after ``Popen`` may still be the parent's)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(pid: int) -> bool:
    return _started(pid) is not None


def after_exit(*, processes: Sequence[int | subprocess.Popen] = (), testbeds: Sequence[str | Path] = (),
               paths: Sequence[str | Path] = (), owner: int | None = None, grace_s: float = 10.0) -> subprocess.Popen:
    """Once process ``owner`` (default this one) has ended, however it ended: stop ``processes``, bring
    ``testbeds`` down (``python -m lab.hpc.testbed down --dir``) and remove ``paths`` (folders or files).

    Parameters
    ----------
    processes : sequence of int or subprocess.Popen
        Processes to stop: SIGTERM to the process, then SIGKILL after ``grace_s`` seconds if it is still there.
    testbeds : sequence of path
        :class:`lab.hpc.testbed.Testbed` folders.
    paths : sequence of path
        Removed last (``shutil.rmtree`` for a folder).
    owner : int, optional
        The pid to wait for; default :func:`os.getpid`.
    grace_s : float
        Seconds between SIGTERM and SIGKILL.

    Returns
    -------
    subprocess.Popen
        The watchdog (its own session, so it survives the owner's process group being killed).

    Raises
    ------
    CleanupError
        A process that is not running (named by its pid), or ``grace_s`` negative.
    """
    if grace_s < 0:
        raise CleanupError(f"after_exit: grace_s must be >= 0, got {grace_s!r}")
    plan = {"owner": int(owner if owner is not None else os.getpid()), "grace_s": float(grace_s), "processes": [],
            "testbeds": [str(Path(t).resolve()) for t in testbeds], "paths": [str(Path(p).resolve()) for p in paths]}
    for p in processes:
        pid = p.pid if isinstance(p, subprocess.Popen) else int(p)
        started = _started(pid)
        if started is None:
            raise CleanupError(f"after_exit: process {pid} is not running, nothing to stop")
        plan["processes"].append({"pid": pid, "started": started})
    return subprocess.Popen([sys.executable, "-m", "lab.cleanup", json.dumps(plan)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(pid: int, started: str, grace_s: float) -> None:
    if _started(pid) != started:  # gone, or the pid now belongs to another process
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _started(pid) == started:
        time.sleep(0.2)
    if _started(pid) == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(plan: dict, poll_s: float = 0.5) -> None:
    """The watchdog's work (``python -m lab.cleanup PLAN``): wait for the owner, then clean up as planned."""
    while _alive(plan["owner"]):
        time.sleep(poll_s)
    for p in plan["processes"]:
        _stop(p["pid"], p["started"], plan["grace_s"])
    for folder in plan["testbeds"]:
        subprocess.run([sys.executable, "-m", "lab.hpc.testbed", "down", "--dir", folder], check=False, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for path in map(Path, plan["paths"]):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lab.cleanup PLAN``: the watchdog :func:`after_exit` starts, with the JSON plan it wrote
    (what to stop and remove once the watched process ends). Returns the exit status, 0."""
    parser = argparse.ArgumentParser(prog="python -m lab.cleanup", description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="the JSON plan after_exit writes")
    run(json.loads(parser.parse_args(argv).plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
