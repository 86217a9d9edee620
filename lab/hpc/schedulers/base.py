"""The one interface every scheduler adapter implements (PSI/J's executor idea, typed with pydantic).

A :class:`JobSpec` says what to run and with which resources; an adapter
(:class:`~lab.hpc.schedulers.slurm.SlurmScheduler`,
:class:`~lab.hpc.schedulers.local.LocalScheduler`) turns it into the site's own
submission, and reports :class:`JobStatus`, :class:`SiteQueue` snapshots and
estimated start times in the same types whatever the scheduler. Times are
epoch seconds (UTC, float), durations seconds, sizes integers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["JobState", "JobSpec", "JobStatus", "SiteQueue", "Capabilities", "Scheduler", "TERMINAL_STATES"]


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
    (the command failed) or :class:`~lab.hpc.errors.SiteUnavailable` (the site does not answer)."""

    name: str

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
