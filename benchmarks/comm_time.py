"""Gradient communication where it costs time: 2-rank training over a rate-shaped link (network namespaces).

    python -m benchmarks.comm --part time --out benchmarks/results/comm.json   (as root; merged into the file)

Issue #23, item 1. On loopback gloo a few-MB all-reduce is nearly free, so a codec that sends fewer bytes
cannot show. Here each rank runs in its own network namespace (:class:`lab.training.netns.ShapedNetwork`:
a veth per host on a bridge, ``htb`` on each host's egress), so every gradient byte crosses a link of
a set rate. Only the namespaces' own addresses are used; the namespaces, bridge and veths are removed
afterwards (also after a failure). Where namespaces cannot be made (not root, no ``tc``) the part is
skipped with the reason (:func:`lab.training.netns.netns_unavailable`).

Link rates
----------
A calibration run (fp32, unshaped link, ``calib_steps`` steps) gives the median step time ``t0`` (almost
all compute). For a target share ``s`` of the step spent in fp32's all-reduce, the link rate is the one at
which the all-reduce's wire bytes (ring all-reduce over 2 ranks: each rank sends ``4 n`` bytes) take
``s / (1 - s) * t0``. The share each rate really gave is reported (``measured_fp32_comm_share`` =
``1 - t0 / fp32 step``, from the fp32 runs at that rate), with the TCP goodput measured on the link.

Methods and metrics
-------------------
fp32 (DDP's all-reduce through the fp32 hook), bf16, fp8 (E4M3 per tensor), gift_fp8 (the bytes-curve
part's main configuration: its layers, eigenpairs, period and warm-up, rank-0 statistics, no error
measurement) with dense AdamS, and SCAPE 90% / 99% (their committed best variants and rates), all with
the learning rates tuned in the committed ``training`` part (dense AdamS's for the codecs; not re-tuned
here: equal, zero extra tuning for every method), ``seeds`` seeds each, all runs of one share in one
namespace network, interleaved by seed. Per run: median ``step_s`` (wall time of a step, compute plus
communication plus the codec's encode/decode inside the hook) and ``time_to_target_s``: the summed step
times up to the first evaluation whose validation loss is at or below the target, the fp32 run's
validation loss at step ``target_frac * steps`` for the same seed (None when never reached). Per share
and method: means over seeds with 95% t intervals, and ``speedup_vs_fp32`` = fp32's mean step time /
the method's (``time_to_target_speedup_vs_fp32`` likewise; the per-seed ratios are also kept).

Profile (``profile``): where GIFT's step time went (the committed configuration: every candidate
tracked, factors of all 19 layers refreshed every 10 steps and every step of a 20-step warm-up,
rank 32, error measured every step) against the bytes-goal configuration, in one process: the hook's
seconds per step (median and mean over ``profile_steps`` steps) and the top functions by cumulative
time (cProfile), FP8's hook for reference.
"""

from __future__ import annotations

import cProfile
import json
import math
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from lab.training.comm.hooks.base import FlatBucket
from lab.training.model import GPTConfig

RESULTS = Path(__file__).resolve().parent / "results" / "comm.json"
_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class TimeSettings:
    model: dict = field(default_factory=lambda: {"n_layer": 2, "d_model": 128, "n_head": 4, "block_size": 64})
    batch_size: int = 16
    steps: int = 120
    warmup_steps: int = 20
    eval_interval: int = 15
    eval_batches: int = 8
    seeds: tuple[int, ...] = (0, 1, 2)
    shares: tuple[float, ...] = (0.25, 0.5, 0.75)
    calib_steps: int = 30
    target_frac: float = 0.75
    dense_lr: float = 1e-3
    dense_betas: tuple[float, float] = (0.7, 0.95)
    scape: dict = field(default_factory=lambda: {
        "scape90": (0.012, {"sparsity": 0.9, "explore": 1.0, "mask_sync": "local", "betas": (0.5, 0.95)}),
        "scape99": (0.032, {"sparsity": 0.99, "explore": 0.2, "mask_sync": "local", "betas": (0.5, 0.95)}),
    })
    methods: tuple[str, ...] = ("fp32", "bf16", "fp8", "gift_fp8", "gift_fp8_subspace", "scape90", "scape99")
    profile_steps: int = 40
    quick: bool = False


