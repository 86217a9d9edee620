"""Typed skills for driving a federation of HPC sites (Diamond Agent's five skills, plus status).

Each skill is a function ``skill(federation, input) -> output`` whose input and
output are pydantic models, so an agent (or the MCP server in
:mod:`lab.hpc.mcp_server`) sees an exact schema:

=====================  ===========================================================
``discover_resources``  every site's partitions, limits and live queue (unavailable sites say why)
``specify_resources``   a site-independent request -> that site's checked spec and batch script
``choose_site``         the placement policy's choice, with what every site showed (logged)
``move_data``           copy data between the federation's data endpoints (sha256-verified, resumable)
``submit_task``         check, place (or use the given site), submit; optionally register a continuation
``get_status``          one job's state (a job this federation submitted)
``retrieve_results``    a finished job's exit code and output (a job this federation submitted)
=====================  ===========================================================

A request a site does not allow is refused before anything is submitted
(:class:`~lab.hpc.errors.PolicyViolation`, naming the limit). Submissions with an
``idempotency_key`` (continuations use their id) are made at most once.

What an agent can reach
-----------------------
The skills are the boundary between an agent and the host, so every argument is
bounded and checked before anything happens:

* every string has a maximum length, and every name a pattern (site, job id, partition,
  account, module, environment variable); fields rendered into a batch script's
  directives (``#SBATCH --account=...``) cannot carry a newline or control character;
* data endpoints are *names*: a site's name (its ``[data]`` endpoint) or an endpoint the
  federation's operator configured (``Federation(endpoints=...)``); a host path is refused;
* every path argument is relative, has no ``..`` component, and, resolved (symbolic links
  followed), stays under its endpoint;
* a job's status and output are readable only for the site the federation submitted it to,
  and only under the federation's ``workdir/<site>``;
* a continuation's handler must come from a module the federation allows
  (``Federation(handler_modules=...)``).

A refused argument raises :class:`~lab.hpc.errors.SkillArgumentError` naming the field
(or pydantic's ``ValidationError``, which names it too, when the model itself refuses it).
"""

from __future__ import annotations

import inspect
import json
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from lab.hpc.continuation import DECISION_EVENTS, ContinuationError, Continuations, job_key, resolve_handler, transfer_event, transfer_key
from lab.hpc.errors import SchedulerError, SkillArgumentError, clip_text
from lab.hpc.placement import PlacementDecision, PolicyName, place
from lab.hpc.schedulers.base import JobSpec, JobState, JobStatus, Scheduler
from lab.hpc.sites import DataEndpoint, Partition, Site, load_sites
from lab.hpc.transfer import LocalTransfer, TransferBackend, TransferRequest, TransferStatus

__all__ = [
    "Federation",
    "Endpoint",
    "LIMITS",
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

#: The bounds every skill argument is held to (characters, items, bytes, seconds).
LIMITS = {
    "name": 64,  # site, endpoint, job, partition, account, module names
    "job_id": 32,
    "path": 1024,
    "command": 65536,
    "env_value": 4096,
    "env_entries": 64,
    "modules": 32,
    "sites": 64,
    "idempotency_key": 128,
    "handler": 200,
    "continuation_args_bytes": 16384,
    "wait_s": 3600,
    "max_bytes": 1 << 20,
}

_SITE_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]{0,39}$"  # as lab.hpc.sites.Site.name
_TOKEN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"  # partition, account: safe in a #SBATCH line
_MODULE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+\-/]{0,127}$"
_ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_JOB_ID_PATTERN = r"^[0-9]{1,20}(_[0-9]{1,10})?$"  # Slurm's (array) ids; the local scheduler's integers
_HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # C0 controls but tab and newline, and DEL
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: The event kinds a continuation may wait for.
ContinuationEvent = Literal["job.started", "job.completed", "job.failed", "job.cancelled", "job.timeout", "transfer.succeeded", "transfer.failed"]


def _no_control(value: str) -> str:
    if m := _CONTROL.search(value):
        raise ValueError(f"control character {m.group()!r} at position {m.start()}")
    return value


def _one_line(value: str) -> str:
    if m := _CONTROL_OR_NEWLINE.search(value):
        raise ValueError(f"newline or control character {m.group()!r} at position {m.start()}")
    return value


