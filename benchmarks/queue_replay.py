"""Queue replay: vectorized ``QueueReplay.snapshots`` against a plain-Python loop over jobs.

    python -m benchmarks.queue_replay --out FILE.json [--trace theta_2022] [--snapshots 1000] [--baseline-snapshots 40]

Loads the trace through ``lab.data`` (timed: ``load_s`` covers reading and
validating the SWF file), then times ``snapshots`` over evenly spaced times
across the trace (best of ``--repeat``), and the plain-Python loop
(:func:`lab.hpc.queue.naive_snapshots`, O(jobs) per snapshot) on a subset of
the same times, checking that both give identical pending/running/busy counts.
JSON keys: ``jobs``, ``load_s``, ``snapshots_per_s``, ``baseline_snapshots_per_s``,
``speedup`` (their ratio), and ``speedup_with_setup`` (counting the one-off
``replay_setup_s`` against the ``--snapshots`` snapshots), plus the machine and the inputs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._common import write
from lab.hpc.queue import QueueReplay, naive_snapshots
from lab.hpc.swf import load_trace


def run(trace_name: str, n_snapshots: int, n_baseline: int, repeat: int) -> dict:
    t0 = time.perf_counter()
    trace = load_trace(trace_name)
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    replay = QueueReplay(trace)
    setup_s = time.perf_counter() - t0
    times = np.linspace(replay.first_submit, replay.last_end, n_snapshots)

    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        vectorized = replay.snapshots(times)
        best = min(best, time.perf_counter() - t0)

    subset = times[:: max(1, n_snapshots // n_baseline)][:n_baseline]
    t0 = time.perf_counter()
    loop = naive_snapshots(replay.submit.tolist(), replay.wait.tolist(), (replay.end - replay.start).tolist(), replay.processors.tolist(), subset.tolist())
    baseline_s = time.perf_counter() - t0

    expected = vectorized.set_index("time").loc[subset, ["pending", "running", "busy_processors", "pending_processors"]]
    agree = bool(np.array_equal(expected.to_numpy(), np.asarray(loop)))
    if not agree:
        raise SystemExit("vectorized replay and the plain-Python loop disagree: the benchmark result would be meaningless")

    snapshots_per_s = n_snapshots / best
    with_setup_per_s = n_snapshots / (setup_s + best)  # a cold start: sort the events, then the snapshots
    baseline_per_s = len(subset) / baseline_s
    return {
        "benchmark": "queue_replay",
        "inputs": {"trace": trace_name, "snapshots": n_snapshots, "baseline_snapshots": len(subset), "repeat": repeat},
        "jobs": len(trace),
        "load_s": load_s,
        "replay_setup_s": setup_s,
        "snapshots_s": best,
        "snapshots_per_s": snapshots_per_s,
        "baseline": "plain-Python loop over every job per snapshot (lab.hpc.queue.naive_snapshots)",
        "baseline_snapshots_per_s": baseline_per_s,
        "speedup": snapshots_per_s / baseline_per_s,
        "snapshots_per_s_with_setup": with_setup_per_s,
        "speedup_with_setup": with_setup_per_s / baseline_per_s,
        "results_agree": agree,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--trace", default="theta_2022", help="registered SWF trace (lab.data name)")
    p.add_argument("--snapshots", type=int, default=1000)
    p.add_argument("--baseline-snapshots", type=int, default=40)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    write(a.out, run(a.trace, a.snapshots, a.baseline_snapshots, a.repeat))


if __name__ == "__main__":
    main()