FULL_TIME = TimeSettings()
QUICK_TIME = TimeSettings(model={"n_layer": 1, "d_model": 32, "n_head": 2, "block_size": 32}, batch_size=4, steps=8,
                          warmup_steps=2, eval_interval=4, eval_batches=2, seeds=(0,), shares=(0.5,), calib_steps=4,
                          methods=("fp32", "fp8"), profile_steps=4, quick=True)

#: GIFT's configuration when no bytes-curve result is present (the layers the budget rule chose in the committed run)
_DEFAULT_GIFT = {"layers": ["head", "tok_emb", "pos_emb"], "n_eigenpairs": 8, "refresh_every": 50, "refresh_warmup": 5}


def gift_kwargs(results: Path = RESULTS) -> dict:
    """GIFT's hook keywords for the timed runs: the bytes-curve part's main row (fixed layers, rank-0 statistics)."""
    main = None
    if results.exists():
        main = (json.loads(results.read_text()).get("bytes_curve") or {}).get("main")
    cfg = ({"layers": main["selected"], "n_eigenpairs": main["n_eigenpairs"], "refresh_every": main["refresh_every"],
            "refresh_warmup": main["refresh_warmup"]} if main else dict(_DEFAULT_GIFT))
    return {**cfg, "damping": 1.0, "ema": 0.5, "track": "selected", "statistics": "rank0", "reselect_every": None}


