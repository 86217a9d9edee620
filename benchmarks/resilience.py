"""Hot-swap fault tolerance (PHOENIX re-implementation) against restart-the-world checkpointing.

    python -m benchmarks.resilience --out FILE.json [--part all|phoenix|overhead|kills|restart|torchft] [--trials 10]

All methods train the character-level GPT of :mod:`lab.training` on the Shakespeare plays, 4 data-parallel
ranks on gloo (this machine's 2 shared CPU cores), same batches, learning-rate schedule and AdamW
hyper-parameters.

``phoenix`` (:mod:`lab.training.resilience`, 4 workers + 1 spare, replenished after each swap)
    overhead (:func:`phoenix_overhead`, three model sizes): one uninterrupted run per size and recipe
    (``phoenix_overhead_by_size``: the optimizer writes each generation and every 4th goes to the peer, the
    shipped CPU recipe; ``phoenix_overhead_by_size_every_generation``: the same with every generation sent,
    PHOENIX's per-step replication; ``phoenix_overhead_by_size_copy``: the snapshot thread copies each
    generation; ``--overhead-scale`` multiplies the
    steps) with protection alternating on/off in blocks of 5 steps; a step's time is its whole loop iteration;
    ``overhead`` = mean on / mean off - 1 with a 95% bootstrap CI over adjacent (on, off) block pairs;
    with the snapshot thread's CPU time per generation and the overhead it predicts when no core is
    idle. Recovery (:func:`phoenix_kills`): one run per size with ``trials`` SIGKILLs at *each* point of
    a step (mid gradient all-reduce, mid snapshot write, before the replica transfer, right after the
    step) at seeded random steps and ranks. ``recovery_s`` is kill -> the step after the last
    completed one done again, split into detection, rebuild (new process group), restore (state
    loaded, replay included) and recompute. ``steps_lost`` = completed steps whose work was redone;
    ``bit_identical`` against an uninterrupted run with protection off.
``restart_dcp_1``, ``restart_dcp_50``, ``async_dcp``
    ``torchrun --max-restarts`` restarting the whole worker group, resuming from the newest complete
    ``torch.distributed.checkpoint`` checkpoint (``dcp.save`` every 1 / 50 steps, ``dcp.async_save``
    every step). Overhead = (step time + checkpoint blocking time) / step time - 1 over an uninterrupted
    run; recovery as above with one kill per torchrun attempt.
``torchft`` (torchft 0.2.0: lighthouse + 4 replica groups of one process, ``Manager``, FT-DDP, ``PGTransport``)
    A killed group's process is restarted by its torchrun and heals from a live peer; the survivors
    continue without it. ``recovery_s`` = kill -> the survivors' next committed step; ``rejoin_median_s``
    = kill -> the killed group committing again; ``degraded_steps`` / ``samples_dropped`` = steps committed
    with fewer than 4 groups and the samples the missing groups did not contribute. Overhead against the
    plain DDP step time of ``restart_dcp_50``'s uninterrupted run (run ``restart`` first).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks._common import write

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # GPTConfig fields; "base" is the model every method is compared on
    "base": {"block_size": 64, "n_layer": 2, "n_head": 4, "d_model": 128},
    "mid": {"block_size": 64, "n_layer": 4, "n_head": 4, "d_model": 192},
    "large": {"block_size": 64, "n_layer": 6, "n_head": 8, "d_model": 256},
}
OVERHEAD_STEPS = {"base": 210, "mid": 110, "large": 70}  # same-run alternating blocks of 5 steps
PHASES = ["collective", "snapshot_copy", "snapshot_send", "step"]


def _ci(values, stat=np.mean, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    values = np.asarray(values, dtype=float)
    boots = [stat(rng.choice(values, len(values))) for _ in range(n)]
    return [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]


def _train_kw(size: str, steps: int) -> dict:
    return {"model": SIZES[size], "workers": 4, "steps": steps, "batch_size": 4, "lr": 3e-3, "warmup_steps": 5}


# ---------------------------------------------------------------------------------------------- phoenix
def phoenix_overhead(size: str, steps: int, block: int, workdir: Path, snapshot_write: str = "auto",
                     replica_interval: int | None = None) -> dict:
    """Same-run overhead: protection alternates on/off in blocks of ``block`` steps (on first). A step's
    time is its whole loop iteration, start to start (forward, backward, gradient all-reduce, optimizer,
    all-gather, snapshot hand-off, loss all-reduce); the first step of each block is left out (the
    previous block's last replication may spill into it), and so is the first pair of blocks (warm-up).
    ``overhead`` = mean on / mean off - 1; ``overhead_ci95``: bootstrap over the adjacent (on, off)
    block pairs' ratios. ``snapshot_cpu_ms_per_generation``: the snapshot thread's CPU time per
    generation (mean over ranks) by part; ``predicted_overhead`` = ranks x that / (cores x off step
    time): what the snapshot costs when no core is idle to hide it on (every cycle it uses is taken
    from a training process); ``hidden_fraction`` = 1 - measured / predicted.
    ``process_cpu_ms_per_step``: each rank's whole-process CPU time (user + system: every thread,
    gloo's transport threads and the kernel's loopback copies included) per step in the on and off
    blocks, mean over ranks; ``predicted_overhead_process_cpu`` = ranks x (on - off) / (cores x off
    step time), the overhead if every extra CPU second of every rank delays the step (no idle core).
    ``ratios``: every block pair's on / off - 1. ``snapshot_write``: :class:`ResilienceConfig`'s (``"auto"``: the
    optimizer writes each generation into its buffer on the CPU; ``"copy"``: the snapshot thread copies it).
    ``replica_interval``: every how many generations one goes to the peer (None: the config's default).
    ``replicated_generations_per_rank``: how many the run sent (mean over ranks)."""
    from lab.training.resilience import ResilienceConfig, run_resilient

    extra = {} if replica_interval is None else {"replica_interval": replica_interval}
    cfg = ResilienceConfig(run_dir=workdir / f"ph_over_{size}_{snapshot_write}_{replica_interval}", spares=1, protect="alternate",
                           block_steps=block, snapshot_write=snapshot_write, **extra, **_train_kw(size, steps))
    out = run_resilient(cfg, timeout=900)
    def block_pairs(t: dict[int, float]) -> list[tuple[float, float]]:
        blocks = []  # (protected, mean over the block's steps) per block, in order
        for b0 in range(1 + 2 * block, steps + 1, block):
            ss = [t[s] for s in range(b0 + 1, min(b0 + block, steps + 1)) if s in t]
            if ss:
                blocks.append((out.protected[b0], float(np.mean(ss))))
        return [(blocks[i][1], blocks[i + 1][1]) for i in range(0, len(blocks) - 1, 2) if blocks[i][0] and not blocks[i + 1][0]]

    pairs = block_pairs(out.iter_s)
    # the process CPU (user + system, every thread, the kernel's loopback copies) per step, on and off,
    # mean over the ranks: what protection costs in CPU, wherever it is spent
    cpu_pairs = [block_pairs(c) for c in out.iter_cpu_s.values()]
    cpu_on = float(np.mean([np.mean([a for a, _ in cp]) for cp in cpu_pairs]))
    cpu_off = float(np.mean([np.mean([b for _, b in cp]) for cp in cpu_pairs]))
    on = [a for a, _ in pairs]
    off = [b for _, b in pairs]
    ratios = [a / b - 1 for a, b in pairs]
    from lab.training.model import GPT, GPTConfig

    n_params = GPT(GPTConfig(vocab_size=70, **SIZES[size])).num_parameters()
    gens = out.snapshot_generations
    parts = {k: float(np.mean([c[k] / max(1, gens[w]) for w, c in out.snapshot_cpu_s.items()])) * 1e3
             for k in ("copy", "crc", "replicate")}
    cpu_gen_s = sum(parts.values()) / 1e3
    cores = os.cpu_count() or 1
    overhead = float(np.mean(on) / np.mean(off) - 1)
    predicted = cfg.workers * cpu_gen_s / (cores * float(np.mean(off)))
    predicted_cpu = cfg.workers * (cpu_on - cpu_off) / (cores * float(np.mean(off)))
    return {"size": size, "n_params": n_params, "snapshot_write": snapshot_write,
            "replica_interval": cfg.effective_replica_interval, "overhead": overhead,
            "overhead_ci95": _ci(ratios) if len(pairs) > 1 else None, "step_s_on": float(np.mean(on)),
            "step_s_off": float(np.mean(off)), "block_pairs": len(pairs), "block_steps": block,
            "snapshot_cpu_ms_per_generation": parts, "snapshot_bytes_per_rank": 4 * 3 * (-(-n_params // cfg.workers)),
            "predicted_overhead": predicted, "hidden_fraction": 1 - overhead / predicted if predicted > 0 else None,
            "process_cpu_ms_per_step": {"on": 1e3 * cpu_on, "off": 1e3 * cpu_off, "delta": 1e3 * (cpu_on - cpu_off)},
            "predicted_overhead_process_cpu": predicted_cpu,
            "cores": cores, "snapshot_thread_busy_s": out.snapshot_busy_s,
            "peak_rss_mb_per_rank": {str(w): kb / 1024 for w, kb in out.maxrss_kb.items()},
            "param_sha256": out.param_sha256, "steps": steps, "ratios": ratios}


def phoenix_kills(size: str, per_phase: int, workdir: Path, seed: int) -> dict:
    """``per_phase`` SIGKILLs at each point of a step (mid gradient all-reduce, mid snapshot write, before
    the replica transfer, right after the step) in one run, at seeded random steps (3 apart) and ranks;
    bit-identity against an uninterrupted run of the same size and steps with protection *off*."""
    from lab.training.resilience import FaultPlan, ResilienceConfig, run_resilient

    rng = random.Random(seed)
    n = per_phase * len(PHASES)
    spacing = 3
    steps = 4 + n * spacing + 4
    fault_steps = [4 + i * spacing + rng.randrange(0, spacing - 1) for i in range(n)]
    faults = [FaultPlan(step=s, rank=rng.randrange(4), phase=PHASES[i % len(PHASES)]) for i, s in enumerate(fault_steps)]
    ref = run_resilient(ResilienceConfig(run_dir=workdir / f"ph_ref_{size}", spares=1, protect="off", **_train_kw(size, steps)),
                        timeout=900)
    cfg = ResilienceConfig(run_dir=workdir / f"ph_kill_{size}", spares=1, replenish=True, faults=faults, timeout_s=10,
                           grace_s=4, **_train_kw(size, steps))
    out = run_resilient(cfg, timeout=1200)
    rec = [{"rank": f.rank, "kind": f.kind, "phase": faults[i].phase if i < len(faults) else None, "step": f.last_step,
            "generation": f.generation, "restore": f.restore, "replayed": f.replayed, "replayed_from": f.replayed_from,
            "old_worker": f.worker,
            "new_worker": f.replacement, "detection_s": f.detection_s, "rebuild_s": f.rebuild_s, "restore_s": f.restore_s,
            "recompute_s": f.recompute_s, "recovery_s": f.recovery_s, "steps_lost": f.steps_lost} for i, f in enumerate(out.failures)]
    rs = [r["recovery_s"] for r in rec]
    by_phase = {}
    for ph in PHASES:
        rr = [r for r in rec if r["phase"] == ph]
        if rr:
            by_phase[ph] = {"trials": len(rr), "recovery_s": statistics.median(r["recovery_s"] for r in rr),
                            "recovery_worst_s": max(r["recovery_s"] for r in rr),
                            "steps_lost_worst": max(r["steps_lost"] for r in rr), "replayed": sum(r["replayed"] for r in rr)}
    return {"size": size, "steps": steps, "replica_interval": cfg.effective_replica_interval, "trials": len(rec),
            "faults_planned": len(faults), "failures": rec, "by_phase": by_phase,
            "replayed_steps_worst": max((r["generation"] - r["replayed_from"] for r in rec if r["replayed"]), default=0),
            "recovery_s": statistics.median(rs), "recovery_worst_s": max(rs), "recovery_ci95": _ci(rs, np.median),
            "split_median_s": {k: statistics.median(r[k] for r in rec) for k in ("detection_s", "rebuild_s", "restore_s", "recompute_s")},
            "steps_lost": statistics.median(r["steps_lost"] for r in rec), "steps_lost_worst": max(r["steps_lost"] for r in rec),
            "replayed": sum(r["replayed"] for r in rec),
            "bit_identical": out.param_sha256 == ref.param_sha256, "reference": "uninterrupted run, protection off",
            "torn_resumes": 0 if all(r["restore"] == "memory" for r in rec) else None,
            "peak_rss_mb_per_rank": {str(w): kb / 1024 for w, kb in out.maxrss_kb.items()}, "wall_s": out.wall_s}


def _exchange_worker(rank: int, port: int, nbytes: int, reps: int, out_path: str) -> None:
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        x, y = torch.randint(0, 255, (nbytes,), dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)

        def exchange():
            works = [dist.isend(x, 1 - rank, tag=1), dist.irecv(y, 1 - rank, tag=1)]
            for w in works:
                w.wait()

        for _ in range(5):
            exchange()
        dist.barrier()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(reps):
            exchange()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if rank == 0:
            Path(out_path).write_text(json.dumps({"wall_ms": 1e3 * (t1 - t0) / reps, "user_ms": 1e3 * (r1.ru_utime - r0.ru_utime) / reps,
                                                  "system_ms": 1e3 * (r1.ru_stime - r0.ru_stime) / reps}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def replica_exchange_cost(size: str, reps: int = 200) -> dict:
    """The CPU one rank spends on one replica exchange outside the snapshot thread's clock: two processes
    send each other one generation's bytes (the size's ``[shard | moments]`` buffer, as the snapshot
    thread does: one ``isend`` and one ``irecv`` on gloo over loopback TCP), ``reps`` times. Per exchange:
    wall time and rank 0's process CPU, user (gloo's threads) and system (the kernel's TCP copies)."""
    import socket

    import torch.multiprocessing as mp

    from lab.training.model import GPT, GPTConfig

    n_params = GPT(GPTConfig(vocab_size=70, **SIZES[size])).num_parameters()
    nbytes = 4 * 3 * (-(-n_params // 4))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "exchange.json"
        mp.spawn(_exchange_worker, args=(port, nbytes, reps, str(out)), nprocs=2, join=True)
        res = json.loads(out.read_text())
    return {"size": size, "bytes": nbytes, "reps": reps, **res}


def snapshot_profile(size: str, reps: int = 30) -> dict:
    """Single-process CPU cost of one rank's snapshot work per generation (4 ranks' layout), by part, for
    the recipe this package used before and the one it uses now (no training, no network: what the
    snapshot thread takes from the cores per generation, besides the replica transfer itself).

    ``before``: the full parameter vector and the two moment shards copied to separate buffers, CRC-32 by
    :func:`zlib.crc32` over both, and a second CRC pass over the received replica (3 of 4 shards of
    bytes). ``after``: one flat [parameter shard | moments] buffer, ISA-L CRC-32, replica committed with
    the sender's CRC (verified only when read)."""
    import time as _time
    import zlib

    import torch
    from isal.isal_zlib import crc32

    from lab.training.model import GPT, GPTConfig

    torch.set_num_threads(1)
    n_params = GPT(GPTConfig(vocab_size=70, **SIZES[size])).num_parameters()
    L = -(-n_params // 4)
    flat, moments = torch.randn(4 * L), torch.randn(2 * L)
    bufs = {"params": torch.empty(4 * L), "moments": torch.empty(2 * L), "flat": torch.empty(3 * L)}

    def mv(t):
        return memoryview(t.numpy()).cast("B")

    def timed(fn):
        fn()
        c = _time.process_time()
        for _ in range(reps):
            fn()
        return (_time.process_time() - c) / reps * 1e3

    before = {"copy": timed(lambda: (bufs["params"].copy_(flat), bufs["moments"].copy_(moments))),
              "crc": timed(lambda: zlib.crc32(mv(bufs["moments"]), zlib.crc32(mv(bufs["params"])))),
              "crc_on_receive": timed(lambda: zlib.crc32(mv(bufs["moments"])))}
    after = {"copy": timed(lambda: (bufs["flat"][:L].copy_(flat[:L]), bufs["flat"][L:].copy_(moments))),
             "crc": timed(lambda: crc32(mv(bufs["flat"]))), "crc_on_receive": 0.0}
    return {"size": size, "n_params": n_params, "before_ms": before, "after_ms": after,
            "before_total_ms": sum(before.values()), "after_total_ms": sum(after.values()),
            "bytes_per_generation_before": 4 * (4 * L + 2 * L), "bytes_per_generation_after": 4 * 3 * L}


# ---------------------------------------------------------------------------------------------- restart
def restart_run(name: str, mode: str, interval: int, steps: int, kills: list, workdir: Path) -> dict:
    d = workdir / name
    d.mkdir(parents=True, exist_ok=True)
    log = d / "events.jsonl"
    log.unlink(missing_ok=True)
    spec = {"log": str(log), "ckpt": str(d / "ckpt"), "mode": mode, "interval": interval, "kills": kills,
            "train": _train_kw("base", steps)}
    (d / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "--max-restarts",
           str(len(kills)), "--monitor-interval", "0.5", str(ROOT / "benchmarks" / "_resilience_restart.py"), "--spec", str(d / "spec.json")]
    t0 = time.time()
    rc = subprocess.run(cmd, env=env, stdout=open(d / "torchrun.log", "w"), stderr=subprocess.STDOUT, timeout=1200).returncode
    ev = [json.loads(line) for line in log.read_text().splitlines()]
    final = [e for e in ev if e["kind"] == "final"]
    steps_ev = [e for e in ev if e["kind"] == "step"]
    out = {"rc": rc, "wall_s": time.time() - t0, "sha": final[-1]["sha"] if final else None,
           "maxrss_mb_rank0": final[-1]["maxrss_kb"] / 1024 if final else None}
    att0 = [e for e in steps_ev if e["attempt"] == 0]
    out["step_s"] = float(np.mean([e["step_s"] for e in att0[3:]]))
    out["save_s_per_step"] = float(np.mean([e["save_s"] for e in att0[3:]]))
    recs = []
    for a, (katt, kstep, krank) in enumerate(kills):
        killed = [e for e in ev if e["kind"] == "killed" and e["attempt"] == katt]
        nxt = [e for e in ev if e["attempt"] == katt + 1]
        if not killed or not nxt:
            continue
        tk = killed[0]["time"]
        proc = min(e["t"] for e in nxt if e["kind"] == "proc_start")
        pg = max(e["time"] for e in nxt if e["kind"] == "pg_ready")
        restored = [e for e in nxt if e["kind"] == "restored"]
        tr = max(e["time"] for e in restored)
        done = [e for e in nxt if e["kind"] == "step" and e["step"] == kstep + 1]
        if not done:
            continue
        recs.append({"step": kstep, "rank": krank, "restored_step": restored[0]["step"], "steps_lost": kstep - restored[0]["step"],
                     "detection_respawn_s": proc - tk, "rebuild_s": pg - proc, "restore_s": tr - pg,
                     "recompute_s": done[0]["time"] - tr, "recovery_s": done[0]["time"] - tk})
    out["failures"] = recs
    return out


def restart_method(name: str, mode: str, interval: int, steps: int, trials: int, workdir: Path, seed: int) -> dict:
    ref = restart_run(name + "_ref", mode, interval, steps, [], workdir)
    rng = random.Random(seed)
    lo = 3
    kill_steps = sorted(rng.sample(range(lo, steps - 1), trials))
    kills = [[a, s, rng.randrange(4)] for a, s in enumerate(kill_steps)]
    run = restart_run(name + "_kill", mode, interval, steps, kills, workdir)
    rs = [f["recovery_s"] for f in run["failures"]]
    return {"overhead": ref["save_s_per_step"] / ref["step_s"], "step_s": ref["step_s"], "save_s_per_step": ref["save_s_per_step"],
            "recovery_s": statistics.median(rs) if rs else None, "recovery_worst_s": max(rs) if rs else None,
            "recovery_ci95": _ci(rs, np.median) if len(rs) > 1 else None,
            "split_median_s": {k: statistics.median(f[k] for f in run["failures"]) for k in
                               ("detection_respawn_s", "rebuild_s", "restore_s", "recompute_s")} if rs else None,
            "steps_lost": statistics.median(f["steps_lost"] for f in run["failures"]) if rs else None,
            "steps_lost_worst": max(f["steps_lost"] for f in run["failures"]) if rs else None,
            "bit_identical": run["sha"] is not None and run["sha"] == ref["sha"], "trials": len(rs), "kills_planned": len(kills),
            "failures": run["failures"], "rc": [ref["rc"], run["rc"]], "peak_rss_mb_rank0": run["maxrss_mb_rank0"],
            "interval": interval, "mode": mode}


# ---------------------------------------------------------------------------------------------- torchft
def torchft_run(name: str, steps: int, kills: dict, workdir: Path, groups: int = 4, timeout_s: float = 5.0) -> dict:
    """One TorchFT job: a lighthouse and ``groups`` replica groups (one process each, under torchrun so a
    killed process is restarted and heals from a live peer). ``kills``: {group: [[attempt, step], ...]}."""
    import socket

    d = workdir / name
    d.mkdir(parents=True, exist_ok=True)
    log = d / "events.jsonl"
    log.unlink(missing_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {"log": str(log), "dir": str(d), "groups": groups, "min_replicas": 2, "timeout_s": timeout_s,
            "kills": {str(g): k for g, k in kills.items()}, "train": _train_kw("base", steps)}
    (d / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}
    lh = subprocess.Popen([str(Path(sys.executable).parent / "torchft_lighthouse"), "--min_replicas", "2", "--quorum_tick_ms", "100",
                           "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{port}"], stdout=open(d / "lighthouse.log", "w"),
                          stderr=subprocess.STDOUT)
    t0 = time.time()
    procs = []
    try:
        for g in range(groups):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts",
                   str(len(kills.get(g, []))), "--monitor-interval", "0.5", str(ROOT / "benchmarks" / "_resilience_torchft.py"),
                   "--spec", str(d / "spec.json"), "--group", str(g)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=open(d / f"group{g}.log", "w"), stderr=subprocess.STDOUT))
        rcs = [p.wait(timeout=1200) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        lh.kill()
        lh.wait()
    ev = [json.loads(line) for line in log.read_text().splitlines()]
    finals = {e["group"]: e for e in ev if e["kind"] == "final"}
    steps_ev = [e for e in ev if e["kind"] == "step"]
    g0 = [e for e in steps_ev if e["group"] == 0 and e["committed"] and e["participants"] == groups]
    out = {"rc": rcs, "wall_s": time.time() - t0, "sha": {g: f["sha"] for g, f in finals.items()},
           "step_s": float(np.mean([e["step_s"] for e in g0[3:]])) if len(g0) > 3 else None,
           "maxrss_mb": {g: f["maxrss_kb"] / 1024 for g, f in finals.items()}}
    recs = []
    for g, ks in kills.items():
        for katt, kstep in ks:
            killed = [e for e in ev if e["kind"] == "killed" and e["group"] == g and e["attempt"] == katt]
            if not killed:
                continue
            tk = killed[0]["time"]
            after = [e for e in steps_ev if e["time"] > tk and e["committed"]]
            surv = [e for e in after if e["group"] != g and e["step"] > kstep]  # a step begun after the kill
            back = [e for e in after if e["group"] == g]
            healed = [e for e in ev if e["kind"] == "healed" and e["group"] == g and e["time"] > tk]
            recs.append({"group": g, "step": kstep, "recovery_s": surv[0]["time"] - tk if surv else None,
                         "rejoin_s": back[0]["time"] - tk if back else None,
                         "healed_s": healed[0]["time"] - tk if healed else None})
    out["failures"] = recs
    # steps the survivors committed with fewer than all groups: the missing groups' samples are dropped
    by_step = {}
    for e in steps_ev:
        if e["committed"]:
            by_step[e["step"]] = min(by_step.get(e["step"], groups), e["participants"])
    out["degraded_steps"] = sum(1 for v in by_step.values() if v < groups)
    out["samples_dropped"] = sum((groups - v) * spec["train"]["batch_size"] for v in by_step.values())
    return out


def torchft_method(trials: int, workdir: Path, seed: int, plain_step_s: float | None) -> dict:
    steps = 10 * trials + 12
    ref = torchft_run("torchft_ref", steps, {}, workdir)
    rng = random.Random(seed)
    kills: dict = {}
    for i in range(trials):
        g = i % 4
        kills.setdefault(g, []).append([len(kills.get(g, [])), 6 + 10 * i + rng.randrange(0, 4)])
    run = torchft_run("torchft_kill", steps, kills, workdir)
    rs = [f["recovery_s"] for f in run["failures"] if f["recovery_s"] is not None]
    ref_sha = ref["sha"].get(0)
    return {"overhead": (ref["step_s"] / plain_step_s - 1) if (ref["step_s"] and plain_step_s) else None,
            "overhead_basis": "mean step time of TorchFT (4 replica groups, all participating) / plain DDP step time of "
                              "restart_dcp_50's uninterrupted run (checkpoint time excluded) - 1",
            "step_s": ref["step_s"], "plain_ddp_step_s": plain_step_s,
            "recovery_s": statistics.median(rs) if rs else None, "recovery_worst_s": max(rs) if rs else None,
            "recovery_definition": "kill -> the survivors' first committed step after the killed one (they go on without the "
                                   "killed group); the killed group's own return is rejoin_median_s",
            "rejoin_median_s": statistics.median([f["rejoin_s"] for f in run["failures"] if f["rejoin_s"] is not None] or [float("nan")]),
            "steps_lost": 0, "degraded_steps": run["degraded_steps"], "samples_dropped": run["samples_dropped"],
            "samples_dropped_reference": ref["samples_dropped"],
            "bit_identical": bool(ref_sha and run["sha"].get(0) == ref_sha), "trials": len(rs), "kills_planned": trials,
            "failures": run["failures"], "rc": [ref["rc"], run["rc"]], "peak_rss_mb": run["maxrss_mb"], "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.resilience", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", default="all", choices=["all", "profile", "phoenix", "overhead", "kills", "restart", "torchft"])
    ap.add_argument("--trials", type=int, default=10, help="kills per method (phoenix: per point of the step)")
    ap.add_argument("--kill-sizes", default="base,large", help="phoenix kill runs: comma-separated SIZES keys")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--overhead-scale", type=float, default=1.0, help="overhead runs: this many times OVERHEAD_STEPS steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result.pop("when", None)
    result.pop("machine", None)
    result["benchmark"] = "resilience"
    methods = result.setdefault("methods", {})
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="resilience-bench-"))
    if args.part in ("all", "profile", "overhead", "phoenix"):
        result["snapshot_cpu_profile"] = {size: snapshot_profile(size) for size in SIZES}
        result["replica_exchange_cost"] = {size: replica_exchange_cost(size) for size in tqdm(SIZES, desc="replica exchange cost")}
    if args.part in ("all", "overhead", "phoenix"):
        sizes, every, copied = {}, {}, {}
        for size in tqdm(SIZES, desc="phoenix overhead by size"):
            # the shipped recipe (the optimizer writes each generation, every 4th goes to the peer), right after
            # it the same with every generation sent to the peer (PHOENIX's per-step replication), then the
            # copying recipe (the CUDA one)
            steps = int(OVERHEAD_STEPS[size] * args.overhead_scale)
            sizes[size] = phoenix_overhead(size, steps, 5, workdir)
            every[size] = phoenix_overhead(size, steps, 5, workdir, replica_interval=1)
            copied[size] = phoenix_overhead(size, steps, 5, workdir, "copy")
        result["phoenix_overhead_by_size"] = sizes
        result["phoenix_overhead_by_size_every_generation"] = every
        result["phoenix_overhead_by_size_copy"] = copied
        if "phoenix" in methods:
            methods["phoenix"].update(overhead=sizes["base"]["overhead"], overhead_ci95=sizes["base"]["overhead_ci95"])
    if args.part in ("all", "phoenix", "kills"):
        kills = result.setdefault("phoenix_kills", {})
        for size in tqdm(args.kill_sizes.split(","), desc="phoenix kills"):
            kills[size] = phoenix_kills(size, args.trials, workdir, args.seed)
        sizes = result["phoenix_overhead_by_size"]
        base = kills["base"]
        methods["phoenix"] = {"overhead": sizes["base"]["overhead"], "overhead_ci95": sizes["base"]["overhead_ci95"],
                              "recovery_s": base["recovery_s"], "recovery_worst_s": base["recovery_worst_s"],
                              "steps_lost": base["steps_lost"], "steps_lost_worst": base["steps_lost_worst"],
                              "bit_identical": base["bit_identical"], "trials": base["trials"],
                              "split_median_s": base["split_median_s"], "replayed": base["replayed"],
                              "replica_interval": base["replica_interval"]}
    if args.part in ("all", "restart"):
        for name, mode, interval in tqdm([("restart_dcp_1", "sync", 1), ("restart_dcp_50", "sync", 50), ("async_dcp", "async", 1)],
                                         desc="restart baselines"):
            methods[name] = restart_method(name, mode, interval, args.steps, args.trials, workdir, args.seed)
    if args.part in ("all", "torchft"):
        plain = methods.get("restart_dcp_50", {}).get("step_s")
        methods["torchft"] = torchft_method(args.trials, workdir, args.seed, plain)
    write(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
