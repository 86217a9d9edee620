"""MemTX: transactional belief commit for shared agent memory (arXiv 2607.23929), on SQLite or PostgreSQL.

"A memory write is not a belief commit." Records carry evidence (source, authority weight, writer
confidence), a permission block (owner, reader and writer roles, scope), ``derived_from`` parents, a type and
a validity interval on a logical clock. Writes are staged in snapshot-isolated transactions and admitted by a
validate-and-commit pipeline; irreversible tool calls pass an action gate; retracting a record repairs what was
derived from it, by type.

Public API
----------
::

    from lab.provenance.txn import MemTXStore, Tier

    store = MemTXStore("memory.db")                      # SQLite, one file, WAL
    store = MemTXStore("postgresql://postgres@127.0.0.1:5432/postgres")   # or a PostgreSQL server
    store.register_tool("refund", irreversible=True, run=do_refund)
    store.register_tool("hold_seat", irreversible=False, run=hold, compensate=release)

    tx = store.begin("agent-a", tier=Tier.EXTERNAL_ACTION)   # tier: set by the harness, not the agent
    tx.stage({...record fields...})                       # -> Record, state "tentative"
    tx.read("reservation:ABC", "status")                  # -> [View(record, state)] at the tier's isolation
    tx.call_tool("refund", {...}, uses=[rid])             # -> ToolCall(decision=GateDecision(...), action=id)
    result = tx.commit()                                  # -> CommitResult(committed, outcomes=[Outcome(record, state, reason)])
    tx.abort()                                            # -> CascadeReport

    report = store.retract(record_id)                     # -> CascadeReport (roots, steps, revoked, quarantined,
                                                          #    compensated, leaked, as_dict())
    store.request_revocation(record_id)                   # pending: blocks derivations and gated calls until retract
    store.state(rid); store.history(rid); store.audit(); store.descendants(rid); store.effects()
    store.mirror(provenance_graph)                        # every record and transition into lab.provenance.graph

:meth:`MemTXStore.retract` is the entry point for rollback repair: it revokes the record and walks its
transitive ``derived_from`` descendants: belief -> ``revoked``; summary, profile, index entry, shared copy ->
``quarantined``; tool action -> compensated (reversible) or logged as a leaked irreversible effect. An aborted
transaction is repaired by the same routine. Every step is in the audit log (``store.audit()``).

Snapshot isolation and its two backends
---------------------------------------
The store is multi-version: every lifecycle transition appends a row ``(record, n, seq, state, reason, tx)``
stamped with the logical clock ``seq``, which each write advances by one inside its database transaction. A
MemTX transaction's snapshot is the clock value when it began; its reads return, per record, the newest version
at or before the snapshot (plus its own staging), so it sees the store as it was when it began, whatever other
processes commit meanwhile. A commit is one database transaction: on SQLite ``BEGIN IMMEDIATE`` (one writer at
a time, WAL readers never blocked); on PostgreSQL ``REPEATABLE READ``, where two committers both update the
clock row and the later one gets a serialization failure, upon which the store re-runs the whole pipeline on a
fresh database snapshot. Either way the pipeline runs against the latest committed state, serially.

*Write-write conflict*: two transactions writing different values into the same entity/attribute slot from
overlapping snapshots: the first to commit wins; the later committer's rival committed after its snapshot, so
it fails with ``stale_late_write`` and aborts (first-committer-wins, checked before any authority comparison).
*Write skew* (two transactions each read a slot the other writes, and write disjoint slots): permitted under
plain snapshot isolation, as in PostgreSQL's own REPEATABLE READ, except where the written record declares the
read as a ``derived_from`` parent (dependency stability then refuses it when the parent changed).
``store.begin(..., validate_reads=True)`` makes a transaction serialisable for what it read: any record or
slot it read that another transaction changed after its snapshot aborts it with ``read_write_conflict``.

Submodules
----------
records
    Schema, lifecycle (:data:`TRANSITIONS`), isolation levels, tiers, reasons.
backends
    :class:`SQLiteBackend`, :class:`PostgresBackend`.
store
    :class:`MemTXStore`, :class:`Transaction`, the pipeline, gate and cascade.
model
    The bounded exhaustive enumerator (invariants I1, I2, G3) and trace replay on the real store.
pgserver
    A throwaway local PostgreSQL server (tests, benchmark, notebook).
"""

from lab.provenance.txn.backends import Backend, PostgresBackend, SQLiteBackend, open_backend
from lab.provenance.txn.records import (
    ACTIVE,
    INFINITY,
    TRANSITIONS,
    Evidence,
    Isolation,
    Permission,
    Reason,
    Record,
    RecordType,
    Scope,
    State,
    Tier,
    make_record,
)
from lab.provenance.txn.store import (
    MEMTX,
    CascadeReport,
    CascadeStep,
    CommitResult,
    Features,
    GateDecision,
    MemTXStore,
    Outcome,
    Tool,
    ToolCall,
    Transaction,
    View,
)

__all__ = [
    "ACTIVE",
    "INFINITY",
    "TRANSITIONS",
    "Backend",
    "PostgresBackend",
    "SQLiteBackend",
    "open_backend",
    "Evidence",
    "Isolation",
    "Permission",
    "Reason",
    "Record",
    "RecordType",
    "Scope",
    "State",
    "Tier",
    "make_record",
    "MEMTX",
    "CascadeReport",
    "CascadeStep",
    "CommitResult",
    "Features",
    "GateDecision",
    "MemTXStore",
    "Outcome",
    "Tool",
    "ToolCall",
    "Transaction",
    "View",
]
