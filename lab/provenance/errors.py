"""Errors of the provenance facet (``lab.provenance``), under :class:`lab.LabError`."""

from __future__ import annotations

from lab import LabError

__all__ = [
    "ProvenanceError",
    "UnknownNodeError",
    "DuplicateNodeError",
    "ContentConflictError",
    "GraphIntegrityError",
    "LineageCycleError",
    "IngestError",
    "AccessError",
    "TrustError",
    "ProvExportError",
    "ScorerUnavailable",
    "MemTXError",
    "RecordSchemaError",
    "LifecycleError",
    "PermissionWideningError",
    "DerivationCycleError",
    "UnknownRecordError",
    "TransactionStateError",
    "BackendUnavailableError",
    "UnknownToolError",
]


class ProvenanceError(LabError):
    """Base class of every error ``lab.provenance`` raises on purpose."""


class UnknownNodeError(ProvenanceError, KeyError):
    """No node with that id."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateNodeError(ProvenanceError, ValueError):
    """A node id that exists already (nodes are never silently overwritten: use ``update_node``)."""


class ContentConflictError(DuplicateNodeError):
    """Writing content under ids the graph holds already with other content.

    ``id``: the first such node id (or edge, ``"src -relation-> dst"``); ``field``: its first differing field
    (``attributes.score`` for a key of an object field); ``stored`` and ``given``: that field's values; ``run`` and
    ``file``: the run and the trace being ingested, when known. Nothing of the batch was written.
    """

    def __init__(
        self, reason: str, *, id: str, field: str | None = None, stored: object = None, given: object = None, run: str | None = None, file: str | None = None
    ):
        self.id, self.field, self.stored, self.given, self.run, self.file, self.reason = id, field, stored, given, run, file, reason
        super().__init__(f"{file}: {reason}" if file else reason)


class GraphIntegrityError(ProvenanceError, ValueError):
    """An edge the graph refuses: an endpoint is missing, the relation does not join those node types, or its
    writer may not write it (not an agent, not the owner of the record the edge adds lineage to, or unable to
    read the record it derives from); see :meth:`~lab.provenance.graph.ProvenanceGraph.add_edge`."""


class LineageCycleError(GraphIntegrityError):
    """A lineage edge that would close a derivation cycle (the lineage must stay acyclic).

    Attributes
    ----------
    cycle : list of str
        The cycle's node ids, starting at the edge's child and following lineage down to its parent
        (``cycle[0]`` derives from ``cycle[-1]`` through the refused edge).
    edge : str
        The refused edge's key, ``"src -relation-> dst"``.
    """

    def __init__(self, reason: str, *, cycle: list[str], edge: str):
        self.cycle, self.edge = list(cycle), edge
        super().__init__(reason)


class IngestError(ProvenanceError, ValueError):
    """A trace is malformed; ``path`` locates the bad field (e.g. ``[12].traj[3].tool_calls[0].function.arguments``)."""

    def __init__(self, reason: str, *, file: str | None = None, path: str | None = None):
        self.file, self.path, self.reason = file, path, reason
        where = file or "<trace>"
        if path:
            where += f" at {path}"
        super().__init__(f"{where}: {reason}")


class AccessError(ProvenanceError, ValueError):
    """An access-policy call on the wrong kind of node (e.g. granting a scope to a non-agent,
    revoking something that is not a source); :mod:`lab.provenance.access`."""


class TrustError(ProvenanceError, ValueError):
    """A trust query that cannot be answered as asked (unknown mode, too many mutually dependent
    supporters for the exact search); :mod:`lab.provenance.trust`."""


class ProvExportError(ProvenanceError, ValueError):
    """A graph that cannot be written as PROV, or a PROV document that is not a lab graph;
    :mod:`lab.provenance.prov_export`."""


class ScorerUnavailable(ProvenanceError):
    """The requested similarity scorer cannot be loaded (e.g. the MiniLM package is not installed);
    :mod:`lab.provenance.embed` never falls back to another scorer silently."""


class MemTXError(ProvenanceError):
    """Base class of the errors of the MemTX transactional store (:mod:`lab.provenance.txn`).

    ``record``: the record id concerned (``None`` when none is); ``field``: the offending field, when one is.
    Raising one never changes anything already committed.
    """

    def __init__(self, reason: str, *, record: str | None = None, field: str | None = None):
        self.record, self.field, self.reason = record, field, reason
        where = ", ".join(x for x in (f"record {record!r}" if record else "", f"field {field!r}" if field else "") if x)
        super().__init__(f"{where}: {reason}" if where else reason)


class RecordSchemaError(MemTXError, ValueError):
    """A record that does not fit the schema: unknown type or state, out-of-range weight, bad validity interval."""


class LifecycleError(MemTXError, ValueError):
    """A lifecycle transition that is not in :data:`lab.provenance.txn.TRANSITIONS` (``field`` is ``"state"``)."""


class PermissionWideningError(MemTXError, ValueError):
    """A derived record whose permission block is wider than its parents' (permission laundering)."""


class DerivationCycleError(MemTXError, ValueError):
    """``derived_from`` edges that would close a cycle (the derivation graph must stay a DAG)."""


class UnknownRecordError(MemTXError, KeyError):
    """No record with that id (a ``derived_from`` parent, a premise, a retraction target)."""

    def __str__(self) -> str:
        return str(self.args[0])


class TransactionStateError(MemTXError, RuntimeError):
    """A call on a transaction that is no longer active (already committed or aborted)."""


class BackendUnavailableError(MemTXError, ConnectionError):
    """The store's database cannot be opened or reached (a PostgreSQL DSN that does not connect, an unwritable file)."""


class UnknownToolError(MemTXError, KeyError):
    """A tool call on a tool that was never registered with the store's action gate."""

    def __str__(self) -> str:
        return str(self.args[0])


class RepairError(ProvenanceError, ValueError):
    """A rollback repair that cannot be done as asked (:mod:`lab.provenance.repair`); ``step`` names the
    offending step, record or faulty id (``None`` when the fault is not one item's). The memory store and the
    environment are left as they were."""

    def __init__(self, reason: str, *, step: str | None = None):
        self.step, self.reason = step, reason
        super().__init__(reason)


class MissingProvenanceError(RepairError):
    """A trace step lacks the provenance repair needs (e.g. a read with no recorded source); ``step`` names it."""


class IrreversibleEffectError(RepairError):
    """A side effect that has no registered compensation (money paid out, a message sent); ``step`` names it."""
