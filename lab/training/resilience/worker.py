"""One worker process of a hot-swap run: a logical data-parallel rank, or an idle spare.

The model is the real-text GPT of :mod:`lab.training.model` on the Shakespeare corpus
(:class:`~lab.training.data.TextCorpus`, :class:`~lab.training.data.BatchSampler`), trained
data-parallel with a ZeRO-1 sharded AdamW: the parameters live in one flat fp32 vector (the model's
parameters are views into it); after the backward pass the flat gradient is averaged with
``all_reduce`` (in ``grad_buckets`` pieces), each rank updates only its 1/N shard of the parameters
with AdamW (its ``exp_avg``/``exp_avg_sq`` shard is the only copy in the job), and an
``all_gather`` puts the updated shards back together. The parameters are therefore *reconstructible*
(every rank has them), the optimizer shard, its step count and the rank's RNG state are not: those
are what goes to the peer ``(rank + 1) % N`` (PHOENIX's "replicate only non-reconstructible optimizer
shards").

Per step ``t`` (with protection on) generation ``t`` is written into local ping-pong buffer ``t % 2``.
On the CPU (``snapshot_write="optimizer"``, the default there) the AdamW update itself writes it: it reads
the live parameter shard and moments (the previous generation's buffer) and writes the new ones into
buffer ``t % 2``, out of place, so the snapshot costs no copy; the all-gather reads the new shard from
there. With ``"copy"`` (CUDA, where the live state is on the device) the update runs in place and the
:class:`Snapshotter` thread copies it. Either way the thread then checksums and commits the buffer; every
``replica_interval``-th generation (and each epoch's first) it also sends it (with its CRC-32) to the peer
on a second gloo group and receives the predecessor's. In between, the peer keeps the averaged gradient
shards a replay from that replica needs (views, no copy). The training
thread goes on with the next forward and backward pass. Before its next optimizer step writes the state
again, it waits only for what that write would destroy: the copy, or, with ``"optimizer"``, the thread
being done with the buffer about to be overwritten.

The coordinator (:mod:`lab.training.resilience.coordinator`) drives workers through a
:class:`torch.distributed.TCPStore` it hosts: ``plan/<epoch>`` (JSON) says which worker holds which
logical rank and how to restore; a worker whose collective fails reports ``report/<epoch>/<worker>``
(its error, its committed generations, the checksum state of the replica it holds) and waits for the
next plan. Every epoch has its own process group, rendezvoused through ``PrefixStore("epoch<e>")``.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import queue
import resource
import signal
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lab.training.resilience.config import FaultPlan, ResilienceConfig
from lab.training.resilience.snapshot import DeviceCopier, PingPong, SnapshotError

__all__ = ["Snapshotter", "TransientCollectiveError", "worker_main"]

_SNAP_NAMES = ("state", "meta", "rng")


class TransientCollectiveError(RuntimeError):
    """An injected transient collective failure (the process stays alive and healthy)."""


def _set_parent_death_signal() -> None:
    """Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: this worker dies when its parent does."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)
    except OSError:
        pass


