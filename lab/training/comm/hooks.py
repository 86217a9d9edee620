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
    parameter, local to the rank. ``"nvfp4"`` takes ``error_feedback=True`` too.
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
"""

from __future__ import annotations

import math
import re
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lab.training.comm.codecs import Codec, Float32Codec, get_codec
from lab.training.comm.gift import (
    CovarianceEMA,
    CovarianceTracker,
    GiftConfig,
    KroneckerWhitening,
    LayerSelector,
    RefreshSchedule,
    Whitening,
    saturation_rates,
)
from lab.training.errors import GiftError, HookError

#: What a GIFT segment undoes after the average: one (right-hand) factor or both Kronecker factors.
Transform = Whitening | KroneckerWhitening

__all__ = [
    "HOOKS",
    "CodecHookState",
    "CommHookState",
    "ErrorFeedback",
    "GiftHookState",
    "StepRecord",
    "bucket_layout",
    "codec_hook",
    "fp32_hook",
    "get_hook",
    "gift_hook",
]

#: Names :func:`get_hook` knows.
HOOKS = ("fp32", "bf16", "fp8", "fp8_ef", "nvfp4", "gift_fp8", "gift_nvfp4")


# -- accounting ------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one rank sent, and how wrong it was, in one step (all buckets of one backward).

    Attributes
    ----------
    step : int
        0-based index of the synchronised backward.
    payload_bytes : int
        Bytes this rank contributed to the gradient collectives (``sum codec.nbytes``; ``4 numel`` for fp32).
    extra_bytes : int
        Bytes of side collectives (GIFT covariance all-reduce, factor broadcast, selection statistics).
    wire_bytes : int
        Ring-algorithm estimate of the bytes this rank sent for the gradient collectives.
    fp32_bytes : int
        ``4 * numel``: what an fp32 all-reduce contribution would be.
    numel, buckets : int
        Gradient elements and buckets communicated.
    err_sq, sent_err_sq, euclid_err_sq, ref_sq : float
        Squared L2 norms summed over the step (only with ``measure_error``): one-step round-trip error
        (no error feedback), error of what was sent (with error feedback), Euclidean codec's one-step
        error on the same gradients, and the fp32 gradient itself.
    per_param : dict[str, dict[str, float]]
        With ``measure_error``: parameter name -> ``{"rel_error", "sent_rel_error", "euclid_rel_error", "path"}``.
    """

    step: int
    payload_bytes: int = 0
    extra_bytes: int = 0
    wire_bytes: int = 0
    fp32_bytes: int = 0
    numel: int = 0
    buckets: int = 0
    err_sq: float = 0.0
    sent_err_sq: float = 0.0
    euclid_err_sq: float = 0.0
    ref_sq: float = 0.0
    per_param: dict[str, dict] = field(default_factory=dict)

    @property
    def bytes_sent(self) -> int:
        """``payload_bytes + extra_bytes``."""
        return self.payload_bytes + self.extra_bytes

    @property
    def compression(self) -> float:
        """``fp32_bytes / bytes_sent`` (inf when nothing was sent)."""
        return self.fp32_bytes / self.bytes_sent if self.bytes_sent else math.inf

    def _ratio(self, num: float) -> float | None:
        if self.ref_sq == 0.0:
            return None if num == 0.0 else math.inf
        return math.sqrt(num / self.ref_sq)

    @property
    def rel_error(self) -> float | None:
        """Whole-step one-step relative error ``sqrt(err_sq / ref_sq)`` (None when not measured)."""
        return self._ratio(self.err_sq)

    @property
    def sent_rel_error(self) -> float | None:
        """Whole-step relative error of what was sent (error feedback included)."""
        return self._ratio(self.sent_err_sq)

    @property
    def euclid_rel_error(self) -> float | None:
        """Whole-step one-step error the Euclidean codec would have had on the same gradients."""
        return self._ratio(self.euclid_err_sq)

    def as_dict(self) -> dict:
        """Plain-Python dict (for event logs and widgets)."""
        return {
            "step": self.step, "payload_bytes": self.payload_bytes, "extra_bytes": self.extra_bytes,
            "bytes_sent": self.bytes_sent, "wire_bytes": self.wire_bytes, "fp32_bytes": self.fp32_bytes,
            "numel": self.numel, "buckets": self.buckets, "rel_error": self.rel_error,
            "sent_rel_error": self.sent_rel_error, "euclid_rel_error": self.euclid_rel_error,
            "per_param": {k: dict(v) for k, v in self.per_param.items()},
        }


def _norm_sq(x: Tensor) -> float:
    x = x.reshape(-1).to(torch.float64)
    return float(torch.dot(x, x))


def _rel(err_sq: float, ref_sq: float) -> float:
    if ref_sq == 0.0:
        return 0.0 if err_sq == 0.0 else math.inf
    return math.sqrt(err_sq / ref_sq)


class ErrorFeedback:
    """Per-key error-feedback residuals (local to a rank; never communicated).

    ``x = g + r`` (:meth:`compensate`), send ``q = Q(x)``, then ``r <- x - q`` (:meth:`update`), so over
    ``T`` steps ``sum_t q_t = sum_t g_t - r_T`` exactly up to float32 rounding of the additions.
    Residuals are float32 of the compensated tensor's shape.
    """

    def __init__(self) -> None:
        self.residuals: dict[str, Tensor] = {}

    def compensate(self, key: str, x: Tensor) -> Tensor:
        """``x + r`` (a new float32 tensor; ``x`` itself when there is no residual yet)."""
        r = self.residuals.get(key)
        x = x.to(torch.float32)
        return x if r is None else x + r.to(x.device).view(x.shape)

    def update(self, key: str, x: Tensor, q: Tensor) -> None:
        """Store ``r = x - q`` (the part of ``x`` the quantized ``q`` did not carry)."""
        self.residuals[key] = (x.to(torch.float32) - q.to(torch.float32).view(x.shape)).detach()

    def pop(self, key: str) -> Tensor | None:
        """Remove and return ``key``'s residual."""
        return self.residuals.pop(key, None)

    def add(self, key: str, r: Tensor) -> None:
        """Add ``r`` to ``key``'s residual (creating it)."""
        old = self.residuals.get(key)
        self.residuals[key] = r.to(torch.float32).detach().clone() if old is None else old + r.view(old.shape)

    def __contains__(self, key: str) -> bool:
        return key in self.residuals


# -- bucket layout ---------------------------------------------------------------------------------


def bucket_layout(bucket) -> list[tuple[Tensor, int, int, torch.Size]]:
    """``(parameter, offset, numel, shape)`` of every gradient in a DDP ``GradBucket``'s flat buffer.

    Offsets come from the storage offsets of ``bucket.gradients()`` (views of ``bucket.buffer()``);
    gradients that are not views of the buffer are laid out back to back.

    Raises
    ------
    HookError
        ``parameters()`` and ``gradients()`` differ in length, or a gradient falls outside the buffer.
    """
    buf = bucket.buffer()
    params, grads = bucket.parameters(), bucket.gradients()
    if len(params) != len(grads):
        raise HookError(f"bucket {bucket.index()}: {len(params)} parameters but {len(grads)} gradients")
    base, ptr = buf.storage_offset(), buf.untyped_storage().data_ptr()
    out, pos = [], 0
    for p, g in zip(params, grads):
        n = g.numel()
        off = g.storage_offset() - base if g.untyped_storage().data_ptr() == ptr and g.is_contiguous() else pos
        if off < 0 or off + n > buf.numel():
            raise HookError(f"bucket {bucket.index()}: gradient of shape {tuple(g.shape)} at offset {off} "
                            f"falls outside the buffer of {buf.numel()} elements")
        out.append((p, off, n, p.shape))
        pos = off + n
    return out


