"""Hooks that wrap a hook: error feedback (:func:`error_feedback_wrapper`) and error measurement
(:func:`measure_error_wrapper`) around the Euclidean codec hook, in the manner of torch's
``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_wrapper``: a wrapper takes a hook
and returns a hook with the same signature, ``hook(state, bucket) -> Future[Tensor]``; its state
(:class:`ErrorFeedbackState`, :class:`MeasureErrorState`) wraps the inner hook's state and reads every
attribute it does not have from it (``history``, ``step``, ``summary()``, ...).

>>> state, hook = CodecHookState("fp8_e4m3"), codec_hook                            # doctest: +SKIP
>>> state, hook = ErrorFeedbackState(state), error_feedback_wrapper(hook)           # doctest: +SKIP
>>> state, hook = MeasureErrorState(state), measure_error_wrapper(hook)             # doctest: +SKIP
>>> ddp.register_comm_hook(state, hook)                                             # doctest: +SKIP

:func:`~lab.training.comm.hooks.get_hook` builds these for ``"fp8_ef"``, ``error_feedback=True`` and
``measure_error=True`` on the Euclidean hooks. How a wrapper sees what was sent: the innermost
:class:`~lab.training.comm.hooks.codec.CodecHookState` calls every *tap* registered for the duration of
one hook call with each parameter's :class:`Encoded` payload (the decode is done once, on demand, and
shared by the taps), so a wrapper costs what the flags it replaces cost, and gives the same bits.

GIFT keeps its error feedback inside the hook: its residuals live in the whitened coordinates, are
rebased when the factors change and are moved between the Euclidean and the whitened path when the layer
selection changes (:class:`~lab.training.comm.hooks.gift.GiftHookState`), so they are a part of the
transform, not a layer around it; the wrappers refuse a GIFT state (:class:`HookError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import torch
import torch.distributed as dist

from lab.training.comm.hooks.base import ErrorFeedback, StepRecord, _cpu, bucket_layout
from lab.training.comm.hooks.codec import CodecHookState, Encoded
from lab.training.errors import HookError

__all__ = ["Encoded", "ErrorFeedbackState", "MeasureErrorState", "WrappedHookState", "error_feedback_wrapper",
           "measure_error_wrapper"]


#: ``tap(record, encoded)``, called by the codec hook for each Euclidean parameter it encodes.
Tap = Callable[[StepRecord, Encoded], None]


class WrappedHookState:
    """A hook state around another (``inner``): attributes it lacks are read from ``inner``.

    :meth:`state_dict` is the inner state's with this wrapper's own entries added (:meth:`_own_state`,
    under their own keys), so a checkpoint holds the whole chain.

    Parameters
    ----------
    inner : CodecHookState or WrappedHookState
        The wrapped state; its innermost state must be a Euclidean :class:`CodecHookState`.

    Raises
    ------
    HookError
        The innermost state is not a :class:`CodecHookState`, or is a GIFT state (its error feedback
        and measurement are part of its transform).
    """

    def __init__(self, inner):
        codec_state = inner.codec_state if isinstance(inner, WrappedHookState) else inner
        if not isinstance(codec_state, CodecHookState):
            raise HookError(f"{type(self).__name__} wraps a codec hook's state (CodecHookState), got {type(codec_state).__name__}")
        if hasattr(codec_state, "gift_error_feedback"):  # GiftHookState (no import: gift.py imports this package)
            raise HookError(f"{type(self).__name__} cannot wrap GIFT: GIFT's error feedback (error_feedback=, "
                            "euclidean_error_feedback=) and measure_error= are settings of GiftHookState")
        self.inner = inner
        #: the innermost :class:`CodecHookState` (where taps are registered)
        self.codec_state: CodecHookState = codec_state

    def __getattr__(self, name: str):
        if name in ("inner", "codec_state"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _own_state(self) -> dict:
        return {}

    def _load_own(self, state: Mapping) -> None:
        pass

    def state_dict(self) -> dict:
        d = self.inner.state_dict()
        d.update(self._own_state())
        return d

    def load_state_dict(self, state: Mapping) -> None:
        self.inner.load_state_dict(state)
        self._load_own(state)


def _call_with_tap(state: WrappedHookState, hook: Callable, bucket, tap: Tap) -> torch.futures.Future:
    taps = state.codec_state._taps
    taps.append(tap)
    try:
        return hook(state.inner, bucket)
    finally:
        taps.remove(tap)


def _annotate(fn: Callable) -> Callable:
    # DDP.register_comm_hook checks the annotations by identity
    fn.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
    return fn


# -- error feedback ----------------------------------------------------------------------------------


class ErrorFeedbackState(WrappedHookState):
    """State of :func:`error_feedback_wrapper`: the per-parameter residuals (local to the rank).

    Attributes
    ----------
    error_feedback : ErrorFeedback
        Residuals keyed by parameter name, float32 flat (``state_dict`` key ``"error_feedback"``, the key
        the former ``CodecHookState(error_feedback=True)`` used, so its checkpoints load).
    """

    def __init__(self, inner):
        super().__init__(inner)
        self.error_feedback = ErrorFeedback()

    def _own_state(self) -> dict:
        return {"error_feedback": _cpu(self.error_feedback.residuals)}

    def _load_own(self, state: Mapping) -> None:
        self.error_feedback.residuals = dict(state.get("error_feedback") or {})


def error_feedback_wrapper(hook: Callable) -> Callable:
    """Error feedback around a codec hook (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD).

    Per parameter ``p`` of the bucket: ``x = g + r`` (written into the bucket's buffer, which the inner
    hook then encodes), the inner hook sends ``q = Q(x)``, and ``r <- x - q`` (from the inner hook's own
    payload, :class:`Encoded`). So ``sum_t q_t = sum_t g_t - r_T`` up to float32 rounding of the
    additions; the result is bit-identical to encoding ``g + r`` directly.

    Parameters
    ----------
    hook : callable
        ``hook(state, bucket)`` of a Euclidean :class:`CodecHookState` (:func:`codec_hook`, or another
        wrapper of it).

    Returns
    -------
    callable
        ``hook(state: ErrorFeedbackState, bucket) -> Future[Tensor]``.

    Raises
    ------
    HookError
        (when called) the state is not an :class:`ErrorFeedbackState`, or the bucket's buffer is not
        float32 (the compensated gradient is written into it and must not be rounded).
    """

    def error_feedback_hook(state: ErrorFeedbackState, bucket) -> torch.futures.Future:
        if not isinstance(state, ErrorFeedbackState):
            raise HookError(f"error_feedback_wrapper's hook needs an ErrorFeedbackState, got {type(state).__name__}")
        buf = bucket.buffer()
        if buf.dtype != torch.float32:
            raise HookError(f"error feedback needs a float32 bucket (the residual is added into it), got {buf.dtype}")
        ef = state.error_feedback
        for p, off, n, _shape in bucket_layout(bucket):
            name = state.codec_state.param_name(p)
            r = ef.residuals.get(name)
            if r is not None:  # x = g + r in place (the same float32 sum as ErrorFeedback.compensate)
                buf[off : off + n].add_(r.to(buf.device).view(-1))

        def tap(rec: StepRecord, enc: Encoded) -> None:
            ef.update(enc.name, enc.x, enc.sent)

        return _call_with_tap(state, hook, bucket, tap)

    error_feedback_hook.__name__ = error_feedback_hook.__qualname__ = f"error_feedback_{getattr(hook, '__name__', 'hook')}"
    return _annotate(error_feedback_hook)


# -- error measurement -------------------------------------------------------------------------------


class MeasureErrorState(WrappedHookState):
    """State of :func:`measure_error_wrapper` (no state of its own: the errors go into the step records).

    Attributes
    ----------
    measure_error : bool
        True (what the former ``measure_error=True`` flag reported).
    """

    measure_error = True


def measure_error_wrapper(hook: Callable) -> Callable:
    """Relative-error measurement around a codec hook (paper Eq. 21's one-step round trip, GIFT arXiv 2607.07494).

    Before the inner hook runs, the bucket's gradients ``g`` are copied (float32); for each parameter the
    inner hook encodes, the step's :class:`StepRecord` gets ``err_sq += ||decode(encode(g)) - g||^2``
    (one step, no error feedback), ``sent_err_sq += ||q - g||^2`` (``q`` what was sent, error feedback
    included), ``euclid_err_sq`` (= the one-step error: this is the Euclidean hook), ``ref_sq += ||g||^2``,
    and ``per_param[name]``. Without error feedback inside (``x == g`` bit for bit), the one-step
    round trip is the payload itself and is not encoded again.

    Wrap it outside :func:`error_feedback_wrapper` (``measure(ef(codec))``) to measure against the
    uncompensated gradient.

    Parameters
    ----------
    hook : callable
        A codec hook or a wrapper of one.

    Returns
    -------
    callable
        ``hook(state: MeasureErrorState, bucket) -> Future[Tensor]``.

    Raises
    ------
    HookError
        (when called) the state is not a :class:`MeasureErrorState`.
    """

    def measure_error_hook(state: MeasureErrorState, bucket) -> torch.futures.Future:
        if not isinstance(state, MeasureErrorState):
            raise HookError(f"measure_error_wrapper's hook needs a MeasureErrorState, got {type(state).__name__}")
        inner = state.codec_state
        buf = bucket.buffer()
        where = {inner.param_name(p): (off, n) for p, off, n, _ in bucket_layout(bucket)}
        # a copy only when a wrapper inside changes the buffer (error feedback); else the buffer is g itself
        link, mutated = state.inner, False
        while isinstance(link, WrappedHookState):
            mutated, link = mutated or isinstance(link, ErrorFeedbackState), link.inner
        original = buf.to(torch.float32, copy=True) if mutated else buf.to(torch.float32)

        def tap(rec: StepRecord, enc: Encoded) -> None:
            off, n = where[enc.name]
            g = original[off : off + n]
            one = enc.sent if torch.equal(enc.x, g) else enc.codec.decode(enc.codec.encode(g, name=enc.name), n)
            inner._record(rec, enc.name, g, one, enc.sent, one, "euclid")

        return _call_with_tap(state, hook, bucket, tap)

    measure_error_hook.__name__ = measure_error_hook.__qualname__ = f"measure_error_{getattr(hook, '__name__', 'hook')}"
    return _annotate(measure_error_hook)
