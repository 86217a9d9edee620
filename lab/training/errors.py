"""Errors of the training facet (``lab.training``): one hierarchy under :class:`lab.LabError`."""

from __future__ import annotations

from lab import LabError

__all__ = ["TrainingError", "CodecError", "NonFiniteError", "HookError", "GiftError",
           "RunConfigError", "CheckpointError", "RunInterrupted",
           "ModelConfigError", "DataConfigError", "OptimizerConfigError", "ScapeError", "HardwareFileError",
           "ExplorerError", "NetnsError"]


class TrainingError(LabError):
    """Base class of every error ``lab.training`` raises on purpose."""


class CodecError(TrainingError, ValueError):
    """A gradient codec was misused: unknown codec name, bad parameter, wrong input dtype, or a payload
    whose dtype, shape or size does not match what the codec produces for that many elements."""


class NonFiniteError(CodecError):
    """A tensor to encode holds NaN or +-inf (raised by codecs built with ``nonfinite="raise"``, the default).

    Attributes
    ----------
    tensor_name : str or None
        The name the caller passed to ``encode(..., name=...)`` (e.g. a parameter's name).
    codec : str
        The codec's name (``"fp8_e4m3"``, ...).
    n_nan, n_inf : int
        How many elements are NaN and how many are +-inf.
    """

    def __init__(self, codec: str, tensor_name: str | None, n_nan: int, n_inf: int):
        self.codec, self.tensor_name, self.n_nan, self.n_inf = codec, tensor_name, n_nan, n_inf
        what = repr(tensor_name) if tensor_name is not None else "<unnamed tensor>"
        super().__init__(f"{codec}: {what} has non-finite values ({n_nan} NaN, {n_inf} inf); "
                         "build the codec with nonfinite='propagate' to send them as NaN instead")


class HookError(TrainingError, ValueError):
    """A DDP communication hook (:mod:`lab.training.comm.hooks`) was misconfigured or misused: unknown hook
    name or keyword, a bucket whose gradients are not views of its buffer, a collective whose result has
    the wrong size, or ranks that disagree about the payload layout."""


class GiftError(HookError):
    """The GIFT transform (:mod:`lab.training.comm.gift`) was given a bad covariance (not square, not
    finite), a bad parameter (rank, damping, EMA, refresh period, selection rule), a model without the
    named ``nn.Linear`` layers asked for, or a gradient whose shape does not match its whitening."""


class RunConfigError(TrainingError, ValueError):
    """A training run (:mod:`lab.training.run`) cannot start as configured: a bad or unreadable config
    file, an optimizer keyword that belongs elsewhere, a comm method that is not one of
    :data:`lab.training.comm.hooks.HOOKS` or whose ``comm_kwargs`` the hook refuses, a world size or device that does not fit."""


class CheckpointError(TrainingError):
    """A checkpoint cannot be written or resumed from: another world size, model shape or optimizer,
    or a missing or unreadable rank file."""


class RunInterrupted(TrainingError):
    """A training process was told to stop by a signal (SIGTERM or SIGINT, e.g. from ``torchrun`` after
    another rank failed); ``signal`` is the signal number. The run records a ``failed`` status first."""

    def __init__(self, signum: int):
        import signal as _signal

        self.signal = signum
        super().__init__(f"interrupted by {_signal.Signals(signum).name}")


class HardwareFileError(TrainingError, ValueError):
    """A hardware description file (:mod:`lab.training.perfmodel.hardware`) cannot be used: unreadable,
    not valid TOML, or a field that is missing, negative, of the wrong type or unknown.

    Attributes
    ----------
    path : str
        The file.
    field : str or None
        The offending field as a dotted path (``"peak_flops.bf16.value"``); None for a whole-file error.
    """

    def __init__(self, path: str, field: str | None, message: str):
        self.path, self.field = str(path), field
        where = f"{self.path}: field {field!r}" if field is not None else self.path
        super().__init__(f"{where}: {message}")


class ExplorerError(TrainingError, ValueError):
    """The performance-model explorer (:mod:`lab.training.perfmodel.explore`) was asked for a value its controls
    do not offer (a field outside its slider's range or not among its dropdown's choices, an unknown hardware
    file, tier or schedule); the message names the field and what it takes."""


class ModelConfigError(TrainingError, ValueError):
    """A model configuration is inconsistent (e.g. ``d_model`` not divisible by ``n_head``, no vocabulary size)."""


class DataConfigError(TrainingError, ValueError):
    """The data cannot be prepared as asked (unknown play names, an empty split, a stream shorter
    than one window, a negative seed or step)."""


class OptimizerConfigError(TrainingError, ValueError):
    """A hyper-parameter of an optimizer in :mod:`lab.training.optim` is invalid.

    Also a :class:`ValueError`, so ``except ValueError`` keeps working.

    Attributes
    ----------
    param : str
        The hyper-parameter's name (``"lr"``, ``"betas[0]"``, ``"sparsity"``, ...).
    value : object
        The rejected value.
    """

    def __init__(self, owner: str, param: str, value: object, requirement: str):
        self.param, self.value = param, value
        super().__init__(f"{owner}: {param} must be {requirement}, got {value!r}")


class ScapeError(TrainingError):
    """SCAPE (:mod:`lab.training.optim.scape`) cannot run as asked (unsupported parameters or gradients,
    an incompatible checkpoint)."""


class NetnsError(TrainingError):
    """A shaped network of namespaces (:mod:`lab.training.netns`) cannot be built or used: not root, no
    ``ip``/``tc``, a refused ``ip``/``tc`` step (the command and its message), a bad parameter (named), or a
    host index that does not exist."""
