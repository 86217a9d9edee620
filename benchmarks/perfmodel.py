"""Operator-level performance model (issue #25): predicted against measured training-step time.

    python -m benchmarks.perfmodel --out benchmarks/results/perfmodel.json [--part all|sample|comm|runs|report]

Parts (each writes its own file beside ``--out`` so a long run can be split under the heavy lock):

``sample``  the sampler, in its own process (``python -m lab.training.perfmodel.profile``): every primitive
            forward and backward over the shapes of 60 model configurations from ``SAMPLE_GRID``
            -> ``perfmodel_samples_cpu.json``.
``comm``    gloo all-reduce / all-gather / reduce-scatter / send-recv, 2 ranks, 256 B .. 16 MiB, on loopback
            and, where namespaces can be made, on the fast and slow tiers of a ShapedNetwork, ``--comm-repeats``
            calls a size (their mean is the size's time) -> ``perfmodel_comm.json``.
``runs``    the calibration configurations (:data:`CALIBRATION_CONFIGS`, sizes of the sampler's grid, and
            :data:`SHAPED_CALIBRATION_CONFIGS` across the slow tier), then the validation configurations
            (:data:`CONFIGS`, :data:`SHAPED_CONFIGS`), real gloo training
            steps (median of ``--steps`` after ``--warmup``; all configurations ``--passes`` times in turn, each
            component the median over passes) -> ``perfmodel_runs.json``.
``report``  fit the regressors (3 seeds of the validation split) and, per seed, the in-situ calibration
            from the calibration runs; predict every validation configuration with the calibrated learned
            model, the uncalibrated one, the linear base alone and the roofline on this machine's measured
            peaks, and write ``--out`` with ``configs``, ``mape``, ``uncalibrated_mape``, ``roofline_mape``,
            ``components``.

Errors are signed ``(predicted - measured) / measured``; MAPE is the mean of their absolute values with a
95 % bootstrap interval over configurations.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks._common import write
from lab.training.perfmodel import PerfConfig
from lab.training.perfmodel.comm import DEFAULT_SIZES, CommModel, measure_collectives
from lab.training.perfmodel.operators import decompose
from lab.training.perfmodel.predict import Calibration, LearnedPredictor, local_hardware, placement_of, tp_allreduce_s
from lab.training.perfmodel.regress import fit_primitives
from lab.training.perfmodel.roofline import Roofline

V = 512


def _c(L, d, h, s, b, m, **kw):
    return PerfConfig(n_layer=L, d_model=d, n_head=h, seq_len=s, vocab_size=V, micro_batch=b, n_micro_batches=m, **kw)


#: Validation configurations on one tier (loopback). Their d, s and V are not in the sampler's grid.
CONFIGS = [
    _c(2, 64, 2, 32, 2, 1), _c(2, 128, 4, 64, 2, 2), _c(4, 128, 4, 128, 1, 2), _c(2, 192, 6, 64, 4, 1),
    _c(4, 256, 8, 64, 2, 2), _c(2, 256, 8, 128, 2, 1), _c(3, 192, 12, 128, 1, 3),
    _c(2, 128, 4, 64, 2, 2, dp=2), _c(4, 256, 8, 64, 2, 1, dp=2), _c(2, 192, 6, 128, 1, 2, dp=2),
    _c(2, 128, 4, 64, 2, 2, tp=2), _c(2, 256, 8, 128, 1, 1, tp=2), _c(4, 192, 6, 64, 2, 1, tp=2),
    _c(2, 128, 4, 64, 2, 4, pp=2), _c(4, 256, 8, 64, 1, 4, pp=2), _c(4, 192, 6, 128, 1, 2, pp=2),
    _c(2, 64, 2, 128, 4, 3, pp=2),
]
#: Run across the shaped slow tier (one rank per host namespace), where namespaces can be made.
SHAPED_CONFIGS = [_c(2, 128, 4, 64, 2, 2, dp=2), _c(2, 128, 4, 64, 2, 2, tp=2), _c(2, 128, 4, 64, 2, 4, pp=2)]
#: Calibration runs (the in-situ corrections of :class:`lab.training.perfmodel.predict.Calibration`): d, s and V
#: from the sampler's grid (``SAMPLE_GRID``; the TP runs' head sizes are not in it), none of them a validation
#: shape: one rank and two (DP 2) for the compute corrections, TP 2 for the TP all-reduce's, PP 2 for the sends'.
_CALIBRATION_ONE_RANK = [
    PerfConfig(n_layer=2, d_model=80, n_head=5, seq_len=40, vocab_size=768, micro_batch=2, n_micro_batches=2),
    PerfConfig(n_layer=3, d_model=144, n_head=9, seq_len=80, vocab_size=768, micro_batch=1, n_micro_batches=2),
    PerfConfig(n_layer=2, d_model=208, n_head=13, seq_len=112, vocab_size=256, micro_batch=2, n_micro_batches=1),
    PerfConfig(n_layer=3, d_model=240, n_head=15, seq_len=56, vocab_size=768, micro_batch=3, n_micro_batches=2),
]
CALIBRATION_CONFIGS = [
    *_CALIBRATION_ONE_RANK,
    *(c.model_copy(update={"dp": 2}) for c in _CALIBRATION_ONE_RANK),
    # TP 2 needs an even head count; PP 2 more layers and micro-batches
    *(c.model_copy(update={"tp": 2, "n_head": h}) for c, h in zip(_CALIBRATION_ONE_RANK, (4, 8, 16, 16))),
    *(c.model_copy(update={"pp": 2, "n_layer": L, "n_micro_batches": m})
      for c, L, m in zip(_CALIBRATION_ONE_RANK, (2, 4, 2, 4), (4, 3, 2, 4))),
]
#: Calibration runs across the shaped slow tier (one rank per host), for its own waits per TP all-reduce and
#: per PP send: the TP and PP calibration layouts of the first two one-rank shapes.
SHAPED_CALIBRATION_CONFIGS = [c for c in CALIBRATION_CONFIGS[8:] if c.d_model in (80, 144)]
SLOW_MBIT = 400.0
COMPONENTS = ["encoder_fwd", "stage_fwd_max", "stage_bwd_max", "tp_allreduce", "grad_sync", "update", "overall"]


def _paths(out: Path) -> dict[str, Path]:
    d = out.parent
    return {"samples": d / "perfmodel_samples_cpu.json", "comm": d / "perfmodel_comm.json", "runs": d / "perfmodel_runs.json"}


def _save(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj) + "\n")
    tmp.replace(path)


def part_sample(paths, configs: int) -> None:
    subprocess.run([sys.executable, "-m", "lab.training.perfmodel.profile", "--out", str(paths["samples"]),
                    "--configs", str(configs)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def part_comm(paths, repeats: int) -> None:
    from lab.training.netns import ShapedNetwork, netns_unavailable

    rows = measure_collectives(2, tier="loopback", repeats=repeats)
    why = netns_unavailable()
    if why is None:
        with ShapedNetwork(n_hosts=2, rate_mbit=SLOW_MBIT) as net:
            small = [x for x in DEFAULT_SIZES if x <= 4 * 2**20]  # the shaped configurations send <= 4 MiB
            rows += measure_collectives(2, tier="fast", repeats=repeats, network=net, hosts=[0, 0], sizes=small)
            rows += measure_collectives(2, tier="slow", repeats=repeats, network=net, hosts=[0, 1], sizes=small)
            goodput = net.measure_mbit(0, 1)
    else:
        print(f"shaped tiers skipped: {why}", file=sys.stderr)
        goodput = None
    _save(paths["comm"], {"rows": rows, "netns_skipped": why, "slow_rate_mbit": SLOW_MBIT,
                          "slow_goodput_mbit": goodput})


def _summarise_run(times, ranks, cfg: PerfConfig) -> dict:
    """Measured components: the medians over steps of each per-step quantity (max over ranks; min for the
    collectives, see below)."""
    parts = [r["parts"] for r in ranks]
    n = len(times)

    def per_step(fn, over_ranks=max):
        return statistics.median(over_ranks(fn(p[i]) for p in parts) for i in range(n))

    fwd = max(statistics.median(statistics.mean(p[i]["fwd_s"]) for i in range(n)) for p in parts)
    bwd = max(statistics.median(statistics.mean(p[i]["bwd_s"]) for i in range(n)) for p in parts)
    blocks = [statistics.median(statistics.mean(p[i]["block_fwd_s"]) for i in range(n)) for p in parts
              if p[0]["block_fwd_s"]]
    return {"overall": statistics.median(times), "stage_fwd_max": fwd, "stage_bwd_max": bwd,
            # collectives: the rank that arrives last waits least, so its time is the communication itself
            # (the others' includes waiting for it, which the overall step already counts)
            "encoder_fwd": max(blocks), "tp_allreduce": per_step(lambda q: q["tp_comm_s"], min),
            "grad_sync": per_step(lambda q: q["grad_sync_s"], min), "update": per_step(lambda q: q["update_s"]),
            "steps_s": times}


def _median_of_passes(passes: list[dict]) -> dict:
    """One configuration's measured components: the median over passes of each (steps of all passes kept)."""
    out = {k: statistics.median(p[k] for p in passes) for k in passes[0] if k != "steps_s"}
    out["steps_s"] = [t for p in passes for t in p["steps_s"]]
    out["overall_per_pass"] = [p["overall"] for p in passes]
    return out


