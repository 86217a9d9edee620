"""Slurm adapter: one site's Slurm controller through its command-line tools, the site chosen per call.

:class:`SlurmScheduler` runs ``sbatch``, ``scancel``, ``squeue``, ``sinfo`` and
``scontrol`` as subprocesses, each with ``SLURM_CONF=<the site's slurm.conf>``
in *that call's* environment (``os.environ`` is never changed), so one process
can talk to many Slurm sites at once -- e.g. the sites of
:mod:`lab.hpc.testbed`.

Why the CLI directly, not PSI/J: PSI/J's Slurm executor also shells out to
``sbatch``/``squeue``/``scancel``, but takes the cluster from the process-wide
environment (``SLURM_CONF``), so one process serves one site unless every
command is wrapped; its status poll is periodic (30 s by default) and it exposes
neither queue snapshots nor Slurm's start estimates (``sbatch --test-only``),
which placement needs (``notes/hpc.md``). The commands used here are few and
stable across Slurm 22.05 and later.

What each method runs (Slurm 22.05):

* :meth:`~SlurmScheduler.submit`: ``sbatch --parsable`` with the script of
  :meth:`~SlurmScheduler.render_script` on stdin; returns the job id.
* :meth:`~SlurmScheduler.cancel`: ``scancel ID`` (a job that has already ended
  or been purged is not an error).
* :meth:`~SlurmScheduler.status`: one ``squeue -j ID,ID,... -O ...`` call for
  the watched jobs only (``--json`` would list every job: 22.05 ignores its
  filters; see :mod:`~lab.hpc.schedulers.slurm_poll`); jobs that squeue no
  longer lists (older than ``MinJobAge``) are looked up in the
  ``jobcomp/filetxt`` file (``JobCompLoc`` from ``scontrol show config``, else
  from the slurm.conf; read incrementally), or with ``sacct -X -j`` where the
  site has accounting but no such file. The file's lines are ``key=value`` pairs (``JobId``,
  ``JobState``, ``SubmitTime``, ``StartTime``, ``EndTime``, ``ExitCode=E:S``,
  ...) with times in the controller's local time. The file is only readable
  where the controller writes it (this machine or a shared file system); jobs
  found nowhere are ``UNKNOWN``.
* :meth:`~SlurmScheduler.queue`: the whole queue, every user's jobs, with one
  ``squeue -h --all --noconvert -O <fields>`` listing
  (:func:`~lab.hpc.schedulers.slurm_poll.squeue_queue`; not ``squeue --json``, whose 22.05
  serializer took 1.4 s for 2,000 jobs on an idle machine and up to 7.5 s while hundreds of
  jobs ended, blocking the site's job poll, issue #16) + ``sinfo --json`` (CPUs of nodes that are
  down, drained or failing count as not idle).
* :meth:`~SlurmScheduler.estimated_start`: ``sbatch --test-only`` with the
  rendered script, which answers at once with "Job N to start at
  2026-11-30T06:51:38 using ..." (local time, converted to epoch seconds; no job
  is submitted, a job id is consumed). Like Slurm's backfill, the estimate is
  based on time limits.
* :meth:`~SlurmScheduler.capabilities`: ``sinfo -h -o %P`` (default partition
  first) + ``sinfo --json``.

A site that is down must fail at once, not after the client's connection retries
(9-18 s per command with ``MessageTimeout=10``). The polls (:meth:`~SlurmScheduler.status`,
:meth:`~SlurmScheduler.queue`, called every second per site by the continuation service) do
not ask first: any command that has not answered within ``probe_after_s`` (1 s) is checked on
with ``scontrol ping`` while it waits, and ended with :class:`~lab.hpc.errors.SiteUnavailable`
if the controller does not answer (a busy controller that answers the ping is waited for).
A ping before every poll was a third of each job poll's time with 2,000 jobs (17 s of
``scontrol`` processes in one run, issue #16). The rare calls (:meth:`~SlurmScheduler.submit`,
:meth:`~SlurmScheduler.cancel`, :meth:`~SlurmScheduler.estimated_start`,
:meth:`~SlurmScheduler.capabilities`) still ping first (a few milliseconds).

States: PENDING (and REQUEUED, ...) -> pending; RUNNING, COMPLETING,
CONFIGURING, SUSPENDED, ... -> running; COMPLETED -> completed; FAILED,
NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED -> failed; CANCELLED ->
cancelled; TIMEOUT -> timeout; anything else -> unknown. Exit codes: the batch
script's exit status, ``128 + S`` if killed by signal ``S``. Times are epoch
seconds (float); a pending job's ``start_time`` is the backfill's estimate
(None until it has one); ``end_time`` and ``exit_code`` only for ended jobs.

Errors: a command that exits non-zero (or reports errors in its JSON) raises
:class:`~lab.hpc.errors.SchedulerError` with the command and its stderr; a
controller that does not answer (``scontrol ping`` says DOWN, "Unable to
contact slurm controller", connection refused, socket timeouts, or no answer
within ``timeout_s``) raises :class:`~lab.hpc.errors.SiteUnavailable`; missing
Slurm client tools raise :class:`~lab.hpc.errors.SchedulerError` saying how to
install them.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from lab.hpc.errors import SchedulerError, SiteUnavailable
from lab.hpc.schedulers.base import (
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

from lab.hpc.schedulers.slurm_poll import JobcompReader, JobcompTail, parse_slurm_time, sacct_watched, squeue_queue, squeue_watched

__all__ = ["SlurmScheduler", "map_state", "parse_jobcomp_line", "parse_slurm_time"]

INSTALL_HINT = "install the Slurm client tools: apt-get install -y --no-install-recommends slurm-wlm (or slurm-client)"

_STATES: dict[str, JobState] = {
    **dict.fromkeys(["PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"], JobState.PENDING),
    **dict.fromkeys(
        ["RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED", "POWER_UP_NODE"],
        JobState.RUNNING,
    ),
    "COMPLETED": JobState.COMPLETED,
    **dict.fromkeys(["FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"], JobState.FAILED),
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
}
_ACTIVE = (JobState.PENDING, JobState.RUNNING)
_UNAVAILABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|connect failure|Socket timed out|"
    r"Zero Bytes were transmitted|Communication connection failure|Transport endpoint is not connected|"
    r"backup controller in standby mode",
    re.IGNORECASE,
)
_TEST_ONLY = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
_JOB_ID = re.compile(r"^\d+(_\d+)?$")
_NOT_IDLE = ("down", "drain", "fail", "not_responding", "future", "power")


def map_state(state: str | list | None) -> JobState:
    """A Slurm job state (``"CANCELLED by 0"``, ``["RUNNING"]``, ``"COMPLETING"``) as a :class:`JobState`."""
    if isinstance(state, list):
        state = state[0] if state else None
    if not state:
        return JobState.UNKNOWN
    return _STATES.get(str(state).split()[0].upper().rstrip("+"), JobState.UNKNOWN)


def parse_jobcomp_line(line: str) -> dict[str, str]:
    """One jobcomp/filetxt line as a dict (``"JobId=3 JobState=FAILED ExitCode=3:0"`` -> ``{"JobId": "3", ...}``).

    Values run to the next `` Key=`` (so values with spaces, such as ``Name``, survive).
    """
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"(?:^|\s)([A-Za-z]+)=(.*?)(?=\s+[A-Za-z]+=|\s*$)", line)}


def _num(value) -> int | None:
    """An integer field of Slurm's JSON (plain in 22.05, ``{"set":..,"number":..}`` in later versions)."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set", True) and value.get("number") is not None else None
    return int(value) if value is not None else None


