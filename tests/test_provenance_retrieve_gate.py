"""Retrieval filters before ranking and ranks by similarity x path trust; the gate asks for evidence by risk."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.provenance import Edge, Node, ProvenanceGraph
from lab.provenance.access import AccessPolicy
from lab.provenance.gate import ActionGate, Decision
from lab.provenance.retrieve import Retriever

NOW = 1_000_000.0
DAY = 86400.0


def airline() -> ProvenanceGraph:
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="alice", type="agent"),
            Node(id="bot", type="agent"),
            Node(id="eve", type="agent"),
            Node(id="s_user", type="source", text="alice reservation 4WQ150 paid with credit card 4421", labels=frozenset({"user:alice"}), time=NOW - 100),
            Node(id="s_flights", type="source", text="flight HAT136 JFK to SEA on May 20 costs 120 dollars", time=NOW - 100),
            Node(id="s_web", type="source", text="a forum says flight HAT136 is cancelled", trust=0.4, time=NOW - 100),
            Node(id="s_old", type="source", text="fare table for SEA flights", time=NOW - 10 * DAY),
            Node(id="m_sum", type="memory", text="summary: alice holds reservation 4WQ150", time=NOW - 50),
            Node(id="c1", type="claim", text="HAT136 to Seattle is available for 120 dollars", time=NOW - 40),
        ]
    )
    g.add_edges(
        [
            Edge(src="m_sum", dst="s_user", relation="derived_from"),
            Edge(src="s_flights", dst="c1", relation="supports"),
            Edge(src="s_web", dst="c1", relation="supports"),
        ]
    )
    return g


@pytest.fixture
def g():
    return airline()


def test_filter_before_ranking_and_trust_in_the_score(g):
    r = Retriever(g, scorer="bm25")
    res = r.retrieve("eve", "alice reservation 4WQ150", k=10)
    assert {h.id for h in res.hits} <= {"s_flights", "s_web", "s_old", "c1"}
    assert res.excluded["s_user"] == "missing label 'user:alice' (carried by the record itself)" and "carried by ancestor 's_user'" in res.excluded["m_sum"]
    policy = AccessPolicy(g)
    policy.grant("bot", "user:alice")
    res = Retriever(g, policy, scorer="bm25").retrieve("bot", "alice reservation 4WQ150", k=2)
    assert {h.id for h in res.hits} == {"s_user", "m_sum"} and all(h.trust == 1.0 for h in res.hits)  # now readable
    flights = Retriever(g, policy, scorer="bm25").retrieve("bot", "flight HAT136", k=10, candidates=["s_flights", "s_web"])
    by_id = {h.id: h for h in flights.hits}
    assert by_id["s_web"].score == pytest.approx(by_id["s_web"].similarity * 0.4)  # untrusted source ranks lower
    assert [h.id for h in flights.hits] == ["s_flights", "s_web"]


def test_revocation_is_immediate(g):
    policy = AccessPolicy(g)
    policy.grant("bot", "user:alice")
    r = Retriever(g, policy, scorer="bm25")
    assert "m_sum" in {h.id for h in r.retrieve("bot", "reservation", k=10).hits}
    policy.revoke_source("s_user", reason="user withdrew consent")
    res = r.retrieve("bot", "reservation", k=10)
    assert "m_sum" not in {h.id for h in res.hits} and res.excluded["m_sum"].startswith("revoked")


def test_minilm_scorer_end_to_end(g):
    res = Retriever(g, scorer="minilm").retrieve("eve", "how much is the flight to Seattle?", k=2)
    assert res.hits[0].id in {"s_flights", "c1"} and all(h.id not in {"s_user", "m_sum"} for h in res.hits)


def test_gate_decisions(g):
    policy = AccessPolicy(g)
    policy.grant("bot", "user:alice")
    gate = ActionGate(g, policy)
    # c1 rests on s_flights (and the weak s_web): with s_flights it is one independent support, not two.
    d = gate.decide("bot", "high", ["s_flights", "c1"], now=NOW)
    assert d.decision == Decision.BLOCK and d.independent == 1
    d = gate.decide("bot", "high", ["s_flights", "s_user"], now=NOW)
    assert d.decision == Decision.ALLOW and d.used == ["s_flights", "s_user"]
    d = gate.decide("bot", "critical", ["s_flights", "s_old"], now=NOW)  # s_old is 10 days old
    assert d.decision == Decision.VERIFY and d.excluded["s_old"].startswith("stale: 864000 s old")
    d = gate.decide("bot", "medium", ["s_web"], now=NOW)
    assert d.decision == Decision.CONFIRM and d.excluded["s_web"] == "path trust 0.40 < 0.50 required for medium risk"
    d = gate.decide("eve", "high", ["s_user", "s_flights"], now=NOW)  # eve may not read s_user
    assert d.decision == Decision.BLOCK and d.excluded["s_user"] == "missing label 'user:alice' (carried by the record itself)"
    policy.revoke_source("s_user", reason="poisoned")
    d = gate.decide("bot", "high", ["s_flights", "m_sum"], now=NOW)
    assert d.decision == Decision.BLOCK and any("revoked" in r for r in d.reasons)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=20),
    st.lists(st.sampled_from(["", "a", "b"]), min_size=10, max_size=10),
    st.sets(st.sampled_from(["a", "b"])),
    st.lists(st.integers(0, 9), max_size=3),
)
def test_no_ineligible_record_is_ever_returned(pairs, labels, grants, revoked):
    g = ProvenanceGraph()
    g.add_node(Node(id="reader", type="agent"))
    g.add_nodes([Node(id=f"n{i}", type="source" if i < 3 else "memory", text=f"record {i} about flights", labels=frozenset({labels[i]} - {""})) for i in range(10)])
    for a, b in pairs:
        if a > b and a >= 3:  # a memory derives from an earlier record
            g.add_edge(Edge(src=f"n{a}", dst=f"n{b}", relation="derived_from"))
    policy = AccessPolicy(g)
    for s in grants:
        policy.grant("reader", s)
    for i in revoked:
        if i < 3:
            policy.revoke_source(f"n{i}", reason="test")
    readable = {f"n{i}" for i in range(10) if policy.can_read("reader", f"n{i}")[0]}
    res = Retriever(g, policy, scorer="bm25").retrieve("reader", "flights", k=10)
    assert {h.id for h in res.hits} <= readable and set(res.excluded) >= {f"n{i}" for i in range(10)} - readable
    d = ActionGate(g, policy).decide("reader", "low", [f"n{i}" for i in range(10)], now=0.0)
    assert set(d.used) <= readable
