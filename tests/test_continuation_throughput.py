"""Continuation throughput at scale (issue #16, the 2,000-job resume latency): the service asks its
sites at the same time (not one after another), and the resumer commits a burst of ready
continuations in a few transactions (not one each), still exactly once. No Slurm install needed:
the real SlurmScheduler against tests.test_continuation_polling's fake controller.
"""

from __future__ import annotations

import threading
from collections import Counter

from lab.hpc.continuation import ContinuationService, Continuations, job_key
from lab.hpc.schedulers.slurm import SlurmScheduler
from tests.test_continuation_polling import FakeSlurm

HANDLER = "tests.continuation_handlers:record"
SITES = ("alpha", "beta", "gamma", "delta")


def _begins(cont: Continuations) -> list[str]:
    """Record the write transactions ``cont``'s connection opens."""
    seen: list[str] = []
    cont.log.connection.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("BEGIN") else None)
    return seen


def _ended_jobs(tmp_path, n: int) -> tuple[Continuations, str]:
    db, calls = tmp_path / "lab.db", tmp_path / "calls.txt"
    cont = Continuations(db)
    for i in range(n):
        key = job_key("alpha", str(i))
        cont.register(key, HANDLER, args={"path": str(calls), "tag": str(i)})
        cont.log.append("alpha", "job.completed", key, {"state": "completed"}, dedupe=f"{key}/completed")
    return cont, str(calls)


def test_a_burst_of_ready_continuations_is_resumed_in_a_few_transactions(tmp_path):
    cont, calls = _ended_jobs(tmp_path, 120)
    begins = _begins(cont)
    resumed = cont.resume_ready()
    assert sorted(r.id for r in resumed) == list(range(1, 121)) and all(r.state == "done" for r in resumed)
    assert resumed[0].result["key"] == "alpha/0" and cont.get(resumed[0].id).result == resumed[0].result
    # one transaction per resume_batch_s (50 ms) of handlers, not one per continuation (120 before)
    assert 1 <= len(begins) <= 10, begins
    assert cont.resume_ready() == []
    assert Counter(line.split()[0] for line in open(calls)) == Counter({str(i): 1 for i in range(1, 121)})
    cont.close()


def test_batch_size_zero_is_one_transaction_per_continuation(tmp_path):
    cont, _ = _ended_jobs(tmp_path, 5)
    cont.resume_batch_s = 0.0
    begins = _begins(cont)
    assert len(cont.resume_ready()) == 5 and len(begins) == 5
    cont.close()


