"""Live view of a federation, folded from the event log (what the live dashboard shows).

:class:`LiveSites` follows the lab's :class:`~lab.events.EventLog` (written by the
continuation service and the skills) and keeps, per site, the time series of its
queue (``site.queue`` samples: pending and running jobs, busy CPUs), whether it is
available, the agent's placement decisions (``placement.decision``) and the job
events as they arrive. It only reads the log, so any number of views (in the
kernel, in a Voila dashboard) can follow one federation. Times are epoch seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from lab.events import Event, EventLog
from lab.hpc.schedulers.base import JobStatus, SiteQueue
from lab.hpc.views import JobRow, default_order, jobs_from_queue

__all__ = ["LiveSites", "SiteSeries", "SiteState"]

JOB_KINDS = ("job.submitted", "job.started", "job.completed", "job.failed", "job.cancelled", "job.timeout")


@dataclass(frozen=True)
class SiteState:
    """What a view should say of a site now (:meth:`LiveSites.state`).

    ``state``: ``"no sample"`` (nothing heard yet), ``"unavailable"`` (the service reported it down),
    ``"stale"`` (no sample for longer than ``stale_after_s``: the service or the site has stopped, e.g.
    after ``testbed.down()``), or ``"live"``. ``age_s``: seconds since the newest sample (None without
    one); ``stale_after_s``: the threshold used.
    """

    state: str
    age_s: float | None
    stale_after_s: float


@dataclass
class SiteSeries:
    """One site's queue samples (parallel lists) and availability."""

    time: list[float] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    busy_cpus: list[int] = field(default_factory=list)
    total_cpus: int | None = None
    available: bool = True
    error: str | None = None
    jobs: list[JobStatus] = field(default_factory=list)  # the active jobs of the newest sample
    every_s: float | None = None  # the writer's poll interval and heartbeat, where its samples say them
    heartbeat_s: float | None = None


class LiveSites:
    """Fold the event log into per-site series, decisions and recent events.

    Parameters
    ----------
    db : path or EventLog
        The federation's database (the continuation service's ``--db``).
    recent : int
        How many recent job/site events to keep for display.
    """

    def __init__(self, db: str | Path | EventLog, *, recent: int = 50):
        self.log = db if isinstance(db, EventLog) else EventLog(db)
        self.cursor = 0
        self.sites: dict[str, SiteSeries] = {}
        self.decisions: list[dict] = []
        self.events: deque[Event] = deque(maxlen=recent)

    def update(self) -> list[Event]:
        """Read the events appended since the last call and fold them in; returns them."""
        new = self.log.tail(self.cursor)
        for event in new:
            self.cursor = event.seq
            self._fold(event)
        return new

    def state(self, name: str, now: float, *, stale_after_s: float | None = None) -> SiteState:
        """Whether site ``name``'s numbers are current at ``now`` (epoch s).

        ``stale_after_s`` defaults to the longest silence the writer allows an unchanged queue: the
        service's ``heartbeat_s`` plus three of its polls (``every_s``), at least 10 s, when its samples
        say so (the continuation service's do); for samples without them, three times the median spacing
        of the site's samples, and at least 10 s. (A queue that does not change is only written every
        ``heartbeat_s``: its age alone says nothing before that.)
        """
        s = self.sites.get(name)
        if s is None or not s.time:
            return SiteState("unavailable" if s is not None and not s.available else "no sample", None, stale_after_s or 10.0)
        if stale_after_s is None and s.heartbeat_s is not None:
            stale_after_s = max(10.0, s.heartbeat_s + 3 * (s.every_s or 1.0))
        if stale_after_s is None:
            gaps = sorted(b - a for a, b in zip(s.time, s.time[1:]))
            stale_after_s = max(10.0, 3 * gaps[len(gaps) // 2]) if gaps else 10.0
        age = now - s.time[-1]
        if not s.available:
            return SiteState("unavailable", age, stale_after_s)
        return SiteState("stale" if age > stale_after_s else "live", age, stale_after_s)

    def jobs(self, now: float, names: list[str] | None = None) -> tuple[list[JobRow], dict[str, str]]:
        """Every active job of the newest sample of each site (``names``, default all), as typed rows.

        Returns ``(rows, stale)``: ``rows`` from :func:`lab.hpc.views.jobs_from_queue`, pending first,
        longest-waiting first; a live site's waits are counted to ``now``, a stale or unavailable one's to
        its newest sample (they are at least that long); ``stale`` maps each such site to a note for the
        table (``"stale: no sample for 58 s"``). A pending Slurm job's start is the backfill's estimate
        (``StartTime`` of the sample's ``squeue -O`` listing), the value ``squeue --start`` prints.
        """
        rows: list[JobRow] = []
        stale: dict[str, str] = {}
        for name in self.sites if names is None else names:
            s = self.sites.get(name)
            if s is None or not s.time:
                continue
            st = self.state(name, now)
            live = st.state == "live"
            if not live:
                stale[name] = "unavailable" if st.state == "unavailable" else f"stale: no sample for {st.age_s:,.0f} s"
            q = SiteQueue(site=name, time=s.time[-1], pending=s.pending[-1], running=s.running[-1], total_cpus=s.total_cpus or 0,
                          idle_cpus=(s.total_cpus or 0) - s.busy_cpus[-1], jobs=s.jobs)
            rows += jobs_from_queue(q, now=now if live else None)
        return sorted(rows, key=default_order), stale

    def _fold(self, event: Event) -> None:
        kind, p = event.kind, event.payload
        if kind == "site.queue":
            s = self.sites.setdefault(event.key, SiteSeries())
            s.time.append(p.get("time", event.time))
            s.pending.append(p["pending"])
            s.running.append(p["running"])
            s.total_cpus = p["total_cpus"]
            s.busy_cpus.append(p["total_cpus"] - p["idle_cpus"])
            s.jobs = [JobStatus.model_validate(j) for j in p.get("jobs", [])]
            s.every_s, s.heartbeat_s = p.get("every_s"), p.get("heartbeat_s")
            s.available, s.error = True, None
        elif kind in ("site.unavailable", "site.available"):
            s = self.sites.setdefault(event.key, SiteSeries())
            s.available = kind == "site.available"
            s.error = p.get("error")
            self.events.append(event)
        elif kind == "placement.decision":
            self.decisions.append({"seq": event.seq, "job": event.key, **p})
        elif kind in JOB_KINDS or kind.startswith("transfer.") or kind.startswith("continuation."):
            self.events.append(event)
