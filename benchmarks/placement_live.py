"""The live half of ``python -m benchmarks.placement``: four real Slurm sites under replayed load.

Four testbed sites (``lab.hpc.testbed``) stand for Theta 2022, Theta 2023, HPC2N and
NASA iPSC, sized 8, 8, 4 and 2 CPUs. Each gets background load replayed from its
trace, compressed in time (``compress`` trace seconds per real second) and scaled
in size (a job's processors as a share of its machine, times the site's CPUs, at
least 1); the jobs are ``sleep``\\ s of the compressed run time that ask for the
compressed requested walltime (Slurm's minimum, one minute, where shorter), thinned
(:func:`thin_load`) to an offered load of about the site's capacity so that queues form
in the traces' bursts without growing for the whole run. The real Slurm schedulers
decide when everything starts.

Every round, the same probe (1-2 CPUs, i.e. 50-100% of the smallest site; 4-12 s
of run time) is submitted to all four sites at once (matched rounds). Just before,
one :func:`lab.hpc.placement.place` call reads every site's live state (queue, idle
CPUs, Slurm's backfill estimate from ``sbatch --test-only``) and every policy of
:mod:`lab.hpc.placement` decides from those same candidates: ``fixed:<site>``,
``least_pending``, ``idle_first`` and ``earliest_completion`` (estimate + walltime).
A probe's completion is the
time its script finished (it prints ``date +%s.%N`` last); a policy's extra time
is its chosen site's completion minus the fastest site's.

Continuation latency: each probe has a continuation (registered through
:func:`lab.hpc.skills.submit_task`); the continuation service runs as its own
process; latency = the agent's resume time minus the probe's own end time.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.placement_replay import summarize
from lab.hpc import skills
from lab.hpc.errors import ArgumentError
from lab.hpc.placement import choose, place
from lab.hpc.schedulers.base import JobSpec
from lab.hpc.swf import load_trace
from lab.hpc.testbed import Testbed

SITES = {"theta22": ("theta_2022", 8), "theta23": ("theta_2023", 8), "hpc2n": ("hpc2n", 4), "nasa": ("nasa_ipsc_1993", 2)}
HOME = "theta22"  # the largest machine


def probe_end(event, continuation, *, path: str, stdout: str):
    """Continuation handler: record when the agent resumed, and the probe's own end time (the
    ``date +%s.%N`` its script printed last)."""
    resumed = time.time()
    end = None
    out = Path(stdout)
    if out.is_file():
        words = out.read_text().split()
        end = float(words[-1]) if words else None
    with open(path, "a") as fh:
        fh.write(f"{continuation.key} {end} {resumed} {event.kind}\n")
    return {"end": end, "resumed": resumed, "kind": event.kind}


def background_jobs(trace_name: str, cpus: int, start_offset_s: float, duration_real_s: float, compress: float) -> list[tuple[float, JobSpec]]:
    """(real seconds after the start, spec) for the trace's jobs submitted in the replayed window."""
    trace = load_trace(trace_name)
    jobs = trace.jobs
    cap = trace.header.max_procs or trace.header.max_nodes
    submit = trace.submit_epoch()
    t0 = np.nanmin(submit) + start_offset_s
    window = (submit >= t0) & (submit < t0 + duration_real_s * compress)
    run = jobs["run_time"].to_numpy(dtype=float, na_value=np.nan)
    req = jobs["requested_time"].to_numpy(dtype=float, na_value=np.nan)
    procs = jobs["allocated_processors"].to_numpy(dtype=float, na_value=np.nan)
    out = []
    for i in np.flatnonzero(window & np.isfinite(run) & np.isfinite(procs)):
        n = int(min(cpus, max(1, round(procs[i] / cap * cpus))))
        sleep = max(0.5, run[i] / compress)
        wall = req[i] if np.isfinite(req[i]) and req[i] > 0 else 2 * run[i]
        wall_s = int(max(60, np.ceil(wall / compress / 60) * 60))
        spec = JobSpec(name="bg", command=f"sleep {sleep:.2f}", ntasks=n, walltime_s=wall_s)
        out.append(((submit[i] - t0) / compress, spec))
    return out


