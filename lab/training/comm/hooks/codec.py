"""The Euclidean low-precision hook: :class:`CodecHookState` and :func:`codec_hook` (FP8 / NVFP4 / bf16 per
parameter tensor; error feedback and error measurement wrap it: :mod:`lab.training.comm.hooks.wrappers`).
See :mod:`lab.training.comm.hooks`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lab.training.comm.codecs import Codec, Float32Codec, get_codec
from lab.training.errors import HookError
from lab.training.comm.hooks.base import (
    CommHookState,
    ErrorFeedback,
    StepRecord,
    Transform,
    _all_gather_single,
    _completed,
    _norm_sq,
    _rel,
    bucket_layout,
)

__all__ = ["CodecHookState", "Encoded", "codec_hook"]


class Encoded:
    """One parameter's Euclidean payload as the codec hook produced it (what a tap receives).

    Attributes
    ----------
    name : str
        The parameter's name (:meth:`CommHookState.param_name`).
    x : Tensor
        The flat float32 tensor that was encoded (the bucket's gradient, after any compensation).
    payload : Tensor
        The codec's ``uint8`` payload of ``x``.
    codec : Codec
    """

    def __init__(self, codec: Codec, name: str, x: Tensor, payload: Tensor):
        self.codec, self.name, self.x, self.payload = codec, name, x, payload

    @cached_property
    def sent(self) -> Tensor:
        """``codec.decode(payload)``: flat float32, what this rank contributes (decoded once, shared)."""
        return self.codec.decode(self.payload, self.x.numel())


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
    nonfinite : {"raise", "propagate"}
        Passed to the codec when ``codec`` is a name.
    process_group, model, history
        See :class:`CommHookState`.

    Error feedback (``"fp8_ef"``) and error measurement are hooks that wrap this one
    (:mod:`lab.training.comm.hooks.wrappers`); they see each parameter's payload through the taps this
    state calls (:attr:`_taps`, registered for one hook call).

    Raises
    ------
    HookError
        ``codec`` is the fp32 codec (use :func:`fp32_hook`) or not a codec.
    CodecError
        Unknown codec name.
    """

    def __init__(self, codec: str | Codec = "fp8_e4m3", *, nonfinite: str = "raise",
                 process_group=None, model: nn.Module | None = None, history: int | None = None):
        super().__init__(process_group, model=model, history=history)
        codec = get_codec(codec, nonfinite=nonfinite) if isinstance(codec, str) else codec
        if not isinstance(codec, Codec):
            raise HookError(f"codec must be a codec name or a Codec, got {type(codec).__name__}")
        if isinstance(codec, Float32Codec):
            raise HookError("the fp32 codec does not need a gather; use get_hook('fp32') (one all_reduce)")
        self.codec = codec
        #: ``tap(record, Encoded)`` callables the wrappers register for one hook call (see :mod:`.wrappers`)
        self._taps: list = []

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
        payload = self.codec.encode(g32, name=name)
        if self._taps:
            enc = Encoded(self.codec, name, g32, payload)
            for tap in self._taps:
                tap(rec, enc)
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


# DDP.register_comm_hook checks the annotations by identity; this module's are strings (postponed evaluation).
for _hook in (codec_hook,):
    _hook.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
del _hook
