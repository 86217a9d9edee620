"""Training facet: low-precision and sparse gradient communication (GIFT, SCAPE), optimizers and monitoring.

Submodules
----------
comm
    Gradient codecs (:mod:`lab.training.comm.codecs`: FP8 E4M3/E5M2, NVFP4, fp32 baseline), the GIFT
    transform (:mod:`lab.training.comm.gift`) and DDP communication hooks (:mod:`lab.training.comm.hooks`).
optim
    AdamS and SCAPE (:mod:`lab.training.optim`: sparse, mask-synchronised AdamS communication).
data
    The workload's text (:mod:`lab.training.data`: Shakespeare's plays through ``lab.data``, a character
    tokenizer, a split by play, a deterministic per-rank batch sampler).
model
    A small GPT (:mod:`lab.training.model`: pre-LN decoder, ``nn.Linear`` layers by name).
run
    A training run (:mod:`lab.training.run`: ``TrainConfig``, ``train`` under torchrun with DDP comm hooks or
    SCAPE, checkpoints and bit-exact resume, ``launch`` in the background).
monitor
    Metric events (:mod:`lab.training.monitor`: ``RunRecorder`` writes the event log and TensorBoard,
    ``RunMonitor`` reads runs, metrics, per-rank status and incremental updates).
perfmodel
    Performance model of distributed training (:mod:`lab.training.perfmodel`: operator decomposition,
    profiled regressors per operator, measured collectives, pipeline composition, in-situ calibration,
    hardware files, the roofline baseline).
errors
    :class:`~lab.training.errors.TrainingError` and its subclasses.
"""

from lab.training.errors import (
    CheckpointError,
    CodecError,
    GiftError,
    HardwareFileError,
    HookError,
    NonFiniteError,
    RunConfigError,
    RunInterrupted,
    TrainingError,
)

__all__ = ["CheckpointError", "CodecError", "GiftError", "HardwareFileError", "HookError", "NonFiniteError", "RunConfigError",
           "RunInterrupted", "TrainingError"]
