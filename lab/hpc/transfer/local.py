"""The embedded default backend: verified, resumable copies between local directories.

See :mod:`lab.hpc.transfer` for endpoints (a local directory each), units and errors.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lab.hpc.errors import ArgumentError, TransferError
from lab.hpc.transfer.base import TransferBackend, TransferRequest, TransferState, TransferStatus, _error, check_bandwidth, check_wait_args

__all__ = ["LocalTransfer", "sha256_file"]

_MiB = 1024 * 1024


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
        check_bandwidth("LocalTransfer", "bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        check_bandwidth("LocalTransfer", "default_bandwidth_bytes_per_s", default_bandwidth_bytes_per_s, optional=False)
        for name, value, low in (("chunk_size", chunk_size, 1), ("retries", retries, 0), ("max_workers", max_workers, 1),
                                 ("min_measured_bytes", min_measured_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ArgumentError("LocalTransfer", name, value, f"must be an integer >= {low}")
        if not (isinstance(latency_s, (int, float)) and latency_s >= 0):
            raise ArgumentError("LocalTransfer", "latency_s", latency_s, "must be a number of seconds >= 0")
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
        check_wait_args("LocalTransfer.wait", timeout_s, poll_s)
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


