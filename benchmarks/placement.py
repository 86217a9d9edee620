"""Placement across federated sites (Diamond Agent's evaluation, made meaningful): replay and live.

    python -m benchmarks.placement --out FILE.json [--rounds 19] [--jobs 83] [--live-rounds 13] [--no-live]

``replay`` (:mod:`benchmarks.placement_replay`): four sites from four real traces,
real schedules as ground truth, policies that see only what was known at submit
time, bootstrap confidence intervals by round. ``live``
(:mod:`benchmarks.placement_live`): four local Slurm sites under load replayed from
the same traces, matched probe rounds measured from real submissions, and the
continuation latency (job end to agent resume). JSON keys: ``replay`` and ``live``,
each with ``rounds``, ``jobs``, ``nontrivial_share``, ``policies`` (per policy:
``within_60s_nontrivial``, ``mean_extra_s``, ``median_extra_s``, ``p90_extra_s``,
``zero_regret_share``, each ``{"value", "ci95"}``), ``best_fixed_site``; ``live`` also
has ``continuation`` (``median_s``, ``p95_s``, ``n``).
"""

from __future__ import annotations

import argparse

from benchmarks._common import write
from benchmarks.placement_live import run_live
from benchmarks.placement_replay import run_replay


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--rounds", type=int, default=19, help="replay rounds")
    p.add_argument("--jobs", type=int, default=83, help="replay probes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--live-rounds", type=int, default=13, help="live rounds (4 probes each)")
    p.add_argument("--no-live", action="store_true", help="skip the live half (needs Debian's slurm-wlm)")
    a = p.parse_args(argv)
    result = {"benchmark": "placement", "replay": run_replay(a.rounds, a.jobs, a.seed)}
    result["live"] = None if a.no_live else run_live(rounds=a.live_rounds, seed=a.seed)
    write(a.out, result)


if __name__ == "__main__":
    main()
