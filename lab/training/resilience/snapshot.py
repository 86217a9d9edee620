"""Ping-pong host snapshots with generation numbers and checksums (PHOENIX's in-memory checkpoint).

Source: PHOENIX / DeadPool (Xie, Chen, Zheng, Yang, Zhang, arXiv 2607.01646): "off-critical-path
in-memory checkpointing"; the per-step *ping-pong* host buffers and "committed generations" follow the
review of its sections 5-6 summarised in ``../shared/notes/papers-phoenix.md`` (the paper's full text
is not available here).

A :class:`PingPong` owns two :class:`HostBuffer` s of the same layout (a dict of named tensors:
shapes and dtypes fixed at construction). Generation ``g`` (the state after optimizer step ``g``;
0 is the initial state) is written into buffer ``g % 2``. Writing *first* invalidates the buffer
(its generation and checksum are cleared), then copies the tensors, then computes the checksum, and
only then commits ``(generation, checksum)``: a writer killed or failing at any point leaves that
buffer uncommitted, while the other buffer still holds the previous committed generation. A torn
buffer is therefore never returned by :meth:`PingPong.committed` or :meth:`PingPong.get`.

Checksums are CRC-32 (:func:`zlib.crc32`, which releases the GIL on large buffers, so a background
thread computing one does not stall the training thread) over the raw bytes of every tensor in
layout order.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from lab.training.errors import TrainingError

__all__ = ["HostBuffer", "PingPong", "SnapshotError", "checksum", "tensor_bytes"]


class SnapshotError(TrainingError):
    """A snapshot buffer cannot be written or read as asked (layout mismatch, no committed generation)."""


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without copying (``memoryview`` of its storage)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise SnapshotError(f"tensor_bytes needs a contiguous CPU tensor, got device {t.device}, contiguous={t.is_contiguous()}")
    return memoryview(t.view(-1).view(torch.uint8).numpy())


def checksum(tensors: Mapping[str, torch.Tensor]) -> int:
    """CRC-32 over the names and raw bytes of ``tensors`` (contiguous CPU tensors), in mapping order.

    Returns
    -------
    int
        An unsigned 32-bit value.
    """
    crc = 0
    for name, t in tensors.items():
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(tensor_bytes(t), crc)
    return crc


@dataclass
class HostBuffer:
    """One of the two host buffers of a :class:`PingPong`.

    Attributes
    ----------
    tensors : dict of str to torch.Tensor
        Preallocated CPU tensors (pinned when the snapshot is of CUDA tensors).
    generation : int or None
        The committed generation, None while empty or being written.
    crc : int or None
        The committed generation's CRC-32 (:func:`checksum`).
    """

    tensors: dict[str, torch.Tensor]
    generation: int | None = None
    crc: int | None = None
    writing: int | None = None

    def verify(self) -> bool:
        """True when the buffer is committed and its bytes still match the committed checksum."""
        return self.generation is not None and self.crc is not None and checksum(self.tensors) == self.crc

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass
class PingPong:
    """Two alternating host buffers; see the module docstring.

    Parameters
    ----------
    layout : dict of str to torch.Tensor
        Example tensors (any device): the buffers get the same names, shapes and dtypes, on the CPU.
    pin_memory : bool
        Allocate page-locked buffers (for asynchronous device-to-host copies on CUDA).
    """

    layout: Mapping[str, torch.Tensor]
    pin_memory: bool = False
    buffers: list[HostBuffer] = field(init=False)
    lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        def alloc(t: torch.Tensor) -> torch.Tensor:
            out = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            return out.pin_memory() if self.pin_memory else out

        self.buffers = [HostBuffer({k: alloc(v) for k, v in self.layout.items()}) for _ in range(2)]

    # ------------------------------------------------------------------ writing
    def begin(self, generation: int) -> HostBuffer:
        """Invalidate buffer ``generation % 2`` and return it for writing ``generation``."""
        if generation < 0:
            raise SnapshotError(f"generation must be >= 0, got {generation}")
        buf = self.buffers[generation % 2]
        with self.lock:
            buf.generation, buf.crc, buf.writing = None, None, generation
        return buf

    def commit(self, buf: HostBuffer, generation: int, crc: int | None = None) -> None:
        """Commit ``generation`` in ``buf`` (computing its checksum unless ``crc`` is given; a given
        ``crc`` is checked against the bytes and a mismatch raises :class:`SnapshotError`)."""
        actual = checksum(buf.tensors)
        if crc is not None and actual != crc:
            with self.lock:
                buf.writing = None
            raise SnapshotError(f"generation {generation}: received bytes have CRC-32 {actual:#010x}, sender said {crc:#010x}")
        with self.lock:
            if buf.writing != generation:
                raise SnapshotError(f"buffer is not being written with generation {generation} (writing {buf.writing})")
            buf.generation, buf.crc, buf.writing = generation, actual, None

    def write(self, generation: int, tensors: Mapping[str, torch.Tensor], *,
              between: Callable[[str], None] | None = None, non_blocking: bool = False) -> HostBuffer:
        """Copy ``tensors`` (same names, shapes and dtypes as the layout) into generation ``generation``
        and commit it. ``between(name)`` runs after each tensor's copy (fault injection: a kill there
        is a kill mid-snapshot). With ``non_blocking`` (CUDA sources into pinned buffers) the copies are
        enqueued on the current stream and synchronised before the checksum.

        Raises
        ------
        SnapshotError
            ``tensors`` do not match the layout (the buffer is then left uncommitted).
        """
        buf = self.begin(generation)
        if list(tensors) != list(buf.tensors):
            raise SnapshotError(f"snapshot names {list(tensors)} differ from the layout {list(buf.tensors)}")
        for name, src in tensors.items():
            dst = buf.tensors[name]
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise SnapshotError(f"snapshot tensor {name!r}: {tuple(src.shape)} {src.dtype} != layout {tuple(dst.shape)} {dst.dtype}")
            dst.copy_(src.detach(), non_blocking=non_blocking)
            if between is not None:
                between(name)
        if non_blocking and torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()
        self.commit(buf, generation)
        return buf

    # ------------------------------------------------------------------ reading
    def committed(self) -> list[int]:
        """Committed generations, oldest first (at most two)."""
        with self.lock:
            return sorted(b.generation for b in self.buffers if b.generation is not None)

    def get(self, generation: int, *, verify: bool = True) -> HostBuffer:
        """The buffer holding committed ``generation``.

        Raises
        ------
        SnapshotError
            ``generation`` is not committed (never written, overwritten, or torn), or, with
            ``verify``, its bytes no longer match its checksum (the message names the generation).
        """
        with self.lock:
            found = [b for b in self.buffers if b.generation == generation]
        if not found:
            raise SnapshotError(f"generation {generation} is not committed (committed: {self.committed()})")
        buf = found[0]
        if verify and not buf.verify():
            raise SnapshotError(f"generation {generation} fails its CRC-32 check (committed {buf.crc:#010x})")
        return buf

    def drop_after(self, generation: int) -> None:
        """Forget committed generations newer than ``generation`` (after a rollback to it)."""
        with self.lock:
            for b in self.buffers:
                if b.generation is not None and b.generation > generation:
                    b.generation, b.crc = None, None

    def invalidate(self) -> None:
        """Forget both generations (after a restore from disk)."""
        with self.lock:
            for b in self.buffers:
                b.generation, b.crc, b.writing = None, None, None

    def nbytes(self) -> int:
        """Host bytes of both buffers."""
        return sum(b.nbytes() for b in self.buffers)
