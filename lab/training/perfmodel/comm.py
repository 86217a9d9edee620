"""Communication model: gloo collectives measured per tier, and their time as a function of message size.

Zhang et al., arXiv 2509.22832, Sec. III-B: NCCL all-reduce, all-gather, reduce-scatter and point-to-point
are benchmarked intra-node and inter-node and a regressor per (collective, precision, nodes, GPUs per
node) predicts them. Here the collectives are gloo's (``torch.distributed``, CPU tensors), measured
(:func:`measure_collectives`) on

* ``loopback``: every rank in this network namespace, over ``lo`` (the single-tier case);
* ``fast`` / ``slow``: inside a :class:`lab.training.netns.ShapedNetwork` — ranks in one host namespace
  talk over its loopback (fast tier, like NVLink inside a node), ranks in different hosts over the
  ``tc``-shaped veth (slow tier, like an inter-node link).

Message size ``S`` follows :mod:`.operators`: the reduced size for all-reduce, the gathered (output) size
for all-gather, the input size for reduce-scatter, the sent size for send/recv. One call's time is the
slowest rank's, between a barrier and the call's return (send/recv: half a ping-pong round trip); a size's
time is the **mean** over repeats (the median is kept beside it). A step adds its calls, so what it costs is
each call's expected time, and on this machine that is not the typical one: up to about 500 KB on loopback
a call takes either about 0.3 ms or about 3.5 ms (near one tick of this kernel, ``CONFIG_HZ=250``), the slow
mode in 20-70 % of the repeats of a size, so the median of 15 repeats jumps between the two modes from one
size to the next while the mean stays near their mixture.

The model (:class:`CommModel`) makes each measured curve (collective, world size, tier) non-decreasing in
size (isotonic regression of the means, weighted by repeats: a larger message does not cost less, and the
pooling averages the noise of neighbouring sizes) and interpolates it piecewise-linearly in log-log space:
gloo switches algorithm and TCP behaves differently by size, so an alpha-beta line through all sizes is
wrong at some size (that line is what :mod:`.roofline` uses, and it is fitted here too,
:meth:`CommCurve.alpha_beta`, for the report). Above the largest measured size it extrapolates with the
slope of the two largest measured sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CommCurve", "CommModel", "measure_collectives", "DEFAULT_SIZES", "COLLECTIVES"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
#: Message sizes in bytes: 256 B to 16 MiB, four per octave-pair (factor sqrt 2).
DEFAULT_SIZES = [int(round(2 ** (e / 2))) // 16 * 16 for e in range(16, 49)]


def _worker(spec: dict) -> dict:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = {}
    for coll in spec["collectives"]:
        for size in spec["sizes"]:
            n = max(world, size // 4 // world * world)
            x = torch.randn(n)
            part = torch.empty(n // world)
            full = torch.empty(n)

            def call():
                if coll == "all_reduce":
                    dist.all_reduce(x)
                elif coll == "all_gather":
                    dist.all_gather_into_tensor(full, part)
                elif coll == "reduce_scatter":
                    dist.reduce_scatter_tensor(part, x)
                elif coll == "send_recv":  # ping-pong between ranks 0 and 1
                    if rank == 0:
                        dist.send(x, 1)
                        dist.recv(x, 1)
                    elif rank == 1:
                        dist.recv(x, 0)
                        dist.send(x, 0)
                else:
                    raise ValueError(f"unknown collective {coll!r}")
            times = []
            for i in range(spec["warmup"] + spec["repeats"]):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                dt = time.perf_counter() - t0
                if i >= spec["warmup"]:
                    times.append(dt / 2 if coll == "send_recv" else dt)
            out[f"{coll}:{n * 4}"] = times
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "times": out}


def measure_collectives(world: int = 2, *, tier: str = "loopback", sizes=None, collectives=COLLECTIVES,
                        repeats: int = 40, warmup: int = 3, network=None, hosts=None, timeout_s: float = 600.0) -> list[dict]:
    """Time gloo collectives on ``world`` ranks started as processes.

    Parameters
    ----------
    world : int
    tier : str
        The label the samples get (``"loopback"``, ``"fast"``, ``"slow"``).
    sizes : list of int, optional
        Message bytes (default :data:`DEFAULT_SIZES`); rounded down to fp32 elements divisible by ``world``.
    collectives : sequence of str
    repeats, warmup : int
    network, hosts
        As :func:`lab.training.perfmodel.parallel.launch_ranks` (ranks inside a ShapedNetwork's hosts).

    Returns
    -------
    list of dict
        ``{"collective", "world", "tier", "bytes", "time_s" (mean of the slowest rank per repeat),
        "median_s", "times_s"}``.

    Raises
    ------
    lab.training.perfmodel.parallel.MeasureError
        A rank failed.
    """
    from lab.training.perfmodel.parallel import launch_ranks

    spec = {"collectives": list(collectives), "sizes": list(sizes or DEFAULT_SIZES), "repeats": repeats,
            "warmup": warmup}
    res = launch_ranks("lab.training.perfmodel.comm", spec, world, network=network, hosts=hosts, timeout_s=timeout_s)
    rows = []
    for key in res[0]["times"]:
        coll, nbytes = key.rsplit(":", 1)
        per_rep = [max(r["times"][key][i] for r in res) for i in range(len(res[0]["times"][key]))]
        if coll == "send_recv":
            per_rep = res[0]["times"][key]  # rank 0's round trip is the one the ping-pong measures
        rows.append({"collective": coll, "world": world, "tier": tier, "bytes": int(nbytes),
                     "time_s": statistics.fmean(per_rep), "median_s": statistics.median(per_rep),
                     "times_s": per_rep})
    return rows


@dataclass(frozen=True)
class CommCurve:
    """Measured time of one (collective, world, tier) by message size, interpolated in log-log space.

    Attributes
    ----------
    collective, tier : str
    world : int
    sizes : ndarray
        Bytes, increasing.
    times : ndarray
        Seconds per size: the measured means made non-decreasing (see :meth:`CommModel`).
    tail_slope : float
        Seconds per byte above the largest size: the slope of the two largest sizes' measured means (0 if
        they fall).
    """

    collective: str
    world: int
    tier: str
    sizes: np.ndarray
    times: np.ndarray
    tail_slope: float = 0.0

    def __call__(self, nbytes: float) -> float:
        """Seconds of one call of ``nbytes`` (0 for ``nbytes <= 0``)."""
        if nbytes <= 0:
            return 0.0
        s, t = self.sizes, self.times
        if nbytes < s[0]:
            return float(t[0])  # latency-bound below the smallest size
        if nbytes > s[-1]:
            return float(t[-1] + self.tail_slope * (nbytes - s[-1]))
        return float(np.exp(np.interp(np.log(nbytes), np.log(s), np.log(t))))

    def alpha_beta(self) -> tuple[float, float]:
        """``(alpha_s, beta_B_per_s)`` of the least-squares line ``t = alpha + S / beta`` (relative error)."""
        from scipy.optimize import nnls

        A = np.column_stack([np.ones_like(self.sizes, dtype=float), self.sizes.astype(float)]) / self.times[:, None]
        (a, inv_b), _ = nnls(A, np.ones(len(self.sizes)))
        return float(a), float(1.0 / inv_b) if inv_b > 0 else float("inf")


class CommModel:
    """Every measured curve, looked up by (collective, group size, tier).

    Parameters
    ----------
    rows : list of dict
        :func:`measure_collectives` output (any number of calls, concatenated): ``collective``, ``world``,
        ``tier``, ``bytes`` and ``time_s`` (seconds, the mean), optionally ``times_s`` (the repeats, whose
        count weights the size).

    Each curve's means are fitted by isotonic regression in size (:class:`sklearn.isotonic.IsotonicRegression`,
    non-decreasing, weighted by repeats): a size whose mean sits above a larger size's is pooled with it.

    Raises
    ------
    ValueError
        A curve with fewer than two sizes, or a row whose ``bytes`` or ``time_s`` is not a positive finite
        number (the message names the row).
    """

    def __init__(self, rows: list[dict]):
        from sklearn.isotonic import IsotonicRegression

        groups: dict = {}
        for i, r in enumerate(rows):
            b, t = r.get("bytes"), r.get("time_s")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (b, t)):
                raise ValueError(f"comm row {i} ({r.get('collective')!r}, world {r.get('world')!r}, tier "
                                 f"{r.get('tier')!r}): bytes = {b!r}, time_s = {t!r}; both must be positive numbers")
            groups.setdefault((r["collective"], int(r["world"]), r["tier"]), []).append(
                (float(b), float(t), len(r.get("times_s") or [0])))
        self.curves: dict = {}
        for key, pts in groups.items():
            pts.sort()
            if len(pts) < 2:
                raise ValueError(f"the curve {key} has {len(pts)} size(s); at least two are needed")
            sizes, means, n = (np.array(c, float) for c in zip(*pts))
            times = IsotonicRegression(increasing=True).fit_transform(np.log(sizes), means, sample_weight=n)
            slope = max((means[-1] - means[-2]) / (sizes[-1] - sizes[-2]), 0.0)
            self.curves[key] = CommCurve(*key, sizes, times, float(slope))
        self.rows = rows

    def time(self, collective: str, group_size: int, nbytes: float, tier: str = "loopback") -> float:
        """Seconds of one call.

        Raises
        ------
        KeyError
            No curve measured for ``(collective, group_size, tier)``; the message lists the measured ones.
        """
        if group_size <= 1 or nbytes <= 0:
            return 0.0
        try:
            curve = self.curves[(collective, group_size, tier)]
        except KeyError:
            raise KeyError(f"no measured curve for {(collective, group_size, tier)}; measured: {sorted(self.curves)}") from None
        return curve(nbytes)

    def tiers(self) -> list[str]:
        """The tiers with curves."""
        return sorted({k[2] for k in self.curves})

    @classmethod
    def load(cls, path: str | Path) -> CommModel:
        """From a JSON file holding ``{"rows": [...]}`` (the benchmark's comm samples)."""
        return cls(json.loads(Path(path).read_text(encoding="utf-8"))["rows"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="One rank of a collective measurement (started by measure_collectives).")
    ap.add_argument("spec")
    ap.add_argument("out")
    a = ap.parse_args()
    Path(a.out).write_text(json.dumps(_worker(json.loads(Path(a.spec).read_text()))))