def t_ci95(xs: list[float]) -> list[float] | None:
    """Two-sided 95% Student-t interval of the mean (None for fewer than 2 values)."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    from scipy import stats

    m, se = statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))
    h = float(stats.t.ppf(0.975, len(xs) - 1)) * se
    return [m - h, m + h]


def time_to_target(step_s: dict[int, float], val_by_step: dict[int, float], target: float) -> float | None:
    """Summed step seconds up to the first evaluation at or below ``target`` (None if none is).

    Parameters
    ----------
    step_s : dict[int, float]
        Seconds of each step (1-based step -> seconds).
    val_by_step : dict[int, float]
        Validation loss after step k.
    target : float
    """
    for k in sorted(val_by_step):
        if val_by_step[k] <= target:
            return float(sum(v for s, v in step_s.items() if s <= k))
    return None


def link_rate_mbit(share: float, compute_s: float, wire_bytes: float, efficiency: float = 0.95) -> float:
    """Link rate (Mbit/s) at which ``wire_bytes`` per step take ``share`` of a step whose other part is ``compute_s``.

    Raises
    ------
    ValueError
        ``share`` outside (0, 1) or non-positive times / bytes.
    """
    if not 0 < share < 1 or compute_s <= 0 or wire_bytes <= 0:
        raise ValueError(f"link_rate_mbit: share in (0, 1), positive compute_s and wire_bytes needed, got {share}, {compute_s}, {wire_bytes}")
    comm_s = share / (1 - share) * compute_s
    return wire_bytes * 8 / comm_s / 1e6 / efficiency


class _NetRun:
    """Runs ``lab.training.run`` ranks, one per namespace host, and reads the event log."""

    def __init__(self, s: TimeSettings, workdir: Path):
        self.s, self.workdir = s, workdir
        self._port = 29600

    def config(self, name: str, seed: int, steps: int, *, lr: float, eval_interval: int, **kw):
        from lab.training.run import TrainConfig

        return TrainConfig(run_dir=(self.workdir / name).resolve(), events_path=(self.workdir / "events.sqlite").resolve(),
                           model=GPTConfig(vocab_size=None, **self.s.model), steps=steps, batch_size=self.s.batch_size,
                           lr=lr, warmup_steps=self.s.warmup_steps, schedule="cosine", eval_interval=eval_interval,
                           eval_batches=self.s.eval_batches, checkpoint_interval=0, keep_checkpoints=1, heartbeat_s=5.0,
                           seed=seed, tensorboard=False, device="cpu", **kw)

    def run(self, net, name: str, config) -> dict:
        config.run_dir.mkdir(parents=True, exist_ok=True)
        path = config.save(config.run_dir / "config.json")
        self._port += 1
        procs = []
        with open(config.run_dir / "launch.log", "ab") as log:
            for r in range(2):
                env = {**os.environ, **net.host_env(r), "RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                       "MASTER_PORT": str(self._port), "OMP_NUM_THREADS": "1", "LAB_PARENT_WATCH": "0",
                       "PYTHONPATH": str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
                procs.append(net.popen(r, [sys.executable, "-m", "lab.training.run", "--config", str(path)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT, cwd=str(config.run_dir)))
            rcs = [p.wait(timeout=1800) for p in procs]
        if any(rcs):
            tail = (config.run_dir / "launch.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"timed run {name} failed (exit codes {rcs}); end of its launch.log:\n{tail}")
        return self.read(config.resolved_run_id)

    def read(self, run_id: str) -> dict:
        from lab.training.monitor import RunMonitor

        with RunMonitor(self.workdir / "events.sqlite") as mon:
            m = mon.metrics(run_id)
            evals = mon.evals(run_id)
        return {"step_s": {int(k): float(v) for k, v in m["step_s"].items()},
                "bytes_per_step": float(m["bytes_sent"].mean()) if "bytes_sent" in m else None,
                "val_by_step": {int(k): float(v) for k, v in evals.items()}}


def _method_spec(s: TimeSettings, method: str, gift: dict) -> dict:
    dense = {"lr": s.dense_lr, "optimizer": "adams", "optimizer_kwargs": {"betas": s.dense_betas}}
    if method in ("fp32", "bf16", "fp8"):
        return {**dense, "comm": method}
    if method == "gift_fp8":
        return {**dense, "comm": "gift_fp8", "comm_kwargs": gift}
    if method == "gift_fp8_subspace":  # the same GIFT, its factors by warm-started subspace iteration
        return {**dense, "comm": "gift_fp8", "comm_kwargs": {**gift, "eigensolver": "subspace"}}
    lr, kw = s.scape[method]
    return {"lr": lr, "optimizer": "scape", "optimizer_kwargs": dict(kw)}


def run_time(quick: bool = False, workdir: Path | None = None, shares: tuple[float, ...] | None = None) -> tuple[dict, dict]:
    """The ``time`` part: ``(time, time_detail)``; ``time`` empty with the reason in ``time_detail`` where
    namespaces cannot be made. ``shares``: only these target shares (default: the settings')."""
    from lab.training.netns import ShapedNetwork, netns_unavailable

    s = QUICK_TIME if quick else FULL_TIME
    if shares:
        s = replace(s, shares=tuple(shares))
    detail: dict = {"settings": asdict(s), "profile": profile_gift(s)}
    reason = netns_unavailable()
    if reason is not None:
        detail["skipped"] = f"shaped-link runs skipped: {reason}"
        print(f"[comm time] {detail['skipped']}", flush=True)
        return {}, detail
    t_start = time.perf_counter()
    gift = gift_kwargs()
    detail["gift_kwargs"] = gift
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="lab-comm-time-"))
    runner = _NetRun(s, wd)
    n_params = None
    with ShapedNetwork(n_hosts=2, rate_mbit=None) as net:
        cal = runner.run(net, "calibrate", runner.config("calibrate", 0, s.calib_steps, lr=s.dense_lr, eval_interval=0,
                                                          optimizer="adams", optimizer_kwargs={"betas": s.dense_betas}))
    steps_after_warm = [v for k, v in cal["step_s"].items() if k > 3] or list(cal["step_s"].values())
    t0 = statistics.median(steps_after_warm)
    from lab.training.data import TextCorpus
    from lab.training.model import GPT

    n_params = sum(p.numel() for p in GPT(GPTConfig(vocab_size=TextCorpus().tokenizer.vocab_size, **s.model)).parameters())
    wire = 4 * n_params  # ring all-reduce, 2 ranks: each rank sends 2 (W - 1) / W * 4 n bytes
    detail.update({"calibration": {"unshaped_step_s": t0, "steps": s.calib_steps, "n_params": n_params,
                                   "fp32_wire_bytes_per_rank": wire}, "runs": {}})
    table: dict = {}
    for share in s.shares:
        rate = link_rate_mbit(share, t0, wire)
        key = f"{share:.2f}"
        runs: dict = {}
        load_before = os.getloadavg()[0]  # other work on this shared machine shows here
        with ShapedNetwork(n_hosts=2, rate_mbit=rate) as net:
            goodput = net.measure_mbit(0, 1)
            todo = [(seed, m) for seed in s.seeds for m in s.methods]
            for seed, method in tqdm(todo, desc=f"shaped link {rate:.0f} Mbit/s (share {share:.0%})", unit="run"):
                name = f"s{key}_{method}_seed{seed}"
                cfg = runner.config(name, seed, s.steps, eval_interval=s.eval_interval, **_method_spec(s, method, gift))
                t1 = time.perf_counter()
                runs[(method, seed)] = {**runner.run(net, name, cfg), "wall_s": time.perf_counter() - t1}
        table[key] = _summarize(s, runs, t0)
        table[key]["_link"] = {"rate_mbit": rate, "measured_goodput_mbit": goodput, "calibration_unshaped_step_s": t0,
                               "load_average_1min_before_after": [load_before, os.getloadavg()[0]]}
        detail["runs"][key] = {f"{m}_seed{sd}": {"step_s_median": statistics.median(r["step_s"].values()),
                                                 "val_by_step": r["val_by_step"], "bytes_per_step": r["bytes_per_step"],
                                                 "wall_s": r["wall_s"]}
                               for (m, sd), r in runs.items()}
    detail["wall_s"] = time.perf_counter() - t_start
    detail["goals"] = _goals(table)
    return table, detail


