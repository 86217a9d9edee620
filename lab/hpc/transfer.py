"""Data movement between sites behind one interface: a local copier and Globus Transfer.

A :class:`TransferRequest` names a source and a destination endpoint and the
items (file pairs) to move; a :class:`TransferBackend` submits it, reports a
:class:`TransferStatus`, waits for it, and estimates how long moving ``n``
bytes takes (placement uses :meth:`TransferBackend.estimate_s`).

Backends
--------
:class:`LocalTransfer`
    The embedded default, for endpoints that are local directories (a site's
    ``[data] kind = "local"`` path). Copies in a background thread, in chunks,
    to ``<dest>.part``; hashes source and copy with SHA-256 and refuses a
    mismatch; resumes a ``.part`` left by an interrupted copy when its bytes
    are a prefix of the source; renames into place atomically only after
    verification; retries a failed item; measures its own throughput.
:class:`GlobusTransfer`
    Wraps a ``globus_sdk.TransferClient`` (written for globus-sdk 4.x; the
    endpoints are passed by keyword, which late 3.x also accepts, untested):
    submits a ``globus_sdk.TransferData`` (``verify_checksum=True`` and
    ``sync_level="checksum"`` when the request asks for verification) and
    maps ``get_task`` documents to :class:`TransferStatus`.

Endpoints and paths
-------------------
For :class:`LocalTransfer` an endpoint is a directory, the root of that
site's files, and item paths are resolved *inside* it, as Globus resolves
paths inside a collection: ``"/in/x.bin"`` and ``"in/x.bin"`` both mean
``<root>/in/x.bin``; a path that climbs out of the root, by ``..`` or through a
symbolic link (paths are resolved on disk), is refused. Use the
endpoint ``"/"`` to address host paths directly. For :class:`GlobusTransfer`
an endpoint is a collection UUID and paths are the collection's paths.

Units
-----
Sizes and ``bytes_*`` in bytes, bandwidths in bytes per second, durations in
seconds, times (``request_time``, ``completion_time``) in epoch seconds (UTC).

Errors
------
:class:`~lab.hpc.errors.TransferError` (a :class:`~lab.hpc.errors.HPCError`,
so a :class:`lab.LabError`) for everything this module raises on purpose:
a missing source (the message names the path), an endpoint that is not a
directory, an unknown task id, an SDK ``GlobusAPIError`` (``err.http_status`` and
``err.code`` carry the HTTP status and Globus error code), a network error
talking to Globus, and :meth:`TransferBackend.run` on a failed or timed-out
transfer (``err.status`` holds the last status). :meth:`TransferBackend.wait`
does not raise on a timeout: it returns the last status, whose ``done`` is False.
A checksum mismatch that persists after the retries is not raised by the
background copier: the task ends ``failed`` with an ``error`` naming the file
and both digests (``run`` raises it as a TransferError). Invalid arguments
(a negative size or timeout, a non-positive bandwidth) raise ValueError.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.hpc.errors import TransferError

__all__ = [
    "TransferItem",
    "TransferRequest",
    "TransferState",
    "TransferStatus",
    "TransferBackend",
    "LocalTransfer",
    "GlobusTransfer",
    "TERMINAL_TRANSFER_STATES",
    "sha256_file",
]

_MiB = 1024 * 1024


# --------------------------------------------------------------------------- types


class TransferItem(BaseModel):
    """One thing to move: ``source_path`` on the source endpoint to ``destination_path`` on the destination.

    ``recursive=True`` moves a directory and everything below it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source_path: str = Field(min_length=1)
    destination_path: str = Field(min_length=1)
    recursive: bool = False


