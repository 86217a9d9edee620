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
            elif argv[0] == "squeue" and "-j" not in argv:  # the whole queue, formatted (-O): default states only
                assert "-O" in argv and "-u" not in argv, argv
                listed = [i for i, s in self.jobs.items() if s in ("PENDING", "RUNNING")]
            elif argv[0] == "squeue":
                ids = argv[argv.index("-j") + 1].split(",")
                mine_only = "-u" in argv  # another user's jobs are the ones named 9xxxxx
                listed = [i for i in ids if i in self.jobs and not (mine_only and i.startswith("9"))]
                if len(ids) == 1 and not listed:
                    return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
            if argv[0] == "squeue" and "--json" not in argv:
                for i in listed:
                    s = self.jobs[i]
                    ended = s not in ("PENDING", "RUNNING")
                    start = T if s != "PENDING" else "N/A"
                    out += f"{i}|{s}|{256 if s == 'FAILED' else 0}|{T}|{start}|{T if ended else 'N/A'}|1|1|1:00|None|{'n0' if s != 'PENDING' else ''}|job x\n"
            if argv[0] == "sinfo":
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
    # one squeue, carrying exactly the watched ids that the completion records do not show ended (3 is read there
    # first), for this user's jobs; not the whole queue (--json lists every user's jobs)
    assert len(squeues) == 1 and "--json" not in squeues[0][1]
    argv = squeues[0][1]
    assert argv[argv.index("-j") + 1] == "1,2" and argv[argv.index("-u") + 1] == sched.user
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
    assert any("-j" not in argv for _, argv in fake.squeue_calls())  # samples were taken, and served the job poll
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


def test_queue_sample_is_one_formatted_squeue_listing_not_json(tmp_path, monkeypatch):
    """The whole-queue sample reads ``squeue -O`` (``--json`` took up to 7.5 s at 2,000 jobs and
    blocked the site's job poll, issue #16), every user's jobs, active ones only."""
    fake = FakeSlurm(tmp_path / "jobcomp.log", other_users=40)
    sched = _scheduler(fake, monkeypatch)
    fake.jobs.update({"1": "RUNNING", "2": "PENDING"})
    fake.end("3", "COMPLETED")  # ended, still listed by squeue -t all: not in the queue
    q = sched.queue()
    squeues = [argv for _, argv in fake.squeue_calls()]
    assert len(squeues) == 1 and "--json" not in squeues[0] and "-O" in squeues[0] and "-j" not in squeues[0]
    assert (q.pending, q.running, q.total_cpus, q.idle_cpus) == (41, 1, 4, 4)
    by_id = {j.job_id: j for j in q.jobs}
    assert len(by_id) == 42 and "3" not in by_id and by_id["1"].state is JobState.RUNNING and by_id["1"].time_limit_s == 60
    assert by_id["900007"].state is JobState.PENDING and by_id["2"].start_time is None  # no estimate yet: None, not 0


def _fake_slurm_bin(tmp_path: Path) -> Path:
    """Executables named like Slurm's client tools that log each call to ``calls.log``. squeue answers
    job 1 as running, after 1 s if the file ``slow`` exists, and like a client whose controller is
    gone (it retries for 20 s, then "Unable to contact") if ``down`` exists; scontrol ping says DOWN then."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    d = tmp_path
    scripts = {
        "squeue": f"""echo "squeue $*" >> {d}/calls.log
if [ -e {d}/down ]; then sleep 20; echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1; fi
if [ -e {d}/slow ]; then sleep 1; fi
echo "1|RUNNING|0|{T}|{T}|N/A|1|1|1:00|None|n0|job x"
""",
        "scontrol": f"""echo "scontrol $*" >> {d}/calls.log
if [ "$1" = ping ]; then
  if [ -e {d}/down ]; then echo "Slurmctld(primary) at vm is DOWN"; exit 1; fi
  echo "Slurmctld(primary) at vm is UP"
fi
""",
        "sinfo": f"""echo "sinfo $*" >> {d}/calls.log
