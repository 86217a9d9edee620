"""Continuation polling at scale (issue #16), without a Slurm install: the real SlurmScheduler and
ContinuationService against a fake controller that answers squeue/sinfo/sacct the way Slurm 22.05
does. Checks: only the watched ids are asked for (never the whole ``squeue --json`` for a job poll),
a job that leaves squeue between two polls is found in the completion file (read incrementally),
nothing is resumed twice, and at most one squeue per site per second.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from lab.hpc.continuation import ContinuationService, Continuations, job_key
from lab.hpc.schedulers.base import JobState
from lab.hpc.schedulers.slurm import SlurmScheduler, map_state, parse_jobcomp_line
from lab.hpc.schedulers.slurm_poll import JobcompReader, parse_time_limit, sacct_watched

HANDLER = "tests.continuation_handlers:record"
T = "2026-12-01T10:00:00"


def _jobcomp_line(job_id: str, state: str = "COMPLETED", exit_code: str = "0:0", name: str = "job x") -> str:
    return (f"JobId={job_id} UserId=u(1) GroupId=g(1) Name={name} JobState={state} Partition=debug TimeLimit=1 "
            f"StartTime={T} EndTime={T} NodeList=n0 NodeCnt=1 ProcCnt=1 WorkDir=/tmp ExitCode={exit_code} SubmitTime={T}\n")


class FakeSlurm:
    """One site's controller: ``jobs`` (id -> state) listed by squeue; ended jobs written to ``jobcomp``."""

    def __init__(self, jobcomp: Path, other_users: int = 0):
        self.jobcomp = jobcomp
        jobcomp.write_text("")
        self.jobs: dict[str, str] = {f"9{i:05d}": "PENDING" for i in range(other_users)}  # other users' held jobs
        self.calls: list[tuple[float, list[str]]] = []
        self.lock = threading.Lock()

    def end(self, job_id: str, state: str = "COMPLETED", exit_code: str = "0:0", purge: bool = False) -> None:
        with self.lock:
            self.jobs[job_id] = state
            with self.jobcomp.open("a") as fh:
                fh.write(_jobcomp_line(job_id, state, exit_code))
            if purge:  # MinJobAge passed: squeue forgets it
                del self.jobs[job_id]

    def run(self, argv, *, stdin=None, check=True):
        with self.lock:
            self.calls.append((time.monotonic(), list(argv)))
            out = ""
            if argv[0] == "squeue" and "--json" in argv:
                out = json.dumps({"errors": [], "jobs": [
                    {"job_id": int(j), "job_state": s, "name": "x", "nodes": "n0" if s != "PENDING" else "", "submit_time": 1, "cpus": 1}
                    for j, s in self.jobs.items()]})
            elif argv[0] == "squeue":
                ids = argv[argv.index("-j") + 1].split(",")
                mine_only = "-u" in argv  # another user's jobs are the ones named 9xxxxx
                listed = [i for i in ids if i in self.jobs and not (mine_only and i.startswith("9"))]
                if len(ids) == 1 and not listed:
                    return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
                for i in listed:
                    s = self.jobs[i]
                    ended = s not in ("PENDING", "RUNNING")
                    start = T if s != "PENDING" else "N/A"
                    out += f"{i}|{s}|{256 if s == 'FAILED' else 0}|{T}|{start}|{T if ended else 'N/A'}|1|1|1:00|None|{'n0' if s != 'PENDING' else ''}|job x\n"
            elif argv[0] == "sinfo":
                out = json.dumps({"errors": [], "nodes": [{"name": "n0", "state": "idle", "cpus": 4, "idle_cpus": 4}]})
            elif argv[:2] == ["scontrol", "show"]:
                out = f"JobCompLoc = {self.jobcomp}\nJobCompType = jobcomp/filetxt\n"
            return subprocess.CompletedProcess(argv, 0, out, "")

    def squeue_calls(self) -> list[tuple[float, list[str]]]:
        return [c for c in self.calls if c[1][0] == "squeue"]


def _scheduler(fake: FakeSlurm, monkeypatch) -> SlurmScheduler:
    sched = SlurmScheduler("alpha", "/nonexistent/slurm.conf")
    monkeypatch.setattr(sched, "_run", fake.run)
    monkeypatch.setattr(sched, "_ping", lambda: None)
    return sched


def test_status_asks_squeue_for_the_watched_ids_only(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path / "jobcomp.log", other_users=300)
    sched = _scheduler(fake, monkeypatch)
    fake.jobs.update({"1": "RUNNING", "2": "PENDING"})
    fake.end("3", "FAILED", "3:0", purge=True)
    got = sched.status(["1", "2", "3"])
    assert {k: v.state for k, v in got.items()} == {"1": JobState.RUNNING, "2": JobState.PENDING, "3": JobState.FAILED}
    assert got["3"].exit_code == 3 and got["3"].name == "job x"
    squeues = fake.squeue_calls()
    # one squeue, carrying exactly the watched ids, for this user's jobs; not the whole queue (--json lists every user's jobs)
    assert len(squeues) == 1 and "--json" not in squeues[0][1]
    argv = squeues[0][1]
    assert argv[argv.index("-j") + 1] == "1,2,3" and argv[argv.index("-u") + 1] == sched.user
    # a job found nowhere for this user (another user's, or gone) is asked for once more without the user filter
    got = sched.status(["1", "900007", "4"])
    assert {k: v.state for k, v in got.items()} == {"1": JobState.RUNNING, "900007": JobState.PENDING, "4": JobState.UNKNOWN}
    last = fake.squeue_calls()[-1][1]
    assert len(fake.squeue_calls()) == 3 and "-u" not in last and last[last.index("-j") + 1] == "900007,4"


