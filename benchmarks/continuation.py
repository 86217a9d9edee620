"""Continuation at scale on four real local Slurm sites (issue #16).

``python -m benchmarks.continuation --out benchmarks/results/continuation.json [--part scale|held|all]``

Two parts (each can be run alone; the output file keeps the other part's keys and any others):

``scale``: four :mod:`lab.hpc.testbed` sites (32 CPUs declared each, ``MinJobAge=2`` so
Slurm forgets ended jobs at its next purge). For each job count (default 100, 500, 2,000),
the jobs are spread over the sites; each ``sleep``\\ s until one of a few common targets
(waves two seconds apart, so hundreds finish in the same second) and prints
``date +%s.%N`` last. The continuation service runs as deployed, its own process
(``python -m lab.hpc.continuation serve``, poll 0.2 s, queue samples every 5 s, one query per
site per second), with each Slurm client tool it runs behind a shim on its PATH that logs the
call's start, end and kind; a :class:`~lab.hpc.continuation.Continuations` resumer runs as in
the agent's kernel (a thread of the benchmark's process, its own database connection). Each job
has a continuation; latency = resume time minus the job's own end stamp, split into the stamp ->
the job's completion record in the jobcomp file (Slurm; polled every 50 ms) -> the event written
(service) -> the handler run (resumer). 5% of the jobs are watched only after
they ended *and* squeue forgot them (``squeue -j`` no longer lists them): like jobs that left
squeue between two polls (a stalled or restarted service), they must be found in the
completion file; their latency counts from the moment they are watched.
Reported per job count: ``p50_s``, ``p95_s``, ``max_s`` (95% bootstrap CI of p95), ``lost``
(continuations never resumed within 90 s of the last job's end), ``resumed_twice`` (handler
calls or ``continuation.resumed`` events beyond one per continuation),
``max_squeue_calls_per_site_s`` (most ``squeue`` calls one site got in any one-second window)
and the same for ``sacct``.

``held``: one site holds N jobs (held, ``sbatch -H``; all but 50 submitted by user
``nobody``: other users' jobs) for N = 100 .. 5,000; 50 of them are watched. Timed per N:
the job poll (:meth:`~lab.hpc.schedulers.slurm.SlurmScheduler.status` on the 50),
the old poll (the whole ``squeue --json`` parsed, as before issue #16), and the
queue sample (:meth:`~lab.hpc.schedulers.slurm.SlurmScheduler.queue`, whole queue by
design, taken every ``queue_every_s``; one ``squeue -O`` listing since the sample's ``--json``
was found to block the job polls).

The naive floor for latency is one poll per site per second: a job's end seen at the site's next
``squeue``, so p50 >= ~0.5 s. The service reads the completion records every poll instead (no
controller call), so an end is seen within a poll of Slurm recording it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks._common import write
from lab.hpc.continuation import Continuations, job_key
from lab.hpc.testbed import Testbed

SITES = ["alpha", "beta", "gamma", "delta"]
CALLS: Counter = Counter()  # continuation id -> handler calls (this process)
_LOCK = threading.Lock()


def on_end(event, continuation):
    """The benchmark's continuation handler: when it ran (epoch seconds); counts its calls."""
    with _LOCK:
        CALLS[continuation.id] += 1
    return {"t": time.time()}


