"""The typed execution graph of agent runs (execution provenance), stored in SQLite.

Nodes are **agents** (principals), **sources** (tool results, documents), **memories**,
**claims** and **actions**; edges carry one of eight relations, read as
``src <relation> dst``:

====================== ================================================= ============ ==============
relation               meaning                                           lineage      carries
                                                                         (ancestor)   revocation
====================== ================================================= ============ ==============
``derived_from``       a memory/claim was derived from a source/memory   ``dst``      yes
``summarises``         a memory/claim summarises a record                ``dst``      yes
``supports``           evidence supports a claim or an action            ``src``      no
``used``               an action used a record                           ``dst``      yes
``generated``          an action generated a record                      ``src``      yes
``attributed_to``      a record is attributed to an agent                (none)
``acted_on_behalf_of`` an agent acted for another                        (none)
``invalidated_by``     a record was invalidated by an action or record   (none)
====================== ================================================= ============ ==============

*Carries revocation*: a record holding content of a revoked record through such an edge is revoked
with it; a ``supports`` edge is a justification, and a claim keeps standing while one of its supports
survives (:mod:`lab.provenance.lineage` defines revocation, invalidation and re-derivation exactly).

(the execution-provenance survey's relations, arXiv 2608, and MAP-Graph's lineage edges;
W3C PROV-DM's ``wasDerivedFrom``, ``used``, ``wasGeneratedBy``, ``wasAttributedTo``,
``actedOnBehalfOf``, ``wasInvalidatedBy``.) *Lineage* is the derivation order the
relations imply, stored in its own indexed table so that ancestry and descendant
queries are single recursive SQL queries.

What each node *inherits* along that lineage (effective permission labels, revocation, path
trust: :mod:`lab.provenance.lineage`) is kept in a derived table, the **inherited index**, that
every write brings up to date inside its own transaction: the nodes it changed and all their
descendants are recomputed from their ancestor closure just before COMMIT. A read of the index
(:meth:`ProvenanceGraph.indexed`) therefore costs O(candidates) and is never stale, even when
another process wrote the graph.

Every node carries its time (epoch seconds), owner agent (its **writer**), permission ``labels``
(scopes that may read it; empty = public), ``trust`` in [0, 1] and validity. Every edge records its
writer too: ``None`` for the recorder (an ingest replaying a trace, the runtime logging what happened),
or the agent that wrote it through the API, which may add lineage only to records it owns and only
from records it can read (:meth:`ProvenanceGraph.add_edge`). The graph does not authenticate its
callers: the code that writes on an agent's behalf names the agent. A record's path trust is capped by
its owner's trust and by its edges' writers' trust (:mod:`lab.provenance.lineage`), so an untrusted
writer cannot lend a record more trust than it has itself. The lineage is kept **acyclic**: an edge
that would close a derivation cycle is refused (:class:`~lab.provenance.errors.LineageCycleError`). The store
is **append-only**: a change to a node writes a new version (:meth:`ProvenanceGraph.history`
lists them), edges are never removed, and SQLite triggers refuse updates or deletes of
history. One SQLite file per store (WAL); :meth:`ProvenanceGraph.transaction` makes a
batch all-or-nothing. :meth:`ProvenanceGraph.difference` compares a node (as it was created) or an edge with the
stored one, which is what makes re-ingesting the same trace a no-op (:mod:`lab.provenance.ingest`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lab.provenance.errors import DuplicateNodeError, GraphIntegrityError, LineageCycleError, UnknownNodeError
from lab.provenance.lineage import Inherited, LineageClosure, factor, principal_scopes, propagate, read_decision

__all__ = ["NodeType", "Relation", "LINEAGE", "Node", "Edge", "Difference", "ProvenanceGraph"]


class NodeType(str, Enum):
    """The kind of a node (MAP-Graph's typed execution graph).

    ``AGENT``: a principal (an assistant, a user, a tool acting as one); holds scopes, owns records.
    ``SOURCE``: a tool result, document or user message, the evidence everything else rests on.
    ``MEMORY``: a stored record an agent wrote (a note, a summary). ``CLAIM``: an assertion an agent
    made (an assistant message). ``ACTION``: a tool call with effects, the thing the gate decides on.
    """

    AGENT = "agent"
    SOURCE = "source"
    MEMORY = "memory"
    CLAIM = "claim"
    ACTION = "action"


class Relation(str, Enum):
    """The relation of an edge ``src <relation> dst``; the module docstring's table gives each one's
    meaning, which endpoint is the lineage ancestor (:data:`LINEAGE`) and whether it carries revocation."""

    DERIVED_FROM = "derived_from"
    SUMMARISES = "summarises"
    SUPPORTS = "supports"
    USED = "used"
    GENERATED = "generated"
    ATTRIBUTED_TO = "attributed_to"
    ACTED_ON_BEHALF_OF = "acted_on_behalf_of"
    INVALIDATED_BY = "invalidated_by"


#: For relations that imply derivation order: which endpoint is the ancestor.
LINEAGE: dict[Relation, str] = {
    Relation.DERIVED_FROM: "dst",
    Relation.SUMMARISES: "dst",
    Relation.USED: "dst",
    Relation.SUPPORTS: "src",
    Relation.GENERATED: "src",
}

_RECORDS = {NodeType.SOURCE, NodeType.MEMORY, NodeType.CLAIM}
#: Node types each relation may connect (src types, dst types).
ALLOWED: dict[Relation, tuple[set[NodeType], set[NodeType]]] = {
    Relation.DERIVED_FROM: ({NodeType.MEMORY, NodeType.CLAIM, NodeType.SOURCE}, _RECORDS),
    Relation.SUMMARISES: ({NodeType.MEMORY, NodeType.CLAIM}, _RECORDS),
    Relation.SUPPORTS: (_RECORDS, {NodeType.CLAIM, NodeType.ACTION, NodeType.MEMORY}),
    Relation.USED: ({NodeType.ACTION}, _RECORDS),
    Relation.GENERATED: ({NodeType.ACTION}, _RECORDS),
    Relation.ATTRIBUTED_TO: (_RECORDS | {NodeType.ACTION}, {NodeType.AGENT}),
    Relation.ACTED_ON_BEHALF_OF: ({NodeType.AGENT}, {NodeType.AGENT}),
    Relation.INVALIDATED_BY: (_RECORDS, _RECORDS | {NodeType.ACTION}),
}


class Node(BaseModel):
    """A node of the execution graph (frozen; a change is a new version, :meth:`ProvenanceGraph.update_node`).

    Parameters
    ----------
    id : str
        Unique, non-empty.
    type : NodeType
    text : str
        What the record says (a tool result, a message, a summary); an action's call.
    time : float
        Epoch seconds (tau-bench runs carry message indices instead).
    owner : str, optional
        The agent that wrote (and owns) the record. When it is an agent node of the graph, its trust
        caps the record's path trust (:mod:`lab.provenance.lineage`); ``None``: the recorder's.
    labels : frozenset of str
        The scopes a reader needs, all of them (empty: anyone).
    trust : float
        The record's own trust in [0, 1] (a source's reliability); an agent's: how far what it writes is trusted.
    valid : bool
        ``False`` once invalidated (superseded, deleted).
    run : str, optional
        The agent run the node belongs to.
    attributes : dict
        Anything else (tool name, arguments, message index, grants ``scopes`` of an agent, ``revoked``...).
        ``attributes["valid_until"]`` (epoch seconds, a number): the record's validity ends then, after
        which the action gate treats it as stale for every risk class.

    Raises
    ------
    pydantic.ValidationError
        (a ``ValueError``) naming the field: e.g. a ``trust`` outside [0, 1], a non-numeric ``attributes.valid_until``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    type: NodeType
    text: str = ""
    time: float = 0.0
    owner: str | None = None
    labels: frozenset[str] = frozenset()
    trust: float = Field(1.0, ge=0.0, le=1.0)
    valid: bool = True
    run: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)

    @field_validator("attributes")
    @classmethod
    def _valid_until_is_a_time(cls, value: dict[str, Any]) -> dict[str, Any]:
        until = value.get("valid_until")
        if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float))):
            raise ValueError(f"attributes.valid_until must be epoch seconds (a number), got {until!r}")
        return value