def _time_limit_s(value) -> int | None:
    """squeue's ``time_limit`` (minutes; ``{"infinite": true}`` or NO_VAL when unlimited) in seconds."""
    if isinstance(value, dict) and value.get("infinite"):
        return None
    minutes = _num(value)
    return None if minutes is None or minutes >= 0xFFFFFFFE else minutes * 60


def _epoch(value) -> float | None:
    n = _num(value)
    return float(n) if n else None


@register_scheduler("slurm")
class SlurmScheduler(Scheduler):
    """One Slurm site, reached through its ``slurm.conf`` (see the module docstring).

    Parameters
    ----------
    name : str
        The site's name (used in errors and :class:`SiteQueue`).
    slurm_conf : path
        The site's slurm.conf; passed as ``SLURM_CONF`` to every command.
    timeout_s : float
        Longest wait for one command (seconds); past it the site counts as unavailable.
    probe_after_s : float
        A command that has not answered within this many seconds is checked on with ``scontrol ping``
        (the watchdog of the module docstring); a controller that does not answer ends it at once.
    listing_interval_s : float
        At most one ``squeue`` and one ``sacct`` call per this many seconds, start to start (a call
        sooner waits; 0: no limit). A :class:`~lab.hpc.continuation.ContinuationService` raises it to
        its ``site_min_interval_s``, so its polls and anything else in the process share the budget.
    """

    def __init__(self, name: str, slurm_conf: Path | str, *, timeout_s: float = 30.0, probe_after_s: float = 1.0,
                 listing_interval_s: float = 0.0):
        self.name = name
        self.slurm_conf = Path(slurm_conf).expanduser()
        self.timeout_s = float(timeout_s)
        self.probe_after_s = float(probe_after_s)
        self.listing_interval_s = float(listing_interval_s)
        self._listing_lock = threading.Lock()
        self._listing_started: dict[str, float] = {}  # "squeue" / "sacct" -> time.monotonic() the last one started
        self._spawned: dict[str, float] = {}  # command -> time.monotonic() its last process was started
        self._jobcomp: Path | None = None
        self._no_jobcomp = False  # the site answered that it writes no jobcomp file
        self._jobcomp_reader: JobcompReader | None = None
        self._jobcomp_tail: JobcompTail | None = None
        #: the user whose jobs :meth:`status` asks squeue for (the one running this process: the jobs it submits)
        self.user: str | None = getpass.getuser()

    def __repr__(self) -> str:
        return f"SlurmScheduler({self.name!r}, {str(self.slurm_conf)!r})"

    @classmethod
    def from_site(cls, site, *, workdir: Path | None = None) -> SlurmScheduler:
        """The adapter for a ``scheduler = "slurm"`` site, through its ``slurm_conf`` (``workdir`` is unused:
        the jobs run where the site's Slurm runs them)."""
        return cls(site.name, site.slurm_conf)

    # ---- command runner
    def _env(self) -> dict[str, str]:
        # the site comes from SLURM_CONF alone: drop inherited SLURM_*/SBATCH_*/... variables that
        # would change what the commands do (e.g. SBATCH_PARTITION, SLURM_CLUSTERS)
        drop = ("SLURM_", "SBATCH_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def _run(self, argv: list[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run one Slurm command for this site (the watchdog ``scontrol ping`` of the module docstring
        if it has not answered within :attr:`probe_after_s`)."""
        probe = argv[:2] != ["scontrol", "ping"] and self.probe_after_s < self.timeout_s
        deadline = time.monotonic() + self.timeout_s
        try:
            # its own process group: a site's wrapper script and what it started are ended together
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=self._env(), text=True, process_group=0)
            self._spawned[argv[0]] = time.monotonic()
        except FileNotFoundError as e:
            raise SchedulerError(self.name, argv, None, f"{argv[0]} not found: {INSTALL_HINT}") from e
        try:
            try:
                out, err = proc.communicate(stdin, timeout=self.probe_after_s if probe else self.timeout_s)
            except subprocess.TimeoutExpired:
                if not probe:
                    raise
                down = self._down()  # slow: a busy controller, or one that is gone (the client retries for ~MessageTimeout)
                if down is not None:
                    raise SiteUnavailable(self.name, argv, None, f"{down} (asked while {argv[0]} waited {self.probe_after_s:g} s)") from None
                out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            raise SiteUnavailable(self.name, argv, None, f"no answer within {self.timeout_s:g} s") from e
        finally:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.communicate()
        r = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check and r.returncode != 0:
            text = (r.stderr or r.stdout or "").strip()
            cls = SiteUnavailable if _UNAVAILABLE.search(text) else SchedulerError
            raise cls(self.name, argv, r.returncode, text)
        return r

    def _listing(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """:meth:`_run` for ``squeue`` / ``sacct``, each at most once per :attr:`listing_interval_s` (start to start)."""
        if self.listing_interval_s > 0:
            with self._listing_lock:
                # from the later of the last call's turn and its process's actual start (a thread
                # descheduled between the two under load must not let the next start early)
                last = max(self._listing_started.get(argv[0], -math.inf), self._spawned.get(argv[0], -math.inf))
                if last > -math.inf:
                    wait_s = last + self.listing_interval_s - time.monotonic()
                    if wait_s > 0:
                        time.sleep(wait_s)
                self._listing_started[argv[0]] = time.monotonic()
        return self._run(argv, **kw)

    def _down(self) -> str | None:
        """None if the controller answers ``scontrol ping``, else what it said (with the slurm.conf)."""
        r = self._run(["scontrol", "ping"], check=False)
        if r.returncode == 0 and " is UP" in r.stdout:
            return None
        text = (r.stdout.splitlines()[0] if r.stdout.strip() else "") or r.stderr.strip() or "controller does not answer"
        return f"{text} (SLURM_CONF={self.slurm_conf})"

    def _ping(self) -> None:
        """Raise :class:`SiteUnavailable` unless the controller answers ``scontrol ping``."""
        down = self._down()
        if down is not None:
            raise SiteUnavailable(self.name, ["scontrol", "ping"], None, down)

    def available(self) -> bool:
        """True if the site's controller answers (``scontrol ping``); never raises for a down site."""
        try:
            self._ping()
        except SiteUnavailable:
            return False
        return True

    def _json(self, argv: list[str]) -> dict:
        r = self._run(argv)
        try:
            data = json.loads(r.stdout)
        except ValueError as e:
            raise SchedulerError(self.name, argv, r.returncode, f"output is not JSON ({e}): {r.stdout[:200]!r} {r.stderr}") from e
        errors = [e for e in data.get("errors") or [] if e]
        if errors:  # 22.05 reports a lost controller here, with exit status 0
            self._ping()
            text = "; ".join(f"{e.get('source', '')}: {e.get('description') or e.get('error')}" for e in errors)
            raise SchedulerError(self.name, argv, r.returncode, text)
        return data

    # ---- script
    def render_script(self, spec: JobSpec) -> str:
        def q(value) -> str:
            value = str(value)
            return f'"{value}"' if re.search(r"\s", value) else value

        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={spec.name}",
            f"#SBATCH --nodes={spec.nodes}",
            f"#SBATCH --ntasks={spec.ntasks}",
            f"#SBATCH --cpus-per-task={spec.cpus_per_task}",
            f"#SBATCH --time={time_dhms(spec.walltime_s)}",
        ]
        if spec.partition:
            lines.append(f"#SBATCH --partition={q(spec.partition)}")
        if spec.account:
            lines.append(f"#SBATCH --account={q(spec.account)}")
        if spec.workdir is not None:
            lines.append(f"#SBATCH --chdir={q(spec.workdir)}")
        if spec.stdout:
            lines.append(f"#SBATCH --output={q(spec.stdout)}")
        lines += render_setup(self.name, spec)
        lines.append(spec.command)
        return "\n".join(lines) + "\n"

    # ---- submission
    def submit(self, spec: JobSpec) -> str:
        script = self.render_script(spec)
        self._ping()
        r = self._run(["sbatch", "--parsable"], stdin=script)
        job_id = r.stdout.strip().split(";")[0]
        if not _JOB_ID.match(job_id):
            raise SchedulerError(self.name, ["sbatch", "--parsable"], r.returncode, f"unexpected output {r.stdout!r} {r.stderr}")
        return job_id

    def cancel(self, job_id: str) -> None:
        job_id = str(job_id)
        if not _JOB_ID.match(job_id):
            raise SchedulerError(self.name, ["scancel", job_id], None, f"{job_id!r} is not a Slurm job id")
        self._ping()
        r = self._run(["scancel", job_id], check=False)
        text = (r.stderr or "").strip()
        if r.returncode != 0 and not re.search(r"Invalid job id|already completing or completed|Job has already finished", text, re.I):
            cls = SiteUnavailable if _UNAVAILABLE.search(text) else SchedulerError
            raise cls(self.name, ["scancel", job_id], r.returncode, text)

    # ---- status
    def _squeue_jobs(self) -> list[dict]:
        """The whole ``squeue --json`` listing (what :meth:`queue` and :meth:`status` read before issue #16;
        kept for comparison: the benchmark's old poll, the testbed test that the formatted listing agrees)."""
        return self._json(["squeue", "--json"]).get("jobs") or []

    def _from_squeue(self, j: dict) -> JobStatus:
        state = map_state(j.get("job_state"))
        ended = state not in _ACTIVE and state != JobState.UNKNOWN
        never_ran = ended and not j.get("nodes")  # e.g. cancelled while pending: no start, no exit code
        reason = j.get("state_reason")
        raw_exit = _num(j.get("exit_code"))
        return JobStatus(
            job_id=str(j.get("job_id")),
            state=state,
            name=j.get("name"),
            reason=None if reason in (None, "", "None") else reason,
            submit_time=_epoch(j.get("submit_time")),
            start_time=_epoch(j.get("start_time")) if state != JobState.UNKNOWN and not never_ran else None,
            end_time=_epoch(j.get("end_time")) if ended else None,
            exit_code=wait_status_exit_code(raw_exit) if ended and not never_ran and raw_exit is not None else None,
            cpus=_num(j.get("cpus")),
            nodes=_num(j.get("node_count")),
            time_limit_s=_time_limit_s(j.get("time_limit")),
        )

    def jobcomp_path(self) -> Path | None:
        """The site's jobcomp/filetxt file (``JobCompLoc``), or None if the site does not write one.

        Asked once (``scontrol show config``, else the slurm.conf); a definite answer, file or none, is
        kept (every :meth:`status` asks), an unanswered one is asked again next time."""
        if self._jobcomp is None and not self._no_jobcomp:
            loc = comp_type = None
            r = self._run(["scontrol", "show", "config"], check=False)
            text = r.stdout if r.returncode == 0 else ""
            answered = r.returncode == 0
            if not text:
                try:
                    text = self.slurm_conf.read_text()
                    answered = True
                except OSError:
                    text = ""
            for line in text.splitlines():
                m = re.match(r"^\s*(JobCompLoc|JobCompType)\s*=\s*(\S*)", line, re.I)
                if m:
                    if m.group(1).lower() == "jobcomploc":
                        loc = m.group(2)
                    else:
                        comp_type = m.group(2)
            if comp_type and "filetxt" in comp_type and loc:
                self._jobcomp = Path(loc)
            else:
                self._no_jobcomp = answered
        return self._jobcomp

    def jobcomp_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Ended jobs found in the jobcomp/filetxt file (the last line per job id wins), read
        incrementally from where the previous call stopped (:class:`~lab.hpc.schedulers.slurm_poll.JobcompReader`)."""
        path = self.jobcomp_path()
        if path is None or not job_ids:
            return {}
        if self._jobcomp_reader is None or self._jobcomp_reader.path != path:
            self._jobcomp_reader = JobcompReader(path, parse_jobcomp_line, map_state)
        return self._jobcomp_reader.status(job_ids)

    def recorded_ends(self, job_ids: list[str], *, lookup: bool = True) -> dict[str, JobStatus]:
        """Ended jobs among ``job_ids`` that the site's jobcomp file already records, with no call to
        the controller (``{}`` where the site writes no such file; with ``lookup=False`` also while
        the file's place is not known yet, instead of asking ``scontrol show config`` for it).

        Slurm writes a job's completion record when its batch script ends, while ``squeue`` goes on
        listing the job as COMPLETING until the node has reported its epilog done: with hundreds of
        jobs ending at once that took seconds (issue #16), so :meth:`status` and the continuation
        service read the record first. A record in a state that is not an end (``REQUEUED``: the job
        will run again) is not taken; squeue answers for that job."""
        if not job_ids or (not lookup and self._jobcomp is None) or self.jobcomp_path() is None:
            return {}
        return {i: st for i, st in self.jobcomp_status([str(j) for j in job_ids]).items()
                if st.state not in _ACTIVE and st.state != JobState.UNKNOWN}

    def new_ends(self) -> dict[str, JobStatus]:
        """Ended jobs whose completion records were appended to the jobcomp file since the previous
        call (every user's: the caller keeps the jobs it watches), read from where the last call
        stopped (:class:`~lab.hpc.schedulers.slurm_poll.JobcompTail`; no controller call). ``{}`` where
        the site writes no such file, and until its place is known (:meth:`jobcomp_path`, learnt by the
        first :meth:`status`): the first call only marks the file's end. Records in a state that is not
        an end (``REQUEUED``) are left out, as in :meth:`recorded_ends`."""
        if self._jobcomp is None:
            return {}
        if self._jobcomp_tail is None or self._jobcomp_tail.path != self._jobcomp:
            self._jobcomp_tail = JobcompTail(self._jobcomp, parse_jobcomp_line, map_state)
            return {}
        return {i: st for i, st in self._jobcomp_tail.read().items() if st.state not in _ACTIVE and st.state != JobState.UNKNOWN}

    def completed_status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Ended jobs among ``job_ids`` from the completion records alone, without ``squeue``: the
        jobcomp file (incremental read) if the site writes one, else one ``sacct -X -j`` call."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        if self.jobcomp_path() is not None:
            return self.jobcomp_status(ids)
        return sacct_watched(self.name, self._listing, ids, map_state)

    def status(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Each job's status: first the jobs the jobcomp file records as ended (:meth:`recorded_ends`,
        no controller call), then one ``squeue -j <the other ids>`` call (not the whole queue: its cost does
        not grow with the jobs other users hold), then the completion records for those squeue no
        longer lists (:meth:`completed_status`); jobs found nowhere are UNKNOWN. The squeue call is
        for :attr:`user`'s jobs only (``-u``: the controller then sends only that user's records);
        a job found neither there nor in the completion records is asked for again without it."""
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        if not ids:
            return {}
        out = self.recorded_ends(ids)  # ended by the completion records: squeue may still say COMPLETING
        listed = [i for i in ids if i not in out]
        if listed:
            out.update(squeue_watched(self.name, self._listing, listed, map_state, user=self.user))
        missing = [i for i in ids if i not in out]
        if missing:
            out.update(self.completed_status(missing))
        foreign = [i for i in ids if i not in out]
        if foreign and self.user:  # another user's job (never the federation's own): ask squeue without the user filter
            out.update(squeue_watched(self.name, self._listing, foreign, map_state))
        for i in ids:
            out.setdefault(i, JobStatus(job_id=i, state=JobState.UNKNOWN, reason="not in squeue nor in the job completion file"))
        return {i: out[i] for i in ids}

    def _nodes(self) -> list[dict]:
        return self._json(["sinfo", "--json"]).get("nodes") or []

    @staticmethod
    def _node_state(n: dict) -> str:
        state = n.get("state")
        parts = state if isinstance(state, list) else [state or ""]
        parts = parts + list(n.get("state_flags") or [])
        return " ".join(str(p) for p in parts).lower()

    def queue(self) -> SiteQueue:
        """The site's whole queue now (every user's active jobs: one ``squeue -O`` listing,
        :func:`~lab.hpc.schedulers.slurm_poll.squeue_queue`) and its CPUs (``sinfo --json``)."""
        now = time.time()
        jobs = [s for s in squeue_queue(self.name, self._listing, map_state) if s.state in _ACTIVE]
        nodes = self._nodes()
        total = sum(_num(n.get("cpus")) or 0 for n in nodes)
        idle = sum(0 if any(w in self._node_state(n) for w in _NOT_IDLE) else (_num(n.get("idle_cpus")) or 0) for n in nodes)
        return SiteQueue(
            site=self.name,
            time=now,
            pending=sum(j.state == JobState.PENDING for j in jobs),
            running=sum(j.state == JobState.RUNNING for j in jobs),
            total_cpus=total,
            idle_cpus=idle,
            jobs=jobs,
        )

    def estimated_start(self, spec: JobSpec) -> float | None:
        script = self.render_script(spec)
        self._ping()
        r = self._run(["sbatch", "--test-only"], stdin=script)
        m = _TEST_ONLY.search(r.stderr + r.stdout)
        return parse_slurm_time(m.group(1)) if m else None

    def capabilities(self) -> Capabilities:
        self._ping()
        r = self._run(["sinfo", "-h", "-o", "%P"])
        parts = [p.strip() for p in r.stdout.split() if p.strip()]
        default = [p.rstrip("*") for p in parts if p.endswith("*")]
        partitions = default + [p for p in dict.fromkeys(p.rstrip("*") for p in parts) if p not in default]
        nodes = self._nodes()
        return Capabilities(
            scheduler="slurm",
            partitions=partitions,
            total_cpus=sum(_num(n.get("cpus")) or 0 for n in nodes),
            nodes=len({n.get("name") for n in nodes}),
            estimated_start=True,
        )

    def close(self) -> None:
        """Nothing to release (every call is its own subprocess); present for symmetry with LocalScheduler."""