def _relative_path(value: str) -> str:
    """A path inside an endpoint: relative, no '..', no control characters (resolution is checked later)."""
    _one_line(value)
    if value.startswith(("/", "\\", "~")):
        raise ValueError("must be relative to its endpoint (no leading '/', '\\' or '~')")
    parts = [p for p in re.split(r"[/\\]", value)]
    if ".." in parts:
        raise ValueError("must not contain a '..' component")
    return value


SiteName = Annotated[str, Field(max_length=40, pattern=_SITE_PATTERN, description="a site of the federation, by name")]
JobId = Annotated[str, Field(min_length=1, max_length=LIMITS["job_id"], pattern=_JOB_ID_PATTERN, description="the scheduler's job id, as submit_task returned it")]
RelativePath = Annotated[
    str,
    Field(min_length=1, max_length=LIMITS["path"], description="a path relative to its endpoint; no '..', no leading '/'"),
    AfterValidator(_relative_path),
]
EnvName = Annotated[str, Field(max_length=128, pattern=_ENV_NAME_PATTERN)]
EnvValue = Annotated[str, Field(max_length=LIMITS["env_value"]), AfterValidator(_one_line)]
ModuleName = Annotated[str, Field(max_length=128, pattern=_MODULE_PATTERN)]


@dataclass(frozen=True)
class Endpoint:
    """A data endpoint of the federation: what :func:`move_data` may read from or write to.

    ``endpoint`` is what the transfer backend is given (a local directory, or a Globus collection
    id); ``root`` the folder (local) or the collection path (Globus) every path stays under.
    """

    name: str
    kind: Literal["local", "globus"]
    endpoint: str
    root: str

    def resolve(self, skill: str, field: str, rel: str) -> str:
        """The item path for ``rel`` under this endpoint (what the backend is given).

        Local endpoints: ``rel`` is resolved on disk (symbolic links followed) and must stay
        under the resolved root. Raises :class:`SkillArgumentError` naming ``field``.
        """
        _check(skill, field, _relative_path, rel)
        if self.kind == "globus":
            return posixpath.join(self.root, posixpath.normpath(rel))
        root = Path(self.root).resolve()
        full = (root / rel).resolve()
        if not full.is_relative_to(root):
            raise SkillArgumentError(skill, field, f"{clip_text(rel)!r} resolves to {clip_text(str(full))}, outside endpoint {self.name!r}")
        return str(full.relative_to(root)) if full != root else "."


