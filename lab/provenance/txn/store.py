"""The MemTX store: snapshot-isolated belief transactions, the validate-and-commit pipeline, the action gate
and typed cascading repair (MemTX, arXiv 2607.23929, sections 2.3-2.7 of ``shared/notes/papers-memtx.md``).

See :mod:`lab.provenance.txn` for the public API and the isolation argument.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx

from lab.provenance.errors import (
    DerivationCycleError,
    PermissionWideningError,
    RecordSchemaError,
    TransactionStateError,
    UnknownRecordError,
    UnknownToolError,
)
from lab.provenance.txn.backends import SCHEMA, Backend, open_backend, retrying
from lab.provenance.txn.records import (
    QUARANTINE_ON_CASCADE,
    TIER_ISOLATION,
    VISIBLE,
    Isolation,
    Reason,
    Record,
    RecordType,
    Scope,
    State,
    Tier,
    check_transition,
    make_record,
    parse_state,
)

__all__ = [
    "Features",
    "MEMTX",
    "Tool",
    "View",
    "Outcome",
    "CommitResult",
    "GateDecision",
    "ToolCall",
    "CascadeStep",
    "CascadeReport",
    "MemTXStore",
    "Transaction",
]

#: The store's tables (:data:`~lab.provenance.txn.backends.SCHEMA`), in creation order.
TABLES = tuple(stmt.split()[5] for stmt in SCHEMA if stmt.startswith("CREATE TABLE"))

EVIDENCE_MIN_CONFIDENCE = 0.6  # the paper's evidence threshold (writer confidence)
EVIDENCE_AUTHORITY_OVERRIDE = 0.9  # ... unless the source's authority is at least this


@dataclass(frozen=True)
class Features:
    """Which parts of the protocol are on (all, for MemTX); the benchmark's baselines and ablations and the
    model checker's deliberately broken variants switch single ones off.

    ``maturity_reads``: reads honour the tier's isolation level (off: every read is ``raw_read``).
    ``snapshot``: reads see the transaction's snapshot (off: the latest state, as a non-transactional store).
    ``evidence``, ``validity``, ``conflict`` (semantic-conflict adjudication, stale-late-write abort included),
    ``permission`` (permission inheritance), ``stability`` (dependency stability): the commit checks.
    ``gate``: the action gate on irreversible tools. ``cascade``: typed cascading repair (off: only the retracted
    record itself changes); ``cascade_summaries``: the cascade repairs summary-like records (off: a broken
    variant that skips them). ``staging``: writes are staged until commit (off: every write commits at once,
    a write-immediately memory).
    """

    maturity_reads: bool = True
    snapshot: bool = True
    evidence: bool = True
    validity: bool = True
    conflict: bool = True
    permission: bool = True
    stability: bool = True
    gate: bool = True
    cascade: bool = True
    cascade_summaries: bool = True
    staging: bool = True

    def without(self, *names: str) -> "Features":
        return replace(self, **{n: False for n in names})


MEMTX = Features()


@dataclass(frozen=True)
class Tool:
    """A registered domain tool: ``irreversible`` ones pass the action gate; ``compensate(args)`` undoes a
    reversible one's effect during a cascade."""

    name: str
    irreversible: bool
    run: Callable[[dict], Any] | None = None
    compensate: Callable[[dict], Any] | None = None


@dataclass(frozen=True)
class View:
    """A record as a read returns it: the immutable content and its lifecycle state in the reader's view."""

    record: Record
    state: State

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def value(self) -> Any:
        return self.record.value


@dataclass(frozen=True)
class Outcome:
    """One staged record's result of the pipeline: its new state and, on failure, the machine-readable reason
    (``check`` names the pipeline step; ``detail`` e.g. the rival's id)."""

    record: str
    state: State
    reason: Reason | None = None
    check: str | None = None
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CommitResult:
    """``committed``: the whole transaction committed; ``outcomes`` per staged record in staging order;
    ``seq``: the logical time of the commit; ``cascade``: the abort's repair when it did not commit."""

    tx: str
    committed: bool
    outcomes: tuple[Outcome, ...]
    seq: int
    cascade: "CascadeReport | None" = None

    @property
    def reasons(self) -> list[str]:
        return [o.reason.value for o in self.outcomes if o.reason is not None]


@dataclass(frozen=True)
class GateDecision:
    """The action gate's answer: ``allowed``, and the machine-readable ``reasons`` when refused."""

    allowed: bool
    reasons: tuple[Reason, ...] = ()
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """A tool call's result: the gate decision, the ``tool_action`` record written when it ran, and what the tool returned."""

    tool: str
    decision: GateDecision
    action: str | None = None
    result: Any = None


@dataclass(frozen=True)
class CascadeStep:
    """One step of the typed repair: ``record`` (its ``type``) went ``old -> new`` because of ``reason``."""

    record: str
    type: RecordType
    old: State
    new: State
    reason: Reason


@dataclass(frozen=True)
class CascadeReport:
    """What a retraction or an abort repaired (one routine for both).

    ``roots``: the retracted / aborted records; ``steps`` in the order taken; ``revoked``, ``quarantined``,
    ``compensated`` and ``leaked`` (irreversible effects that could only be logged): record ids; ``seq``: the
    logical time of the repair.
    """

    roots: tuple[str, ...]
    steps: tuple[CascadeStep, ...]
    seq: int

    def _ids(self, reason: Reason) -> list[str]:
        return [s.record for s in self.steps if s.reason == reason]

    @property
    def revoked(self) -> list[str]:
        return [s.record for s in self.steps if s.new == State.REVOKED and s.reason not in (Reason.COMPENSATED, Reason.LEAKED_IRREVERSIBLE_EFFECT)]

    @property
    def quarantined(self) -> list[str]:
        return [s.record for s in self.steps if s.new == State.QUARANTINED]

    @property
    def compensated(self) -> list[str]:
        return self._ids(Reason.COMPENSATED)

    @property
    def leaked(self) -> list[str]:
        return self._ids(Reason.LEAKED_IRREVERSIBLE_EFFECT)

    def as_dict(self) -> dict:
        return {
            "roots": list(self.roots),
            "seq": self.seq,
            "steps": [{"record": s.record, "type": s.type.value, "old": s.old.value, "new": s.new.value, "reason": s.reason.value} for s in self.steps],
        }


def _body(r: Record) -> str:
    return r.model_dump_json()


def _record(body: str) -> Record:
    return Record.model_validate_json(body)


