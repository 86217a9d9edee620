"""Gradient communication: codecs, the GIFT transform and DDP communication hooks.

Modules
-------
codecs
    :mod:`lab.training.comm.codecs`: gradients to the uint8 bytes a collective moves (fp32, FP8 E4M3/E5M2
    per tensor or per block, NVFP4), with exact sizes; formats, byte layouts and the non-finite policy.
gift
    :mod:`lab.training.comm.gift`: GIFT (arXiv 2607.07494): :class:`Whitening` (low-rank + scalar-residual
    powers ``A^{-1/2}`` / ``A^{1/2}`` of a damped covariance), :class:`KroneckerWhitening` (both factors,
    ``B^{-1/2} G A^{-1/2}``), :class:`CovarianceTracker`, :class:`LayerSelector` (the paper's saturation
    score, or error / gain), :class:`RefreshSchedule` and :class:`CovarianceEMA` (when and how factors
    are refreshed, shared by the hook and ``benchmarks.comm``), :class:`GiftConfig` (the hook's settings).
hooks
    :mod:`lab.training.comm.hooks`: DDP hooks ``(state, bucket) -> Future`` and :func:`get_hook` for
    ``"fp32"``, ``"bf16"``, ``"fp8"``, ``"fp8_ef"``, ``"nvfp4"``, ``"gift_fp8"``, ``"gift_nvfp4"``, with per-rank
    byte and error accounting (:class:`StepRecord`).
"""

from lab.training.comm.codecs import CODECS, BF16Codec, Codec, Float32Codec, FP8Codec, NVFP4Codec, get_codec
from lab.training.comm.gift import (
    CovarianceEMA,
    CovarianceTracker,
    GiftConfig,
    KroneckerWhitening,
    LayerSelector,
    RefreshSchedule,
    Whitening,
)
from lab.training.comm.hooks import (
    HOOKS,
    CodecHookState,
    CommHookState,
    ErrorFeedback,
    ErrorFeedbackState,
    GiftHookState,
    MeasureErrorState,
    StepRecord,
    codec_hook,
    error_feedback_wrapper,
    fp32_hook,
    get_hook,
    gift_hook,
    measure_error_wrapper,
)

__all__ = [
    "CODECS", "BF16Codec", "Codec", "Float32Codec", "FP8Codec", "NVFP4Codec", "get_codec",
    "CovarianceEMA", "CovarianceTracker", "GiftConfig", "KroneckerWhitening", "LayerSelector", "RefreshSchedule",
    "Whitening",
    "HOOKS", "CodecHookState", "CommHookState", "ErrorFeedback", "ErrorFeedbackState", "GiftHookState",
    "MeasureErrorState", "StepRecord", "codec_hook", "error_feedback_wrapper", "fp32_hook", "get_hook", "gift_hook",
    "measure_error_wrapper",
]