def part_runs(paths, steps: int, warmup: int, passes: int) -> None:
    """Every calibration and validation configuration, ``passes`` times in turn (so a slow spell of this
    shared machine lands on all of them, not on a few), each component the median over passes."""
    from tqdm import tqdm

    from lab.training.netns import ShapedNetwork, netns_unavailable
    from lab.training.perfmodel.parallel import measure_steps

    plan = [("calibration", "loopback", c) for c in CALIBRATION_CONFIGS] + [("runs", "loopback", c) for c in CONFIGS]
    why = netns_unavailable()
    if why is None:
        plan += [("calibration", "slow", c) for c in SHAPED_CALIBRATION_CONFIGS]
        plan += [("runs", "slow", c) for c in SHAPED_CONFIGS]
    else:
        print(f"shaped-tier runs skipped: {why}", file=sys.stderr)
    got: list[list[dict]] = [[] for _ in plan]
    with contextlib.ExitStack() as stack, tqdm(total=passes * len(plan), desc="calibration and validation runs") as bar:
        net = stack.enter_context(ShapedNetwork(n_hosts=2, rate_mbit=SLOW_MBIT)) if why is None else None
        for _ in range(passes):
            for i, (_, tier, cfg) in enumerate(plan):
                shaped = {"network": net, "hosts": [0, 1]} if tier == "slow" else {}
                t, ranks = measure_steps(cfg, steps=steps, warmup=warmup, detail=True, **shaped)
                got[i].append(_summarise_run(t, ranks, cfg))
                bar.update()
    out: dict = {"runs": [], "calibration": [], "netns_skipped": why, "steps": steps, "warmup": warmup,
                 "passes": passes}
    for (key, tier, cfg), measured in zip(plan, got):
        out[key].append({"config": cfg.model_dump(mode="json"), "tier": tier, "measured": _median_of_passes(measured)})
    _save(paths["runs"], out)