class Edge(BaseModel):
    """``src <relation> dst`` at ``time``, written by ``writer``.

    Parameters
    ----------
    src, dst : str
        Node ids (both must exist when the edge is added).
    relation : Relation
    time : float
        Epoch seconds.
    writer : str, optional
        The agent that wrote the edge through the API; :meth:`ProvenanceGraph.add_edge` checks that it may.
        ``None``: the recorder (an ingest replaying a trace), which vouches for it.
    attributes : dict
        Anything else (the tokens a support rests on, the span it came from...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    src: str
    dst: str
    relation: Relation
    time: float = 0.0
    writer: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        """``"src -relation-> dst"``: what identifies the edge (the graph holds one edge per key)."""
        return f"{self.src} -{self.relation.value}-> {self.dst}"


class Difference(NamedTuple):
    """How the graph's copy of a node or edge differs from a given one (:meth:`ProvenanceGraph.difference`).

    ``key``: the node id, or the edge's :attr:`Edge.key` (``"src -relation-> dst"``); ``field``: the first field that differs
    (``attributes.score`` for a key of an object field; ``None``: the graph holds nothing under that key); ``stored`` and
    ``given``: that field's two values (JSON form).
    """

    key: str
    field: str | None
    stored: Any = None
    given: Any = None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _node_fields(node: Node) -> dict[str, Any]:
    """A node's fields in JSON form, labels sorted: two nodes are the same node iff these are equal."""
    data = node.model_dump(mode="json")
    data["labels"] = sorted(data["labels"])
    return data


