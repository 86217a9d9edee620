"""What both ingests share: the :class:`IngestReport`, and how a run's planned writes are compared with the graph.

An ingest first *plans* each run's writes (nodes, edges and, for memories, node versions), in the order they
must be written, then hands the run's ``(kind, key, difference)`` triples (:func:`difference`, one per planned
write) to :func:`verdict`, which says what to do with the run:

* ``"present"``: the graph holds every planned write exactly as planned; nothing is written;
* ``"new"``: the graph holds none of them; all are written;
* ``"extend"``: the graph holds some, each exactly as planned (a trace re-exported after it grew, a trajectory
  ingested while in progress); only the missing ones are written, in the planned order;
* ``"empty"``: nothing to write (a trace of CHAIN spans only);
* a stored write with other content raises :class:`~lab.provenance.errors.ContentConflictError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field, computed_field

from lab.provenance.errors import ContentConflictError
from lab.provenance.graph import Difference, Edge, Node, NodeType, ProvenanceGraph

__all__ = ["IngestReport"]


class Version(NamedTuple):
    """A planned :meth:`~lab.provenance.graph.ProvenanceGraph.update_node` (e.g. an update or a delete of a memory)."""

    node: str
    reason: str
    changes: dict[str, Any]


#: One planned write.
Write = Node | Edge | Version

Status = Literal["present", "new", "extend", "empty"]


class Verdict(NamedTuple):
    """What to do with one run: its :data:`Status`, and the positions (in the run's planned order) of the planned
    writes the graph lacks, which are the ones to write."""

    status: Status
    missing: list[int]


def difference(graph: ProvenanceGraph, w: Write) -> tuple[str, str, Difference | None]:
    """``(kind, key, difference)`` of one planned write against the graph: a node or an edge by
    :meth:`~lab.provenance.graph.ProvenanceGraph.difference`, a version by
    :meth:`~lab.provenance.graph.ProvenanceGraph.update_difference` (found by its reason)."""
    if isinstance(w, Node):
        return "node", w.id, graph.difference(w)
    if isinstance(w, Edge):
        return "edge", w.key, graph.difference(w)
    return f"version {w.reason!r} of node", w.node, graph.update_difference(w.node, reason=w.reason, **w.changes)


def apply(graph: ProvenanceGraph, w: Write) -> None:
    """Write one planned write."""
    if isinstance(w, Node):
        graph.add_node(w)
    elif isinstance(w, Edge):
        graph.add_edge(w)
    else:
        graph.update_node(w.node, reason=w.reason, **w.changes)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _versus(stored: Any, given: Any, width: int = 30) -> str:
    """``<stored> in the graph but <given> here``; two long strings are shown around their first difference."""
    if isinstance(stored, str) and isinstance(given, str) and max(len(stored), len(given)) > 2 * width:
        at = next((i for i, (a, b) in enumerate(zip(stored, given)) if a != b), min(len(stored), len(given)))
        lo = max(0, at - width // 2)

        def cut(t: str) -> str:
            return ("..." if lo else "") + repr(t[lo : at + width])[1:-1] + ("..." if at + width < len(t) else "")

        return f"'{cut(stored)}' in the graph but '{cut(given)}' here (they differ from character {at})"
    return f"{_short(stored)} in the graph but {_short(given)} here"


def verdict(diffs: Iterable[tuple[str, str, Difference | None]], run: str, file: str) -> Verdict:
    """Present, new, extend or empty (module docstring), for one run's ``(kind, key, difference)`` triples, one per
    planned write in the run's order (:func:`difference`).

    Raises :class:`ContentConflictError` at the first planned write the graph holds with other content, naming
    it, its first differing field and both values, and the run.
    """
    missing: list[int] = []
    count = 0
    for count, (kind, key, d) in enumerate(diffs, 1):
        if d is None:
            continue
        if d.field is not None:
            raise ContentConflictError(
                f"run {run!r} is stored already with other content: {kind} {d.key!r} has {d.field} {_versus(d.stored, d.given)}; "
                f"nothing was written (stored records are never overwritten: ingest into another graph or under other run ids)",
                id=d.key, field=d.field, stored=d.stored, given=d.given, run=run, file=file,
            )
        missing.append(count - 1)
    if count == 0:
        return Verdict("empty", [])
    if not missing:
        return Verdict("present", [])
    return Verdict("new" if len(missing) == count else "extend", missing)


#: The :class:`IngestReport` field counting each node type.
_TYPE_FIELD = {NodeType.AGENT: "agents", NodeType.SOURCE: "sources", NodeType.CLAIM: "claims", NodeType.ACTION: "actions", NodeType.MEMORY: "memories"}
#: The :class:`IngestReport` count and id list of each :data:`Status`.
_STATUS_FIELDS = {"new": ("runs", "run_ids"), "extend": ("extended", "extended_ids"), "present": ("present", "present_ids"), "empty": ("empty", "empty_ids")}


class IngestReport(BaseModel):
    """What one ingest wrote, run by run.

    Every run the ingest read is counted once, in one of (each id list in input order):

    * ``runs`` (``run_ids``): runs written from scratch: the graph held none of their planned writes;
    * ``extended`` (``extended_ids``): runs the graph held in part, every stored write exactly as planned: only
      their missing writes were written (a re-exported trace that has grown);
    * ``present`` (``present_ids``): runs whose every planned write was found stored: nothing of them was written;
    * ``empty`` (``empty_ids``): runs with nothing to write (a trace of CHAIN spans only).

    ``agents`` ... ``memories``: the nodes, by type, actually added (by new and extended runs; ``actions``: writes,
    ``steps``: the generic steps of a span export, action nodes with ``attributes["write"] = False``); ``versions``: the
    node versions written (memory updates and deletes); ``edges``: the edges added. ``already_present``: nothing
    at all was written and some run was found stored (re-running an ingest into the same graph). ``unsupported``:
    the write actions added without any lineage path (flagged ``attributes["unsupported"]``).
    """

    runs: int = 0
    extended: int = 0
    agents: int = 0
    sources: int = 0
    claims: int = 0
    actions: int = 0
    memories: int = 0
    versions: int = 0
    edges: int = 0
    steps: int = 0
    unsupported: int = 0
    run_ids: list[str] = Field(default_factory=list)
    extended_ids: list[str] = Field(default_factory=list)
    present: int = 0
    present_ids: list[str] = Field(default_factory=list)
    empty: int = 0
    empty_ids: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def already_present(self) -> bool:
        return self.present > 0 and self.runs == 0 and self.extended == 0

    def _count(self, run: str, status: Status, written: Sequence[Write]) -> None:
        """Count a run of this status, with the writes written for it."""
        count, ids = _STATUS_FIELDS[status]
        setattr(self, count, getattr(self, count) + 1)
        getattr(self, ids).append(run)
        for w in written:
            field = _TYPE_FIELD[w.type] if isinstance(w, Node) else "edges" if isinstance(w, Edge) else "versions"
            if isinstance(w, Node) and w.type == NodeType.ACTION and w.attributes.get("write") is False:
                field = "steps"  # a generic step (OpenInference CHAIN, EMBEDDING, ...), not a write
            setattr(self, field, getattr(self, field) + 1)
            if isinstance(w, Node) and w.type == NodeType.ACTION and w.attributes.get("unsupported"):
                self.unsupported += 1