def _sbatch(conf: Path, script: str, *, user: str | None = None, hold: bool = False) -> str:
    argv = ["sbatch", "--parsable"] + (["-H"] if hold else [])
    if user:
        argv = ["/usr/sbin/runuser", "-u", user, "--"] + argv
    r = subprocess.run(argv, input=script, capture_output=True, text=True, env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin:/usr/sbin"}, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"sbatch failed: {r.stderr}")
    return r.stdout.strip().split(";")[0]


# Each Slurm client call the service makes goes through a shim on its PATH that logs when its process was
# forked (the kernel's start time in clock ticks, /proc/self/stat field 22: the moment the client issued it,
# unaffected by how long the shell then waited for a CPU), when the shell started and ended it (bash's
# $EPOCHREALTIME: no extra process), the site (SLURM_CONF) and what it was, then runs the real tool.
_SHIM = """#!/bin/bash
s=$EPOCHREALTIME
read -r -a st < /proc/$$/stat
{real} "$@"
rc=$?
case " $* " in *" -j "*) what=poll ;; *) what=sample ;; esac
[ {name} = squeue ] || what={name}
[ {name} = scontrol ] && what="scontrol $1"
echo "$s $EPOCHREALTIME ${{st[21]}} {name} $SLURM_CONF $what" >> {log}
exit $rc
"""


def _shims(bin_dir: Path, log: Path) -> Path:
    """``bin_dir`` with a logging shim for each Slurm client tool the service runs (see ``_SHIM``)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("squeue", "sacct", "sinfo", "scontrol"):
        real = shutil.which(name)
        if real is None:
            continue
        (bin_dir / name).write_text(_SHIM.format(real=real, name=name, log=log))
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _read_calls(log: Path, conf_site: dict[str, str]) -> dict[str, list]:
    """site -> [(start, end, command, what, forked)] from the shims' log (forked: seconds since boot, to one clock tick)."""
    calls: dict[str, list] = {s: [] for s in conf_site.values()}
    if not log.exists():
        return calls
    tick = os.sysconf("SC_CLK_TCK")
    for line in log.read_text().splitlines():
        parts = line.split(" ", 5)
        if len(parts) == 6 and parts[4] in conf_site:
            calls[conf_site[parts[4]]].append((float(parts[0]), float(parts[1]), parts[3], parts[5], int(parts[2]) / tick))
    return calls


def _durations(calls: dict[str, list]) -> dict:
    """Per kind of call, over all sites: how many, and the median, p95 and max seconds each took."""
    by: dict[str, list[float]] = {}
    for log in calls.values():
        for began, ended, _, what, _ in log:
            by.setdefault(what, []).append(ended - began)
    return {k: {"n": len(v), "p50_s": round(statistics.median(v), 3), "p95_s": round(float(np.percentile(v, 95)), 3),
                "max_s": round(max(v), 3), "total_s": round(sum(v), 1)} for k, v in sorted(by.items())}


class _JobcompWatch(threading.Thread):
    """When each job's completion record appeared in its site's jobcomp file (polled every ``every_s``)."""

    def __init__(self, paths: dict[str, Path], every_s: float = 0.05):
        super().__init__(daemon=True)
        self.paths, self.every_s = paths, every_s
        self.seen: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()

    def run(self):
        offsets = dict.fromkeys(self.paths, 0)
        while not self.stop.is_set():
            for site, path in self.paths.items():
                try:
                    with path.open("rb") as fh:
                        fh.seek(offsets[site])
                        data = fh.read()
                except OSError:
                    continue
                now = time.time()
                cut = data.rfind(b"\n") + 1
                offsets[site] += cut
                for raw in data[:cut].splitlines():
                    if raw.startswith(b"JobId="):
                        self.seen.setdefault((site, raw[6:].split(b" ", 1)[0].decode()), now)
            self.stop.wait(self.every_s)


def _max_per_second(times: list[float], resolution: float = 0.0) -> int:
    """Most of ``times`` (seconds) in any window of one second; times known to ``resolution`` seconds
    (two calls a clock tick short of a second apart may have been a second apart)."""
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - 1.0 + resolution:
            j += 1
        best = max(best, i - j + 1)
    return best


def _set_min_job_age(site, seconds: int) -> None:
    text = re.sub(r"^MinJobAge=\d+", f"MinJobAge={seconds}", site.conf.read_text(), flags=re.M)
    site.conf.write_text(text)
    subprocess.run(["scontrol", "reconfigure"], env=site.env(), check=True, capture_output=True, timeout=60)


def _listed(site, ids: list[str]) -> set[str]:
    if not ids:
        return set()
    r = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i"], env=site.env(), capture_output=True, text=True, timeout=60)
    return set(r.stdout.split())


def _p95_ci(values: list[float], seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    arr = np.asarray(values)
    boots = [np.percentile(rng.choice(arr, arr.size), 95) for _ in range(1000)]
    return [round(float(np.percentile(boots, 2.5)), 3), round(float(np.percentile(boots, 97.5)), 3)]


def run_scale(tb: Testbed, sites, n_jobs: int, work: Path, *, late_share: float = 0.05, wave_s: float = 2.0,
              poll_s: float = 0.2, queue_every_s: float = 5.0) -> dict:
    db = work / f"scale-{n_jobs}.db"
    out_dir = work / f"out-{n_jobs}"
    for s in sites:
        (out_dir / s.name).mkdir(parents=True)
    calls_log = work / f"calls-{n_jobs}.log"
    shims = _shims(work / "shims", calls_log)
    agent = Continuations(db)
    # the service as deployed: its own process (python -m lab.hpc.continuation serve), every Slurm call through the shims
    service = subprocess.Popen(
        [sys.executable, "-m", "lab.hpc.continuation", "serve", "--sites", str(tb.sites_dir), "--db", str(db),
         "--poll-s", str(poll_s), "--queue-every-s", str(queue_every_s), "--site-min-interval-s", "1"],
        env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}, stdout=subprocess.DEVNULL,
        stderr=(work / f"service-{n_jobs}.err").open("w"), start_new_session=True)
    # the resumer as in the agent's kernel: a thread of this process, its own database connection
    resumer = Continuations(db)
    watch = _JobcompWatch({s.name: s.dir / "jobcomp.log" for s in sites})
    stop = threading.Event()
    threads = [threading.Thread(target=resumer.run, args=(stop, 0.1), daemon=True), watch]
    for t in threads:
        t.start()
    loads = [os.getloadavg()[0]]  # the machine's 1-minute load average: at the start, then while the jobs end
    n_waves = max(1, n_jobs // 200)
    t0 = time.time() + 8.0  # first wave's target: after the submissions have begun
    jobs = []  # (site, job_id, late)
    plan = [(sites[i % len(sites)], t0 + wave_s * (i % n_waves), (i % round(1 / late_share)) == 0) for i in range(n_jobs)]

    def submit(item):
        site, target, late = item
        script = (f"#!/bin/bash\n#SBATCH -J cont\n#SBATCH -t 00:05:00\n#SBATCH -n 1\n#SBATCH -o {out_dir}/{site.name}/%j.out\n"
                  f"sleep $(awk -v t={target:.3f} -v n=$(date +%s.%N) 'BEGIN{{d=t-n; print (d>0?d:0)}}')\ndate +%s.%N\n")
        return site, _sbatch(site.conf, script), late

    cids = {}
    try:
        with ThreadPoolExecutor(6) as pool:
            for site, job_id, late in tqdm(pool.map(submit, plan), total=n_jobs, desc=f"submit {n_jobs}", leave=False):
                jobs.append((site, job_id, late))
                if not late:
                    agent.watch_job(site.name, job_id)
                    cids[(site.name, job_id)] = agent.register(job_key(site.name, job_id), "benchmarks.continuation:on_end")
        submitted_by = time.time()
        # the late jobs: wait until they ended and squeue forgot them, then watch them
        late_jobs = [(s, j) for s, j, late in jobs if late]
        watched_at = {}
        deadline = time.time() + 150
        pending_late = list(late_jobs)
        while pending_late and time.time() < deadline:
            time.sleep(2.0)
            still = []
            for s in sites:
                ids = [j for ss, j in pending_late if ss is s]
                listed = _listed(s, ids)
                for j in ids:
                    if j in listed:
                        still.append((s, j))
                    else:
                        agent.watch_job(s.name, j)
                        cids[(s.name, j)] = agent.register(job_key(s.name, j), "benchmarks.continuation:on_end")
                        watched_at[(s.name, j)] = time.time()
            pending_late = still
        # wait for every continuation (90 s after the last job's end at most)
        last_end_deadline = max(time.time(), t0 + wave_s * n_waves) + 90
        while time.time() < last_end_deadline:
            loads.append(os.getloadavg()[0])
            if len(cids) == n_jobs and agent.count("waiting") == 0:
                break
            time.sleep(0.5)
    finally:
        service.terminate()
        try:
            service.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        service_err = (work / f"service-{n_jobs}.err").read_text()
        stop.set()
        watch.stop.set()
        for t in threads:
            t.join(timeout=30)
    # latencies
    lat, lat_late, lost, no_stamp = [], [], 0, 0
    detect, resume, slurm_end, recorded, seen_after_record = [], [], [], [], []
    resumed_events = Counter(e.payload["id"] for e in agent.log.tail(kinds=["continuation.resumed"]))
    for s, j, late in jobs:
        cid = cids.get((s.name, j))
        if cid is None:
            lost += 1
            continue
        rec = agent.get(cid)
        if rec.state != "done":
            lost += 1
            continue
        if late:
            lat_late.append(rec.result["t"] - watched_at[(s.name, j)])
            continue
        try:
            stamp = float((out_dir / s.name / f"{j}.out").read_text().split()[-1])
        except (OSError, IndexError, ValueError):
            no_stamp += 1
            continue
        lat.append(rec.result["t"] - stamp)
        ev = agent.log.tail(rec.event_seq - 1, limit=1)[0]
        detect.append(ev.time - stamp)  # the job's end seen by the service and written
        resume.append(rec.result["t"] - ev.time)  # then picked up by the resumer
        if ev.payload.get("end_time"):
            slurm_end.append(ev.payload["end_time"] + 1.0 - stamp)  # Slurm's end (whole seconds, rounded up) after the stamp
        if (s.name, j) in watch.seen:
            recorded.append(watch.seen[(s.name, j)] - stamp)  # its completion record in the jobcomp file (50 ms polls)
            seen_after_record.append(ev.time - watch.seen[(s.name, j)])
    twice = sum(max(0, c - 1) for c in CALLS.values()) + sum(max(0, c - 1) for c in resumed_events.values())
    calls = _read_calls(calls_log, {str(s.conf): s.name for s in sites})
    squeue = {n: [f for _, _, cmd, _, f in c if cmd == "squeue"] for n, c in calls.items()}
    sacct = {n: [f for _, _, cmd, _, f in c if cmd == "sacct"] for n, c in calls.items()}
    agent.close()
    resumer.close()
    CALLS.clear()

    def pct(v, q):
        return round(float(np.percentile(v, q)), 3) if v else None

    row = {
        "jobs": n_jobs,
        "sites": len(sites),
        "p50_s": round(statistics.median(lat), 3),
        "p95_s": round(float(np.percentile(lat, 95)), 3),
        "p95_ci95_s": _p95_ci(lat),
        "max_s": round(max(lat), 3),
        "latency_jobs": len(lat),
        # stamp -> completion record (Slurm) -> event written (service) -> handler ran (resumer)
        "breakdown_p95_s": {
            "recorded_after_stamp": pct(recorded, 95),
            "seen_after_recorded": pct(seen_after_record, 95),
            "seen_by_service": pct(detect, 95),
            "resumed_after_seen": pct(resume, 95),
            "slurm_end_after_stamp_upper": pct(slurm_end, 95),
        },
        "breakdown_median_s": {
            "recorded_after_stamp": pct(recorded, 50), "seen_after_recorded": pct(seen_after_record, 50),
            "seen_by_service": pct(detect, 50), "resumed_after_seen": pct(resume, 50),
        },
        "no_end_stamp": no_stamp,
        "lost": lost,
        "resumed_twice": twice,
        "left_squeue_before_watched": len(late_jobs),
        "left_squeue_resumed": len(lat_late),
        "left_squeue_p95_s": round(float(np.percentile(lat_late, 95)), 3) if lat_late else None,
        # counted at the calls' fork times (one clock tick resolution)
        "max_squeue_calls_per_site_s": max(_max_per_second(t, 1 / os.sysconf("SC_CLK_TCK")) for t in squeue.values()),
        "max_sacct_calls_per_site_s": max((_max_per_second(t, 1 / os.sysconf("SC_CLK_TCK")) for t in sacct.values()), default=0),
        "min_squeue_gap_s": round(min((b - a for t in squeue.values() for a, b in zip(sorted(t), sorted(t)[1:])), default=float("nan")), 3),
        "squeue_calls": sum(len(t) for t in squeue.values()),
        "slurm_calls": _durations(calls),
        "service_stderr_tail": (service_err or "").strip()[-500:],
        "submit_s": round(submitted_by - (t0 - 8.0), 1),
        "waves": n_waves,
        "load_avg_1m": {"start": round(loads[0], 2), "max": round(max(loads), 2)},
    }
    return row


def run_held(tb: Testbed, site, work: Path, levels: list[int], *, watched: int = 50, reps: int = 20) -> dict:
    sched = site.scheduler()
    script = "#!/bin/bash\n#SBATCH -J held\n#SBATCH -t 00:05:00\n#SBATCH -o /dev/null\ntrue\n"
    own = [_sbatch(site.conf, script, hold=True) for _ in range(watched)]
    held = watched
    rows = {}

    def others(n):
        # other users' jobs, in batches of 100 per runuser call
        batch = f"for i in $(seq {n}); do sbatch --parsable -H -J other -t 00:05:00 -o /dev/null --wrap true >/dev/null || exit 1; done"
        subprocess.run(["/usr/sbin/runuser", "-u", "nobody", "--", "bash", "-c", batch], env={"SLURM_CONF": str(site.conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, check=True, timeout=600)

    for level in tqdm(levels, desc="held"):
        need = level - held
        if need > 0:
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(others, [100] * (need // 100) + ([need % 100] if need % 100 else [])))
            held = level
        count = int(subprocess.run(["squeue", "-h", "-o", "%i"], env=site.env(), capture_output=True, text=True).stdout.count("\n"))

        def timed(fn, n):
            ts = []
            for _ in range(n):
                a = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - a) * 1000)
            return {"median_ms": round(statistics.median(ts), 1), "max_ms": round(max(ts), 1)}

        poll = timed(lambda: sched.status(own), reps)

        def old_poll():  # what status() did before issue #16: the whole squeue --json, parsed
            sched._ping()
            live = {str(j.get("job_id")): j for j in sched._squeue_jobs()}
            return {i: sched._from_squeue(live[i]) for i in own if i in live}

        old = timed(old_poll, max(5, reps // 4))
        sample = timed(sched.queue, 5)
        rows[str(level)] = {"jobs_in_squeue": count, **poll, "old_json_poll": old, "queue_sample": sample}
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.continuation", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--part", choices=["scale", "held", "all"], default="all")
    p.add_argument("--jobs", type=int, nargs="+", default=[100, 500, 2000])
    p.add_argument("--held", type=int, nargs="+", default=[100, 500, 1000, 2000, 5000])
    p.add_argument("--cpus", type=int, default=32, help="CPUs declared per site")
    p.add_argument("--compute-nice", type=int, default=0,
                   help="nice value of the sites' node daemons and so of their jobs (Testbed.up's compute_nice)")
    args = p.parse_args(argv)
    result = {}
    if args.out.exists():
        result = json.loads(args.out.read_text())
        for k in ("when", "machine"):
            result.pop(k, None)
    result["benchmark"] = "continuation"
    with tempfile.TemporaryDirectory(prefix="cont-bench-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # user nobody (the other users' jobs) must read the sites' slurm.conf
        with Testbed(work / "tb") as tb:
            sites = tb.up(SITES, cpus=args.cpus, memory_mb=args.cpus * 500, compute_nice=args.compute_nice)
            if args.part in ("held", "all"):
                result["poll_ms_by_jobs_held"] = run_held(tb, sites[0], work, args.held)
                result["poll_ms_by_jobs_held_note"] = (
                    "jobs held by one site (sbatch -H; all but the 50 watched submitted by user nobody); "
                    "median_ms/max_ms: SlurmScheduler.status on the 50 watched jobs (squeue -j, 20 polls); "
                    "old_json_poll: the whole squeue --json parsed (before issue #16); queue_sample: SlurmScheduler.queue "
                    "(whole queue by design, every queue_every_s: one squeue -O listing + sinfo --json)"
                )
                for s in sites:
                    subprocess.run(["scancel", "--state=PENDING", "-u", "nobody"], env=s.env(), capture_output=True)
                    subprocess.run(["scancel", "--state=PENDING", "-u", "root"], env=s.env(), capture_output=True)
            if args.part in ("scale", "all"):
                for s in sites:
                    _set_min_job_age(s, 2)
                rows = []
                for n in args.jobs:
                    rows.append(run_scale(tb, sites, n, work))
                    tqdm.write(json.dumps(rows[-1]))
                result["scale_by_jobs"] = rows
                result["scale"] = max(rows, key=lambda r: r["jobs"])
                result["scale_note"] = (
                    f"{len(SITES)} real local Slurm 22.05 sites ({args.cpus} CPUs declared each on a 2-core VM, MinJobAge=2); "
                    "latency = continuation resume time - the job's own end stamp (date +%s.%N), excluding the "
                    "left_squeue jobs (watched only after squeue forgot them; their latency counts from being watched); "
                    "service: site_min_interval_s=1, poll_s=0.2, queue samples every 5 s; resumer polls every 0.1 s"
                )
    write(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