def _summarize(s: TimeSettings, runs: dict, t0: float) -> dict:
    out = {}
    target_step = int(round(s.target_frac * s.steps / s.eval_interval)) * s.eval_interval
    targets = {}
    for seed in s.seeds:
        fp = runs[("fp32", seed)]["val_by_step"]
        k = min(fp, key=lambda st: abs(st - target_step))
        targets[seed] = fp[k]
    fp_step = {seed: statistics.median(runs[("fp32", seed)]["step_s"].values()) for seed in s.seeds}
    fp_ttt = {seed: time_to_target(runs[("fp32", seed)]["step_s"], runs[("fp32", seed)]["val_by_step"], targets[seed])
              for seed in s.seeds}
    for method in s.methods:
        step = [statistics.median(runs[(method, sd)]["step_s"].values()) for sd in s.seeds]
        ttt = [time_to_target(runs[(method, sd)]["step_s"], runs[(method, sd)]["val_by_step"], targets[sd]) for sd in s.seeds]
        val = [runs[(method, sd)]["val_by_step"][max(runs[(method, sd)]["val_by_step"])] for sd in s.seeds]
        sp = [fp_step[sd] / x for sd, x in zip(s.seeds, step)]
        tsp = [(fp_ttt[sd] / x) if (x and fp_ttt[sd]) else None for sd, x in zip(s.seeds, ttt)]
        reached = [x for x in ttt if x is not None]
        out[method] = {
            "seeds": list(s.seeds), "step_s": statistics.fmean(step), "step_s_ci95": t_ci95(step), "step_s_by_seed": step,
            "time_to_target_s": statistics.fmean(reached) if len(reached) == len(ttt) else None,
            "time_to_target_s_by_seed": ttt, "reached_target": len(reached), "target_val_loss_by_seed": [targets[sd] for sd in s.seeds],
            "speedup_vs_fp32": statistics.fmean(sp), "speedup_vs_fp32_ci95": t_ci95(sp), "speedup_vs_fp32_by_seed": sp,
            "time_to_target_speedup_vs_fp32": statistics.fmean(tsp) if all(x is not None for x in tsp) else None,
            "time_to_target_speedup_vs_fp32_by_seed": tsp,
            "val_loss": statistics.fmean(val), "val_loss_ci95": t_ci95(val), "val_loss_by_seed": val,
            "bytes_per_step": statistics.fmean(runs[(method, sd)]["bytes_per_step"] or 0.0 for sd in s.seeds),
        }
    out["_measured_fp32_comm_share"] = 1.0 - t0 / statistics.fmean(fp_step.values())
    out["_target"] = f"fp32's validation loss at step {target_step} of the same seed"
    return out


