"""The federated-HPC facet end to end on real local Slurm sites: skills, placement, continuation, MCP.

Two testbed sites (``alpha`` 2 CPUs, ``beta`` 1 CPU) started once for the module.
Fails (never skips) without Debian's slurm-wlm.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.hpc import skills
from lab.hpc.continuation import ContinuationService, Continuations, job_key
from lab.hpc.errors import PolicyViolation
from lab.hpc.placement import place
from lab.hpc.schedulers.base import JobSpec, JobState

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fed(testbed, tmp_path_factory):
    work = tmp_path_factory.mktemp("fed")
    federation = skills.Federation.from_folder(testbed.sites_dir, db=work / "lab.db", workdir=work / "jobs")
    yield federation
    federation.close()


def wait_for(predicate, timeout_s=60, poll_s=0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def cancel_all(fed):
    for name in fed.sites:
        sched = fed.scheduler(name)
        for job in sched.queue().jobs:
            if job.state in (JobState.PENDING, JobState.RUNNING):
                sched.cancel(job.job_id)
    wait_for(lambda: all(fed.scheduler(n).queue().running == 0 and fed.scheduler(n).queue().pending == 0 for n in fed.sites))


def test_discover_specify_submit_retrieve(fed):
    found = skills.discover_resources(fed)
    assert {s.name: (s.available, s.total_cpus) for s in found.sites} == {"alpha": (True, 2), "beta": (True, 1)}
    req = skills.ResourceRequest(name="hello", command="echo hello from $SLURM_CLUSTER_NAME", walltime_s=120, environment={"GREETING": "hi"})
    spec = skills.specify_resources(fed, skills.SpecifyResourcesInput(site="alpha", request=req))
    assert "#SBATCH --job-name=hello" in spec.script and "export GREETING=hi" in spec.script and spec.spec.partition == "debug"
    out = skills.submit_task(fed, skills.SubmitTaskInput(request=req, site="alpha"))
    wait_for(lambda: skills.get_status(fed, skills.GetStatusInput(site="alpha", job_id=out.job_id)).state == JobState.COMPLETED)
    res = wait_for(lambda: (r := skills.retrieve_results(fed, skills.RetrieveResultsInput(site="alpha", job_id=out.job_id, name="hello"))).stdout and r)
    assert res.exit_code == 0 and res.stdout.strip() == "hello from alpha"


def test_policy_violation_is_refused_before_submission(fed):
    before = fed.scheduler("beta").queue().jobs
    req = skills.ResourceRequest(command="true", ntasks=2)  # beta has 1 CPU per node
    with pytest.raises(PolicyViolation) as excinfo:
        skills.submit_task(fed, skills.SubmitTaskInput(request=req, site="beta"))
    assert excinfo.value.limit == "cpus_per_node" and "allowed at most 1" in str(excinfo.value)
    with pytest.raises(PolicyViolation, match="max_walltime_s=7200: allowed at most 3600"):
        skills.specify_resources(fed, skills.SpecifyResourcesInput(site="alpha", request=skills.ResourceRequest(command="true", walltime_s=7200)))
    assert len(fed.scheduler("beta").queue().jobs) == len(before)


def test_placement_reads_live_queues(fed):
    # Fill alpha's 2 CPUs for a minute and queue one more job there: alpha is busy, beta idle.
    blocker = skills.ResourceRequest(name="blocker", command="sleep 60", ntasks=2, walltime_s=300)
    skills.submit_task(fed, skills.SubmitTaskInput(request=blocker, site="alpha"))
    skills.submit_task(fed, skills.SubmitTaskInput(request=blocker, site="alpha"))
    wait_for(lambda: fed.scheduler("alpha").queue().pending == 1)
    probe = JobSpec(name="probe", command="true", walltime_s=120)
    now = time.time()
    ec = place(probe, fed.sites, fed.schedulers, "earliest_completion", now=now)
    assert ec.chosen == "beta"
    alpha, beta = ec.candidate("alpha"), ec.candidate("beta")
    assert alpha.estimated_start > now + 30 and beta.estimated_start < now + 30  # alpha's backfill plan vs an idle site
    assert alpha.pending == 1 and alpha.idle_cpus == 0 and beta.idle_cpus == 1
    assert place(probe, fed.sites, fed.schedulers, "least_pending").chosen == "beta"
    assert place(probe, fed.sites, fed.schedulers, "fixed_site", home="alpha").chosen == "alpha"
    # Data movement counts: 2 minutes of transfer to beta make alpha's start the better plan only if earlier.
    slow = place(probe, fed.sites, fed.schedulers, "earliest_completion", transfer_s={"beta": 3600.0})
    assert slow.candidate("beta").predicted_completion >= now + 3600 and slow.chosen == "alpha"
    # A request only alpha allows (2 CPUs) goes there even though it is busy.
    wide = place(probe.model_copy(update={"ntasks": 2}), fed.sites, fed.schedulers, "earliest_completion")
    assert wide.chosen == "alpha" and "cpus_per_node" in wide.candidate("beta").reason
    cancel_all(fed)


def _service(testbed, db, log):
    return subprocess.Popen(
        [sys.executable, "-m", "lab.hpc.continuation", "serve", "--sites", str(testbed.sites_dir), "--db", str(db), "--poll-s", "0.2"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def test_continuations_resume_exactly_once_across_restarts(testbed, fed, tmp_path):
    calls = tmp_path / "calls.txt"
    db = fed.continuations.log.path
    log = (tmp_path / "service.log").open("w")
    service = _service(testbed, db, log)
    try:
        jobs = []
        for i, (site, seconds) in enumerate([("alpha", 0), ("beta", 0), ("alpha", 4), ("beta", 4)]):
            req = skills.ResourceRequest(name=f"c{i}", command=f"sleep {seconds}; exit {i % 2}", walltime_s=120)
            cont = skills.ContinuationSpec(handler="tests.continuation_handlers:record", args={"path": str(calls), "tag": f"c{i}"})
            jobs.append(skills.submit_task(fed, skills.SubmitTaskInput(request=req, site=site, continuation=cont)))
        wait_for(lambda: len(fed.continuations.log.tail(kinds=["job.completed", "job.failed"])) >= 2, timeout_s=60)
        # Kill the service without warning while two jobs still run, and start it again.
        os.killpg(service.pid, signal.SIGKILL)
        service.wait()
        service = _service(testbed, db, log)
        # The agent's side: a resumer in this process, and a second one in another process (a restarted kernel).
        code = (
            "import sys, time; sys.path.insert(0, %r)\n"
            "from lab.hpc.continuation import Continuations\n"
            "c = Continuations(%r)\n"
            "end = time.time() + 40\n"
            "while time.time() < end and c.waiting(): c.resume_ready(); time.sleep(0.1)\n"
        ) % (str(REPO), str(db))
        other = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
        wait_for(lambda: (fed.continuations.resume_ready() or True) and not fed.continuations.waiting(), timeout_s=60, poll_s=0.1)
        other.wait(timeout=60)
    finally:
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=30)
        log.close()
    lines = calls.read_text().splitlines()
    assert len(lines) == 4 and len({line.split()[0] for line in lines}) == 4  # each continuation ran once
    results = {fed.continuations.get(j.continuation_id).result["tag"]: fed.continuations.get(j.continuation_id).result for j in jobs}
    assert {tag: r["kind"] for tag, r in results.items()} == {"c0": "job.completed", "c1": "job.failed", "c2": "job.completed", "c3": "job.failed"}
    assert results["c1"]["exit_code"] == 1
    events = fed.continuations.log.tail()
    for j in jobs:  # no event written twice, though the service was killed and restarted
        kinds = [e.kind for e in events if e.key == job_key(j.site, j.job_id)]
        assert len(kinds) == len(set(kinds)) and kinds[:2] == ["job.submitted", "job.started"]
    resumed = [e for e in events if e.kind == "continuation.resumed"]
    assert len(resumed) == 4 and all(e.payload["latency_s"] < 5 for e in resumed)


def test_failing_handler_is_recorded_not_retried(fed, testbed):
    service = ContinuationService(fed.continuations.log.path, fed.schedulers, poll_s=0.1)
    try:
        req = skills.ResourceRequest(name="boom", command="true", walltime_s=60)
        out = skills.submit_task(fed, skills.SubmitTaskInput(request=req, site="beta", continuation=skills.ContinuationSpec(handler="tests.continuation_handlers:explode")))
        def step():
            service.poll_once()  # the service's side, in-process here
            fed.continuations.resume_ready()
            return fed.continuations.get(out.continuation_id).state != "waiting"

        wait_for(step, timeout_s=60)
    finally:
        service.close()
    rec = fed.continuations.get(out.continuation_id)
    assert rec.state == "error" and rec.error == "RuntimeError: handler failed on purpose"
    assert fed.continuations.resume_ready() == []


def test_idempotent_submission(fed):
    req = skills.ResourceRequest(name="once", command="true", walltime_s=60)
    first = skills.submit_task(fed, skills.SubmitTaskInput(request=req, site="beta", idempotency_key="k-1"))
    again = skills.submit_task(fed, skills.SubmitTaskInput(request=req, site="beta", idempotency_key="k-1"))
    assert again.duplicate and (again.site, again.job_id) == (first.site, first.job_id)


def test_mcp_server_over_stdio(testbed, fed, tmp_path):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "lab.hpc.mcp_server", "--sites", str(testbed.sites_dir), "--db", str(tmp_path / "mcp.db"), "--workdir", str(tmp_path / "jobs")],
        cwd=str(REPO),
    )

    async def session():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            tools = sorted(t.name for t in (await s.list_tools()).tools)
            found = await s.call_tool("discover_resources", {})
            submitted = await s.call_tool("submit_task", {"request": {"command": "echo via mcp", "name": "mcpjob"}, "policy": "least_pending"})
            refused = await s.call_tool("specify_resources", {"site": "beta", "request": {"command": "true", "nodes": 2}})
            return tools, found, submitted, refused

    tools, found, submitted, refused = asyncio.run(asyncio.wait_for(session(), 120))
    assert tools == ["choose_site", "discover_resources", "get_status", "move_data", "retrieve_results", "specify_resources", "submit_task"]
    sites = {s["name"]: s["available"] for s in found.structured_content["sites"]}
    assert sites == {"alpha": True, "beta": True}
    assert not submitted.is_error and submitted.structured_content["site"] in ("alpha", "beta")
    assert submitted.structured_content["decision"]["policy"] == "least_pending"
    assert refused.is_error and "max_nodes=2: allowed at most 1" in refused.content[0].text


def test_unavailable_site_is_skipped_and_shown(testbed, fed):
    testbed.stop_site("beta")
    found = {s.name: s for s in skills.discover_resources(fed).sites}
    assert found["alpha"].available and not found["beta"].available and found["beta"].error
    decision = place(JobSpec(command="true", walltime_s=60), fed.sites, fed.schedulers, "earliest_completion")
    assert decision.chosen == "alpha" and decision.candidate("beta").reason.startswith("unavailable:")
    # The service marks the outage in the log once and goes on with the other site.
    service = ContinuationService(fed.continuations.log.path, fed.schedulers, poll_s=0.1, queue_every_s=0.0)
    try:
        before = fed.continuations.log.last_seq()
        service.poll_queues()
        service.poll_queues()
        new = fed.continuations.log.tail(before)
    finally:
        service.close()
    assert [e.key for e in new if e.kind == "site.unavailable"] == ["beta"]
    assert "alpha" in [e.key for e in new if e.kind == "site.queue"]
