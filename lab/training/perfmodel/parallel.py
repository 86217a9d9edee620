"""Measured training steps under data, tensor and pipeline parallelism on gloo (the validation runs).

What the performance model is validated against: real training steps of the GPT of
:mod:`lab.training.model`, built from the functions of :mod:`.primitives`, on ``dp * tp * pp`` processes
joined by ``torch.distributed`` (gloo). Ranks are placed tensor-parallel innermost, then data-, then
pipeline-parallel (Megatron-LM's order; :class:`.operators.Operator`'s ``group_stride``).

* **TP** (own column/row-parallel linears; ``torch.distributed.tensor.parallel`` needs DTensor
  collectives that gloo lacks for some ops): :class:`StageModule` shards QKV / FFN-up by output, out-proj
  / FFN-down by input, the embedding, head and cross-entropy by vocabulary (Shoeybi et al. 2019, Sec. 3).
  A row-parallel bias lives on TP rank 0 only (it is added once to the sum).
* **PP** (own stage split, :meth:`.config.PerfConfig.stage_layers`): the non-interleaved 1F1B order of
  :func:`.compose.pipeline_order`; activations and their gradients go by ``isend`` / ``recv``.
* **DP**: the gradients are views of one flat buffer per rank, all-reduced in
  ``ceil(bytes / bucket_cap_mb)`` equal buckets after the last backward (no overlap: the composition's
  ``overlap_grad_sync=False`` case), then AdamW steps and the buffer is zeroed.

Each step's wall time is measured on every rank between a barrier and the end of its optimizer step;
the step's time is the slowest rank's. Token ids are random (timing does not depend on the text).

Run one configuration with :func:`measure_steps` (it starts the ranks as subprocesses, on loopback or
inside the namespaces of a :class:`lab.training.netns.ShapedNetwork`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from lab.training.errors import TrainingError
from lab.training.perfmodel import primitives as P
from lab.training.perfmodel.compose import pipeline_order
from lab.training.perfmodel.config import PerfConfig

__all__ = ["StageModule", "make_optimizer", "measure_steps", "launch_ranks", "rank_coords", "MeasureError"]


class MeasureError(TrainingError, RuntimeError):
    """A measured run failed: a rank exited non-zero or timed out (its stderr tail is in the message)."""


def make_optimizer(params) -> torch.optim.Optimizer:
    """The optimizer every measured step uses (and the sampler times): AdamW, lr 1e-4, torch's defaults."""
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1)


def rank_coords(rank: int, cfg: PerfConfig) -> tuple[int, int, int]:
    """``(tp_rank, dp_rank, pp_rank)`` of a global rank (tp innermost, then dp, then pp)."""
    return rank % cfg.tp, (rank // cfg.tp) % cfg.dp, rank // (cfg.tp * cfg.dp)


def _param(*shape, dtype) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, dtype=dtype) * 0.02)


