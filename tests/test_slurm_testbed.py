"""Real Slurm: two local sites of different sizes (lab.hpc.testbed) driven through SlurmScheduler.

Needs Debian's slurm-wlm 22.05 (``make slurm``). Without it every test here fails with the
install hint (never skips). Tests run in file order against one module-scoped testbed:
the job-id test must come before any other submission, the controller-outage and
``down`` tests last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from lab import LabError
from lab.hpc.continuation import ContinuationService, Continuations, job_key
from lab.hpc.errors import HPCError, SchedulerError, SiteUnavailable
from lab.hpc.schedulers.base import TERMINAL_STATES, JobSpec, JobState, JobStatus
from lab.hpc.schedulers.slurm import SlurmScheduler, map_state, parse_jobcomp_line, parse_slurm_time
from lab.hpc.testbed import Testbed, TestbedError, _proc_state, _stepd_sessions, main

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def alpha(testbed) -> SlurmScheduler:
    return testbed.site("alpha").scheduler(timeout_s=20)


@pytest.fixture(scope="module")
def beta(testbed) -> SlurmScheduler:
    return testbed.site("beta").scheduler(timeout_s=20)


@pytest.fixture(scope="module")
def outdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("out")


def wait_for(sched: SlurmScheduler, job_id: str, states=TERMINAL_STATES, timeout: float = 20.0) -> JobStatus:
    deadline = time.monotonic() + timeout
    while True:
        st = sched.status([job_id])[job_id]
        if st.state in states:
            return st
        assert time.monotonic() < deadline, f"job {job_id} on {sched.name} still {st.state} after {timeout} s: {st}"
        time.sleep(0.2)


# --------------------------------------------------------------------------- no daemons needed


def test_render_script_directives_setup_command():
    sched = SlurmScheduler("x", "/nonexistent/slurm.conf")
    spec = JobSpec(
        name="train",
        command="python train.py --epochs 3",
        nodes=2,
        ntasks=4,
        cpus_per_task=3,
        walltime_s=90061,
        partition="long",
        account="proj1",
        workdir=Path("/scratch/run one"),
        stdout="%x-%j.out",
        environment={"OMP_NUM_THREADS": "3", "GREETING": "hello world"},
        modules=["gcc/12", "openmpi"],
    )
    assert sched.render_script(spec) == (
        "#!/bin/bash\n"
        "#SBATCH --job-name=train\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks=4\n"
        "#SBATCH --cpus-per-task=3\n"
        "#SBATCH --time=1-01:01:01\n"
        "#SBATCH --partition=long\n"
        "#SBATCH --account=proj1\n"
        '#SBATCH --chdir="/scratch/run one"\n'
        "#SBATCH --output=%x-%j.out\n"
        "module load gcc/12\n"
        "module load openmpi\n"
        "export OMP_NUM_THREADS=3\n"
        "export GREETING='hello world'\n"
        "python train.py --epochs 3\n"
    )
    with pytest.raises(SchedulerError, match="not a valid shell name"):
        sched.render_script(JobSpec(command="true", environment={"BAD NAME": "1"}))


def test_state_map_and_jobcomp_parsing():
    assert map_state("PENDING") is JobState.PENDING
    assert map_state("COMPLETING") is JobState.RUNNING
    assert map_state(["RUNNING"]) is JobState.RUNNING
    assert map_state("CANCELLED by 0") is JobState.CANCELLED
    assert map_state("NODE_FAIL") is map_state("OUT_OF_MEMORY") is JobState.FAILED
    assert map_state("TIMEOUT") is JobState.TIMEOUT
    assert map_state("WEIRD") is map_state(None) is JobState.UNKNOWN
    line = (
        "JobId=2 UserId=root(0) GroupId=root(0) Name=my job JobState=FAILED Partition=debug TimeLimit=60 "
        "StartTime=2026-11-30T06:47:03 EndTime=Unknown NodeList=vm NodeCnt=1 ProcCnt=1 ExitCode=3:0 "
    )
    rec = parse_jobcomp_line(line)
    assert rec["JobId"] == "2" and rec["Name"] == "my job" and rec["JobState"] == "FAILED" and rec["ExitCode"] == "3:0"
    # Slurm prints the machine's local time: the epoch must equal the local interpretation
    assert parse_slurm_time(rec["StartTime"]) == datetime(2026, 11, 30, 6, 47, 3).timestamp()
    assert parse_slurm_time(rec["EndTime"]) is None


def test_missing_slurm_fails_with_install_hint(monkeypatch, tmp_path):
    import lab.hpc.testbed as tbmod

    monkeypatch.setattr(tbmod.shutil, "which", lambda name: None)
    monkeypatch.setattr(tbmod.os, "access", lambda path, mode: False)
    with pytest.raises(TestbedError, match="apt-get install .*slurm-wlm") as info:
        Testbed(tmp_path).up(1)
    assert isinstance(info.value, HPCError) and isinstance(info.value, LabError)
    assert not (tmp_path / "testbed.json").exists()


def test_invalid_testbed_requests(tmp_path):
    with pytest.raises(TestbedError, match="invalid"):
        Testbed(tmp_path).up(["Alpha"])
    with pytest.raises(TestbedError, match="unique"):
        Testbed(tmp_path).up(["a", "a"])
    with pytest.raises(TestbedError, match="one value or one per site"):
        Testbed(tmp_path).up(3, cpus=[1, 2])
    with pytest.raises(TestbedError, match="too long"):
        Testbed(tmp_path / ("d" * 80)).up(1)


def test_daemon_dying_at_start_reports_its_log(monkeypatch, tmp_path):
    import lab.hpc.testbed as tbmod

    render = tbmod.render_conf
    monkeypatch.setattr(tbmod, "render_conf", lambda *a, **k: render(*a, **k).replace("select/cons_tres", "select/nonexistent"))
    with pytest.raises(TestbedError, match=r"(?s)slurmctld exited with status \d+ while starting.*select/nonexistent"):
        Testbed(tmp_path).up(1)
    assert not (tmp_path / "testbed.json").exists()


# --------------------------------------------------------------------------- live sites


def test_both_sites_answer(testbed, alpha, beta):
    assert testbed.status() == {"alpha": {"slurmctld": True, "slurmd": True}, "beta": {"slurmctld": True, "slurmd": True}}
    ca, cb = alpha.capabilities(), beta.capabilities()
    assert (ca.scheduler, ca.partitions, ca.total_cpus, ca.nodes, ca.estimated_start) == ("slurm", ["debug", "long"], 2, 1, True)
    assert (cb.total_cpus, cb.nodes) == (1, 1)
    for sched, cpus in ((alpha, 2), (beta, 1)):
        q = sched.queue()
        assert (q.site, q.pending, q.running, q.total_cpus, q.idle_cpus, q.jobs) == (sched.name, 0, 0, cpus, cpus, [])
        assert abs(q.time - time.time()) < 5
        assert sched.available()
    # each site is its own cluster: ClusterName as configured, the conf passed per call
    for site in testbed.sites:
        out = subprocess.run(["scontrol", "show", "config"], env=site.env(), capture_output=True, text=True, check=True).stdout
        assert f"ClusterName             = {site.name}" in out
    assert "SLURM_CONF" not in os.environ or os.environ["SLURM_CONF"] not in {str(s.conf) for s in testbed.sites}


def test_job_ids_are_independent_per_site(alpha, beta, outdir):
    spec = JobSpec(name="ids", command="true", walltime_s=60, stdout=str(outdir / "%x-%j.out"))
    a1, a2 = alpha.submit(spec), alpha.submit(spec)
    b1 = beta.submit(spec)
    assert (a1, a2, b1) == ("1", "2", "1")
    assert {wait_for(alpha, a1).state, wait_for(alpha, a2).state, wait_for(beta, b1).state} == {JobState.COMPLETED}


def test_job_completes_with_output(alpha, outdir):
    before = time.time()
    spec = JobSpec(
        name="hello",
        command='echo "hello from $SLURM_CLUSTER_NAME job $SLURM_JOB_ID: $GREETING"; pwd',
        walltime_s=60,
        workdir=outdir,
        stdout="%x-%j.out",
        environment={"GREETING": "hi there"},
    )
    job_id = alpha.submit(spec)
    st = wait_for(alpha, job_id)
    assert (st.job_id, st.state, st.exit_code, st.name, st.cpus, st.nodes) == (job_id, JobState.COMPLETED, 0, "hello", 1, 1)
    assert before - 1 <= st.submit_time <= st.start_time <= st.end_time <= time.time() + 1
    text = (outdir / f"hello-{job_id}.out").read_text()
    assert text == f"hello from alpha job {job_id}: hi there\n{outdir}\n"
    # the jobcomp/filetxt fallback (used once squeue forgets the job) reads the same facts
    comp = alpha.jobcomp_status([job_id])[job_id]
    assert (comp.state, comp.exit_code, comp.name, comp.cpus, comp.nodes) == (JobState.COMPLETED, 0, "hello", 1, 1)
    assert (comp.submit_time, comp.start_time, comp.end_time) == (st.submit_time, st.start_time, st.end_time)


def test_failing_job_reports_exit_code(alpha, outdir):
    job_id = alpha.submit(JobSpec(name="fails", command="echo before; exit 3", walltime_s=60, stdout=str(outdir / "%x-%j.out")))
    st = wait_for(alpha, job_id)
    assert (st.state, st.exit_code) == (JobState.FAILED, 3)
    assert alpha.jobcomp_status([job_id])[job_id].exit_code == 3
    assert (outdir / f"fails-{job_id}.out").read_text() == "before\n"


def test_unknown_job_id(alpha):
    assert alpha.status(["99999"])["99999"].state is JobState.UNKNOWN
    assert alpha.status([]) == {}


def test_cancel_running_job(alpha, outdir):
    job_id = alpha.submit(JobSpec(name="long", command="sleep 30", walltime_s=120, stdout=str(outdir / "%x-%j.out")))
    wait_for(alpha, job_id, states={JobState.RUNNING})
    alpha.cancel(job_id)
    st = wait_for(alpha, job_id, timeout=10)
    assert st.state is JobState.CANCELLED and st.end_time is not None
    alpha.cancel(job_id)  # already ended: no error


def test_saturated_site_queues_and_estimates(alpha, beta, outdir):
    """beta has 1 CPU: the second 1-CPU job waits with a reason; a new job's estimated start is far ahead."""
    spec = JobSpec(name="hog", command="sleep 30", walltime_s=120, stdout=str(outdir / "%x-%j.out"))
    ids = [beta.submit(spec), beta.submit(spec)]
    try:
        wait_for(beta, ids[0], states={JobState.RUNNING})
        q = beta.queue()
        assert (q.running, q.pending, q.total_cpus, q.idle_cpus) == (1, 1, 1, 0)
        by_id = {j.job_id: j for j in q.jobs}
        assert by_id[ids[0]].state is JobState.RUNNING and by_id[ids[1]].state is JobState.PENDING
        assert by_id[ids[1]].reason in ("Resources", "Priority")
        # the formatted listing (squeue -O) carries what squeue --json says, the backfill's planned start included
        old = {str(j["job_id"]): beta._from_squeue(j) for j in beta._squeue_jobs()}
        fields = ("state", "reason", "name", "submit_time", "start_time", "cpus", "time_limit_s")
        assert {i: [getattr(j, f) for f in fields] for i, j in by_id.items()} == {i: [getattr(old[i], f) for f in fields] for i in ids}
        deadline = time.monotonic() + 10  # the backfill (every second) plans the pending job's start
        while {j.job_id: j.start_time for j in beta.queue().jobs}[ids[1]] is None and time.monotonic() < deadline:
            time.sleep(0.5)
        planned = {j.job_id: j.start_time for j in beta.queue().jobs}[ids[1]]
        assert planned is not None and planned > time.time() + 60
        assert planned == beta._from_squeue([j for j in beta._squeue_jobs() if str(j["job_id"]) == ids[1]][0]).start_time
        # time limits, not run times: the running job holds the CPU for up to 120 s, the pending one 120 s more
        now = time.time()
        est = beta.estimated_start(JobSpec(command="true", walltime_s=60))
        assert est is not None and est > now + 100, est - now
        idle_est = alpha.estimated_start(JobSpec(command="true", walltime_s=60))
        assert idle_est is not None and abs(idle_est - now) < 5  # alpha is idle: now (second resolution)
    finally:
        # the pending job first: cancelling the running one frees the CPU, and the
        # scheduler may start the pending one before a second scancel reaches it
        for j in reversed(ids):
            beta.cancel(j)
    states = [wait_for(beta, j, timeout=10) for j in ids]
    assert [s.state for s in states] == [JobState.CANCELLED] * 2
    assert states[1].exit_code is None and states[1].start_time is None  # cancelled while pending: it never ran
    # the ends come from the completion records: squeue may list the killed job as COMPLETING a moment longer
    deadline = time.monotonic() + 10
    while (q := beta.queue()).running and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (q.running, q.pending, q.idle_cpus) == (0, 0, 1)


