"""The one interface every scheduler adapter implements (PSI/J's executor idea, typed with pydantic).

A :class:`JobSpec` says what to run and with which resources; an adapter
(:class:`~lab.hpc.schedulers.slurm.SlurmScheduler`,
:class:`~lab.hpc.schedulers.local.LocalScheduler`) turns it into the site's own
submission, and reports :class:`JobStatus`, :class:`SiteQueue` snapshots and
estimated start times in the same types whatever the scheduler. Times are
epoch seconds (UTC, float), durations seconds, sizes integers.

Adapters are found by name: :func:`register_scheduler` files a :class:`Scheduler` subclass under
the name a site's ``scheduler`` field uses (``"slurm"``, ``"local"``, or a new one), and
:meth:`lab.hpc.sites.Site.connect` builds the adapter with that class's :meth:`Scheduler.from_site`;
:func:`scheduler_class` looks one up (an unknown name raises
:class:`~lab.hpc.errors.UnknownSchedulerError` listing the registered ones). The built-in adapters
register themselves when :mod:`lab.hpc.schedulers` is imported.

The script-rendering helpers every adapter shares live here too: :func:`render_setup`,
:func:`time_dhms`, :func:`wait_status_exit_code`.
"""

from __future__ import annotations

import os
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from lab.hpc.errors import SchedulerError, UnknownSchedulerError

if TYPE_CHECKING:  # only for annotations: sites imports this module
    from lab.hpc.sites import Site

__all__ = [
    "JobState", "JobSpec", "JobStatus", "SiteQueue", "Capabilities", "Scheduler", "TERMINAL_STATES",
    "register_scheduler", "scheduler_class", "scheduler_names", "render_setup", "time_dhms", "wait_status_exit_code",
]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JobState(str, Enum):
    """A job's state, normalised across schedulers."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})


class JobSpec(BaseModel):
    """What to run, and the resources it asks for.

    ``command`` is the body of the batch script (shell); ``walltime_s`` the limit in seconds;
    ``nodes`` whole nodes and ``ntasks`` processes (Slurm's ``-N``/``-n``); ``cpus_per_task``
    cores per process. ``modules`` and ``environment`` are prepended as setup lines.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field("lab-job", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    command: str
    nodes: int = Field(1, ge=1)
    ntasks: int = Field(1, ge=1)
    cpus_per_task: int = Field(1, ge=1)
    walltime_s: int = Field(60, ge=1)
    partition: str | None = None
    account: str | None = None
    workdir: Path | None = None
    stdout: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    modules: list[str] = Field(default_factory=list)


class JobStatus(BaseModel):
    """A job as a scheduler reports it."""

    job_id: str
    state: JobState
    name: str | None = None
    reason: str | None = None
    submit_time: float | None = None
    start_time: float | None = None  # for a pending job: the scheduler's estimate, if any
    end_time: float | None = None
    exit_code: int | None = None
    cpus: int | None = None
    nodes: int | None = None
    time_limit_s: int | None = None  # the walltime asked for, seconds (None: unknown or unlimited)


class SiteQueue(BaseModel):
    """A site's queue at one instant."""

    site: str
    time: float
    pending: int
    running: int
    total_cpus: int
    idle_cpus: int
    jobs: list[JobStatus] = Field(default_factory=list)


class Capabilities(BaseModel):
    """What an adapter can do and how big the site is."""

    scheduler: str
    partitions: list[str]
    total_cpus: int
    nodes: int
    estimated_start: bool


class Scheduler(ABC):
    """One site's batch scheduler. Every method may raise :class:`~lab.hpc.errors.SchedulerError`
    (the command failed) or :class:`~lab.hpc.errors.SiteUnavailable` (the site does not answer).

    A scheduler is a context manager: ``with site.connect() as sched: ...`` calls :meth:`close` at the end.
    """

    name: str

    @classmethod
    def from_site(cls, site: Site, *, workdir: Path | None = None) -> Scheduler:
        """The adapter for ``site`` (what :meth:`lab.hpc.sites.Site.connect` returns); ``workdir`` is
        where an adapter that runs jobs itself keeps them. Adapters override this."""
        raise NotImplementedError(f"{cls.__name__} does not say how to connect to a site (override from_site)")

    def close(self) -> None:
        """Release what the adapter holds (threads, processes, connections). Idempotent. The default
        holds nothing; :class:`~lab.hpc.schedulers.local.LocalScheduler` ends its jobs."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @abstractmethod
    def render_script(self, spec: JobSpec) -> str:
        """The batch script this scheduler would run for ``spec`` (directives, environment, command)."""

    @abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Submit; returns the scheduler's job id."""

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel a pending or running job (no error if it has already ended)."""

    @abstractmethod
    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Status of each job id; jobs the scheduler no longer knows come back as UNKNOWN."""

    @abstractmethod
    def queue(self) -> SiteQueue:
        """Snapshot of the whole queue and the free resources."""

    @abstractmethod
    def estimated_start(self, spec: JobSpec) -> float | None:
        """When a job like ``spec`` submitted now would start (epoch seconds), or None if unknown."""

    @abstractmethod
    def capabilities(self) -> Capabilities:
        """Partitions, size and features of the site."""


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Scheduler]] = {}
_S = TypeVar("_S", bound=type[Scheduler])
_NAME = re.compile(r"^[a-z][a-z0-9_\-]{0,31}$")