class MemTXStore:
    """A MemTX store on one backend (see :mod:`lab.provenance.txn`).

    Parameters
    ----------
    where : str, Path or Backend
        An SQLite file path (default ``":memory:"``), a PostgreSQL DSN/URI, or a backend instance.
    features : Features
        The protocol's parts (default: all on).
    hook : callable, optional
        ``hook(point)`` is called at named points inside a commit (the crash test kills the process there).

    Raises
    ------
    BackendUnavailableError
        The database cannot be opened or reached.
    """

    def __init__(self, where: str | Path | Backend = ":memory:", *, features: Features = MEMTX, hook: Callable[[str], None] | None = None):
        self.db = where if isinstance(where, Backend) else open_backend(where)
        self.features = features
        self.hook = hook
        self.tools: dict[str, Tool] = {}
        self._ord = itertools.count()
        retrying(self.db.init_schema)

    # -- plumbing

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "MemTXStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _point(self, name: str) -> None:
        if self.hook is not None:
            self.hook(name)

    def _tick(self) -> int:
        """Advance the logical clock inside the current write transaction; the new time."""
        self.db.x("UPDATE clock SET seq = seq + 1 WHERE k = 0")
        return int(self.db.q("SELECT seq FROM clock WHERE k = 0")[0][0])

    def now(self) -> int:
        """The logical clock (the time of the last write)."""
        with self.db.read():
            return int(self.db.q("SELECT seq FROM clock WHERE k = 0")[0][0])

    def _set_state(self, rid: str, new: State, reason: Reason | str, seq: int, tx: str | None, audit: list) -> State:
        head = self.db.q("SELECT state, n FROM heads WHERE id = ?", (rid,))
        old = State(head[0][0]) if head else None
        check_transition(rid, old, new)
        n = head[0][1] + 1 if head else 0
        reason = reason.value if isinstance(reason, Reason) else reason
        self.db.x("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?)", (rid, n, seq, new.value, reason, tx))
        if head:
            self.db.x("UPDATE heads SET state = ?, n = ?, seq = ? WHERE id = ?", (new.value, n, seq, rid))
        else:
            self.db.x("INSERT INTO heads VALUES (?, ?, ?, ?)", (rid, new.value, n, seq))
        audit.append(("transition", rid, {"old": old.value if old else None, "new": new.value, "reason": reason, "tx": tx}))
        return old

    def _write_audit(self, seq: int, audit: list) -> None:
        for i, (op, rid, detail) in enumerate(audit):
            self.db.x("INSERT INTO audit VALUES (?, ?, ?, ?, ?)", (seq, i, op, rid, json.dumps(detail, sort_keys=True)))

    def _insert(self, r: Record, tx: str | None, seq: int) -> None:
        self.db.x("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (r.id, r.type.value, r.entity, r.attribute, _body(r), tx, seq, next(self._ord) + seq * 1_000_000))
        for p in r.derived_from:
            self.db.x("INSERT INTO parents VALUES (?, ?)", (r.id, p))

    # -- reads outside a transaction

    def record(self, rid: str) -> Record:
        """The record's content. Raises :class:`UnknownRecordError`."""
        with self.db.read():
            rows = self.db.q("SELECT body FROM records WHERE id = ?", (rid,))
        if not rows:
            raise UnknownRecordError(f"no record {rid!r}", record=rid)
        return _record(rows[0][0])

    def state(self, rid: str) -> State:
        """The record's current lifecycle state. Raises :class:`UnknownRecordError`."""
        with self.db.read():
            rows = self.db.q("SELECT state FROM heads WHERE id = ?", (rid,))
        if not rows:
            raise UnknownRecordError(f"no record {rid!r}", record=rid)
        return State(rows[0][0])

    def states(self) -> dict[str, State]:
        """Every record's current state (id -> state)."""
        with self.db.read():
            return {i: State(s) for i, s in self.db.q("SELECT id, state FROM heads")}

    def history(self, rid: str) -> list[tuple[int, State, str]]:
        """The record's transitions: ``(logical time, state, reason)`` oldest first."""
        with self.db.read():
            return [(int(s), State(st), r) for s, st, r in self.db.q("SELECT seq, state, reason FROM versions WHERE id = ? ORDER BY n", (rid,))]

    def audit(self, record: str | None = None) -> list[dict]:
        """The audit log (every transition, gate decision, compensation and leaked effect), oldest first."""
        with self.db.read():
            if record is None:
                rows = self.db.q("SELECT seq, i, op, record, detail FROM audit ORDER BY seq, i")
            else:
                rows = self.db.q("SELECT seq, i, op, record, detail FROM audit WHERE record = ? ORDER BY seq, i", (record,))
        return [{"seq": int(s), "i": i, "op": op, "record": r, **json.loads(d)} for s, i, op, r, d in rows]

    def records(self) -> list[Record]:
        """Every record, in creation order."""
        with self.db.read():
            return [_record(b) for (b,) in self.db.q("SELECT body FROM records ORDER BY ord")]

    def pending(self) -> set[str]:
        """Records with a revocation requested but not yet carried out."""
        with self.db.read():
            return {i for (i,) in self.db.q("SELECT id FROM pending")}

    def descendants(self, rid: str) -> list[str]:
        """Transitive ``derived_from`` descendants of ``rid`` (breadth-first, each once)."""
        with self.db.read():
            return self._descendants([rid])

    def _descendants(self, roots: Iterable[str]) -> list[str]:
        seen, out, frontier = set(roots), [], list(roots)
        while frontier:
            marks = ",".join("?" * len(frontier))
            kids = [c for (c,) in self.db.q(f"SELECT DISTINCT child FROM parents WHERE parent IN ({marks}) ORDER BY child", frontier)]
            frontier = [c for c in kids if c not in seen]
            seen.update(frontier)
            out.extend(frontier)
        return out

    def _ancestors(self, parents: Iterable[str]) -> set[str]:
        seen, frontier = set(parents), list(parents)
        while frontier:
            marks = ",".join("?" * len(frontier))
            ups = [p for (p,) in self.db.q(f"SELECT parent FROM parents WHERE child IN ({marks})", frontier)]
            frontier = [p for p in ups if p not in seen]
            seen.update(frontier)
        return seen

    # -- tools

    def register_tool(self, name: str, *, irreversible: bool, run: Callable[[dict], Any] | None = None, compensate: Callable[[dict], Any] | None = None) -> Tool:
        """Register a domain tool with the gate; a reversible tool should come with its ``compensate(args)``.

        Reversibility is assigned statically (the paper's choice). Returns the :class:`Tool`.
        """
        tool = Tool(name, irreversible, run, compensate)
        self.tools[name] = tool
        return tool

    # -- writes outside a transaction

    def begin(self, agent: str, *, tier: Tier | str = Tier.LOW, isolation: Isolation | str | None = None, validate_reads: bool = False) -> "Transaction":
        """Open a transaction for ``agent`` at risk ``tier`` (set by the trusted harness, not by the agent).

        Parameters
        ----------
        isolation : Isolation, optional
            Override of the tier's read level (:data:`~lab.provenance.txn.records.TIER_ISOLATION`).
        validate_reads : bool
            Also abort on a read-write conflict (a record or slot this transaction read changed after its
            snapshot): serialisable for what it read, so write skew is refused. Default: snapshot isolation,
            which permits write skew between records that do not derive from each other.
        """
        try:
            tier = Tier(tier)
            isolation = Isolation(isolation) if isolation is not None else TIER_ISOLATION[tier]
        except ValueError as exc:
            raise RecordSchemaError(str(exc), field="tier" if not isinstance(tier, Tier) else "isolation") from None
        tid = f"tx-{uuid.uuid4().hex[:12]}"

        def go():
            with self.db.write():
                snap = int(self.db.q("SELECT seq FROM clock WHERE k = 0")[0][0])
                self.db.x("INSERT INTO txs VALUES (?, ?, ?, ?, ?, ?)", (tid, agent, tier.value, snap, "active", None))
            return snap

        snap = retrying(go)
        return Transaction(self, tid, agent, tier, isolation, snap, validate_reads)

    def observe(self, record: Record | Mapping[str, Any]) -> Record:
        """Record an observation in state ``raw`` (recorded, not believed: no read above ``raw_read`` returns it)."""
        r = record if isinstance(record, Record) else make_record(**record)

        def go():
            with self.db.write():
                self._check_parents(r, {})
                seq = self._tick()
                self._insert(r, None, seq)
                audit: list = []
                self._set_state(r.id, State.RAW, "observed", seq, None, audit)
                self._write_audit(seq, audit)

        retrying(go)
        return r

    def transition(self, rid: str, new: State | str, *, reason: str) -> None:
        """Move one record along a listed lifecycle edge (e.g. a reviewer releasing a quarantined record back to
        ``tentative``). Raises :class:`RecordSchemaError` (unknown state), :class:`LifecycleError` (not listed),
        :class:`UnknownRecordError`."""
        new = parse_state(new, record=rid)

        def go():
            with self.db.write():
                if not self.db.q("SELECT 1 FROM heads WHERE id = ?", (rid,)):
                    raise UnknownRecordError(f"no record {rid!r}", record=rid)
                seq = self._tick()
                audit: list = []
                self._set_state(rid, new, reason, seq, None, audit)
                self._write_audit(seq, audit)

        retrying(go)

    def reinstate(self, rid: str, *, reason: str) -> State:
        """Return a ``superseded`` or ``quarantined`` record to ``committed`` (rollback repair: the record that
        superseded it was removed, or a record taken out of use was re-derived unchanged).

        A superseded record moves ``superseded -> committed``; a quarantined one takes the listed path
        ``tentative -> validated -> committed``. A committed or action-safe record is left as it is. The caller
        takes a rival out of the slot first (no adjudication runs here). Returns the state it had.

        Raises
        ------
        UnknownRecordError
        LifecycleError
            The record is revoked (terminal), or one of its transitive ``derived_from`` ancestors is revoked or
            pending revocation (G3: no committed record with a revoked ancestor); the message names it.
        """
        from lab.provenance.errors import LifecycleError

        def go():
            with self.db.write():
                head = self.db.q("SELECT state FROM heads WHERE id = ?", (rid,))
                if not head:
                    raise UnknownRecordError(f"no record {rid!r}", record=rid)
                old = State(head[0][0])
                if old in (State.COMMITTED, State.ACTION_SAFE):
                    return old
                if old not in (State.SUPERSEDED, State.QUARANTINED):
                    raise LifecycleError(f"cannot reinstate a {old.value} record", record=rid, field="state")
                parents = _record(self.db.q("SELECT body FROM records WHERE id = ?", (rid,))[0][0]).derived_from
                for a in sorted(self._ancestors(parents)) if parents else ():
                    st = self.db.q("SELECT state FROM heads WHERE id = ?", (a,))
                    if (st and st[0][0] == State.REVOKED.value) or self.db.q("SELECT 1 FROM pending WHERE id = ?", (a,)):
                        raise LifecycleError(f"cannot reinstate: ancestor {a!r} is revoked or pending revocation", record=rid, field="derived_from")
                seq = self._tick()
                audit: list = []
                for new in ([State.COMMITTED] if old == State.SUPERSEDED else [State.TENTATIVE, State.VALIDATED, State.COMMITTED]):
                    self._set_state(rid, new, reason, seq, None, audit)
                audit.append(("reinstate", rid, {"old": old.value, "reason": reason}))
                self._write_audit(seq, audit)
                return old

        return retrying(go)

    def erase(self, rid: str, *, reason: str) -> None:
        """Revoke ``rid`` (if it is not already) and erase its value (the stored content keeps its id, type,
        slot, evidence and permission; ``value`` becomes ``None``): a record about someone else is deleted, its
        id, history and the reason stay for audit. No cascade runs (:meth:`retract` for that).

        Raises
        ------
        UnknownRecordError
        LifecycleError
            Only through :data:`~lab.provenance.txn.records.TRANSITIONS` (every non-terminal state may be revoked).
        """

        def go():
            with self.db.write():
                rows = self.db.q("SELECT r.body, h.state FROM records r JOIN heads h ON h.id = r.id WHERE r.id = ?", (rid,))
                if not rows:
                    raise UnknownRecordError(f"no record {rid!r}", record=rid)
                seq = self._tick()
                audit: list = []
                if State(rows[0][1]) != State.REVOKED:
                    self._set_state(rid, State.REVOKED, reason, seq, None, audit)
                body = _record(rows[0][0]).model_copy(update={"value": None})
                self.db.x("UPDATE records SET body = ? WHERE id = ?", (_body(body), rid))
                audit.append(("erase", rid, {"reason": reason}))
                self._write_audit(seq, audit)

        retrying(go)

    @contextmanager
    def atomic(self) -> Iterator["MemTXStore"]:
        """One database transaction spanning the block: every store call inside it commits with the block or not
        at all. An exception leaving the block rolls back all it wrote (records, transitions, audit entries, the
        clock) and propagates; nested blocks are SQL savepoints (an inner failure undoes only the inner block).
        Other connections see nothing of the block until it ends (rollback repair runs in one, so a refused
        repair leaves the store unchanged).

        Raises
        ------
        RetryableConflict
            The outermost block could not start (another writer holds the database): retry the block.
        """
        with self.db.savepoint():
            yield self

    def dump(self) -> dict[str, list[tuple]]:
        """Every row of every table (``{table: rows}``, rows sorted): the whole store, for comparison
        (``before == after``) or :meth:`clone`."""
        with self.db.read():
            return {t: sorted((tuple(r) for r in self.db.q(f"SELECT * FROM {t}")), key=repr) for t in TABLES}

    def clone(self, where: str | Path | Backend = ":memory:") -> "MemTXStore":
        """A copy of the whole store (records, versions, audit log, clock, effects; the registered tools) in a
        fresh database at ``where`` (default: an SQLite database in memory), whichever backend this one is on.

        Raises
        ------
        BackendUnavailableError
        """
        rows = self.dump()
        other = MemTXStore(where, features=self.features)
        other.tools = dict(self.tools)
        with other.db.write():
            for t in TABLES:
                other.db.x(f"DELETE FROM {t}")
                for r in rows[t]:
                    other.db.x(f"INSERT INTO {t} VALUES ({', '.join('?' * len(r))})", r)
        return other

    def request_revocation(self, rid: str) -> None:
        """Mark ``rid`` as pending revocation: from now on no record deriving from it commits
        (dependency stability) and no irreversible action may use it, until :meth:`retract` runs."""

        def go():
            with self.db.write():
                if not self.db.q("SELECT 1 FROM heads WHERE id = ?", (rid,)):
                    raise UnknownRecordError(f"no record {rid!r}", record=rid)
                seq = self._tick()
                if not self.db.q("SELECT 1 FROM pending WHERE id = ?", (rid,)):
                    self.db.x("INSERT INTO pending VALUES (?, ?)", (rid, seq))
                self._write_audit(seq, [("revocation_requested", rid, {})])

        retrying(go)

    def retract(self, record_id: str, *, reason: str = "revoked") -> CascadeReport:
        """Revoke ``record_id`` and repair everything derived from it (the typed cascade).

        belief -> ``revoked``; summary, profile, index entry, shared copy -> ``quarantined`` (to be rebuilt from
        surviving sources); a ``tool_action`` -> compensated (its tool's ``compensate(args)`` is called) when
        reversible, else logged as a leaked irreversible effect; both end ``revoked``. Each step goes to the
        audit log. The same routine repairs an aborted transaction's staged records.

        Returns
        -------
        CascadeReport

        Raises
        ------
        UnknownRecordError
        """
        comp: list = []

        def go():
            comp.clear()
            with self.db.write():
                if not self.db.q("SELECT 1 FROM heads WHERE id = ?", (record_id,)):
                    raise UnknownRecordError(f"no record {record_id!r}", record=record_id)
                seq = self._tick()
                audit: list = [("retract", record_id, {"reason": reason})]
                report = self._cascade({record_id: State.REVOKED}, Reason.REVOKED, seq, None, audit, comp)
                self._write_audit(seq, audit)
            return report

        report = retrying(go)
        self._run_compensations(comp)
        return report

    def _run_compensations(self, comp: list) -> None:
        for tool, args in comp:
            if tool.compensate is not None:
                tool.compensate(args)

    def _cascade(self, roots: Mapping[str, State], reason: Reason, seq: int, tx: str | None, audit: list, comp: list) -> CascadeReport:
        """The one repair routine (abort and revocation): roots go to their given state, descendants by type."""
        steps: list[CascadeStep] = []
        types = {}

        def typ(rid):
            if rid not in types:
                types[rid] = RecordType(self.db.q("SELECT type FROM records WHERE id = ?", (rid,))[0][0])
            return types[rid]

        def move(rid, new, why):
            old = State(self.db.q("SELECT state FROM heads WHERE id = ?", (rid,))[0][0])
            if old == new or old == State.REVOKED:
                return
            self._set_state(rid, new, why, seq, tx, audit)
            steps.append(CascadeStep(rid, typ(rid), old, new, why))

        for rid, new in roots.items():
            why = None
            if isinstance(new, tuple):  # (state, the pipeline's reason) for a record that failed its commit
                new, why = new
            if typ(rid) == RecordType.TOOL_ACTION:
                self._repair_action(rid, seq, tx, audit, comp, move)
            else:
                move(rid, new, why or (reason if new == State.REVOKED else Reason.QUARANTINED_FOR_REBUILD))
        self.db.x(f"DELETE FROM pending WHERE id IN ({','.join('?' * len(roots))})", list(roots))
        if self.features.cascade:
            for d in self._descendants(list(roots)):
                t = typ(d)
                state = State(self.db.q("SELECT state FROM heads WHERE id = ?", (d,))[0][0])
                if state in (State.REVOKED,):
                    continue
                if t == RecordType.BELIEF:
                    move(d, State.REVOKED, Reason.REVOKED)
                elif t in QUARANTINE_ON_CASCADE:
                    if self.features.cascade_summaries and state not in (State.QUARANTINED, State.SUPERSEDED):
                        move(d, State.QUARANTINED, Reason.QUARANTINED_FOR_REBUILD)
                else:
                    self._repair_action(d, seq, tx, audit, comp, move)
        audit.append(("cascade", next(iter(roots)), {"roots": list(roots), "steps": len(steps), "reason": reason.value}))
        return CascadeReport(tuple(roots), tuple(steps), seq)

    def _repair_action(self, rid, seq, tx, audit, comp, move) -> None:
        row = self.db.q("SELECT tool, args, status FROM effects WHERE id = ?", (rid,))
        if not row or row[0][2] != "executed":
            return
        name, args = row[0][0], json.loads(row[0][1])
        tool = self.tools.get(name)
        irreversible = tool.irreversible if tool is not None else True  # an unknown tool cannot be undone here
        if irreversible:
            self.db.x("UPDATE effects SET status = 'leaked' WHERE id = ?", (rid,))
            audit.append(("leaked_irreversible_effect", rid, {"tool": name, "args": args}))
            move(rid, State.REVOKED, Reason.LEAKED_IRREVERSIBLE_EFFECT)
        else:
            self.db.x("UPDATE effects SET status = 'compensated' WHERE id = ?", (rid,))
            audit.append(("compensate", rid, {"tool": name, "args": args}))
            comp.append((tool, args))
            move(rid, State.REVOKED, Reason.COMPENSATED)

    def effects(self) -> dict[str, dict]:
        """Every tool effect: action record id -> ``{"tool", "args", "status"}`` (``executed``, ``compensated``, ``leaked``)."""
        with self.db.read():
            return {i: {"tool": t, "args": json.loads(a), "status": s} for i, t, a, s in self.db.q("SELECT id, tool, args, status FROM effects")}

    def _check_parents(self, r: Record, batch: Mapping[str, Record]) -> list[Record]:
        parents = []
        for p in r.derived_from:
            if p in batch:
                parents.append(batch[p])
                continue
            rows = self.db.q("SELECT body FROM records WHERE id = ?", (p,))
            if not rows:
                raise UnknownRecordError(f"derived_from names no record {p!r}", record=r.id, field="derived_from")
            parents.append(_record(rows[0][0]))
        if self.db.q("SELECT 1 FROM records WHERE id = ?", (r.id,)):
            raise RecordSchemaError("a record with this id exists already (records are immutable)", record=r.id, field="id")
        if self.features.permission:
            for parent in parents:
                if parent.type == RecordType.TOOL_ACTION:
                    continue
                if r.permission.wider_than(parent.permission):
                    raise PermissionWideningError(
                        f"permission block (scope {r.permission.scope.value}, readers {sorted(r.permission.readers)}) is wider than parent "
                        f"{parent.id!r}'s (scope {parent.permission.scope.value}, readers {sorted(parent.permission.readers)})",
                        record=r.id,
                        field="permission",
                    )
        return parents

    # -- the provenance graph

    def mirror(self, graph) -> int:
        """Write every record and every lifecycle transition not yet there into a
        :class:`~lab.provenance.graph.ProvenanceGraph`: a record is a ``memory`` node (an ``action`` node for a
        ``tool_action``) whose ``attributes`` hold ``lifecycle`` (the state), ``memtx_type`` and ``reason``; each
        transition is a new node version (``graph.history``); ``derived_from`` parents become ``derived_from``
        edges (``used`` from an action). The node text starts with the state in brackets (an action's: ``compensated``
        or ``LEAKED irreversible`` once repaired), so the explorer's labels show the lifecycle, and a node leaves
        ``valid`` when quarantined, superseded or revoked, which the explorer draws faded. Idempotent. Returns the
        number of transitions written.
        """
        from lab.provenance.graph import Edge, Node, NodeType, Relation

        with self.db.read():
            recs = {r.id: r for r in (_record(b) for (b,) in self.db.q("SELECT body FROM records ORDER BY ord"))}
            versions = self.db.q("SELECT id, n, seq, state, reason FROM versions ORDER BY seq, id, n")
            effects = {i: st for i, st in self.db.q("SELECT id, status FROM effects")}

        def text(r: Record, state: str) -> str:
            """What the explorer labels the node with: the lifecycle state first, a repaired action's fate."""
            if r.type == RecordType.TOOL_ACTION:
                fate = {"compensated": "compensated", "leaked": "LEAKED irreversible"}.get(effects.get(r.id, ""), state)
                return f"[{fate}] {r.tool}({json.dumps(r.value)})"
            return f"[{state}] {r.type.value} {r.entity}.{r.attribute} = {json.dumps(r.value)}"

        written = 0
        with graph.transaction():
            for rid, n, seq, state, reason in versions:
                r = recs[rid]
                if rid not in graph:
                    node = Node(
                        id=rid,
                        type=NodeType.ACTION if r.type == RecordType.TOOL_ACTION else NodeType.MEMORY,
                        text=text(r, state),
                        time=float(seq),
                        owner=r.permission.owner,
                        attributes={"lifecycle": state, "memtx_type": r.type.value, "reason": reason, "lifecycle_n": n, "scope": r.permission.scope.value,
                                    "source": r.evidence.source, "authority": r.evidence.authority},
                    )
                    graph.add_node(node)
                    for p in r.derived_from:
                        rel = Relation.USED if r.type == RecordType.TOOL_ACTION else Relation.DERIVED_FROM
                        if p in graph:
                            graph.add_edge(Edge(src=rid, dst=p, relation=rel, time=float(seq)), verify_writer=False)
                    written += 1
                    continue
                node = graph.node(rid)
                if node.attributes.get("lifecycle_n", -1) >= n:
                    continue
                graph.update_node(rid, reason=f"lifecycle {node.attributes.get('lifecycle')} -> {state}: {reason}", text=text(r, state),
                                  attributes={**node.attributes, "lifecycle": state, "reason": reason, "lifecycle_n": n,
                                              "effect": effects.get(rid, "")},
                                  valid=State(state) not in (State.REVOKED, State.QUARANTINED, State.SUPERSEDED))
                written += 1
        return written


class Transaction:
    """A snapshot-isolated MemTX transaction (from :meth:`MemTXStore.begin`).

    Attributes
    ----------
    id, agent : str
    tier : Tier
    isolation : Isolation
    snapshot : int
        The logical time it began at: its reads see the store as it was then, plus its own staging.
    """

    def __init__(self, store: MemTXStore, tid: str, agent: str, tier: Tier, isolation: Isolation, snapshot: int, validate_reads: bool):
        self.store, self.id, self.agent, self.tier, self.isolation, self.snapshot = store, tid, agent, tier, isolation, snapshot
        self.validate_reads = validate_reads
        self.active = True
        self.staged: list[str] = []
        self.read_ids: set[str] = set()
        self.read_slots: set[tuple[str, str]] = set()
        self.result: CommitResult | None = None

    @property
    def db(self) -> Backend:
        return self.store.db

    def _live(self) -> None:
        if not self.active:
            raise TransactionStateError(f"transaction {self.id} is no longer active", field="tx")

    # -- reads

    def _state_at(self, rid: str) -> State | None:
        """The record's state in this transaction's view (snapshot, plus its own staging)."""
        f = self.store.features
        if not f.snapshot:
            rows = self.db.q("SELECT state FROM heads WHERE id = ?", (rid,))
        else:
            rows = self.db.q("SELECT state FROM versions WHERE id = ? AND (seq <= ? OR tx = ?) ORDER BY n DESC LIMIT 1", (rid, self.snapshot, self.id))
        return State(rows[0][0]) if rows else None

    def read(self, entity: str | None = None, attribute: str | None = None) -> list[View]:
        """Records of a slot (or an entity, or all) visible at this transaction's isolation level, oldest first;
        a private record only to its owner and its reader roles."""
        self._live()
        f = self.store.features
        level = self.isolation if f.maturity_reads else Isolation.RAW_READ
        where, params = [], []
        if entity is not None:
            where.append("entity = ?")
            params.append(entity)
        if attribute is not None:
            where.append("attribute = ?")
            params.append(attribute)
        sql = "SELECT id, body FROM records" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY ord"
        out = []
        with self.db.read():
            rows = self.db.q(sql, params)
            for rid, body in rows:
                st = self._state_at(rid)
                if st is None:
                    continue
                own = st == State.TENTATIVE and rid in self.staged
                if st not in VISIBLE[level] and not own:
                    continue
                r = _record(body)
                perm = r.permission
                if perm.scope == Scope.PRIVATE and self.agent != perm.owner and self.agent not in perm.readers:
                    continue  # access control: a private record is read by its owner and its reader roles only
                if level == Isolation.CAUSALLY_STABLE_READ and not own and not self._stable(r):
                    continue
                out.append(View(r, st))
                self.read_ids.add(rid)
        if entity is not None:
            self.read_slots.add((entity, attribute or "*"))
        return out

    def get(self, rid: str) -> View | None:
        """One record if visible at this transaction's isolation level, else ``None``."""
        r = self.store.record(rid)
        for v in self.read(r.entity, r.attribute):
            if v.id == rid:
                return v
        return None

    def _stable(self, r: Record) -> bool:
        anc = self.store._ancestors(r.derived_from) if r.derived_from else set()
        if not anc:
            return True
        marks = ",".join("?" * len(anc))
        if self.db.q(f"SELECT 1 FROM pending WHERE id IN ({marks}) LIMIT 1", list(anc)):
            return False
        return all(self._state_at(a) in (State.COMMITTED, State.ACTION_SAFE, State.RAW) for a in anc)

    # -- writes

    def stage(self, record: Record | Mapping[str, Any]) -> Record:
        """Stage a record (state ``tentative``, visible to other transactions only at ``raw_read`` /
        ``tentative_read``). Without staging (write-immediately baselines) it commits at once.

        Raises
        ------
        RecordSchemaError
            A field that does not fit the schema (names it), an id in use.
        UnknownRecordError
            A ``derived_from`` parent that does not exist.
        DerivationCycleError
            A record derived from itself.
        PermissionWideningError
            A permission block wider than a parent's.
        """
        return self.stage_many([record])[0]

    def stage_many(self, records: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
        """Stage several records at once, all or nothing; parents may be earlier or later records of the batch.

        Raises
        ------
        As :meth:`stage`; :class:`DerivationCycleError` when the batch's ``derived_from`` edges close a cycle
        (``record`` is one of the cycle's records, the message lists the cycle).
        """
        self._live()
        rs = []
        for rec in records:
            if isinstance(rec, Mapping) and rec.get("id") is not None and rec["id"] in tuple(rec.get("derived_from", ())):
                raise DerivationCycleError("a record cannot derive from itself", record=str(rec["id"]), field="derived_from")
            rs.append(rec if isinstance(rec, Record) else make_record(**rec))
        batch = {r.id: r for r in rs}
        g = nx.DiGraph()
        g.add_nodes_from(batch)
        g.add_edges_from((p, r.id) for r in rs for p in r.derived_from if p in batch)
        try:
            cycle = nx.find_cycle(g)
            raise DerivationCycleError(f"derived_from edges close a cycle: {' -> '.join(a for a, _ in cycle)}", record=cycle[0][0], field="derived_from")
        except nx.NetworkXNoCycle:
            pass
        order = [batch[i] for i in nx.topological_sort(g)]
        immediate = not self.store.features.staging

        def go():
            with self.db.write():
                for r in order:
                    self.store._check_parents(r, batch)
                seq = self.store._tick()
                audit: list = []
                for r in order:
                    self.store._insert(r, self.id, seq)
                    self.store._set_state(r.id, State.TENTATIVE, "staged", seq, self.id, audit)
                    if immediate:
                        self.store._set_state(r.id, State.VALIDATED, "write_immediately", seq, self.id, audit)
                        self.store._set_state(r.id, State.COMMITTED, "write_immediately", seq, self.id, audit)
                        self.store._supersede_rivals(r, seq, self.id, audit)
                self.store._write_audit(seq, audit)

        retrying(go)
        if not immediate:
            self.staged.extend(r.id for r in order)
        return [batch[r.id] for r in rs]

    # -- the gate

    def gate(self, tool: str, *, uses: Iterable[str] = (), entity: str | None = None) -> GateDecision:
        """The action gate's decision on calling ``tool`` with premises ``uses`` (record ids) about ``entity``.

        A reversible tool passes unless a premise or an ancestor is inactive (quarantined, superseded, revoked)
        or pending revocation. An irreversible one is refused when (a) a ``tentative`` (or
        ``validated``) record about an entity the call concerns exists outside this transaction's committed
        snapshot, this transaction's own staging included (commit the plan before acting); (b) the transaction is
        ``external_action`` and no premise is ``action_safe``; or (c) a premise is no longer committed
        (revoked, quarantined, superseded since the snapshot) or it or an ancestor is pending revocation.
        (a) and (b) are the paper's two conditions; restricting (a) to the call's entities and adding (c) are
        choices of this implementation.

        Raises
        ------
        UnknownToolError
        UnknownRecordError
            A premise that does not exist.
        """
        self._live()
        if tool not in self.store.tools:
            raise UnknownToolError(f"tool {tool!r} is not registered with the gate", field="tool")
        uses = list(uses)
        if not self.store.features.gate:
            return GateDecision(True)
        if not self.store.tools[tool].irreversible:
            return self._reversible_gate(uses)
        reasons, detail = [], {}
        with self.db.read():
            ents = set([entity] if entity else [])
            heads = {}
            for u in uses:
                rows = self.db.q("SELECT r.entity, h.state FROM records r JOIN heads h ON h.id = r.id WHERE r.id = ?", (u,))
                if not rows:
                    raise UnknownRecordError(f"premise {u!r} does not exist", record=u, field="uses")
                ents.add(rows[0][0])
                heads[u] = State(rows[0][1])
            if ents:
                marks = ",".join("?" * len(ents))
                tent = [i for (i,) in self.db.q(
                    f"SELECT r.id FROM records r JOIN heads h ON h.id = r.id WHERE h.state IN ('tentative', 'validated') AND r.entity IN ({marks}) ORDER BY r.ord", list(ents))]
                if tent:
                    reasons.append(Reason.TENTATIVE_OUTSIDE_SNAPSHOT)
                    detail["tentative"] = tent
            if self.tier == Tier.EXTERNAL_ACTION and not any(heads[u] == State.ACTION_SAFE and self._state_at(u) == State.ACTION_SAFE for u in uses):
                reasons.append(Reason.NO_ACTION_SAFE_PREMISE)
            bad = [u for u in uses if heads[u] not in (State.COMMITTED, State.ACTION_SAFE)]
            anc = self.store._ancestors(uses) if uses else set()
            if anc:
                marks = ",".join("?" * len(anc))
                bad += [p for (p,) in self.db.q(f"SELECT id FROM pending WHERE id IN ({marks})", list(anc))]
            if bad:
                reasons.append(Reason.PREMISE_INVALIDATED)
                detail["invalidated"] = sorted(set(bad))
        return GateDecision(not reasons, tuple(reasons), detail)

    def _reversible_gate(self, uses: list[str]) -> GateDecision:
        """A reversible tool needs only live premises: none of them or their ancestors inactive (quarantined,
        superseded, revoked) or pending revocation (else its action record would outlive a revoked ancestor)."""
        if not uses:
            return GateDecision(True)
        with self.db.read():
            for u in uses:
                if not self.db.q("SELECT 1 FROM heads WHERE id = ?", (u,)):
                    raise UnknownRecordError(f"premise {u!r} does not exist", record=u, field="uses")
            anc = sorted(self.store._ancestors(uses))
            marks = ",".join("?" * len(anc))
            bad = [i for (i,) in self.db.q(f"SELECT id FROM heads WHERE id IN ({marks}) AND state IN ('quarantined', 'superseded', 'revoked')", anc)]
            bad += [i for (i,) in self.db.q(f"SELECT id FROM pending WHERE id IN ({marks})", anc)]
        if bad:
            return GateDecision(False, (Reason.PREMISE_INVALIDATED,), {"invalidated": sorted(set(bad))})
        return GateDecision(True)

    def call_tool(self, tool: str, args: Mapping[str, Any] | None = None, *, uses: Iterable[str] = (), entity: str | None = None) -> ToolCall:
        """Call a registered tool through the gate; when allowed, run it and write a committed ``tool_action``
        record derived from the premises ``uses`` (so a later retraction reaches it). A refusal is a structured
        :class:`GateDecision`, never an exception; the decision goes to the audit log either way."""
        args = dict(args or {})
        uses = list(uses)
        decision = self.gate(tool, uses=uses, entity=entity)
        t = self.store.tools[tool]
        action = None
        result = None
        if decision.allowed:
            result = t.run(args) if t.run is not None else None
            action = f"act-{uuid.uuid4().hex[:12]}"
            rec = make_record(id=action, type="tool_action", entity=entity or "", attribute=tool, value=args, tool=tool,
                              evidence={"source": self.agent, "authority": 1.0, "confidence": 1.0},
                              permission={"owner": self.agent, "scope": "private"}, derived_from=tuple(uses))

            def go():
                with self.db.write():
                    seq = self.store._tick()
                    self.store._insert(rec, self.id, seq)
                    self.db.x("INSERT INTO effects VALUES (?, ?, ?, ?)", (action, tool, json.dumps(args, sort_keys=True), "executed"))
                    audit = [("gate", action, {"tool": tool, "allowed": True, "uses": uses, "tx": self.id})]
                    self.store._set_state(action, State.COMMITTED, "executed", seq, self.id, audit)
                    self.store._write_audit(seq, audit)

            retrying(go)
        else:
            def go():
                with self.db.write():
                    seq = self.store._tick()
                    self.store._write_audit(seq, [("gate", None, {"tool": tool, "allowed": False, "uses": uses, "tx": self.id,
                                                                 "reasons": [r.value for r in decision.reasons]})])

            retrying(go)
        return ToolCall(tool, decision, action, result)

    # -- commit and abort

    def commit(self) -> CommitResult:
        """Run the validate-and-commit pipeline over the staged records, all or nothing.

        Per staged record, in order: (1) evidence: writer confidence >= 0.6 unless source authority >= 0.9;
        (0) the record is still tentative (a cascade may have repaired it meanwhile: ``staged_record_repaired``);
        (2) validity: the interval contains the commit's logical time; (3) semantic conflict in the same
        entity/attribute slot among overlapping intervals with a different value: a rival committed after this
        snapshot -> ``stale_late_write`` (before any authority comparison); else higher authority supersedes the
        rival, lower authority -> ``lower_authority``, equal authority from another source ->
        ``equal_authority_conflict``; a parent revoked -> ``derived_from_revoked``; a scope wider than a parent's
        -> ``permission_laundering``; (4) dependency stability: an ancestor pending revocation ->
        ``ancestor_pending_revocation``, a parent not committed (quarantined, superseded, another transaction's
        tentative record) -> ``ancestor_unstable``; with ``validate_reads``, a record or slot read that changed
        after the snapshot -> ``read_write_conflict``.
        All pass: every staged record becomes ``committed`` (``action_safe`` in an ``external_action``
        transaction). Any fails: the failing records are ``quarantined`` with their reason and the rest of the
        transaction is aborted through the cascade routine (revoked, descendants repaired).
        """
        self._live()
        comp: list = []

        def go():
            comp.clear()
            with self.db.write():
                self.store._point("commit:begin")
                seq = self.store._tick()
                self.store._point("commit:ticked")
                outcomes, supersede = self._pipeline(seq)
                failed = {o.record: o for o in outcomes if o.reason is not None}
                audit: list = []
                cascade = None
                if not failed:
                    for i, o in enumerate(outcomes):
                        self.store._set_state(o.record, State.VALIDATED, "validated", seq, self.id, audit)
                        self.store._point(f"commit:validated:{i}")
                    for rival, by in supersede:
                        if State(self.db.q("SELECT state FROM heads WHERE id = ?", (rival,))[0][0]) in (State.COMMITTED, State.ACTION_SAFE):
                            self.store._set_state(rival, State.SUPERSEDED, f"superseded by {by}", seq, self.id, audit)
                    for i, o in enumerate(outcomes):
                        self.store._set_state(o.record, State.COMMITTED, "committed", seq, self.id, audit)
                        self.store._point(f"commit:committed:{i}")
                        if self.tier == Tier.EXTERNAL_ACTION:
                            self.store._set_state(o.record, State.ACTION_SAFE, "external_action", seq, self.id, audit)
                    status = "committed"
                else:
                    roots = {o.record: ((State.QUARANTINED, o.reason) if o.record in failed else State.REVOKED) for o in outcomes}
                    roots.update({a: State.REVOKED for a in self._actions()})
                    cascade = self.store._cascade(roots, Reason.TRANSACTION_ABORTED, seq, self.id, audit, comp)
                    outcomes = [o if o.record in failed else replace(o, state=State.REVOKED, reason=Reason.TRANSACTION_ABORTED, check="abort") for o in outcomes]
                    status = "aborted"
                self.db.x("UPDATE txs SET status = ?, end_seq = ? WHERE id = ?", (status, seq, self.id))
                audit.append(("commit" if not failed else "abort", None, {"tx": self.id, "reasons": sorted({o.reason.value for o in outcomes if o.reason})}))
                self.store._write_audit(seq, audit)
                self.store._point("commit:end")
            return CommitResult(self.id, not failed, tuple(outcomes), seq, cascade)

        self.result = retrying(go)
        self.active = False
        self.store._run_compensations(comp)
        return self.result

    def _actions(self) -> list[str]:
        return [i for (i,) in self.db.q("SELECT r.id FROM records r JOIN effects e ON e.id = r.id WHERE r.tx = ? AND e.status = 'executed'", (self.id,))]

    def abort(self, reason: str = "aborted by agent") -> CascadeReport:
        """Abort: the staged records are revoked and everything derived from them (other transactions' dirty
        derivations, this transaction's reversible tool calls) repaired by the same routine as :meth:`MemTXStore.retract`."""
        self._live()
        comp: list = []

        def go():
            comp.clear()
            with self.db.write():
                seq = self.store._tick()
                audit: list = [("abort", None, {"tx": self.id, "reason": reason})]
                roots = {r: State.REVOKED for r in self.staged + self._actions()}
                report = self.store._cascade(roots, Reason.TRANSACTION_ABORTED, seq, self.id, audit, comp) if roots else CascadeReport((), (), seq)
                self.db.x("UPDATE txs SET status = 'aborted', end_seq = ? WHERE id = ?", (seq, self.id))
                self.store._write_audit(seq, audit)
            return report

        report = retrying(go)
        self.active = False
        self.store._run_compensations(comp)
        return report

    def _pipeline(self, now: int) -> tuple[list[Outcome], list[tuple[str, str]]]:
        f = self.store.features
        outcomes, supersede = [], []
        staged = set(self.staged)
        for rid in self.staged:
            r = _record(self.db.q("SELECT body FROM records WHERE id = ?", (rid,))[0][0])
            fail = None
            now_state = State(self.db.q("SELECT state FROM heads WHERE id = ?", (rid,))[0][0])
            if now_state != State.TENTATIVE:  # a cascade repaired it while it was staged: the plan is void
                outcomes.append(Outcome(rid, now_state, Reason.STAGED_RECORD_REPAIRED, "staging", {"state": now_state.value}))
                continue
            ev = r.evidence
            if f.evidence and ev.confidence < EVIDENCE_MIN_CONFIDENCE and ev.authority < EVIDENCE_AUTHORITY_OVERRIDE:
                fail = (Reason.EVIDENCE_INSUFFICIENT, "evidence", {"confidence": ev.confidence, "authority": ev.authority})
            if fail is None and f.validity:
                if now < r.valid_from:
                    fail = (Reason.NOT_YET_VALID, "validity", {"now": now, "valid_from": r.valid_from})
                elif now >= r.valid_to:
                    fail = (Reason.VALIDITY_EXPIRED, "validity", {"now": now, "valid_to": r.valid_to})
            if fail is None and f.conflict and r.type != RecordType.TOOL_ACTION:
                fail = self._conflict(r, staged, supersede)
            elif not f.conflict and r.type != RecordType.TOOL_ACTION:  # no adjudication: the last committer wins
                supersede.extend((rid2, r.id) for rid2 in self._rivals(r, staged))
            if fail is None and f.permission:
                for p in r.derived_from:
                    pr = _record(self.db.q("SELECT body FROM records WHERE id = ?", (p,))[0][0])
                    if pr.type != RecordType.TOOL_ACTION and r.permission.wider_than(pr.permission):
                        fail = (Reason.PERMISSION_LAUNDERING, "semantic_conflict", {"parent": p})
                        break
            if fail is None and f.stability:
                fail = self._stability(r, staged)
            if fail is None and self.validate_reads:
                fail = self._read_conflict()
            if fail is None:
                outcomes.append(Outcome(rid, State.COMMITTED if self.tier != Tier.EXTERNAL_ACTION else State.ACTION_SAFE))
            else:
                outcomes.append(Outcome(rid, State.QUARANTINED, fail[0], fail[1], fail[2]))
        return outcomes, supersede

    def _conflict(self, r: Record, staged: set[str], supersede: list) -> tuple | None:
        rows = self.db.q(
            "SELECT r.id, r.body, h.seq, h.state FROM records r JOIN heads h ON h.id = r.id WHERE r.entity = ? AND r.attribute = ? AND r.id != ?"
            " AND h.state IN ('committed', 'action_safe') ORDER BY r.ord",
            (r.entity, r.attribute, r.id),
        )
        for rid, body, _, _ in rows:
            rival = _record(body)
            if rid in staged or rival.type == RecordType.TOOL_ACTION or not r.overlaps(rival) or rival.value == r.value:
                continue
            committed_at = int(self.db.q("SELECT MIN(seq) FROM versions WHERE id = ? AND state = 'committed'", (rid,))[0][0])
            if committed_at > self.snapshot:
                return (Reason.STALE_LATE_WRITE, "semantic_conflict", {"rival": rid, "rival_committed_at": committed_at, "snapshot": self.snapshot})
            a, b = r.evidence, rival.evidence
            if a.authority > b.authority or (a.authority == b.authority and a.source == b.source):
                supersede.append((rid, r.id))
            elif a.authority < b.authority:
                return (Reason.LOWER_AUTHORITY, "semantic_conflict", {"rival": rid, "authority": a.authority, "rival_authority": b.authority})
            else:
                return (Reason.EQUAL_AUTHORITY_CONFLICT, "semantic_conflict", {"rival": rid, "source": a.source, "rival_source": b.source})
        for p in r.derived_from:
            if State(self.db.q("SELECT state FROM heads WHERE id = ?", (p,))[0][0]) == State.REVOKED:
                return (Reason.DERIVED_FROM_REVOKED, "semantic_conflict", {"parent": p})
        return None

    def _rivals(self, r: Record, staged: set[str]) -> list[str]:
        rows = self.db.q("SELECT r.id, r.body FROM records r JOIN heads h ON h.id = r.id WHERE r.entity = ? AND r.attribute = ? AND r.id != ?"
                         " AND h.state IN ('committed', 'action_safe')", (r.entity, r.attribute, r.id))
        out = []
        for rid, body in rows:
            rival = _record(body)
            if rid not in staged and rival.type != RecordType.TOOL_ACTION and r.overlaps(rival) and rival.value != r.value:
                out.append(rid)
        return out

    def _stability(self, r: Record, staged: set[str]) -> tuple | None:
        if not r.derived_from:
            return None
        anc = self.store._ancestors(r.derived_from)
        marks = ",".join("?" * len(anc))
        pend = [p for (p,) in self.db.q(f"SELECT id FROM pending WHERE id IN ({marks}) ORDER BY id", list(anc))]
        if pend:
            return (Reason.ANCESTOR_PENDING_REVOCATION, "dependency_stability", {"ancestor": pend[0]})
        for a in sorted(anc):
            st = State(self.db.q("SELECT state FROM heads WHERE id = ?", (a,))[0][0])
            if st == State.REVOKED:
                return (Reason.DERIVED_FROM_REVOKED, "dependency_stability", {"ancestor": a})
            if a in staged or st in (State.COMMITTED, State.ACTION_SAFE, State.RAW):
                continue
            return (Reason.ANCESTOR_UNSTABLE, "dependency_stability", {"ancestor": a, "state": st.value})
        return None

    def _read_conflict(self) -> tuple | None:
        for rid in sorted(self.read_ids - set(self.staged)):
            if self.db.q("SELECT 1 FROM versions WHERE id = ? AND seq > ? AND (tx IS NULL OR tx != ?) LIMIT 1", (rid, self.snapshot, self.id)):
                return (Reason.READ_WRITE_CONFLICT, "read_validation", {"read": rid})
        for ent, attr in sorted(self.read_slots):
            sql = "SELECT r.id FROM records r JOIN versions v ON v.id = r.id WHERE r.entity = ? AND v.seq > ? AND v.state = 'committed' AND (r.tx IS NULL OR r.tx != ?)"
            params = [ent, self.snapshot, self.id]
            if attr != "*":
                sql += " AND r.attribute = ?"
                params.append(attr)
            hit = self.db.q(sql + " LIMIT 1", params)
            if hit:
                return (Reason.READ_WRITE_CONFLICT, "read_validation", {"slot": f"{ent}.{attr}", "record": hit[0][0]})
        return None


def _supersede_rivals(self: MemTXStore, r: Record, seq: int, tx: str, audit: list) -> None:
    """Write-immediately semantics: the newest write in a slot supersedes every other committed value there."""
    rows = self.db.q("SELECT r.id, r.body FROM records r JOIN heads h ON h.id = r.id WHERE r.entity = ? AND r.attribute = ? AND r.id != ? AND h.state IN ('committed', 'action_safe')",
                     (r.entity, r.attribute, r.id))
    for rid, body in rows:
        rival = _record(body)
        if rival.type != RecordType.TOOL_ACTION and r.type != RecordType.TOOL_ACTION and rival.value != r.value and r.overlaps(rival):
            self._set_state(rid, State.SUPERSEDED, f"superseded by {r.id}", seq, tx, audit)


MemTXStore._supersede_rivals = _supersede_rivals
