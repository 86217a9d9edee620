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
(a negative size or timeout, a non-positive bandwidth) raise
:class:`~lab.hpc.errors.ArgumentError` naming the argument (also a ValueError).

Modules
-------
:mod:`lab.hpc.transfer.base` (the types and :class:`TransferBackend`), :mod:`lab.hpc.transfer.local`
(:class:`LocalTransfer`, :func:`sha256_file`), :mod:`lab.hpc.transfer.globus`
(:class:`GlobusTransfer`); every public name is importable from :mod:`lab.hpc.transfer` itself.
"""

from lab.hpc.transfer.base import TERMINAL_TRANSFER_STATES, TransferBackend, TransferItem, TransferRequest, TransferState, TransferStatus
from lab.hpc.transfer.globus import GlobusTransfer
from lab.hpc.transfer.local import LocalTransfer, sha256_file

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