class StageModule(nn.Module):
    """The blocks of one pipeline stage on one TP rank, as :mod:`.primitives` calls.

    Parameters
    ----------
    cfg : PerfConfig
    stage : int
        Pipeline stage ``0 .. pp - 1``.
    tp_rank : int
    tp_group : ProcessGroup or None
        None when ``cfg.tp == 1``.
    dtype : torch.dtype
    """

    def __init__(self, cfg: PerfConfig, stage: int, tp_rank: int = 0, tp_group=None, dtype=torch.float32):
        super().__init__()
        self.cfg, self.stage, self.tp_rank, self.group = cfg, stage, tp_rank, tp_group
        d, t, f = cfg.d_model, cfg.tp, cfg.ffn_mult
        self.h_local, self.v_local = cfg.n_head // t, cfg.padded_vocab // t
        self.vocab_start = tp_rank * self.v_local
        b = cfg.bias
        own_bias = b and tp_rank == 0
        layers = cfg.stage_layers()
        self.first, self.last = stage == 0, stage == cfg.pp - 1
        self.block_fwd_s: list[float] = []  # wall seconds of each block forward (the encoder_fwd component)
        if self.first:
            self.tok = _param(self.v_local, d, dtype=dtype)
            self.pos = _param(cfg.seq_len, d, dtype=dtype)
        self.blocks = nn.ModuleList()
        for _ in range(layers[stage]):
            blk = nn.ParameterDict({
                "ln1_w": nn.Parameter(torch.ones(d, dtype=dtype)), "qkv_w": _param(3 * d // t, d, dtype=dtype),
                "proj_w": _param(d, d // t, dtype=dtype), "ln2_w": nn.Parameter(torch.ones(d, dtype=dtype)),
                "fc_w": _param(f * d // t, d, dtype=dtype), "fc2_w": _param(d, f * d // t, dtype=dtype)})
            if b:
                blk.update({"ln1_b": nn.Parameter(torch.zeros(d, dtype=dtype)),
                            "qkv_b": nn.Parameter(torch.zeros(3 * d // t, dtype=dtype)),
                            "ln2_b": nn.Parameter(torch.zeros(d, dtype=dtype)),
                            "fc_b": nn.Parameter(torch.zeros(f * d // t, dtype=dtype))})
            if own_bias:
                blk.update({"proj_b": nn.Parameter(torch.zeros(d, dtype=dtype)),
                            "fc2_b": nn.Parameter(torch.zeros(d, dtype=dtype))})
            self.blocks.append(blk)
        if self.last:
            self.lnf_w = nn.Parameter(torch.ones(d, dtype=dtype))
            self.lnf_b = nn.Parameter(torch.zeros(d, dtype=dtype)) if b else None
            self.head = _param(self.v_local, d, dtype=dtype)

    def _copy(self, x):
        return P.CopyToTensorParallel.apply(x, self.group) if self.group is not None else x

    def _reduce(self, x):
        return P.ReduceFromTensorParallel.apply(x, self.group) if self.group is not None else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: token ids ``(b, s)`` int64 on the first stage, else activations ``(b, s, d)``.
        Returns activations ``(b, s, d)``; on the last stage, after the final LayerNorm and before the head."""
        if self.first:
            x = self._reduce(P.embedding(x, self.tok, self.vocab_start, self.cfg.tp))
            x = P.position_embedding(x, self.pos)
        for blk in self.blocks:
            t0 = time.perf_counter()
            a = self._copy(P.layernorm(x, blk["ln1_w"], blk.get("ln1_b")))
            a = P.attention(P.linear(a, blk["qkv_w"], blk.get("qkv_b")), self.h_local)
            a = self._reduce(P.linear(a, blk["proj_w"], blk.get("proj_b")))
            x = P.residual(x, a)
            a = self._copy(P.layernorm(x, blk["ln2_w"], blk.get("ln2_b")))
            a = P.gelu(P.linear(a, blk["fc_w"], blk.get("fc_b")))
            a = self._reduce(P.linear(a, blk["fc2_w"], blk.get("fc2_b")))
            x = P.residual(x, a)
            self.block_fwd_s.append(time.perf_counter() - t0)
        if self.last:
            x = P.layernorm(x, self.lnf_w, self.lnf_b)
        return x

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Head and cross-entropy of the last stage: ``x: (b, s, d)``, ``targets: (b, s)`` -> scalar."""
        logits = P.linear(self._copy(x), self.head, None)
        return P.cross_entropy(logits.view(-1, self.v_local), targets.reshape(-1), self.vocab_start,
                               self.cfg.tp, self.group)


def _flat_grads(module: nn.Module) -> torch.Tensor:
    params = [p for p in module.parameters()]
    buf = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
    off = 0
    for p in params:
        p.grad = buf[off:off + p.numel()].view_as(p)
        off += p.numel()
    return buf


def _worker(spec: dict) -> dict:
    """One rank's run (called by ``python -m lab.training.perfmodel.parallel``); returns its step times."""
    cfg = PerfConfig.model_validate(spec["config"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(spec.get("seed", 0) + rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tp_rank, dp_rank, pp_rank = rank_coords(rank, cfg)
    tp_group = dp_group = None
    for p_ in range(cfg.pp):  # every rank creates every group, in the same order
        for q in range(cfg.dp):
            ranks = [p_ * cfg.tp * cfg.dp + q * cfg.tp + i for i in range(cfg.tp)]
            g = dist.new_group(ranks) if cfg.tp > 1 else None
            if rank in ranks:
                tp_group = g
        for i in range(cfg.tp):
            ranks = [p_ * cfg.tp * cfg.dp + q * cfg.tp + i for q in range(cfg.dp)]
            g = dist.new_group(ranks) if cfg.dp > 1 else None
            if rank in ranks:
                dp_group = g
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    mod = StageModule(cfg, pp_rank, tp_rank, tp_group, dtype)
    buf = _flat_grads(mod)
    opt = make_optimizer(list(mod.parameters()))
    m, b, s, d = cfg.n_micro_batches, cfg.micro_batch, cfg.seq_len, cfg.d_model
    gen = torch.Generator().manual_seed(1234 + dp_rank)
    ids = torch.randint(0, cfg.vocab_size, (m, b, s + 1), generator=gen)
    order = pipeline_order("1f1b", pp_rank, cfg.pp, m)
    prev = rank - cfg.tp * cfg.dp if pp_rank > 0 else None
    nxt = rank + cfg.tp * cfg.dp if pp_rank < cfg.pp - 1 else None
    nbytes = buf.numel() * buf.element_size()
    k = max(1, math.ceil(nbytes / (cfg.bucket_cap_mb * 2**20)))
    buckets = list(torch.tensor_split(buf, k)) if cfg.dp > 1 else []
    scale = 1.0 / (m * cfg.dp)

    def step():
        sends, saved = [], {}
        rec = {"F": [], "B": []}
        P.TP_COMM_SECONDS[0] = 0.0
        mod.block_fwd_s.clear()
        for kind, j in order:
            ts = time.perf_counter()
            if kind == "F":
                if mod.first:
                    inp = ids[j, :, :s]
                else:
                    inp = torch.empty(b, s, d, dtype=dtype)
                    dist.recv(inp, prev)
                    inp.requires_grad_(True)
                    ts = time.perf_counter()  # the slot is the compute, not the wait for the activation
                out = mod(inp)
                if mod.last:
                    out = mod.loss(out, ids[j, :, 1:]) * scale
                else:
                    sends.append(dist.isend(out.detach(), nxt))
                saved[j] = (inp, out)
            else:
                inp, out = saved.pop(j)
                if mod.last:
                    out.backward()
                else:
                    g = torch.empty(b, s, d, dtype=dtype)
                    dist.recv(g, nxt)
                    ts = time.perf_counter()
                    out.backward(g)
                if not mod.first:
                    sends.append(dist.isend(inp.grad, prev))
            rec[kind].append(time.perf_counter() - ts)
        for w in sends:
            w.wait()
        t1 = time.perf_counter()
        for bucket in buckets:
            dist.all_reduce(bucket, group=dp_group)
        t2 = time.perf_counter()
        opt.step()
        buf.zero_()
        return {"fwd_s": rec["F"], "bwd_s": rec["B"], "grad_sync_s": t2 - t1, "update_s": time.perf_counter() - t2,
                "tp_comm_s": P.TP_COMM_SECONDS[0], "block_fwd_s": list(mod.block_fwd_s)}

    times, parts = [], []
    for i in range(spec["warmup"] + spec["steps"]):
        dist.barrier()
        t0 = time.perf_counter()
        part = step()
        times.append(time.perf_counter() - t0)
        parts.append(part)
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "stage": pp_rank, "times": times[spec["warmup"]:], "parts": parts[spec["warmup"]:]}


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def launch_ranks(module: str, spec: dict, world: int, *, network=None, hosts=None,
                 timeout_s: float = 300.0) -> list[dict]:
    """Start ``world`` ranks of ``python -m module SPEC OUT`` and return each rank's JSON result.

    Parameters
    ----------
    module : str
        A module whose ``__main__`` reads the spec file, runs rank ``$RANK`` and writes its result file
        (this module's and :mod:`.comm`'s).
    spec : dict
        JSON-serialisable run description.
    world : int
    network : lab.training.netns.ShapedNetwork, optional
        Start rank ``r`` inside host ``hosts[r]``'s namespace (rendezvous at host 0's address, gloo on
        the host's veth); default: every rank here on loopback.
    hosts : list of int, optional
        Host of each rank (default ``r * n_hosts // world``: ranks split evenly, in order).
    timeout_s : float

    Raises
    ------
    MeasureError
        A rank exited non-zero (its stderr tail is in the message) or ran past ``timeout_s``.
    """
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="perfmodel-run-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        procs = []
        for r in range(world):
            env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
            argv = [sys.executable, "-m", module, str(spec_path), str(Path(tmp) / f"r{r}.json")]
            if network is None:
                env["GLOO_SOCKET_IFNAME"] = "lo"
                procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            else:
                hs = hosts or [r * len(network.hosts) // world for r in range(world)]
                env.update({"GLOO_SOCKET_IFNAME": network.hosts[hs[r]].ifname,
                            "MASTER_ADDR": network.hosts[0].address})
                procs.append(network.popen(hs[r], argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + timeout_s
        errors = []
        for r, p in enumerate(procs):
            try:
                _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.wait()
                raise MeasureError(f"rank {r} of {module} {spec} ran past {timeout_s:g} s") from None
            if p.returncode != 0:
                errors.append(f"rank {r} exit {p.returncode}: {err.decode(errors='replace')[-1500:]}")
        if errors:
            raise MeasureError("; ".join(errors))
        return [json.loads((Path(tmp) / f"r{r}.json").read_text()) for r in range(world)]


def measure_steps(config: PerfConfig, *, steps: int = 5, warmup: int = 2, network=None, hosts=None,
                  timeout_s: float = 300.0, seed: int = 0, detail: bool = False):
    """Run ``warmup + steps`` training steps of ``config`` on ``config.world_size`` processes.

    Parameters
    ----------
    config : PerfConfig
    steps, warmup : int
        Timed steps and untimed warm-up steps.
    network, hosts, timeout_s
        As :func:`launch_ranks`.
    seed : int

    detail : bool
        Also return every rank's per-step parts.

    Returns
    -------
    list of float
        Seconds of each timed step (the slowest rank's), length ``steps``. With ``detail``, ``(times,
        ranks)``: ``ranks[r] = {"rank", "stage", "times", "parts"}``, each part ``{"fwd_s", "bwd_s"
        (each slot of the schedule, wall s), "grad_sync_s", "update_s", "tp_comm_s",
        "block_fwd_s"}``.

    Raises
    ------
    MeasureError
        A rank failed or ran past ``timeout_s``.
    """
    spec = {"config": config.model_dump(mode="json"), "steps": steps, "warmup": warmup, "seed": seed}
    res = launch_ranks("lab.training.perfmodel.parallel", spec, config.world_size, network=network, hosts=hosts,
                       timeout_s=timeout_s)
    times = [max(ts) for ts in zip(*(r["times"] for r in res))]
    return (times, res) if detail else times


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec")
    ap.add_argument("out")
    a = ap.parse_args()
    res = _worker(json.loads(Path(a.spec).read_text()))
    Path(a.out).write_text(json.dumps(res))
