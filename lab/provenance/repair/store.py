"""The memory state that repair reads and changes, behind a small protocol.

:class:`MemoryStore` is the interface the runner, the planner and the replay use; :class:`DictMemoryStore` is a
small in-process implementation of it. MemTX's transactional store (``lab.provenance.txn``, issue #19) is meant
to plug in behind the same protocol (``write``, ``get``, ``records``, ``resolve``, ``set_status``,
``snapshot``/``restore``); until it lands the runner uses this one.

A record's ``status`` is one of :data:`STATUSES`:

``active``        readable; :meth:`MemoryStore.resolve` returns the newest active record of a key.
``superseded``    replaced by a newer write of the same key (kept; the repair reinstates it when the record that
                  superseded it is removed).
``deactivated``   taken out of use by a repair (kept, with the reason; the paper's *deactivate*).
``quarantined``   kept for audit only, never read (a poisoned record).
``deleted``       its value erased (a misattributed record about someone else); id and reason remain.

(Dependency-guided rollback repair, arXiv 2608.10502, section 3: the planner's deactivate / delete / quarantine /
preserve.)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from lab.provenance.errors import RepairError, UnknownNodeError

__all__ = ["STATUSES", "MemoryRecord", "MemoryStore", "DictMemoryStore"]

STATUSES = ("active", "superseded", "deactivated", "quarantined", "deleted")


@dataclass(frozen=True)
class MemoryRecord:
    """One persistent memory record.

    Parameters
    ----------
    id : str
        Unique record id (the trace ids refer to it).
    key : str
        What the record is about, ``"<entity>/<field>"`` (e.g. ``"order:O1042/status"``).
    value : JSON value
        What it says.
    time : int
        The run's logical clock when written (prior-session records carry negative times).
    trust : float
        In [0, 1]: the trust of the evidence it was written from.
    session : str
        ``"prior"`` for records a previous session left, else the run id.
    step : str, optional
        The step that wrote it (``None`` for prior-session records).
    status : str
        One of :data:`STATUSES`.
    reason : str
        Why the status was last changed.
    """

    id: str
    key: str
    value: Any
    time: int
    trust: float = 1.0
    session: str = "prior"
    step: str | None = None
    status: str = "active"
    reason: str = ""

    @property
    def field(self) -> str:
        """The last component of the key (``status`` of ``order:O1/status``)."""
        return self.key.rsplit("/", 1)[-1]


@runtime_checkable
class MemoryStore(Protocol):
    """What repair needs of a memory store (MemTX's store is meant to provide the same)."""

    def write(self, record: MemoryRecord) -> MemoryRecord: ...

    def get(self, record_id: str) -> MemoryRecord: ...

    def records(self) -> list[MemoryRecord]: ...

    def resolve(self, key: str) -> MemoryRecord | None: ...

    def set_status(self, record_id: str, status: str, reason: str) -> MemoryRecord: ...

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...


@dataclass
class DictMemoryStore:
    """An in-process :class:`MemoryStore` (records in insertion order).

    A write of a key that has an active record supersedes it (``status="superseded"``); :meth:`resolve` returns
    the newest active record of a key. :meth:`snapshot` / :meth:`restore` make a repair all-or-nothing.

    Raises
    ------
    UnknownNodeError
        :meth:`get` / :meth:`set_status` of an id the store does not hold (the message names it).
    ValueError
        A duplicate id, or a status outside :data:`STATUSES`.
    """

    _records: dict[str, MemoryRecord] = field(default_factory=dict)

    def write(self, record: MemoryRecord) -> MemoryRecord:
        if record.id in self._records:
            raise RepairError(f"memory record {record.id!r} exists already", step=record.id)
        if record.status == "active":
            old = self.resolve(record.key)
            if old is not None and old.time > record.time:  # a replayed write at its original time, older than the current one
                record = replace(record, status="superseded", reason=f"superseded by {old.id}")
            elif old is not None:
                self._records[old.id] = replace(old, status="superseded", reason=f"superseded by {record.id}")
        self._records[record.id] = record
        return record

    def get(self, record_id: str) -> MemoryRecord:
        try:
            return self._records[record_id]
        except KeyError:
            raise UnknownNodeError(f"no memory record {record_id!r}") from None

    def __contains__(self, record_id: str) -> bool:
        return record_id in self._records

    def records(self) -> list[MemoryRecord]:
        return list(self._records.values())

    def resolve(self, key: str) -> MemoryRecord | None:
        best = None
        for r in self._records.values():
            if r.key == key and r.status == "active" and (best is None or r.time >= best.time):
                best = r
        return best

    def set_status(self, record_id: str, status: str, reason: str) -> MemoryRecord:
        if status not in STATUSES:
            raise RepairError(f"status {status!r} is not one of {STATUSES}", step=record_id)
        r = replace(self.get(record_id), status=status, reason=reason)
        if status == "deleted":
            r = replace(r, value=None)
        self._records[record_id] = r
        return r

    def active(self) -> dict[str, Any]:
        """``{key: value}`` of every key's resolved record (the state a reader sees)."""
        out: dict[str, Any] = {}
        for r in self._records.values():
            if r.status == "active":
                cur = self.resolve(r.key)
                out[r.key] = cur.value
        return out

    def inject(self, record_id: str, value: Any) -> MemoryRecord:
        """Overwrite a record's value in place (benchmark fault injection only: a corrupted memory write)."""
        r = replace(self.get(record_id), value=value)
        self._records[record_id] = r
        return r

    def snapshot(self) -> dict[str, MemoryRecord]:
        return dict(self._records)

    def restore(self, snapshot: dict[str, MemoryRecord]) -> None:
        self._records = dict(snapshot)

    def copy(self) -> DictMemoryStore:
        return DictMemoryStore(copy.copy(self._records))
