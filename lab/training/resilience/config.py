"""Configuration of a hot-swap run (:class:`ResilienceConfig`) and injected faults (:class:`FaultPlan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lab.training.data import VALIDATION_PLAYS
from lab.training.model import GPTConfig

__all__ = ["FaultPlan", "ResilienceConfig"]


class FaultPlan(BaseModel):
    """A fault a worker injects into itself (each fires once per run, even after a rollback replays its step).

    Attributes
    ----------
    step : int
        The step (1-based; for snapshot phases, the generation) at which it fires.
    rank : int
        The logical rank that fails.
    phase : {"step", "collective", "snapshot_copy", "snapshot_send"}
        ``"step"``: after the step completed (and its snapshot was queued); ``"collective"``: in the
        middle of the gradient all-reduce (half the buckets sent); ``"snapshot_copy"``: while generation
        ``step`` is written, between its parameter shard and its moments (``snapshot_write="copy"``: in the
        background thread's copy; ``"optimizer"``: inside the optimizer update that writes it);
        ``"snapshot_send"``: in the snapshot thread, once that generation is committed locally and before
        its transfer to the peer (generations that do not go to the peer: right after the commit).
    kind : {"sigkill", "hang", "transient", "corrupt_replica"}
        ``"sigkill"``: the process SIGKILLs itself; ``"hang"``: its training thread sleeps forever;
        ``"transient"``: it raises :class:`~lab.training.resilience.worker.TransientCollectiveError`
        and stays healthy; ``"corrupt_replica"``: it flips bytes of the peer replica it holds (and
        keeps training: combine with a kill of its predecessor).
    """

    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=0)
    rank: int = Field(ge=0)
    phase: Literal["step", "collective", "snapshot_copy", "snapshot_send"] = "step"
    kind: Literal["sigkill", "hang", "transient", "corrupt_replica"] = "sigkill"


class ResilienceConfig(BaseModel):
    """Everything a hot-swap run needs (JSON round-trips; workers receive it as JSON).

    Attributes
    ----------
    run_dir : pathlib.Path
        Disk checkpoints (``checkpoints/step_<k>/rank<r>.pt``) and logs.
    run_id : str or None
        Id in the event log (default: the run directory's name).
    events_path : pathlib.Path or None
        The event log (``lab.training.monitor``); None: no events.
    model : GPTConfig
    workers, spares : int
        Data-parallel ranks and idle spare processes.
    steps, batch_size, lr, min_lr_ratio, warmup_steps, weight_decay, betas, eps, seed
        Training (cosine schedule with linear warm-up; AdamW hyper-parameters; sequences per rank per step).
    protect : {"on", "off", "alternate"}
        Per-step in-memory snapshots on, off, or alternating in blocks of ``block_steps`` steps (on
        first): the benchmark's same-run overhead measurement.
    snapshot_write : {"auto", "optimizer", "copy"}
        How a generation reaches its host buffer. ``"optimizer"``: the AdamW update writes the new parameter
        shard and moments straight into the generation's buffer (out of place, from the previous generation's
        buffer, which holds the live moments), so no copy is made; only the checksum and the replica transfer
        are left to the snapshot thread. ``"copy"``: the update runs in place on the live state and the snapshot
        thread copies it (needed where the state lives on a GPU: the device-to-host copy). ``"auto"``:
        ``"optimizer"`` on the CPU, ``"copy"`` on CUDA.
    replica_interval : int
        Replicate every this many generations to the peer (``k``): generation ``g`` goes to the peer when
        ``g % k == 0``, and so does each epoch's first generation (the start, a restore). Every generation
        still goes into the local ping-pong buffers. A lost rank's newest replica ``R`` is then up to
        ``k + 1`` steps behind the survivors; its replica holder keeps every one of those steps' averaged
        gradient shards (views into a ring of ``k + 2`` flat gradient buffers: ``(k + 2) x 4`` bytes per
        parameter) and the spare replays the AdamW updates ``R + 1 .. g`` on the replica: the same bits,
        0 completed steps lost. Replay needs steps that draw no random numbers, so a model with dropout
        replicates every generation (:attr:`effective_replica_interval`). ``1``: PHOENIX's every-step
        replication.
    disk_interval : int
        Synchronous disk checkpoint every this many steps (0: never): the fallback when a replica is
        corrupt or missing.
    timeout_s : float
        Collective timeout: a rank silent for longer is declared hung.
    grace_s : float
        How long the coordinator waits, after the first failure report, for the remaining ranks' reports.
    store_timeout_s : float
    grad_buckets : int
        Pieces of the gradient all-reduce (a ``"collective"`` fault fires halfway).
    faults : list of FaultPlan
    step_delay_s : float
        Sleep after each step (demos: slows a tiny run down enough to watch it).
    replenish : bool
        Start a new idle spare each time one takes a rank (a cluster's spare pool; the benchmark's
        repeated kills in one run). Off by default: ``spares`` is then the hard limit.
    """

    model_config = ConfigDict(extra="forbid")

    run_dir: Path
    run_id: str | None = None
    events_path: Path | None = None
    model: GPTConfig = Field(default_factory=lambda: GPTConfig(block_size=32, n_layer=2, n_head=2, d_model=32))
    val_plays: list[str] = Field(default_factory=lambda: list(VALIDATION_PLAYS))
    workers: int = Field(default=4, ge=2)
    spares: int = Field(default=1, ge=0)
    steps: int = Field(default=20, ge=1)
    batch_size: int = Field(default=4, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=5, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    seed: int = Field(default=0, ge=0)
    protect: Literal["on", "off", "alternate"] = "on"
    block_steps: int = Field(default=10, ge=1)
    snapshot_write: Literal["auto", "optimizer", "copy"] = "auto"
    replica_interval: int = Field(default=4, ge=1)
    disk_interval: int = Field(default=0, ge=0)
    timeout_s: float = Field(default=10.0, gt=0)
    grace_s: float = Field(default=3.0, gt=0)
    store_timeout_s: float = Field(default=120.0, gt=0)
    grad_buckets: int = Field(default=4, ge=1)
    faults: list[FaultPlan] = Field(default_factory=list)
    step_delay_s: float = Field(default=0.0, ge=0)
    replenish: bool = False

    @model_validator(mode="after")
    def _faults_in_range(self) -> ResilienceConfig:
        for i, f in enumerate(self.faults):
            if f.rank >= self.workers:
                raise ValueError(f"faults[{i}].rank {f.rank} is not a rank of {self.workers} workers")
            if f.step > self.steps:
                raise ValueError(f"faults[{i}].step {f.step} is past the run's {self.steps} steps")
        return self

    @property
    def resolved_run_id(self) -> str:
        return self.run_id or Path(self.run_dir).name

    @property
    def effective_replica_interval(self) -> int:
        """:attr:`replica_interval`, or 1 when the model draws random numbers every step (dropout), where a
        replay could not know the lost rank's RNG state."""
        return 1 if self.model.dropout > 0 else self.replica_interval

    def replicated(self, generation: int, start: int) -> bool:
        """Whether ``generation`` goes to the peer, in an epoch that started from generation ``start``."""
        return generation == start or generation % self.effective_replica_interval == 0

    def protected(self, step: int) -> bool:
        """Whether step ``step`` (1-based) takes a snapshot."""
        if self.protect == "alternate":
            return ((step - 1) // self.block_steps) % 2 == 0
        return self.protect == "on"
