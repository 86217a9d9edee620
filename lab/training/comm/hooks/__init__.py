"""DDP communication hooks: fp32 all-reduce, Euclidean FP8 / NVFP4 (with or without error feedback), GIFT.

Each hook follows torch's convention (``torch.distributed.algorithms.ddp_comm_hooks``): a plain function
``hook(state, bucket) -> torch.futures.Future[Tensor]`` registered with
``ddp.register_comm_hook(state, hook)``; the future's value is the averaged flat bucket (same numel and
dtype as ``bucket.buffer()``), which DDP copies into the parameters' ``.grad``. torch's own PowerSGD hook
deadlocks on gloo with more than one bucket and ``bf16_compress_hook`` refuses CPU, so these are our own.

>>> state, hook = get_hook("gift_fp8", model=model, fmt="e4m3")   # doctest: +SKIP
>>> ddp.register_comm_hook(state, hook)                            # doctest: +SKIP

Hooks (:data:`HOOKS`, :func:`get_hook`)
--------------------------------------
``"fp32"``
    ``buffer / world`` then one ``all_reduce`` (SUM), exactly what DDP does without a hook (the result
    is bit-identical to DDP's default).
``"fp8"``, ``"fp8_ef"``, ``"nvfp4"``
    Euclidean low precision (:mod:`lab.training.comm.codecs`; ``fmt="e4m3"`` default or ``"e5m2"``,
    ``block_size`` for per-block FP8 scales): every parameter's gradient in the bucket is encoded
    separately (one scale per parameter tensor, the paper's "layer-wise" Euclidean baseline), the
    per-parameter payloads are concatenated into one flat ``uint8`` tensor per rank and exchanged with
    ``all_gather_single`` (formerly ``all_gather_into_tensor``; gloo cannot reduce FP8, and FP8 travels
    as ``uint8``); every rank decodes all ranks' payloads, sums them in rank order 0..W-1 in float32 and
    divides by W, so all replicas get bit-identical gradients. ``"fp8_ef"`` adds error feedback
    (Seide et al. 2014; Karimireddy et al. 2019): ``x = g + r; send Q(x); r <- x - Q(x)``, per
    parameter, local to the rank, as a hook wrapping the codec hook (:func:`error_feedback_wrapper`, like
    torch's ``fp16_compress_wrapper``). ``"nvfp4"`` and ``"bf16"`` take ``error_feedback=True`` too.
``"gift_fp8"``, ``"gift_nvfp4"``
    GIFT (:mod:`lab.training.comm.gift`; arXiv 2607.07494, Algorithm 1): the selected ``nn.Linear``
    weights are sent as ``Q(B^{-1/2} G A^{-1/2} + R)`` (the two-sided form, Eq. 14-17, ``output_side=True``;
    the paper's input-side form Eq. 18-20, ``Q(G A^{-1/2} + R)``, with ``output_side=False``) with error
    feedback ``R`` in the whitened coordinates and mapped back after the average; selected embeddings
    the same way with the covariance of their output gradient (an extension, ``embeddings=True``); a
    selected layer's bias is whitened with its weight as ``[G | b]`` (an extension, ``bias=True``);
    other parameters (LayerNorm) take the Euclidean path (no error feedback unless
    ``euclidean_error_feedback=True``, like the paper). See :class:`GiftHookState`.

Accounting (per rank, per step; :class:`StepRecord`)
----------------------------------------------------
A step is one synchronised backward: the hook calls from ``bucket.index() == 0`` to
``bucket.is_last()``. ``payload_bytes`` is what this rank contributes to the gradient collectives:
``4 * numel`` (fp32 buffer; ``element_size * numel`` in general) for ``"fp32"`` and
``sum_p codec.nbytes(p.numel())`` over the bucket's parameters for the codec hooks (the whitening does
not change the size). ``extra_bytes`` counts the input size of every side collective (GIFT's covariance
all-reduce, or the header with ``statistics="rank0"``, and factor broadcast on refresh steps, the
selection statistics on selection steps).
``wire_bytes`` estimates what the rank sends over the network with ring algorithms:
``(W - 1) * payload`` for ``all_gather``, ``2 (W - 1) / W * payload`` for ``all_reduce`` (side
collectives not included). With ``measure_error=True`` each record also holds the codec's relative error
against the fp32 gradient, computed locally before the collective: the one-step round trip without error
feedback (``||decode(encode(T g)) T^-1 - g|| / ||g||``, paper Eq. 21), what was actually sent (including
error feedback), and Euclidean FP8's one-step error on the same gradients, for the whole step and per
parameter.

Ordering and determinism
------------------------
All collectives (including GIFT's side collectives, issued at the start of a step and, for factors of
output gradients, before a bucket is encoded) are issued from the hook body, which DDP calls in bucket
order on every rank; the future callbacks only decode, so the collective order cannot diverge across
gloo's threads (the cause of PowerSGD's deadlock). Replicas stay
bit-identical provided every rank runs the same kernels (same torch build, device type and thread
count), the assumption under which the post-collective map back ``A^{1/2}`` gives the same bits.

Errors: :class:`~lab.training.errors.HookError` (and :class:`~lab.training.errors.GiftError`); codec
errors (:class:`~lab.training.errors.NonFiniteError` for NaN/inf gradients with ``nonfinite="raise"``)
propagate from the hook.

Modules: :mod:`~lab.training.comm.hooks.base` (accounting, :class:`CommHookState`, the fp32 hook),
:mod:`~lab.training.comm.hooks.codec` (Euclidean codecs), :mod:`~lab.training.comm.hooks.wrappers` (error
feedback and error measurement wrapping a codec hook), :mod:`~lab.training.comm.hooks.gift` (GIFT);
everything public is importable from this package.
"""