def _process_cpu_s() -> float:
    """User plus system CPU seconds of this whole process: every thread (training, autograd, gloo's
    transport threads) and the kernel's work for it (the loopback TCP copies)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _lr(cfg: ResilienceConfig, step: int) -> float:
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1.0 + math.cos(math.pi * progress))


class Snapshotter:
    """Background thread that writes per-step ping-pong snapshots and replicates them to the peer.

    Parameters
    ----------
    local, replica : PingPong
        Layout ``{"state": (3L,) float32, "meta": (2,) int64, "rng": (R,) uint8}``: this rank's
        parameter shard, ``exp_avg`` and ``exp_avg_sq`` shards back to back (one flat buffer, one
        copy pass, one checksum, one message), ``[optimizer step, step]``, the RNG state. ``replica``
        holds the predecessor rank's.
    rank, world_size : int
    group : ProcessGroup or None
        The gloo group used for replication (None: no replication).
    fault : callable, optional
        ``fault(generation, phase)`` called at ``"copy"`` (after the first source's copy, before the
        rest: mid-snapshot) and ``"send"`` (before the replica transfer): fault injection.
    copier : DeviceCopier, optional
        Device-to-host copies (a CUDA side stream); default: synchronous copies on the CPU.

    Notes
    -----
    Per generation the thread (a) copies, then sets ``copy_done`` -- the only thing the training
    thread ever waits for, and only right before its next optimizer step, which overwrites what was
    copied; (b) computes the CRC-32 of the host buffer and commits it; (c) for a generation submitted
    with ``replicate`` (every rank passes the same), replicates buffer and CRC to rank ``(rank + 1) % N``
    and receives the predecessor's into the replica buffer not holding the newest replica
    (:meth:`PingPong.index_for`), committed with the sender's CRC without a second pass (verified when
    read). ``cpu_s`` accumulates this thread's CPU time per part
    (:func:`time.thread_time`: the cost it takes from the training processes when there is no idle
    core), ``busy_s`` its wall time.

    A generation the optimizer wrote into its buffer itself (:meth:`submit_written`, the worker's
    ``snapshot_write="optimizer"``) skips (a). The writer of buffer ``b`` then waits, with
    :meth:`wait_writable`, until the thread is done with ``b``, i.e. its generation was committed and
    replicated. It also waits until the other buffer is committed, so that a committed generation
    exists while ``b`` is being overwritten.
    """

    def __init__(self, local: PingPong, replica: PingPong, rank: int, world_size: int, group: Any, fault=None,
                 copier: DeviceCopier | None = None):
        self.local, self.replica = local, replica
        self.rank, self.world_size, self.group, self.fault = rank, world_size, group, fault
        self.copier = copier or DeviceCopier("cpu")
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.alive = True
        self.copy_done = threading.Event()
        self.copy_done.set()
        # per buffer index (generation % 2), for generations written in place: committed, and released
        # (committed and replicated: the thread no longer reads the buffer)
        self.committed_ev = [threading.Event(), threading.Event()]
        self.released_ev = [threading.Event(), threading.Event()]
        for ev in (*self.committed_ev, *self.released_ev):
            ev.set()
        self._copied = None
        self._working = False
        self.busy_s = 0.0
        self.cpu_s = {"copy": 0.0, "crc": 0.0, "replicate": 0.0}
        self.generations = 0
        self.thread = threading.Thread(target=self._loop, name=f"snapshot-r{rank}", daemon=True)
        self.thread.start()

    def submit(self, generation: int, sources: dict[str, Any], replicate: bool = True) -> None:
        """Queue generation ``generation``: ``sources`` maps the layout's names to the live tensors (or
        sequences of them); small ones (``meta``, ``rng``) must be private copies. Called right after
        the optimizer step (on CUDA the copies are ordered behind it by an event). ``replicate``: also
        send it to the peer (every rank must pass the same value for the same generation)."""
        self.raise_error()
        self.copy_done.clear()
        self.q.put((generation, "copy", sources, self.copier.mark_ready(), replicate))

    def submit_written(self, generation: int, replicate: bool = True) -> None:
        """Queue generation ``generation``, already written into ``local``'s buffer ``generation % 2`` (begun
        with :meth:`PingPong.begin`, not committed): the thread checksums, commits and (with ``replicate``)
        replicates it."""
        self.raise_error()
        b = generation % 2
        self.committed_ev[b].clear()
        self.released_ev[b].clear()
        self.q.put((generation, "written", None, None, replicate))

    def submit_replicate(self, generation: int) -> None:
        """Queue a replica transfer of ``generation``, already committed in ``local`` (an epoch's first
        generation after a restore: the peers' replicas restart from it)."""
        self.raise_error()
        self.released_ev[self.local.index_of(self.local.get(generation, verify=False))].clear()
        self.q.put((generation, "committed", None, None, True))

    def wait_writable(self, index: int) -> None:
        """Before overwriting buffer ``index`` in place: block until the thread has released it (its
        generation committed and replicated) and has committed the other buffer's generation."""
        self.released_ev[index].wait()
        self.committed_ev[1 - index].wait()
        self.raise_error()

    def _wake_all(self) -> None:
        self.copy_done.set()
        for ev in (*self.committed_ev, *self.released_ev):
            ev.set()

    def wait_copied(self) -> None:
        """Before the live state changes: block until the last submitted generation is copied (CPU), or
        make the compute stream wait for its copy event (CUDA, after the copies are enqueued)."""
        self.copy_done.wait()
        self.raise_error()
        self.copier.wait(self._copied)

    def raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"snapshot thread of rank {self.rank} failed: {self.error}") from self.error

    def drain(self, timeout: float) -> None:
        """Wait (up to ``timeout`` s) until every queued generation is copied and replicated."""
        t_end = time.monotonic() + timeout
        while (not self.q.empty() or self._working) and time.monotonic() < t_end and self.error is None:
            time.sleep(0.002)
        self.raise_error()

    def stop(self, timeout: float = 1.0) -> None:
        self.alive = False
        self.q.put(None)
        self.thread.join(timeout)
        self._wake_all()

    def _between(self, gen: int):
        fired = []

        def hook(name: str) -> None:
            if not fired and self.fault is not None:
                fired.append(name)
                self.fault(gen, "copy")
        return hook

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None or not self.alive:
                self._wake_all()
                return
            self._working = True
            gen, how, sources, ready, replicate = item
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                if how == "copy":
                    self.copier.begin(ready)
                    buf = self.local.copy(gen, sources, between=self._between(gen), copier=self.copier)
                    self._copied = self.copier.end()
                    self.copy_done.set()
                else:  # written in place by the optimizer, or committed already: nothing to copy
                    buf = self.local.buffers[gen % 2] if how == "written" else self.local.get(gen, verify=False)
                c1 = time.thread_time()
                if how != "committed":
                    self.copier.synchronize(self._copied if how == "copy" else None)
                    self.local.commit(buf, gen)
                    self.committed_ev[self.local.index_of(buf)].set()
                c2 = time.thread_time()
                if self.fault is not None:
                    self.fault(gen, "send")
                if replicate and self.group is not None and self.world_size > 1:
                    self._replicate(gen, buf)
                self.released_ev[self.local.index_of(buf)].set()
                c3 = time.thread_time()
            except BaseException as exc:  # noqa: BLE001 - reported to the training thread
                self.error = exc
                self._wake_all()
                self._working = False
                return
            self.cpu_s["copy"] += c1 - c0
            self.cpu_s["crc"] += c2 - c1
            self.cpu_s["replicate"] += c3 - c2
            self.generations += 1
            self.busy_s += time.perf_counter() - t0
            self._working = False

    def _replicate(self, gen: int, buf) -> None:
        """Send ``buf`` (generation ``gen``, with its CRC) to the successor and receive the predecessor's
        same generation into the replica: every message posted at once, one wait."""
        nxt, prv = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        dst = self.replica.begin(gen, self.replica.index_for(gen))  # every rank replicates the same generations
        buf.set_header(gen, buf.crc)
        dst.set_header(-1, -1)
        reqs = [dist.isend(buf.wire, nxt, group=self.group, tag=1), dist.irecv(dst.wire, prv, group=self.group, tag=1)]
        for r in reqs:
            r.wait()
        rgen, rcrc = dst.header()
        if rgen != gen:
            raise SnapshotError(f"rank {self.rank}: rank {prv} replicated generation {rgen} while {gen} was expected")
        if self.alive:
            self.replica.commit(dst, gen, rcrc, trust=True)


