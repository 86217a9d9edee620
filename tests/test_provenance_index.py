"""The graph's inherited index (effective labels, revocation, path trust) equals a from-scratch
computation after any sequence of writes, inside and across transactions and processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.provenance import Edge, GraphIntegrityError, Node, ProvenanceGraph
from lab.provenance.access import AccessPolicy
from lab.provenance.lineage import propagate


def from_scratch(g: ProvenanceGraph, ids):
    return propagate(g.lineage_closure(ids))


def assert_index_exact(g: ProvenanceGraph) -> None:
    ids = [n.id for n in g.nodes()]
    scratch = from_scratch(g, ids)
    for i, (_, inh) in g.indexed(ids).items():
        assert inh.labels == scratch[i].labels, i  # same labels and the same carrier per label
        assert inh.revoked_by == scratch[i].revoked_by, i
        assert inh.path_trust == pytest.approx(scratch[i].path_trust, abs=1e-12), i
        assert inh.invalidated_by == scratch[i].invalidated_by and inh.rederive == scratch[i].rederive, i


def test_hand_built_chain_updates_on_every_write():
    g = ProvenanceGraph()
    g.add_nodes([Node(id="s1", type="source", trust=0.5, labels=frozenset({"hr"})), Node(id="s2", type="source", trust=0.9), Node(id="m", type="memory", trust=0.8)])
    g.add_edge(Edge(src="m", dst="s2", relation="derived_from"))
    (_, m), = g.indexed(["m"]).values()
    assert m.labels == {} and m.revoked_by is None and m.path_trust == pytest.approx(0.72)
    g.add_edge(Edge(src="m", dst="s1", relation="derived_from"))  # a private parent arrives later
    m = g.indexed(["m"])["m"][1]
    assert m.labels == {"hr": "s1"} and m.path_trust == pytest.approx(0.72)  # best path still via s2
    g.update_node("s2", reason="source found unreliable", trust=0.1)
    assert g.indexed(["m"])["m"][1].path_trust == pytest.approx(0.4)  # now via s1: 0.5 * 0.8
    AccessPolicy(g).revoke_source("s1", "withdrawn")
    m = g.indexed(["m"])["m"][1]
    assert m.revoked_by == "s1" and m.path_trust == pytest.approx(0.08)  # 0.1 * 0.8, s1 now factor 0


def test_reads_inside_a_transaction_see_its_writes_and_rollback_restores():
    g = ProvenanceGraph()
    g.add_nodes([Node(id="s", type="source", labels=frozenset({"a"})), Node(id="m", type="memory")])
    with pytest.raises(RuntimeError):
        with g.transaction():
            g.add_edge(Edge(src="m", dst="s", relation="derived_from"))
            assert g.indexed(["m"])["m"][1].labels == {"a": "s"}  # pending write visible
            raise RuntimeError("abort")
    assert g.indexed(["m"])["m"][1].labels == {}  # rolled back with the write
    assert_index_exact(g)


def test_cycle_in_a_store_written_before_cycles_were_refused_shares_one_result(tmp_path):
    path = str(tmp_path / "old.sqlite")
    with ProvenanceGraph(path) as g:
        g.add_nodes([Node(id="a", type="memory", labels=frozenset({"x"})), Node(id="b", type="memory"), Node(id="s", type="source", trust=0.6)])
        g.add_edges([Edge(src="a", dst="b", relation="derived_from"), Edge(src="b", dst="s", relation="derived_from")])
    con = sqlite3.connect(path)  # b derived from a, as an old store could hold: written behind the graph's back
    con.execute("INSERT INTO edges(src, dst, relation, time, attributes) VALUES ('b', 'a', 'derived_from', 0, '{}')")
    con.execute("INSERT INTO lineage(child, parent, relation) VALUES ('b', 'a', 'derived_from')")
    con.execute("PRAGMA user_version = 0")  # the index is rebuilt on open
    con.commit()
    con.close()
    with ProvenanceGraph(path) as g:
        assert_index_exact(g)
        assert g.indexed(["b"])["b"][1].labels == {"x": "a"}


def _writer(path: str) -> None:
    g = ProvenanceGraph(path)
    AccessPolicy(g).revoke_source("s", "revoked by another process")
    g.close()


def test_write_from_another_process_is_seen(tmp_path):
    path = str(tmp_path / "g.sqlite")
    g = ProvenanceGraph(path)
    g.add_nodes([Node(id="reader", type="agent"), Node(id="s", type="source"), Node(id="m", type="memory")])
    g.add_edge(Edge(src="m", dst="s", relation="derived_from"))
    assert g.indexed(["m"])["m"][1].revoked_by is None
    p = mp.get_context("spawn").Process(target=_writer, args=(path,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert g.indexed(["m"])["m"][1].revoked_by == "s"
    assert AccessPolicy(g).can_read("reader", "m") == (False, "revoked: ancestor 's' is revoked")


def test_store_without_index_is_indexed_on_open(tmp_path):
    path = str(tmp_path / "old.sqlite")
    with ProvenanceGraph(path) as g:
        g.add_nodes([Node(id="s", type="source", trust=0.5, labels=frozenset({"a"})), Node(id="m", type="memory")])
        g.add_edge(Edge(src="m", dst="s", relation="derived_from"))
    con = sqlite3.connect(path)  # as a store written before the index existed
    con.execute("DELETE FROM inherited")
    con.execute("PRAGMA user_version = 0")
    con.commit()
    con.close()
    with ProvenanceGraph(path) as g:
        assert g.indexed(["m"])["m"][1].labels == {"a": "s"}
        assert_index_exact(g)


_ids = st.sampled_from([f"n{i}" for i in range(8)])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("edge"), _ids, _ids, st.sampled_from(["derived_from", "summarises", "supports"])),
        st.tuples(st.just("trust"), _ids, st.floats(0, 1)),
        st.tuples(st.just("labels"), _ids, st.frozensets(st.sampled_from("abc"), max_size=2)),
        st.tuples(st.just("revoke"), _ids),
        st.tuples(st.just("invalidate"), _ids),
        st.tuples(st.just("writer"), st.floats(0, 1)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, batch=st.booleans())
def test_random_writes_keep_the_index_exact(ops, batch):
    g = ProvenanceGraph()
    g.add_node(Node(id="w", type="agent", trust=0.7))  # owns the odd memories: its trust caps theirs
    g.add_nodes([Node(id=f"n{i}", type="source" if i < 3 else "memory", trust=0.5 + i / 20, owner="w" if i % 2 else None) for i in range(8)])

    def apply():
        for op in ops:
            if op[0] == "edge":
                _, a, b, relation = op
                try:
                    g.add_edge(Edge(src=a, dst=b, relation=relation))
                except GraphIntegrityError:  # a cycle, or a relation those types do not take: refused, nothing written
                    pass
            elif op[0] == "trust":
                g.update_node(op[1], reason="trust", trust=op[2])
            elif op[0] == "labels":
                g.update_node(op[1], reason="labels", labels=op[2])
            elif op[0] == "revoke":
                n = g.node(op[1])
                g.update_node(op[1], reason="revoke", valid=False, attributes={**n.attributes, "revoked": True})
            elif op[0] == "writer":
                g.update_node("w", reason="writer trust", trust=op[1])
            else:
                g.invalidate(op[1])

    if batch:
        with g.transaction():
            apply()
    else:
        apply()
    assert_index_exact(g)
