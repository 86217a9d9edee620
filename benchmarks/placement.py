"""Placement across federated sites (Diamond Agent's evaluation, made meaningful): replay and live.

    python -m benchmarks.placement --out FILE.json [--part replay|live|all] [--rounds 19] [--jobs 83] [--live-rounds 36]

``replay`` (:mod:`benchmarks.placement_replay`): four sites from four real traces,
real schedules as ground truth, policies (:mod:`lab.hpc.placement`) that see only
what was known at submit time. The predictor's settings are chosen first
(:func:`~benchmarks.placement_replay.tune`) on the validation seeds' rounds, which lie in
each site's earlier usable weeks; every policy is then scored once on the evaluation
seeds' rounds (:data:`~benchmarks.placement_replay.EVAL_SEEDS`), from the later weeks:
pooled metrics with bootstrap CIs by round, per-seed metrics with 95 % t-intervals over
seeds, and paired per-seed tests of ``earliest_completion`` against ``idle_first`` and the
best fixed site. ``live`` (:mod:`benchmarks.placement_live`): four local Slurm sites under
load replayed from the same traces, matched probe rounds measured from real submissions,
and the continuation latency (job end to agent resume).

JSON keys: ``replay`` and ``live``, each with ``rounds``, ``jobs``, ``nontrivial_share``,
``policies`` (per policy: ``within_60s_nontrivial``, ``mean_extra_s``, ``median_extra_s``,
``p90_extra_s``, ``zero_regret_share``, each ``{"value", "ci95"}``), ``best_fixed_site``;
``replay`` also ``eval_seeds``, ``over_seeds``, ``paired`` (``earliest_completion-vs-idle_first``,
``earliest_completion-vs-best_fixed``, ... each with ``mean_extra_diff_ci95`` and
``p90_extra_diff_ci95``: method minus baseline, seconds), ``information_bound`` (clairvoyant predictors told
the real futures of the jobs already submitted: :func:`~benchmarks.placement_replay.information_bound`) and
``tuning``; ``live`` also has
``continuation`` (``median_s``, ``p95_s``, ``n``) and ``earliest_completion_vs_least_pending``.
``--part`` runs one half and keeps the other from an existing ``--out`` file (each half
fits in one ~15-minute hold of the shared lock).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

from benchmarks._common import write
from benchmarks.placement_live import run_live
from benchmarks.placement_replay import EVAL_SEEDS, TUNED_ON, TUNING_CRITERION, VALIDATION_SEEDS, make_predictor, probe_table, run_replay, tune


def replay_part(rounds: int, jobs: int, eval_seeds, validation_seeds) -> dict:
    """Tune on validation seeds, then evaluate every policy once on the evaluation seeds."""
    tuning = tune(rounds, jobs, seeds=validation_seeds)
    predictor = make_predictor(tuning["chosen"])
    tuned_on = f"{TUNED_ON} This run: {tuning['settings_compared']} settings compared on validation seeds {list(validation_seeds)} (validation weeks only) by {TUNING_CRITERION}; chosen {tuning['chosen_name']}"
    result = run_replay(rounds, jobs, seeds=list(eval_seeds), predictor=predictor, tuned_on=tuned_on)
    result["tuning"] = tuning
    result["probes"] = probe_table(result["probes"])  # one table, not 1,660 dicts (the file was 2.8 MB)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--part", choices=("replay", "live", "all"), default="all", help="run one half, keeping the other from --out")
    p.add_argument("--rounds", type=int, default=19, help="replay rounds per seed")
    p.add_argument("--jobs", type=int, default=83, help="replay probes per seed")
    p.add_argument("--eval-seeds", type=int, nargs="+", default=list(EVAL_SEEDS))
    p.add_argument("--validation-seeds", type=int, nargs="+", default=list(VALIDATION_SEEDS))
    p.add_argument("--live-rounds", type=int, default=36, help="live rounds asked for (4 probes each; rounds not finished within the drain timeout are left out)")
    p.add_argument("--seed", type=int, default=0, help="the live run's seed")
    a = p.parse_args(argv)
    out = Path(a.out)
    old = json.loads(out.read_text()) if out.is_file() and a.part != "all" else {}
    result = {"benchmark": "placement", "replay": old.get("replay"), "live": old.get("live"), "parts": dict(old.get("parts") or {})}
    if a.part in ("replay", "all"):
        result["replay"] = replay_part(a.rounds, a.jobs, a.eval_seeds, a.validation_seeds)
        result["parts"]["replay"] = {"when": datetime.now(timezone.utc).isoformat(), "command": "python -m benchmarks.placement --part replay --out FILE.json"}
    if a.part in ("live", "all"):
        result["live"] = run_live(rounds=a.live_rounds, seed=a.seed)
        result["parts"]["live"] = {"when": datetime.now(timezone.utc).isoformat(), "command": f"python -m benchmarks.placement --part live --out FILE.json --live-rounds {a.live_rounds}"}
    write(out, result)


if __name__ == "__main__":
    main()
