"""Typed skills for driving a federation of HPC sites (Diamond Agent's five skills, plus status).

Each skill is a function ``skill(federation, input) -> output`` whose input and
output are pydantic models, so an agent (or the MCP server in
:mod:`lab.hpc.mcp_server`) sees an exact schema:

=====================  ===========================================================
``discover_resources``  every site's partitions, limits and live queue (unavailable sites say why)
``specify_resources``   a site-independent request -> that site's checked spec and batch script
``choose_site``         the placement policy's choice, with what every site showed (logged)
``move_data``           copy input to a site's data endpoint (sha256-verified, resumable)
``submit_task``         check, place (or use the given site), submit; optionally register a continuation
``get_status``          one job's state
``retrieve_results``    a finished job's exit code and output
=====================  ===========================================================

A request a site does not allow is refused before anything is submitted
(:class:`~lab.hpc.errors.PolicyViolation`, naming the limit). Submissions with an
``idempotency_key`` (continuations use their id) are made at most once.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lab.hpc.continuation import DECISION_EVENTS, Continuations, _resolve, job_key, transfer_event, transfer_key
from lab.hpc.errors import HPCError, SchedulerError
from lab.hpc.placement import PlacementDecision, PolicyName, place
from lab.hpc.schedulers.base import JobSpec, JobState, JobStatus, Scheduler
from lab.hpc.sites import DataEndpoint, Partition, Site, load_sites
from lab.hpc.transfer import LocalTransfer, TransferBackend, TransferRequest, TransferStatus

__all__ = [
    "Federation",
    "ResourceRequest",
    "DiscoverResourcesInput",
    "DiscoverResourcesOutput",
    "SiteResources",
    "SpecifyResourcesInput",
    "SpecifyResourcesOutput",
    "MoveDataInput",
    "ChooseSiteInput",
    "SubmitTaskInput",
    "SubmitTaskOutput",
    "ContinuationSpec",
    "GetStatusInput",
    "RetrieveResultsInput",
    "RetrieveResultsOutput",
    "discover_resources",
    "specify_resources",
    "move_data",
    "choose_site",
    "submit_task",
    "get_status",
    "retrieve_results",
]


class Federation:
    """The sites an agent drives, with their connected schedulers, a transfer backend and the
    continuation database.

    Parameters
    ----------
    sites : dict of name to Site
    db : path
        SQLite file shared with the continuation service (events, continuations, submissions).
    workdir : path
        Where batch scripts write their output (``workdir/<site>/<name>-<job id>.out``).
    transfer : TransferBackend, optional
        Default :class:`~lab.hpc.transfer.LocalTransfer`.
    schedulers : dict of name to Scheduler, optional
        Already-connected adapters (default: ``site.connect()`` on first use).
    """

    def __init__(
        self,
        sites: dict[str, Site],
        *,
        db: str | Path,
        workdir: str | Path,
        transfer: TransferBackend | None = None,
        schedulers: dict[str, Scheduler] | None = None,
    ):
        self.sites = dict(sites)
        self.workdir = Path(workdir)
        self.transfer = transfer or LocalTransfer()
        self._schedulers = dict(schedulers or {})
        self.continuations = Continuations(db)
        self._conn = self.continuations._store.conn
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS submissions (key TEXT PRIMARY KEY, site TEXT NOT NULL, job_id TEXT NOT NULL, created REAL NOT NULL)"
        )

    @classmethod
    def from_folder(cls, folder: str | Path, *, db: str | Path, workdir: str | Path, **kwargs) -> Federation:
        """Load every ``*.toml`` site in ``folder`` (:func:`lab.hpc.sites.load_sites`)."""
        return cls(load_sites(folder), db=db, workdir=workdir, **kwargs)

    def site(self, name: str) -> Site:
        try:
            return self.sites[name]
        except KeyError:
            raise HPCError(f"no site named {name!r}; the federation has {sorted(self.sites)}") from None

    def scheduler(self, name: str) -> Scheduler:
        site = self.site(name)
        if name not in self._schedulers:
            self._schedulers[name] = site.connect(workdir=self.workdir / name)
        return self._schedulers[name]

    @property
    def schedulers(self) -> dict[str, Scheduler]:
        return {name: self.scheduler(name) for name in self.sites}

    def close(self) -> None:
        for sched in self._schedulers.values():
            close = getattr(sched, "close", None)
            if close is not None:
                close()
        self.continuations.close()


class ResourceRequest(BaseModel):
    """A site-independent request: what to run and what it needs (seconds, nodes, processes, cores)."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="shell commands the job runs")
    name: str = Field("lab-job", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    nodes: int = Field(1, ge=1)
    ntasks: int = Field(1, ge=1)
    cpus_per_task: int = Field(1, ge=1)
    walltime_s: int = Field(60, ge=1, description="walltime limit, seconds")
    partition: str | None = None
    account: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    modules: list[str] = Field(default_factory=list)

    def spec(self, stdout: str | None = None, workdir: Path | None = None) -> JobSpec:
        return JobSpec(**self.model_dump(), stdout=stdout, workdir=workdir)


class DiscoverResourcesInput(BaseModel):
    sites: list[str] | None = Field(None, description="site names (default: all)")


class SiteResources(BaseModel):
    name: str
    scheduler: str
    available: bool
    error: str | None = None
    partitions: list[Partition]
    data: DataEndpoint
    pending: int | None = None
    running: int | None = None
    idle_cpus: int | None = None
    total_cpus: int | None = None


class DiscoverResourcesOutput(BaseModel):
    time: float
    sites: list[SiteResources]


class SpecifyResourcesInput(BaseModel):
    site: str
    request: ResourceRequest


class SpecifyResourcesOutput(BaseModel):
    site: str
    spec: JobSpec
    script: str


class MoveDataInput(BaseModel):
    source_endpoint: str = Field(description="local directory (or Globus collection id) holding the data")
    source_path: str
    site: str
    destination_path: str = Field(description="path under the site's data endpoint")
    wait_s: float = Field(600.0, ge=0, description="seconds to wait for completion (0: return at once)")


class ChooseSiteInput(BaseModel):
    request: ResourceRequest
    policy: PolicyName = "earliest_completion"
    home: str | None = Field(None, description="the site fixed_site always picks")
    input_bytes: int = Field(0, ge=0, description="bytes of input to move to the chosen site")


class ContinuationSpec(BaseModel):
    """A continuation for the submitted job. A handler with a ``stdout`` parameter also receives
    the job's output file (unless ``args`` sets it)."""

    handler: str = Field(description="'package.module:function' called as handler(event, continuation, **args)")
    on: list[str] = Field(default_factory=lambda: list(DECISION_EVENTS))
    args: dict[str, Any] = Field(default_factory=dict)


class SubmitTaskInput(BaseModel):
    request: ResourceRequest
    site: str | None = Field(None, description="submit here; None: choose with the placement policy")
    policy: PolicyName = "earliest_completion"
    home: str | None = Field(None, description="the site fixed_site always picks")
    input_bytes: int = Field(0, ge=0, description="bytes of input to move to the chosen site (for placement)")
    continuation: ContinuationSpec | None = None
    idempotency_key: str | None = Field(None, description="a second submission with this key returns the first job")


class SubmitTaskOutput(BaseModel):
    site: str
    job_id: str
    script: str
    stdout: str
    decision: PlacementDecision | None = None
    continuation_id: int | None = None
    duplicate: bool = False


class GetStatusInput(BaseModel):
    site: str
    job_id: str


class RetrieveResultsInput(BaseModel):
    site: str
    job_id: str
    name: str = Field("lab-job", description="the job's name, part of its output file name")
    max_bytes: int = Field(65536, ge=0)


class RetrieveResultsOutput(BaseModel):
    site: str
    job_id: str
    state: JobState
    exit_code: int | None
    stdout_path: str
    stdout: str | None = Field(None, description="the end of the output file (None if there is none)")


def discover_resources(fed: Federation, inp: DiscoverResourcesInput | None = None) -> DiscoverResourcesOutput:
    """Every (or the named) site's limits and live queue; a site that does not answer is marked unavailable."""
    names = (inp.sites if inp and inp.sites else None) or list(fed.sites)
    out = []
    for name in names:
        site = fed.site(name)
        res = SiteResources(name=name, scheduler=site.scheduler, available=False, partitions=site.partitions, data=site.data)
        try:
            q = fed.scheduler(name).queue()
        except SchedulerError as exc:
            res.error = str(exc)
        else:
            res.available = True
            res.pending, res.running, res.idle_cpus, res.total_cpus = q.pending, q.running, q.idle_cpus, q.total_cpus
        out.append(res)
    return DiscoverResourcesOutput(time=time.time(), sites=out)


def _stdout(fed: Federation, site: str, name: str, job_id: str = "%j") -> Path:
    return fed.workdir / site / f"{name}-{job_id}.out"


def specify_resources(fed: Federation, inp: SpecifyResourcesInput) -> SpecifyResourcesOutput:
    """Translate a request into the site's checked spec and batch script (nothing is submitted).

    Raises :class:`~lab.hpc.errors.PolicyViolation` naming the limit the request breaks.
    """
    site = fed.site(inp.site)
    workdir = fed.workdir / inp.site
    spec = site.check(inp.request.spec(stdout=str(_stdout(fed, inp.site, inp.request.name)), workdir=workdir))
    return SpecifyResourcesOutput(site=inp.site, spec=spec, script=fed.scheduler(inp.site).render_script(spec))


def choose_site(fed: Federation, inp: ChooseSiteInput) -> PlacementDecision:
    """Where the placement policy would run ``request`` now (moving ``input_bytes`` there first).

    The decision, with every site's live state and estimates, is appended to the event log
    (``placement.decision``) for dashboards and audit. Raises
    :class:`~lab.hpc.placement.PlacementError` when no site can take the job.
    """
    transfer_s = {n: fed.transfer.estimate_s(inp.input_bytes) if inp.input_bytes else 0.0 for n in fed.sites}
    decision = place(inp.request.spec(), fed.sites, fed.schedulers, inp.policy, home=inp.home, transfer_s=transfer_s)
    fed.continuations.log.append("agent", "placement.decision", f"decision/{inp.request.name}", decision.model_dump(mode="json"))
    return decision


def move_data(fed: Federation, inp: MoveDataInput) -> TransferStatus:
    """Copy ``source_path`` to ``destination_path`` under the site's data endpoint, verified by sha256.

    Waits up to ``wait_s`` seconds; the task is also watched by the continuation service, and its
    end becomes a ``transfer.succeeded`` / ``transfer.failed`` event with key ``transfer/<task id>``
    (register a continuation on that key to resume when the data is there).

    Raises :class:`~lab.hpc.errors.TransferError` for a missing source or a bad endpoint.
    """
    site = fed.site(inp.site)
    dest = site.data.collection_id if site.data.kind == "globus" else site.data.path
    request = TransferRequest(
        source_endpoint=inp.source_endpoint,
        destination_endpoint=dest,
        items=[(inp.source_path, inp.destination_path)],
        label=f"to {inp.site}",
    )
    task = fed.transfer.submit(request)
    fed.continuations.watch_transfer(inp.site, task)  # the service reports its end (a continuation may wait on it)
    status = fed.transfer.status(task) if inp.wait_s == 0 else fed.transfer.wait(task, timeout_s=inp.wait_s, poll_s=0.05)
    kind = transfer_event(status)
    if kind:  # seen here first: record it now (the service's report of the same end is deduplicated)
        key = transfer_key(task)
        fed.continuations.log.append(inp.site, kind, key, status.model_dump(mode="json"), dedupe=f"{key}/{kind}")
    return status


def submit_task(fed: Federation, inp: SubmitTaskInput) -> SubmitTaskOutput:
    """Check the request against the chosen site, submit it, and watch it for continuations.

    With ``site=None`` the placement policy chooses among all sites (the decision, with
    the inputs it saw, comes back in ``decision``).

    Raises
    ------
    PolicyViolation
        The given site does not allow the request (nothing is submitted).
    PlacementError
        No site can take it.
    SchedulerError
        The site's submission command failed.
    """
    if inp.idempotency_key is not None:
        row = fed._conn.execute("SELECT site, job_id FROM submissions WHERE key = ?", (inp.idempotency_key,)).fetchone()
        if row is not None:
            stdout = _stdout(fed, row[0], inp.request.name, row[1])
            return SubmitTaskOutput(site=row[0], job_id=row[1], script="", stdout=str(stdout), duplicate=True)
    decision = None
    name = inp.site
    if name is None:
        decision = choose_site(fed, ChooseSiteInput(request=inp.request, policy=inp.policy, home=inp.home, input_bytes=inp.input_bytes))
        name = decision.chosen
    site = fed.site(name)
    workdir = fed.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    spec = site.check(inp.request.spec(stdout=str(_stdout(fed, name, inp.request.name)), workdir=workdir))
    sched = fed.scheduler(name)
    script = sched.render_script(spec)
    job_id = sched.submit(spec)
    if inp.idempotency_key is not None:
        fed._conn.execute("INSERT OR IGNORE INTO submissions(key, site, job_id, created) VALUES (?, ?, ?, ?)", (inp.idempotency_key, name, job_id, time.time()))
    fed.continuations.watch_job(name, job_id)
    submitted = {"site": name, "job_id": job_id, "name": inp.request.name, "walltime_s": inp.request.walltime_s}
    fed.continuations.log.append(name, "job.submitted", job_key(name, job_id), submitted)
    stdout = str(_stdout(fed, name, inp.request.name, job_id))
    cid = None
    if inp.continuation is not None:
        c = inp.continuation
        args = dict(c.args)
        if "stdout" in inspect.signature(_resolve(c.handler)).parameters:
            args.setdefault("stdout", stdout)  # the job's output file, known only now
        cid = fed.continuations.register(job_key(name, job_id), c.handler, on=tuple(c.on), args=args)
    return SubmitTaskOutput(site=name, job_id=job_id, script=script, stdout=stdout, decision=decision, continuation_id=cid)


def get_status(fed: Federation, inp: GetStatusInput) -> JobStatus:
    """One job's state as its site reports it."""
    return fed.scheduler(inp.site).status([inp.job_id])[inp.job_id]


def retrieve_results(fed: Federation, inp: RetrieveResultsInput) -> RetrieveResultsOutput:
    """A job's state, exit code and the last ``max_bytes`` of its output file."""
    st = get_status(fed, GetStatusInput(site=inp.site, job_id=inp.job_id))
    path = _stdout(fed, inp.site, inp.name, inp.job_id)
    text = None
    if path.is_file():
        with path.open("rb") as fh:
            size = path.stat().st_size
            fh.seek(max(0, size - inp.max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    return RetrieveResultsOutput(site=inp.site, job_id=inp.job_id, state=st.state, exit_code=st.exit_code, stdout_path=str(path), stdout=text)