def test_a_job_that_leaves_squeue_between_two_polls_is_found_and_resumed_once(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path / "jobcomp.log", other_users=50)
    sched = _scheduler(fake, monkeypatch)
    db, calls = tmp_path / "lab.db", tmp_path / "calls.txt"
    cont = Continuations(db)
    for j in ("11", "12", "13"):
        fake.jobs[j] = "RUNNING"
        cont.watch_job("alpha", j)
        cont.register(job_key("alpha", j), HANDLER, args={"path": str(calls), "tag": j})
    service = ContinuationService(db, {"alpha": sched}, queue_every_s=None, site_min_interval_s=0.0)
    service.poll_once()
    fake.end("11", purge=True)  # ended and forgotten by squeue before the next poll
    fake.end("12", "FAILED", "2:0")  # ended, still listed
    service.poll_once()
    fake.end("13", "CANCELLED", "0:15", purge=True)
    service.poll_once()
    service.poll_once()  # nothing new: nothing appended twice
    kinds = [(e.key, e.kind) for e in cont.log.tail(kinds=["job.completed", "job.failed", "job.cancelled"])]
    assert kinds == [("alpha/11", "job.completed"), ("alpha/12", "job.failed"), ("alpha/13", "job.cancelled")]
    assert len(cont.resume_ready()) == 3 and cont.resume_ready() == []
    assert sorted(line.split()[-1] for line in calls.read_text().splitlines()) == ["11", "12", "13"]
    # the completion file was read from its last offset each time, not again from the start
    assert sched._jobcomp_reader.bytes_read == (tmp_path / "jobcomp.log").stat().st_size
    service.close()
    cont.close()


def test_at_most_one_squeue_per_site_per_second_with_queue_samples_on(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path / "jobcomp.log")
    sched = _scheduler(fake, monkeypatch)
    db = tmp_path / "lab.db"
    cont = Continuations(db)
    for j in range(1, 21):
        fake.jobs[str(j)] = "RUNNING"
        cont.watch_job("alpha", str(j))
    # poll often, sample the queue often: the service must still ask the site at most once a second
    service = ContinuationService(db, {"alpha": sched}, poll_s=0.05, queue_every_s=0.3, site_min_interval_s=0.5)
    stop = threading.Event()
    worker = threading.Thread(target=service.serve, args=(stop,))
    worker.start()
    time.sleep(0.6)
    fake.end("5", purge=True)
    time.sleep(1.6)
    stop.set()
    worker.join()
    times = [t for t, _ in fake.squeue_calls()]
    assert len(times) >= 3
    assert min(b - a for a, b in zip(times, times[1:])) >= 0.5 - 0.01  # one squeue (sample or job poll) per interval
    assert any("--json" in argv for _, argv in fake.squeue_calls())  # samples were taken, and served the job poll
    assert [e.key for e in cont.log.tail(kinds=["job.completed"])] == ["alpha/5"]
    service.close()
    cont.close()


def test_jobcomp_reader_reads_incrementally_and_catches_up(tmp_path):
    path = tmp_path / "jobcomp.log"
    path.write_text(_jobcomp_line("1") + _jobcomp_line("2", "FAILED", "1:0"))
    reader = JobcompReader(path, parse_jobcomp_line, map_state)
    assert set(reader.status(["1"])) == {"1"}
    size = path.stat().st_size
    assert reader.offset == size and reader.bytes_read == size
    # job 2's line was read past before anyone asked: a one-off catch-up read finds it
    assert reader.status(["2"])["2"].exit_code == 1
    # a partial last line is left for the next read
    partial = _jobcomp_line("3", "TIMEOUT")
    with path.open("a") as fh:
        fh.write(partial[:30])
    assert reader.status(["3"]) == {} and reader.offset == size
    with path.open("a") as fh:
        fh.write(partial[30:])
    assert reader.status(["3"])["3"].state == JobState.TIMEOUT
    # the last line per job wins (a requeued job ends twice)
    with path.open("a") as fh:
        fh.write(_jobcomp_line("3", "COMPLETED"))
    assert reader.status(["3"])["3"].state == JobState.COMPLETED
    # rotated: read from the start of the new file
    path.unlink()
    path.write_text(_jobcomp_line("4"))
    assert set(reader.status(["3", "4"])) == {"3", "4"}  # 3 is remembered, 4 read from the new file
    assert reader.offset == path.stat().st_size


def test_sacct_fallback_and_time_limits(tmp_path):
    def run(argv, *, check=False):
        assert argv[:5] == ["sacct", "-X", "-n", "-P", "-j"] and argv[5] == "7,8,9"
        out = f"7|COMPLETED|0:0|{T}|{T}|{T}|1|1|00:01:00|a|b\n8|CANCELLED by 0|0:15|{T}|{T}|{T}|1|1|1-00:00:00|x\n9|RUNNING|0:0|{T}|{T}|Unknown|1|1|UNLIMITED|r\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    got = sacct_watched("alpha", run, ["7", "8", "9"], map_state)
    assert set(got) == {"7", "8"} and got["7"].name == "a|b" and got["8"].exit_code == 15 + 128 and got["8"].time_limit_s == 86400

    def disabled(argv, *, check=False):
        return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Slurm accounting storage is disabled\n")

    assert sacct_watched("alpha", disabled, ["7"], map_state) == {}
    assert [parse_time_limit(t) for t in ("1:00", "1:00:00", "2-03:04:05", "30", "UNLIMITED", "2-3")] == [60, 3600, 183845, 1800, None, 183600]
