"""The MemTX record schema, its eight-state lifecycle, isolation levels, risk tiers and commit reasons.

Source: MemTX (arXiv 2607.23929) sections on the record schema, the lifecycle, maturity-scoped reads and the
commit pipeline, as summarised in ``shared/notes/papers-memtx.md`` sections 2.1-2.4. Where the paper is
silent (which transitions exactly, which isolation a tier gets) the choices are stated here.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lab.provenance.errors import LifecycleError, RecordSchemaError

__all__ = [
    "RecordType",
    "State",
    "Scope",
    "Isolation",
    "Tier",
    "Reason",
    "TRANSITIONS",
    "INITIAL_STATES",
    "ACTIVE",
    "TERMINAL",
    "VISIBLE",
    "TIER_ISOLATION",
    "QUARANTINE_ON_CASCADE",
    "Permission",
    "Evidence",
    "Record",
    "check_transition",
    "make_record",
    "INFINITY",
]

#: The logical clock's "never ends" (a validity interval ``[valid_from, INFINITY)`` is open-ended).
INFINITY = 2**62


class RecordType(str, Enum):
    """The type of a record (the paper's six); it decides what the typed cascade does to it."""

    BELIEF = "belief"
    SUMMARY = "summary"
    PROFILE = "profile"
    INDEX_ENTRY = "index_entry"
    SHARED_COPY = "shared_copy"
    TOOL_ACTION = "tool_action"


class State(str, Enum):
    """The eight lifecycle states: the main line ``raw -> tentative -> validated -> committed -> action_safe``
    and the branch states ``quarantined``, ``superseded`` and ``revoked`` (terminal)."""

    RAW = "raw"
    TENTATIVE = "tentative"
    VALIDATED = "validated"
    COMMITTED = "committed"
    ACTION_SAFE = "action_safe"
    QUARANTINED = "quarantined"
    SUPERSEDED = "superseded"
    REVOKED = "revoked"


#: The only transitions the store performs (anything else raises :class:`~lab.provenance.errors.LifecycleError`).
#: Choices where the paper lists states but not edges: a quarantined record may be re-staged (``tentative``,
#: after review or rebuild from surviving sources) or revoked; a superseded one may be revoked, quarantined (found
#: faulty after it was replaced) or reinstated to ``committed`` when the record that superseded it is removed
#: (:meth:`~lab.provenance.txn.MemTXStore.reinstate`, rollback repair, arXiv 2608.10502).
TRANSITIONS: dict[State, frozenset[State]] = {
    State.RAW: frozenset({State.TENTATIVE, State.QUARANTINED, State.REVOKED}),
    State.TENTATIVE: frozenset({State.VALIDATED, State.QUARANTINED, State.REVOKED}),
    State.VALIDATED: frozenset({State.COMMITTED, State.QUARANTINED, State.REVOKED}),
    State.COMMITTED: frozenset({State.ACTION_SAFE, State.SUPERSEDED, State.QUARANTINED, State.REVOKED}),
    State.ACTION_SAFE: frozenset({State.SUPERSEDED, State.QUARANTINED, State.REVOKED}),
    State.QUARANTINED: frozenset({State.TENTATIVE, State.REVOKED}),
    State.SUPERSEDED: frozenset({State.REVOKED, State.QUARANTINED, State.COMMITTED}),
    State.REVOKED: frozenset(),
}
#: States a record may be created in: ``raw`` (an observation), ``tentative`` (staged in a transaction), and
#: ``committed`` for a ``tool_action`` only (the record that a tool call happened).
INITIAL_STATES = frozenset({State.RAW, State.TENTATIVE, State.COMMITTED})
#: States whose record counts as live belief (I2 and G3 quantify over them).
ACTIVE = frozenset({State.TENTATIVE, State.VALIDATED, State.COMMITTED, State.ACTION_SAFE})
TERMINAL = frozenset({State.REVOKED})
#: Types the cascade quarantines (to be rebuilt from surviving sources) instead of revoking.
QUARANTINE_ON_CASCADE = frozenset({RecordType.SUMMARY, RecordType.PROFILE, RecordType.INDEX_ENTRY, RecordType.SHARED_COPY})


class Scope(str, Enum):
    """A permission block's scope, narrowest first: ``private < shared < public``."""

    PRIVATE = "private"
    SHARED = "shared"
    PUBLIC = "public"

    @property
    def rank(self) -> int:
        return ("private", "shared", "public").index(self.value)


class Isolation(str, Enum):
    """The five maturity-scoped read levels, weakest first."""

    RAW_READ = "raw_read"
    TENTATIVE_READ = "tentative_read"
    COMMITTED_READ = "committed_read"
    CAUSALLY_STABLE_READ = "causally_stable_read"
    ACTION_SAFE_READ = "action_safe_read"


#: Which states each read level returns (causally-stable additionally hides records with an unstable ancestor).
VISIBLE: dict[Isolation, frozenset[State]] = {
    Isolation.RAW_READ: frozenset(State),
    Isolation.TENTATIVE_READ: frozenset({State.TENTATIVE, State.VALIDATED, State.COMMITTED, State.ACTION_SAFE}),
    Isolation.COMMITTED_READ: frozenset({State.COMMITTED, State.ACTION_SAFE}),
    Isolation.CAUSALLY_STABLE_READ: frozenset({State.COMMITTED, State.ACTION_SAFE}),
    Isolation.ACTION_SAFE_READ: frozenset({State.ACTION_SAFE}),
}


class Tier(str, Enum):
    """A transaction's risk tier, declared by the trusted harness configuration (never by agent output)."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    EXTERNAL_ACTION = "external_action"


#: The default read level of each tier (a choice: the paper fixes only that external-action gets the strictest).
#: Action-safe reads in an external-action transaction see committed records too, so that a fresh store is usable:
#: they return committed and action-safe records, and the gate then demands an action-safe premise.
TIER_ISOLATION: dict[Tier, Isolation] = {
    Tier.LOW: Isolation.COMMITTED_READ,
    Tier.MEDIUM: Isolation.COMMITTED_READ,
    Tier.HIGH: Isolation.CAUSALLY_STABLE_READ,
    Tier.EXTERNAL_ACTION: Isolation.CAUSALLY_STABLE_READ,
}


class Reason(str, Enum):
    """Machine-readable reasons of the commit pipeline, the gate and the cascade."""

    # commit pipeline, in check order
    EVIDENCE_INSUFFICIENT = "evidence_insufficient"
    NOT_YET_VALID = "not_yet_valid"
    VALIDITY_EXPIRED = "validity_expired"
    STALE_LATE_WRITE = "stale_late_write"
    LOWER_AUTHORITY = "lower_authority"
    EQUAL_AUTHORITY_CONFLICT = "equal_authority_conflict"
    DERIVED_FROM_REVOKED = "derived_from_revoked"
    PERMISSION_LAUNDERING = "permission_laundering"
    ANCESTOR_PENDING_REVOCATION = "ancestor_pending_revocation"
    ANCESTOR_UNSTABLE = "ancestor_unstable"
    READ_WRITE_CONFLICT = "read_write_conflict"
    STAGED_RECORD_REPAIRED = "staged_record_repaired"
    # abort of the rest of a transaction
    TRANSACTION_ABORTED = "transaction_aborted"
    # gate
    TENTATIVE_OUTSIDE_SNAPSHOT = "tentative_outside_snapshot"
    NO_ACTION_SAFE_PREMISE = "no_action_safe_premise"
    PREMISE_INVALIDATED = "premise_invalidated"
    # cascade
    REVOKED = "revoked"
    COMPENSATED = "compensated"
    LEAKED_IRREVERSIBLE_EFFECT = "leaked_irreversible_effect"
    QUARANTINED_FOR_REBUILD = "quarantined_for_rebuild"
    SUPERSEDED = "superseded"


class Permission(BaseModel):
    """A record's permission block: its owner, the roles that may read and write it, and its scope."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str = Field(min_length=1)
    readers: frozenset[str] = frozenset()
    writers: frozenset[str] = frozenset()
    scope: Scope = Scope.PRIVATE

    def wider_than(self, other: "Permission") -> bool:
        """True when this block exposes more than ``other``: a wider scope, or (both not public) a reader role
        ``other`` lacks."""
        if self.scope.rank > other.scope.rank:
            return True
        return self.scope != Scope.PUBLIC and bool(self.readers - other.readers - {other.owner})


class Evidence(BaseModel):
    """Where a record's content comes from: the source, its authority weight and the writer's confidence (both in [0, 1])."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1)
    authority: float = Field(ge=0.0, le=1.0)
    confidence: float = Field(ge=0.0, le=1.0)


class Record(BaseModel):
    """One MemTX record (immutable content; its lifecycle state lives in the store's version table).

    Parameters
    ----------
    id : str
    type : RecordType
    entity, attribute : str
        The slot the record asserts about (semantic conflict is per slot).
    value : JSON-serialisable
    evidence : Evidence
    permission : Permission
    derived_from : tuple of str
        Parent record ids (the derivation DAG).
    valid_from, valid_to : int
        Validity interval ``[valid_from, valid_to)`` on the store's logical clock (``valid_to`` defaults to
        :data:`INFINITY`).
    tool : str, optional
        For a ``tool_action``: the registered tool it records.
    observed_at : int, optional
        The writer's own logical time of the observation (e.g. an agent's step clock; may be negative for what a
        prior session left). MemTX does not interpret it; rollback repair orders a slot's records by it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    type: RecordType
    entity: str = ""
    attribute: str = ""
    value: Any = None
    evidence: Evidence
    permission: Permission
    derived_from: tuple[str, ...] = ()
    valid_from: int = Field(0, ge=0)
    valid_to: int = INFINITY
    tool: str | None = None
    observed_at: int | None = None

    @field_validator("value")
    @classmethod
    def _json(cls, value: Any) -> Any:
        json.dumps(value)
        return value

    @model_validator(mode="after")
    def _interval(self) -> "Record":
        if self.valid_to <= self.valid_from:
            raise ValueError(f"validity interval [{self.valid_from}, {self.valid_to}) is empty")
        if len(set(self.derived_from)) != len(self.derived_from) or self.id in self.derived_from:
            raise ValueError("derived_from must list distinct parents, not the record itself")
        return self

    def overlaps(self, other: "Record") -> bool:
        """Whether the two validity intervals intersect (temporally disjoint values coexist)."""
        return self.valid_from < other.valid_to and other.valid_from < self.valid_to


