"""The processes of a launched training run: a handle that can stop every rank, and ranks that stop
when their launcher dies.

``torchrun`` starts each rank in a session of its own (``setsid``), so a signal to torchrun's process
group never reaches the ranks, and a SIGKILLed torchrun (which cannot forward anything) used to leave
every rank training and writing events. Two mechanisms close that gap:

:class:`ParentWatch` (inside each rank)
    Asks the kernel for a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, Linux, through
    :mod:`ctypes`) and runs a watchdog thread that polls :func:`os.getppid` every ``poll_s`` seconds
    (any POSIX system; it also catches a parent that died before the ``prctl`` call, which the kernel
    cannot signal). When the parent is gone the rank gets SIGTERM (its handler ends the run and records
    a ``stopped`` status saying why); if the process is still alive ``grace_s`` seconds later (its main
    thread stuck in a collective whose peer is gone, say), the watchdog records that status itself,
    if nobody has, and ends the process with :func:`os._exit`.
:class:`RunHandle` (in the launching process)
    What :func:`lab.training.run.launch` returns: a :class:`subprocess.Popen` of torchrun that also knows
    the run's ranks (torchrun's child processes, found in ``/proc``). :meth:`RunHandle.terminate` asks
    every rank to stop (SIGINT: each records ``stopped`` and exits 0, so torchrun ends 0);
    :meth:`RunHandle.kill` SIGKILLs every rank and torchrun, waits until they are gone and records a
    ``stopped`` status for each rank that had not recorded an end (so the monitor shows the run
    stopped, not running until its heartbeats time out); :meth:`RunHandle.stop` is terminate, a wait,
    then kill.

A process is "gone" when ``/proc/<pid>`` no longer exists or is a zombie (exited, not yet reaped).
Process identity is checked by start time (``/proc/<pid>/stat`` field 22), so a recycled pid is never
signalled. Linux only (``/proc``); elsewhere :meth:`RunHandle.worker_pids` is empty and the handle
acts on torchrun alone.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ParentWatch", "RunHandle", "children_of", "pid_alive", "set_parent_death_signal"]

PR_SET_PDEATHSIG = 1
#: How a torchrun agent's command line reads (``torchrun ...`` or ``python -m torch.distributed.run ...``).
TORCHRUN_CMDLINE = re.compile(r"torchrun|torch\.distributed\.(run|launch)")


# ---------------------------------------------------------------------------------------------- /proc
def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (``[0]`` is the state), or None if there is none."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text[text.rfind(")") + 2:].split()


def _start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def pid_alive(pid: int, start_time: str | None = None) -> bool:
    """True if process ``pid`` exists and is not a zombie (and, with ``start_time``, is still the same
    process: same ``/proc/<pid>/stat`` start time)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return start_time is None or (len(fields) > 19 and fields[19] == start_time)


def children_of(pid: int) -> list[int]:
    """Pids of the live processes whose parent is ``pid`` (scans ``/proc``; empty where there is none)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        if fields and len(fields) > 1 and fields[1] == str(pid) and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return sorted(out)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

    Returns False where that is not available (not Linux, or the call failed); the watchdog of
    :class:`ParentWatch` then covers it alone. Note the kernel's rule: the signal comes when the parent
    *thread* that forked this process exits; torchrun's agent forks its workers from its main thread.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# ---------------------------------------------------------------------------------------------- in a rank
class ParentWatch:
    """Stop this process when its parent dies (see the module docstring).

    Parameters
    ----------
    poll_s : float
        Seconds between two looks at :func:`os.getppid` (the watchdog's latency).
    grace_s : float
        Seconds between telling the process to stop (SIGTERM) and ending it with :func:`os._exit`.
    expect_parent : re.Pattern or None
        When given, the parent's command line must match it at :meth:`install` (``TORCHRUN_CMDLINE``
        for a torchrun worker): a process whose launcher died before it could watch (while it was still
        importing torch, say) has already been re-parented to another process and stops at once.
    on_orphan : callable, optional
        ``on_orphan(reason)``, called from the watchdog thread just before :func:`os._exit` unless
        :meth:`ended` was called (a rank records its ``stopped`` status there; it must not use
        objects the main thread is using, such as its database connection).

    Attributes
    ----------
    parent : int
        The parent's pid when :meth:`install` ran.
    reason : str or None
        Why this process is stopping (``"torchrun (pid 123) ended"``), once its parent is gone.
    """

    def __init__(self, *, poll_s: float = 0.25, grace_s: float = 5.0, expect_parent: re.Pattern | None = None,
                 on_orphan: Callable[[str], None] | None = None):
        self.poll_s, self.grace_s, self.expect_parent = float(poll_s), float(grace_s), expect_parent
        self.on_orphan = on_orphan
        self.parent = os.getppid()
        self.parent_cmd = ""
        self.reason: str | None = None
        self.pdeathsig = False
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> ParentWatch:
        """Set the parent-death signal and start the watchdog thread; returns ``self``."""
        self.parent = os.getppid()
        self.parent_cmd = _cmdline(self.parent)
        self.pdeathsig = set_parent_death_signal(signal.SIGTERM)
        already = self.expect_parent is not None and not self.expect_parent.search(self.parent_cmd)
        self._thread = threading.Thread(target=self._loop, args=(already,), name="lab-parent-watch", daemon=True)
        self._thread.start()
        return self

    def parent_gone(self) -> bool:
        """True once this process's parent is not the one :meth:`install` saw."""
        return os.getppid() != self.parent or self.reason is not None

    def parent_description(self) -> str:
        name = "torchrun" if TORCHRUN_CMDLINE.search(self.parent_cmd) else "parent process"
        return f"{name} (pid {self.parent})"

    def ended(self) -> None:
        """Tell the watchdog this process has recorded its end (it then skips ``on_orphan``)."""
        self._ended.set()

    def close(self) -> None:
        """Stop watching (the parent-death signal stays set)."""
        self._stop.set()

    def _loop(self, already_orphaned: bool) -> None:
        if not already_orphaned:
            while not self._stop.wait(self.poll_s):
                if os.getppid() != self.parent:
                    break
            else:
                return
            self.reason = f"{self.parent_description()} ended"
        else:
            self.reason = f"{self.parent_description()} is not a torchrun agent: the launcher ended before this rank started"
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the main thread's handler stops the run (if the kernel's signal did not already)
        except OSError:
            pass
        if self._ended.wait(self.grace_s):
            # recorded; give the main thread the rest of the grace period to exit on its own
            time.sleep(min(1.0, self.grace_s))
        elif self.on_orphan is not None:
            try:
                self.on_orphan(self.reason)
            except Exception:  # noqa: BLE001 - exiting matters more than the record
                pass
        os._exit(128 + signal.SIGTERM)