def test_sbatch_failure_names_the_partition(alpha):
    with pytest.raises(SchedulerError, match="nosuchpart|[Ii]nvalid partition") as info:
        alpha.submit(JobSpec(command="true", partition="nosuchpart"))
    assert not isinstance(info.value, SiteUnavailable)
    assert info.value.command[0] == "sbatch" and info.value.returncode != 0
    assert "nosuchpart" in str(info.value)
    # a job larger than the site: refused by the estimate as by the submission
    with pytest.raises(SchedulerError, match="node configuration is not available") as info:
        alpha.estimated_start(JobSpec(command="true", cpus_per_task=4))
    assert info.value.command == ["sbatch", "--test-only"]


def test_up_refuses_a_running_testbed(testbed):
    with pytest.raises(TestbedError, match="already running.*down"):
        Testbed(testbed.dir).up(1)


def test_controller_down_is_site_unavailable(testbed, alpha, beta, outdir):
    spec = JobSpec(command="true", walltime_s=60, stdout=str(outdir / "%x-%j.out"))
    ended = beta.submit(spec)
    assert wait_for(beta, ended).state is JobState.COMPLETED
    testbed.stop_site("beta")
    assert testbed.status()["beta"] == {"slurmctld": False, "slurmd": True}
    # a job the completion records show ended is answered from them, controller or not
    assert beta.status([ended])[ended].state is JobState.COMPLETED
    unrecorded = "9999999"  # the others need the controller
    for call in (beta.queue, lambda: beta.status([unrecorded]), lambda: beta.submit(spec), lambda: beta.estimated_start(spec), beta.capabilities):
        t0 = time.monotonic()
        with pytest.raises(SiteUnavailable, match="beta"):
            call()
        # at once, though the polls (queue, status) no longer ping first: the watchdog ping after probe_after_s
        assert time.monotonic() - t0 < beta.probe_after_s + 3.0  # 9-18 s: a Slurm client's retries for a gone controller
    assert not beta.available()
    # the other site is unaffected
    job_id = alpha.submit(spec)
    assert wait_for(alpha, job_id).state is JobState.COMPLETED
    assert alpha.queue().total_cpus == 2