def _predicted_components(pred, cfg: PerfConfig, tp_wait_s: float = 0.0, dp_wait_s: float = 0.0) -> dict:
    by = pred.plan.by_operator
    layer0 = [o for o in decompose(cfg) if o.layer == 0]
    # encoder_fwd: one block's forward (its operators' times; by_operator sums over layers, so divide)
    n0 = cfg.stage_layers()[0]
    enc = sum(by.get((0, o.name, "fwd"), 0.0) for o in layer0) / n0
    tp = tp_allreduce_s(pred, cfg, tp_wait_s)  # the all-reduces alone, as measured (the waits are in the stages)
    return {"overall": pred.total_s, "stage_fwd_max": pred.max_fwd_s, "stage_bwd_max": pred.max_bwd_s,
            "encoder_fwd": enc, "tp_allreduce": tp,
            # the all-reduce alone, as measured (min over ranks): the calibration's wait for the later rank out
            "grad_sync": pred.grad_sync_s - (dp_wait_s if cfg.dp > 1 and pred.grad_sync_s > 0 else 0.0),
            "update": pred.update_s}


def _ci(values, n=2000, seed=0):
    v = np.asarray(values, float)
    rng = np.random.default_rng(seed)
    boots = [float(np.mean(rng.choice(v, len(v)))) for _ in range(n)]
    return [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]


def noise_floor_mape(per_pass: list[list[float]], n_sim: int = 200_000, seed: int = 0) -> dict:
    """The MAPE a predictor that knew each configuration's true mean step time would still score against
    its measured value (the median of its passes), estimated from the spread between passes.

    ``per_pass``: for each configuration, its ``overall`` step time (s) in each of ``n >= 2`` passes (one
    ``n`` for all). Passes are taken as independent normal draws around the true value with a relative
    spread ``sigma`` of their own: ``E|X_i - X_j| = 2 sigma / sqrt(pi)`` estimates ``sigma`` from the
    mean relative pairwise difference, and ``E|median_n - mu|`` for that ``sigma`` (simulated, seeded) is
    the floor. Drift shared by every pass of a configuration is not seen, so the floor is a lower bound.

    Returns ``{"mape": percent, "pairwise_rel_diff_percent": mean over configurations, "passes": n,
    "median_to_pair_ratio": the simulated constant}``.

    Raises
    ------
    ValueError
        When a configuration has fewer than 2 passes or the configurations' pass counts differ.
    """
    counts = {len(p) for p in per_pass}
    if not per_pass or len(counts) != 1 or min(counts) < 2:
        raise ValueError(f"noise_floor_mape: every configuration needs the same number (>= 2) of passes, got {sorted(counts)}")
    n = counts.pop()
    pair = [float(np.mean([abs(a - b) / ((a + b) / 2) for i, a in enumerate(p) for b in p[i + 1:]])) for p in per_pass]
    z = np.random.default_rng(seed).standard_normal((n_sim, n))
    ratio = float(np.mean(np.abs(np.median(z, axis=1))) / (2 / np.sqrt(np.pi)))
    return {"mape": float(np.mean(pair)) * ratio * 100, "pairwise_rel_diff_percent": float(np.mean(pair)) * 100,
            "passes": n, "median_to_pair_ratio": ratio}


