"""lab.hpc.schedulers.local: real subprocesses, CPU limit, FIFO queue, walltimes, cancel, FCFS estimates."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lab.hpc.errors import PolicyViolation, SchedulerError, SiteUnavailable
from lab.hpc.schedulers.base import TERMINAL_STATES, JobSpec, JobState, JobStatus, Scheduler
from lab.hpc.schedulers.local import LocalScheduler, time_dhms, wait_status_exit_code


@pytest.fixture
def sched(tmp_path: Path):
    s = LocalScheduler("laptop", cpus=2, workdir=tmp_path, poll_s=0.02, kill_grace_s=0.5)
    yield s
    s.close()


def wait_for(sched: LocalScheduler, job_id: str, states=TERMINAL_STATES, timeout: float = 10.0) -> JobStatus:
    deadline = time.monotonic() + timeout
    while True:
        st = sched.status([job_id])[job_id]
        if st.state in states:
            return st
        assert time.monotonic() < deadline, f"job {job_id} still {st.state} after {timeout} s"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def test_helpers():
    assert time_dhms(59) == "0-00:00:59" and time_dhms(90061) == "1-01:01:01"
    assert wait_status_exit_code(3 << 8) == 3 and wait_status_exit_code(9) == 137


def test_is_a_scheduler_with_capabilities(sched, tmp_path):
    assert isinstance(sched, Scheduler)
    c = sched.capabilities()
    assert (c.scheduler, c.partitions, c.total_cpus, c.nodes, c.estimated_start) == ("local", ["local"], 2, 1, True)
    q = sched.queue()
    assert (q.site, q.pending, q.running, q.total_cpus, q.idle_cpus, q.jobs) == ("laptop", 0, 0, 2, 2, [])
    script = sched.render_script(JobSpec(name="x", command="echo $A", environment={"A": "a b"}, modules=["gcc"], walltime_s=61))
    assert script == "#!/bin/bash\n# lab local job x: nodes=1 ntasks=1 cpus_per_task=1 walltime=0-00:01:01\nmodule load gcc\nexport A='a b'\necho $A\n"


def test_job_completes_with_output(sched, tmp_path):
    before = time.time()
    spec = JobSpec(name="hello", command='echo "hello $GREETING from $LAB_SITE job $LAB_JOB_ID"; pwd', environment={"GREETING": "big world"}, stdout="%x-%j.out")
    job_id = sched.submit(spec)
    st = wait_for(sched, job_id)
    assert (st.job_id, st.state, st.exit_code, st.name, st.cpus, st.nodes) == (job_id, JobState.COMPLETED, 0, "hello", 1, 1)
    assert before <= st.submit_time <= st.start_time <= st.end_time <= time.time()
    assert (tmp_path / f"hello-{job_id}.out").read_text() == f"hello big world from laptop job {job_id}\n{tmp_path}\n"


def test_workdir_and_default_output(sched, tmp_path):
    sub = tmp_path / "run"
    sub.mkdir()
    job_id = sched.submit(JobSpec(command="pwd; echo err >&2", workdir=sub))
    assert wait_for(sched, job_id).state is JobState.COMPLETED
    assert (tmp_path / f"lab-{job_id}.out").read_text() == f"{sub}\nerr\n"


def test_failing_job_reports_exit_code(sched):
    job_id = sched.submit(JobSpec(command="exit 3"))
    st = wait_for(sched, job_id)
    assert (st.state, st.exit_code, st.reason) == (JobState.FAILED, 3, "exit code 3")


def test_missing_workdir_fails_the_job(sched, tmp_path):
    st = wait_for(sched, sched.submit(JobSpec(command="true", workdir=tmp_path / "absent")))
    assert st.state is JobState.FAILED and "could not start" in st.reason


def test_walltime_is_enforced(sched, tmp_path):
    t0 = time.monotonic()
    job_id = sched.submit(JobSpec(command="sleep 30", walltime_s=1))
    st = wait_for(sched, job_id, timeout=5)
    assert st.state is JobState.TIMEOUT and st.exit_code == 128 + 15
    assert 1.0 <= st.end_time - st.start_time < 2.5 and time.monotonic() - t0 < 3


def test_walltime_kills_a_script_that_ignores_sigterm(sched, tmp_path):
    job_id = sched.submit(JobSpec(command="trap '' TERM; sleep 30 & wait; sleep 30", walltime_s=1))
    st = wait_for(sched, job_id, timeout=6)
    assert st.state is JobState.TIMEOUT and st.exit_code == 128 + 9  # SIGKILL after kill_grace_s
    assert sched.queue().idle_cpus == 2


def test_cpu_limit_queues_jobs_fifo(sched, tmp_path):
    """2 CPUs: a 2-CPU job and two 1-CPU jobs; the 1-CPU jobs wait for it, in order, with Slurm's reasons."""
    big = sched.submit(JobSpec(name="big", command="sleep 0.6", cpus_per_task=2, walltime_s=10))
    a = sched.submit(JobSpec(name="a", command="sleep 0.4", walltime_s=5))
    b = sched.submit(JobSpec(name="b", command="sleep 0.4", ntasks=1, walltime_s=5))
    q = sched.queue()
    assert (q.running, q.pending, q.idle_cpus) == (1, 2, 0)
    by_id = {j.job_id: j for j in q.jobs}
    assert by_id[big].state is JobState.RUNNING
    assert (by_id[a].reason, by_id[b].reason) == ("Resources", "Priority")
    # FCFS projection: both start when big's walltime (10 s) would end
    assert by_id[a].start_time == by_id[b].start_time == pytest.approx(by_id[big].start_time + 10)
    sts = {j: wait_for(sched, j) for j in (big, a, b)}
    assert all(s.state is JobState.COMPLETED for s in sts.values())
    assert sts[a].start_time >= sts[big].end_time and sts[b].start_time >= sts[big].end_time
    assert abs(sts[a].start_time - sts[b].start_time) < 0.5  # both fit together after big