def _check(skill: str, field: str, fn, value):
    try:
        return fn(value)
    except ValueError as exc:
        raise SkillArgumentError(skill, field, str(exc)) from None


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
    endpoints : dict of name to local directory, optional
        Data endpoints besides the sites' own (e.g. ``{"inputs": "/home/me/inputs"}``, where a
        user stages input): :func:`move_data` reads and writes only the sites' data endpoints
        (by site name) and these. A name may not be a site's.
    handler_modules : sequence of str, optional
        Modules (or packages) whose functions may be continuation handlers
        (``["lab.hpc.handlers"]``); None: any importable module (trusted callers only; the MCP
        server always passes a list).

    Raises
    ------
    SkillArgumentError
        An endpoint name is not a valid name or is a site's name.
    """

    def __init__(
        self,
        sites: dict[str, Site],
        *,
        db: str | Path,
        workdir: str | Path,
        transfer: TransferBackend | None = None,
        schedulers: dict[str, Scheduler] | None = None,
        endpoints: Mapping[str, str | Path] | None = None,
        handler_modules: Sequence[str] | None = None,
    ):
        self.sites = dict(sites)
        self.workdir = Path(workdir).expanduser().resolve()
        self.transfer = transfer or LocalTransfer()
        self._schedulers = dict(schedulers or {})
        self.endpoints: dict[str, Path] = {}
        for name, path in (endpoints or {}).items():
            if not re.fullmatch(_SITE_PATTERN, name):
                raise SkillArgumentError("Federation", "endpoints", f"endpoint name {clip_text(name)!r} does not match {_SITE_PATTERN}")
            if name in self.sites:
                raise SkillArgumentError("Federation", "endpoints", f"endpoint name {name!r} is a site's name")
            self.endpoints[name] = Path(path).expanduser().resolve()
        self.handler_modules = None if handler_modules is None else tuple(handler_modules)
        self.continuations = Continuations(db)

    @classmethod
    def from_folder(cls, folder: str | Path, *, db: str | Path, workdir: str | Path, **kwargs) -> Federation:
        """Load every ``*.toml`` site in ``folder`` (:func:`lab.hpc.sites.load_sites`)."""
        return cls(load_sites(folder), db=db, workdir=workdir, **kwargs)

    def site(self, name: str, *, skill: str = "federation", field: str = "site") -> Site:
        """The named site. Raises :class:`SkillArgumentError` naming ``field`` for a name the federation lacks."""
        try:
            return self.sites[name]
        except (KeyError, TypeError):
            raise SkillArgumentError(skill, field, f"no site named {clip_text(name)!r}; the federation has {sorted(self.sites)}") from None

    def endpoint(self, name: str, *, skill: str = "move_data", field: str = "source_endpoint") -> Endpoint:
        """A data endpoint by name: a site's ``[data]`` endpoint, or one of ``endpoints``.

        Raises :class:`SkillArgumentError` naming ``field`` for anything else (a host path included).
        """
        if name in self.sites:
            data = self.sites[name].data
            if data.kind == "globus":
                return Endpoint(name, "globus", str(data.collection_id), data.path if data.path != "." else "/")
            return Endpoint(name, "local", str(Path(data.path).expanduser().resolve()), str(Path(data.path).expanduser().resolve()))
        if name in self.endpoints:
            root = str(self.endpoints[name])
            return Endpoint(name, "local", root, root)
        known = sorted([*self.sites, *self.endpoints])
        what = "a host path is not an endpoint" if "/" in str(name) or "\\" in str(name) else "no such endpoint"
        raise SkillArgumentError(skill, field, f"{clip_text(name)!r}: {what}; the federation's data endpoints are {known}")

    def submitted(self, site: str, job_id: str) -> dict[str, Any] | None:
        """The ``job.submitted`` record of a job this federation submitted to ``site`` (None if it did not)."""
        events = self.continuations.log.tail(kinds=["job.submitted"], key=job_key(site, job_id), limit=1)
        return events[0].payload if events else None

    def check_handler(self, handler: str, *, skill: str = "submit_task", field: str = "continuation.handler") -> None:
        """Refuse a continuation handler outside ``handler_modules`` (:class:`SkillArgumentError`)."""
        if self.handler_modules is None:
            return
        module = handler.partition(":")[0]
        if not any(module == m or module.startswith(m + ".") for m in self.handler_modules):
            raise SkillArgumentError(skill, field, f"handler {handler!r} is not in an allowed module; allowed: {list(self.handler_modules)}")

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
    """A site-independent request: what to run and what it needs (seconds, nodes, processes, cores).

    Every string is bounded (:data:`LIMITS`); ``partition`` and ``account`` are plain tokens
    (letters, digits, ``_ . -``), so they cannot break the ``#SBATCH`` line they are rendered into.
    """

    model_config = ConfigDict(extra="forbid")

    command: Annotated[str, AfterValidator(_no_control)] = Field(
        min_length=1, max_length=LIMITS["command"], description="shell commands the job runs (the batch script's body)"
    )
    name: str = Field("lab-job", max_length=64, pattern=r"^[A-Za-z0-9_.\-]{1,64}$", description="job name; part of its output file's name")
    nodes: int = Field(1, ge=1, le=100_000, description="whole nodes")
    ntasks: int = Field(1, ge=1, le=10_000_000, description="processes")
    cpus_per_task: int = Field(1, ge=1, le=4096, description="cores per process")
    walltime_s: int = Field(60, ge=1, le=366 * 86400, description="walltime limit, seconds")
    partition: str | None = Field(None, max_length=64, pattern=_TOKEN_PATTERN, description="partition (queue); None: the site's default")
    account: str | None = Field(None, max_length=64, pattern=_TOKEN_PATTERN, description="allocation account charged; some sites require one")
    environment: dict[EnvName, EnvValue] = Field(
        default_factory=dict, max_length=LIMITS["env_entries"], description="variables exported in the batch script"
    )
    modules: list[ModuleName] = Field(default_factory=list, max_length=LIMITS["modules"], description="environment modules loaded first")

    def spec(self, stdout: str | None = None, workdir: Path | None = None) -> JobSpec:
        return JobSpec(**self.model_dump(), stdout=stdout, workdir=workdir)


class DiscoverResourcesInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sites: list[SiteName] | None = Field(None, max_length=LIMITS["sites"], description="site names (default: all)")


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
    model_config = ConfigDict(extra="forbid")

    site: SiteName
    request: ResourceRequest = Field(description="what to run and what it needs")


class SpecifyResourcesOutput(BaseModel):
    site: str
    spec: JobSpec
    script: str


class MoveDataInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source_endpoint: str = Field(
        max_length=40,
        pattern=_SITE_PATTERN,
        description="the data endpoint holding the data, by name: a site (its [data] endpoint) or an endpoint the federation configures; never a host path",
    )
    source_path: RelativePath
    site: SiteName = Field(description="the site whose data endpoint receives the data")
    destination_path: RelativePath
    wait_s: float = Field(600.0, ge=0, le=LIMITS["wait_s"], description="seconds to wait for completion (0: return at once)")


def _needs_home(model):
    if model.policy == "fixed_site" and model.home is None and getattr(model, "site", None) is None:
        raise ValueError("home: policy 'fixed_site' needs home, the site it always picks")
    return model


class ChooseSiteInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request: ResourceRequest = Field(description="what to run and what it needs")
    policy: PolicyName = Field("earliest_completion", description="fixed_site: always home; least_pending: fewest pending jobs; earliest_completion: earliest predicted end")
    home: SiteName | None = Field(None, description="the site fixed_site always picks (required with fixed_site)")
    input_bytes: int = Field(0, ge=0, le=10**15, description="bytes of input to move to the chosen site")

    _home = model_validator(mode="after")(_needs_home)


class ContinuationSpec(BaseModel):
    """A continuation for the submitted job. A handler with a ``stdout`` parameter also receives
    the job's output file (``args`` may not set it)."""

    model_config = ConfigDict(extra="forbid")

    handler: str = Field(
        max_length=LIMITS["handler"],
        pattern=_HANDLER_PATTERN,
        description="'package.module:function' called as handler(event, continuation, **args); e.g. 'lab.hpc.handlers:collect_output'",
    )
    on: list[ContinuationEvent] = Field(default_factory=lambda: list(DECISION_EVENTS), min_length=1, max_length=7, description="the event kinds that resume it")
    args: dict[Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Any] = Field(
        default_factory=dict, max_length=32, description=f"keyword arguments for the handler (JSON, at most {LIMITS['continuation_args_bytes']} bytes)"
    )

    @model_validator(mode="after")
    def _args_bounded(self):
        if "stdout" in self.args:
            raise ValueError("args.stdout: set by submit_task to the job's own output file")
        try:
            size = len(json.dumps(self.args))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"args: not JSON ({exc})") from None
        if size > LIMITS["continuation_args_bytes"]:
            raise ValueError(f"args: {size} bytes of JSON, at most {LIMITS['continuation_args_bytes']}")
        return self


class SubmitTaskInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request: ResourceRequest = Field(description="what to run and what it needs")
    site: SiteName | None = Field(None, description="submit here; None: choose with the placement policy")
    policy: PolicyName = Field("earliest_completion", description="used when site is None: fixed_site, least_pending or earliest_completion")
    home: SiteName | None = Field(None, description="the site fixed_site always picks (required with fixed_site when site is None)")
    input_bytes: int = Field(0, ge=0, le=10**15, description="bytes of input to move to the chosen site (for placement)")
    continuation: ContinuationSpec | None = Field(None, description="run a handler when the job ends (event-driven; the agent does not wait)")
    idempotency_key: Annotated[str, AfterValidator(_one_line)] | None = Field(
        None, min_length=1, max_length=LIMITS["idempotency_key"], description="a second submission with this key returns the first job"
    )

    _home = model_validator(mode="after")(_needs_home)


class SubmitTaskOutput(BaseModel):
    site: str
    job_id: str
    script: str
    stdout: str
    decision: PlacementDecision | None = None
    continuation_id: int | None = None
    duplicate: bool = False


class GetStatusInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    site: SiteName
    job_id: JobId


class RetrieveResultsInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    site: SiteName
    job_id: JobId
    name: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.\-]{1,64}$", description="the job's name (default: the name it was submitted with; any other is refused)"
    )
    max_bytes: int = Field(65536, ge=0, le=LIMITS["max_bytes"], description="bytes from the end of the output file")


