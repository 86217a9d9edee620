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

Checksums are CRC-32 over a buffer's payload (its tensors back to back, in layout order, at 64-byte
aligned offsets with zero padding: :attr:`HostBuffer.payload`), computed with ISA-L
(:func:`isal.isal_zlib.crc32`: the same polynomial and values as :func:`zlib.crc32`, about 25 GB/s
here against zlib's 2-4 GB/s, and it releases the GIL). On 2 cores shared by 4 ranks every cycle a
snapshot costs is taken from training, in whichever thread or in the kernel it is spent (there is no
idle core to hide it on): the failure-free overhead is the copy (none where the optimizer writes the
generation into its buffer, the worker's ``snapshot_write="optimizer"``), the checksum and the replica's
transfer added up (``benchmarks/resilience.py``, ``process_cpu_ms_per_step``).

A layout entry may be filled from several sources (:meth:`PingPong.write` with a sequence of
tensors): they are copied back to back into the entry's flat tensor. All entries are views into one
byte buffer (:attr:`HostBuffer.wire`), so a generation is one checksum pass and, with its 16-byte
header of generation and checksum, one message to the peer.

:class:`DeviceCopier` does the copies: on CUDA on a side stream into pinned buffers, ordered after the
optimizer step by an event and waited for by the next optimizer step with another event (the host is
not blocked); on the CPU the same calls copy synchronously and the events are None.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from isal.isal_zlib import crc32

from lab.training.errors import TrainingError

__all__ = ["HEADER_BYTES", "DeviceCopier", "HostBuffer", "PingPong", "SnapshotError", "checksum", "tensor_bytes"]

HEADER_BYTES = 16  #: a buffer's wire header: generation and CRC-32 as two int64
_ALIGN = 64  # each tensor of a layout starts at a multiple of this many bytes of the payload


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
        crc = crc32(name.encode(), crc)
        crc = crc32(tensor_bytes(t), crc)
    return crc


@dataclass
class HostBuffer:
    """One of the two host buffers of a :class:`PingPong`.

    Attributes
    ----------
    tensors : dict of str to torch.Tensor
        Preallocated CPU tensors (pinned when the snapshot is of CUDA tensors): views into ``wire``.
    wire : torch.Tensor or None
        ``(HEADER_BYTES + payload,)`` uint8: a header ``(generation, crc)`` as two int64, then every
        tensor of the layout at a 64-byte aligned offset. The whole generation is one message to the
        peer and one checksum pass.
    generation : int or None
        The committed generation, None while empty or being written.
    crc : int or None
        The committed generation's CRC-32 (:func:`checksum`).
    """

    tensors: dict[str, torch.Tensor]
    generation: int | None = None
    crc: int | None = None
    writing: int | None = None
    wire: torch.Tensor | None = None

    @property
    def payload(self) -> torch.Tensor | None:
        """The bytes the tensors live in (``wire`` after its header), or None for loose tensors."""
        return None if self.wire is None else self.wire[HEADER_BYTES:]

    def compute_crc(self) -> int:
        """CRC-32 of the buffer's bytes: one pass over :attr:`payload` (the layout's tensors back to back,
        zero padding between them), or :func:`checksum` of loose tensors."""
        if self.wire is None:
            return checksum(self.tensors)
        return crc32(tensor_bytes(self.payload))

    def set_header(self, generation: int, crc: int) -> None:
        """Write ``(generation, crc)`` into the first :data:`HEADER_BYTES` of :attr:`wire` (outside the
        checksummed payload), so one message carries a generation and its checksum."""
        self.wire[:HEADER_BYTES].view(torch.int64).copy_(torch.tensor([generation, crc], dtype=torch.int64))

    def header(self) -> tuple[int, int]:
        """``(generation, crc)`` from :attr:`wire`'s header (what a received message says it holds)."""
        g, c = self.wire[:HEADER_BYTES].view(torch.int64).tolist()
        return int(g), int(c)

    def verify(self) -> bool:
        """True when the buffer is committed and its bytes still match the committed checksum."""
        return self.generation is not None and self.crc is not None and self.compute_crc() == self.crc

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
        offsets, end = {}, 0
        for name, t in self.layout.items():
            offsets[name] = end
            end += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN

        def alloc() -> HostBuffer:
            # zero-filled (pinned too): the padding has the same bytes on every rank, whatever the allocator hands out
            wire = torch.zeros(HEADER_BYTES + end, dtype=torch.uint8)
            if self.pin_memory:
                wire = wire.pin_memory()
            tensors = {}
            for name, t in self.layout.items():
                a = HEADER_BYTES + offsets[name]
                tensors[name] = wire[a:a + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            return HostBuffer(tensors, wire=wire)

        self.buffers = [alloc() for _ in range(2)]

    # ------------------------------------------------------------------ writing
    def begin(self, generation: int, index: int | None = None) -> HostBuffer:
        """Invalidate buffer ``index`` (default ``generation % 2``) and return it for writing ``generation``."""
        if generation < 0:
            raise SnapshotError(f"generation must be >= 0, got {generation}")
        buf = self.buffers[generation % 2 if index is None else index]
        with self.lock:
            buf.generation, buf.crc, buf.writing = None, None, generation
        return buf

    def commit(self, buf: HostBuffer, generation: int, crc: int | None = None, *, trust: bool = False) -> None:
        """Commit ``generation`` in ``buf``.

        Without ``crc`` the checksum is computed from the buffer's bytes. With ``crc`` (a transfer:
        the sender's checksum) the bytes are checked against it and a mismatch raises
        :class:`SnapshotError` (the buffer stays uncommitted) -- unless ``trust``, which records
        ``crc`` without reading the bytes: the replica path, whose bytes are verified when they are
        read (:meth:`get` with ``verify``, and the holder's report to the coordinator), so receiving
        a replica costs no checksum pass on the critical cores.
        """
        if crc is not None and trust:
            actual = int(crc)
        else:
            actual = buf.compute_crc()
            if crc is not None and actual != crc:
                with self.lock:
                    buf.writing = None
                raise SnapshotError(f"generation {generation}: received bytes have CRC-32 {actual:#010x}, sender said {crc:#010x}")
        with self.lock:
            if buf.writing != generation:
                raise SnapshotError(f"buffer is not being written with generation {generation} (writing {buf.writing})")
            buf.generation, buf.crc, buf.writing = generation, actual, None

    def copy(self, generation: int, tensors: Mapping[str, torch.Tensor | Sequence[torch.Tensor]], *,
             between: Callable[[str], None] | None = None, copier: DeviceCopier | None = None) -> HostBuffer:
        """Invalidate buffer ``generation % 2`` and copy ``tensors`` into it, without committing.

        Parameters
        ----------
        tensors : mapping of str to tensor or sequence of tensors
            The layout's names in layout order. A tensor must have the entry's shape and dtype; a
            sequence of contiguous tensors of the entry's dtype is copied back to back into the
            entry's flat buffer and must fill it exactly.
        between : callable, optional
            ``between(name)`` after each source tensor's copy (fault injection: a kill there is a kill
            mid-snapshot).
        copier : DeviceCopier, optional
            Does the copies (a CUDA side stream); None: synchronous ``copy_``.

        Raises
        ------
        SnapshotError
            ``tensors`` do not match the layout (checked before anything is copied; the buffer is
            then left uncommitted).
        """
        buf = self.begin(generation)
        if list(tensors) != list(buf.tensors):
            raise SnapshotError(f"snapshot names {list(tensors)} differ from the layout {list(buf.tensors)}")
        plan = []
        for name, src in tensors.items():
            dst = buf.tensors[name]
            if isinstance(src, torch.Tensor):
                if src.shape != dst.shape or src.dtype != dst.dtype:
                    raise SnapshotError(f"snapshot tensor {name!r}: {tuple(src.shape)} {src.dtype} != layout "
                                        f"{tuple(dst.shape)} {dst.dtype}")
                plan.append((name, [src]))
                continue
            parts = list(src)
            bad = [i for i, t in enumerate(parts) if t.dtype != dst.dtype or not t.is_contiguous()]
            if bad:
                raise SnapshotError(f"snapshot tensor {name!r} part {bad[0]}: needs contiguous {dst.dtype}, got "
                                    f"{parts[bad[0]].dtype} contiguous={parts[bad[0]].is_contiguous()}")
            if sum(t.numel() for t in parts) != dst.numel():
                raise SnapshotError(f"snapshot tensor {name!r}: parts hold {sum(t.numel() for t in parts)} elements, "
                                    f"the layout {dst.numel()}")
            plan.append((name, parts))
        for name, parts in plan:
            flat, off = buf.tensors[name].view(-1), 0
            for src in parts:
                k = src.numel()
                target, source = flat[off:off + k], src.detach().reshape(-1)
                if copier is None:
                    target.copy_(source)
                else:
                    copier.copy(target, source)
                off += k
                if between is not None:
                    between(name)
        return buf

    def write(self, generation: int, tensors: Mapping[str, torch.Tensor | Sequence[torch.Tensor]], *,
              between: Callable[[str], None] | None = None, copier: DeviceCopier | None = None) -> HostBuffer:
        """:meth:`copy` then (after the copier's copies completed) :meth:`commit`; returns the committed buffer.

        Raises
        ------
        SnapshotError
            ``tensors`` do not match the layout (the buffer is then left uncommitted).
        """
        buf = self.copy(generation, tensors, between=between, copier=copier)
        if copier is not None:
            copier.synchronize(copier.end())
        self.commit(buf, generation)
        return buf

    # ------------------------------------------------------------------ reading
    def index_of(self, buf: HostBuffer) -> int:
        """Which of the two buffers ``buf`` is (0 or 1)."""
        return next(i for i, b in enumerate(self.buffers) if b is buf)

    def index_for(self, generation: int) -> int:
        """The buffer to write ``generation`` into when generations do not alternate by parity (a replica
        written every ``k`` generations): the one already holding ``generation``, else an empty one, else the
        one with the older generation -- never the newest committed one, which survives a torn write."""
        with self.lock:
            gens = [-1 if b.generation is None else b.generation for b in self.buffers]
        if generation in gens:
            return gens.index(generation)
        return 0 if gens[0] <= gens[1] else 1

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

    def release(self, index: int) -> None:
        """Forget the generation in buffer ``index`` (0 or 1): its bytes are about to change in place."""
        with self.lock:
            b = self.buffers[index]
            b.generation, b.crc, b.writing = None, None, None

    def invalidate(self) -> None:
        """Forget both generations (after a restore from disk)."""
        with self.lock:
            for b in self.buffers:
                b.generation, b.crc, b.writing = None, None, None

    def nbytes(self) -> int:
        """Host bytes of both buffers."""
        return sum(b.nbytes() for b in self.buffers)


class DeviceCopier:
    """Copies the live state into host snapshot buffers, off the compute stream where there is one.

    Parameters
    ----------
    device : torch.device or str
        The device of the live state. ``cuda``: copies are enqueued, non-blocking, on a side
        :class:`torch.cuda.Stream` into pinned host buffers (allocate the :class:`PingPong` with
        ``pin_memory=copier.pin_memory``); ``cpu``: plain synchronous ``copy_``.
    use_stream : bool
        False: the synchronous CPU path even on CUDA (a test of the same calls with the stream off).

    Notes
    -----
    The ordering that makes an asynchronous snapshot of generation ``t`` exact (PHOENIX: the copy
    overlaps the next step's computation, ``../shared/notes/papers-phoenix.md``):

    1. training thread, after optimizer step ``t``: ``ready = mark_ready()``, an event recorded on
       the compute stream behind the optimizer's (and the parameter all-gather's) kernels;
    2. snapshot thread: ``begin(ready)`` makes the side stream wait for it, ``copy`` enqueues the
       device-to-host copies, ``copied = end()`` records an event on the side stream behind them;
    3. training thread, before optimizer step ``t + 1`` (which overwrites parameters and moments in
       place): ``wait(copied)`` makes the *compute stream* wait for ``copied``; the forward and
       backward passes of ``t + 1`` (which only read the parameters) run concurrently with the copy,
       the host thread is never blocked;
    4. snapshot thread: ``synchronize(copied)`` before the checksum reads the host bytes.

    Each source tensor is also ``record_stream``-ed on the side stream so the caching allocator
    cannot reuse its memory before the copy has read it. On the CPU, ``mark_ready``/``end`` return
    None and ``begin``/``wait``/``synchronize`` do nothing: the copy is synchronous in the snapshot
    thread and the host-side wait of step 3 (the snapshot thread's ``copy_done`` event in
    :class:`~lab.training.resilience.worker.Snapshotter`) is the only ordering needed.
    """

    def __init__(self, device: torch.device | str = "cpu", use_stream: bool = True):
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise SnapshotError(f"DeviceCopier for {self.device}: CUDA is not available")
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" and use_stream else None

    @property
    def pin_memory(self) -> bool:
        """Whether host buffers should be page-locked (CUDA sources: required for asynchronous copies)."""
        return self.device.type == "cuda"

    def mark_ready(self):
        """An event behind the work queued so far on the compute stream (None without a side stream)."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def begin(self, ready) -> None:
        """Order the side stream's next copies after ``ready`` (from :meth:`mark_ready`)."""
        if self.stream is not None and ready is not None:
            self.stream.wait_event(ready)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy ``src`` (device) into ``dst`` (host, same shape and dtype)."""
        if self.stream is None or not src.is_cuda:  # host sources (meta, RNG): a plain copy
            dst.copy_(src)
            return
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(self.stream)

    def end(self):
        """An event behind the copies enqueued since :meth:`begin` (None without a side stream)."""
        if self.stream is None:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def wait(self, copied) -> None:
        """Make the compute stream wait for ``copied`` (GPU-side; the host thread continues)."""
        if copied is not None:
            torch.cuda.current_stream(self.device).wait_event(copied)

    def synchronize(self, copied) -> None:
        """Block the calling (snapshot) thread until the copies behind ``copied`` are in host memory."""
        if copied is not None:
            copied.synchronize()
