"""The execution-graph store: typed nodes and edges, lineage queries, append-only history, atomic batches."""

from __future__ import annotations

import sqlite3

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.provenance import Difference, DuplicateNodeError, Edge, GraphIntegrityError, Node, ProvenanceGraph, UnknownNodeError
from lab.provenance.errors import LineageCycleError


def small(path=":memory:") -> ProvenanceGraph:
    g = ProvenanceGraph(path)
    g.add_nodes(
        [
            Node(id="alice", type="agent"),
            Node(id="s1", type="source", text="flight HAT001 costs $120", trust=0.9, labels=frozenset({"alice"})),
            Node(id="s2", type="source", text="user is gold member", trust=0.6),
            Node(id="m1", type="memory", text="summary of s1"),
            Node(id="c1", type="claim", text="the cheapest flight is HAT001"),
            Node(id="x1", type="action", text="book HAT001"),
        ]
    )
    g.add_edges(
        [
            Edge(src="m1", dst="s1", relation="derived_from"),
            Edge(src="m1", dst="c1", relation="supports"),
            Edge(src="s2", dst="c1", relation="supports"),
            Edge(src="x1", dst="c1", relation="used"),
            Edge(src="c1", dst="alice", relation="attributed_to"),
        ]
    )
    return g


def test_lineage_queries():
    g = small()
    assert g.parents("c1") == ["m1", "s2"] and g.children("s1") == ["m1"]
    assert g.ancestors("x1") == {"c1", "m1", "s1", "s2"}
    assert g.descendants("s1") == {"m1", "c1", "x1"} and g.descendants("x1") == set()
    assert g.ancestors("alice") == set()  # attribution is not derivation


def test_types_are_enforced():
    g = small()
    with pytest.raises(GraphIntegrityError, match="used cannot connect source 's1' to claim 'c1'"):
        g.add_edge(Edge(src="s1", dst="c1", relation="used"))
    with pytest.raises(GraphIntegrityError, match="no node 'ghost'"):
        g.add_edge(Edge(src="m1", dst="ghost", relation="derived_from"))
    with pytest.raises(DuplicateNodeError, match="node 's1' exists already"):
        g.add_node(Node(id="s1", type="source"))
    with pytest.raises(UnknownNodeError, match="no node 'nope'"):
        g.node("nope")


def test_history_is_append_only(tmp_path):
    g = small(tmp_path / "p.db")
    g.update_node("s1", reason="source found unreliable", trust=0.1)
    g.invalidate("m1", by="x1", reason="superseded")
    assert [(v, r, n.trust) for v, r, n in g.history("s1")] == [(1, "created", 0.9), (2, "source found unreliable", 0.1)]
    assert g.node("m1").valid is False and [e.dst for e in g.edges(src="m1", relation="invalidated_by")] == ["x1"]
    conn = sqlite3.connect(tmp_path / "p.db")
    for sql in ("UPDATE node_versions SET body = '{}'", "DELETE FROM node_versions", "DELETE FROM edges", "DELETE FROM nodes"):
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(sql)


def test_difference_compares_with_what_was_written(tmp_path):
    g = small(tmp_path / "p.db")
    s1 = Node(id="s1", type="source", text="flight HAT001 costs $120", trust=0.9, labels=frozenset({"alice"}))
    assert g.difference(s1) is None and g.difference(Edge(src="m1", dst="s1", relation="derived_from")) is None
    assert g.difference(s1.model_copy(update={"trust": 0.5})) == Difference("s1", "trust", 0.9, 0.5)
    assert g.difference(s1.model_copy(update={"labels": frozenset({"alice", "bob"})})) == Difference("s1", "labels", ["alice"], ["alice", "bob"])
    assert g.difference(Node(id="s1", type="memory")) == Difference("s1", "type", "source", "memory")  # fields in Node's order
    assert g.difference(Node(id="s9", type="source")) == Difference("s9", None)
    g.update_node("s1", reason="found unreliable", trust=0.1, attributes={"n": 1})
    assert g.difference(s1) is None  # a node is compared as it was created: later versions are its history
    assert g.update_difference("s1", reason="found unreliable", trust=0.1) is None
    assert g.update_difference("s1", reason="found unreliable", attributes={"n": True}) == Difference("s1", "attributes.n", 1, True)
    assert g.update_difference("s1", reason="other", trust=0.1) == Difference("s1", None)
    assert g.update_difference("nope", reason="found unreliable") == Difference("nope", None)
    edge = Edge(src="s2", dst="c1", relation="supports", time=2.0, attributes={"tokens": ["a"]})
    assert g.difference(edge) == Difference("s2 -supports-> c1", "time", 0.0, 2.0)
    assert g.difference(edge.model_copy(update={"time": 0.0})) == Difference("s2 -supports-> c1", "attributes", {}, {"tokens": ["a"]})
    assert g.difference(Edge(src="s2", dst="x1", relation="supports")) == Difference("s2 -supports-> x1", None)


def test_failed_batch_leaves_nothing():
    g = small()
    before = (len(g), len(g.edges()))
    with pytest.raises(GraphIntegrityError):
        with g.transaction():
            g.add_node(Node(id="m2", type="memory"))
            g.add_edge(Edge(src="m2", dst="s1", relation="derived_from"))
            g.add_edge(Edge(src="m2", dst="missing", relation="derived_from"))
    assert (len(g), len(g.edges())) == before and "m2" not in g and g.children("s1") == ["m1"]


def test_networkx_views():
    g = small()
    full = g.to_networkx()
    assert full.number_of_nodes() == 6 and full.number_of_edges() == 5 and full.nodes["s1"]["trust"] == 0.9
    lineage = g.to_networkx(lineage_only=True)
    assert nx.ancestors(lineage, "x1") == g.ancestors("x1")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=30))
def test_recursive_queries_match_networkx(pairs):
    g = ProvenanceGraph()
    g.add_nodes([Node(id=f"n{i}", type="memory") for i in range(12)])
    for a, b in pairs:
        try:
            g.add_edge(Edge(src=f"n{a}", dst=f"n{b}", relation="derived_from"))  # n{a} derives from n{b}
        except LineageCycleError as exc:  # refused: n{b} derives from n{a} already; the cycle is named
            assert exc.cycle[0] == f"n{a}" and exc.cycle[-1] == f"n{b}" and (a == b or f"n{a}" in g.ancestors(f"n{b}"))
    ref = g.to_networkx(lineage_only=True)
    assert nx.is_directed_acyclic_graph(ref)
    for i in range(12):
        assert g.ancestors(f"n{i}") == nx.ancestors(ref, f"n{i}") - {f"n{i}"}
        assert g.descendants(f"n{i}") == nx.descendants(ref, f"n{i}") - {f"n{i}"}