def test_strict_fifo_no_overtaking(sched):
    """A 2-CPU job at the head blocks later 1-CPU jobs even when one CPU is idle (no backfill)."""
    first = sched.submit(JobSpec(command="sleep 0.5", walltime_s=5))
    wide = sched.submit(JobSpec(command="true", cpus_per_task=2, walltime_s=5))
    small = sched.submit(JobSpec(command="true", walltime_s=5))
    q = sched.queue()
    assert (q.running, q.pending, q.idle_cpus) == (1, 2, 1)
    sts = {j: wait_for(sched, j) for j in (first, wide, small)}
    assert sts[wide].start_time >= sts[first].end_time
    assert sts[small].start_time >= sts[wide].start_time


def test_cancel_pending_and_running(sched):
    running = sched.submit(JobSpec(command="sleep 30", cpus_per_task=2, walltime_s=60))
    pending = sched.submit(JobSpec(command="sleep 30", walltime_s=60))
    wait_for(sched, running, states={JobState.RUNNING})
    sched.cancel(pending)
    st = sched.status([pending])[pending]
    assert (st.state, st.start_time, st.exit_code) == (JobState.CANCELLED, None, None)
    sched.cancel(running)
    st = wait_for(sched, running)
    assert st.state is JobState.CANCELLED
    deadline = time.monotonic() + 5
    while sched.queue().idle_cpus != 2:  # CPUs come back once the process group is gone
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sched.cancel(running)  # already ended: no error
    sched.cancel("12345")  # unknown: no error
    assert wait_for(sched, running).end_time is not None


def test_estimated_start_is_fcfs_projection(sched):
    now = time.time()
    assert sched.estimated_start(JobSpec(command="true")) == pytest.approx(now, abs=0.5)
    hog = sched.submit(JobSpec(command="sleep 30", cpus_per_task=2, walltime_s=40))
    wait_for(sched, hog, states={JobState.RUNNING})
    start = sched.status([hog])[hog].start_time
    assert sched.estimated_start(JobSpec(command="true", walltime_s=5)) == pytest.approx(start + 40)
    sched.submit(JobSpec(command="true", walltime_s=20))  # pending behind hog, takes 1 CPU for up to 20 s
    # a 1-CPU job fits beside it; a 2-CPU job must wait for it too
    assert sched.estimated_start(JobSpec(command="true", walltime_s=5)) == pytest.approx(start + 40)
    assert sched.estimated_start(JobSpec(command="true", cpus_per_task=2)) == pytest.approx(start + 60)
    with pytest.raises(PolicyViolation, match="max_cpus"):  # never fits: refused, as sbatch --test-only refuses
        sched.estimated_start(JobSpec(command="true", cpus_per_task=3))


def test_oversized_and_wrong_partition_refused(sched):
    with pytest.raises(PolicyViolation, match="max_cpus"):
        sched.submit(JobSpec(command="true", ntasks=2, cpus_per_task=2))
    with pytest.raises(PolicyViolation, match="max_nodes"):
        sched.submit(JobSpec(command="true", nodes=2))
    with pytest.raises(PolicyViolation, match="partition"):
        sched.submit(JobSpec(command="true", partition="gpu"))
    with pytest.raises(SchedulerError, match="not a valid shell name"):
        sched.submit(JobSpec(command="true", environment={"1X": "y"}))
    assert sched.status(["1"])["1"].state is JobState.UNKNOWN


def test_thread_safe_concurrent_submits(sched):
    ids: list[str] = []
    lock = threading.Lock()

    def worker():
        for _ in range(5):
            j = sched.submit(JobSpec(command="true", walltime_s=5))
            with lock:
                ids.append(j)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(int, ids)) == list(range(1, 21))
    assert all(wait_for(sched, j).state is JobState.COMPLETED for j in ids)


def test_close_kills_running_jobs(tmp_path):
    sched = LocalScheduler("x", cpus=1, workdir=tmp_path)
    running = sched.submit(JobSpec(command="echo $$ > pid; sleep 30", walltime_s=60, workdir=tmp_path))
    pending = sched.submit(JobSpec(command="sleep 30", walltime_s=60))
    wait_for(sched, running, states={JobState.RUNNING})
    deadline = time.monotonic() + 5
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pid = int((tmp_path / "pid").read_text())
    sched.close()
    assert not alive(pid)
    sts = sched.status([running, pending])
    assert sts[running].state is JobState.CANCELLED and sts[pending].state is JobState.CANCELLED
    with pytest.raises(SiteUnavailable):
        sched.submit(JobSpec(command="true"))
    sched.close()  # idempotent
