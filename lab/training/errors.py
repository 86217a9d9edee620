"""Errors of the training facet (``lab.training``): one hierarchy under :class:`lab.LabError`."""

from __future__ import annotations

from lab import LabError

__all__ = ["TrainingError", "CodecError", "NonFiniteError"]


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
