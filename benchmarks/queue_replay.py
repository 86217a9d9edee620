"""Queue replay: vectorized ``QueueReplay.snapshots`` against a vectorised NumPy scan of the jobs per snapshot.

    python -m benchmarks.queue_replay --out FILE.json [--trace theta_2022] [--snapshots 1000] [--baseline-snapshots 40] [--repeat 5]

Loads the trace through ``lab.data`` (timed: ``load_s`` covers reading and
validating the SWF file), then, on the same ``--snapshots`` evenly spaced times
across the trace and in the same run, times both

* ``QueueReplay.snapshots`` (sorted job events, one ``searchsorted`` per count), and
* the fair baseline, :func:`numpy_scan_snapshots`: per snapshot, boolean masks over
  all jobs' arrays (``submit <= t < start``, ``start <= t < end``) and their sums,
  O(jobs) per snapshot but in NumPy,

each best of ``--repeat`` runs (``time.perf_counter``), and checks they give identical
pending/running/busy/pending-processor counts. The plain-Python loop
(:func:`lab.hpc.queue.naive_snapshots`) is kept as a second reference, timed the same
way (best of ``--repeat``) on ``--baseline-snapshots`` of the times, since it is slow.

JSON keys: ``jobs``, ``load_s``, ``snapshots_per_s``, ``baseline`` (what the baseline is),
``baseline_snapshots_per_s`` (the NumPy scan), ``speedup`` (their ratio), ``speedup_with_setup``
(counting the one-off ``replay_setup_s`` against the ``--snapshots`` snapshots),
``python_loop_snapshots_per_s`` and ``speedup_vs_python_loop``, plus the machine and the inputs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._common import write
from lab.hpc.queue import QueueReplay, naive_snapshots
from lab.hpc.swf import load_trace


def numpy_scan_snapshots(submit, start, end, processors, times) -> np.ndarray:
    """Queue counts by a vectorised scan of every job at each time (the fair baseline).

    Parameters
    ----------
    submit, start, end : numpy.ndarray of float64, shape (n_jobs,)
        Epoch seconds.
    processors : numpy.ndarray of int64, shape (n_jobs,)
    times : numpy.ndarray of float64, shape (n_times,)

    Returns
    -------
    numpy.ndarray of int64, shape (n_times, 4)
        ``pending, running, busy_processors, pending_processors`` per time (pending:
        ``submit <= t < start``; running: ``start <= t < end``), as :func:`lab.hpc.queue.naive_snapshots`.
    """
    out = np.empty((len(times), 4), dtype=np.int64)
    for i, t in enumerate(np.asarray(times, dtype=np.float64).tolist()):
        pend = (submit <= t) & (start > t)
        run = (start <= t) & (end > t)
        out[i] = (np.count_nonzero(pend), np.count_nonzero(run), processors[run].sum(), processors[pend].sum())
    return out


def _best_of(repeat: int, fn):
    best, value = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def run(trace_name: str, n_snapshots: int, n_baseline: int, repeat: int) -> dict:
    t0 = time.perf_counter()
    trace = load_trace(trace_name)
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    replay = QueueReplay(trace)
    setup_s = time.perf_counter() - t0
    times = np.linspace(replay.first_submit, replay.last_end, n_snapshots)
    cols = ["pending", "running", "busy_processors", "pending_processors"]

    best, vectorized = _best_of(repeat, lambda: replay.snapshots(times))
    submit, start, end = replay.submit.astype(np.float64), replay.start.astype(np.float64), replay.end.astype(np.float64)
    procs = replay.processors.astype(np.int64)
    scan_s, scanned = _best_of(repeat, lambda: numpy_scan_snapshots(submit, start, end, procs, times))
    agree_scan = bool(np.array_equal(vectorized[cols].to_numpy().astype(np.int64), scanned))

    subset = times[:: max(1, n_snapshots // n_baseline)][:n_baseline]
    args = (replay.submit.tolist(), replay.wait.tolist(), (replay.end - replay.start).tolist(), replay.processors.tolist(), subset.tolist())
    loop_s, loop = _best_of(repeat, lambda: naive_snapshots(*args))
    expected = vectorized.set_index("time").loc[subset, cols]
    agree_loop = bool(np.array_equal(expected.to_numpy(), np.asarray(loop)))
    if not (agree_scan and agree_loop):
        raise SystemExit(f"the replay and a baseline disagree (numpy scan agrees: {agree_scan}, python loop agrees: {agree_loop}): the result would be meaningless")

    snapshots_per_s = n_snapshots / best
    with_setup_per_s = n_snapshots / (setup_s + best)  # a cold start: sort the events, then the snapshots
    scan_per_s = n_snapshots / scan_s
    loop_per_s = len(subset) / loop_s
    return {
        "benchmark": "queue_replay",
        "inputs": {"trace": trace_name, "snapshots": n_snapshots, "baseline_snapshots": len(subset), "repeat": repeat},
        "jobs": len(trace),
        "load_s": load_s,
        "replay_setup_s": setup_s,
        "timing": f"each method best of {repeat} runs (time.perf_counter), same snapshot times, same process",
        "snapshots_s": best,
        "snapshots_per_s": snapshots_per_s,
        "baseline": "vectorised NumPy scan of every job per snapshot (benchmarks.queue_replay.numpy_scan_snapshots), best of repeat, all snapshots",
        "baseline_s": scan_s,
        "baseline_snapshots_per_s": scan_per_s,
        "speedup": snapshots_per_s / scan_per_s,
        "snapshots_per_s_with_setup": with_setup_per_s,
        "speedup_with_setup": with_setup_per_s / scan_per_s,
        "python_loop_snapshots_per_s": loop_per_s,
        "speedup_vs_python_loop": snapshots_per_s / loop_per_s,
        "results_agree": agree_scan and agree_loop,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--trace", default="theta_2022", help="registered SWF trace (lab.data name)")
    p.add_argument("--snapshots", type=int, default=1000)
    p.add_argument("--baseline-snapshots", type=int, default=40, help="snapshots for the (slow) plain-Python loop")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    write(a.out, run(a.trace, a.snapshots, a.baseline_snapshots, a.repeat))


if __name__ == "__main__":
    main()
