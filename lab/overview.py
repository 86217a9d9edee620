"""What is live in the lab right now: testbed sites, training runs, continuation services.

The JupyterLab side panel (``research_lab_ext``) shows this; it is read here, through the facets'
own readers, never re-implemented: a testbed's sites and daemons through
:class:`~lab.hpc.testbed.Testbed` (its state file and ``status``), a site's queue through its
:class:`~lab.hpc.schedulers.slurm.SlurmScheduler` (``squeue``/``sinfo``), training runs through
:class:`~lab.training.monitor.RunMonitor`, a continuation service's site samples through
:class:`~lab.hpc.live.LiveSites` and its waiting continuations through
:class:`~lab.hpc.continuation.Continuations`.

Nothing registers itself anywhere, so the live things are *found*: :func:`discover` walks a few
folders (the default testbed folder, the Jupyter root, the temp folder: where the dashboards and
notebooks start theirs) to a small depth for testbed state files (``testbed.json``) and SQLite
files that already hold an event log (an ``events`` table, checked read-only, so a foreign
database is never written to). :func:`snapshot` reads each of them.

A training run whose ranks' processes have all gone from this machine (SIGKILL, out of memory)
while their last status still says running is reported ``dead`` at once, without waiting for the
heartbeat timeout: its ranks' status events carry their ``pid`` and ``host``.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Found", "SiteInfo", "RunInfo", "ServiceInfo", "Overview", "default_roots", "discover", "snapshot"]

STATE_FILE = "testbed.json"  # = lab.hpc.testbed.STATE_FILE (checked by the tests)
LOG_SUFFIXES = (".sqlite", ".db", ".sqlite3")
_SKIP = {"node_modules", "__pycache__", "site-packages", ".git", ".venv", "spool", "state"}


@dataclass
class Found:
    """What :func:`discover` found: testbed folders and event-log files (absolute paths)."""

    testbeds: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)


@dataclass
class SiteInfo:
    """One testbed site. ``state``: ``"up"`` (both daemons alive and the controller answers),
    ``"controller down"``, ``"node down"``, ``"down"`` (no daemon), or ``"not answering"`` (alive
    but ``squeue`` failed); ``pending``/``running``: job counts (None when not answering);
    ``total_cpus``/``idle_cpus``: the node's CPUs; ``testbed``: the testbed folder."""

    name: str
    testbed: str
    state: str
    pending: int | None
    running: int | None
    total_cpus: int | None
    idle_cpus: int | None
    error: str | None = None


@dataclass
class RunInfo:
    """One training run of an event log. ``state``: :meth:`RunMonitor.run_state` (``running``,
    ``finished``, ``stopped``, ``failed``, ``dead``, ``unknown``), turned to ``dead`` when every
    rank's process is gone from this host; ``alive``: a rank process of it runs here now
    (None when its ranks ran elsewhere); ``step``: newest step logged; ``steps``: the target;
    ``loss``: the loss at ``step``; ``age_s``: seconds since the newest status of any rank."""

    run_id: str
    log: str
    state: str
    alive: bool | None
    step: int
    steps: int | None
    loss: float | None
    val_loss: float | None
    world_size: int | None
    age_s: float | None


@dataclass
class ServiceInfo:
    """A continuation service's event log: the sites it samples with their live state
    (:meth:`LiveSites.state`: ``live``, ``stale``, ``unavailable``, ``no sample``), ``state``
    (``live`` when any site's samples are current, else ``stale``), ``waiting``: continuations
    still waiting for their event (None when the log has no continuations table), ``age_s``:
    seconds since its newest event."""

    log: str
    state: str
    sites: dict[str, str]
    waiting: int | None
    age_s: float | None


@dataclass
class Overview:
    """Everything :func:`snapshot` read, at ``time`` (epoch s); ``errors``: what could not be read
    (path and reason), so one broken file does not hide the rest."""

    time: float
    sites: list[SiteInfo]
    runs: list[RunInfo]
    services: list[ServiceInfo]
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def default_roots(extra: list[str | Path] | None = None) -> list[Path]:
    """Where to look: ``$LAB_LIVE_ROOTS`` (``os.pathsep``-separated) when set, else the default
    testbed folder (:func:`lab.hpc.testbed.default_dir`) and the temp folder; ``extra`` (e.g. the
    Jupyter root) is added in both cases."""
    from lab.hpc.testbed import default_dir

    env = os.environ.get("LAB_LIVE_ROOTS")
    roots = [Path(p) for p in env.split(os.pathsep) if p] if env else [default_dir(), Path(tempfile.gettempdir())]
    return roots + [Path(p) for p in extra or []]


def _has_event_table(path: Path) -> bool:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return False
    try:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='events'").fetchone() is not None
    except sqlite3.Error:  # not a database, or locked past the timeout
        return False
    finally:
        conn.close()


