"""Typed descriptions of HPC sites: what each site has and what it allows.

One TOML file per site (a folder of them is a federation)::

    name = "alpha"
    scheduler = "slurm"                 # or "local" (the embedded subprocess scheduler), or any registered adapter
    slurm_conf = "/path/to/slurm.conf"  # slurm only: the site's controller, passed per command
    accounts = ["lab"]

    [[partitions]]
    name = "debug"
    max_nodes = 1
    max_walltime_s = 3600
    cpus_per_node = 2
    default = true

    [environment]                       # set up in every batch script, in this order
    modules = ["python/3.11"]
    setup = ["source /opt/site/env.sh"]
    variables = { OMP_NUM_THREADS = "1" }

    [data]                              # where the site's files live
    kind = "local"                      # or "globus" with collection_id
    path = "/scratch/alpha"

    [policies]
    require_account = false
    max_queued_jobs = 100

:func:`load_site` and :func:`load_sites` validate with pydantic and raise
:class:`~lab.hpc.errors.SiteError` naming the file and the field;
:meth:`Site.check` refuses a :class:`~lab.hpc.schedulers.base.JobSpec` that
breaks a limit with :class:`~lab.hpc.errors.PolicyViolation` saying which.
``scheduler`` names an adapter registered with
:func:`~lab.hpc.schedulers.base.register_scheduler` (built in: ``"slurm"``, ``"local"``); another
name is refused with :class:`~lab.hpc.errors.UnknownSchedulerError` listing the registered ones, and
:meth:`Site.connect` builds the adapter through that registry.
Units: seconds, whole nodes, CPUs (cores).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lab.hpc.errors import PolicyViolation, SiteError, UnknownSchedulerError
from lab.hpc.schedulers.base import JobSpec, Scheduler, scheduler_class, scheduler_names

__all__ = ["Partition", "Environment", "DataEndpoint", "Policies", "Site", "load_site", "load_sites", "write_site"]


class Partition(BaseModel):
    """A partition (queue) and its limits: nodes per job, walltime per job (seconds), cores per node."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    max_nodes: int = Field(ge=1)
    max_walltime_s: int = Field(ge=1)
    cpus_per_node: int = Field(ge=1)
    default: bool = False


class Environment(BaseModel):
    """What every batch script on the site sets up before the job's command."""

    model_config = ConfigDict(extra="forbid")

    modules: list[str] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list)
    variables: dict[str, str] = Field(default_factory=dict)