def make_record(**fields: Any) -> Record:
    """Build a :class:`Record`, turning pydantic's error into :class:`~lab.provenance.errors.RecordSchemaError`.

    Raises
    ------
    RecordSchemaError
        Naming the record id and the first offending field (e.g. ``type`` for an unknown type,
        ``evidence.authority`` for a weight outside [0, 1]).
    """
    try:
        return Record.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or None
        raise RecordSchemaError(err["msg"], record=str(fields.get("id")) if fields.get("id") else None, field=field) from None
    except (TypeError, ValueError) as exc:  # value not JSON
        raise RecordSchemaError(str(exc), record=str(fields.get("id")), field="value") from None


def parse_state(value: Any, *, record: str | None = None) -> State:
    """``value`` as a :class:`State`; :class:`RecordSchemaError` (field ``state``) when it is not one."""
    try:
        return State(value)
    except ValueError:
        raise RecordSchemaError(f"unknown lifecycle state {value!r} (one of {[s.value for s in State]})", record=record, field="state") from None


def check_transition(record: str, old: State | None, new: State) -> None:
    """Raise :class:`~lab.provenance.errors.LifecycleError` unless ``old -> new`` is listed in :data:`TRANSITIONS`
    (``old`` ``None``: creation, allowed into :data:`INITIAL_STATES`)."""
    ok = new in INITIAL_STATES if old is None else new in TRANSITIONS[old]
    if not ok:
        raise LifecycleError(f"transition {old.value if old else '(new)'} -> {new.value} is not in the lifecycle", record=record, field="state")