def discover(roots: list[str | Path], *, max_depth: int = 3) -> Found:
    """Testbed folders (holding ``testbed.json``) and event logs (SQLite files with an ``events``
    table) under ``roots``, at most ``max_depth`` folders below a root; hidden folders,
    ``node_modules``, virtual environments and Slurm's state/spool folders are not entered;
    unreadable folders are skipped. Sorted, without duplicates."""
    found = Found()
    seen: set[Path] = set()

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if depth < max_depth and not e.name.startswith(".") and e.name not in _SKIP:
                        walk(Path(e.path), depth + 1)
                elif e.name == STATE_FILE:
                    found.testbeds.append(folder)
                elif e.name.endswith(LOG_SUFFIXES) and e.is_file() and _has_event_table(Path(e.path)):
                    found.logs.append(Path(e.path))
            except OSError:
                continue

    for root in roots:
        root = Path(root).expanduser().resolve()
        if root in seen or not root.is_dir():
            continue
        seen.add(root)
        walk(root, 0)
    found.testbeds = sorted(set(found.testbeds))
    found.logs = sorted(set(found.logs))
    return found


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (TypeError, ValueError):
        return False
    # a zombie (killed, not yet reaped by its parent) is not alive
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _sites(testbed_dir: Path, errors: list[str]) -> list[SiteInfo]:
    from lab.hpc.testbed import Testbed, TestbedError

    try:
        tb = Testbed(testbed_dir)
        sites, status = tb.sites, tb.status()
    except TestbedError as exc:
        errors.append(str(exc))
        return []
    out = []
    for s in sites:
        alive = status.get(s.name, {})
        ctld, slurmd = alive.get("slurmctld", False), alive.get("slurmd", False)
        info = SiteInfo(s.name, str(testbed_dir), "down", None, None, None, None)
        if ctld:
            try:
                q = s.scheduler(timeout_s=5.0).queue()
                info.pending, info.running, info.total_cpus, info.idle_cpus = q.pending, q.running, q.total_cpus, q.idle_cpus
                info.state = "up" if slurmd else "node down"
            except Exception as exc:  # noqa: BLE001 - a site that does not answer is shown so, never hides the others
                info.state, info.error = "not answering", str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        elif slurmd:
            info.state = "controller down"
        out.append(info)
    return out


def _runs(log: Path, now: float, host: str) -> list[RunInfo]:
    from lab.training.monitor import TERMINAL, RunMonitor

    out = []
    with RunMonitor(log) as mon:
        runs = mon.runs(now=now)
        for row in runs.itertuples(index=False):
            st = mon.status(row.run_id, now=now)
            local = [r for r in st.itertuples() if r.host == host and r.pid is not None]
            alive = any(_pid_alive(r.pid) for r in local) if local else None
            state = row.state
            if state not in TERMINAL and state != "dead" and alive is False and len(local) == len(st):
                state = "dead"
            age = float(st["age_s"].min()) if len(st) else None
            loss = None if row.loss is None or row.loss != row.loss else float(row.loss)
            val = None if row.val_loss is None or row.val_loss != row.val_loss else float(row.val_loss)
            steps = None if row.steps is None or row.steps != row.steps else int(row.steps)
            world = None if row.world_size is None or row.world_size != row.world_size else int(row.world_size)
            out.append(RunInfo(row.run_id, str(log), state, alive, int(row.last_step), steps, loss, val, world, age))
    return out


def _service(log: Path, now: float) -> ServiceInfo | None:
    from lab.events import EventLog
    from lab.hpc.live import LiveSites

    with EventLog(log) as events:
        if not events.tail(0, kinds=["site.queue", "site.available", "site.unavailable"], limit=1):
            return None
        live = LiveSites(events)
        live.update()
        states = {name: live.state(name, now).state for name in live.sites}
        newest = events.tail(max(0, events.last_seq() - 1))
        age = now - newest[-1].time if newest else None
        has_table = events._conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='continuations'").fetchone()
    waiting = None
    if has_table:
        from lab.hpc.continuation import Continuations

        cont = Continuations(log)
        try:
            waiting = len(cont.waiting())
        finally:
            cont.close()
    return ServiceInfo(str(log), "live" if "live" in states.values() else "stale", states, waiting, age)


def snapshot(roots: list[str | Path] | None = None, *, max_depth: int = 3, now: float | None = None) -> Overview:
    """Read every live thing under ``roots`` (default :func:`default_roots`).

    Returns an :class:`Overview`; a testbed or log that cannot be read is named in ``errors``
    (``"path: reason"``) and the rest is still read. ``now`` (epoch s, default the clock) is when
    heartbeat ages are judged. Only reads: every file is opened by its facet's reader, and a
    SQLite file is opened only when it already holds an event log.
    """
    now = time.time() if now is None else float(now)
    found = discover(default_roots() if roots is None else roots, max_depth=max_depth)
    host = socket.gethostname()
    ov = Overview(now, [], [], [])
    for tb in found.testbeds:
        ov.sites += _sites(tb, ov.errors)
    for log in found.logs:
        try:
            ov.runs += _runs(log, now, host)
            service = _service(log, now)
            if service is not None:
                ov.services.append(service)
        except Exception as exc:  # noqa: BLE001 - one unreadable log is reported, not fatal to the view
            ov.errors.append(f"{log}: {type(exc).__name__}: {exc}")
    return ov