def test_down_leaves_no_daemons(testbed, alpha, outdir):
    job_id = alpha.submit(JobSpec(name="left", command="sleep 60", walltime_s=120, stdout=str(outdir / "%x-%j.out")))
    wait_for(alpha, job_id, states={JobState.RUNNING})
    sites = testbed.sites
    pids = [p for s in sites for p in s.pids.values()]
    assert len(pids) == 4
    deadline = time.monotonic() + 10  # Slurm says RUNNING a moment before slurmd has started the job's step daemon
    while not _stepd_sessions(testbed.site("alpha").dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stepd_sessions(testbed.site("alpha").dir)  # the job's step daemon is there ...
    assert sorted(testbed.down()) == ["alpha", "beta"]
    for pid in pids:
        assert _proc_state(pid) in (None, "Z", "X"), f"daemon {pid} still alive"
    for s in sites:
        assert not _stepd_sessions(s.dir)  # ... and gone with the site
    assert not testbed.state_file.exists()
    assert testbed.status() == {}
    assert testbed.down() == []  # idempotent


def test_command_line_up_status_down(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "lab.hpc.testbed", *args, "--dir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    up = cli("up", "--sites", "1", "--cpus", "1", "--memory", "1000")
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.startswith(f"site0\t{tmp_path / 'site0' / 'slurm.conf'}\tcpus=1 memory=1000MB")
        st = cli("status")
        assert st.returncode == 0 and st.stdout.count("alive") == 2, st.stdout
        pids = [s.pids for s in Testbed(tmp_path).sites][0]
    finally:
        down = cli("down")
    assert down.returncode == 0 and "stopped 1 site(s): site0" in down.stdout
    assert all(_proc_state(p) in (None, "Z", "X") for p in pids.values())
    st = cli("status")
    assert st.returncode == 1 and "no testbed" in st.stdout
    assert main(["status", "--dir", str(tmp_path)]) == 1


def test_a_completing_job_is_ended_by_its_completion_record_and_niced_nodes_run_niced_jobs(tmp_path):
    """Slurm writes a job's jobcomp record when its batch script ends, but squeue lists the job as COMPLETING
    until the node's epilog is done (seconds while hundreds of jobs end at once, issue #16): ``status`` and
    the continuation service take the record, so the end is seen while squeue still says COMPLETING.
    ``compute_nice`` runs the node daemon, and so the job, at that nice value."""
    tb = Testbed(tmp_path / "tb", timeout_s=30, grace_s=10)
    try:
        (site,) = tb.up(["gamma"], cpus=1, memory_mb=1000, compute_nice=5)
        epilog = tmp_path / "epilog.sh"
        epilog.write_text("#!/bin/sh\nsleep 8\n")  # run by slurmd after the job: the job stays COMPLETING meanwhile
        epilog.chmod(0o755)
        site.conf.write_text(site.conf.read_text() + f"Epilog={epilog}\n")
        subprocess.run(["scontrol", "reconfigure"], env=site.env(), check=True, capture_output=True, timeout=60)
        sched = site.scheduler(timeout_s=20)
        job_id = sched.submit(JobSpec(name="niced", command="nice; exit 4", walltime_s=60, stdout=str(tmp_path / "%j.out")))
        deadline = time.monotonic() + 20
        while "COMPLETING" not in (listed := subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=site.env(),
                                                            capture_output=True, text=True).stdout):
            assert time.monotonic() < deadline, f"job {job_id} never listed COMPLETING: {listed!r}"
            time.sleep(0.1)
        st = sched.status([job_id])[job_id]
        assert (st.state, st.exit_code) == (JobState.FAILED, 4), st  # RUNNING (COMPLETING) before
        db = tmp_path / "lab.db"
        cont = Continuations(db)
        cont.watch_job("gamma", job_id)
        service = ContinuationService(db, {"gamma": sched}, queue_every_s=None)
        service.poll_once()  # the service's own path: one poll writes the end
        ended = cont.log.tail(kinds=["job.failed"], key=job_key("gamma", job_id))
        assert len(ended) == 1 and ended[0].payload["exit_code"] == 4, ended
        service.queue_every_s = 0.0
        sample_view = service._ask_site("gamma", [job_id], True)[1][job_id]  # with a whole-queue sample: the same
        assert sample_view.state is JobState.FAILED, sample_view
        still = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=site.env(), capture_output=True, text=True).stdout
        assert "COMPLETING" in still, still  # all of it seen while squeue still says COMPLETING
        assert (tmp_path / f"{job_id}.out").read_text().strip() == "5"  # the job ran at the node daemon's nice value
        service.close()
        cont.close()
    finally:
        tb.down()