def _goals(table: dict) -> dict:
    """Per share: is GIFT-FP8's step faster than fp32's? Met only when the 95% interval of the per-seed
    speedups lies above 1 (a mean above 1 with an interval across it is not a win)."""
    goals = {}
    for share, row in table.items():
        if "gift_fp8" in row and "fp8" in row:
            g, ci = row["gift_fp8"]["speedup_vs_fp32"], row["gift_fp8"]["speedup_vs_fp32_ci95"]
            goals[f"time_gift_faster_than_fp32_at_{share}"] = {
                "goal": f"GIFT-FP8's step faster than fp32's over the shaped link (fp32 comm share target {share}; "
                        "95% interval of the per-seed speedups above 1)",
                "value": g, "ci95": ci, "fp8_value": row["fp8"]["speedup_vs_fp32"],
                "met": bool(ci is not None and ci[0] > 1.0)}
    return goals


# ----------------------------------------------------------------------------------------------- profile
def profile_gift(s: TimeSettings) -> dict:
    """Hook seconds per step and the top cumulative functions: FP8, GIFT as committed, GIFT at the bytes goal."""
    from lab.training.comm import get_hook
    from lab.training.data import BatchSampler, TextCorpus
    from lab.training.model import GPT

    corpus = TextCorpus()
    cfg = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, **s.model)
    committed = {"damping": 1.0, "n_eigenpairs": 32, "refresh_every": 10, "refresh_warmup": 20, "ema": 0.5,
                 "output_side": True, "select_by": "gain", "select_threshold": 1.5, "select_warmup": 20,
                 "reselect_every": 100, "measure_error": True}
    if s.quick:
        committed.update(n_eigenpairs=4, refresh_every=2, refresh_warmup=1, select_warmup=1, reselect_every=2)
    budget = {k: v for k, v in gift_kwargs().items()}
    if s.quick:
        budget.update(layers=["head"], n_eigenpairs=4, refresh_every=2, refresh_warmup=1)
    out = {}
    for name, (hook_name, kw) in {"fp8": ("fp8", {}), "gift_committed": ("gift_fp8", committed),
                                  "gift_bytes_goal": ("gift_fp8", budget),
                                  "gift_bytes_goal_subspace": ("gift_fp8", {**budget, "eigensolver": "subspace"})}.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        state, hook = get_hook(hook_name, model=model, **kw)
        sampler = BatchSampler(len(corpus.train_tokens), cfg.block_size, s.batch_size, 1, 0)
        params = list(model.parameters())[::-1]  # DDP buckets hold parameters in reverse order
        times, fwd_bwd = [], []
        prof = cProfile.Profile()
        for i in tqdm(range(s.profile_steps), desc=f"profile {name}", unit="step", leave=False):
            x, y = sampler.batch(corpus.train_tokens, i, 0)
            model.zero_grad(set_to_none=True)
            t1 = time.perf_counter()  # forward + backward: GIFT's covariance collection runs in their hooks
            model(x, y)[1].backward()
            fwd_bwd.append(time.perf_counter() - t1)
            bucket = FlatBucket(params)
            prof.enable()
            t1 = time.perf_counter()
            hook(state, bucket).wait()
            times.append(time.perf_counter() - t1)
            prof.disable()
        st = pstats.Stats(prof)
        top = sorted(((f"{k[0].rsplit('/', 1)[-1]}:{k[1]}({k[2]})", v[3]) for k, v in st.stats.items()),
                     key=lambda kv: -kv[1])[:12]
        out[name] = {"hook_s_per_step_median": statistics.median(times), "hook_s_per_step_mean": statistics.fmean(times),
                     "fwd_bwd_s_per_step_median": statistics.median(fwd_bwd), "fwd_bwd_s_per_step_mean": statistics.fmean(fwd_bwd),
                     "top_cumulative_s": dict(top), "kwargs": {k: v for k, v in kw.items()}}
        if hasattr(state, "close"):
            state.close()
    for name in ("gift_committed", "gift_bytes_goal", "gift_bytes_goal_subspace"):
        out[name]["mean_vs_fp8"] = out[name]["hook_s_per_step_mean"] / out["fp8"]["hook_s_per_step_mean"]
        out[name]["fwd_bwd_mean_vs_fp8"] = out[name]["fwd_bwd_s_per_step_mean"] / out["fp8"]["fwd_bwd_s_per_step_mean"]
    out["steps"] = s.profile_steps
    out["note"] = ("one process (a world of one: no collective), the hook called on one bucket of every gradient; "
                   "seconds include GIFT's refreshes (eigendecompositions) on refresh steps; fwd_bwd_* time the "
                   "forward and backward before the hook, where GIFT's covariance collection runs")
    return out

