"""The memory that repair reads and changes: MemTX's store (:mod:`lab.provenance.txn`) seen as an agent's
key-value memory.

:class:`MemTXMemory` keeps every memory record in a :class:`~lab.provenance.txn.MemTXStore` (SQLite by
default, PostgreSQL through a DSN): each write is a MemTX transaction through its validate-and-commit pipeline,
each status change a lifecycle transition in the store's version table and audit log, and a repair runs inside
one database transaction (:meth:`MemTXMemory.atomic`), so a refused repair leaves the store exactly as it was.

A :class:`MemoryRecord` (what the runner, planner and replay see) is a MemTX ``belief``:

============== ==================================================================================================
MemoryRecord   MemTX record
============== ==================================================================================================
``id``         ``id`` (kept through every status change: deactivate, delete and quarantine are transitions)
``key``        ``entity`` (the part before the first ``/``) and ``attribute`` (the rest): the slot
``value``      ``value``
``time``       ``observed_at`` (the run's logical step clock; negative for what a prior session left)
``trust``      ``evidence.authority`` (writer confidence 1.0: the agent stores what it read)
``session``    ``permission.owner``
``step``       ``evidence.source`` (the session's name for a prior session's record)
============== ==================================================================================================

A record's ``status`` (:data:`STATUSES`) is its MemTX lifecycle state:

=============== ====================== ===============================================================================
status          MemTX state            meaning
=============== ====================== ===============================================================================
``active``      ``committed``          readable; :meth:`MemTXMemory.resolve` returns the slot's record with the
                                       latest ``time`` (several may hold the same value)
``superseded``  ``superseded``         replaced by a newer write of another value (MemTX's own supersession);
                                       reinstated (:meth:`~lab.provenance.txn.MemTXStore.reinstate`) when the
                                       record that superseded it is removed
``deactivated`` ``quarantined``        taken out of use by a repair, to be re-derived (MemTX: "rebuilt from
                                       surviving sources"); reinstated when re-derived unchanged
``quarantined`` ``revoked``            a poisoned record: never read again, content kept for audit
``deleted``     ``revoked`` + erased   a misattributed record about someone else: the value erased
                                       (:meth:`~lab.provenance.txn.MemTXStore.erase`); id, history and reason stay
=============== ====================== ===============================================================================

The agents' memory policy is "the newest observation of a slot wins", so the store runs MemTX's pipeline with
semantic-conflict adjudication off (:data:`AGENT_MEMORY`; evidence, validity, permission and dependency checks
stay on): with adjudication a forum post (authority 0.3) could never overwrite a catalogue price, and two reads
of a reservation from different steps (equal authority, different sources) would conflict, so neither the
benchmark's failures nor the recorded tau-bench runs could happen as they did.

(Dependency-guided rollback repair, arXiv 2608.10502, section 3: the planner's deactivate / delete / quarantine /
preserve; MemTX, arXiv 2607.23929: the store, its lifecycle and audit log.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.provenance.errors import LifecycleError, MemTXError, RepairError, UnknownNodeError
from lab.provenance.txn import MEMTX, Features, MemTXStore, State, make_record

__all__ = ["STATUSES", "AGENT_MEMORY", "MemoryRecord", "MemTXMemory"]

STATUSES = ("active", "superseded", "deactivated", "quarantined", "deleted")

#: The MemTX features of an agent's memory: all on except semantic-conflict adjudication (module docstring).
AGENT_MEMORY: Features = MEMTX.without("conflict")

_REVOKED_AS = ("quarantined", "deleted")  # the reason prefix tells the two revoked statuses apart


@dataclass(frozen=True)
class MemoryRecord:
    """One persistent memory record as repair sees it (module docstring for where each field lives in MemTX).

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


def _slot(key: str) -> tuple[str, str]:
    ent, _, attr = key.partition("/")
    return ent, attr


_ROWS = ("SELECT r.body, h.state, v.reason FROM records r JOIN heads h ON h.id = r.id JOIN versions v ON v.id = h.id AND v.n = h.n")


