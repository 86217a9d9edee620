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


# ---------------------------------------------------------------- candidate pre-selection (TextIndex) and the retriever over it

import math  # noqa: E402
import random  # noqa: E402

from lab.provenance.index import TextIndex, tokens  # noqa: E402
from lab.provenance.retrieve import Retriever  # noqa: E402


def _bm25_by_hand(texts: dict[str, str], query: str, k1: float = 1.5, b: float = 0.75) -> dict[str, float]:
    docs = {i: tokens(t) for i, t in texts.items()}
    avgdl = sum(map(len, docs.values())) / len(docs)
    out = {}
    for i, toks in docs.items():
        s = 0.0
        for q in set(tokens(query)):
            df = sum(q in d for d in docs.values())
            if df and q in toks:
                tf = toks.count(q)
                s += math.log(1 + (len(docs) - df + 0.5) / (df + 0.5)) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(toks) / avgdl))
        if s > 0:
            out[i] = s
    return out


def test_text_index_is_okapi_bm25_over_current_record_texts():
    g = ProvenanceGraph()
    texts = {"s1": "refund the refund fare", "s2": "seat change fee", "m1": "refund policy for the fare", "c1": "nothing here"}
    g.add_nodes([Node(id="a", type="agent", text="refund agent"), *(Node(id=i, type="source" if i[0] == "s" else "memory" if i[0] == "m" else "claim", text=t) for i, t in texts.items())])
    idx = TextIndex(g)
    got = dict(idx.search("refund fare"))
    want = _bm25_by_hand(texts, "refund fare")
    assert set(got) == set(want) and all(got[i] == pytest.approx(want[i]) for i in want)  # agents are not records
    assert [i for i, _ in idx.search("refund fare", limit=1)] == [max(want, key=want.get)]
    with pytest.raises(ValueError, match="limit must be >= 1"):
        idx.search("x", limit=0)
    # writes reach the next search: a new record, a changed text (old words gone), nothing stale
    g.add_node(Node(id="m2", type="memory", text="fare fare fare"))
    g.update_node("s1", reason="rewritten", text="seat map")
    hits = dict(idx.search("refund fare"))
    assert "m2" in hits and "s1" not in hits and len(idx) == 5
    texts.update(m2="fare fare fare", s1="seat map")
    assert hits == pytest.approx(_bm25_by_hand(texts, "refund fare"))


def _index_writer(path: str) -> None:
    g = ProvenanceGraph(path)
    g.add_node(Node(id="late", type="source", text="zebra crossing"))
    g.close()


def test_text_index_sees_another_processes_writes(tmp_path):
    path = str(tmp_path / "g.sqlite")
    g = ProvenanceGraph(path)
    g.add_node(Node(id="early", type="source", text="zebra"))
    idx = TextIndex(g)
    assert [i for i, _ in idx.search("zebra crossing")] == ["early"]
    p = mp.get_context("spawn").Process(target=_index_writer, args=(path,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert [i for i, _ in idx.search("zebra crossing")] == ["late", "early"]


def _random_graph(seed: int) -> tuple[ProvenanceGraph, list[str]]:
    rng = random.Random(seed)
    g = ProvenanceGraph()
    g.add_node(Node(id="reader", type="agent", attributes={"scopes": ["x"]}))
    words = [f"w{i}" for i in range(15)]
    ids = []
    for i in range(120):
        nid = f"n{i}"
        labels = frozenset(rng.sample(["x", "y"], rng.randrange(2))) if i < 40 else frozenset()
        g.add_node(Node(id=nid, type="source" if i < 40 else "memory", text=" ".join(rng.sample(words, 4)), trust=rng.uniform(0.2, 1), labels=labels))
        if i >= 40:
            for p in rng.sample(ids, rng.choice((1, 2))):
                g.add_edge(Edge(src=nid, dst=p, relation="derived_from"))
        ids.append(nid)
    return g, ids


@pytest.mark.parametrize("seed", range(6))
def test_preselected_retrieval_equals_ranking_every_candidate(seed):
    g, ids = _random_graph(seed)
    idx = TextIndex(g)
    fast = Retriever(g, AccessPolicy(g), "index", index=idx, preselect=10_000)
    slow = Retriever(g, AccessPolicy(g), "index", index=idx)
    rng = random.Random(seed)
    for _ in range(10):
        q = " ".join(f"w{rng.randrange(15)}" for _ in range(2))
        got = fast.retrieve("reader", q, k=5)
        want = slow.retrieve("reader", q, k=5, candidates=ids)
        assert [h.id for h in got.hits] == [h.id for h in want.hits], q
        assert [h.trust for h in got.hits] == [h.trust for h in want.hits]
        assert got.candidates <= len(idx.search(q, limit=10_000))
        assert all(want.excluded[i] == why for i, why in got.excluded.items())  # same reasons for what it read


def test_reused_rows_never_outlive_a_write_or_a_rollback():
    g = ProvenanceGraph()
    g.add_nodes([Node(id="reader", type="agent"), Node(id="s", type="source", text="alpha beta"), Node(id="m", type="memory", text="alpha gamma")])
    g.add_edge(Edge(src="m", dst="s", relation="derived_from"))
    r = Retriever(g, AccessPolicy(g), "index", index=TextIndex(g))
    assert {h.id for h in r.retrieve("reader", "alpha", k=5).hits} == {"s", "m"}
    AccessPolicy(g).revoke_source("s", "withdrawn")  # a write: every row read before is dropped
    res = r.retrieve("reader", "alpha", k=5)
    assert res.hits == [] and res.excluded["m"].startswith("revoked")
    g2 = ProvenanceGraph()
    g2.add_nodes([Node(id="reader", type="agent"), Node(id="s", type="source", text="alpha")])
    r2 = Retriever(g2, AccessPolicy(g2), "index", index=TextIndex(g2))
    with pytest.raises(RuntimeError):
        with g2.transaction():
            g2.update_node("s", reason="hide", labels=frozenset({"secret"}))
            assert r2.retrieve("reader", "alpha", k=5).hits == []  # the open transaction's write is seen ...
            raise RuntimeError("abort")
    assert [h.id for h in r2.retrieve("reader", "alpha", k=5).hits] == ["s"]  # ... and not kept after the rollback


def test_retriever_index_arguments_are_checked():
    g = ProvenanceGraph()
    with pytest.raises(ValueError, match="scorer='index'"):
        Retriever(g, scorer="index")
    with pytest.raises(ValueError, match="preselect must be >= 1"):
        Retriever(g, scorer="index", index=TextIndex(g), preselect=0)