def _first_difference(key: str, stored: dict[str, Any], given: dict[str, Any], prefix: str = "") -> Difference | None:
    """The first field of ``stored`` (in its order) whose JSON form differs in ``given``; within a field that is
    an object with the same keys on both sides, its first differing key (``attributes.score``)."""
    for field, value in stored.items():
        other = given[field]
        if _canonical(value) != _canonical(other):
            if isinstance(value, dict) and isinstance(other, dict) and value.keys() == other.keys():
                return _first_difference(key, value, other, f"{prefix}{field}.")
            return Difference(key, prefix + field, value, other)
    return None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS node_versions (
    id TEXT NOT NULL, version INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    written REAL NOT NULL, reason TEXT, PRIMARY KEY (id, version)
);
CREATE TABLE IF NOT EXISTS nodes (
    id TEXT PRIMARY KEY, version INTEGER NOT NULL, type TEXT NOT NULL, run TEXT, owner TEXT, body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS nodes_type ON nodes(type);
CREATE INDEX IF NOT EXISTS nodes_run ON nodes(run);
CREATE TABLE IF NOT EXISTS edges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, src TEXT NOT NULL, dst TEXT NOT NULL, relation TEXT NOT NULL,
    time REAL NOT NULL, attributes TEXT NOT NULL, writer TEXT, UNIQUE (src, dst, relation)
);
CREATE INDEX IF NOT EXISTS edges_src ON edges(src);
CREATE INDEX IF NOT EXISTS edges_dst ON edges(dst);
CREATE TABLE IF NOT EXISTS lineage (
    child TEXT NOT NULL, parent TEXT NOT NULL, relation TEXT NOT NULL, writer TEXT, PRIMARY KEY (child, parent, relation)
);
CREATE INDEX IF NOT EXISTS lineage_parent ON lineage(parent);
CREATE TRIGGER IF NOT EXISTS node_versions_no_update BEFORE UPDATE ON node_versions BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER IF NOT EXISTS node_versions_no_delete BEFORE DELETE ON node_versions BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER IF NOT EXISTS edges_no_update BEFORE UPDATE ON edges BEGIN SELECT RAISE(ABORT, 'edges are append-only'); END;
CREATE TRIGGER IF NOT EXISTS edges_no_delete BEFORE DELETE ON edges BEGIN SELECT RAISE(ABORT, 'edges are append-only'); END;
CREATE TRIGGER IF NOT EXISTS nodes_no_delete BEFORE DELETE ON nodes BEGIN SELECT RAISE(ABORT, 'nodes are never deleted: invalidate them'); END;
"""
#: Indexes on columns a store written before edges had writers lacks until :meth:`ProvenanceGraph.__init__` adds them.
_WRITER_SCHEMA = """
CREATE INDEX IF NOT EXISTS nodes_owner ON nodes(owner);
CREATE INDEX IF NOT EXISTS lineage_writer ON lineage(writer);
"""


def _body(node: Node) -> str:
    return node.model_dump_json()


def _node(body: str) -> Node:
    """A stored node, without re-validating what was validated when it was written (hot path)."""
    data = json.loads(body)
    data["type"] = NodeType(data["type"])
    data["labels"] = frozenset(data["labels"])
    return Node.model_construct(**data)


#: ``PRAGMA user_version`` of a store whose inherited index is complete.
_INDEX_VERSION = 3
_INDEX_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS inherited "
    "(id TEXT PRIMARY KEY, version INTEGER NOT NULL, labels TEXT NOT NULL, revoked_by TEXT, path_trust REAL NOT NULL, "
    "invalidated_by TEXT, rederive TEXT)"
)
#: Host parameters per ``IN (...)`` query (SQLite's default limit is 32,766).
_MAX_VARIABLES = 30_000


class ProvenanceGraph:
    """An append-only execution graph in one SQLite file.

    Parameters
    ----------
    path : str or Path
        The SQLite file (its folder is created; WAL mode), or ``":memory:"`` for a throwaway graph. A store
        written by an earlier version is upgraded on open (edge writers added as ``NULL``, the recorder;
        the inherited index rebuilt).

    Raises
    ------
    DuplicateNodeError, UnknownNodeError, GraphIntegrityError, LineageCycleError
        As documented per method; a failed write inside :meth:`transaction` rolls the whole batch back.
    """

    def __init__(self, path: str | Path = ":memory:"):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._conn.executescript(_SCHEMA)
        for table in ("edges", "lineage"):  # a store written before edges had writers: add the column (NULL: the recorder)
            if "writer" not in {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")}:
                self._conn.execute(f"ALTER TABLE {table} ADD COLUMN writer TEXT")
        self._conn.executescript(_WRITER_SCHEMA)
        self._depth = 0
        self._cache: dict[tuple[str, int], Node] = {}  # parsed node versions (immutable, so never stale)
        self._labels_cache: dict[str, dict[str, str]] = {}  # inherited.labels text -> parsed
        self._dirty: set[str] = set()  # nodes whose inherited row must be recomputed before COMMIT
        self._conn.execute(_INDEX_SCHEMA)
        if self._conn.execute("PRAGMA user_version").fetchone()[0] < _INDEX_VERSION:
            with self.transaction():  # a store written before this index existed: (re)build it once
                self._conn.execute("DROP TABLE inherited")
                self._conn.execute(_INDEX_SCHEMA)
                self._dirty.update(r[0] for r in self._conn.execute("SELECT id FROM nodes"))
                self._conn.execute(f"PRAGMA user_version = {_INDEX_VERSION}")

    def close(self) -> None:
        """Close the SQLite connection (the file stays; open it again with a new :class:`ProvenanceGraph`)."""
        self._conn.close()

    def __enter__(self) -> ProvenanceGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transactions

    @contextmanager
    def transaction(self) -> Iterator[ProvenanceGraph]:
        """All writes inside commit together or not at all (nested uses join the outer one)."""
        if self._depth == 0:
            self._conn.execute("BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield self
            if self._depth == 1:
                self._flush_index()  # inside the transaction: the index commits with the writes
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self._dirty.clear()
                self._conn.execute("ROLLBACK")
            raise
        self._depth -= 1
        if self._depth == 0:
            self._conn.execute("COMMIT")

    def _flush_index(self) -> None:
        """Recompute the inherited rows of the dirty nodes and of everything derived from them."""
        if not self._dirty:
            return
        dirty = json.dumps(sorted(self._dirty))
        affected = [
            r[0]
            for r in self._conn.execute(
                "WITH RECURSIVE down(id) AS (SELECT value FROM json_each(?) "
                "UNION SELECT l.child FROM lineage l JOIN down ON l.parent = down.id) SELECT id FROM down",
                (dirty,),
            )
        ]
        closure = self.lineage_closure(affected)
        inherited = propagate(closure)
        self._conn.executemany(
            "INSERT OR REPLACE INTO inherited VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                (i, closure.versions[i], json.dumps(inh.labels), inh.revoked_by, inh.path_trust, inh.invalidated_by, json.dumps(inh.rederive) if inh.rederive else None)
                for i, inh in ((i, inherited[i]) for i in affected)
            ),
        )
        self._dirty.clear()

    def _writer_changed(self, agent: str) -> None:
        """An agent's trust caps what it owns and the lineage edges it wrote: mark those rows for recomputation."""
        self._dirty.update(
            r[0] for r in self._conn.execute("SELECT id FROM nodes WHERE owner = ?1 UNION SELECT child FROM lineage WHERE writer = ?1", (agent,))
        )

    # -- writes

    def add_node(self, node: Node) -> Node:
        """Add a new node (version 1, reason ``"created"``).

        Parameters
        ----------
        node : Node
            Its ``owner``, when an agent of the graph, caps its path trust from now on.

        Returns
        -------
        Node
            ``node``.

        Raises
        ------
        DuplicateNodeError
            The id exists (nodes are never overwritten: :meth:`update_node`).
        """
        with self.transaction():
            if self._conn.execute("SELECT 1 FROM nodes WHERE id = ?", (node.id,)).fetchone():
                raise DuplicateNodeError(f"node {node.id!r} exists already; use update_node to change it")
            body = _body(node)
            self._conn.execute("INSERT INTO node_versions VALUES (?, 1, ?, ?, ?, 'created')", (node.id, node.type.value, body, time.time()))
            self._conn.execute("INSERT INTO nodes VALUES (?, 1, ?, ?, ?, ?)", (node.id, node.type.value, node.run, node.owner, body))
            self._dirty.add(node.id)
            if node.type == NodeType.AGENT:  # records may name it as owner before it exists
                self._writer_changed(node.id)
        return node

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        """Add many nodes in one transaction (all or none); see :meth:`add_node`.

        Parameters
        ----------
        nodes : iterable of Node
        """
        with self.transaction():
            for node in nodes:
                self.add_node(node)

    def add_edge(self, edge: Edge, *, verify_writer: bool = True) -> Edge:
        """Add an edge (idempotent for the same src, dst and relation: the first one written is kept).

        Parameters
        ----------
        edge : Edge
        verify_writer : bool
            Check that ``edge.writer`` may write it (below). ``False`` only to restore edges whose writers
            were checked when they were first written (:func:`lab.provenance.prov_export.from_prov`).

        Returns
        -------
        Edge
            ``edge``.

        Raises
        ------
        GraphIntegrityError
            An endpoint is missing; the relation does not connect those node types (:data:`ALLOWED`); or
            ``edge.writer`` is set and is not an agent of the graph, does not own the record the edge
            adds lineage to (the child; for a relation without lineage, ``src``) or cannot read the
            record it adds as lineage parent (its labels, its revocation: :meth:`AccessPolicy.can_read`).
        LineageCycleError
            The edge would close a derivation cycle (its ``cycle`` attribute lists the nodes).
        """
        src, dst = self._type(edge.src), self._type(edge.dst)
        allowed_src, allowed_dst = ALLOWED[edge.relation]
        if src not in allowed_src or dst not in allowed_dst:
            raise GraphIntegrityError(
                f"{edge.relation.value} cannot connect {src.value} {edge.src!r} to {dst.value} {edge.dst!r} "
                f"(allowed: {sorted(t.value for t in allowed_src)} -> {sorted(t.value for t in allowed_dst)})"
            )
        side = LINEAGE.get(edge.relation)
        parent, child = ((edge.dst, edge.src) if side == "dst" else (edge.src, edge.dst)) if side is not None else (None, None)
        with self.transaction():
            if edge.writer is not None and verify_writer:
                self._check_writer(edge, child if child is not None else edge.src, parent)
            if child is not None:
                self._check_acyclic(edge, child, parent)
            self._conn.execute(
                "INSERT OR IGNORE INTO edges(src, dst, relation, time, attributes, writer) VALUES (?, ?, ?, ?, ?, ?)",
                (edge.src, edge.dst, edge.relation.value, edge.time, json.dumps(edge.attributes, sort_keys=True), edge.writer),
            )
            if child is not None:
                if self._conn.execute("INSERT OR IGNORE INTO lineage VALUES (?, ?, ?, ?)", (child, parent, edge.relation.value, edge.writer)).rowcount:
                    self._dirty.add(child)
        return edge

    def _check_writer(self, edge: Edge, subject: str, parent: str | None) -> None:
        """Refuse an edge its writer may not write (see :meth:`add_edge`)."""
        row = self._conn.execute("SELECT body FROM nodes WHERE id = ?", (edge.writer,)).fetchone()
        writer = _node(row[0]) if row else None
        if writer is None or writer.type != NodeType.AGENT:
            raise GraphIntegrityError(f"{edge.key}: writer {edge.writer!r} is not an agent of the graph")
        owner = self.node(subject).owner
        if subject != edge.writer and owner != edge.writer:
            hint = "a record without owner takes lineage from the recorder only (writer=None)" if owner is None else "an agent adds lineage only to its own records"
            raise GraphIntegrityError(f"{edge.key}: writer {edge.writer!r} does not own {subject!r} (owner {owner!r}): {hint}")
        if parent is not None:
            ok, why = read_decision(parent, self.indexed([parent])[parent][1], principal_scopes(writer))
            if not ok:
                raise GraphIntegrityError(f"{edge.key}: writer {edge.writer!r} cannot read {parent!r}: {why}")

    def _check_acyclic(self, edge: Edge, child: str, parent: str) -> None:
        """Refuse a lineage edge ``parent -> child`` when ``parent`` already derives from ``child``."""
        if parent != child:
            down = (
                "WITH RECURSIVE down(id) AS (SELECT ?1 UNION SELECT l.child FROM lineage l JOIN down ON l.parent = down.id) "
            )
            if self._conn.execute(down + "SELECT 1 FROM down WHERE id = ?2 LIMIT 1", (child, parent)).fetchone() is None:
                return
            g = nx.DiGraph()
            g.add_edges_from(self._conn.execute(down + "SELECT l.parent, l.child FROM lineage l WHERE l.parent IN down", (child,)))
            cycle = nx.shortest_path(g, child, parent)
        else:
            cycle = [child]
        raise LineageCycleError(
            f"{edge.key} would close a derivation cycle {' -> '.join([*cycle, child])} "
            "(each derived from the one before it): the lineage must stay acyclic",
            cycle=cycle,
            edge=edge.key,
        )

    def add_edges(self, edges: Iterable[Edge], *, verify_writer: bool = True) -> None:
        """Add many edges in one transaction (all or none); see :meth:`add_edge`.

        Parameters
        ----------
        edges : iterable of Edge
        verify_writer : bool
            As in :meth:`add_edge`.
        """
        with self.transaction():
            for edge in edges:
                self.add_edge(edge, verify_writer=verify_writer)

    def update_node(self, node_id: str, *, reason: str, **changes: Any) -> Node:
        """Write a new version of a node with ``changes``; the old versions stay in :meth:`history`.

        Parameters
        ----------
        node_id : str
        reason : str
            Why (kept with the version).
        **changes
            :class:`Node` fields and their new values (``trust=0.2``, ``labels=...``); not ``id`` or ``type``.

        Returns
        -------
        Node
            The new version. Everything inherited from it (its descendants' labels, revocation, trust; for
            an agent, the trust of what it owns or wrote) is brought up to date in the same transaction.

        Raises
        ------
        UnknownNodeError
        GraphIntegrityError
            A change of ``id`` or ``type``.
        pydantic.ValidationError
            A changed field out of its range.
        """
        with self.transaction():
            row = self._conn.execute("SELECT version, body FROM nodes WHERE id = ?", (node_id,)).fetchone()
            if row is None:
                raise UnknownNodeError(f"no node {node_id!r}")
            if "id" in changes or "type" in changes:
                raise GraphIntegrityError("a node's id and type never change")
            old = _node(row[1])
            new = Node.model_validate(old.model_copy(update=changes).model_dump())  # validate the changed fields
            version = row[0] + 1
            body = _body(new)
            self._conn.execute("INSERT INTO node_versions VALUES (?, ?, ?, ?, ?, ?)", (node_id, version, new.type.value, body, time.time(), reason))
            self._conn.execute("UPDATE nodes SET version = ?, owner = ?, body = ? WHERE id = ?", (version, new.owner, body, node_id))
            self._dirty.add(node_id)  # labels, trust, validity or revocation may have changed
            if new.type == NodeType.AGENT and factor(new) != factor(old):  # not on a grant: scopes cap no trust
                self._writer_changed(node_id)
        return new

    def invalidate(self, node_id: str, *, by: str | None = None, reason: str = "invalidated") -> Node:
        """Mark a record invalid (a new version with ``valid=False``), with an ``invalidated_by`` edge to ``by``.

        What follows for its descendants (:mod:`lab.provenance.lineage`): a record whose every lineage
        parent is gone is *unsupported* and no longer returned or used as evidence; a record that carries
        its content (``derived_from``, ``summarises``, ``used``, ``generated``) while other supports survive
        is marked for re-derivation (``Inherited.rederive``) and keeps only the trust its surviving
        supports give; a claim with another surviving ``supports`` parent is unaffected. Revocation
        (:meth:`AccessPolicy.revoke_source`) differs only on the carrying case: there the descendant is revoked.

        Parameters
        ----------
        node_id : str
        by : str, optional
            The action or record that invalidated it.
        reason : str
            The version's reason in :meth:`history`.

        Raises
        ------
        UnknownNodeError
        """
        with self.transaction():
            node = self.update_node(node_id, reason=reason, valid=False)
            if by is not None:
                self.add_edge(Edge(src=node_id, dst=by, relation=Relation.INVALIDATED_BY, time=time.time()))
        return node

    # -- reads

    def difference(self, item: Node | Edge) -> Difference | None:
        """``None`` when the graph holds ``item`` exactly as given, else the first :class:`Difference`.

        Parameters
        ----------
        item : Node or Edge

        A node is compared, field by field in :class:`Node`'s order (type, text, time, owner, labels, trust,
        validity, run, attributes), with the version it was **created** as (version 1): the later versions
        :meth:`update_node` writes (grants, revocations, invalidation) are its history, not a difference. An
        edge is compared on ``time``, ``attributes`` and ``writer`` with the stored edge of the same src, dst and relation
        (:meth:`add_edge` keeps the first of those). Values compare in their JSON form (``1`` is not ``True``).
        """
        if isinstance(item, Node):
            key = item.id
            row = self._conn.execute("SELECT body FROM node_versions WHERE id = ? AND version = 1", (key,)).fetchone()
            if row is None:
                return Difference(key, None)
            stored, given = _node_fields(_node(row[0])), _node_fields(item)
        else:
            key = item.key
            row = self._conn.execute(
                "SELECT time, attributes, writer FROM edges WHERE src = ? AND dst = ? AND relation = ?", (item.src, item.dst, item.relation.value)
            ).fetchone()
            if row is None:
                return Difference(key, None)
            stored = {"time": row[0], "attributes": json.loads(row[1]), "writer": row[2]}
            given = {"time": item.time, "attributes": json.loads(json.dumps(item.attributes, sort_keys=True)), "writer": item.writer}
        return _first_difference(key, stored, given)

    def update_difference(self, node_id: str, *, reason: str, **changes: Any) -> Difference | None:
        """``None`` when the graph holds the version ``update_node(node_id, reason=reason, **changes)`` would
        write (the first version written with that ``reason``, its ``changes`` fields as given), else the
        :class:`Difference`: the first differing field, or ``field=None`` when there is no such version.

        Parameters
        ----------
        node_id : str
        reason : str
        **changes
            As for :meth:`update_node`.
        """
        for _, written_for, node in self.history(node_id) if node_id in self else ():
            if written_for == reason:
                stored = _node_fields(node)
                given = _node_fields(Node.model_validate({**stored, **changes}))
                return _first_difference(node_id, {f: stored[f] for f in changes}, given)
        return Difference(node_id, None)

    def _parsed(self, node_id: str, version: int, body: str) -> Node:
        """The parsed node version ``(node_id, version)``; versions never change, so the cache is exact."""
        key = (node_id, version)
        node = self._cache.get(key)
        if node is None:
            if len(self._cache) > 500_000:
                self._cache.clear()
            node = self._cache[key] = _node(body)
        return node

    def lineage_closure(self, node_ids: Iterable[str]) -> LineageClosure:
        """The requested nodes and all their lineage ancestors, with their lineage edges' relations and the
        trust of their owners and edge writers (one recursive query, one for edges, one for writers).

        The one ancestor-closure reader of the facet: :mod:`lab.provenance.lineage` computes from it
        what the inherited index holds; :mod:`lab.provenance.trust` reads source ancestries from it.

        Parameters
        ----------
        node_ids : iterable of str

        Returns
        -------
        LineageClosure

        Raises
        ------
        UnknownNodeError
            A requested id is not in the graph.
        """
        ids = list(dict.fromkeys(node_ids))
        rows = self._conn.execute(
            "WITH RECURSIVE up(id) AS (SELECT value FROM json_each(?) "
            "UNION SELECT l.parent FROM lineage l JOIN up ON l.child = up.id) "
            "SELECT n.id, n.version, n.body FROM up JOIN nodes n ON n.id = up.id",
            (json.dumps(ids),),
        ).fetchall()
        nodes = {i: self._parsed(i, version, body) for i, version, body in rows}
        versions = {i: version for i, version, _ in rows}
        missing = [i for i in ids if i not in nodes]
        if missing:
            raise UnknownNodeError(f"no node {missing[0]!r}")
        parents: dict[str, list[str]] = {i: [] for i in nodes}
        relations: dict[tuple[str, str], frozenset[str]] = {}
        writers: dict[tuple[str, str], set[str]] = {}  # only pairs with an agent-written edge (the rest: the recorder)
        edge_rows = self._conn.execute(
            "SELECT child, parent, relation, writer FROM lineage WHERE child IN (SELECT value FROM json_each(?)) ORDER BY child, parent",
            (json.dumps(sorted(nodes)),),
        )
        one = {r: frozenset({r}) for r in (rel.value for rel in LINEAGE)}
        for child, parent, relation, writer in edge_rows:
            if parent in nodes:
                pair = (child, parent)
                had = relations.get(pair)
                if had is None:
                    parents[child].append(parent)
                    relations[pair] = one.get(relation) or frozenset({relation})
                else:
                    relations[pair] = had | {relation}
                if writer is not None:
                    writers.setdefault(pair, set()).add(writer)
        named = {n.owner for n in nodes.values() if n.owner is not None} | {w for ws in writers.values() for w in ws}
        agents = {
            i: factor(_node(body))
            for i, body in self._conn.execute("SELECT id, body FROM nodes WHERE type = 'agent' AND id IN (SELECT value FROM json_each(?))", (json.dumps(sorted(named)),))
        } if named else {}
        owner_trust = {i: agents[n.owner] for i, n in nodes.items() if n.owner in agents and n.type != NodeType.AGENT}
        # a pair also written by the recorder (writer NULL) keeps the recorder's 1; else the best agent writer's
        recorded = {pair for pair in writers if self._conn.execute(
            "SELECT 1 FROM lineage WHERE child = ? AND parent = ? AND writer IS NULL LIMIT 1", pair).fetchone()}
        edge_trust = {pair: max(agents.get(w, 1.0) for w in ws) for pair, ws in writers.items() if pair not in recorded}
        return LineageClosure(nodes, parents, versions, relations, edge_trust, owner_trust)

    def indexed(self, node_ids: Iterable[str]) -> dict[str, tuple[Node, Inherited]]:
        """The current node and its inherited row (effective labels with carriers, revocation, path trust,
        invalidation and the re-derivation mark) for each id, from the inherited index: one query,
        O(len(node_ids)).

        Parameters
        ----------
        node_ids : iterable of str

        Returns
        -------
        dict of str to (Node, Inherited)
            In the order of ``node_ids`` (repeats dropped); what :meth:`AccessPolicy.filter` takes.

        Raises
        ------
        UnknownNodeError
            An id is not in the graph.
        """
        ids = list(dict.fromkeys(node_ids))
        if self._depth:
            self._flush_index()  # writes pending in the open transaction are visible to it
            return self._indexed(ids)
        self._conn.execute("BEGIN")  # one snapshot for the index rows and the node bodies
        try:
            return self._indexed(ids)
        finally:
            self._conn.execute("COMMIT")

    def _indexed(self, ids: list[str]) -> dict[str, tuple[Node, Inherited]]:
        out: dict[str, tuple[Node, Inherited]] = {}
        parsed_labels = self._labels_cache
        for start in range(0, len(ids), _MAX_VARIABLES):
            chunk = ids[start : start + _MAX_VARIABLES]
            uncached: list[str] = []
            rows = self._conn.execute(
                f"SELECT id, version, labels, revoked_by, path_trust, invalidated_by, rederive FROM inherited WHERE id IN ({','.join('?' * len(chunk))})", chunk
            ).fetchall()
            for i, version, *_ in rows:
                if (i, version) not in self._cache:
                    uncached.append(i)
            if uncached:  # bodies only for node versions not parsed before
                for i, version, body in self._conn.execute(f"SELECT id, version, body FROM nodes WHERE id IN ({','.join('?' * len(uncached))})", uncached):
                    self._parsed(i, version, body)
            found: dict[str, tuple[Node, Inherited]] = {}
            for i, version, labels, revoked_by, trust, invalidated_by, rederive in rows:
                lab = parsed_labels.get(labels)
                if lab is None:  # few distinct label sets: parse each once (the dicts are read-only)
                    if len(parsed_labels) > 100_000:
                        parsed_labels.clear()
                    lab = parsed_labels[labels] = json.loads(labels)
                marks = tuple(json.loads(rederive)) if rederive else ()
                found[i] = (self._cache[(i, version)], Inherited(lab, revoked_by, trust, invalidated_by, marks))
            for i in chunk:  # in the order asked
                if i in found:
                    out[i] = found[i]
        if len(out) != len(ids):
            raise UnknownNodeError(f"no node {next(i for i in ids if i not in out)!r}")
        return out

    def _type(self, node_id: str) -> NodeType:
        row = self._conn.execute("SELECT type FROM nodes WHERE id = ?", (node_id,)).fetchone()
        if row is None:
            raise GraphIntegrityError(f"no node {node_id!r}: add it before its edges")
        return NodeType(row[0])

    def __contains__(self, node_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM nodes WHERE id = ?", (node_id,)).fetchone() is not None

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM nodes").fetchone()[0])

    def node(self, node_id: str) -> Node:
        """The current version of a node.

        Parameters
        ----------
        node_id : str

        Raises
        ------
        UnknownNodeError
        """
        row = self._conn.execute("SELECT body FROM nodes WHERE id = ?", (node_id,)).fetchone()
        if row is None:
            raise UnknownNodeError(f"no node {node_id!r}")
        return _node(row[0])

    def nodes(self, type: NodeType | str | None = None, *, run: str | None = None) -> list[Node]:
        """The current version of every node, in insertion order.

        Parameters
        ----------
        type : NodeType or str, optional
            Only nodes of this type.
        run : str, optional
            Only nodes of this run.
        """
        sql, args = "SELECT body FROM nodes WHERE 1=1", []
        if type is not None:
            sql += " AND type = ?"
            args.append(NodeType(type).value)
        if run is not None:
            sql += " AND run = ?"
            args.append(run)
        return [_node(r[0]) for r in self._conn.execute(sql + " ORDER BY rowid", args)]

    def edges(self, *, src: str | None = None, dst: str | None = None, relation: Relation | str | None = None) -> list[Edge]:
        """The edges, in insertion order, each with its writer.

        Parameters
        ----------
        src, dst : str, optional
            Only edges from / to this node.
        relation : Relation or str, optional
            Only edges of this relation.
        """
        sql, args = "SELECT src, dst, relation, time, attributes, writer FROM edges WHERE 1=1", []
        for col, val in (("src", src), ("dst", dst)):
            if val is not None:
                sql += f" AND {col} = ?"
                args.append(val)
        if relation is not None:
            sql += " AND relation = ?"
            args.append(Relation(relation).value)
        return [
            Edge(src=r[0], dst=r[1], relation=r[2], time=r[3], writer=r[5], attributes=json.loads(r[4])) for r in self._conn.execute(sql + " ORDER BY seq", args)
        ]

    def history(self, node_id: str) -> list[tuple[int, str, Node]]:
        """Every version of a node: ``(version, reason, node)``, oldest first.

        Parameters
        ----------
        node_id : str

        Raises
        ------
        UnknownNodeError
        """
        rows = self._conn.execute("SELECT version, reason, body FROM node_versions WHERE id = ? ORDER BY version", (node_id,)).fetchall()
        if not rows:
            raise UnknownNodeError(f"no node {node_id!r}")
        return [(v, reason, _node(body)) for v, reason, body in rows]

    def parents(self, node_id: str) -> list[str]:
        """Direct lineage parents (what ``node_id`` was derived from, summarises, used or is supported by), sorted.

        Parameters
        ----------
        node_id : str
        """
        return [r[0] for r in self._conn.execute("SELECT DISTINCT parent FROM lineage WHERE child = ? ORDER BY parent", (node_id,))]

    def children(self, node_id: str) -> list[str]:
        """Direct lineage children (what derives from ``node_id`` or rests on it), sorted.

        Parameters
        ----------
        node_id : str
        """
        return [r[0] for r in self._conn.execute("SELECT DISTINCT child FROM lineage WHERE parent = ? ORDER BY child", (node_id,))]

    def ancestors(self, node_id: str) -> set[str]:
        """Everything ``node_id`` derives from, transitively (one recursive query over the lineage index).

        Parameters
        ----------
        node_id : str
        """
        rows = self._conn.execute(
            "WITH RECURSIVE up(id) AS (SELECT parent FROM lineage WHERE child = ? "
            "UNION SELECT l.parent FROM lineage l JOIN up ON l.child = up.id) SELECT id FROM up",
            (node_id,),
        )
        return {r[0] for r in rows} - {node_id}

    def descendants(self, node_id: str) -> set[str]:
        """Everything derived from ``node_id``, transitively.

        Parameters
        ----------
        node_id : str
        """
        rows = self._conn.execute(
            "WITH RECURSIVE down(id) AS (SELECT child FROM lineage WHERE parent = ? "
            "UNION SELECT l.child FROM lineage l JOIN down ON l.parent = down.id) SELECT id FROM down",
            (node_id,),
        )
        return {r[0] for r in rows} - {node_id}

    def runs(self) -> list[str]:
        """The run ids of the nodes, sorted."""
        return [r[0] for r in self._conn.execute("SELECT DISTINCT run FROM nodes WHERE run IS NOT NULL ORDER BY run")]

    def to_networkx(self, *, run: str | None = None, lineage_only: bool = False) -> nx.MultiDiGraph:
        """A networkx view: nodes with their fields as attributes; edges keyed by relation, with ``time``,
        ``writer`` and their attributes.

        Parameters
        ----------
        run : str, optional
            Only this run's nodes (and the edges between them).
        lineage_only : bool
            Parent -> child edges of the derivation order instead (acyclic).
        """
        g = nx.MultiDiGraph()
        for node in self.nodes(run=run):
            g.add_node(node.id, **node.model_dump(exclude={"id"}))
        if lineage_only:
            for child, parent, relation in self._conn.execute("SELECT child, parent, relation FROM lineage"):
                if child in g and parent in g:
                    g.add_edge(parent, child, key=relation, relation=relation)
        else:
            for e in self.edges():
                if e.src in g and e.dst in g:
                    g.add_edge(e.src, e.dst, key=e.relation.value, **{**e.attributes, "relation": e.relation.value, "time": e.time, "writer": e.writer})
        return g