def register_scheduler(name: str, *, replace: bool = False) -> Callable[[_S], _S]:
    """Class decorator: file a :class:`Scheduler` subclass under ``name`` (a site's ``scheduler`` value).

    Parameters
    ----------
    name : str
        Lower-case, ``[a-z][a-z0-9_-]*``, at most 32 characters.
    replace : bool
        Allow replacing an adapter already registered under ``name`` (default: refuse).

    Raises
    ------
    lab.hpc.errors.ArgumentError
        A malformed name, a class that is not a Scheduler, or a name already taken (without ``replace``).
    """
    from lab.hpc.errors import ArgumentError

    if not isinstance(name, str) or not _NAME.match(name):
        raise ArgumentError("register_scheduler", "name", name, "must match [a-z][a-z0-9_-]{0,31}")

    def decorate(cls: _S) -> _S:
        if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
            raise ArgumentError("register_scheduler", "cls", cls, "must be a subclass of lab.hpc.schedulers.base.Scheduler")
        if name in _REGISTRY and _REGISTRY[name] is not cls and not replace:
            raise ArgumentError("register_scheduler", "name", name, f"already registered to {_REGISTRY[name].__qualname__} (pass replace=True)")
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_builtin() -> None:
    import lab.hpc.schedulers  # noqa: F401  (registers "local" and "slurm")


def scheduler_names() -> list[str]:
    """The registered scheduler names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def scheduler_class(name: str) -> type[Scheduler]:
    """The adapter class registered under ``name``.

    Raises
    ------
    lab.hpc.errors.UnknownSchedulerError
        No adapter has that name (the message lists the registered ones).
    """
    _load_builtin()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownSchedulerError(name, _REGISTRY) from None


# --------------------------------------------------------------------------- shared script helpers


def render_setup(site: str, spec: JobSpec) -> list[str]:
    """The lines between the directives and the command: ``module load`` lines, then ``export K=V`` lines.

    Values are shell-quoted; a key that is not a shell variable name raises
    :class:`~lab.hpc.errors.SchedulerError`.
    """
    lines = [f"module load {shlex.quote(m)}" for m in spec.modules]
    for key, value in spec.environment.items():
        if not _ENV_NAME.match(key):
            raise SchedulerError(site, "render_script", None, f"environment variable name {key!r} is not a valid shell name")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    return lines


def time_dhms(seconds: int) -> str:
    """Seconds as Slurm's ``D-HH:MM:SS`` (e.g. 90061 -> ``1-01:01:01``)."""
    seconds = int(seconds)
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}"


def wait_status_exit_code(status: int) -> int:
    """A raw ``wait()`` status as an exit code: the exit status, or ``128 + signal`` if killed."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