def part_report(paths, out: Path, seeds: int) -> dict:
    samples = json.loads(paths["samples"].read_text())
    comm_d = json.loads(paths["comm"].read_text())
    runs_d = json.loads(paths["runs"].read_text())
    comm = CommModel(comm_d["rows"])
    t0 = time.perf_counter()
    models = [fit_primitives(samples, seed=s) for s in range(seeds)]
    fit_s = time.perf_counter() - t0
    hw = {"loopback": local_hardware(comm, tier="loopback", world=2)}
    if "slow" in comm.tiers():
        hw["slow"] = local_hardware(comm, tier="slow", world=2, gpus_per_node=1)
    # one untimed prediction first: the first one imports what torch's meta device needs (sympy), once per process
    LearnedPredictor(models[0], comm).predict(PerfConfig(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=V))
    cal_runs = [(PerfConfig.model_validate(r["config"]), r["measured"], r.get("tier", "loopback"))
                for r in runs_d["calibration"]]
    cals = [Calibration.fit(LearnedPredictor(m, comm), cal_runs) for m in models]
    rows = []
    for run in runs_d["runs"]:
        cfg = PerfConfig.model_validate(run["config"])
        tier = run["tier"]
        placement = placement_of(tier)
        preds = [LearnedPredictor(m, comm, c).predict(cfg, placement) for m, c in zip(models, cals)]
        bare = LearnedPredictor(models[0], comm).predict(cfg, placement)
        base = LearnedPredictor(models[0].linear_base_only(), comm).predict(cfg, placement)
        roof = Roofline.predict(cfg, hw[tier], method="simulate")
        meas = run["measured"]
        world = cfg.dp * cfg.tp * cfg.pp
        comp_pred = [_predicted_components(p, cfg, c.factor(world, "tp_wait_s", tier), c.factor(world, "dp_wait_s", tier))
                     for p, c in zip(preds, cals)]
        comp_base, comp_roof = _predicted_components(base, cfg), _predicted_components(roof, cfg)
        comp_bare = _predicted_components(bare, cfg)
        row = {"config": run["config"], "tier": tier, "measured_s": meas["overall"],
               "predicted_s": comp_pred[0]["overall"],
               "predicted_s_per_seed": [c["overall"] for c in comp_pred],
               "uncalibrated_s": bare.total_s, "roofline_s": roof.total_s, "linear_base_s": base.total_s,
               "prediction_time_s": preds[0].prediction_s, "steps_s": meas["steps_s"],
               "components": {}}
        row["error"] = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        row["uncalibrated_error"] = (row["uncalibrated_s"] - row["measured_s"]) / row["measured_s"]
        row["roofline_error"] = (row["roofline_s"] - row["measured_s"]) / row["measured_s"]
        row["linear_base_error"] = (row["linear_base_s"] - row["measured_s"]) / row["measured_s"]
        for c in COMPONENTS:
            m_ = meas[c]
            if m_ <= 1e-5 or comp_pred[0][c] == 0.0 and comp_roof[c] == 0.0:
                continue  # the component is absent in this configuration (no TP, no DP)
            row["components"][c] = {"measured_s": m_, "predicted_s": comp_pred[0][c], "roofline_s": comp_roof[c],
                                    "linear_base_s": comp_base[c], "uncalibrated_s": comp_bare[c],
                                    "error": (comp_pred[0][c] - m_) / m_, "roofline_error": (comp_roof[c] - m_) / m_,
                                    "uncalibrated_error": (comp_bare[c] - m_) / m_,
                                    "linear_base_error": (comp_base[c] - m_) / m_}
        rows.append(row)

    def summary(key):
        errs = [abs(r[key]) * 100 for r in rows]
        return {"mape": float(np.mean(errs)), "ci95": _ci(errs)}

    components = {}
    for c in COMPONENTS:
        have = [r["components"][c] for r in rows if c in r["components"]]
        if not have:
            continue
        components[c] = {"n_configs": len(have),
                         "mape": float(np.mean([abs(h["error"]) for h in have]) * 100),
                         "mean_signed_error": float(np.mean([h["error"] for h in have]) * 100),
                         "roofline_mape": float(np.mean([abs(h["roofline_error"]) for h in have]) * 100),
                         "uncalibrated_mape": float(np.mean([abs(h["uncalibrated_error"]) for h in have]) * 100),
                         "linear_base_mape": float(np.mean([abs(h["linear_base_error"]) for h in have]) * 100)}
        components[c]["better_than_roofline"] = components[c]["mape"] < components[c]["roofline_mape"]
    per_seed = [float(np.mean([abs(r["predicted_s_per_seed"][s] - r["measured_s"]) / r["measured_s"] for r in rows]) * 100)
                for s in range(seeds)]
    step_cv = [float(np.std(r["steps_s"]) / np.mean(r["steps_s"]) * 100) for r in rows]
    result = {
        "benchmark": "perfmodel",
        "configs": rows,
        "mape": summary("error")["mape"], "mape_ci95": summary("error")["ci95"],
        "mape_per_seed": per_seed,
        "roofline_mape": summary("roofline_error")["mape"], "roofline_mape_ci95": summary("roofline_error")["ci95"],
        "uncalibrated_mape": summary("uncalibrated_error")["mape"],
        "uncalibrated_mape_ci95": summary("uncalibrated_error")["ci95"],
        # paired: the configurations resampled together
        # what a predictor knowing every true step time would score against these measurements
        "noise_floor": (noise_floor_mape([r["measured"]["overall_per_pass"] for r in runs_d["runs"]])
                        if runs_d.get("passes", 1) > 1 else None),
        "mape_minus_uncalibrated_ci95": _ci([(abs(r["error"]) - abs(r["uncalibrated_error"])) * 100 for r in rows]),
        "calibration": cals[0].to_json(),
        "calibration_runs": [{"config": r["config"], "tier": r.get("tier", "loopback"), "measured": r["measured"]}
                             for r in runs_d["calibration"]],
        "linear_base_mape": summary("linear_base_error")["mape"],
        "components": components,
        "goals": {"mape_le_5": summary("error")["mape"] <= 5.0,
                  "better_than_roofline_every_component": all(v["better_than_roofline"] for v in components.values()),
                  "prediction_under_1s": max(r["prediction_time_s"] for r in rows) < 1.0},
        "prediction_time_s": {"max": max(r["prediction_time_s"] for r in rows),
                              "median": statistics.median(r["prediction_time_s"] for r in rows)},
        "regressors": models[0].table(), "fit_time_s_all_seeds": fit_s,
        "measurement": {"steps": runs_d["steps"], "warmup": runs_d["warmup"], "passes": runs_d.get("passes", 1),
                        "step_time_cv_percent_median": statistics.median(step_cv),
                        "netns_skipped": runs_d.get("netns_skipped"), "slow_rate_mbit": comm_d.get("slow_rate_mbit"),
                        "slow_goodput_mbit": comm_d.get("slow_goodput_mbit"),
                        "n_samples": len(samples["samples"]), "engine_overhead_s": samples["engine_overhead_s"]},
        "hardware_local": {k: h.model_dump(mode="json") for k, h in hw.items()},
        "comm_alpha_beta": {f"{k[0]}:{k[1]}:{k[2]}": c.alpha_beta() for k, c in comm.curves.items()},
    }
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.perfmodel", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/perfmodel.json"))
    ap.add_argument("--part", default="all", choices=["all", "sample", "comm", "runs", "report"])
    ap.add_argument("--configs", type=int, default=60, help="sampler model configurations")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--passes", type=int, default=20,
                    help="times each run is measured, in turn (20: about 40 minutes here; the noise floor falls as 1 / sqrt(passes))")
    ap.add_argument("--comm-repeats", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    paths = _paths(a.out)
    if a.part in ("all", "sample"):
        part_sample(paths, a.configs)
    if a.part in ("all", "comm"):
        part_comm(paths, a.comm_repeats)
    if a.part in ("all", "runs"):
        part_runs(paths, a.steps, a.warmup, a.passes)
    if a.part in ("all", "report"):
        write(a.out, part_report(paths, a.out, a.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