# -- states ----------------------------------------------------------------------------------------


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class CommHookState:
    """Base state: process group, step counter and the per-step :class:`StepRecord` history.

    Parameters
    ----------
    process_group : ProcessGroup, optional
        Default: the default group. Without an initialised process group the hooks run as a world of
        one (no collectives), which is how the single-process tests drive them.
    model : nn.Module, optional
        Used to name parameters in records (``named_parameters``); DDP wrappers are unwrapped.
    measure_error : bool
        Compute the codec's relative errors locally (extra encode/decode work).
    history : int, optional
        Keep only the last ``history`` step records (default: all).
    """

    def __init__(self, process_group=None, *, model: nn.Module | None = None, measure_error: bool = False,
                 history: int | None = None):
        if history is not None and (isinstance(history, bool) or not isinstance(history, int) or history < 1):
            raise HookError(f"history must be a positive int or None, got {history!r}")
        self.process_group = process_group
        self.measure_error = bool(measure_error)
        self.step = 0
        self.history: deque[StepRecord] = deque(maxlen=history)
        self._current: StepRecord | None = None
        self.device = torch.device("cpu")
        self._names: dict[int, str] = {}
        if model is not None:
            self._names = {id(p): n for n, p in _unwrap(model).named_parameters()}

    @property
    def distributed(self) -> bool:
        """Whether a process group is in use (else a world of one)."""
        return dist.is_available() and dist.is_initialized()

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group) if self.distributed else 1

    @property
    def rank(self) -> int:
        return dist.get_rank(self.process_group) if self.distributed else 0

    def param_name(self, p: Tensor) -> str:
        """The parameter's model name; without a model ``"param<k>"``, ``k`` in the order first seen.

        Names key the error-feedback residuals, so they must not depend on the bucket (DDP rebuilds its
        buckets after the first iteration).
        """
        name = self._names.get(id(p))
        if name is None:
            name = self._names[id(p)] = f"param{len(self._names)}"
        return name

    def _open(self, bucket) -> StepRecord:
        if self._current is None:
            self.device = bucket.buffer().device  # where side collectives live (CUDA for NCCL)
            self._current = StepRecord(step=self.step)
            self._on_step_start(self._current)
        return self._current

    def _on_step_start(self, rec: StepRecord) -> None:
        """Hook for subclasses: side collectives at the start of a step (called from the hook body)."""

    def _close(self, bucket) -> None:
        if bucket.is_last() and self._current is not None:
            self.history.append(self._current)
            self._current = None
            self.step += 1

    def state_dict(self) -> dict:
        """What a checkpoint needs to resume bit-exactly (tensors cloned to CPU); history is not included."""
        return {"step": self.step}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict` (on a state built with the same parameters and model).

        Raises
        ------
        HookError
            A step boundary is open (called mid-backward) or ``state`` lacks a key.
        """
        if self._current is not None:
            raise HookError("load_state_dict called in the middle of a step")
        try:
            self.step = int(state["step"])
        except KeyError as exc:
            raise HookError(f"hook state_dict lacks {exc}") from None

    def bytes_per_step(self) -> list[int]:
        """``bytes_sent`` of every recorded step."""
        return [r.bytes_sent for r in self.history]

    def summary(self) -> dict:
        """Means over the recorded steps: bytes (payload, extra, sent, fp32) and relative errors."""
        recs = list(self.history)
        if not recs:
            return {"steps": 0}
        mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
        errs = lambda attr: [getattr(r, attr) for r in recs if getattr(r, attr) is not None]  # noqa: E731
        return {
            "steps": len(recs),
            "payload_bytes": mean([r.payload_bytes for r in recs]),
            "extra_bytes": mean([r.extra_bytes for r in recs]),
            "bytes_sent": mean([r.bytes_sent for r in recs]),
            "fp32_bytes": mean([r.fp32_bytes for r in recs]),
            "rel_error": mean(errs("rel_error")),
            "sent_rel_error": mean(errs("sent_rel_error")),
            "euclid_rel_error": mean(errs("euclid_rel_error")),
        }


#: ``all_gather_single`` (torch >= 2.13) is ``all_gather_into_tensor``'s new name; the old one warns.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _cpu(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().cpu().clone() for k, v in tensors.items()}


def _completed(value) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut


def fp32_hook(state: CommHookState, bucket) -> torch.futures.Future:
    """Plain average: ``buffer /= W`` then ``all_reduce`` (SUM), asynchronously; same bits as DDP's default.

    Returns
    -------
    Future[Tensor]
        The bucket buffer itself (flat, its dtype), averaged in place.
    """
    rec = state._open(bucket)
    buf = bucket.buffer()
    nbytes = buf.numel() * buf.element_size()
    w = state.world_size
    rec.payload_bytes += nbytes
    rec.wire_bytes += (2 * (w - 1) * nbytes) // w
    rec.fp32_bytes += 4 * buf.numel()
    rec.numel += buf.numel()
    rec.buckets += 1
    if w == 1:
        fut = _completed(buf)
    else:
        buf.div_(w)
        fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future().then(lambda f: f.value()[0])
    state._close(bucket)
    return fut


@dataclass(frozen=True)
class _Segment:
    offset: int  # in the bucket buffer (elements)
    numel: int
    shape: torch.Size
    start: int  # in this rank's payload (bytes)
    stop: int
    whitening: Transform | None = None  # set for GIFT segments (map back after averaging)
    bias: tuple[int, int] | None = None  # (offset, numel) of the bias whitened with this weight, if any


class CodecHookState(CommHookState):
    """State of the Euclidean low-precision hook (:func:`codec_hook`).

    Parameters
    ----------
    codec : str or Codec
        A :func:`~lab.training.comm.codecs.get_codec` name (``"fp8_e4m3"``, ``"fp8_e5m2_b128"``,
        ``"nvfp4"``, ...) or a codec instance.
    error_feedback : bool
        Keep a per-parameter residual (``"fp8_ef"``).
    nonfinite : {"raise", "propagate"}
        Passed to the codec when ``codec`` is a name.
    process_group, model, measure_error, history
        See :class:`CommHookState`.

    Raises
    ------
    HookError
        ``codec`` is the fp32 codec (use :func:`fp32_hook`) or not a codec.
    CodecError
        Unknown codec name.
    """

    def __init__(self, codec: str | Codec = "fp8_e4m3", *, error_feedback: bool = False, nonfinite: str = "raise",
                 process_group=None, model: nn.Module | None = None, measure_error: bool = False,
                 history: int | None = None):
        super().__init__(process_group, model=model, measure_error=measure_error, history=history)
        codec = get_codec(codec, nonfinite=nonfinite) if isinstance(codec, str) else codec
        if not isinstance(codec, Codec):
            raise HookError(f"codec must be a codec name or a Codec, got {type(codec).__name__}")
        if isinstance(codec, Float32Codec):
            raise HookError("the fp32 codec does not need a gather; use get_hook('fp32') (one all_reduce)")
        self.codec = codec
        self.error_feedback = ErrorFeedback() if error_feedback else None

    def state_dict(self) -> dict:
        d = super().state_dict()
        d["error_feedback"] = _cpu(self.error_feedback.residuals) if self.error_feedback is not None else None
        return d

    def load_state_dict(self, state: Mapping) -> None:
        super().load_state_dict(state)
        if self.error_feedback is not None:
            self.error_feedback.residuals = dict(state.get("error_feedback") or {})

    # encode side (hook body) -------------------------------------------------------------------

    def _quantize_plain(self, name: str, g32: Tensor, ef: ErrorFeedback | None, need_sent: bool) -> tuple[Tensor, Tensor | None]:
        """Euclidean path of one flat float32 gradient: ``(payload, decoded payload or None)``; updates ``ef``."""
        x = ef.compensate(name, g32) if ef is not None else g32
        payload = self.codec.encode(x, name=name)
        sent = None
        if ef is not None or need_sent:
            sent = self.codec.decode(payload, x.numel())
            if ef is not None:
                ef.update(name, x, sent)
        return payload, sent

    def _record(self, rec: StepRecord, name: str, g: Tensor, one: Tensor, sent: Tensor, euclid: Tensor, path: str) -> None:
        ref, e1 = _norm_sq(g), _norm_sq(one.reshape(-1) - g.reshape(-1))
        es, ee = _norm_sq(sent.reshape(-1) - g.reshape(-1)), _norm_sq(euclid.reshape(-1) - g.reshape(-1))
        rec.ref_sq += ref
        rec.err_sq += e1
        rec.sent_err_sq += es
        rec.euclid_err_sq += ee
        rec.per_param[name] = {"rel_error": _rel(e1, ref), "sent_rel_error": _rel(es, ref),
                               "euclid_rel_error": _rel(ee, ref), "path": path}

    def _encode_param(self, name: str, p: Tensor, g: Tensor, rec: StepRecord) -> tuple[Tensor, Transform | None]:
        """Payload of one parameter's gradient ``g`` (a view of the bucket, shape of ``p``) and the
        whitening to undo after the average (None: Euclidean)."""
        g32 = g.reshape(-1).to(torch.float32)
        ef = self.error_feedback
        payload, sent = self._quantize_plain(name, g32, ef, self.measure_error)
        if self.measure_error:
            one = sent if ef is None else self.codec.decode(self.codec.encode(g32, name=name), g32.numel())
            self._record(rec, name, g32, one, sent, one, "euclid")
        return payload, None

    def _encode_bucket(self, bucket, rec: StepRecord) -> tuple[Tensor, list[_Segment]]:
        buf = bucket.buffer()
        layout = bucket_layout(bucket)
        self._before_bucket(layout, rec)
        joint = self._encode_joint(buf, layout, rec)
        payloads, segments, pos = [], [], 0
        for p, off, n, shape in layout:
            name = self.param_name(p)
            if id(p) in joint:
                payload, whitening, bias = joint[id(p)]
            else:
                (payload, whitening), bias = self._encode_param(name, p, buf[off : off + n].view(shape), rec), None
            expected = self.codec.nbytes(n)
            if payload.numel() != expected:  # the codecs guarantee this; a cheap guard for the accounting
                raise HookError(f"{name}: payload of {payload.numel()} bytes, codec {self.codec.name} states {expected}")
            payloads.append(payload)
            segments.append(_Segment(off, n, shape, pos, pos + expected, whitening, bias))
            pos += expected
        flat = torch.cat(payloads) if payloads else torch.empty(0, dtype=torch.uint8, device=buf.device)
        return flat, segments

    def _before_bucket(self, layout: list, rec: StepRecord) -> None:
        """Hook for subclasses: side collectives before a bucket is encoded (its gradients are complete)."""

    def _encode_joint(self, buf: Tensor, layout: list,
                      rec: StepRecord) -> dict[int, tuple[Tensor, Transform | None, tuple[int, int] | None]]:
        """Parameters encoded together (``id(p) -> (payload, whitening, bias (offset, numel) or None)``); none here."""
        return {}

    # decode side (future callback: no collectives here) ----------------------------------------

    def _decode_bucket(self, rows: Tensor, segments: list[_Segment], numel: int, dtype: torch.dtype) -> Tensor:
        world = rows.shape[0]
        acc = torch.zeros(numel, dtype=torch.float32, device=rows.device)
        for r in range(world):  # the same order on every rank: bit-identical sums
            row = rows[r]
            for s in segments:
                acc[s.offset : s.offset + s.numel] += self.codec.decode(row[s.start : s.stop], s.numel)
        acc.div_(world)
        for s in segments:
            if s.whitening is None:
                continue
            view = acc[s.offset : s.offset + s.numel]
            if s.bias is None:
                view.copy_(s.whitening.unwhiten(view.view(s.shape)).reshape(-1))
            else:  # [G | b] was whitened as one (out, in + 1) matrix
                bview = acc[s.bias[0] : s.bias[0] + s.bias[1]]
                back = s.whitening.unwhiten(torch.cat([view.view(s.shape), bview.view(-1, 1)], dim=1))
                view.copy_(back[:, :-1].reshape(-1))
                bview.copy_(back[:, -1])
        return acc if acc.dtype == dtype else acc.to(dtype)


def codec_hook(state: CodecHookState, bucket) -> torch.futures.Future:
    """Encode every gradient of the bucket, ``all_gather`` the uint8 payloads, decode and average in rank order.

    Works for :class:`CodecHookState` (Euclidean) and :class:`GiftHookState` (GIFT's selected layers
    whitened). The returned future's value is a new flat tensor of ``bucket.buffer()``'s numel and dtype.

    Raises
    ------
    HookError
        A payload whose size differs from the codec's stated size.
    NonFiniteError
        NaN/inf gradients with a codec built with ``nonfinite="raise"``.
    """
    rec = state._open(bucket)
    try:
        buf = bucket.buffer()
        payload, segments = state._encode_bucket(bucket, rec)
        w = state.world_size
        rec.payload_bytes += payload.numel()
        rec.wire_bytes += (w - 1) * payload.numel()
        rec.fp32_bytes += 4 * buf.numel()
        rec.numel += buf.numel()
        rec.buckets += 1
        numel, dtype = buf.numel(), buf.dtype
        if w == 1:
            return _completed(state._decode_bucket(payload.view(1, -1), segments, numel, dtype))
        out = torch.empty(w * payload.numel(), dtype=torch.uint8, device=payload.device)
        work = _all_gather_single(out, payload, group=state.process_group, async_op=True)

        def finish(fut: torch.futures.Future) -> Tensor:
            fut.value()  # re-raises a failed collective
            return state._decode_bucket(out.view(w, -1), segments, numel, dtype)

        return work.get_future().then(finish)
    finally:
        state._close(bucket)


#: GIFT uses the same hook function; the state decides which parameters are whitened.
gift_hook = codec_hook

# DDP.register_comm_hook checks the annotations by identity; this module's are strings (postponed evaluation).
for _hook in (fp32_hook, codec_hook):
    _hook.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
del _hook


# -- GIFT ------------------------------------------------------------------------------------------


class GiftHookState(CodecHookState):
    """State of the GIFT hook: covariance tracking, whitening factors, layer selection, error feedback.

    Per step (hook body, identical order on every rank):

    1. At the start of a refresh step ``t`` (``t < refresh_warmup``, ``t % refresh_every == 0``, and every
       selection step, so newly selected layers start from fresh factors): the input covariance sums the forward hooks
       collected (every training forward since the last refresh with ``collect="every"``, the default;
       only this step's forward with ``collect="refresh"``, the artifact's behaviour) are packed (upper
       triangles + row counts, float32) and all-reduced (SUM); ``A_new = sum S / sum n``;
       ``A <- b A + (1 - b) A_new`` (``A = A_new`` the first time) with ``b = ema ** steps_since_last_refresh``
       (``ema_per="step"``, the default) or ``b = ema`` (``ema_per="refresh"``, the artifact); factors
       :meth:`Whitening.from_covariance` (damping, rank, residual); with ``broadcast_factors`` rank 0's
       float32 factors are broadcast so every rank maps back with the same bits; error-feedback residuals
       are rebased, ``R <- R A_old^{1/2} A_new^{-1/2}`` (``rebase_error_feedback``; the artifact does not).
       Output-gradient factors (the embeddings' factor; a Linear layer's left-hand factor ``B`` with
       ``output_side``) are refreshed the same way just before each bucket is encoded, for the layers
       whose weight is in that bucket: their gradients are complete then, so the step's own backward is
       in (``R <- B_new^{-1/2} B_old^{1/2} R`` for the left-hand side).
    2. At a selection step (:meth:`LayerSelector.due`): the window statistics are all-reduced (float64)
       and the same layers are selected on every rank. A layer leaving GIFT folds its residual, mapped
       back, into the Euclidean residual (with ``euclidean_error_feedback``) or drops it; a layer entering
       starts from the Euclidean residual (whitened) or zero.
    3. Per parameter: a selected layer's weight gradient ``G`` (``(out, in)``) with factors sends
       ``Q(B^{-1/2} G A^{-1/2} + R)`` (``Q(G A^{-1/2} + R)`` without ``output_side`` or before ``B``'s first
       refresh) and keeps ``R`` (EF in whitened coordinates, ``error_feedback``), with its
       bias as ``[G | b]`` (``bias``); a selected embedding likewise with its output-gradient factor
       (``embeddings``); everything else (LayerNorm parameters, layers not selected or without factors
       yet) is Euclidean.
    4. Statistics for candidate layers (while a selection window is open, or with ``measure_error``):
       Euclidean upper/lower-bound hit rates (of the weight) and one-step errors, and GIFT's one-step
       error when factors exist (of ``[G | b]`` for a layer whitened with its bias); kept in
       :attr:`layer_history` when ``measure_error``.

    Parameters
    ----------
    model : nn.Module
        The model (or its DDP wrapper); its ``nn.Linear`` layers (and, with ``embeddings``, its
        ``nn.Embedding`` layers) are the candidates.
    codec : str or Codec
        ``"fp8_e4m3"`` (default), ``"fp8_e5m2"`` (the artifact's format), ``"nvfp4"``, per-block FP8, ...
    config : GiftConfig, optional
        Every setting below (from ``n_eigenpairs`` to ``statistics``) as one validated, frozen
        :class:`~lab.training.comm.gift.GiftConfig`; or pass them as keywords (``**settings``), which
        are validated by :meth:`GiftConfig.build` (a :class:`GiftError` naming the field), not both.
    n_eigenpairs : int, optional
        Eigenpairs kept per factor (default and paper: 32; the low-rank part of :meth:`Whitening.from_covariance`).
    rank : int, optional
        Deprecated alias of ``n_eigenpairs`` (a config key of earlier runs' ``comm_kwargs``; not the
        process rank, which is :attr:`rank`): warns ``DeprecationWarning``.
    damping : float
        Relative damping ``A + damping * mean(diag A) I`` (artifact: 1e-3; comm-check: 1e-2 helped the median layer).
    ema : float
        EMA factor of ``A``, in [0, 1) (artifact: 0.95 per refresh).
    ema_per : {"step", "refresh"}
        Apply ``ema`` once per step elapsed (default: ``ema ** 50`` per 50-step refresh, a ~20-step time
        constant) or once per refresh (the artifact: with 50-step refreshes a ~1000-step time constant, so
        in runs of a few hundred steps ``A`` stays near its value at initialisation and GIFT measured
        0.6-1.1x of Euclidean FP8's error per layer on a char-GPT, i.e. mostly worse).
    refresh_every : int
        Refresh period in steps (artifact: 50).
    refresh_warmup : int
        Refresh at every one of the first ``refresh_warmup`` steps (default 0: the artifact's fixed period).
        Early in training the model moves fastest and a factor a few steps old can do worse than none: on
        the benchmark's char-GPT (damping 1.0, EMA 0.5, period 10) GIFT's gain over Euclidean FP8 was
        0.6-0.9x at steps 3-10 and 17-18 (below 1: worse) and 2.5-6.7x with a refresh every step;
        from step 30 on the 10-step period holds 1.7-3.3x. The benchmark uses 20 (its learning-rate warm-up).
    residual : {"scalar", "diag"}
        See :class:`~lab.training.comm.gift.Whitening`.
    layers : Iterable[str], optional
        A fixed initial selection (the paper's set S chosen before training); default: automatic.
    include, exclude : str, optional
        Regular expressions (``re.search``) on layer names that restrict the candidates.
    select_by : {"saturation", "error", "gain"}
        Selection score (paper: ``"saturation"``), see :class:`~lab.training.comm.gift.LayerSelector`.
    select_k : int or float
        Layers selected (int) or fraction of the candidates (default 0.25; the paper kept 13 of 64).
    select_threshold : float, optional
        Select every layer with score ``>= threshold`` instead of top-k.
    select_warmup : int
        Steps of Euclidean warm-up before the first automatic selection (paper: 100, profiled offline).
    reselect_every : int or None
        Re-select every this many steps (None: never).
    track : {"all", "selected"}
        Collect ``A`` for every candidate (per-layer picture, ``"gain"`` selection, instant switch-over)
        or only for selected layers (cheaper; a newly selected layer waits for the next refresh).
    embeddings : bool
        Also whiten ``nn.Embedding`` weight gradients (an extension; the paper whitens linear layers).
        An embedding is a linear layer on one-hot inputs, so its input-side factor is diagonal (token
        frequencies) and cannot change a per-element float format's relative error; its factor is the
        other Kronecker factor instead, the covariance ``S`` of the gradient of its output (``d x d``),
        and it sends ``Q(G S^{-1/2} + R)``, mapped back with ``S^{1/2}``. The module whose output gradient
        is used comes from ``model.embedding_layers()`` when the model has it (:class:`~lab.training.model.GPT`:
        the residual stream's gradient for both the token and the position embedding), else each
        embedding's own output. That gradient exists only in the backward; the factor is refreshed
        before the embedding's bucket is encoded, with the step's own backward in. Embeddings sharing a
        source share one ``dy^T dy`` per backward, but each is all-reduced and broadcast as its own
        factor (``d (d + 1) / 2`` floats more per refresh for the GPT's second embedding).
    bias : bool
        Whiten a Linear layer's bias together with its weight (an extension; the paper sends biases
        Euclidean): K-FAC's homogeneous coordinate appends a constant 1 to the inputs, so the factor is
        the ``(in + 1, in + 1)`` covariance of ``[x; 1]`` and ``[G | b] A^{-1/2}`` is quantized as the
        weight's and the bias's payloads (each with its own scale; the same bytes as Euclidean), mapped
        back jointly. Needs the weight and bias in one DDP bucket (adjacent parameters always are unless
        a bucket boundary falls between them); a layer split across buckets is sent Euclidean, with a
        warning. Early in training the residual projections' biases carry about half the gradient.
    output_side : bool
        Also whiten on the left with the output-gradient covariance ``B = E[dy dy^T]`` (``(out, out)``) of
        each Linear layer (one module per weight): the paper's full two-sided form (Eq. 14-17), which it
        dropped after its Table I found no gain at 600M. On the benchmark's char-GPT it lowers the
        per-layer error a further 1.2-3x (see :mod:`lab.training.comm.gift`). Costs ``out (out + 1) / 2 + 1``
        floats per layer and refresh in the all-reduce and ``out k + k + 1`` in the factor broadcast.
    output_side_max : int
        Linear layers with more outputs than this keep the input side only (a vocabulary-sized LM head
        would need a ``(vocab, vocab)`` covariance and its eigendecomposition at every refresh).
    collect : {"every", "refresh"}
        Which forwards (and their backwards) feed the factors (see step 1). ``"every"`` costs an
        ``(in, in)`` GEMM per layer and forward (and, with ``output_side``, an ``(out, out)`` one per
        backward) but no extra bytes.
    error_feedback : bool
        Error feedback in whitened coordinates for GIFT layers (paper: yes).
    euclidean_error_feedback : bool
        Error feedback on the Euclidean path too (paper: no).
    rebase_error_feedback : bool
        Rebase whitened residuals when the factors change.
    broadcast_factors : bool
        Broadcast rank 0's factors after each refresh (extra bytes: ``4 (d k + k + 1)`` per layer, ``d``
        the factor's size: ``in + 1`` for a layer whitened with its bias).
    statistics : {"all_reduce", "rank0"}
        Where a refresh's covariances come from: the sums of every rank, all-reduced (default, the
        artifact; ``4 (d (d + 1) / 2 + 1)`` bytes per factor and refresh), or rank 0's own sums (an
        extension: no all-reduce, rank 0 builds the factors and broadcasts them after a header of
        ``4`` bytes per factor with their ranks; the other ranks' sums are dropped). A covariance
        estimated on one rank's share of the batch is noisier; the side bytes drop to the broadcast.
    nonfinite, process_group, measure_error, history
        See :class:`CodecHookState`.

    Attributes
    ----------
    whitening : dict[str, Whitening]
        Current right-hand factors per tracked layer (``A``; an embedding's ``S``).
    out_whitening : dict[str, Whitening]
        Current left-hand factors ``B`` (``output_side``); :meth:`transform` combines both.
    selector : LayerSelector
        Window sums and :attr:`LayerSelector.history` (selections with scores).
    layer_history : deque of dict
        With ``measure_error``: per step and candidate layer ``step``, ``layer``, ``selected``,
        ``euclid_rel_error``, ``gift_rel_error``, ``sent_rel_error``, ``upper_hit``, ``lower_hit``,
        ``condition_number``.

    Raises
    ------
    GiftError
        No candidate ``nn.Linear`` (or ``nn.Embedding``) layer, unknown names in ``layers``, bad
        parameters, an ``embedding_layers()`` entry that is not an ``nn.Embedding``, or
        ``select_by="gain"`` with ``track="selected"``.
    """

    def __init__(self, model: nn.Module, codec: str | Codec = "fp8_e4m3", config: GiftConfig | None = None, *,
                 nonfinite: str = "raise", process_group=None, measure_error: bool = False, history: int | None = None,
                 **settings: Any):
        if not isinstance(model, nn.Module):
            raise GiftError(f"GIFT needs the model (an nn.Module) to find its nn.Linear layers, got {type(model).__name__}")
        if "rank" in settings:  # deprecated alias (earlier runs' comm_kwargs); the process rank is self.rank
            rank = settings.pop("rank")
            if "n_eigenpairs" in settings and settings["n_eigenpairs"] != rank:
                raise GiftError(f"n_eigenpairs={settings['n_eigenpairs']!r} and its deprecated alias rank={rank!r} disagree")
            warnings.warn("GiftHookState(rank=...) is deprecated: the eigenpairs kept are n_eigenpairs=... "
                          "(rank is the process rank)", DeprecationWarning, stacklevel=2)
            settings["n_eigenpairs"] = rank
        if config is not None and settings:
            raise GiftError(f"pass either config= or GIFT settings as keywords, not both (got {sorted(settings)})")
        if config is not None and not isinstance(config, GiftConfig):
            raise GiftError(f"config must be a GiftConfig, got {type(config).__name__}")
        cfg = config if config is not None else GiftConfig.build(**settings)
        #: the validated, frozen settings (:class:`~lab.training.comm.gift.GiftConfig`)
        self.config = cfg
        super().__init__(codec, error_feedback=cfg.euclidean_error_feedback, nonfinite=nonfinite,
                         process_group=process_group, model=model, measure_error=measure_error, history=history)
        layers, include, exclude, embeddings, bias = cfg.layers, cfg.include, cfg.exclude, cfg.embeddings, cfg.bias
        output_side, output_side_max = cfg.output_side, cfg.output_side_max
        #: when factors are rebuilt, and the covariance EMAs (input / right-hand side, output / left-hand side)
        self.schedule = RefreshSchedule(cfg.refresh_every, cfg.refresh_warmup)
        self._ema_in, self._ema_out = CovarianceEMA(cfg.ema, cfg.ema_per), CovarianceEMA(cfg.ema, cfg.ema_per)
        #: eigenpairs kept per factor (``n_eigenpairs``); :attr:`rank` is this process's rank
        self.n_eigenpairs, self.damping, self.ema, self.refresh_every = cfg.n_eigenpairs, float(cfg.damping), float(cfg.ema), cfg.refresh_every
        self.refresh_warmup = cfg.refresh_warmup
        self.residual, self.track, self.collect, self.ema_per = cfg.residual, cfg.track, cfg.collect, cfg.ema_per
        self.rebase_error_feedback, self.broadcast_factors = cfg.rebase_error_feedback, cfg.broadcast_factors
        self.statistics = cfg.statistics
        self.gift_error_feedback = ErrorFeedback() if cfg.error_feedback else None

        # candidates: named nn.Linear layers (a weight shared by several modules is one layer), then
        # the embeddings (factor: the covariance of a module's output gradient, see embeddings)
        root = _unwrap(model)
        inc, exc = (re.compile(include) if include else None), (re.compile(exclude) if exclude else None)

        def wanted(name: str) -> bool:
            return not ((inc and not inc.search(name)) or (exc and exc.search(name)))

        by_weight: dict[int, tuple[str, list[nn.Linear]]] = {}
        for name, mod in root.named_modules():
            if isinstance(mod, nn.Linear) and wanted(name):
                by_weight.setdefault(id(mod.weight), (name, []))[1].append(mod)
        emb: dict[str, tuple[nn.Embedding, nn.Module]] = {}
        if embeddings:
            found = (root.embedding_layers() if hasattr(root, "embedding_layers")
                     else {n: (m, m) for n, m in root.named_modules() if isinstance(m, nn.Embedding)})
            for name, (mod, source) in found.items():
                if not isinstance(mod, nn.Embedding):
                    raise GiftError(f"embedding {name!r} is a {type(mod).__name__}, not an nn.Embedding")
                if wanted(name) and id(mod.weight) not in by_weight:
                    emb[name] = (mod, source)
        if not by_weight and not emb:
            raise GiftError(f"no candidate nn.Linear or nn.Embedding layer in {type(root).__name__} "
                            f"(include={include!r}, exclude={exclude!r})")
        weights = {**{pid: name for pid, (name, _) in by_weight.items()}, **{id(m.weight): n for n, (m, _) in emb.items()}}
        self.layers: tuple[str, ...] = tuple(weights.values())
        self.embeddings: tuple[str, ...] = tuple(emb)
        self._weight_layer = weights
        self._layer_weight_name = {name: self._names.get(pid, name + ".weight") for pid, name in weights.items()}
        # a Linear's bias is whitened with its weight (K-FAC's homogeneous coordinate) when the weight
        # belongs to one module that has a bias
        self._layer_param = {name: mods[0].weight for name, mods in by_weight.values()}
        self._layer_bias = ({name: mods[0].bias for name, mods in by_weight.values()
                             if len(mods) == 1 and mods[0].bias is not None
                             and mods[0].bias.requires_grad and mods[0].weight.requires_grad}  # frozen: never in a bucket
                            if bias else {})
        self._layer_bias_name = {n: self._names.get(id(b), n + ".bias") for n, b in self._layer_bias.items()}
        self._split_warned: set[str] = set()
        # input side (forward hooks, refreshed at the step's start); output-gradient factors (backward
        # hooks, refreshed per bucket): the embeddings' only factor, and a Linear's left-hand factor
        self.tracker = CovarianceTracker({name: mods for name, mods in by_weight.values()}, self._collecting,
                                         homogeneous=self._layer_bias)
        self.output_side = tuple(name for name, mods in by_weight.values()
                                 if output_side and len(mods) == 1 and mods[0].weight.requires_grad
                                 and mods[0].out_features <= output_side_max)
        self.out_tracker = CovarianceTracker(
            {}, self._collecting,
            {**{n: (source, m.embedding_dim) for n, (m, source) in emb.items()},
             **{name: (mods[0], mods[0].out_features) for name, mods in by_weight.values() if name in self.output_side}})
        self.selector = LayerSelector(self.layers, select_by=cfg.select_by, k=cfg.select_k, threshold=cfg.select_threshold,
                                      warmup=cfg.select_warmup if layers is None else None, every=cfg.reselect_every,
                                      initial=None if layers is None else list(layers))
        self.whitening: dict[str, Whitening] = {}
        self.out_whitening: dict[str, Whitening] = {}
        self.refreshes = 0  # steps at which some factor was refreshed
        self._counted_refresh = -1
        self.layer_history: deque[dict] = deque(maxlen=None if history is None else history * len(self.layers))

    # the covariance EMAs' dicts under their old names (state_dict keys, tests)
    _cov = property(lambda self: self._ema_in.cov)
    _out_cov = property(lambda self: self._ema_out.cov)
    _last_refresh = property(lambda self: self._ema_in.last)
    _out_last_refresh = property(lambda self: self._ema_out.last)

    @property
    def selected(self) -> tuple[str, ...]:
        """Layers currently sent through GIFT (candidate order)."""
        return self.selector.selected

    def close(self) -> None:
        """Remove the forward hooks from the model."""
        self.tracker.close()
        self.out_tracker.close()

    def transform(self, layer: str) -> Transform | None:
        """The transform GIFT applies to ``layer``'s gradient now: both factors when the output side has
        one, the input (right-hand) factor alone before that, None before any refresh."""
        wh = self.whitening.get(layer)
        wo = self.out_whitening.get(layer)
        return None if wh is None else (wh if wo is None else KroneckerWhitening(wh, wo))

    def state_dict(self) -> dict:
        """Adds the covariance EMAs, factors (float32 flat), whitened residuals, the selection and its
        window, and the covariance sums collected since the last refresh."""
        d = super().state_dict()
        d.update({
            "cov": _cpu(self._cov),
            "whitening": {n: (w.to_flat().cpu(), w.dim, w.rank) for n, w in self.whitening.items()},
            "last_refresh": dict(self._last_refresh),
            "refreshes": self.refreshes,
            "gift_error_feedback": _cpu(self.gift_error_feedback.residuals) if self.gift_error_feedback is not None else None,
            "selected": self.selector.selected,
            "selector_window": self.selector.window.clone(),
            "selector_history": list(self.selector.history),
            "tracker": (_cpu(self.tracker._sums), dict(self.tracker._counts)),
            "out_cov": _cpu(self._out_cov),
            "out_whitening": {n: (w.to_flat().cpu(), w.dim, w.rank) for n, w in self.out_whitening.items()},
            "out_last_refresh": dict(self._out_last_refresh),
            "out_tracker": (_cpu(self.out_tracker._sums), dict(self.out_tracker._counts)),
        })
        return d

    _STATE_KEYS = ("step", "cov", "whitening", "last_refresh", "refreshes", "gift_error_feedback", "selected",
                   "selector_window", "selector_history", "tracker", "out_cov", "out_whitening", "out_last_refresh",
                   "out_tracker")

    def _check_state(self, state: Mapping) -> None:
        """Refuse a state whose layers or factor sizes differ from this hook's (before anything is loaded)."""
        missing = [k for k in self._STATE_KEYS if k not in state]
        if missing:
            raise HookError(f"GIFT hook state_dict lacks {missing}")
        unknown = [n for n in list(state["cov"]) + list(state["selected"]) if n not in self.layers]
        if unknown:
            raise GiftError(f"hook state_dict names layers {unknown} this model does not have")
        hint = "(saved with other bias= / embeddings= / output_side= / include= settings?)"
        dims = {**self.out_tracker.dims, **self.tracker.dims}  # right-hand factors: embeddings' from the output side
        out_dims = {n: self.out_tracker.dims[n] for n in self.output_side}
        for n, c in state["out_cov"].items():
            if n not in out_dims or tuple(c.shape) != (out_dims[n], out_dims[n]):
                raise HookError(f"hook state_dict: layer {n!r} has a {tuple(c.shape)} output-side covariance, this "
                                f"hook's is {(out_dims[n],) * 2 if n in out_dims else 'absent'} {hint}")
        for n, (_f, dim, _k) in state["out_whitening"].items():
            if out_dims.get(n) != dim:
                raise HookError(f"hook state_dict: layer {n!r} has an output-side factor of dim {dim}, this hook's is "
                                f"{out_dims.get(n)} {hint}")
        for n, c in state["cov"].items():
            if tuple(c.shape) != (dims[n], dims[n]):
                raise HookError(f"hook state_dict: layer {n!r} has a {tuple(c.shape)} covariance, this hook's factor "
                                f"is ({dims[n]}, {dims[n]}) {hint}")
        for n, (_f, dim, _k) in state["whitening"].items():
            if n not in dims or dim != dims[n]:
                raise HookError(f"hook state_dict: layer {n!r} has a factor of dim {dim}, this hook's is {dims.get(n)} {hint}")
        for n, r in (state["gift_error_feedback"] or {}).items():
            if n not in dims or r.dim() != 2 or r.shape[1] != dims[n]:
                raise HookError(f"hook state_dict: layer {n!r} has a residual of shape {tuple(r.shape)}, this hook's "
                                f"factor is {dims.get(n)} wide {hint}")
        rows = state["selector_window"].shape[0]
        if rows != len(self.layers):
            raise HookError(f"hook state_dict: a selection window of {rows} layers, this hook has {len(self.layers)} {hint}")

    def load_state_dict(self, state: Mapping) -> None:
        """Load a :meth:`state_dict`; checked against this hook's layers and factor sizes first.

        Raises
        ------
        GiftError
            The state names layers this model does not have.
        HookError
            A key is missing, or a covariance, factor, residual or selection window has another size
            (e.g. a state saved with ``bias=False`` loaded with ``bias=True``); nothing is loaded then.
        """
        try:
            self._check_state(state)
        except KeyError as exc:
            raise HookError(f"GIFT hook state_dict lacks {exc}") from None
        super().load_state_dict(state)
        try:
            self._ema_in.cov = dict(state["cov"])
            self.whitening = {n: Whitening.from_flat(f, dim, k) for n, (f, dim, k) in state["whitening"].items()}
            self._ema_in.last = dict(state["last_refresh"])
            self.refreshes = int(state["refreshes"])
            self._counted_refresh = self.step - 1
            if self.gift_error_feedback is not None:
                self.gift_error_feedback.residuals = dict(state["gift_error_feedback"] or {})
            self.selector.selected = tuple(n for n in self.layers if n in set(state["selected"]))
            self.selector.window = state["selector_window"].clone()
            self.selector.history = list(state["selector_history"])
            for tracker, key in ((self.tracker, "tracker"), (self.out_tracker, "out_tracker")):
                sums, counts = state[key]
                tracker._sums, tracker._counts = dict(sums), {n: int(counts.get(n, 0)) for n in tracker.dims}
            self._ema_out.cov = dict(state["out_cov"])
            self.out_whitening = {n: Whitening.from_flat(f, dim, k) for n, (f, dim, k) in state["out_whitening"].items()}
            self._ema_out.last = dict(state["out_last_refresh"])
        except KeyError as exc:
            raise HookError(f"GIFT hook state_dict lacks {exc}") from None

    # forward-side --------------------------------------------------------------------------------

    def _tracked(self) -> tuple[str, ...]:
        return self.layers if self.track == "all" else self.selected

    def _collecting(self, name: str) -> bool:
        if self.collect == "refresh" and not self._is_refresh_step(self.step):
            return False
        if self.statistics == "rank0" and self.world_size > 1 and self.rank != 0:
            return False  # only rank 0's sums are used
        return self.track == "all" or name in self.selected

    # step start: side collectives ----------------------------------------------------------------

    def _is_refresh_step(self, step: int) -> bool:
        return self.schedule.due(step, self.selector.due(step))

    def _on_step_start(self, rec: StepRecord) -> None:
        if self._is_refresh_step(self.step):
            self._refresh(rec)
        if self.selector.due(self.step):
            self._select(rec)

    def _refresh(self, rec: StepRecord) -> None:
        """Input-side factors of the tracked Linear layers (step start: the step's forward is complete)."""
        self._refresh_factors(self.tracker, [n for n in self._tracked() if n in self.tracker.dims], rec)

    def _before_bucket(self, layout: list, rec: StepRecord) -> None:
        """Output-gradient factors of the layers in this bucket, on refresh steps: their gradients are
        complete, so the step's own backward is in (the embeddings' factor, a Linear's left-hand one)."""
        if not self._is_refresh_step(self.step):
            return
        tracked = set(self._tracked())
        in_bucket = [self._weight_layer[id(p)] for p, *_ in layout if id(p) in self._weight_layer]
        self._refresh_factors(self.out_tracker, [n for n in in_bucket if n in tracked and n in self.out_tracker.dims], rec)

    def _refresh_factors(self, tracker: CovarianceTracker, names: list[str], rec: StepRecord) -> None:
        """All-reduce ``tracker``'s sums for ``names``, update the EMAs and factors, rebase EF residuals.

        A name that is a Linear layer of ``self.out_tracker`` updates the left-hand factor
        (:attr:`out_whitening`); every other name (a Linear's input side, an embedding) the right-hand
        one (:attr:`whitening`).
        """
        stale = [n for n in tracker.dims if n not in self._tracked() and tracker.count(n)]
        if stale:  # collected while selected, deselected since (track="selected"): drop, never mix in later
            tracker.take(stale)
        if not names:
            return
        w = self.world_size
        vec = tracker.take(names, device=self.device)
        local = w > 1 and self.statistics == "rank0"
        if local and self.rank != 0:
            self._receive_factors(tracker, names, rec)
            return
        if w > 1 and not local:
            dist.all_reduce(vec, group=self.process_group)
            rec.extra_bytes += 4 * vec.numel()
        sums = tracker.unpack(vec, names)
        left = tracker is self.out_tracker
        fresh: dict[str, Whitening] = {}
        try:
            for name in names:
                s, n = sums[name]
                if n <= 0:
                    continue
                is_left = left and name in self.output_side
                cov = (self._ema_out if is_left else self._ema_in).update(name, s.to(torch.float64) / n, self.step)
                fresh[name] = Whitening.from_covariance(cov, self.n_eigenpairs, self.damping, self.residual)
        except Exception:
            if local:  # the other ranks wait for rank 0's header: tell them it failed, then raise here
                failed = torch.full((len(names),), -2.0, dtype=torch.float32, device=self.device)
                dist.broadcast(failed, src=self._root(), group=self.process_group)
            raise
        if local:  # tell the other ranks which factors follow, and their ranks
            header = torch.tensor([float(fresh[n].rank) if n in fresh else -1.0 for n in names],
                                  dtype=torch.float32, device=self.device)
            dist.broadcast(header, src=self._root(), group=self.process_group)
            rec.extra_bytes += 4 * header.numel()
        if w > 1 and self.broadcast_factors and fresh:
            order = [n for n in names if n in fresh]
            flat = torch.cat([fresh[n].to_flat() for n in order])
            dist.broadcast(flat, src=self._root(), group=self.process_group)
            rec.extra_bytes += 4 * flat.numel()
            fresh = _unflatten_factors(flat, {n: (fresh[n].dim, fresh[n].rank) for n in order})
        self._install_factors(tracker, fresh)

    def _root(self) -> int:
        return dist.get_global_rank(self.process_group or dist.group.WORLD, 0)

    def _receive_factors(self, tracker: CovarianceTracker, names: list[str], rec: StepRecord) -> None:
        """``statistics="rank0"`` on another rank: rank 0's header (ranks, -1: no factor), then its factors."""
        header = torch.empty(len(names), dtype=torch.float32, device=self.device)
        dist.broadcast(header, src=self._root(), group=self.process_group)
        rec.extra_bytes += 4 * header.numel()
        if bool((header == -2).any()):
            raise GiftError(f"step {self.step}: rank 0 failed to build the GIFT factors of {names} (its error has the cause)")
        ks = {n: int(k) for n, k in zip(names, header.tolist()) if k >= 0}
        if not ks:
            return
        shapes = {n: (tracker.dims[n], k) for n, k in ks.items()}
        flat = torch.empty(sum(d * k + k + 1 for d, k in shapes.values()), dtype=torch.float32, device=self.device)
        dist.broadcast(flat, src=self._root(), group=self.process_group)
        rec.extra_bytes += 4 * flat.numel()
        left = tracker is self.out_tracker
        for n in ks:
            (self._ema_out if left and n in self.output_side else self._ema_in).mark(n, self.step)
        self._install_factors(tracker, _unflatten_factors(flat, shapes))

    def _install_factors(self, tracker: CovarianceTracker, fresh: dict[str, Whitening]) -> None:
        """Make ``fresh`` the current factors, rebasing the whitened error-feedback residuals."""
        left = tracker is self.out_tracker
        ef = self.gift_error_feedback
        for name, new in fresh.items():
            is_left = left and name in self.output_side
            store = self.out_whitening if is_left else self.whitening
            old = store.get(name)
            if ef is not None and name in ef:  # keep the residual's value in original coordinates
                r = ef.pop(name)
                if not self.rebase_error_feedback:
                    ef.add(name, r)
                elif is_left:  # R <- B_new^{-1/2} B_old^{1/2} R
                    ef.add(name, KroneckerWhitening(self.whitening[name], new).rebase_output(r, old))
                elif old is not None:  # R <- R A_old^{1/2} A_new^{-1/2}
                    ef.add(name, new.whiten(old.unwhiten(r)))
            store[name] = new
        if fresh and self._counted_refresh != self.step:
            self._counted_refresh = self.step
            self.refreshes += 1

    def _select(self, rec: StepRecord) -> None:
        window = self.selector.window_vector()
        if self.world_size > 1:
            window = window.to(self.device)
            dist.all_reduce(window, group=self.process_group)
            rec.extra_bytes += 8 * window.numel()
            window = window.cpu()
        before = set(self.selected)
        after = set(self.selector.select(self.step, window))
        gift_ef, plain_ef = self.gift_error_feedback, self.error_feedback
        for name in before - after:  # leaving GIFT: keep the residual mass on the Euclidean path if it has EF
            r = gift_ef.pop(name) if gift_ef is not None else None
            if r is not None and plain_ef is not None and name in self.whitening:
                back = self.transform(name).unwhiten(r)
                if name in self._layer_bias:
                    plain_ef.add(self._layer_bias_name[name], back[:, -1].contiguous())
                    back = back[:, :-1]
                plain_ef.add(self._layer_weight_name[name], back.reshape(-1))
        for name in after - before:  # entering GIFT: start from the Euclidean residual, whitened
            if plain_ef is None or gift_ef is None or name not in self.whitening:
                continue
            w = self.transform(name)
            rw = plain_ef.pop(self._layer_weight_name[name])
            if name in self._layer_bias:
                rb = plain_ef.pop(self._layer_bias_name[name])
                if rw is None and rb is None:
                    continue
                weight = self._layer_param[name]
                rw = rw.view(weight.shape) if rw is not None else weight.new_zeros(weight.shape, dtype=torch.float32)
                rb = rb.view(-1, 1) if rb is not None else rw.new_zeros(rw.shape[0], 1)
                gift_ef.add(name, w.whiten(torch.cat([rw, rb], dim=1)))
            elif rw is not None:
                gift_ef.add(name, w.whiten(rw.view(-1, w.dim)))

    # per-bucket and per-parameter encode -------------------------------------------------------------

    def _encode_joint(self, buf: Tensor, layout: list,
                      rec: StepRecord) -> dict[int, tuple[Tensor, Transform | None, tuple[int, int] | None]]:
        """A Linear's weight and bias encoded together when both are in this bucket (see ``bias``)."""
        where = {id(p): (off, n, shape) for p, off, n, shape in layout}
        joint: dict[int, tuple[Tensor, Transform | None, tuple[int, int] | None]] = {}
        for layer, b in self._layer_bias.items():
            w = self._layer_param[layer]
            if id(w) in where and id(b) in where:
                (wo, wn, ws), (bo, bn, _) = where[id(w)], where[id(b)]
                pw, pb, wh = self._encode_layer(layer, buf[wo : wo + wn].view(ws), buf[bo : bo + bn], rec)
                joint[id(w)] = (pw, wh, (bo, bn) if wh is not None else None)
                joint[id(b)] = (pb, None, None)
            elif (id(w) in where or id(b) in where) and layer not in self._split_warned:
                self._split_warned.add(layer)
                warnings.warn(f"GIFT: {layer}'s weight and bias are in different DDP buckets; the layer is sent "
                              "Euclidean (raise bucket_cap_mb, or bias=False to whiten the weight alone)", stacklevel=2)
        return joint

    def _encode_layer(self, layer: str, g: Tensor, gb: Tensor | None,
                      rec: StepRecord) -> tuple[Tensor, Tensor | None, Transform | None]:
        """Weight ``g`` ``(out, in)`` and bias ``gb`` ``(out,)`` (or None) of one candidate layer: (weight
        payload, bias payload or None, the whitening to undo after the average or None). GIFT whitens
        ``X = [g | gb]`` (or ``g``) and sends it as the weight's and the bias's payloads."""
        w_name, b_name = self._layer_weight_name[layer], self._layer_bias_name.get(layer)
        wh = self.transform(layer)
        use_gift = layer in self.selected and wh is not None
        collecting = self.selector.collecting(self.step)
        stats = collecting or self.measure_error
        codec, ef_plain = self.codec, self.error_feedback
        g32 = g.to(torch.float32)
        b32 = gb.reshape(-1).to(torch.float32) if gb is not None else None
        if not (use_gift or stats):
            pb = self._quantize_plain(b_name, b32, ef_plain, False)[0] if b32 is not None else None
            return self._quantize_plain(w_name, g32.reshape(-1), ef_plain, False)[0], pb, None
        d = g32.shape[1]
        x_full = torch.cat([g32, b32.view(-1, 1)], dim=1) if b32 is not None else g32

        def encode(x: Tensor) -> tuple[Tensor, Tensor | None]:  # per tensor: the weight's columns, the bias's
            if b32 is None:
                return codec.encode(x, name=w_name), None
            return codec.encode(x[:, :d].contiguous(), name=w_name), codec.encode(x[:, d].contiguous(), name=b_name)

        def decode(pw: Tensor, pb: Tensor | None) -> Tensor:
            dw = codec.decode(pw, x_full.shape[0] * d).view(-1, d)
            return dw if pb is None else torch.cat([dw, codec.decode(pb, x_full.shape[0]).view(-1, 1)], dim=1)

        gift_one = sent = None
        if use_gift:
            u = wh.whiten(x_full)
            ef = self.gift_error_feedback
            x = ef.compensate(layer, u) if ef is not None else u
            pw, pb = encode(x)
            if ef is not None or stats:
                dec = decode(pw, pb)
                if ef is not None:
                    ef.update(layer, x, dec)
                if stats:
                    sent = wh.unwhiten(dec)
                    gift_one = sent if ef is None else wh.unwhiten(decode(*encode(u)))
        else:
            pw, sw = self._quantize_plain(w_name, g32.reshape(-1), ef_plain, True)
            sent = sw.view(g32.shape)
            pb = None
            if b32 is not None:
                pb, sb = self._quantize_plain(b_name, b32, ef_plain, True)
                sent = torch.cat([sent, sb.view(-1, 1)], dim=1)
        if not stats:
            return pw, pb, wh

        # statistics of the layer (on [G | b] with a bias): Euclidean, per tensor as that path sends them, and GIFT
        if not use_gift and ef_plain is None:
            pe, eu = pw, sent
        else:
            pe, pe_b = encode(x_full)
            eu = decode(pe, pe_b)
        upper, lower = saturation_rates(codec, pe, g32)
        if gift_one is None and wh is not None and (self.measure_error or self.selector.select_by == "gain"):
            gift_one = wh.unwhiten(decode(*encode(wh.whiten(x_full))))
        ref = _norm_sq(x_full)
        eu_err = _rel(_norm_sq(eu - x_full), ref)
        gift_err = _rel(_norm_sq(gift_one - x_full), ref) if gift_one is not None else None
        if collecting and ref > 0:
            self.selector.observe(layer, upper=upper, lower=lower, euclid_err=eu_err, gift_err=gift_err)
        if self.measure_error:
            one, path = (gift_one if use_gift else eu), ("gift" if use_gift else "euclid")
            self._record(rec, w_name, g32, one[:, :d], sent[:, :d], eu[:, :d], path)
            if b32 is not None:
                self._record(rec, b_name, b32, one[:, d], sent[:, d], eu[:, d], path)
            self.layer_history.append({
                "step": self.step, "layer": layer, "selected": bool(use_gift),
                "euclid_rel_error": eu_err, "gift_rel_error": gift_err,
                "sent_rel_error": _rel(_norm_sq(sent - x_full), ref),
                "upper_hit": upper, "lower_hit": lower,
                "condition_number": wh.condition_number if wh is not None else None,
            })
        return pw, pb, (wh if use_gift else None)

    def _encode_param(self, name: str, p: Tensor, g: Tensor, rec: StepRecord) -> tuple[Tensor, Transform | None]:
        layer = self._weight_layer.get(id(p))
        if layer is None or g.dim() != 2 or layer in self._layer_bias:  # the last: bias in another bucket
            return super()._encode_param(name, p, g, rec)
        payload, _, whitening = self._encode_layer(layer, g, None, rec)
        return payload, whitening

    # widget data -----------------------------------------------------------------------------------

    def layer_table(self) -> list[dict]:
        """The latest per-layer picture: one dict per candidate (latest measured record, selection, score).

        Keys: ``layer``, ``selected``, ``score`` (latest selection's, None before), plus the latest
        :attr:`layer_history` fields for that layer (None when not measured), and ``gain``
        (``euclid_rel_error / gift_rel_error``).
        """
        latest: dict[str, dict] = {}
        for r in self.layer_history:
            latest[r["layer"]] = r
        scores = self.selector.history[-1]["scores"] if self.selector.history else {}
        out = []
        for name in self.layers:
            r = latest.get(name, {})
            eu, gi = r.get("euclid_rel_error"), r.get("gift_rel_error")
            out.append({
                "layer": name, "selected": name in self.selected, "score": scores.get(name),
                "step": r.get("step"), "euclid_rel_error": eu, "gift_rel_error": gi,
                "gain": (eu / gi) if (eu is not None and gi) else None,
                "upper_hit": r.get("upper_hit"), "lower_hit": r.get("lower_hit"),
                "condition_number": self.transform(name).condition_number if name in self.whitening else None,
            })
        return out


def _unflatten_factors(flat: Tensor, shapes: Mapping[str, tuple[int, int]]) -> dict[str, Whitening]:
    """Split a broadcast ``[to_flat() of each factor]`` vector back into factors; ``shapes``: name -> (dim, rank), in order."""
    out, pos = {}, 0
    for n, (d, k) in shapes.items():
        m = d * k + k + 1
        out[n] = Whitening.from_flat(flat[pos : pos + m], d, k)
        pos += m
    return out


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
        for ``"nvfp4"``; ``model`` (required) and the other :class:`GiftHookState` parameters for GIFT;
        ``process_group``, ``model``, ``measure_error``, ``history``, ``nonfinite`` for all codec hooks
        (``"fp32"`` takes ``process_group``, ``model``, ``history``).

    Raises
    ------
    HookError
        Unknown name or keyword (``GiftError`` for GIFT parameters, e.g. a missing ``model``).
    """
    try:
        if name == "fp32":
            return CommHookState(**kw), fp32_hook
        if name in ("fp8", "fp8_ef"):
            codec = _fp8_name(kw.pop("fmt", "e4m3"), kw.pop("block_size", None))
            return CodecHookState(codec, error_feedback=(name == "fp8_ef"), **kw), codec_hook
        if name == "nvfp4":
            return CodecHookState("nvfp4", **kw), codec_hook
        if name == "bf16":
            return CodecHookState("bf16", **kw), codec_hook
        if name in ("gift_fp8", "gift_nvfp4"):
            if "model" not in kw:
                raise GiftError(f"{name} needs model=... (the module whose nn.Linear layers GIFT whitens)")
            model = kw.pop("model")
            codec = _fp8_name(kw.pop("fmt", "e4m3"), kw.pop("block_size", None)) if name == "gift_fp8" else "nvfp4"
            return GiftHookState(model, codec, **kw), gift_hook
    except TypeError as exc:  # unknown keyword
        raise HookError(f"{name}: {exc}") from None
    raise HookError(f"unknown hook {name!r}; known: {', '.join(HOOKS)}")