# ---------------------------------------------------------------------------------------------- launcher side
class RunHandle(subprocess.Popen):
    """A launched run: torchrun's :class:`subprocess.Popen`, which can also reach the run's ranks.

    Built by :func:`lab.training.run.launch`; ``.pid``, ``.poll()``, ``.wait()`` and ``.returncode``
    are torchrun's, as before. The run's identity is kept for the records :meth:`kill` writes.

    Attributes
    ----------
    run_id : str
    events_path : pathlib.Path
        The run's event log.
    nproc : int
        Ranks on this machine.
    """

    def __init__(self, args, *, run_id: str, events_path: Path, nproc: int, **popen_kwargs: Any):
        super().__init__(args, **popen_kwargs)
        self.run_id, self.events_path, self.nproc = run_id, Path(events_path), int(nproc)
        self._workers: dict[int, str] = {}  # pid -> start time, every rank process seen

    def worker_pids(self) -> list[int]:
        """Pids of the run's rank processes that are alive: torchrun's children now, and any seen
        before (a rank outlives a dead torchrun only until its :class:`ParentWatch` stops it)."""
        if self.poll() is None:
            for pid in children_of(self.pid):
                start = _start_time(pid)
                if start is not None:
                    self._workers.setdefault(pid, start)
        return [pid for pid, start in sorted(self._workers.items()) if pid_alive(pid, start)]

    def _signal_workers(self, sig: int) -> list[int]:
        pids = self.worker_pids()
        for pid in pids:
            try:
                os.killpg(pid, sig)  # each rank leads its own session and process group
            except ProcessLookupError:
                pass
            except PermissionError:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        return pids

    def terminate(self) -> None:
        """Ask every rank to stop (SIGINT): each records a ``stopped`` status and exits 0, and torchrun
        then ends. Before the ranks exist (torchrun still starting them) torchrun itself gets SIGTERM.
        Returns at once; :meth:`wait` for the end, or use :meth:`stop`."""
        if self.poll() is not None:
            return
        if not self._signal_workers(signal.SIGINT):
            self.send_signal(signal.SIGTERM)

    def kill(self, *, record: bool = True, timeout_s: float = 10.0) -> None:
        """SIGKILL every rank and torchrun, wait (at most ``timeout_s``) until they are gone, then, with
        ``record``, append a ``stopped`` status (``reason``, ``recorded_by``) for every rank whose latest
        status in the event log is not an end (finished, stopped, failed)."""
        self.worker_pids()  # learn the ranks while torchrun can still name them
        if self.poll() is None:
            self.send_signal(signal.SIGKILL)
        self._signal_workers(signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.poll() is None or self.worker_pids()):
            time.sleep(0.05)
        if record:
            self.record_stopped("killed (SIGKILL) through the run's handle")

    def stop(self, grace_s: float = 15.0) -> int:
        """:meth:`terminate`, wait up to ``grace_s`` seconds, then :meth:`kill` what is left; returns
        torchrun's exit code (0 when every rank stopped by itself)."""
        self.terminate()
        try:
            return self.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.wait()

    def record_stopped(self, reason: str) -> list[int]:
        """Append a ``stopped`` ``train.status`` for each rank of this run whose latest status is not an
        end; returns those ranks. Call only once the ranks are gone."""
        from lab.events import EventLog
        from lab.training.monitor import KIND_STATUS, TERMINAL

        if not self.events_path.exists():
            return []
        log = EventLog(self.events_path)
        try:
            latest: dict[int, Any] = {}
            for e in log.tail(0, kinds=[KIND_STATUS], key=self.run_id):
                latest[int(e.payload["rank"])] = e
            done = []
            for rank, e in sorted(latest.items()):
                if e.payload.get("state") in TERMINAL:
                    continue
                log.append(f"rank{rank}", KIND_STATUS, self.run_id, {
                    "rank": rank, "state": "stopped", "step": int(e.payload.get("step") or 0), "pid": e.payload.get("pid"),
                    "host": e.payload.get("host") or socket.gethostname(), "reason": reason,
                    "recorded_by": f"launcher pid {os.getpid()}",
                })
                done.append(rank)
            return done
        finally:
            log.close()
