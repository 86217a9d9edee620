"""The types every data-movement backend shares and the :class:`TransferBackend` interface.

See :mod:`lab.hpc.transfer` for endpoints, units and errors.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.hpc.errors import ArgumentError, TransferError

__all__ = ["TransferItem", "TransferRequest", "TransferState", "TransferStatus", "TransferBackend", "TERMINAL_TRANSFER_STATES"]

_MiB = 1024 * 1024


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
        check_wait_args(f"{type(self).__name__}.wait", timeout_s, poll_s)
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

        Raises :class:`~lab.hpc.errors.ArgumentError` (a ValueError) for a negative or non-numeric size.
        """
        if isinstance(n_bytes, bool) or not (isinstance(n_bytes, (int, float)) and n_bytes >= 0):
            raise ArgumentError(f"{type(self).__name__}.estimate_s", "n_bytes", n_bytes, "must be a number of bytes >= 0")
        return float(self.latency_s) + float(n_bytes) / float(self.bandwidth_bytes_per_s())

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


def check_wait_args(where: str, timeout_s: float, poll_s: float) -> None:
    """Refuse a negative (or NaN) ``timeout_s`` / ``poll_s`` with :class:`~lab.hpc.errors.ArgumentError`."""
    for name, value in (("timeout_s", timeout_s), ("poll_s", poll_s)):
        if not (isinstance(value, (int, float)) and value >= 0):
            raise ArgumentError(where, name, value, "must be a number of seconds >= 0")


def check_bandwidth(where: str, name: str, value: float | None, *, optional: bool = True) -> None:
    """Refuse a bandwidth that is not a positive number (None allowed when ``optional``)."""
    if value is None and optional:
        return
    if not (isinstance(value, (int, float)) and value > 0):
        raise ArgumentError(where, name, value, "must be a positive number of bytes per second")
