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
slowest rank's, between a barrier and the call's return (send/recv: half a ping-pong round trip), the
median over repeats.

The model (:class:`CommModel`) interpolates each measured curve (collective, world size, tier)
piecewise-linearly in log-log space: gloo switches algorithm and TCP behaves differently by size, so an
alpha-beta line through all sizes is wrong at some size (that line is what :mod:`.roofline` uses, and it
is fitted here too, :meth:`CommCurve.alpha_beta`, for the report). Outside the measured sizes it
extrapolates with the alpha-beta line of the two end points.
"""

from __future__ import annotations

import argparse
import json
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
                        repeats: int = 15, warmup: int = 3, network=None, hosts=None, timeout_s: float = 600.0) -> list[dict]:
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
        ``{"collective", "world", "tier", "bytes", "time_s" (median of the slowest rank per repeat), "times_s"}``.

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
                     "time_s": statistics.median(per_rep), "times_s": per_rep})
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
        Seconds (median per size).
    """

    collective: str
    world: int
    tier: str
    sizes: np.ndarray
    times: np.ndarray

    def __call__(self, nbytes: float) -> float:
        """Seconds of one call of ``nbytes`` (0 for ``nbytes <= 0``)."""
        if nbytes <= 0:
            return 0.0
        s, t = self.sizes, self.times
        if nbytes < s[0]:
            return float(t[0])  # latency-bound below the smallest size
        if nbytes > s[-1]:
            slope = (t[-1] - t[-2]) / (s[-1] - s[-2])
            return float(t[-1] + max(slope, 0.0) * (nbytes - s[-1]))
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
        :func:`measure_collectives` output (any number of calls, concatenated).

    Raises
    ------
    ValueError
        A curve with fewer than two sizes.
    """

    def __init__(self, rows: list[dict]):
        groups: dict = {}
        for r in rows:
            groups.setdefault((r["collective"], int(r["world"]), r["tier"]), []).append((r["bytes"], r["time_s"]))
        self.curves: dict = {}
        for key, pts in groups.items():
            pts.sort()
            if len(pts) < 2:
                raise ValueError(f"the curve {key} has {len(pts)} size(s); at least two are needed")
            self.curves[key] = CommCurve(*key, np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float))
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