class RetrieveResultsOutput(BaseModel):
    site: str
    job_id: str
    state: JobState
    exit_code: int | None
    stdout_path: str
    stdout: str | None = Field(None, description="the end of the output file (None if there is none)")


def discover_resources(fed: Federation, inp: DiscoverResourcesInput | None = None) -> DiscoverResourcesOutput:
    """Every (or the named) site's limits and live queue; a site that does not answer is marked unavailable.

    Raises :class:`SkillArgumentError` (field ``sites``) for a name the federation lacks.
    """
    names = (inp.sites if inp and inp.sites else None) or list(fed.sites)
    out = []
    for name in names:
        site = fed.site(name, skill="discover_resources", field="sites")
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

    Raises :class:`~lab.hpc.errors.PolicyViolation` naming the limit the request breaks, and
    :class:`SkillArgumentError` (field ``site``) for a site the federation lacks.
    """
    site = fed.site(inp.site, skill="specify_resources")
    workdir = fed.workdir / inp.site
    spec = site.check(inp.request.spec(stdout=str(_stdout(fed, inp.site, inp.request.name)), workdir=workdir))
    return SpecifyResourcesOutput(site=inp.site, spec=spec, script=fed.scheduler(inp.site).render_script(spec))


def _check_home(fed: Federation, skill: str, policy: str, home: str | None) -> None:
    if home is not None:
        fed.site(home, skill=skill, field="home")
    elif policy == "fixed_site":
        raise SkillArgumentError(skill, "home", "policy 'fixed_site' needs home, the site it always picks")


def choose_site(fed: Federation, inp: ChooseSiteInput) -> PlacementDecision:
    """Where the placement policy would run ``request`` now (moving ``input_bytes`` there first).

    The decision, with every site's live state and estimates, is appended to the event log
    (``placement.decision``) for dashboards and audit.

    Raises
    ------
    PlacementError
        No site can take the job.
    SkillArgumentError
        ``home`` is not a site (or missing with ``fixed_site``).
    """
    _check_home(fed, "choose_site", inp.policy, inp.home)
    transfer_s = {n: fed.transfer.estimate_s(inp.input_bytes) if inp.input_bytes else 0.0 for n in fed.sites}
    decision = place(inp.request.spec(), fed.sites, fed.schedulers, inp.policy, home=inp.home, transfer_s=transfer_s)
    fed.continuations.log.append("agent", "placement.decision", f"decision/{inp.request.name}", decision.model_dump(mode="json"))
    return decision


def move_data(fed: Federation, inp: MoveDataInput) -> TransferStatus:
    """Copy ``source_path`` on ``source_endpoint`` to ``destination_path`` under the site's data
    endpoint, verified by sha256.

    Both endpoints are the federation's (:meth:`Federation.endpoint`); both paths must stay under
    their endpoint once resolved. Waits up to ``wait_s`` seconds; the task is also watched by the
    continuation service, and its end becomes a ``transfer.succeeded`` / ``transfer.failed`` event
    with key ``transfer/<task id>`` (register a continuation on that key to resume when the data is there).

    Raises
    ------
    SkillArgumentError
        An endpoint that is not the federation's (a host path), a path that leaves its endpoint,
        or a site the federation lacks; the field is named.
    TransferError
        A missing source or an endpoint that is not a directory.
    """
    source = fed.endpoint(inp.source_endpoint, skill="move_data", field="source_endpoint")
    fed.site(inp.site, skill="move_data", field="site")
    dest = fed.endpoint(inp.site, skill="move_data", field="site")
    request = TransferRequest(
        source_endpoint=source.endpoint,
        destination_endpoint=dest.endpoint,
        items=[(source.resolve("move_data", "source_path", inp.source_path), dest.resolve("move_data", "destination_path", inp.destination_path))],
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
    SkillArgumentError
        A site or ``home`` the federation lacks, ``fixed_site`` without ``home``, or a
        continuation handler outside the federation's ``handler_modules`` (nothing is submitted).
    SchedulerError
        The site's submission command failed.
    """
    if inp.site is not None:
        fed.site(inp.site, skill="submit_task", field="site")
    else:
        _check_home(fed, "submit_task", inp.policy, inp.home)
    handler = None
    if inp.continuation is not None:
        fed.check_handler(inp.continuation.handler)
        try:
            handler = resolve_handler(inp.continuation.handler)
        except ContinuationError as exc:
            raise SkillArgumentError("submit_task", "continuation.handler", str(exc)) from None
    if inp.idempotency_key is not None:
        prior = fed.continuations.submissions.get(inp.idempotency_key)
        if prior is not None:
            stdout = _stdout(fed, prior.site, inp.request.name, prior.job_id)
            return SubmitTaskOutput(site=prior.site, job_id=prior.job_id, script="", stdout=str(stdout), duplicate=True)
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
        fed.continuations.submissions.record(inp.idempotency_key, name, job_id)
    fed.continuations.watch_job(name, job_id)
    submitted = {"site": name, "job_id": job_id, "name": inp.request.name, "walltime_s": inp.request.walltime_s}
    fed.continuations.log.append(name, "job.submitted", job_key(name, job_id), submitted)
    stdout = str(_stdout(fed, name, inp.request.name, job_id))
    cid = None
    if inp.continuation is not None:
        c = inp.continuation
        args = dict(c.args)
        if "stdout" in inspect.signature(handler).parameters:
            args["stdout"] = stdout  # the job's output file, known only now
        cid = fed.continuations.register(job_key(name, job_id), c.handler, on=tuple(c.on), args=args)
    return SubmitTaskOutput(site=name, job_id=job_id, script=script, stdout=stdout, decision=decision, continuation_id=cid)