#: Trace seconds per real second, per site (NASA's log has ~5x Theta's job rate: at 1800 its 2-CPU site got
#: 4.7 jobs/s, more than the local Slurm launches, and its queue only grew).
COMPRESS = {"theta22": 1800.0, "theta23": 1800.0, "hpc2n": 1800.0, "nasa": 600.0}
#: Background jobs are thinned (each kept with probability min(1, target / offered)) so that the offered load
#: (CPU-seconds asked per real second over the site's CPUs) is about this: queues form in the traces' bursts but
#: do not grow without bound (offered loads were 1.45-1.7 x capacity, so late rounds' probes never finished).
TARGET_LOAD = 1.0


def thin_load(jobs: list[tuple[float, JobSpec]], cpus: int, duration_s: float, target: float | None, rng: np.random.Generator) -> tuple[list[tuple[float, JobSpec]], float]:
    """Keep each background job with probability ``min(1, target / offered)``, where ``offered`` is the jobs'
    CPU-seconds (``ntasks x sleep``) per second of ``duration_s`` over ``cpus``; ``target`` None keeps all.
    Returns (kept jobs, offered load before thinning)."""
    if duration_s <= 0 or cpus <= 0:
        raise ArgumentError(f"thin_load: duration_s and cpus must be positive, got duration_s={duration_s}, cpus={cpus}")
    cpu_s = sum(spec.ntasks * float(spec.command.split()[1]) for _, spec in jobs)
    offered = cpu_s / duration_s / cpus
    if target is None or offered <= target:
        return list(jobs), offered
    keep = rng.random(len(jobs)) < target / offered
    return [j for j, k in zip(jobs, keep) if k], offered


