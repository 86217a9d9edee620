"""The hooks' common parts: per-step accounting (:class:`StepRecord`), error feedback, bucket layout,
:class:`CommHookState` and the fp32 hook. See :mod:`lab.training.comm.hooks` for the hooks and their contract."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lab.training.comm.gift import (
    KroneckerWhitening,
    Whitening,
)
from lab.training.errors import HookError

#: What a GIFT segment undoes after the average: one (right-hand) factor or both Kronecker factors.
Transform = Whitening | KroneckerWhitening

__all__ = ["CommHookState", "ErrorFeedback", "FlatBucket", "StepRecord", "Transform", "bucket_layout", "fp32_hook"]


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


# DDP.register_comm_hook checks the annotations by identity; this module's are strings (postponed evaluation).
for _hook in (fp32_hook,):
    _hook.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
del _hook


class FlatBucket:
    """A stand-in for ``torch.distributed.GradBucket`` over given parameters, to call a DDP comm hook outside DDP
    (a benchmark's simulated step, a test): the parts the hooks use.

    Parameters
    ----------
    params : iterable of torch.nn.Parameter
        The bucket's parameters, in order.
    index : int
        What :meth:`index` returns (DDP's bucket index).
    last : bool
        What :meth:`is_last` returns.
    grads : list of tensor, optional
        The gradients to flatten (default each parameter's ``.grad``); copied into one flat buffer
        (``buffer()``, 1-D, the gradients' dtype), of which :meth:`gradients` returns per-parameter views.
    """

    def __init__(self, params, index=0, last=True, grads=None):
        self._params = list(params)
        grads = grads if grads is not None else [p.grad for p in self._params]
        self._buf = torch.cat([g.reshape(-1) for g in grads]).clone()
        self._index, self._last = index, last

    def buffer(self):
        return self._buf

    def parameters(self):
        return self._params

    def gradients(self):
        out, pos = [], 0
        for p in self._params:
            out.append(self._buf[pos : pos + p.numel()].view(p.shape))
            pos += p.numel()
        return out

    def index(self):
        return self._index

    def is_last(self):
        return self._last