from __future__ import annotations

from collections.abc import Callable

from lab.training.comm.hooks.base import CommHookState, ErrorFeedback, StepRecord, Transform, bucket_layout, fp32_hook
from lab.training.comm.hooks.codec import CodecHookState, codec_hook
from lab.training.comm.hooks.gift import GiftHookState, gift_hook
from lab.training.comm.hooks.wrappers import (
    ErrorFeedbackState,
    MeasureErrorState,
    WrappedHookState,
    error_feedback_wrapper,
    measure_error_wrapper,
)
from lab.training.errors import GiftError, HookError

__all__ = [
    "HOOKS",
    "CodecHookState",
    "CommHookState",
    "ErrorFeedback",
    "ErrorFeedbackState",
    "GiftHookState",
    "MeasureErrorState",
    "StepRecord",
    "Transform",
    "WrappedHookState",
    "bucket_layout",
    "codec_hook",
    "error_feedback_wrapper",
    "fp32_hook",
    "get_hook",
    "gift_hook",
    "measure_error_wrapper",
]

#: Names :func:`get_hook` knows.
HOOKS = ("fp32", "bf16", "fp8", "fp8_ef", "nvfp4", "gift_fp8", "gift_nvfp4")


# -- registry --------------------------------------------------------------------------------------


def _fp8_name(fmt: str, block_size: int | None) -> str:
    return f"fp8_{fmt}" + (f"_b{block_size}" if block_size is not None else "")


def get_hook(name: str, **kw) -> tuple[CommHookState, Callable]:
    """A fresh ``(state, hook)`` pair for ``ddp.register_comm_hook(state, hook)``.

    Parameters
    ----------
    name : str
        One of :data:`HOOKS`: ``"fp32"``, ``"bf16"``, ``"fp8"``, ``"fp8_ef"``, ``"nvfp4"``, ``"gift_fp8"``, ``"gift_nvfp4"``.
    **kw
        ``fmt`` (``"e4m3"`` default, ``"e5m2"``) and ``block_size`` for the FP8 hooks; ``error_feedback``
        for ``"nvfp4"`` and ``"bf16"`` (``"fp8_ef"`` is ``"fp8"`` with it); ``model`` (required) and the
        other :class:`GiftHookState` parameters for GIFT; ``process_group``, ``model``, ``measure_error``,
        ``history``, ``nonfinite`` for all codec hooks (``"fp32"`` takes ``process_group``, ``model``,
        ``history``). On the Euclidean hooks ``error_feedback`` and ``measure_error`` wrap the codec hook
        (:func:`error_feedback_wrapper`, then :func:`measure_error_wrapper` outside it; the state is an
        :class:`ErrorFeedbackState` / :class:`MeasureErrorState` around the :class:`CodecHookState`); GIFT
        keeps both inside its state (see :mod:`lab.training.comm.hooks.wrappers`).

    Raises
    ------
    HookError
        Unknown name or keyword (``GiftError`` for GIFT parameters, e.g. a missing ``model``).
    """
    try:
        if name == "fp32":
            return CommHookState(**kw), fp32_hook
        if name in ("fp8", "fp8_ef", "nvfp4", "bf16"):
            if name in ("fp8", "fp8_ef"):
                codec = _fp8_name(kw.pop("fmt", "e4m3"), kw.pop("block_size", None))
            else:
                codec = name
            ef = name == "fp8_ef" or (name in ("nvfp4", "bf16") and bool(kw.pop("error_feedback", False)))
            measure = kw.pop("measure_error", False)
            state, hook = CodecHookState(codec, **kw), codec_hook
            if ef:
                state, hook = ErrorFeedbackState(state), error_feedback_wrapper(hook)
            if measure:  # outside the error feedback: measured against the uncompensated gradient
                state, hook = MeasureErrorState(state), measure_error_wrapper(hook)
            return state, hook
        if name in ("gift_fp8", "gift_nvfp4"):
            if "model" not in kw:
                raise GiftError(f"{name} needs model=... (the module whose nn.Linear layers GIFT whitens)")
            model = kw.pop("model")
            codec = _fp8_name(kw.pop("fmt", "e4m3"), kw.pop("block_size", None)) if name == "gift_fp8" else "nvfp4"
            return GiftHookState(model, codec, **kw), gift_hook
    except TypeError as exc:  # unknown keyword
        raise HookError(f"{name}: {exc}") from None
    raise HookError(f"unknown hook {name!r}; known: {', '.join(HOOKS)}")