class DataEndpoint(BaseModel):
    """Where the site's files live: a local path, or a Globus collection (and a path in it)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "globus"] = "local"
    path: str = "."
    collection_id: str | None = None

    @model_validator(mode="after")
    def _globus_needs_collection(self):
        if self.kind == "globus" and not self.collection_id:
            raise SiteError("a globus data endpoint needs collection_id", field="collection_id")
        return self


class Policies(BaseModel):
    """Site rules checked before anything is submitted."""

    model_config = ConfigDict(extra="forbid")

    require_account: bool = False
    max_queued_jobs: int | None = Field(None, ge=1)


class Site(BaseModel):
    """One independently administered HPC site."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_\-]{0,39}$")
    scheduler: str = Field(description="a registered scheduler adapter's name (lab.hpc.schedulers.base.scheduler_names())")
    slurm_conf: Path | None = None
    description: str = ""
    accounts: list[str] = Field(default_factory=list)
    partitions: list[Partition] = Field(min_length=1)
    environment: Environment = Field(default_factory=Environment)
    data: DataEndpoint = Field(default_factory=DataEndpoint)
    policies: Policies = Field(default_factory=Policies)

    @field_validator("scheduler")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in scheduler_names():
            raise UnknownSchedulerError(name, scheduler_names())
        return name

    @model_validator(mode="after")
    def _consistent(self):
        if self.scheduler == "slurm" and self.slurm_conf is None:
            raise SiteError("a slurm site needs slurm_conf", field="slurm_conf")
        names = [p.name for p in self.partitions]
        if len(set(names)) != len(names):
            raise SiteError(f"partition names repeat: {names}", field="partitions")
        if sum(p.default for p in self.partitions) > 1:
            raise SiteError("more than one partition has default = true", field="partitions")
        return self

    @property
    def default_partition(self) -> Partition:
        return next((p for p in self.partitions if p.default), self.partitions[0])

    @property
    def total_cpus_per_node(self) -> int:
        return max(p.cpus_per_node for p in self.partitions)

    def partition(self, name: str | None) -> Partition:
        """The named partition (the default one for None); PolicyViolation if the site has none such."""
        if name is None:
            return self.default_partition
        for p in self.partitions:
            if p.name == name:
                return p
        raise PolicyViolation(self.name, "partition", name, [p.name for p in self.partitions], "unknown partition")

    def check(self, spec: JobSpec) -> JobSpec:
        """Refuse a request this site does not allow; return it completed with the site's
        partition and environment (modules, setup lines as part of the command, variables).

        Raises
        ------
        PolicyViolation
            Unknown partition, too many nodes, walltime over the partition's limit, more CPUs per
            node than the partition has, or an account that is missing or not the site's.
        """
        part = self.partition(spec.partition)
        if spec.nodes > part.max_nodes:
            raise PolicyViolation(self.name, "max_nodes", spec.nodes, part.max_nodes, f"partition {part.name!r}")
        if spec.walltime_s > part.max_walltime_s:
            raise PolicyViolation(self.name, "max_walltime_s", spec.walltime_s, part.max_walltime_s, f"partition {part.name!r}")
        per_node = -(-spec.ntasks * spec.cpus_per_task // spec.nodes)
        if per_node > part.cpus_per_node:
            raise PolicyViolation(self.name, "cpus_per_node", per_node, part.cpus_per_node, f"partition {part.name!r}: ntasks x cpus_per_task / nodes")
        if spec.account is None and self.policies.require_account:
            raise PolicyViolation(self.name, "account", None, self.accounts, "this site requires an account")
        if spec.account is not None and self.accounts and spec.account not in self.accounts:
            raise PolicyViolation(self.name, "account", spec.account, self.accounts, "not an account of this site")
        env = self.environment
        command = "\n".join([*env.setup, spec.command]) if env.setup else spec.command
        return spec.model_copy(
            update={
                "partition": part.name,
                "command": command,
                "modules": [*env.modules, *spec.modules],
                "environment": {**env.variables, **spec.environment},
            }
        )

    def connect(self, *, workdir: Path | None = None) -> Scheduler:
        """The scheduler adapter for this site: the class registered under its ``scheduler`` name
        (:func:`~lab.hpc.schedulers.base.scheduler_class`), built by its ``from_site`` (Slurm through the
        site's own ``slurm_conf``; the local one with its jobs under ``workdir``, default the data path).
        Close it (or use it as a context manager) when done.

        Raises
        ------
        UnknownSchedulerError
            No adapter is registered under ``scheduler`` (any more).
        """
        return scheduler_class(self.scheduler).from_site(self, workdir=workdir)


def _field(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "<file>"


def load_site(path: str | Path) -> Site:
    """Read and validate one site file.

    Raises
    ------
    SiteError
        The file is not UTF-8 text, not valid TOML (with its line and column), or a field is missing
        or wrong (the first offending field, as a dotted path like ``partitions.0.max_nodes``).
    UnknownSchedulerError
        ``scheduler`` names no registered adapter (a SiteError listing the registered names).
    FileNotFoundError
        No such file.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SiteError(f"not valid TOML: {exc}", path=path) from None
    except UnicodeDecodeError as exc:  # a ValueError: never let it out bare
        raise SiteError(f"not UTF-8 text (byte {exc.start}: {exc.reason})", path=path) from None
    try:
        site = Site.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SiteError):  # raised by a validator: it names its own field below err["loc"]
            field = ".".join(p for p in (_field(err["loc"]) if err["loc"] else "", cause.field or "") if p) or None
            if isinstance(cause, UnknownSchedulerError):
                raise UnknownSchedulerError(cause.name, cause.registered, path=path) from None
            raise SiteError(cause.reason, path=path, field=field) from None
        raise SiteError(err["msg"], path=path, field=_field(err["loc"])) from None
    if site.slurm_conf is not None and not site.slurm_conf.is_absolute():
        site = site.model_copy(update={"slurm_conf": (path.parent / site.slurm_conf).resolve()})
    return site


def load_sites(folder: str | Path) -> dict[str, Site]:
    """Every ``*.toml`` site in ``folder``, by name (sorted by file name).

    Raises :class:`SiteError` for a bad file, or two files naming the same site.
    """
    folder = Path(folder)
    sites: dict[str, Site] = {}
    origin: dict[str, Path] = {}
    for path in sorted(folder.glob("*.toml")):
        site = load_site(path)
        if site.name in sites:
            raise SiteError(f"site name {site.name!r} is also used by {origin[site.name]}", path=path, field="name")
        sites[site.name], origin[site.name] = site, path
    if not sites:
        raise SiteError("no *.toml site files", path=folder)
    return sites


def write_site(site: Site, path: str | Path) -> Path:
    """Write ``site`` as TOML (what :func:`load_site` reads back)."""
    path = Path(path)
    data = site.model_dump(mode="json", exclude_none=True)
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path