def run_live(
    *,
    rounds: int = 36,
    period_s: float = 8.0,
    warmup_s: float = 60.0,
    compress: float | dict[str, float] | None = None,
    target_load: float | None = TARGET_LOAD,
    drain_timeout_s: float = 480.0,
    seed: int = 0,
    workdir: Path | None = None,
) -> dict:
    """Run the live comparison; returns the ``live`` JSON object (see the module docstring).

    ``rounds`` probe rounds every ``period_s`` seconds after ``warmup_s`` seconds of background
    load; ``compress`` trace seconds per real second (one number, or per site; default
    :data:`COMPRESS`); background jobs thinned to ``target_load`` (:func:`thin_load`; None: all);
    rounds whose four probes have not all finished ``drain_timeout_s`` seconds after the last round
    are left out (``rounds`` counts the complete ones; ``rounds_incomplete`` the others).
    Raises :class:`lab.hpc.testbed.TestbedError` without Slurm.
    """
    compress = dict(COMPRESS) if compress is None else ({n: float(compress) for n in SITES} if isinstance(compress, (int, float)) else dict(compress))
    rng = np.random.default_rng(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="labpl", dir="/tmp"))
    tb = Testbed(base / "tb", timeout_s=60)
    names = list(SITES)
    tb.up(names, cpus=[c for _, c in SITES.values()], memory_mb=[max(2000, 600 * c) for _, c in SITES.values()])
    service = None
    fed = None
    try:
        db = base / "lab.db"
        fed = skills.Federation.from_folder(tb.sites_dir, db=db, workdir=base / "jobs")
        service = subprocess.Popen(
            [sys.executable, "-m", "lab.hpc.continuation", "serve", "--sites", str(tb.sites_dir), "--db", str(db), "--poll-s", "0.2", "--queue-every-s", "0"],
            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        duration = warmup_s + rounds * period_s + 30
        # Background load: one submitting thread per site, in real time.
        offsets = {name: float(rng.uniform(7, 21)) * 86400 for name in names}  # skip each trace's first week
        loads, offered = {}, {}
        thin_rng = np.random.default_rng([seed, 1])  # its own stream: the probes' draws stay those of the seed
        for name in names:
            jobs = background_jobs(SITES[name][0], SITES[name][1], offsets[name], duration, compress[name])
            loads[name], offered[name] = thin_load(jobs, SITES[name][1], duration, target_load, thin_rng)
        t_start = time.time()
        stop = threading.Event()

        def feed(name):
            sched = fed.scheduler(name)
            for at, spec in loads[name]:
                delay = t_start + at - time.time()
                if delay > 0 and stop.wait(delay):
                    return
                try:
                    sched.submit(spec.model_copy(update={"workdir": base / "jobs" / name, "stdout": "/dev/null"}))
                except Exception:  # a refused background job does not stop the load
                    pass

        threads = [threading.Thread(target=feed, args=(n,), daemon=True) for n in names]
        for th in threads:
            th.start()
        time.sleep(warmup_s)
        calls = base / "resumes.txt"
        probes = []  # (round, site, key, stdout)
        decisions = []
        for r in tqdm(range(rounds), desc="live rounds", unit="round"):
            ntasks = int(rng.integers(1, 3))
            run_s = float(rng.uniform(4, 12))
            spec = JobSpec(name=f"probe{r}", command=f"sleep {run_s:.2f}; date +%s.%N", ntasks=ntasks, walltime_s=60)
            t = time.time()
            # one look at the sites (queues and sbatch --test-only estimates); every policy of
            # lab.hpc.placement decides from those same candidates
            ec = place(spec, fed.sites, fed.schedulers, "earliest_completion", now=t)
            chosen = {"earliest_completion": ec.chosen}
            for policy in ("least_pending", "idle_first"):
                chosen[policy] = choose(policy, ec.candidates, processors=ntasks).site
            for name in names:
                chosen[f"fixed:{name}"] = choose("fixed_site", ec.candidates, home=name).site
            shown = {
                c.site: {"pending": c.pending, "idle_cpus": c.idle_cpus, "estimated_start_in_s": None if c.estimated_start is None else round(c.estimated_start - t, 2)}
                for c in ec.candidates
            }
            decisions.append({"round": r, "time": t, "ntasks": ntasks, "run_s": run_s, "chosen": chosen, "shown": shown})
            for name in names:
                req = skills.ResourceRequest(name=f"probe{r}", command=spec.command, ntasks=ntasks, walltime_s=60)
                out = skills.submit_task(fed, skills.SubmitTaskInput(request=req, site=name))
                cid = fed.continuations.register(f"{name}/{out.job_id}", "benchmarks.placement_live:probe_end", args={"path": str(calls), "stdout": out.stdout})
                probes.append((r, name, f"{name}/{out.job_id}", cid))
            next_round = t_start + warmup_s + (r + 1) * period_s
            while time.time() < next_round:
                fed.continuations.resume_ready()
                time.sleep(0.1)
        deadline = time.time() + drain_timeout_s
        with tqdm(total=len(probes), desc="probes finished", unit="probe") as bar:
            while time.time() < deadline and fed.continuations.waiting():
                fed.continuations.resume_ready()
                bar.update(max(0, len(probes) - len(fed.continuations.waiting()) - bar.n))
                time.sleep(0.1)
        stop.set()
    finally:
        if service is not None:
            service.terminate()
            service.wait(timeout=30)
        if fed is not None:
            results = {cid: fed.continuations.get(cid) for *_, cid in probes} if "probes" in locals() else {}
            fed.close()
        tb.down()

    end = {}
    latencies = []
    states = {}
    for r, name, key, cid in probes:
        rec = results[cid]
        states[rec.state] = states.get(rec.state, 0) + 1
        if rec.state != "done" or not rec.result or rec.result.get("end") is None:
            print(f"probe {key}: {rec.state} {rec.error or ''}", file=sys.stderr)
        if rec.state == "done" and rec.result and rec.result["end"] is not None and rec.result["kind"] == "job.completed":
            end[(r, name)] = rec.result["end"]
            latencies.append(rec.result["resumed"] - rec.result["end"])
    complete_rounds = [d for d in decisions if all((d["round"], n) in end for n in names)]
    policies = list(complete_rounds[0]["chosen"]) if complete_rounds else []
    extra = {p: [] for p in policies}
    nontrivial, round_ids = [], []
    for d in complete_rounds:
        ends = {n: end[(d["round"], n)] for n in names}
        fastest = min(ends.values())
        nontrivial.append(max(ends.values()) - fastest > 60.0)
        round_ids.append(d["round"])
        for p in policies:
            extra[p].append(ends[d["chosen"][p]] - fastest)
    per_policy = {p: summarize(extra[p], nontrivial, round_ids) for p in policies}
    per_round = []
    for i, d in enumerate(complete_rounds):
        ends = {n: end[(d["round"], n)] for n in names}
        per_round.append({
            "round": d["round"], "ntasks": d["ntasks"], "run_s": round(d["run_s"], 2), "chosen": d["chosen"], "shown": d["shown"],
            "completion_after_decision_s": {n: round(ends[n] - d["time"], 2) for n in names},
            "extra_s": {p: round(extra[p][i], 2) for p in policies},
        })
    differ = [i for i, d in enumerate(complete_rounds) if d["chosen"]["earliest_completion"] != d["chosen"]["least_pending"]]
    ec_vs_lp = {
        "rounds_differ": len(differ),
        "rounds": [complete_rounds[i]["round"] for i in differ],
        "mean_extra_s_on_those": {p: float(np.mean([extra[p][i] for i in differ])) if differ else None for p in ("earliest_completion", "least_pending", "idle_first")},
        "earliest_completion_better": int(sum(extra["earliest_completion"][i] < extra["least_pending"][i] for i in differ)),
        "least_pending_better": int(sum(extra["earliest_completion"][i] > extra["least_pending"][i] for i in differ)),
    } if complete_rounds else None
    waited = {n: float(np.mean([r["completion_after_decision_s"][n] - r["run_s"] for r in per_round])) if per_round else None for n in names}
    fixed = {p: per_policy[p]["mean_extra_s"]["value"] for p in policies if p.startswith("fixed:")}
    return {
        "rounds": len(complete_rounds),
        "rounds_incomplete": len(decisions) - len(complete_rounds),
        "jobs": len(complete_rounds) * len(names),
        "nontrivial_share": float(np.mean(nontrivial)) if nontrivial else None,
        "policies": per_policy,
        "best_fixed_site": min(fixed, key=fixed.get).split(":", 1)[1] if fixed else None,
        "earliest_completion_vs_least_pending": ec_vs_lp,
        "mean_wait_s": waited,
        "per_round": per_round,
        "continuation": {
            "median_s": statistics.median(latencies) if latencies else None,
            "p95_s": float(np.percentile(latencies, 95)) if latencies else None,
            "n": len(latencies),
        },
        "inputs": {
            "sites": {
                n: {"trace": SITES[n][0], "cpus": SITES[n][1], "trace_offset_days": round(offsets[n] / 86400, 2), "background_jobs": len(loads[n]),
                    "compress": compress[n], "offered_load_before_thinning": round(offered[n], 3)}
                for n in names
            },
            "compress": compress,
            "target_load": target_load,
            "drain_timeout_s": drain_timeout_s,
            "rounds_requested": rounds,
            "period_s": period_s,
            "warmup_s": warmup_s,
            "probe": "1-2 CPUs (50-100% of the smallest site), 4-12 s sleep, 60 s walltime, submitted to every site each round",
            "home": HOME,
            "seed": seed,
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run_live(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=2))
