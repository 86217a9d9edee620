"""The embedded default scheduler: batch jobs as local subprocesses, with a CPU limit and walltimes.

:class:`LocalScheduler` behaves like a one-node batch system: each job's
rendered bash script (:meth:`LocalScheduler.render_script`) runs as a
subprocess in its own session; at most ``cpus`` CPUs are in use at once (a job
takes ``ntasks * cpus_per_task``); jobs that do not fit wait in a strict
first-come-first-served queue that a background thread starts as CPUs free up;
a job that runs past its walltime gets SIGTERM, then SIGKILL after
``kill_grace_s``, and ends as ``TIMEOUT``; :meth:`~LocalScheduler.cancel` does
the same to a running job (``CANCELLED``). Such a job stays ``RUNNING`` (its
``reason`` says why), holding its CPUs, until its processes are gone, like
Slurm's COMPLETING, so a terminal state always comes with its end time and exit
code. States, exit codes and submit, start and end times are kept for every
job of the scheduler's lifetime.

:meth:`LocalScheduler.estimated_start` is an FCFS projection: running jobs end
at their start plus walltime, pending jobs start in order as soon as enough CPUs
are projected free; a pending job's ``JobStatus.start_time`` is the same
projection (like Slurm's backfill estimate, it is an upper bound based on time
limits, not run times).

Units: times are epoch seconds (float, UTC), durations seconds, CPUs integers.
Exit codes: the script's exit status; a script killed by signal ``S`` reports
``128 + S`` (the shell's convention), e.g. 143 for SIGTERM.

Output: the job's stdout and stderr go to ``spec.stdout`` (``%j`` job id,
``%x`` job name, ``%%`` a percent sign; relative to the job's working
directory) or, by default, ``<workdir>/lab-<jobid>.out``. The job runs in
``spec.workdir`` or the scheduler's ``workdir``, with ``LAB_JOB_ID``,
``LAB_JOB_NAME`` and ``LAB_SITE`` in its environment. Scripts are kept under
``<workdir>/.lab-local/``.

Errors: a job larger than the scheduler (more CPUs or nodes than it has), a
partition other than ``local``, or a malformed environment variable name is
refused at submission (and by ``estimated_start``) with
:class:`~lab.hpc.errors.PolicyViolation` / :class:`~lab.hpc.errors.SchedulerError`; submitting after :meth:`close` raises
:class:`~lab.hpc.errors.SiteUnavailable`.

The script-rendering helpers (:func:`render_setup`, :func:`time_dhms`,
:func:`wait_status_exit_code`) live in :mod:`lab.hpc.schedulers.base` (importable from here too).
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import os
import operator
import re
import signal
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from lab.hpc.errors import ArgumentError, PolicyViolation, SiteUnavailable
from lab.hpc.schedulers.base import (
    TERMINAL_STATES,
    Capabilities,
    JobSpec,
    JobState,
    JobStatus,
    Scheduler,
    SiteQueue,
    register_scheduler,
    render_setup,
    time_dhms,
    wait_status_exit_code,
)

__all__ = ["LocalScheduler", "render_setup", "time_dhms", "wait_status_exit_code"]

PARTITION = "local"


#: Schedulers not yet closed: closed at interpreter exit, so no job outlives the process that ran it.
_OPEN: weakref.WeakSet[LocalScheduler] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for sched in list(_OPEN):
        sched.close()


def _expand_output(pattern: str, job_id: str, name: str) -> str:
    return re.sub(r"%(.)", lambda m: {"j": job_id, "x": name, "%": "%"}.get(m.group(1), m.group(0)), pattern)


# --------------------------------------------------------------------------- the scheduler


@dataclass
class _Job:
    job_id: str
    spec: JobSpec
    cpus: int
    script: Path
    output: Path
    cwd: Path
    submit_time: float
    state: JobState = JobState.PENDING
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    proc: subprocess.Popen | None = None  # set while the process may be alive
    outcome: JobState | None = None  # CANCELLED or TIMEOUT once signalled: the state when the process is gone
    term_sent: float | None = None
    kill_sent: bool = False


@register_scheduler("local")
class LocalScheduler(Scheduler):
    """One-node batch scheduler running jobs as local subprocesses (see the module docstring).

    Parameters
    ----------
    name : str
        The site's name.
    cpus : int
        CPUs the scheduler may use at once (the sum of running jobs' ``ntasks * cpus_per_task``).
    workdir : path
        Default working directory of jobs; scripts and default outputs go under it.
    poll_s : float
        How often the background thread checks processes and walltimes (seconds).
    kill_grace_s : float
        Seconds between SIGTERM and SIGKILL when a job is cancelled or runs out of walltime.
    """

    def __init__(self, name: str, *, cpus: int = 2, workdir: Path | str, poll_s: float = 0.05, kill_grace_s: float = 2.0):
        try:
            n_cpus = operator.index(cpus)
        except TypeError:
            n_cpus = 0
        if isinstance(cpus, bool) or n_cpus < 1:
            raise ArgumentError("LocalScheduler", "cpus", cpus, "must be an integer >= 1")
        if not poll_s > 0:
            raise ArgumentError("LocalScheduler", "poll_s", poll_s, "must be > 0 seconds")
        if not kill_grace_s >= 0:
            raise ArgumentError("LocalScheduler", "kill_grace_s", kill_grace_s, "must be >= 0 seconds")
        self.name = name
        self.cpus = int(cpus)
        self.workdir = Path(workdir).expanduser().resolve()
        self.poll_s, self.kill_grace_s = float(poll_s), float(kill_grace_s)
        self._scripts = self.workdir / ".lab-local"
        self._scripts.mkdir(parents=True, exist_ok=True)
        self._jobs: dict[str, _Job] = {}
        self._pending: list[str] = []  # FIFO of job ids
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"LocalScheduler[{name}]", daemon=True)
        self._thread.start()
        _OPEN.add(self)

    @classmethod
    def from_site(cls, site, *, workdir: Path | None = None) -> LocalScheduler:
        """The local scheduler for ``site``: its largest partition's CPUs per node, jobs under
        ``workdir`` (default the site's data path)."""
        return cls(site.name, cpus=site.total_cpus_per_node, workdir=workdir or Path(site.data.path))

    # ---- rendering / submission
    def render_script(self, spec: JobSpec) -> str:
        lines = [
            "#!/bin/bash",
            f"# lab local job {spec.name}: nodes={spec.nodes} ntasks={spec.ntasks} cpus_per_task={spec.cpus_per_task} "
            f"walltime={time_dhms(spec.walltime_s)}",
        ]
        lines += render_setup(self.name, spec)
        lines.append(spec.command)
        return "\n".join(lines) + "\n"

    def _check(self, spec: JobSpec) -> int:
        """The CPUs ``spec`` takes; :class:`PolicyViolation` if it can never run here."""
        cpus = spec.ntasks * spec.cpus_per_task
        if spec.nodes > 1:
            raise PolicyViolation(self.name, "max_nodes", spec.nodes, 1, "the local scheduler is one node")
        if cpus > self.cpus:
            raise PolicyViolation(self.name, "max_cpus", cpus, self.cpus, "ntasks * cpus_per_task")
        if spec.partition not in (None, PARTITION):
            raise PolicyViolation(self.name, "partition", spec.partition, [PARTITION])
        return cpus

    def submit(self, spec: JobSpec) -> str:
        cpus = self._check(spec)
        script_text = self.render_script(spec)
        with self._cond:
            if self._closed:
                raise SiteUnavailable(self.name, "submit", None, "the local scheduler is closed")
            job_id = str(next(self._ids))
            cwd = Path(spec.workdir).expanduser() if spec.workdir is not None else self.workdir
            cwd = cwd if cwd.is_absolute() else self.workdir / cwd
            out = Path(_expand_output(spec.stdout, job_id, spec.name)) if spec.stdout else self.workdir / f"lab-{job_id}.out"
            out = out if out.is_absolute() else cwd / out
            script = self._scripts / f"job-{job_id}.sh"
            script.write_text(script_text)
            job = _Job(job_id, spec, cpus, script, out, cwd, submit_time=time.time())
            self._jobs[job_id] = job
            self._pending.append(job_id)
            self._schedule(time.time())
            self._cond.notify_all()
        return job_id

    def cancel(self, job_id: str) -> None:
        with self._cond:
            job = self._jobs.get(str(job_id))
            if job is None or job.state in TERMINAL_STATES:
                return
            now = time.time()
            if job.state == JobState.PENDING:
                self._pending.remove(job.job_id)
                job.state, job.end_time, job.reason = JobState.CANCELLED, now, "cancelled while pending"
                self._schedule(now)
            elif job.outcome is None:  # stays RUNNING (like Slurm's COMPLETING) until its processes are gone
                job.outcome, job.reason = JobState.CANCELLED, "cancelled"
                self._signal(job, signal.SIGTERM, now)
            self._cond.notify_all()

    # ---- inspection
    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        with self._cond:
            now = time.time()
            projected = self._project(now)[0]
            return {str(j): self._status(self._jobs.get(str(j)), str(j), projected) for j in job_ids}

    def queue(self) -> SiteQueue:
        with self._cond:
            now = time.time()
            projected = self._project(now)[0]
            active = [j for j in self._jobs.values() if j.state in (JobState.PENDING, JobState.RUNNING)]
            return SiteQueue(
                site=self.name,
                time=now,
                pending=sum(j.state == JobState.PENDING for j in active),
                running=sum(j.state == JobState.RUNNING for j in active),
                total_cpus=self.cpus,
                idle_cpus=self.cpus - self._busy_cpus(),
                jobs=[self._status(j, j.job_id, projected) for j in active],
            )

    def estimated_start(self, spec: JobSpec) -> float | None:
        cpus = self._check(spec)  # a job that can never run here is refused, as by submit
        with self._cond:
            return self._project(time.time(), extra=(cpus, spec.walltime_s))[1]

    def capabilities(self) -> Capabilities:
        return Capabilities(scheduler="local", partitions=[PARTITION], total_cpus=self.cpus, nodes=1, estimated_start=True)

    # ---- life cycle
    def close(self) -> None:
        """Stop the background thread; cancel pending jobs and kill running ones (their process groups)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            _OPEN.discard(self)
            now = time.time()
            for job_id in self._pending:
                job = self._jobs[job_id]
                job.state, job.end_time, job.reason = JobState.CANCELLED, now, "scheduler closed"
            self._pending.clear()
            procs = [j for j in self._jobs.values() if j.proc is not None]
            for job in procs:
                if job.outcome is None:
                    job.outcome, job.reason = JobState.CANCELLED, "scheduler closed"
                self._signal(job, signal.SIGKILL, now)
            self._cond.notify_all()
        self._thread.join(timeout=5)
        with self._cond:
            for job in procs:
                try:
                    job.proc.wait(timeout=5)
                except (subprocess.TimeoutExpired, AttributeError):
                    pass
                self._reap(job, time.time())


    # ---- internals (all called with self._cond held)
    def _busy_cpus(self) -> int:
        return sum(j.cpus for j in self._jobs.values() if j.proc is not None)

    def _status(self, job: _Job | None, job_id: str, projected: dict[str, float]) -> JobStatus:
        if job is None:
            return JobStatus(job_id=job_id, state=JobState.UNKNOWN, reason="no such job on this scheduler")
        start = job.start_time if job.state != JobState.PENDING else projected.get(job.job_id)
        return JobStatus(
            job_id=job.job_id,
            state=job.state,
            name=job.spec.name,
            reason=job.reason,
            submit_time=job.submit_time,
            start_time=start,
            end_time=job.end_time if job.state in TERMINAL_STATES else None,
            exit_code=job.exit_code if job.state in TERMINAL_STATES else None,
            cpus=job.cpus,
            nodes=1,
            time_limit_s=job.spec.walltime_s,
        )

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.time()
                for job in [j for j in self._jobs.values() if j.proc is not None]:
                    if job.proc.poll() is not None:
                        self._reap(job, now)
                    elif job.outcome is None and now >= job.start_time + job.spec.walltime_s:
                        job.outcome, job.reason = JobState.TIMEOUT, f"walltime of {job.spec.walltime_s} s exceeded"
                        self._signal(job, signal.SIGTERM, now)
                    elif job.term_sent is not None and not job.kill_sent and now >= job.term_sent + self.kill_grace_s:
                        self._signal(job, signal.SIGKILL, now)
                self._schedule(now)
                self._cond.wait(self.poll_s)

    def _reap(self, job: _Job, now: float) -> None:
        """The job's process has ended: record its end (its CPUs are free again)."""
        if job.proc is None or job.proc.returncode is None:
            return
        rc = job.proc.returncode
        job.exit_code = 128 - rc if rc < 0 else rc
        job.end_time = now
        job.proc = None
        if job.outcome is not None:
            job.state = job.outcome
        else:
            job.state = JobState.COMPLETED if rc == 0 else JobState.FAILED
            job.reason = None if rc == 0 else f"exit code {job.exit_code}"

    def _signal(self, job: _Job, sig: int, now: float) -> None:
        if job.proc is None:
            return
        try:
            os.killpg(job.proc.pid, sig)  # the job leads its own session: take its children too
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            job.kill_sent = True
        elif job.term_sent is None:
            job.term_sent = now

    def _schedule(self, now: float) -> None:
        """Start pending jobs in FIFO order while the head of the queue fits (no backfill)."""
        if self._closed:
            return
        free = self.cpus - self._busy_cpus()
        while self._pending:
            job = self._jobs[self._pending[0]]
            if job.cpus > free:
                job.reason = "Resources"
                for other in self._pending[1:]:
                    self._jobs[other].reason = "Priority"
                return
            self._pending.pop(0)
            self._start(job, now)
            free -= job.cpus if job.proc is not None else 0

    def _start(self, job: _Job, now: float) -> None:
        env = {**os.environ, **{k: str(v) for k, v in job.spec.environment.items()}}
        env.update(LAB_JOB_ID=job.job_id, LAB_JOB_NAME=job.spec.name, LAB_SITE=self.name)
        try:
            job.output.parent.mkdir(parents=True, exist_ok=True)
            with open(job.output, "ab") as out:
                job.proc = subprocess.Popen(
                    ["/bin/bash", str(job.script)],
                    cwd=job.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        except OSError as e:  # e.g. the working directory does not exist: the job fails, like under Slurm
            job.state, job.start_time, job.end_time, job.exit_code = JobState.FAILED, now, now, 1
            job.reason = f"could not start: {e}"
            return
        job.state, job.start_time, job.reason = JobState.RUNNING, now, None

    def _project(self, now: float, extra: tuple[int, int] | None = None) -> tuple[dict[str, float], float | None]:
        """FCFS projection: start times of pending jobs (by id) and of an extra ``(cpus, walltime_s)`` job."""
        releases: list[tuple[float, int]] = []
        free = self.cpus
        for j in self._jobs.values():
            if j.proc is not None:
                if j.outcome is None:
                    end = j.start_time + j.spec.walltime_s
                else:  # being killed
                    end = (j.term_sent or now) + self.kill_grace_s
                heapq.heappush(releases, (max(now, end), j.cpus))
                free -= j.cpus
        t = now
        starts: dict[str, float] = {}
        queue = [(self._jobs[i].cpus, self._jobs[i].spec.walltime_s, i) for i in self._pending]
        if extra is not None:
            queue.append((extra[0], extra[1], None))
        extra_start = None
        for cpus, walltime, job_id in queue:
            while free < cpus and releases:
                end, c = heapq.heappop(releases)
                t, free = max(t, end), free + c
            heapq.heappush(releases, (t + walltime, cpus))
            free -= cpus
            if job_id is None:
                extra_start = t
            else:
                starts[job_id] = t
        return starts, extra_start