class MemTXMemory:
    """An agent's memory on a :class:`~lab.provenance.txn.MemTXStore` (module docstring).

    Parameters
    ----------
    where : str or Path
        Where a new store lives: an SQLite file, ``":memory:"`` (default) or a PostgreSQL DSN.
    store : MemTXStore, optional
        An existing store to use instead (its features should be :data:`AGENT_MEMORY`).

    Raises
    ------
    BackendUnavailableError
        The database cannot be opened or reached.
    """

    def __init__(self, where: str | Path = ":memory:", *, store: MemTXStore | None = None):
        self.txn = store if store is not None else MemTXStore(where, features=AGENT_MEMORY)

    # -- reading

    def _view(self, body: str, state: str, reason: str) -> MemoryRecord:
        d = json.loads(body)
        st = State(state)
        if st in (State.COMMITTED, State.ACTION_SAFE):
            status = "active"
        elif st == State.SUPERSEDED:
            status = "superseded"
        elif st == State.QUARANTINED:
            status, reason = "deactivated", reason.removeprefix("deactivated: ")
        elif st == State.REVOKED:
            status = next((s for s in _REVOKED_AS if reason.startswith(s + ": ")), "quarantined")
            reason = reason.removeprefix(status + ": ")
        else:  # raw, tentative, validated: not (yet) believed
            status = "deactivated"
        ev, owner = d["evidence"], d["permission"]["owner"]
        key = d["entity"] + ("/" + d["attribute"] if d["attribute"] else "")
        return MemoryRecord(d["id"], key, d["value"], d.get("observed_at") or 0, ev["authority"], owner, None if ev["source"] == owner else ev["source"], status, reason)

    def _rows(self, where: str = "", params: tuple = ()) -> list[MemoryRecord]:
        with self.txn.db.read():
            rows = self.txn.db.q(f"{_ROWS} {where} ORDER BY r.ord", params)
        return [self._view(*r) for r in rows]

    def get(self, record_id: str) -> MemoryRecord:
        """The record ``record_id``. Raises :class:`UnknownNodeError` naming it."""
        rows = self._rows("WHERE r.id = ?", (record_id,))
        if not rows:
            raise UnknownNodeError(f"no memory record {record_id!r}")
        return rows[0]

    def __contains__(self, record_id: str) -> bool:
        with self.txn.db.read():
            return bool(self.txn.db.q("SELECT 1 FROM records WHERE id = ?", (record_id,)))

    def records(self) -> list[MemoryRecord]:
        """Every record, in the order they were written."""
        return self._rows()

    @staticmethod
    def _newest(records: list[MemoryRecord]) -> MemoryRecord | None:
        best = None
        for r in records:  # in write order: of equal times the later write wins
            if r.status == "active" and (best is None or r.time >= best.time):
                best = r
        return best

    def resolve(self, key: str) -> MemoryRecord | None:
        """The active record of ``key`` with the latest ``time`` (``None`` when the key has none)."""
        return self._newest(self._rows("WHERE r.entity = ? AND r.attribute = ? AND h.state IN ('committed', 'action_safe')", _slot(key)))

    def active(self) -> dict[str, Any]:
        """``{key: value}`` of every key's resolved record (the state a reader sees)."""
        by_key: dict[str, list[MemoryRecord]] = {}
        for r in self._rows("WHERE h.state IN ('committed', 'action_safe')"):
            by_key.setdefault(r.key, []).append(r)
        return {k: self._newest(rs).value for k, rs in by_key.items()}

    # -- writing

    def write(self, record: MemoryRecord) -> MemoryRecord:
        """Write ``record`` (status ``active``) as one MemTX transaction: staged, run through the pipeline,
        committed; a committed record of another value in its slot is superseded. A replayed write at its
        original time that is older than the slot's current record is itself superseded by that record.

        Returns
        -------
        MemoryRecord
            As stored (its status).

        Raises
        ------
        RepairError
            A record with this id exists already, a status other than ``active``, or the pipeline refused the
            write (the reasons named); nothing is written then.
        """
        if record.status != "active":
            raise RepairError(f"memory record {record.id!r}: a write is active, not {record.status!r}", step=record.id)
        if record.id in self:
            raise RepairError(f"memory record {record.id!r} exists already", step=record.id)
        ent, attr = _slot(record.key)
        try:
            rec = make_record(id=record.id, type="belief", entity=ent, attribute=attr, value=record.value,
                              evidence={"source": record.step or record.session, "authority": record.trust, "confidence": 1.0},
                              permission={"owner": record.session, "scope": "shared"}, observed_at=record.time)
        except MemTXError as e:
            raise RepairError(f"memory record {record.id!r}: {e}", step=record.id) from None
        with self.txn.atomic():
            old = self.resolve(record.key)
            tx = self.txn.begin(record.session)
            tx.stage(rec)
            res = tx.commit()
            if not res.committed:
                raise RepairError(f"MemTX refused the write of memory record {record.id!r}: {', '.join(res.reasons)}", step=record.id)
            if old is not None and old.time > record.time:
                if old.status == "active" and self.txn.state(old.id) == State.SUPERSEDED:
                    self.txn.reinstate(old.id, reason=f"newer than the replayed write {record.id}")
                self.txn.transition(record.id, State.SUPERSEDED, reason=f"superseded by {old.id}")
        return self.get(record.id)

    def set_status(self, record_id: str, status: str, reason: str) -> MemoryRecord:
        """Move a record to ``status`` (one of :data:`STATUSES`; module docstring for the MemTX transition each
        takes) with ``reason``; the id stays. Returns the record as stored.

        Raises
        ------
        RepairError
            A status outside :data:`STATUSES`, or a move MemTX's lifecycle does not allow (out of a revoked
            record: a quarantined or deleted one stays so), naming the record.
        UnknownNodeError
            No such record.
        """
        if status not in STATUSES:
            raise RepairError(f"status {status!r} is not one of {STATUSES}", step=record_id)
        cur = self.get(record_id)
        try:
            with self.txn.atomic():
                if status == "active":
                    self.txn.reinstate(record_id, reason=reason)
                elif status == "deleted":
                    self.txn.erase(record_id, reason=f"deleted: {reason}")
                elif cur.status != status:
                    new = {"superseded": State.SUPERSEDED, "deactivated": State.QUARANTINED, "quarantined": State.REVOKED}[status]
                    self.txn.transition(record_id, new, reason=f"{status}: {reason}" if status != "superseded" else reason)
        except LifecycleError as e:
            raise RepairError(f"memory record {record_id!r} cannot go from {cur.status} to {status}: {e}", step=record_id) from None
        return self.get(record_id)

    # -- whole store

    @contextmanager
    def atomic(self) -> Iterator[MemTXMemory]:
        """One MemTX database transaction spanning the block (:meth:`lab.provenance.txn.MemTXStore.atomic`): an
        exception rolls back every write and status change made inside it."""
        with self.txn.atomic():
            yield self

    def copy(self) -> MemTXMemory:
        """A copy of the whole store (records, lifecycle history, audit log) in a fresh in-memory SQLite database
        (:meth:`lab.provenance.txn.MemTXStore.clone`): a what-if run on it leaves this one alone."""
        return MemTXMemory(store=self.txn.clone())

    def close(self) -> None:
        self.txn.close()
