"""Status polling for watched Slurm jobs that costs the same however many jobs the site holds.

A continuation service watches a few hundred or thousand jobs of its own on sites whose queues
hold many more (every user's jobs). Fetching and parsing the whole ``squeue --json`` each poll
grows with the site's queue (issue #16 measured 45 -> 202 ms median with 400 jobs held by one
small site); Slurm 22.05's ``squeue --json`` also ignores ``--jobs``. So the watched jobs are asked
for by id, in one call per poll:

* :func:`squeue_watched`: ``squeue -h --noconvert -t all -j ID,ID,... -O <fields>`` (one call for
  any number of ids; ``-O`` with ``|`` separators, the job name last so a name with spaces or
  ``|`` survives). Slurm answers "Invalid job id specified" (exit 1) when the only id asked
  for is no longer known; that is "not listed", not an error.
* :class:`JobcompReader`: jobs that left ``squeue`` (older than ``MinJobAge``, possibly between
  two polls) are found in the ``jobcomp/filetxt`` file, read **incrementally** from the offset
  where the previous read stopped (a partial last line is left for the next read; a file that
  shrank or was replaced is read again from the start). Only the lines of jobs the caller has
  asked about are kept. A job asked about for the first time after it already left squeue is
  looked up once in the part of the file read before (a catch-up read), so it is never lost.
* :func:`sacct_watched`: where the site keeps no jobcomp file but runs accounting,
  ``sacct -X -n -P -j ID,ID,... --format=...`` (one call).

Parsl's sacct polls hung with thousands of finished jobs (Parsl #3814) and lost blocks when
squeue forgot a finished job (Parsl #1588): here the calls carry only the watched ids, and a
job is looked for in squeue first, then in the completion records, never dropped.

Times are epoch seconds (Slurm prints the controller's local time; parsed with
:func:`~lab.hpc.schedulers.slurm.parse_slurm_time`'s rule).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lab.hpc.errors import SchedulerError, SiteUnavailable
from lab.hpc.schedulers.base import JobState, JobStatus, wait_status_exit_code

__all__ = [
    "SQUEUE_FIELDS", "JobcompReader", "parse_slurm_time", "parse_squeue_lines", "parse_time_limit", "sacct_watched", "squeue_queue",
    "squeue_watched",
]

#: squeue ``-O`` fields, ``|``-separated; Name last (it may hold spaces and ``|``).
SQUEUE_FIELDS = (
    "JobID:|,State:|,exit_code:|,SubmitTime:|,StartTime:|,EndTime:|,NumCPUs:|,NumNodes:|,TimeLimit:|,Reason:|,NodeList:|,Name:"
)
_N_FIELDS = 12
_SACCT_FORMAT = "JobID,State,ExitCode,Submit,Start,End,AllocCPUS,NNodes,Timelimit,JobName"
_ACTIVE = (JobState.PENDING, JobState.RUNNING)
_NO_NODES = ("", "(null)", "N/A", "None assigned")
_UNAVAILABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|connect failure|Socket timed out|"
    r"Zero Bytes were transmitted|Communication connection failure|Transport endpoint is not connected",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=65536)
def parse_slurm_time(text: str | None) -> float | None:
    """Slurm's ``YYYY-MM-DDTHH:MM:SS`` in this machine's local time as epoch seconds (None for Unknown/None/empty
    or unparseable text)."""
    # cached: a poll parses three stamps for each of hundreds of jobs, most of them the same few
    # seconds (time.strptime was a third of a 2,000-job poll's CPU time, issue #16)
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return float(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return None


def parse_time_limit(text: str | None) -> int | None:
    """Slurm's time limit (``"1:00"`` m:ss, ``"1:00:00"``, ``"2-03:04:05"``, ``"30"`` minutes) in seconds;
    None for ``UNLIMITED``, ``INVALID``, ``N/A`` or anything unparseable."""
    if not text:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        return None
    days = int(m.group(1) or 0)
    parts = [int(p) for p in m.group(2, 3, 4) if p is not None]
    if m.group(1) is not None:  # d-h[:m[:s]]
        parts += [0] * (3 - len(parts))
        h, mi, s = parts
    elif len(parts) == 3:
        h, mi, s = parts
    elif len(parts) == 2:
        h, mi, s = 0, parts[0], parts[1]
    else:  # plain minutes
        h, mi, s = 0, parts[0], 0
    return ((days * 24 + h) * 60 + mi) * 60 + s


def _check(site: str, argv: list[str], r) -> None:
    text = (r.stderr or r.stdout or "").strip()
    cls = SiteUnavailable if _UNAVAILABLE.search(text) else SchedulerError
    raise cls(site, argv, r.returncode, text)


def squeue_watched(
    site: str, run: Callable, job_ids: Iterable[str], map_state: Callable[[str], JobState], *, user: str | None = None
) -> dict[str, JobStatus]:
    """The jobs among ``job_ids`` that ``squeue`` still lists (any state), with one ``squeue`` call.

    ``run(argv, check=False)`` runs a command for the site (returns a ``CompletedProcess``);
    ``map_state`` maps a Slurm state name to :class:`JobState`. Ended jobs carry ``exit_code``
    (squeue's wait status decoded) unless they never ran. With ``user``, only that user's jobs
    are asked for (``-u USER``): squeue then loads just that user's jobs from the controller
    (with several ``-j`` ids and no single user it loads every job and filters them itself, so
    its cost would still grow with other users' jobs).

    Raises
    ------
    SiteUnavailable
        The controller does not answer.
    SchedulerError
        squeue failed otherwise.
    """
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return {}
    argv = ["squeue", "-h", "--noconvert", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FIELDS] + (["-u", user] if user else [])
    r = run(argv, check=False)
    if r.returncode != 0:
        if re.search(r"Invalid job id specified", r.stderr or "") and not r.stdout.strip():
            return {}  # the one id asked for is no longer known to the controller
        _check(site, argv[:7] + [f"<{len(ids)} ids>"] + argv[8:], r)
    wanted = set(ids)
    return {st.job_id: st for st in parse_squeue_lines(r.stdout, map_state, wanted)}


def squeue_queue(site: str, run: Callable, map_state: Callable[[str], JobState]) -> list[JobStatus]:
    """Every job of every user that ``squeue`` lists in its default states (pending, running,
    completing, ...), with one ``squeue -h --all --noconvert -O <SQUEUE_FIELDS>`` call: a site's whole queue,
    for queue samples.

    Not ``squeue --json``: in Slurm 22.05 its serializer dominates the call and grows with the queue
    (1.4 s for 2,000 held jobs on an idle 2-core VM, up to 7.5 s while hundreds of jobs end, issue #16),
    while the formatted listing carries the same facts (a pending job's ``StartTime`` is the backfill's
    estimate, as ``start_time`` in the JSON).

    Raises
    ------
    SiteUnavailable
        The controller does not answer.
    SchedulerError
        squeue failed otherwise.
    """
    argv = ["squeue", "-h", "--all", "--noconvert", "-O", SQUEUE_FIELDS]  # --all: hidden partitions' jobs too
    r = run(argv, check=False)
    if r.returncode != 0:
        _check(site, argv, r)
    return parse_squeue_lines(r.stdout, map_state)


def parse_squeue_lines(text: str, map_state: Callable[[str], JobState], wanted: set[str] | None = None) -> list[JobStatus]:
    """The jobs of ``squeue -h --noconvert -O SQUEUE_FIELDS`` output (of ``wanted`` ids only, if given).

    Lines that do not have the fields are skipped. Ended jobs carry ``exit_code`` (squeue's wait
    status decoded) unless they never ran (no node list); a pending job's ``start_time`` is Slurm's
    estimate (None without one)."""
    out = []
    for line in text.splitlines():
        f = line.split("|", _N_FIELDS - 1)
        if len(f) < _N_FIELDS or (wanted is not None and f[0] not in wanted):
            continue
        job_id, state_name, raw_exit, submit, start, end, cpus, nodes, limit, reason, nodelist, name = f
        state = map_state(state_name)
        ended = state not in _ACTIVE and state != JobState.UNKNOWN
        never_ran = ended and nodelist.strip() in _NO_NODES
        out.append(JobStatus(
            job_id=job_id,
            state=state,
            name=name or None,
            reason=None if reason in ("", "None", "(null)") else reason,
            submit_time=parse_slurm_time(submit),
            start_time=parse_slurm_time(start) if state != JobState.UNKNOWN and not never_ran else None,
            end_time=parse_slurm_time(end) if ended else None,
            exit_code=wait_status_exit_code(int(raw_exit)) if ended and not never_ran and raw_exit.lstrip("-").isdigit() else None,
            cpus=int(cpus) if cpus.isdigit() else None,
            nodes=int(nodes) if nodes.isdigit() else None,
            time_limit_s=parse_time_limit(limit),
        ))
    return out


def _jobcomp_status(job_id: str, rec: dict[str, str], map_state: Callable[[str], JobState]) -> JobStatus:
    never_ran = rec.get("NodeCnt") == "0"
    exit_code = None
    if ":" in rec.get("ExitCode", "") and not never_ran:
        code, sig = (int(x) for x in rec["ExitCode"].split(":")[:2])
        exit_code = 128 + sig if sig else code
    return JobStatus(
        job_id=job_id,
        state=map_state(rec.get("JobState")),
        name=rec.get("Name"),
        submit_time=parse_slurm_time(rec.get("SubmitTime")),
        start_time=None if never_ran else parse_slurm_time(rec.get("StartTime")),
        end_time=parse_slurm_time(rec.get("EndTime")),
        exit_code=exit_code,
        cpus=int(rec["ProcCnt"]) if rec.get("ProcCnt", "").isdigit() else None,
        nodes=int(rec["NodeCnt"]) if rec.get("NodeCnt", "").isdigit() else None,
        time_limit_s=int(rec["TimeLimit"]) * 60 if rec.get("TimeLimit", "").isdigit() else None,
    )


class JobcompReader:
    """A ``jobcomp/filetxt`` file read incrementally: each :meth:`status` reads only what was
    appended since the previous one (see the module docstring).

    Parameters
    ----------
    path : path
        The site's ``JobCompLoc``.
    parse_line : callable
        ``"JobId=3 JobState=FAILED ..."`` -> dict (:func:`~lab.hpc.schedulers.slurm.parse_jobcomp_line`).
    map_state : callable
        Slurm state name -> :class:`JobState`.
    forget_after_s : float
        A job not asked about for this many seconds is forgotten (its line and interest dropped, as
        :meth:`forget`): a watcher stops asking once a job's end is recorded, so without this the
        reader would keep every job line ever asked about. Asked about again later, it is found
        by the catch-up read, so forgetting never loses a job.

    Attributes
    ----------
    offset : int
        Bytes of the file read so far.
    bytes_read : int
        Bytes read in total (catch-up reads included): a poll's cost.
    """

    def __init__(self, path: str | Path, parse_line: Callable[[str], dict[str, str]], map_state: Callable[[str], JobState],
                 *, forget_after_s: float = 600.0):
        self.path = Path(path)
        self.forget_after_s = float(forget_after_s)
        self._asked: dict[str, float] = {}  # job id -> time.monotonic() it was last asked about
        self._parse, self._map = parse_line, map_state
        self.offset = 0
        self.bytes_read = 0
        self._ident: tuple[int, int] | None = None  # (device, inode) of the file read so far
        self._interest: set[str] = set()
        self._lines: dict[str, str] = {}  # job id -> its last line (jobs asked about only)
        self._lock = threading.Lock()

    def _scan(self, start: int, stop: int | None, wanted: set[str]) -> int:
        """Keep the lines of ``wanted`` jobs in bytes [start, stop) (to the last full line); returns where it stopped."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(start)
                data = fh.read() if stop is None else fh.read(max(0, stop - start))
        except OSError:
            return start
        self.bytes_read += len(data)
        cut = data.rfind(b"\n") + 1  # a partial last line waits for the next read
        for raw in data[:cut].splitlines():
            if not raw.startswith(b"JobId="):
                continue
            line = raw.decode(errors="replace")
            job_id = line[6:].split(" ", 1)[0]
            if job_id in wanted:
                self._lines[job_id] = line
        return start + cut

    def status(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        """Ended jobs among ``job_ids`` found in the file (the last line per job wins). Thread-safe (the
        continuation service reads the file every poll while a site's worker may be asking too)."""
        ids = {str(j) for j in job_ids}
        if not ids:
            return {}
        with self._lock:
            return self._status_of(ids)

    def _status_of(self, ids: set[str]) -> dict[str, JobStatus]:
        now = time.monotonic()
        stale = [j for j, t in self._asked.items() if now - t > self.forget_after_s and j not in ids]
        if stale:
            self._forget(stale)
        self._asked.update(dict.fromkeys(ids, now))
        try:
            st = os.stat(self.path)
        except OSError:
            return {i: self._status(i) for i in ids if i in self._lines}
        ident = (st.st_dev, st.st_ino)
        if self._ident != ident or st.st_size < self.offset:  # rotated, replaced or truncated: start again
            self._ident, self.offset = ident, 0
            self._lines = {k: v for k, v in self._lines.items() if k in self._interest}
        new = ids - self._interest
        self._interest |= ids
        read_before = self.offset
        self.offset = self._scan(self.offset, None, self._interest)
        late = {i for i in new if i not in self._lines}
        if late and read_before:  # first asked about after its line had already been read past
            self._scan(0, read_before, late)
        return {i: self._status(i) for i in ids if i in self._lines}

    def _status(self, job_id: str) -> JobStatus:
        return _jobcomp_status(job_id, self._parse(self._lines[job_id]), self._map)

    def forget(self, job_ids: Iterable[str]) -> None:
        """Stop keeping the lines of these jobs (e.g. once their end has been recorded)."""
        with self._lock:
            self._forget(job_ids)

    def _forget(self, job_ids: Iterable[str]) -> None:
        for j in job_ids:
            self._interest.discard(str(j))
            self._lines.pop(str(j), None)
            self._asked.pop(str(j), None)


class JobcompTail:
    """The completion records appended to a ``jobcomp/filetxt`` file since the previous :meth:`read`,
    every job's (the caller keeps those it watches): a poll costs what was appended, not what is
    watched. It starts at the file's end (what was recorded before is :class:`JobcompReader`'s
    catch-up); a rotated, replaced or truncated file is read from its start.

    Parameters are those of :class:`JobcompReader`.
    """

    def __init__(self, path: str | Path, parse_line: Callable[[str], dict[str, str]], map_state: Callable[[str], JobState]):
        self.path = Path(path)
        self._parse, self._map = parse_line, map_state
        self._lock = threading.Lock()
        try:
            st = os.stat(self.path)
            self._ident, self.offset = (st.st_dev, st.st_ino), st.st_size
        except OSError:
            self._ident, self.offset = None, 0
        self.bytes_read = 0

    def read(self) -> dict[str, JobStatus]:
        """``{job_id: JobStatus}`` of the lines appended since the last call (the last line per job wins);
        a partial last line waits for the next call."""
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError:
                return {}
            ident = (st.st_dev, st.st_ino)
            if self._ident != ident or st.st_size < self.offset:
                self._ident, self.offset = ident, 0
            if st.st_size == self.offset:
                return {}
            try:
                with self.path.open("rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read()
            except OSError:
                return {}
            cut = data.rfind(b"\n") + 1
            self.offset += cut
            self.bytes_read += len(data)
            lines: dict[str, str] = {}
            for raw in data[:cut].splitlines():
                if raw.startswith(b"JobId="):
                    line = raw.decode(errors="replace")
                    lines[line[6:].split(" ", 1)[0]] = line
        return {j: _jobcomp_status(j, self._parse(line), self._map) for j, line in lines.items()}


def sacct_watched(site: str, run: Callable, job_ids: Iterable[str], map_state: Callable[[str], JobState]) -> dict[str, JobStatus]:
    """Ended jobs among ``job_ids`` from Slurm accounting, with one ``sacct -X -j`` call; ``{}`` when
    the site has no accounting (``sacct`` says the storage is disabled or slurmdbd is not there).

    Raises :class:`SiteUnavailable` if the controller or accounting daemon does not answer."""
    ids = list(dict.fromkeys(str(j) for j in job_ids))
    if not ids:
        return {}
    argv = ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), f"--format={_SACCT_FORMAT}"]
    r = run(argv, check=False)
    if r.returncode != 0:
        text = (r.stderr or "").strip()
        if re.search(r"accounting storage is disabled|not running a supported accounting_storage|slurmdbd", text, re.I) and not _UNAVAILABLE.search(text):
            return {}
        _check(site, argv[:5] + [f"<{len(ids)} ids>"] + argv[6:], r)
    wanted, out = set(ids), {}
    for line in r.stdout.splitlines():
        f = line.split("|", 9)
        if len(f) < 10 or f[0] not in wanted:
            continue
        job_id, state_name, exit_code, submit, start, end, cpus, nodes, limit, name = f
        state = map_state(state_name)
        if state in _ACTIVE or state == JobState.UNKNOWN:
            continue  # squeue answers for active jobs
        never_ran = nodes.strip() in ("", "0")
        code = None
        if ":" in exit_code and not never_ran:
            c, s = (int(x) for x in exit_code.split(":")[:2])
            code = 128 + s if s else c
        out[job_id] = JobStatus(
            job_id=job_id, state=state, name=name or None, submit_time=parse_slurm_time(submit),
            start_time=None if never_ran else parse_slurm_time(start), end_time=parse_slurm_time(end), exit_code=code,
            cpus=int(cpus) if cpus.isdigit() else None, nodes=int(nodes) if nodes.isdigit() else None,
            time_limit_s=parse_time_limit(limit),
        )
    return out