class _Worker:
    """State of one worker process across epochs (see :func:`worker_main`)."""

    def __init__(self, cfg: ResilienceConfig, worker_id: int, port: int):
        from lab.training.data import BatchSampler, TextCorpus
        from lab.training.model import GPT

        self.cfg, self.worker_id = cfg, worker_id
        self.store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=cfg.store_timeout_s))
        self.device = torch.device("cpu")
        corpus = TextCorpus(cfg.val_plays)
        self.tokens = corpus.train_tokens
        model_cfg = cfg.model.model_copy(update={"vocab_size": cfg.model.vocab_size or corpus.tokenizer.vocab_size})
        self.model_cfg = model_cfg
        torch.manual_seed(cfg.seed)
        self.model = GPT(model_cfg)
        self.sampler = BatchSampler(len(self.tokens), model_cfg.block_size, cfg.batch_size, cfg.workers, cfg.seed)
        params = list(self.model.parameters())
        self.n_params = sum(p.numel() for p in params)
        n = cfg.workers
        self.shard_len = -(-self.n_params // n)
        padded = self.shard_len * n
        self.flat = torch.zeros(padded)
        # a ring of k + 2 flat gradient buffers (k = the replica interval), by step % (k + 2): a step's
        # averaged gradient stays intact for the k + 1 steps after it, so the replica holder keeps its
        # predecessor's shard of every step since that rank's newest replica, without a copy
        self.ring = cfg.effective_replica_interval + 2
        self.grads = [torch.zeros(padded) for _ in range(self.ring)]
        self.wd = torch.zeros(padded)
        self.views: list[tuple[torch.nn.Parameter, int, int]] = []
        off = 0
        for p in params:
            k = p.numel()
            self.flat[off:off + k].copy_(p.data.view(-1))
            p.data = self.flat[off:off + k].view_as(p)
            if p.dim() >= 2:
                self.wd[off:off + k] = cfg.weight_decay
            self.views.append((p, off, k))
            off += k
        self.init_flat = self.flat.clone()
        # the AdamW moments of this rank's shard: one flat tensor, exp_avg then exp_avg_sq (with
        # snapshot_write="copy"; with "optimizer" the live moments are in local buffer ``_cur``)
        self._own_moments = torch.zeros(2 * self.shard_len)
        self._cur = 0
        self.opt_step = 0
        self.rng_len = torch.get_rng_state().numel()
        # a generation: [parameter shard | exp_avg | exp_avg_sq] in one flat buffer, plus meta and RNG
        layout = {"state": torch.zeros(3 * self.shard_len), "meta": torch.zeros(2, dtype=torch.int64),
                  "rng": torch.zeros(self.rng_len, dtype=torch.uint8)}
        self.copier = DeviceCopier(self.flat.device)
        self.in_place = cfg.snapshot_write == "optimizer" or (cfg.snapshot_write == "auto" and self.flat.device.type == "cpu")
        if self.in_place and self.flat.device.type != "cpu":
            raise SnapshotError(f"snapshot_write='optimizer' needs the live state in host memory, not on {self.flat.device}")
        self.local = PingPong(layout, pin_memory=self.copier.pin_memory)
        self.replica = PingPong(layout, pin_memory=self.copier.pin_memory)
        # the replica holder's views of its predecessor's averaged-gradient shard of the last steps (into
        # ``grads``, by step % ring): with them a lost rank's shard is *replayed* from its replica up to the
        # survivors' generation
        self.pred_grads: list[torch.Tensor | None] = [None] * self.ring
        self.pred_grad_steps: list[int | None] = [None] * self.ring
        # the first generation since which this rank's RNG state has not changed (a replay from a replica
        # at or after it needs no random numbers), and that state
        self.rng_static_since = 0
        self._rng_seen: torch.Tensor | None = None
        self.rank: int | None = None
        self.step = 0
        self.fired: set[int] = set()
        self.recorder = None

    # ------------------------------------------------------------------ store helpers
    def _set(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def _get(self, key: str) -> Any:
        return json.loads(self.store.get(key))

    def _wait_plan(self, epoch: int) -> dict:
        key = f"plan/{epoch}"
        while True:
            if self.store.check([key]):
                return self._get(key)
            if self.store.check(["fatal"]):
                return {"restore": "fatal"}
            time.sleep(0.01)

    # ------------------------------------------------------------------ faults
    def _fault_due(self, step: int, phase: str) -> FaultPlan | None:
        for i, f in enumerate(self.cfg.faults):
            if f.rank == self.rank and f.step == step and f.phase == phase and i not in self.fired:
                if self.store.add(f"fault/{i}", 1) == 1:
                    self.fired.add(i)
                    return f
                self.fired.add(i)
        return None

    def _fire(self, f: FaultPlan) -> None:
        self._set(f"killed_at/{self.worker_id}", {"time": time.time(), "rank": self.rank, "step": f.step, "phase": f.phase,
                                                  "kind": f.kind})
        if f.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.kind == "hang":
            while True:
                time.sleep(3600)
        elif f.kind == "transient":
            raise TransientCollectiveError(f"injected transient collective error on rank {self.rank} at step {f.step}")
        elif f.kind == "corrupt_replica":
            # flip bytes of the replica this rank holds (its predecessor's shard), both generations
            for b in self.replica.buffers:
                if b.generation is not None:
                    b.tensors["state"].view(torch.uint8)[:8].bitwise_not_()

    def _snapshot_fault(self, gen: int, phase: str) -> None:
        f = self._fault_due(gen, "snapshot_" + phase)
        if f is not None:
            self._fire(f)

    # ------------------------------------------------------------------ state
    def _shard(self) -> torch.Tensor:
        return self.flat[self.rank * self.shard_len:(self.rank + 1) * self.shard_len]

    @property
    def moments(self) -> torch.Tensor:
        """The live AdamW moments of this rank's shard, ``(2 L,)`` float32: ``exp_avg`` then ``exp_avg_sq``
        (with ``snapshot_write="optimizer"``, a view into the local buffer of the newest generation)."""
        if self.in_place:
            return self.local.buffers[self._cur].tensors["state"][self.shard_len:]
        return self._own_moments

    def _buffer_index(self, tensors: dict[str, torch.Tensor]) -> int:
        """Which local buffer (0 or 1) holds ``tensors`` (a :class:`HostBuffer`'s ``tensors``)."""
        return next(i for i, b in enumerate(self.local.buffers) if b.tensors is tensors)

    def _write_current(self, step: int):
        """Write the live state as generation ``step`` into local buffer ``step % 2`` (``snapshot_write=
        "optimizer"``: the start of an epoch, where no optimizer step has written it); returns the buffer,
        begun, not committed."""
        b, L = step % 2, self.shard_len
        buf = self.local.begin(step)
        if b != self._cur:
            buf.tensors["state"][L:].copy_(self.moments)
            self._cur = b
        buf.tensors["state"][:L].copy_(self._shard())
        self._write_meta(buf, step)
        return buf

    def _write_meta(self, buf, step: int) -> None:
        buf.tensors["meta"].copy_(torch.tensor([self.opt_step, step], dtype=torch.int64))
        buf.tensors["rng"].copy_(torch.get_rng_state())

    def _snapshot_sources(self, step: int) -> dict[str, Any]:
        """What generation ``step`` holds: the live parameter shard and moments (copied by the snapshot
        thread), private copies of the small meta and RNG tensors."""
        return {"state": [self._shard(), self.moments], "meta": torch.tensor([self.opt_step, step], dtype=torch.int64),
                "rng": torch.get_rng_state().clone()}

    def _load_snapshot(self, snap: dict[str, torch.Tensor]) -> int:
        """Load a generation's buffers (this rank's shard, moments, meta, RNG); returns its step. The rest
        of the parameters comes from the other ranks' shards (the all-gather in :meth:`_restore`)."""
        L = self.shard_len
        self._shard().copy_(snap["state"][:L])
        if self.in_place:  # the buffer holding it becomes the live state
            self._cur = self._buffer_index(snap)
        else:
            self.moments.copy_(snap["state"][L:])
        self.opt_step = int(snap["meta"][0])
        torch.set_rng_state(snap["rng"].clone())
        return int(snap["meta"][1])

    def _adamw_step(self, step: int, grad_shard: torch.Tensor, into=None, between=None) -> torch.Tensor:
        """ZeRO-1 AdamW update of this rank's shard for step ``step`` (torch.optim.AdamW's update, written
        out) from the averaged gradient shard; the same code runs in training and in a replay.

        ``into``: None updates the live shard and moments in place; a local :class:`HostBuffer` (begun)
        receives the new shard and moments out of place, read from the live ones (the same operations in the
        same order, so the same bits), and becomes the live state. ``between()`` runs after the shard is
        written and before the moments (a kill there tears the generation). Returns the new shard."""
        cfg, (b1, b2) = self.cfg, self.cfg.betas
        lo, hi, L = self.rank * self.shard_len, (self.rank + 1) * self.shard_len, self.shard_len
        lr = _lr(cfg, step)
        self.opt_step += 1
        p, g, mv = self.flat[lo:hi], grad_shard, self.moments
        m, v = mv[:L], mv[L:]
        if into is None:
            p_out, m_out, v_out = p, m, v
        else:
            state = into.tensors["state"]
            p_out, m_out, v_out = state[:L], state[L:2 * L], state[2 * L:]
        torch.mul(p, 1 - lr * self.wd[lo:hi], out=p_out)
        if between is not None:
            between()
        torch.lerp(m, g, 1 - b1, out=m_out)
        torch.mul(v, b2, out=v_out).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** self.opt_step, 1 - b2 ** self.opt_step
        denom = (v_out.sqrt() / math.sqrt(bc2)).add_(cfg.eps)
        p_out.addcdiv_(m_out, denom, value=-lr / bc1)
        if into is not None:
            self._cur = self._buffer_index(into.tensors)
        return p_out

    def _note_rng(self, step: int) -> None:
        """After step ``step`` (or a restore to generation ``step``): track :attr:`rng_static_since`, the first
        generation since which this rank's RNG state is unchanged. Every rank runs the same program, so when
        this rank drew no random numbers over steps ``R + 1 .. g``, neither did a lost one: its RNG state at
        ``g`` is the one in its replica of ``R``."""
        state = torch.get_rng_state()
        if self._rng_seen is None or not torch.equal(state, self._rng_seen):
            self.rng_static_since, self._rng_seen = step, state

    def _disk_dir(self, step: int) -> Path:
        return Path(self.cfg.run_dir) / "checkpoints" / f"step_{step:08d}"

    def _save_disk(self, step: int) -> None:
        d = self._disk_dir(step)
        d.mkdir(parents=True, exist_ok=True)
        payload = {"params": self.flat.clone(), "moments": self.moments.clone(),
                   "meta": torch.tensor([self.opt_step, step], dtype=torch.int64), "rng": torch.get_rng_state().clone()}
        tmp = d / f"rank{self.rank}.pt.tmp"
        torch.save(payload, tmp)
        tmp.replace(d / f"rank{self.rank}.pt")
        dist.barrier()
        if self.rank == 0:
            (d / "COMPLETE").write_text(json.dumps({"step": step, "time": time.time()}))

    def _restore(self, plan: dict) -> None:
        how, rank = plan["restore"], self.rank
        if how == "fresh":
            self.local.invalidate()
            self.replica.invalidate()
            self.flat.copy_(self.init_flat)
            self.moments.zero_()
            self.opt_step = 0
            torch.manual_seed(self.cfg.seed * 1_000_003 + rank + 1)
            self.step = 0
        elif how == "disk":
            self.local.invalidate()
            self.replica.invalidate()
            path = self._disk_dir(plan["generation"]) / f"rank{rank}.pt"
            ck = torch.load(path, weights_only=True)
            self.flat.copy_(ck["params"])
            self.moments.copy_(ck["moments"])
            self.opt_step = int(ck["meta"][0])
            torch.set_rng_state(ck["rng"].clone())
            self.step = int(ck["meta"][1])
        else:  # memory: generation g from the ping-pong buffers, a new rank's from its peer's replica
            g = plan["generation"]
            for pp in (self.local, self.replica):
                pp.drop_after(g)
            new, replay_from = set(plan["new_ranks"]), plan.get("replay_from", {})
            if rank not in new:
                self.step = self._load_snapshot(self.local.get(g).tensors)  # verifies the CRC-32
            for r in sorted(new):
                holder = (r + 1) % self.cfg.workers
                src_gen = int(replay_from.get(str(r), g))  # the replica generation rank r restarts from
                if rank == holder:
                    buf = self.replica.get(src_gen)  # verifies the CRC-32 (the transfer recorded the sender's)
                    dist.send(torch.tensor([src_gen, buf.crc], dtype=torch.int64), r)
                    for name in _SNAP_NAMES:
                        dist.send(buf.tensors[name], r)
                    for s in range(src_gen + 1, g + 1):  # the averaged gradient shards kept since those steps
                        dist.send(self.pred_grads[self.pred_grad_steps.index(s)], r)
                elif rank == r:
                    head = torch.zeros(2, dtype=torch.int64)
                    dist.recv(head, holder)
                    dst = self.local.begin(int(head[0]))
                    for name in _SNAP_NAMES:
                        dist.recv(dst.tensors[name], holder)
                    self.local.commit(dst, int(head[0]), int(head[1]))  # verifies the CRC-32
                    self.step = self._load_snapshot(dst.tensors)
                    grad = torch.zeros(self.shard_len)
                    for s in range(src_gen + 1, g + 1):
                        # replay optimizer step s on the shard of generation s-1: the same update, from the
                        # same inputs, that the lost rank ran (bit-identical); the RNG state carries over
                        # (the plan only replays steps that drew no random numbers)
                        dist.recv(grad, holder)
                        self.step = s
                        if self.in_place:
                            buf = self.local.begin(s)
                            self._shard().copy_(self._adamw_step(s, grad, into=buf))
                            self._write_meta(buf, s)
                            self.local.commit(buf, s)
                        else:
                            self._adamw_step(s, grad)
                            self.local.write(s, self._snapshot_sources(s))
            # every rank restored its own shard of generation g: the parameters are their concatenation
            shard = self._shard().clone()
            dist.all_gather(list(self.flat.split(self.shard_len)), shard)
            if self.step != g:
                raise SnapshotError(f"rank {rank}: restored generation {g} but its step counter says {self.step}")
        self.rng_static_since, self._rng_seen = self.step, None
        self._note_rng(self.step)

    # ------------------------------------------------------------------ one epoch
    def run_epoch(self, epoch: int, plan: dict) -> dict:
        cfg, n = self.cfg, self.cfg.workers
        t_plan = time.time()
        timeout = timedelta(seconds=cfg.timeout_s)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"epoch{epoch}", self.store), rank=self.rank, world_size=n,
                                timeout=timeout)
        snap_group = dist.new_group(backend="gloo", timeout=timeout)
        t_pg = time.time()
        self._restore(plan)
        t_restored = time.time()
        self._set(f"timing/{epoch}/{self.worker_id}", {"plan": t_plan, "pg_ready": t_pg, "restored": t_restored})
        rank = self.rank
        if cfg.events_path is not None:
            self._record_start(epoch, plan)
        lo, hi = rank * self.shard_len, (rank + 1) * self.shard_len
        pred = (rank - 1) % n
        plo, phi = pred * self.shard_len, (pred + 1) * self.shard_len
        self.pred_grad_steps = [None] * self.ring
        start = self.step
        shards = list(self.flat.split(self.shard_len))
        snap = Snapshotter(self.local, self.replica, rank, n, snap_group, fault=self._snapshot_fault, copier=self.copier)
        self.snap = snap
        step_times, iter_times, iter_cpu, protected, losses = {}, {}, {}, {}, {}
        t_prev = c_prev = None
        try:
            if cfg.protect != "off":  # the epoch's first generation: local, and to the peer (its replicas restart here)
                if self.step in self.local.committed():
                    snap.submit_replicate(self.step)
                elif self.in_place:
                    self._write_current(self.step)
                    snap.submit_written(self.step)
                else:
                    snap.submit(self.step, self._snapshot_sources(self.step))
            while self.step < cfg.steps:
                step = self.step + 1
                t0, c0 = time.perf_counter(), _process_cpu_s()
                if t_prev is not None:  # the whole loop iteration of the previous step, start to start
                    iter_times[step - 1] = t0 - t_prev
                    iter_cpu[step - 1] = c0 - c_prev
                t_prev, c_prev = t0, c0
                grad = self.grads[step % self.ring]
                self.pred_grad_steps[step % self.ring] = None  # step-ring's gradient is overwritten now
                x, y = self.sampler.batch(self.tokens, step, rank)
                _, loss = self.model(x, y)
                for p, _, _ in self.views:
                    p.grad = None
                loss.backward()
                for p, off, k in self.views:
                    grad[off:off + k].copy_(p.grad.view(-1))
                f = self._fault_due(step, "collective")
                buckets = list(grad.chunk(cfg.grad_buckets))
                for i, bucket in enumerate(buckets):
                    if f is not None and i == len(buckets) // 2:
                        self._fire(f)
                    dist.all_reduce(bucket)
                grad.div_(n)
                # Ordering: generation step-1 was submitted right after the previous optimizer step and
                # has been checksummed (and, with "copy", copied) while this step's forward/backward/
                # all-reduce ran (they only read the parameters). The update below writes either a
                # buffer the thread may still be reading ("optimizer": wait until it released it) or the
                # live state in place ("copy": wait for the copy; CUDA: the compute stream waits on the
                # copy's event).
                on = cfg.protected(step)
                if on:  # keep the predecessor's gradient shard of this step (a replay's input), a view
                    self.pred_grads[step % self.ring] = grad[plo:phi]
                    self.pred_grad_steps[step % self.ring] = step
                lr = _lr(cfg, step)
                replicate = cfg.replicated(step, start)
                if self.in_place and on:
                    # the update writes generation `step` into buffer step % 2 (out of place, from the
                    # live buffer): once the thread is done with that buffer's older generation
                    snap.wait_writable(step % 2)
                    buf = self.local.begin(step)
                    new_shard = self._adamw_step(step, grad[lo:hi], into=buf, between=lambda: self._snapshot_fault(step, "copy"))
                    dist.all_gather(shards, new_shard)
                    self.step = step
                    self._write_meta(buf, step)
                    snap.submit_written(step, replicate)
                else:
                    # the plain ZeRO-1 step (an unprotected step is exactly this in either mode): in place
                    if self.in_place:  # on the live buffer, which then holds no generation
                        snap.wait_writable(self._cur)
                        self.local.release(self._cur)
                    else:
                        snap.wait_copied()
                    self._adamw_step(step, grad[lo:hi])
                    dist.all_gather(shards, self.flat[lo:hi].clone())
                    self.step = step
                    if on:
                        snap.submit(step, self._snapshot_sources(step), replicate)
                self._note_rng(step)
                step_s = time.perf_counter() - t0
                loss_t = loss.detach().clone()
                dist.all_reduce(loss_t)
                loss_v = float(loss_t) / n
                step_times[step], protected[step], losses[step] = step_s, on, loss_v
                if rank == 0:
                    self._set("progress", {"epoch": epoch, "step": step, "time": time.time()})
                    if self.recorder is not None:
                        self.recorder.step(step, loss=loss_v, lr=lr, step_s=step_s, compute_s=step_s, comm_s=0.0,
                                           worker=self.worker_id, epoch=epoch, protected=on)
                if cfg.disk_interval and step % cfg.disk_interval == 0:
                    snap.drain(cfg.timeout_s)
                    self._save_disk(step)
                f = self._fault_due(step, "step")
                if f is not None:
                    self._fire(f)
                if cfg.step_delay_s:
                    time.sleep(cfg.step_delay_s)
            if t_prev is not None:
                iter_times[self.step] = time.perf_counter() - t_prev
                iter_cpu[self.step] = _process_cpu_s() - c_prev
            snap.drain(cfg.timeout_s)
            snap.stop()
            dist.barrier()
            from lab.training.run import param_sha256

            return {"sha": param_sha256(self.model), "step": self.step, "step_s": step_times, "protected": protected,
                    "losses": losses, "snapshot_busy_s": snap.busy_s, "iter_s": iter_times, "iter_cpu_s": iter_cpu,
                    "snapshot_cpu_s": snap.cpu_s, "snapshot_generations": snap.generations}
        finally:
            snap.stop(0.5)

    def _record_start(self, epoch: int, plan: dict) -> None:
        """Status (and on rank 0 at the first start, the ``train.run``) events for the monitor."""
        from lab.training.monitor import RunRecorder

        cfg, rank = self.cfg, self.rank
        if self.recorder is None or self.recorder.rank != rank:
            if self.recorder is not None:
                self.recorder.close()
            self.recorder = RunRecorder(cfg.events_path, cfg.resolved_run_id, rank)
            self.recorder.start_heartbeat(1.0, lambda: self.step)
        self.recorder.status("started", self.step, worker=self.worker_id, epoch=epoch, restore=plan["restore"])
        if rank == 0 and epoch == 0:
            config = json.loads(cfg.model_dump_json())
            config.update(optimizer="adamw (ZeRO-1 shards)", comm="fp32")
            self.recorder.run_started(config=config, world_size=cfg.workers, n_params=self.n_params,
                                      vocab_size=self.model_cfg.vocab_size, device="cpu", backend="gloo", start_step=0,
                                      run_dir=str(cfg.run_dir), tensorboard_dir=None, comm="fp32", spares=cfg.spares)

    def report_error(self, epoch: int, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TransientCollectiveError):
            kind = "transient"
        elif "timed out" in text.lower() or "timeout" in text.lower():
            kind = "timeout"
        else:
            kind = "collective_error"
        replica = {}
        for b in self.replica.buffers:
            if b.generation is not None:
                replica[str(b.generation)] = "ok" if b.verify() else "corrupt"
        self._set(f"report/{epoch}/{self.worker_id}", {
            "rank": self.rank, "kind": kind, "error": text[:400], "step": self.step,
            "local": self.local.committed(),
            "pred_grad_steps": [s for s in self.pred_grad_steps if s is not None], "rng_static_since": self.rng_static_since,
            "replica": replica, "time": time.time()})

    def main(self) -> None:
        epoch = 0
        while True:
            plan = self._wait_plan(epoch)
            if plan["restore"] in ("fatal", "stop"):
                return
            members = {int(r): w for r, w in plan["members"].items()}
            mine = [r for r, w in members.items() if w == self.worker_id]
            if not mine:
                epoch += 1
                continue
            self.rank = mine[0]
            try:
                out = self.run_epoch(epoch, plan)
                out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                if self.recorder is not None:
                    self.recorder.stop_heartbeat()
                    self.recorder.status("finished", self.step, param_sha256=out["sha"], worker=self.worker_id)
                self._set(f"done/{epoch}/{self.worker_id}", out)
                self._destroy()
                self._wait_plan(epoch + 1)
                return
            except Exception as exc:  # noqa: BLE001 - reported to the coordinator, which decides
                if os.environ.get("LAB_RESILIENCE_DEBUG"):
                    traceback.print_exc()
                try:
                    self.snap.stop(0.2)
                except Exception:
                    pass
                self._destroy()
                self.report_error(epoch, exc)
                epoch += 1

    def _destroy(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def worker_main(cfg_json: str, worker_id: int, port: int) -> None:
    """Entry point of a worker process (``multiprocessing`` target).

    Parameters
    ----------
    cfg_json : str
        :class:`~lab.training.resilience.config.ResilienceConfig` as JSON.
    worker_id : int
        This process's id (0 .. workers + spares - 1); the first ``workers`` start as ranks, the rest as spares.
    port : int
        The coordinator's TCPStore port on 127.0.0.1.
    """
    _set_parent_death_signal()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = ResilienceConfig.model_validate_json(cfg_json)
    w = _Worker(cfg, worker_id, port)
    w.store.set(f"ready/{worker_id}", str(os.getpid()))
    try:
        w.main()
    finally:
        if w.recorder is not None:
            w.recorder.close()