echo '{{"errors": [], "nodes": [{{"name": "n0", "state": "idle", "cpus": 2, "idle_cpus": 2}}]}}'
""",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_polls_do_not_ping_first_and_a_down_controller_still_fails_fast(tmp_path, monkeypatch):
    """``scontrol ping`` before every poll was a third of a job poll's time at 2,000 jobs (issue #16):
    the polls run without it; a command slower than probe_after_s is checked on with a ping while it
    waits, so a controller that is gone still fails in about probe_after_s, not after the client's retries."""
    import pytest

    from lab.hpc.errors import SiteUnavailable

    monkeypatch.setenv("PATH", f"{_fake_slurm_bin(tmp_path)}:{__import__('os').environ['PATH']}")
    log = tmp_path / "calls.log"
    sched = SlurmScheduler("alpha", tmp_path / "slurm.conf", probe_after_s=0.3)
    sched.user = None
    for _ in range(3):
        assert sched.status(["1"])["1"].state is JobState.RUNNING
    # where the completion records are is asked once (the answer is kept), then only squeue
    calls = log.read_text().splitlines()
    assert calls[0] == "scontrol show config" and calls[1:] == [calls[1]] * 3, calls
    assert calls[1].startswith("squeue -h --noconvert -t all -j 1 -O"), calls
    for _ in range(3):
        assert sched.queue().running == 1
    calls = log.read_text().splitlines()
    assert len(calls) == 10 and not [c for c in calls[1:] if c.startswith("scontrol")], calls
    # slow but up: one ping while it waits, then the answer
    (tmp_path / "slow").touch()
    assert sched.status(["1"])["1"].state is JobState.RUNNING
    new = log.read_text().splitlines()[10:]
    assert len(new) == 2 and new[0].startswith("squeue") and new[1] == "scontrol ping"
    # gone: the ping says so and the waiting squeue is ended
    (tmp_path / "down").touch()
    t0 = time.monotonic()
    with pytest.raises(SiteUnavailable, match=r"alpha.*is DOWN"):
        sched.status(["1"])
    assert time.monotonic() - t0 < 5.0  # 20 s (the fake client's retries) before


def test_the_listing_guard_counts_from_when_the_last_squeue_started(tmp_path, monkeypatch):
    """At most one squeue per site per listing interval, counted between the processes' real starts: a thread
    descheduled between taking its turn and starting squeue (under load) used to let the next call start
    early (two squeue calls 0.1 s apart here; the scale benchmark saw two in one second)."""
    import lab.hpc.schedulers.slurm as slurm_module

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f'#!/bin/sh\ndate +%s.%N >> {tmp_path}/starts.log\necho "1|RUNNING|0|{T}|{T}|N/A|1|1|1:00|None|n0|job x"\n')
    (bin_dir / "squeue").chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")  # show config: no jobcomp file (the answer is kept)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    real_popen, late = subprocess.Popen, [True]

    def descheduled_once(argv, *a, **kw):
        if argv[0] == "squeue" and late[0]:
            late[0] = False
            time.sleep(0.3)  # between the guard's turn and the process start
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(slurm_module.subprocess, "Popen", descheduled_once)
    sched = SlurmScheduler("alpha", tmp_path / "slurm.conf", listing_interval_s=0.4)
    sched.user = None
    for _ in range(3):
        assert sched.status(["1"])["1"].state is JobState.RUNNING
    starts = [float(x) for x in (tmp_path / "starts.log").read_text().split()]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 3 and min(gaps) >= 0.4 - 0.01, gaps