def _submitted_job(fed: Federation, skill: str, site: str, job_id: str) -> dict[str, Any]:
    fed.site(site, skill=skill, field="site")
    record = fed.submitted(site, job_id)
    if record is None:
        raise SkillArgumentError(skill, "job_id", f"job {job_id} was not submitted to site {site!r} by this federation")
    return record


def get_status(fed: Federation, inp: GetStatusInput) -> JobStatus:
    """One job's state as its site reports it.

    Raises :class:`SkillArgumentError` for a site the federation lacks (field ``site``) or a job it
    did not submit there (field ``job_id``).
    """
    _submitted_job(fed, "get_status", inp.site, inp.job_id)
    return fed.scheduler(inp.site).status([inp.job_id])[inp.job_id]


def retrieve_results(fed: Federation, inp: RetrieveResultsInput) -> RetrieveResultsOutput:
    """A job's state, exit code and the last ``max_bytes`` of its output file.

    Only a job this federation submitted to ``inp.site`` can be read, and only its own output file
    (``workdir/<site>/<name>-<job id>.out``, which must resolve inside ``workdir/<site>``).

    Raises
    ------
    SkillArgumentError
        A site the federation lacks (``site``), a job it did not submit there (``job_id``), a
        ``name`` other than the job's (``name``), or an output file that resolves outside the
        site's folder (``name``).
    """
    record = _submitted_job(fed, "retrieve_results", inp.site, inp.job_id)
    name = record.get("name", "lab-job")
    if inp.name is not None and inp.name != name:
        raise SkillArgumentError("retrieve_results", "name", f"job {inp.job_id} on {inp.site!r} was submitted as {name!r}, not {inp.name!r}")
    st = fed.scheduler(inp.site).status([inp.job_id])[inp.job_id]
    folder = (fed.workdir / inp.site).resolve()
    path = _stdout(fed, inp.site, name, inp.job_id)
    text = None
    if path.is_file():
        if not path.resolve().is_relative_to(folder):
            raise SkillArgumentError("retrieve_results", "name", f"the output file {path} resolves outside {folder}")
        with path.open("rb") as fh:
            size = path.stat().st_size
            fh.seek(max(0, size - inp.max_bytes))
            text = fh.read().decode("utf-8", errors="replace")
    return RetrieveResultsOutput(site=inp.site, job_id=inp.job_id, state=st.state, exit_code=st.exit_code, stdout_path=str(path), stdout=text)
