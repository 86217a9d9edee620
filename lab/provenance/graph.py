"""The typed execution graph of agent runs (execution provenance), stored in SQLite.

Nodes are **agents** (principals), **sources** (tool results, documents), **memories**,
**claims** and **actions**; edges carry one of seven relations, read as
``src <relation> dst``:

==================== =================================================== ===================
relation             meaning                                             lineage (ancestor)
==================== =================================================== ===================
``derived_from``     a memory/claim was derived from a source/memory      ``dst``
``supports``         evidence supports a claim or an action               ``src``
``used``             an action used a record                              ``dst``
``generated``        an action generated a record                         ``src``
``attributed_to``    a record is attributed to an agent                   (none)
``acted_on_behalf_of`` an agent acted for another                         (none)
``invalidated_by``   a record was invalidated by an action or record      (none)
==================== =================================================== ===================

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

Every node carries its time (epoch seconds), owner agent, permission ``labels``
(scopes that may read it; empty = public), ``trust`` in [0, 1] and validity. The store
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
from pydantic import BaseModel, ConfigDict, Field

from lab.provenance.errors import DuplicateNodeError, GraphIntegrityError, UnknownNodeError
from lab.provenance.lineage import Inherited, LineageClosure, propagate

__all__ = ["NodeType", "Relation", "LINEAGE", "Node", "Edge", "Difference", "ProvenanceGraph"]


class NodeType(str, Enum):
    AGENT = "agent"
    SOURCE = "source"
    MEMORY = "memory"
    CLAIM = "claim"
    ACTION = "action"


class Relation(str, Enum):
    DERIVED_FROM = "derived_from"
    SUPPORTS = "supports"
    USED = "used"
    GENERATED = "generated"
    ATTRIBUTED_TO = "attributed_to"
    ACTED_ON_BEHALF_OF = "acted_on_behalf_of"
    INVALIDATED_BY = "invalidated_by"


#: For relations that imply derivation order: which endpoint is the ancestor.
LINEAGE: dict[Relation, str] = {Relation.DERIVED_FROM: "dst", Relation.USED: "dst", Relation.SUPPORTS: "src", Relation.GENERATED: "src"}

_RECORDS = {NodeType.SOURCE, NodeType.MEMORY, NodeType.CLAIM}
#: Node types each relation may connect (src types, dst types).
ALLOWED: dict[Relation, tuple[set[NodeType], set[NodeType]]] = {
    Relation.DERIVED_FROM: ({NodeType.MEMORY, NodeType.CLAIM, NodeType.SOURCE}, _RECORDS),
    Relation.SUPPORTS: (_RECORDS, {NodeType.CLAIM, NodeType.ACTION, NodeType.MEMORY}),
    Relation.USED: ({NodeType.ACTION}, _RECORDS),
    Relation.GENERATED: ({NodeType.ACTION}, _RECORDS),
    Relation.ATTRIBUTED_TO: (_RECORDS | {NodeType.ACTION}, {NodeType.AGENT}),
    Relation.ACTED_ON_BEHALF_OF: ({NodeType.AGENT}, {NodeType.AGENT}),
    Relation.INVALIDATED_BY: (_RECORDS, _RECORDS | {NodeType.ACTION}),
}


class Node(BaseModel):
    """A node of the execution graph.

    ``labels``: the scopes allowed to read the record (empty: anyone); ``trust``: the record's own
    trust in [0, 1] (a source's reliability); ``time``: epoch seconds; ``run``: the agent run it
    belongs to; ``attributes``: anything else (tool name, arguments, message index...).
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


class Edge(BaseModel):
    """``src <relation> dst`` at ``time`` (epoch seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    src: str
    dst: str
    relation: Relation
    time: float = 0.0
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
    time REAL NOT NULL, attributes TEXT NOT NULL, UNIQUE (src, dst, relation)
);
CREATE INDEX IF NOT EXISTS edges_src ON edges(src);
CREATE INDEX IF NOT EXISTS edges_dst ON edges(dst);
CREATE TABLE IF NOT EXISTS lineage (child TEXT NOT NULL, parent TEXT NOT NULL, relation TEXT NOT NULL, PRIMARY KEY (child, parent, relation));
CREATE INDEX IF NOT EXISTS lineage_parent ON lineage(parent);
CREATE TRIGGER IF NOT EXISTS node_versions_no_update BEFORE UPDATE ON node_versions BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER IF NOT EXISTS node_versions_no_delete BEFORE DELETE ON node_versions BEGIN SELECT RAISE(ABORT, 'history is append-only'); END;
CREATE TRIGGER IF NOT EXISTS edges_no_update BEFORE UPDATE ON edges BEGIN SELECT RAISE(ABORT, 'edges are append-only'); END;
CREATE TRIGGER IF NOT EXISTS edges_no_delete BEFORE DELETE ON edges BEGIN SELECT RAISE(ABORT, 'edges are append-only'); END;
CREATE TRIGGER IF NOT EXISTS nodes_no_delete BEFORE DELETE ON nodes BEGIN SELECT RAISE(ABORT, 'nodes are never deleted: invalidate them'); END;
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
_INDEX_VERSION = 2
_INDEX_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS inherited "
    "(id TEXT PRIMARY KEY, version INTEGER NOT NULL, labels TEXT NOT NULL, revoked_by TEXT, path_trust REAL NOT NULL)"
)
#: Host parameters per ``IN (...)`` query (SQLite's default limit is 32,766).
_MAX_VARIABLES = 30_000


class ProvenanceGraph:
    """An append-only execution graph in one SQLite file (``":memory:"`` for a throwaway one).

    Raises
    ------
    DuplicateNodeError, UnknownNodeError, GraphIntegrityError
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
            "INSERT OR REPLACE INTO inherited VALUES (?, ?, ?, ?, ?)",
            ((i, closure.versions[i], json.dumps(inherited[i].labels), inherited[i].revoked_by, inherited[i].path_trust) for i in affected),
        )
        self._dirty.clear()

    # -- writes

    def add_node(self, node: Node) -> Node:
        """Add a new node. Raises :class:`DuplicateNodeError` if the id exists."""
        with self.transaction():
            if self._conn.execute("SELECT 1 FROM nodes WHERE id = ?", (node.id,)).fetchone():
                raise DuplicateNodeError(f"node {node.id!r} exists already; use update_node to change it")
            body = _body(node)
            self._conn.execute("INSERT INTO node_versions VALUES (?, 1, ?, ?, ?, 'created')", (node.id, node.type.value, body, time.time()))
            self._conn.execute("INSERT INTO nodes VALUES (?, 1, ?, ?, ?, ?)", (node.id, node.type.value, node.run, node.owner, body))
            self._dirty.add(node.id)
        return node

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        with self.transaction():
            for node in nodes:
                self.add_node(node)

    def add_edge(self, edge: Edge) -> Edge:
        """Add an edge (idempotent for the same src, dst and relation).

        Raises :class:`GraphIntegrityError` if an endpoint is missing or the relation does not
        connect those node types (:data:`ALLOWED`).
        """
        src, dst = self._type(edge.src), self._type(edge.dst)
        allowed_src, allowed_dst = ALLOWED[edge.relation]
        if src not in allowed_src or dst not in allowed_dst:
            raise GraphIntegrityError(
                f"{edge.relation.value} cannot connect {src.value} {edge.src!r} to {dst.value} {edge.dst!r} "
                f"(allowed: {sorted(t.value for t in allowed_src)} -> {sorted(t.value for t in allowed_dst)})"
            )
        with self.transaction():
            self._conn.execute(
                "INSERT OR IGNORE INTO edges(src, dst, relation, time, attributes) VALUES (?, ?, ?, ?, ?)",
                (edge.src, edge.dst, edge.relation.value, edge.time, json.dumps(edge.attributes, sort_keys=True)),
            )
            side = LINEAGE.get(edge.relation)
            if side is not None:
                parent, child = (edge.dst, edge.src) if side == "dst" else (edge.src, edge.dst)
                if self._conn.execute("INSERT OR IGNORE INTO lineage VALUES (?, ?, ?)", (child, parent, edge.relation.value)).rowcount:
                    self._dirty.add(child)
        return edge

    def add_edges(self, edges: Iterable[Edge]) -> None:
        with self.transaction():
            for edge in edges:
                self.add_edge(edge)

    def update_node(self, node_id: str, *, reason: str, **changes: Any) -> Node:
        """Write a new version of a node with ``changes`` (e.g. ``trust=0.2``, ``labels=...``); the old
        versions stay in :meth:`history`. Raises :class:`UnknownNodeError`."""
        with self.transaction():
            row = self._conn.execute("SELECT version, body FROM nodes WHERE id = ?", (node_id,)).fetchone()
            if row is None:
                raise UnknownNodeError(f"no node {node_id!r}")
            if "id" in changes or "type" in changes:
                raise GraphIntegrityError("a node's id and type never change")
            new = _node(row[1]).model_copy(update=changes)
            new = Node.model_validate(new.model_dump())  # validate the changed fields
            version = row[0] + 1
            body = _body(new)
            self._conn.execute("INSERT INTO node_versions VALUES (?, ?, ?, ?, ?, ?)", (node_id, version, new.type.value, body, time.time(), reason))
            self._conn.execute("UPDATE nodes SET version = ?, owner = ?, body = ? WHERE id = ?", (version, new.owner, body, node_id))
            self._dirty.add(node_id)  # labels, trust, validity or revocation may have changed
        return new

    def invalidate(self, node_id: str, *, by: str | None = None, reason: str = "invalidated") -> Node:
        """Mark a record invalid (a new version with ``valid=False``), with an ``invalidated_by`` edge to ``by``."""
        with self.transaction():
            node = self.update_node(node_id, reason=reason, valid=False)
            if by is not None:
                self.add_edge(Edge(src=node_id, dst=by, relation=Relation.INVALIDATED_BY, time=time.time()))
        return node

    # -- reads

    def difference(self, item: Node | Edge) -> Difference | None:
        """``None`` when the graph holds ``item`` exactly as given, else the first :class:`Difference`.

        A node is compared, field by field in :class:`Node`'s order (type, text, time, owner, labels, trust,
        validity, run, attributes), with the version it was **created** as (version 1): the later versions
        :meth:`update_node` writes (grants, revocations, invalidation) are its history, not a difference. An
        edge is compared on ``time`` and ``attributes`` with the stored edge of the same src, dst and relation
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
                "SELECT time, attributes FROM edges WHERE src = ? AND dst = ? AND relation = ?", (item.src, item.dst, item.relation.value)
            ).fetchone()
            if row is None:
                return Difference(key, None)
            stored = {"time": row[0], "attributes": json.loads(row[1])}
            given = {"time": item.time, "attributes": json.loads(json.dumps(item.attributes, sort_keys=True))}
        return _first_difference(key, stored, given)

    def update_difference(self, node_id: str, *, reason: str, **changes: Any) -> Difference | None:
        """``None`` when the graph holds the version ``update_node(node_id, reason=reason, **changes)`` would
        write (the first version written with that ``reason``, its ``changes`` fields as given), else the
        :class:`Difference`: the first differing field, or ``field=None`` when there is no such version."""
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
        """The requested nodes and all their lineage ancestors (one recursive query, one for edges).

        Raises :class:`UnknownNodeError` if a requested id is not in the graph.
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
        edge_rows = self._conn.execute(
            "SELECT DISTINCT child, parent FROM lineage WHERE child IN (SELECT value FROM json_each(?)) ORDER BY child, parent",
            (json.dumps(sorted(nodes)),),
        )
        for child, parent in edge_rows:
            if parent in nodes:
                parents[child].append(parent)
        return LineageClosure(nodes, parents, versions)

    def indexed(self, node_ids: Iterable[str]) -> dict[str, tuple[Node, Inherited]]:
        """The current node and its inherited row (effective labels with carriers, revocation,
        path trust) for each id, from the inherited index: one query, O(len(node_ids)).

        Raises :class:`UnknownNodeError` if an id is not in the graph.
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
                f"SELECT id, version, labels, revoked_by, path_trust FROM inherited WHERE id IN ({','.join('?' * len(chunk))})", chunk
            ).fetchall()
            for i, version, _, _, _ in rows:
                if (i, version) not in self._cache:
                    uncached.append(i)
            if uncached:  # bodies only for node versions not parsed before
                for i, version, body in self._conn.execute(f"SELECT id, version, body FROM nodes WHERE id IN ({','.join('?' * len(uncached))})", uncached):
                    self._parsed(i, version, body)
            for i, version, labels, revoked_by, trust in rows:
                lab = parsed_labels.get(labels)
                if lab is None:  # few distinct label sets: parse each once (the dicts are read-only)
                    if len(parsed_labels) > 100_000:
                        parsed_labels.clear()
                    lab = parsed_labels[labels] = json.loads(labels)
                out[i] = (self._cache[(i, version)], Inherited(lab, revoked_by, trust))
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
        """The current version of a node. Raises :class:`UnknownNodeError`."""
        row = self._conn.execute("SELECT body FROM nodes WHERE id = ?", (node_id,)).fetchone()
        if row is None:
            raise UnknownNodeError(f"no node {node_id!r}")
        return _node(row[0])

    def nodes(self, type: NodeType | str | None = None, *, run: str | None = None) -> list[Node]:
        sql, args = "SELECT body FROM nodes WHERE 1=1", []
        if type is not None:
            sql += " AND type = ?"
            args.append(NodeType(type).value)
        if run is not None:
            sql += " AND run = ?"
            args.append(run)
        return [_node(r[0]) for r in self._conn.execute(sql + " ORDER BY rowid", args)]

    def edges(self, *, src: str | None = None, dst: str | None = None, relation: Relation | str | None = None) -> list[Edge]:
        sql, args = "SELECT src, dst, relation, time, attributes FROM edges WHERE 1=1", []
        for col, val in (("src", src), ("dst", dst)):
            if val is not None:
                sql += f" AND {col} = ?"
                args.append(val)
        if relation is not None:
            sql += " AND relation = ?"
            args.append(Relation(relation).value)
        return [Edge(src=r[0], dst=r[1], relation=r[2], time=r[3], attributes=json.loads(r[4])) for r in self._conn.execute(sql + " ORDER BY seq", args)]

    def history(self, node_id: str) -> list[tuple[int, str, Node]]:
        """Every version of a node: ``(version, reason, node)``, oldest first."""
        rows = self._conn.execute("SELECT version, reason, body FROM node_versions WHERE id = ? ORDER BY version", (node_id,)).fetchall()
        if not rows:
            raise UnknownNodeError(f"no node {node_id!r}")
        return [(v, reason, _node(body)) for v, reason, body in rows]

    def parents(self, node_id: str) -> list[str]:
        """Direct lineage parents (what ``node_id`` was derived from, used or supported by)."""
        return [r[0] for r in self._conn.execute("SELECT DISTINCT parent FROM lineage WHERE child = ? ORDER BY parent", (node_id,))]

    def children(self, node_id: str) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT DISTINCT child FROM lineage WHERE parent = ? ORDER BY child", (node_id,))]

    def ancestors(self, node_id: str) -> set[str]:
        """Everything ``node_id`` derives from, transitively (one recursive query over the lineage index)."""
        rows = self._conn.execute(
            "WITH RECURSIVE up(id) AS (SELECT parent FROM lineage WHERE child = ? "
            "UNION SELECT l.parent FROM lineage l JOIN up ON l.child = up.id) SELECT id FROM up",
            (node_id,),
        )
        return {r[0] for r in rows} - {node_id}

    def descendants(self, node_id: str) -> set[str]:
        """Everything derived from ``node_id``, transitively."""
        rows = self._conn.execute(
            "WITH RECURSIVE down(id) AS (SELECT child FROM lineage WHERE parent = ? "
            "UNION SELECT l.child FROM lineage l JOIN down ON l.parent = down.id) SELECT id FROM down",
            (node_id,),
        )
        return {r[0] for r in rows} - {node_id}

    def runs(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT DISTINCT run FROM nodes WHERE run IS NOT NULL ORDER BY run")]

    def to_networkx(self, *, run: str | None = None, lineage_only: bool = False) -> nx.MultiDiGraph:
        """A networkx view: nodes with their fields as attributes; edges keyed by relation
        (``lineage_only``: parent -> child edges of the derivation order instead)."""
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
                    g.add_edge(e.src, e.dst, key=e.relation.value, relation=e.relation.value, time=e.time, **e.attributes)
        return g