class TransferRequest(BaseModel):
    """What to move, from where to where.

    ``source_endpoint`` / ``destination_endpoint``: a local directory (for
    :class:`LocalTransfer`) or a Globus collection UUID (for
    :class:`GlobusTransfer`). ``items`` may be given as :class:`TransferItem`
    objects, dicts, or ``(source_path, destination_path)`` pairs.
    ``verify_checksum`` asks Globus for checksum verification (the local
    backend always verifies with SHA-256, whatever this says);
    ``sync_level`` is Globus's skip rule (default ``"checksum"`` when
    verifying, else unset; the local backend ignores it).
    """

    model_config = ConfigDict(extra="forbid")

    source_endpoint: str = Field(min_length=1)
    destination_endpoint: str = Field(min_length=1)
    items: list[TransferItem] = Field(min_length=1)
    label: str | None = Field(None, max_length=128)
    verify_checksum: bool = True
    sync_level: Literal["exists", "size", "mtime", "checksum"] | None = None

    @field_validator("items", mode="before")
    @classmethod
    def _pairs_to_items(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [
                {"source_path": str(v[0]), "destination_path": str(v[1])} if isinstance(v, (tuple, list)) and len(v) == 2 else v
                for v in value
            ]
        return value

    @property
    def effective_sync_level(self) -> str | None:
        """The sync level sent to Globus: ``sync_level``, or ``"checksum"`` when verifying."""
        if self.sync_level is not None:
            return self.sync_level
        return "checksum" if self.verify_checksum else None


class TransferState(str, Enum):
    """A transfer's state, normalised across backends."""

    PENDING = "pending"
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TERMINAL_TRANSFER_STATES = frozenset({TransferState.SUCCEEDED, TransferState.FAILED})


class TransferStatus(BaseModel):
    """A transfer task as a backend reports it.

    ``bytes_transferred`` counts bytes actually moved by this task (a retried
    attempt counts again; a resumed prefix does not); ``bytes_expected`` the
    total size of the items, when known. ``files`` / ``files_transferred`` /
    ``files_skipped`` count files; ``faults`` failed attempts (I/O errors,
    checksum mismatches) including those later retried successfully.
    ``checksum_verified`` is True when every file was verified, False when a
    verification failed, None when not (yet) known or not requested.
    ``error`` says why a failed task failed; ``detail`` is the backend's own
    short status (Globus ``nice_status``). ``resumed_from_bytes``: bytes of
    earlier partial copies reused (local backend). ``checksums`` maps each
    destination path to its SHA-256 hex digest (local backend).
    ``bytes_per_s``: the task's effective throughput. Times in epoch seconds.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str
    state: TransferState
    label: str | None = None
    bytes_transferred: int = 0
    bytes_expected: int | None = None
    files: int = 0
    files_transferred: int = 0
    files_skipped: int = 0
    faults: int = 0
    checksum_verified: bool | None = None
    error: str | None = None
    detail: str | None = None
    resumed_from_bytes: int = 0
    checksums: dict[str, str] = Field(default_factory=dict)
    bytes_per_s: float | None = None
    request_time: float | None = None
    completion_time: float | None = None

    @property
    def done(self) -> bool:
        """True once the task is succeeded or failed."""
        return self.state in TERMINAL_TRANSFER_STATES

    @property
    def ok(self) -> bool:
        """True when the task succeeded."""
        return self.state is TransferState.SUCCEEDED


def _error(message: str, **attrs: Any) -> TransferError:
    err = TransferError(message)
    for key, value in attrs.items():
        setattr(err, key, value)
    return err


# --------------------------------------------------------------------------- interface


class TransferBackend(ABC):
    """The one interface every data-movement backend implements.

    Subclasses set ``latency_s`` (per-task overhead, seconds) and implement
    :meth:`bandwidth_bytes_per_s`; :meth:`estimate_s` combines them.
    """

    latency_s: float = 0.0

    @abstractmethod
    def submit(self, request: TransferRequest) -> str:
        """Start moving ``request``'s items; return the task id at once.

        Raises :class:`~lab.hpc.errors.TransferError` if the request cannot be submitted.
        """

    @abstractmethod
    def status(self, task_id: str) -> TransferStatus:
        """The task's current status. Raises TransferError for an unknown task or a backend error."""

    @abstractmethod
    def bandwidth_bytes_per_s(self) -> float:
        """The bandwidth :meth:`estimate_s` uses, bytes per second (configured, measured, or a default)."""

    def wait(self, task_id: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> TransferStatus:
        """Poll :meth:`status` every ``poll_s`` seconds until the task is succeeded or failed, or ``timeout_s`` passes.

        Returns the last status seen: check ``.done`` (False after a timeout,
        like ``TransferClient.task_wait`` returning False) and ``.ok``; a failed
        task is returned, not raised (:meth:`run` raises). Raises TransferError
        only when :meth:`status` does (unknown task, API error).
        """
        if timeout_s < 0 or poll_s < 0:
            raise ValueError(f"timeout_s and poll_s must be >= 0 seconds, got {timeout_s!r}, {poll_s!r}")
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(task_id)
            remaining = deadline - time.monotonic()
            if st.done or remaining <= 0:
                return st
            self._sleep(min(poll_s, remaining))

    def run(self, request: TransferRequest, timeout_s: float = 3600.0, poll_s: float = 1.0) -> TransferStatus:
        """Submit, wait, and return the succeeded status.

        Raises TransferError (``err.task_id``, ``err.status``) if the task failed
        (the message carries its error, e.g. both digests of a checksum mismatch)
        or is still running after ``timeout_s`` seconds, and whatever :meth:`submit` raises.
        """
        task_id = self.submit(request)
        st = self.wait(task_id, timeout_s=timeout_s, poll_s=poll_s)
        if not st.done:
            raise _error(
                f"transfer {task_id} still {st.state.value} after {timeout_s:g} s" + (f" ({st.detail})" if st.detail else ""),
                task_id=task_id,
                status=st,
            )
        if not st.ok:
            raise _error(f"transfer {task_id} failed: {st.error or st.detail or 'unknown reason'}", task_id=task_id, status=st)
        return st

    def estimate_s(self, n_bytes: int | float) -> float:
        """Seconds to move ``n_bytes`` bytes: ``latency_s + n_bytes / bandwidth_bytes_per_s()``.

        Raises ValueError for a negative size.
        """
        if n_bytes < 0:
            raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
        return float(self.latency_s) + float(n_bytes) / float(self.bandwidth_bytes_per_s())

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


# --------------------------------------------------------------------------- local


def sha256_file(path: str | os.PathLike, *, prefix_len: int | None = None, chunk_size: int = 4 * _MiB) -> str:
    """SHA-256 hex digest of a file (or of its first ``prefix_len`` bytes). Raises OSError."""
    h = hashlib.sha256()
    left = prefix_len
    with open(path, "rb") as fh:
        while left is None or left > 0:
            block = fh.read(chunk_size if left is None else min(chunk_size, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


def _hash_with_prefix(path: Path, prefix_len: int, chunk_size: int) -> tuple[str, str | None]:
    """(digest of the whole file, digest of its first ``prefix_len`` bytes or None) in one pass."""
    h = hashlib.sha256()
    prefix: str | None = None
    pos = 0
    with open(path, "rb") as fh:
        while True:
            want = chunk_size
            if prefix is None and prefix_len > 0 and pos < prefix_len:
                want = min(chunk_size, prefix_len - pos)
            block = fh.read(want)
            if not block:
                break
            h.update(block)
            pos += len(block)
            if prefix is None and prefix_len > 0 and pos == prefix_len:
                prefix = h.copy().hexdigest()
    return h.hexdigest(), prefix


class _ChecksumMismatch(Exception):
    def __init__(self, path: Path, source_digest: str, dest_digest: str, attempts: int = 1):
        self.path, self.source_digest, self.dest_digest = path, source_digest, dest_digest
        tail = f" (after {attempts} attempts; destination not written)" if attempts > 1 else ""
        super().__init__(
            f"checksum mismatch for {path}: source sha256 {source_digest}, destination sha256 {dest_digest}{tail}"
        )


class _Task:
    """Mutable bookkeeping of one local task (guarded by the backend's lock)."""

    def __init__(self, task_id: str, request: TransferRequest, pairs: list[tuple[Path, Path]]):
        self.request = request
        self.pairs = pairs
        self.done_event = threading.Event()
        self.status = TransferStatus(
            task_id=task_id,
            state=TransferState.PENDING,
            label=request.label,
            files=len(pairs),
            request_time=time.time(),
        )


class LocalTransfer(TransferBackend):
    """Copies files between local directories, verified by SHA-256, resumable, in background threads.

    Parameters
    ----------
    bandwidth_bytes_per_s : float or None
        Fixed bandwidth for :meth:`estimate_s`, bytes/s. None (default): the
        bandwidth measured over this backend's finished copies (total bytes of
        items of at least ``min_measured_bytes`` over their wall time, hashing
        included), or ``default_bandwidth_bytes_per_s`` before any.
    latency_s : float
        Per-task overhead added by :meth:`estimate_s`, seconds.
    chunk_size : int
        Bytes per read/write.
    retries : int
        Extra attempts for an item whose copy fails (I/O error) or whose
        checksum does not match; a retry after a mismatch starts from byte 0.
    max_workers : int
        Tasks copied concurrently (items within a task go one after another).
    chunk_hook : callable or None
        Fault injection for tests: ``chunk_hook(dest_path, offset, chunk) -> bytes``
        returns the bytes actually written at ``offset`` of ``dest_path``.
    default_bandwidth_bytes_per_s, min_measured_bytes
        See ``bandwidth_bytes_per_s``.

    Every file is verified with SHA-256 whatever ``request.verify_checksum``
    says (hashing is cheap next to the copy). A missing source or a bad
    endpoint is refused by :meth:`submit` with
    :class:`~lab.hpc.errors.TransferError`; failures during the copy end the
    task ``failed`` with ``error`` set (remaining items are not attempted;
    files already verified stay in place). A failed item leaves no
    destination file; an interrupted one leaves ``<dest>.part`` for a later
    task to resume.
    """

    def __init__(
        self,
        bandwidth_bytes_per_s: float | None = None,
        *,
        latency_s: float = 0.001,
        chunk_size: int = 1 * _MiB,
        retries: int = 2,
        max_workers: int = 2,
        chunk_hook: Callable[[Path, int, bytes], bytes] | None = None,
        default_bandwidth_bytes_per_s: float = 200e6,
        min_measured_bytes: int = 64 * 1024,
    ):
        if bandwidth_bytes_per_s is not None and not bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")
        if chunk_size < 1 or retries < 0 or max_workers < 1 or latency_s < 0 or not default_bandwidth_bytes_per_s > 0:
            raise ValueError("chunk_size >= 1, retries >= 0, max_workers >= 1, latency_s >= 0, default bandwidth > 0 required")
        self.configured_bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.default_bandwidth_bytes_per_s = float(default_bandwidth_bytes_per_s)
        self.latency_s = float(latency_s)
        self.chunk_size = int(chunk_size)
        self.retries = int(retries)
        self.chunk_hook = chunk_hook
        self.min_measured_bytes = int(min_measured_bytes)
        self._lock = threading.Lock()
        self._tasks: dict[str, _Task] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lab-transfer")
        self._measured_bytes = 0
        self._measured_s = 0.0
        self._dest_locks: dict[Path, threading.Lock] = {}  # one writer per <dest>.part at a time

    # -- measurement

    @property
    def measured_bandwidth_bytes_per_s(self) -> float | None:
        """Throughput measured over finished copies, bytes/s (None before the first)."""
        with self._lock:
            if self._measured_bytes == 0 or self._measured_s <= 0:
                return None
            return self._measured_bytes / self._measured_s

    def bandwidth_bytes_per_s(self) -> float:
        """Configured bandwidth if given, else the measured one, else the default (bytes/s)."""
        if self.configured_bandwidth_bytes_per_s is not None:
            return float(self.configured_bandwidth_bytes_per_s)
        measured = self.measured_bandwidth_bytes_per_s
        return measured if measured is not None else self.default_bandwidth_bytes_per_s

    # -- interface

    def submit(self, request: TransferRequest) -> str:
        """Check every source exists, queue the copy, return a task id (a UUID string).

        Raises TransferError naming the path when a source is missing (or is a
        directory without ``recursive=True``), or when an endpoint is not a
        directory or an item path climbs out of its endpoint.
        """
        src_root = self._root(request.source_endpoint, "source")
        dst_root = self._root(request.destination_endpoint, "destination")
        pairs: list[tuple[Path, Path]] = []
        for item in request.items:
            src = self._inside(src_root, item.source_path)
            dst = self._inside(dst_root, item.destination_path)
            if src.is_dir():
                if not item.recursive:
                    raise _error(f"source {src} is a directory; set recursive=True to copy it", path=src)
                files = sorted(p for p in src.rglob("*") if p.is_file())
                for p in files:  # a symbolic link below the source folder may point out of the endpoint
                    if not p.resolve().is_relative_to(src_root):
                        raise _error(f"source {p} resolves to {p.resolve()}, outside its endpoint {src_root}", path=p)
                pairs.extend((p, self._inside(dst_root, str(dst.relative_to(dst_root) / p.relative_to(src)))) for p in files)
            elif src.is_file():
                pairs.append((src, dst))
            else:
                raise _error(f"source {src} does not exist (or is not a regular file)", path=src)
        seen: set[Path] = set()
        for _, dst in pairs:
            if dst in seen:
                raise _error(f"destination {dst} is named by more than one item", path=dst)
            seen.add(dst)
        task_id = str(uuid.uuid4())
        task = _Task(task_id, request, pairs)
        try:
            task.status.bytes_expected = sum(s.stat().st_size for s, _ in pairs)
        except OSError as exc:
            raise _error(f"source {exc.filename} cannot be read: {exc.strerror}", path=exc.filename) from None
        with self._lock:
            self._tasks[task_id] = task
        self._pool.submit(self._run_task, task)
        return task_id

    def status(self, task_id: str) -> TransferStatus:
        """A snapshot of the task's status. Raises TransferError for an unknown task id."""
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                raise _error(f"no local transfer task {task_id!r}", task_id=task_id)
            return task.status.model_copy(deep=True)

    def wait(self, task_id: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> TransferStatus:
        """Block until the task ends or ``timeout_s`` passes (no polling locally; ``poll_s`` is accepted for the interface).

        Returns the last status (``.done`` is False after a timeout); raises TransferError for an unknown id.
        """
        if timeout_s < 0 or poll_s < 0:
            raise ValueError(f"timeout_s and poll_s must be >= 0 seconds, got {timeout_s!r}, {poll_s!r}")
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            raise _error(f"no local transfer task {task_id!r}", task_id=task_id)
        task.done_event.wait(timeout_s)
        return self.status(task_id)

    def close(self, wait: bool = True) -> None:
        """Stop accepting tasks; with ``wait`` block until queued copies finish."""
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> LocalTransfer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- paths

    @staticmethod
    def _root(endpoint: str, which: str) -> Path:
        root = Path(endpoint).expanduser()
        if not root.is_dir():
            raise _error(f"{which} endpoint {endpoint!r} is not an existing local directory", path=root)
        return root.resolve()

    @staticmethod
    def _inside(root: Path, path: str) -> Path:
        """``path`` under the (resolved) ``root``, resolved on disk: ``..`` and symbolic links are
        followed, and a result outside ``root`` is refused (TransferError naming the path)."""
        if "\x00" in path:
            raise _error(f"path {path[:200]!r} contains a NUL character", path=path)
        rel = path.lstrip("/")
        full = (root / rel) if rel else root
        resolved = full.resolve()
        if not resolved.is_relative_to(root):
            raise _error(f"path {path[:200]!r} leaves its endpoint {root} (resolves to {resolved})", path=path)
        return resolved

    # -- the copier (runs in a worker thread)

    def _update(self, task: _Task, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(task.status, key, value)

    def _add(self, task: _Task, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                setattr(task.status, key, getattr(task.status, key) + value)

    def _run_task(self, task: _Task) -> None:
        t0 = time.monotonic()
        self._update(task, state=TransferState.ACTIVE)
        try:
            for src, dst in task.pairs:
                digest = self._copy_item(task, src, dst)
                with self._lock:
                    task.status.files_transferred += 1
                    task.status.checksums[str(dst)] = digest
            elapsed = time.monotonic() - t0
            with self._lock:
                st = task.status
                st.state = TransferState.SUCCEEDED
                st.checksum_verified = True  # the local copier always verifies
                st.bytes_per_s = st.bytes_transferred / elapsed if elapsed > 0 and st.bytes_transferred else None
                st.completion_time = time.time()
        except _ChecksumMismatch as exc:
            self._finish_failed(task, str(exc), checksum_verified=False, t0=t0)
        except TransferError as exc:
            self._finish_failed(task, str(exc), t0=t0)
        except Exception as exc:  # noqa: BLE001 - a worker must always end its task
            self._finish_failed(task, f"{type(exc).__name__}: {exc}", t0=t0)
        finally:
            task.done_event.set()

    def _finish_failed(self, task: _Task, message: str, *, t0: float, checksum_verified: bool | None = None) -> None:
        with self._lock:
            st = task.status
            st.state = TransferState.FAILED
            st.error = message
            st.checksum_verified = checksum_verified
            st.completion_time = time.time()
            elapsed = time.monotonic() - t0
            st.bytes_per_s = st.bytes_transferred / elapsed if elapsed > 0 and st.bytes_transferred else None

    def _copy_item(self, task: _Task, src: Path, dst: Path) -> str:
        """Copy one file with retries; return the verified SHA-256. Raises _ChecksumMismatch / TransferError."""
        with self._lock:
            dest_lock = self._dest_locks.setdefault(dst, threading.Lock())
        with dest_lock:
            return self._copy_item_locked(task, src, dst)

    def _copy_item_locked(self, task: _Task, src: Path, dst: Path) -> str:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return self._copy_once(task, src, dst, allow_resume=attempt == 0 or not isinstance(last, _ChecksumMismatch))
            except FileNotFoundError as exc:
                if not src.exists():
                    raise _error(f"source {src} disappeared during the transfer", path=src) from None
                last = exc
            except (_ChecksumMismatch, OSError) as exc:
                last = exc
            self._add(task, faults=1)
        if isinstance(last, _ChecksumMismatch):
            raise _ChecksumMismatch(last.path, last.source_digest, last.dest_digest, attempts=self.retries + 1)
        assert last is not None
        raise _error(f"copying {src} to {dst} failed after {self.retries + 1} attempts: {last}", path=src) from last

    def _copy_once(self, task: _Task, src: Path, dst: Path, *, allow_resume: bool) -> str:
        t0 = time.monotonic()
        part = dst.with_name(dst.name + ".part")
        dst.parent.mkdir(parents=True, exist_ok=True)
        size = src.stat().st_size
        offset = 0
        if part.exists():
            have = part.stat().st_size
            if allow_resume and 0 < have <= size:
                src_digest, prefix_digest = _hash_with_prefix(src, have, self.chunk_size)
                if prefix_digest is not None and prefix_digest == sha256_file(part, chunk_size=self.chunk_size):
                    offset = have
                else:
                    part.unlink()
            else:
                part.unlink()
                src_digest = sha256_file(src, chunk_size=self.chunk_size)
        else:
            src_digest = sha256_file(src, chunk_size=self.chunk_size)
        if offset:
            self._add(task, resumed_from_bytes=offset)
        # An interruption here leaves <dest>.part in place: a later attempt or task resumes it
        # if it is still a prefix of the source (checked by hashing), else starts over.
        with open(src, "rb") as fin, open(part, "r+b" if offset else "wb") as fout:
            fin.seek(offset)
            fout.seek(offset)
            fout.truncate()
            pos = offset
            while True:
                chunk = fin.read(self.chunk_size)
                if not chunk:
                    break
                data = self.chunk_hook(dst, pos, chunk) if self.chunk_hook is not None else chunk
                fout.write(data)
                pos += len(chunk)
                self._add(task, bytes_transferred=len(data))
            fout.flush()
            os.fsync(fout.fileno())
        dst_digest = sha256_file(part, chunk_size=self.chunk_size)
        if dst_digest != src_digest:
            part.unlink(missing_ok=True)
            raise _ChecksumMismatch(dst, src_digest, dst_digest)
        try:
            os.chmod(part, src.stat().st_mode & 0o7777)
        except OSError:
            pass
        os.replace(part, dst)
        elapsed = time.monotonic() - t0
        if size >= self.min_measured_bytes and elapsed > 0:
            with self._lock:
                self._measured_bytes += size
                self._measured_s += elapsed
        return dst_digest


# --------------------------------------------------------------------------- globus

_CHECKSUM_CODES = ("VERIFY_CHECKSUM", "CHECKSUM")


def _epoch(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


class GlobusTransfer(TransferBackend):
    """Moves data between Globus collections through a ``globus_sdk.TransferClient``.

    Parameters
    ----------
    transfer_client : globus_sdk.TransferClient
        An authenticated client (any authorizer or GlobusApp).
    bandwidth_bytes_per_s : float or None
        Fixed bandwidth for :meth:`estimate_s`, bytes/s. None (default): the
        byte-weighted mean of ``effective_bytes_per_second`` over succeeded
        tasks this backend has seen, or ``default_bandwidth_bytes_per_s``.
    latency_s : float
        Per-task overhead (queueing, endpoint activation), seconds.
    fail_on_checksum_fault : bool
        Globus retries a checksum mismatch on its own and the task stays
        ACTIVE; with True (default) a task whose ``nice_status`` (or
        ``fatal_error``) reports a checksum fault is reported ``failed`` at
        once, with that reason. With False only a FAILED task is failed.
    fetch_events : bool
        For a failed task, read its error events (``task_event_list``) to
        name the cause; a failure to read them is ignored.
    sleep : callable
        ``sleep(seconds)`` between polls in :meth:`wait` (tests pass a no-op).

    Every SDK ``GlobusAPIError`` becomes :class:`~lab.hpc.errors.TransferError`
    with ``http_status`` and ``code`` attributes (both in the message); a
    network error becomes TransferError too.
    """

    def __init__(
        self,
        transfer_client: Any,
        *,
        bandwidth_bytes_per_s: float | None = None,
        latency_s: float = 5.0,
        default_bandwidth_bytes_per_s: float = 100e6,
        fail_on_checksum_fault: bool = True,
        fetch_events: bool = True,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if bandwidth_bytes_per_s is not None and not bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s!r}")
        self.client = transfer_client
        self.configured_bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.default_bandwidth_bytes_per_s = float(default_bandwidth_bytes_per_s)
        self.latency_s = float(latency_s)
        self.fail_on_checksum_fault = fail_on_checksum_fault
        self.fetch_events = fetch_events
        self._sleep_fn = sleep
        self._lock = threading.Lock()
        self._measured: dict[str, tuple[int, float]] = {}  # task_id -> (bytes, bytes/s)

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._sleep_fn(seconds)

    # -- measurement

    @property
    def measured_bandwidth_bytes_per_s(self) -> float | None:
        """Byte-weighted mean effective throughput of succeeded tasks seen, bytes/s (None before any)."""
        with self._lock:
            total = sum(b for b, _ in self._measured.values())
            if total <= 0:
                return None
            seconds = sum(b / r for b, r in self._measured.values())
            return total / seconds if seconds > 0 else None

    def bandwidth_bytes_per_s(self) -> float:
        """Configured bandwidth if given, else the measured one, else the default (bytes/s)."""
        if self.configured_bandwidth_bytes_per_s is not None:
            return float(self.configured_bandwidth_bytes_per_s)
        measured = self.measured_bandwidth_bytes_per_s
        return measured if measured is not None else self.default_bandwidth_bytes_per_s

    # -- interface

    def transfer_data(self, request: TransferRequest) -> Any:
        """The ``globus_sdk.TransferData`` document :meth:`submit` sends for ``request``."""
        import globus_sdk

        kwargs: dict[str, Any] = {}
        if request.label is not None:
            kwargs["label"] = request.label
        sync_level = request.effective_sync_level
        if sync_level is not None:
            kwargs["sync_level"] = sync_level
        kwargs["verify_checksum"] = bool(request.verify_checksum)
        # keyword endpoints: globus-sdk 4 dropped v3's leading transfer_client argument
        tdata = globus_sdk.TransferData(
            source_endpoint=request.source_endpoint, destination_endpoint=request.destination_endpoint, **kwargs
        )
        for item in request.items:
            if item.recursive:
                tdata.add_item(item.source_path, item.destination_path, recursive=True)
            else:
                tdata.add_item(item.source_path, item.destination_path)
        return tdata

    def submit(self, request: TransferRequest) -> str:
        """Submit the transfer (the SDK fetches a submission id first); return Globus's task id.

        Raises TransferError (``http_status``, ``code``) when Globus refuses it.
        """
        tdata = self.transfer_data(request)
        with _globus_errors("submitting transfer"):
            result = self.client.submit_transfer(tdata)
        task_id = result.get("task_id") if hasattr(result, "get") else None
        if not task_id:
            raise _error(f"Globus accepted the transfer but returned no task_id (code {result.get('code')!r})")
        return str(task_id)

    def status(self, task_id: str) -> TransferStatus:
        """``get_task`` mapped to :class:`TransferStatus`. Raises TransferError on an API or network error."""
        with _globus_errors(f"reading task {task_id}"):
            doc = self.client.get_task(task_id)
        data = dict(doc.data) if hasattr(doc, "data") and isinstance(doc.data, dict) else dict(doc)
        st = self._map(task_id, data)
        if st.state is TransferState.FAILED and st.error is None:
            st.error = f"Globus task {task_id} failed"
        return st

    # -- mapping

    def _map(self, task_id: str, d: dict[str, Any]) -> TransferStatus:
        raw = str(d.get("status") or "").upper()
        nice = d.get("nice_status")
        fatal = d.get("fatal_error") or None
        fatal_code = fatal.get("code") if isinstance(fatal, dict) else None
        fatal_desc = fatal.get("description") if isinstance(fatal, dict) else None
        checksum_fault = any(
            isinstance(s, str) and any(c in s.upper() for c in _CHECKSUM_CODES) for s in (nice, fatal_code)
        )
        verify = d.get("verify_checksum")
        error: str | None = None
        checksum_verified: bool | None = None
        if raw == "SUCCEEDED":
            state = TransferState.SUCCEEDED
            checksum_verified = True if verify else None
        elif raw == "FAILED":
            state = TransferState.FAILED
            parts = [p for p in (fatal_code, fatal_desc) if p]
            error = ": ".join(parts) if parts else None
            if checksum_fault:
                checksum_verified = False
        elif raw == "INACTIVE":
            state = TransferState.PENDING
        elif raw == "ACTIVE":
            state = TransferState.PENDING if (nice or "").lower() == "queued" else TransferState.ACTIVE
        else:
            state = TransferState.PENDING
        if checksum_fault and state is not TransferState.SUCCEEDED:
            checksum_verified = False
            if self.fail_on_checksum_fault or state is TransferState.FAILED:
                state = TransferState.FAILED
                reason = d.get("nice_status_short_description") or d.get("nice_status_details") or ""
                error = f"checksum verification failed ({fatal_code or nice})" + (f": {reason}" if reason else "")
        if state is TransferState.FAILED and self.fetch_events and not checksum_fault:
            event = self._error_event(task_id)
            if event is not None:
                code = str(event.get("code") or "")
                desc = event.get("description") or ""
                details = event.get("details") or ""
                if any(c in code.upper() for c in _CHECKSUM_CODES):
                    checksum_verified = False
                    error = f"checksum verification failed ({code})" + (f": {details or desc}" if details or desc else "")
                elif error is None:
                    error = f"{code}: {desc or details}".strip(": ")
        bps = d.get("effective_bytes_per_second")
        bytes_transferred = int(d.get("bytes_transferred") or 0)
        if state is TransferState.SUCCEEDED and bps and bytes_transferred > 0:
            with self._lock:
                self._measured[task_id] = (bytes_transferred, float(bps))
        return TransferStatus(
            task_id=str(d.get("task_id") or task_id),
            state=state,
            label=d.get("label"),
            bytes_transferred=bytes_transferred,
            files=int(d.get("files") or 0),
            files_transferred=int(d.get("files_transferred") or 0),
            files_skipped=int(d.get("files_skipped") or 0),
            faults=int(d.get("faults") or 0),
            checksum_verified=checksum_verified,
            error=error,
            detail=nice or (raw.lower() or None),
            bytes_per_s=float(bps) if bps else None,
            request_time=_epoch(d.get("request_time")),
            completion_time=_epoch(d.get("completion_time")),
        )

    def _error_event(self, task_id: str) -> dict[str, Any] | None:
        try:
            events = self.client.task_event_list(task_id, limit=10, query_params={"filter": "is_error:1"})
            for ev in events:
                if ev.get("is_error", True):
                    return dict(ev)
        except Exception:  # noqa: BLE001 - events only refine the reason
            return None
        return None


@contextmanager
def _globus_errors(what: str) -> Iterator[None]:
    """Turn globus-sdk errors raised inside the block into TransferError (``http_status``, ``code``)."""
    import globus_sdk

    try:
        yield
    except globus_sdk.GlobusAPIError as exc:
        status, code = exc.http_status, exc.code
        message = getattr(exc, "message", None) or str(exc)
        raise _error(
            f"Globus refused {what}: HTTP {status} {code}: {message}",
            http_status=status,
            code=code,
            request_id=getattr(exc, "request_id", None),
        ) from exc
    except globus_sdk.NetworkError as exc:
        raise _error(f"network error {what}: {exc}", http_status=None, code=type(exc).__name__) from exc