def test_two_batching_resumers_still_resume_each_exactly_once(tmp_path):
    cont, calls = _ended_jobs(tmp_path, 200)
    other = Continuations(tmp_path / "lab.db")
    got: list[list] = [[], []]
    start = threading.Barrier(2)

    def resume(i, c):
        start.wait()
        got[i] = c.resume_ready()

    workers = [threading.Thread(target=resume, args=(i, c)) for i, c in enumerate((cont, other))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ids = [r.id for r in got[0]] + [r.id for r in got[1]]
    assert sorted(ids) == list(range(1, 201))  # every one, none by both
    assert Counter(line.split()[0] for line in open(calls)) == Counter({str(i): 1 for i in range(1, 201)})
    assert len(cont.log.tail(kinds=["continuation.resumed"])) == 200
    other.close()
    cont.close()


def test_the_sites_are_asked_at_the_same_time(tmp_path):
    """Each fake site's squeue waits until all four are in flight: asked one after another, the
    first would wait alone and the poll fail (as it did before: the 2,000-job poll summed the sites)."""
    arrived = threading.Barrier(len(SITES), timeout=10)
    db = tmp_path / "lab.db"
    cont = Continuations(db)
    fakes, scheds = {}, {}
    for site in SITES:
        fake = FakeSlurm(tmp_path / f"{site}.jobcomp")
        sched = SlurmScheduler(site, "/nonexistent/slurm.conf")

        def run(argv, *, stdin=None, check=True, fake=fake):
            if argv[0] == "squeue":
                arrived.wait()
            return fake.run(argv, stdin=stdin, check=check)

        sched._run, sched._ping = run, (lambda: None)
        for j in ("1", "2"):
            fake.jobs[j] = "RUNNING"
            cont.watch_job(site, j)
            cont.register(job_key(site, j), HANDLER, args={"path": str(tmp_path / "calls.txt")})
        fake.end("2", "FAILED", "1:0")
        fakes[site], scheds[site] = fake, sched
    service = ContinuationService(db, scheds, queue_every_s=None, site_min_interval_s=0.0)
    service.poll_once()
    assert {e.key for e in cont.log.tail(kinds=["job.failed"])} == {job_key(s, "2") for s in SITES}
    assert {e.key for e in cont.log.tail(kinds=["job.started"])} == {job_key(s, j) for s in SITES for j in ("1", "2")}
    assert all(len(f.squeue_calls()) == 1 for f in fakes.values())
    assert len(cont.resume_ready()) == len(SITES)
    service.close()
    cont.close()


def test_append_many_keeps_order_and_dedupe_and_writes_nothing_on_a_bad_payload(tmp_path):
    import pytest

    from lab.events import EventLog, EventLogError

    log = EventLog(tmp_path / "log.db")
    first = log.append("s", "job.completed", "a/1", {"x": 1}, dedupe="a/1/completed")
    seqs = log.append_many([
        ("s", "job.started", "a/2", {"y": 2}, "a/2/running"),
        ("s", "note", "a/3", None),
        ("s", "job.completed", "a/1", {"x": 1}, "a/1/completed"),  # seen before: its seq, nothing written
        ("s", "job.started", "a/2", {}, "a/2/running"),  # twice in one call: the first one's seq
        ("s", "note", "a/4", {"z": [1, 2]}, None, 123.25),
    ])
    events = log.tail()
    assert [e.key for e in events] == ["a/1", "a/2", "a/3", "a/4"]
    by_key = {e.key: e for e in events}
    assert seqs == [by_key["a/2"].seq, by_key["a/3"].seq, first, by_key["a/2"].seq, by_key["a/4"].seq]
    assert seqs[0] < seqs[1] < seqs[4] and by_key["a/4"].time == 123.25 and by_key["a/4"].payload == {"z": [1, 2]}
    with pytest.raises(EventLogError, match="a/6"):
        log.append_many([("s", "note", "a/5", {}), ("s", "note", "a/6", {"bad": object()})])
    assert [e.key for e in log.tail()] == ["a/1", "a/2", "a/3", "a/4"]
    assert log.append_many([]) == []
    log.close()


def test_jobcomp_reader_forgets_jobs_no_longer_asked_about(tmp_path, monkeypatch):
    import lab.hpc.schedulers.slurm_poll as slurm_poll
    from lab.hpc.schedulers.slurm import map_state, parse_jobcomp_line
    from lab.hpc.schedulers.slurm_poll import JobcompReader
    from tests.test_continuation_polling import _jobcomp_line

    clock = [1000.0]
    monkeypatch.setattr(slurm_poll.time, "monotonic", lambda: clock[0])
    path = tmp_path / "jobcomp.log"
    path.write_text("".join(_jobcomp_line(str(i)) for i in range(1, 101)))
    reader = JobcompReader(path, parse_jobcomp_line, map_state, forget_after_s=60)
    assert len(reader.status([str(i) for i in range(1, 101)])) == 100  # a hundred jobs ended: recorded, never asked again
    clock[0] += 61
    assert set(reader.status(["100"])) == {"100"}
    assert set(reader._lines) == {"100"} and reader._interest == {"100"}  # the other 99 lines are not kept forever
    assert reader.status(["7"])["7"].job_id == "7"  # asked again after being forgotten: the catch-up read finds it


def test_slow_queue_samples_are_spaced_so_the_job_polls_go_on(tmp_path, monkeypatch):
    """A whole-queue sample that takes long (a busy controller) stretches the sample interval to
    sample_share of the site's time; the watched jobs are polled in between with their own squeue."""
    import time as _time

    fake = FakeSlurm(tmp_path / "jobcomp.log")
    sched = SlurmScheduler("alpha", "/nonexistent/slurm.conf")
    samples: list[float] = []

    def slow_queue():
        samples.append(_time.monotonic())
        _time.sleep(0.2)
        return SlurmScheduler.queue(sched)

    sched._run, sched._ping, sched.queue = fake.run, (lambda: None), slow_queue
    db = tmp_path / "lab.db"
    cont = Continuations(db)
    fake.jobs["1"] = "RUNNING"
    cont.watch_job("alpha", "1")
    service = ContinuationService(db, {"alpha": sched}, poll_s=0.02, queue_every_s=0.1, site_min_interval_s=0.05, sample_share=0.25)
    stop = threading.Event()
    worker = threading.Thread(target=service.serve, args=(stop,))
    worker.start()
    _time.sleep(2.0)
    stop.set()
    worker.join()
    # every 0.1 s + 0.2 s each (~7 in 2 s) before; now at most one per 0.2 / 0.25 = 0.8 s
    assert 1 <= len(samples) <= 3 and min((b - a for a, b in zip(samples, samples[1:])), default=1.0) >= 0.75
    job_polls = [argv for _, argv in fake.squeue_calls() if "-j" in argv]
    assert len(job_polls) >= 5  # the watched job kept being polled between the samples
    sample_events = cont.log.tail(kinds=["site.queue"])
    assert sample_events and sample_events[-1].payload["every_s"] >= 0.75  # readers see the interval in force
    service.close()
    cont.close()


def test_serve_does_not_wait_for_a_slow_site(tmp_path):
    """One site's controller answers in 1.2 s: the other site's jobs are still polled (and their
    ends written) every site_min_interval_s, not once per slowest answer."""
    import time as _time

    db = tmp_path / "lab.db"
    cont = Continuations(db)
    fakes, scheds = {}, {}
    for site in ("slow", "fast"):
        fake = FakeSlurm(tmp_path / f"{site}.jobcomp")
        sched = SlurmScheduler(site, "/nonexistent/slurm.conf")

        def run(argv, *, stdin=None, check=True, fake=fake, slow=site == "slow"):
            if slow and argv[0] == "squeue":
                _time.sleep(1.2)
            return fake.run(argv, stdin=stdin, check=check)

        sched._run, sched._ping = run, (lambda: None)
        fake.jobs["1"] = "RUNNING"
        cont.watch_job(site, "1")
        fakes[site], scheds[site] = fake, sched
    service = ContinuationService(db, scheds, poll_s=0.05, queue_every_s=None, site_min_interval_s=0.2)
    stop = threading.Event()
    worker = threading.Thread(target=service.serve, args=(stop,))
    worker.start()
    _time.sleep(0.5)
    fakes["fast"].end("1")
    _time.sleep(0.5)
    ended = [e.key for e in cont.log.tail(kinds=["job.completed"])]
    stop.set()
    worker.join()
    assert ended == ["fast/1"]  # written within 0.5 s while the slow site's first answer was still coming
    assert len(fakes["fast"].squeue_calls()) >= 3 and len(fakes["slow"].squeue_calls()) <= 2
    service.close()
    cont.close()


def test_a_slow_poll_is_followed_at_once_and_the_scheduler_keeps_one_squeue_per_interval(tmp_path):
    """The site interval counts start to start (issue #16: counted from a poll's end, a 1.6 s poll under
    load was followed 1 s later, a cycle of 2.6 s); the scheduler's own guard keeps its squeue calls an
    interval apart whoever calls it."""
    import time as _time

    fake = FakeSlurm(tmp_path / "jobcomp.log")
    sched = SlurmScheduler("alpha", "/nonexistent/slurm.conf")

    def slow(argv, *, stdin=None, check=True):
        if argv[0] == "squeue":
            _time.sleep(0.35)
        return fake.run(argv, stdin=stdin, check=check)

    sched._run, sched._ping = slow, (lambda: None)
    db = tmp_path / "lab.db"
    cont = Continuations(db)
    fake.jobs["1"] = "RUNNING"
    cont.watch_job("alpha", "1")
    service = ContinuationService(db, {"alpha": sched}, poll_s=0.02, queue_every_s=None, site_min_interval_s=0.5)
    assert sched.listing_interval_s == 0.5  # raised to the service's interval
    stop = threading.Event()
    worker = threading.Thread(target=service.serve, args=(stop,))
    worker.start()
    _time.sleep(2.3)
    stop.set()
    worker.join()
    starts = [t for t, _ in fake.squeue_calls()]
    gaps = [b - a for a, b in zip(starts, starts[1:])]  # (each stamped 0.35 s after its start: the same shift)
    assert len(starts) >= 4 and max(gaps) < 0.65 and min(gaps) >= 0.5 - 0.01, gaps  # 0.85 s each before
    service.close()
    cont.close()
    # the guard alone: back-to-back calls from outside a service wait their turn (squeue and sacct each)
    fast = FakeSlurm(tmp_path / "jobcomp2.log")
    sched = SlurmScheduler("beta", "/nonexistent/slurm.conf", listing_interval_s=0.3)
    sched._run = fast.run
    fast.jobs["1"] = "RUNNING"
    for _ in range(3):
        sched.status(["1"])
    starts = [t for t, _ in fast.squeue_calls()]
    assert len(starts) == 3 and min(b - a for a, b in zip(starts, starts[1:])) >= 0.3 - 0.005
