"""The dashboards' tables as typed rows (lab.hpc.views): per-job rows from a live queue, from a trace replay and
from a real Slurm testbed (estimated starts equal to ``squeue --start``), their sort keys, and the placement table."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from lab.events import EventLog
from lab.hpc import QueueReplay, parse_swf
from lab.hpc.continuation import ContinuationService
from lab.hpc.live import LiveSites
from lab.hpc.placement import Candidate, PlacementDecision
from lab.hpc.schedulers.base import JobSpec, JobState, JobStatus, SiteQueue
from lab.hpc.schedulers.slurm import parse_slurm_time
from lab.hpc.views import (
    Cell,
    Column,
    Row,
    Table,
    candidate_table,
    format_duration,
    job_id_key,
    job_table,
    jobs_from_queue,
    jobs_from_replay,
)

T0 = 1_700_000_000.0


def queue(jobs, t=T0):
    return SiteQueue(site="alpha", time=t, pending=sum(j.state == JobState.PENDING for j in jobs),
                     running=sum(j.state == JobState.RUNNING for j in jobs), total_cpus=4, idle_cpus=0, jobs=jobs)


JOBS = [
    JobStatus(job_id="9", state=JobState.RUNNING, submit_time=T0 - 600, start_time=T0 - 500, cpus=4, time_limit_s=3600),
    JobStatus(job_id="10", state=JobState.PENDING, submit_time=T0 - 2700, start_time=T0 + 900, cpus=2, time_limit_s=7200,
              reason="Resources"),
    JobStatus(job_id="11", state=JobState.PENDING, submit_time=T0 - 7200, start_time=None, cpus=1, time_limit_s=60,
              reason="Priority"),
    JobStatus(job_id="12", state=JobState.COMPLETED, submit_time=T0 - 9000, start_time=T0 - 8000, cpus=1),
]


def test_rows_from_a_live_queue_say_waited_so_far_and_estimated_start():
    rows = jobs_from_queue(queue(JOBS), now=T0 + 60)
    assert [r.job_id for r in rows] == ["11", "10", "9"]  # ended jobs left out; pending first, longest-waiting first
    r11, r10, r9 = rows
    assert r10.waited_s == 2760 and r11.waited_s == 7260  # counted to `now`
    assert (r10.start_time, r10.start_kind, r10.starts_in_s) == (T0 + 900, "estimate", 840)
    assert (r11.start_time, r11.start_kind, r11.starts_in_s) == (None, "unknown", None)  # the backfill has not planned it
    assert (r9.waited_s, r9.start_kind, r9.starts_in_s) == (100, "started", None)  # a running job: the wait it had
    assert (r10.walltime_s, r10.processors, r10.reason) == (7200, 2, "Resources")
    assert jobs_from_queue(queue(JOBS))[1].waited_s == 2700  # default: to when the queue was read


def test_job_table_sorts_by_value_not_by_text():
    table = job_table(jobs_from_queue(queue(JOBS), now=T0))
    waited = table.column_index("waited")
    assert [r.cells[waited].text for r in table.rows] == ["2.0 h", "45.0 min", "1.7 min"]
    # as text "45.0 min" > "2.0 h"; as durations it is shorter
    assert [r.id for r in table.view("waited")] == ["alpha/9", "alpha/10", "alpha/11"]
    assert [r.id for r in table.view("waited", descending=True)] == ["alpha/11", "alpha/10", "alpha/9"]
    assert [r.id for r in table.view("job")] == ["alpha/9", "alpha/10", "alpha/11"]  # numeric ids: 9 < 10 < 11
    # unknown estimated start (job 11) last whichever way the column is sorted
    assert [r.id for r in table.view("start")][-1] == "alpha/11"
    assert [r.id for r in table.view("start", descending=True)][-1] == "alpha/11"
    assert [r.id for r in table.view("walltime")] == ["alpha/11", "alpha/9", "alpha/10"]
    start = table.column_index("start")
    assert table.rows[1].cells[start].text == "in 15.0 min (22:28:20)" and table.rows[0].cells[start].text == "not planned yet"
    # filters: by the row's group (the state) and by any cell's text, case-insensitive
    assert [r.id for r in table.view(group="running")] == ["alpha/9"]
    assert [r.id for r in table.view(text="resources")] == ["alpha/10"]
    assert table.view(group="pending", text="nothing like this") == []
    assert table.to_json()["rows"][0]["sort"][table.column_index("walltime")] == 60


def test_sort_keys():
    assert sorted(["10", "9", "10_2", "11", "10_1"], key=job_id_key) == ["9", "10", "10_1", "10_2", "11"]
    assert job_id_key("abc") == "abc"
    assert [format_duration(s) for s in (5, 90, 5400, 3 * 86400, None, float("nan"))] == ["5 s", "1.5 min", "1.5 h", "3.0 d", "?", "?"]
    table = Table(columns=(Column("x", "x", True),), rows=tuple(Row(str(k), "g", (Cell(str(v), v),)) for k, v in enumerate([3.0, None, 1.0, "b", 2.0])))
    assert [r.id for r in table.view("x")] == ["2", "4", "0", "3", "1"]  # numbers, then text, unknown last
    assert [r.id for r in table.view("x", descending=True)] == ["0", "4", "2", "3", "1"]
    with pytest.raises(KeyError, match="no column 'y'"):
        table.view("y")
    with pytest.raises(ValueError, match="row '0' has 2 cells for 1 columns"):
        Table(columns=(Column("x", "x"),), rows=(Row("0", "g", (Cell("a", "a"), Cell("b", "b"))),))


def test_stale_sites_rows_are_muted_and_say_so():
    rows = jobs_from_queue(queue(JOBS))
    table = job_table(rows, stale={"alpha": "stale: no sample for 58 s"})
    assert all(r.muted for r in table.rows)
    assert table.rows[0].cells[0].text == "alpha (stale: no sample for 58 s)"
    assert table.rows[0].cells[table.column_index("waited")].text.startswith("\u2265 ")  # at least that long


SMALL = """; MaxProcs: 4
1 0     7200 3600 2 -1 -1 2 3600 -1 1 1 1 -1 -1 -1 -1 -1
2 3600  0    7200 1 -1 -1 1 -1   -1 1 1 1 -1 -1 -1 -1 -1
"""


def test_rows_from_a_replay():
    replay = QueueReplay(parse_swf(SMALL), name="tiny")
    t = replay.first_submit + 5400  # 1.5 h: job 1 pending (starts at 2 h), job 2 running since 1 h
    pending, running = jobs_from_replay(replay, t)
    assert (pending.job_id, pending.state, pending.waited_s, pending.start_time - t, pending.start_kind) == ("1", JobState.PENDING, 5400, 1800, "trace")
    assert (pending.walltime_s, pending.processors) == (3600, 2)
    assert (running.job_id, running.state, running.waited_s, running.walltime_s) == ("2", JobState.RUNNING, 0, None)
    text = job_table([pending, running], dated=True, reasons=False).to_json()
    assert [c["key"] for c in text["columns"]] == ["site", "job", "state", "waited", "start", "walltime", "procs", "submitted"]
    assert text["rows"][0]["cells"][4] == "in 30.0 min (01-01 02:00, trace)"  # the trace starts at epoch 0
    assert text["rows"][1]["cells"][5] == "?"  # walltime unknown in the trace
    assert jobs_from_replay(replay, replay.last_end + 1) == []


def test_candidate_table_one_row_per_site():
    spec = JobSpec(command="true", walltime_s=60)
    decision = PlacementDecision(policy="earliest_completion", chosen="beta", time=T0, spec=spec, candidates=[
        Candidate(site="alpha", eligible=True, pending=3, running=1, idle_cpus=0, total_cpus=2, estimated_start=T0 + 600,
                  transfer_s=0.1, walltime_s=60, predicted_completion=T0 + 660),
        Candidate(site="beta", eligible=True, pending=0, running=0, idle_cpus=1, total_cpus=1, estimated_start=T0, transfer_s=0.1,
                  walltime_s=60, predicted_completion=T0 + 60.1),
        Candidate(site="gamma", eligible=False, reason="walltime 60 s exceeds max_walltime_s 30"),
    ])
    table = candidate_table(decision)
    assert [r.cells[0].text for r in table.rows] == ["alpha", "\u25b6 beta", "gamma"]
    assert [r.group for r in table.rows] == ["eligible", "chosen", "not eligible"]
    assert table.rows[2].cells[1].text == "no: walltime 60 s exceeds max_walltime_s 30"
    assert [r.id for r in table.view("done")] == ["beta", "alpha", "gamma"]  # not eligible: no completion, last
    assert table.rows[0].cells[table.column_index("start")].text == "+10.0 min"
    assert candidate_table(decision.model_dump(mode="json")).to_json() == table.to_json()  # as the event log holds it
    assert candidate_table(None).empty == "no placement yet"


# ---- a real Slurm testbed: estimated starts are Slurm's backfill plan, as `squeue --start` prints it


def squeue_start(site) -> dict[str, float | None]:
    r = subprocess.run(["squeue", "--start", "-h", "-o", "%i %S"], env={**os.environ, "SLURM_CONF": str(site.conf)},
                       capture_output=True, text=True, check=True, timeout=30)
    return {line.split()[0]: parse_slurm_time(line.split()[1]) for line in r.stdout.splitlines() if line.strip()}


@pytest.mark.slurm
@pytest.mark.slow
def test_live_rows_from_a_real_slurm_site_match_squeue_start(testbed, tmp_path):
    beta = testbed.site("beta").scheduler(timeout_s=20)  # 1 CPU: the second job waits behind the first
    spec = JobSpec(name="hold", command="sleep 30", walltime_s=180, stdout=str(tmp_path / "%x-%j.out"))
    ids = [beta.submit(spec), beta.submit(spec)]
    db = tmp_path / "lab.db"
    service = ContinuationService(db, {"beta": beta}, queue_every_s=1.0)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the first job runs and the backfill has planned the second
            q = beta.queue()
            by_id = {j.job_id: j for j in q.jobs}
            if by_id[ids[0]].state == JobState.RUNNING and by_id[ids[1]].start_time is not None:
                break
            assert time.monotonic() < deadline, by_id
            time.sleep(0.5)
        expected = squeue_start(testbed.site("beta"))
        now = time.time()
        rows = {r.job_id: r for r in jobs_from_queue(q, now=now)}
        pending, running = rows[ids[1]], rows[ids[0]]
        assert pending.state == JobState.PENDING and pending.start_kind == "estimate"
        assert pending.start_time == expected[ids[1]]  # the very value squeue --start prints
        # backfill plans with time limits: the second job starts when the first one's 180 s are up
        assert pending.start_time == pytest.approx(running.start_time + 180, abs=2)
        assert (pending.walltime_s, pending.processors, running.walltime_s) == (180, 1, 180)
        assert pending.waited_s == pytest.approx(now - pending.submit_time) and pending.reason in ("Resources", "Priority")
        assert running.start_kind == "started" and running.waited_s == pytest.approx(running.start_time - running.submit_time)

        # the continuation service writes the jobs into site.queue, and the live view reads the same rows back
        service.poll_queues()
        live = LiveSites(EventLog(db))
        live.update()
        later = time.time()
        back, stale = live.jobs(later)
        assert stale == {} and [r.job_id for r in back] == [ids[1], ids[0]]
        assert back[0].start_time == expected[ids[1]] and back[0].waited_s == pytest.approx(later - back[0].submit_time)
        back, stale = live.jobs(later + 600)  # ten minutes without a sample: stale, waits counted to the sample only
        assert stale == {"beta": f"stale: no sample for {later + 600 - live.sites['beta'].time[-1]:,.0f} s"}
        assert back[0].waited_s == pytest.approx(live.sites["beta"].time[-1] - back[0].submit_time)
    finally:
        service.close()
        for j in ids:
            beta.cancel(j)