def test_the_service_writes_an_end_from_the_completion_records_without_waiting_for_squeue(tmp_path, monkeypatch):
    """Between the sites' squeue turns, ``serve`` reads the completion records every poll: a job whose end Slurm
    has recorded (squeue still says COMPLETING, and the site's squeue is slow) is written within a poll, once;
    the squeue answer that arrives afterwards (RUNNING) neither reopens its watch nor writes a second event."""
    fake = FakeSlurm(tmp_path / "jobcomp.log")
    inner = fake.run

    def slow_squeue(argv, *, stdin=None, check=True):
        if argv[0] == "squeue":
            time.sleep(1.5)
        return inner(argv, stdin=stdin, check=check)

    sched = _scheduler(fake, monkeypatch)
    monkeypatch.setattr(sched, "_run", slow_squeue)
    db = tmp_path / "lab.db"
    cont = Continuations(db)
    fake.jobs["7"] = "RUNNING"
    cont.watch_job("alpha", "7")
    service = ContinuationService(db, {"alpha": sched}, poll_s=0.05, queue_every_s=None, site_min_interval_s=1.0)
    stop = threading.Event()
    worker = threading.Thread(target=service.serve, args=(stop,))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not [c for c in fake.squeue_calls()]:  # the site's first squeue is under way
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
        with fake.lock:  # Slurm records the end; squeue goes on listing the job (COMPLETING: running)
            fake.jobs["7"] = "COMPLETING"
            with fake.jobcomp.open("a") as fh:
                fh.write(_jobcomp_line("7"))
        ended_at = time.monotonic()
        while not cont.log.tail(kinds=["job.completed"], key=job_key("alpha", "7")):
            assert time.monotonic() - ended_at < 5
            time.sleep(0.01)
        seen_s = time.monotonic() - ended_at
        time.sleep(3.5)  # the in-flight squeue (RUNNING) and the next turn come back meanwhile
    finally:
        stop.set()
        worker.join()
    assert seen_s < 0.8, seen_s  # the squeue under way ended about 1.3 s later, the next one 1.5 s after that
    kinds = [e.kind for e in cont.log.tail(key=job_key("alpha", "7"))]
    assert kinds.count("job.completed") == 1 and "job.started" not in kinds[kinds.index("job.completed"):], kinds
    active = service._store.conn.execute("SELECT active, last_state FROM watches WHERE job_id = '7'").fetchone()
    assert tuple(active) == (0, "completed"), active
    service.close()
    cont.close()


def test_jobcomp_tail_reads_only_what_was_appended(tmp_path):
    """The record pass's reader: starts at the file's end, returns each appended record once (a partial last line
    waits), and starts again from the top of a rotated file; a REQUEUED record is not an end."""
    from lab.hpc.schedulers.slurm_poll import JobcompTail

    path = tmp_path / "jobcomp.log"
    path.write_text(_jobcomp_line("1"))
    tail = JobcompTail(path, parse_jobcomp_line, map_state)
    assert tail.read() == {}  # what was there before is not re-read
    with path.open("a") as fh:
        fh.write(_jobcomp_line("2", "FAILED", "3:0") + _jobcomp_line("3")[:20])
    got = tail.read()
    assert list(got) == ["2"] and (got["2"].state, got["2"].exit_code) == (JobState.FAILED, 3)
    with path.open("a") as fh:
        fh.write(_jobcomp_line("3")[20:])
    assert list(tail.read()) == ["3"] and tail.read() == {}
    assert tail.bytes_read == path.stat().st_size - len(_jobcomp_line("1")) + 20  # the partial line read twice
    rotated = tmp_path / "jobcomp.new"
    rotated.write_text(_jobcomp_line("4", "CANCELLED", "0:15"))
    rotated.replace(path)
    assert list(tail.read()) == ["4"]
    sched = SlurmScheduler("alpha", "/nonexistent/slurm.conf")
    assert sched.new_ends() == {}  # the file's place not known yet: no controller call
    sched._jobcomp = path
    assert sched.new_ends() == {}  # the first call marks the end
    with path.open("a") as fh:
        fh.write(_jobcomp_line("5", "REQUEUED") + _jobcomp_line("6"))
    assert list(sched.new_ends()) == ["6"]


def test_a_job_watched_after_its_record_was_written_is_found_by_the_next_record_pass(tmp_path, monkeypatch):
    """A job watched only after it ended (and squeue forgot it) is looked up in the completion records by the
    next record pass, with no squeue call (it used to wait for its site's next query turn)."""
    fake = FakeSlurm(tmp_path / "jobcomp.log")
    sched = _scheduler(fake, monkeypatch)
    db = tmp_path / "lab.db"
    cont = Continuations(db)
    fake.jobs["1"] = "RUNNING"
    cont.watch_job("alpha", "1")
    service = ContinuationService(db, {"alpha": sched}, queue_every_s=None, site_min_interval_s=0.0)
    service.poll_once()  # the site's first query: the records' place is known from now on
    assert service.read_records() == []
    fake.end("21", "FAILED", "2:0", purge=True)  # ended and forgotten before anybody watched it
    assert service.read_records() == []  # read past (nobody watched it)
    cont.watch_job("alpha", "21")
    calls = len(fake.squeue_calls())
    assert len(service.read_records()) == 2 and len(fake.squeue_calls()) == calls  # started (between polls) and failed
    assert [(e.kind, e.payload["exit_code"]) for e in cont.log.tail(key=job_key("alpha", "21"))] == [("job.started", 2), ("job.failed", 2)]
    service.close()
    cont.close()
