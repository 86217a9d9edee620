"""Globus Transfer behind :class:`~lab.hpc.transfer.base.TransferBackend`, through a ``globus_sdk.TransferClient``.

See :mod:`lab.hpc.transfer` for endpoints (collection UUIDs), units and errors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from lab.hpc.transfer.base import TransferBackend, TransferRequest, TransferState, TransferStatus, _error, check_bandwidth

__all__ = ["GlobusTransfer"]

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
        check_bandwidth("GlobusTransfer", "bandwidth_bytes_per_s", bandwidth_bytes_per_s)
        check_bandwidth("GlobusTransfer", "default_bandwidth_bytes_per_s", default_bandwidth_bytes_per_s, optional=False)
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
