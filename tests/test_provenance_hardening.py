"""Issue 15, findings 1-5 and 8: an untrusted writer cannot raise trust through the graph's structure, a
bare claim carries no more than its writer's trust, revocation and invalidation keep independently
supported claims, derivation cycles are refused, validity intervals make records stale; and the seams
(one public access filter, one lineage closure, explicit path-trust algorithms, errors in errors.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.provenance import Edge, GraphIntegrityError, Node, ProvenanceGraph
from lab.provenance.access import AccessPolicy
from lab.provenance.gate import ActionGate, Decision
from lab.provenance.retrieve import Retriever
from lab.provenance.trust import path_trust, path_trusts

NOW = 1_000_000.0
DAY = 86400.0


def poisoning_graph() -> ProvenanceGraph:
    """mallory (trust 0.2) owns claim C; S is a trusted source (0.95); bob (trust 1.0) owns claim T supported by S."""
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="mallory", type="agent", trust=0.2),
            Node(id="bob", type="agent"),
            Node(id="S", type="source", text="flight HAT136 is refundable", trust=0.95, time=NOW - 100),
            Node(id="P", type="source", text="private ledger", trust=0.95, labels=frozenset({"finance"}), time=NOW - 100),
            Node(id="C", type="claim", text="flight HAT136 can be cancelled for free", owner="mallory", time=NOW - 50),
            Node(id="T", type="claim", text="bob's claim", owner="bob", time=NOW - 50),
            Node(id="W", type="source", text="a weak forum post", trust=0.3, time=NOW - 100),
        ]
    )
    g.add_edge(Edge(src="W", dst="T", relation="supports"))
    return g


# ---------------------------------------------------------------- finding 1: structure poisoning


def test_an_untrusted_writer_cannot_raise_trust_through_an_edge():
    g = poisoning_graph()
    gate = ActionGate(g)
    # the edge records who wrote it
    e = g.add_edge(Edge(src="C", dst="S", relation="derived_from", writer="mallory"))
    assert e.writer == "mallory" and g.edges(src="C")[0].writer == "mallory"
    # a claim's trust never exceeds its writer's trust times its evidence
    assert path_trust(g, "C") == pytest.approx(0.2 * 0.95)
    d = gate.decide("mallory", "medium", ["C"], now=NOW)
    assert d.decision == Decision.CONFIRM and "path trust 0.19" in d.excluded["C"]
    # an edge into a record the writer does not own is refused, naming writer, record and owner
    with pytest.raises(GraphIntegrityError, match="'mallory' does not own 'T' .owner 'bob'."):
        g.add_edge(Edge(src="S", dst="T", relation="supports", writer="mallory"))
    with pytest.raises(GraphIntegrityError, match="does not own 'S'"):
        g.add_edge(Edge(src="S", dst="W", relation="derived_from", writer="mallory"))
    # ... and one from a record the writer cannot read
    with pytest.raises(GraphIntegrityError, match="'mallory' cannot read 'P': missing label 'finance'"):
        g.add_edge(Edge(src="C", dst="P", relation="derived_from", writer="mallory"))
    with pytest.raises(GraphIntegrityError, match="writer 'nobody' is not an agent"):
        g.add_edge(Edge(src="C", dst="W", relation="derived_from", writer="nobody"))
    assert path_trust(g, "T") == pytest.approx(0.3) and g.parents("T") == ["W"]  # nothing of the refused edges stored


def test_an_edge_recorded_without_writer_still_carries_no_more_than_the_record_owners_trust():
    """The attack through today's API (no writer on the edge): C's owner caps C's trust."""
    g = poisoning_graph()
    g.add_edge(Edge(src="S", dst="C", relation="supports"))
    assert path_trust(g, "C") == pytest.approx(0.2 * 0.95)
    assert ActionGate(g).decide("mallory", "medium", ["C"], now=NOW).decision == Decision.CONFIRM
    g.update_node("mallory", reason="vetted", trust=0.9)  # the writer's trust changing reaches its records at once
    assert path_trust(g, "C") == pytest.approx(0.9 * 0.95)


# ---------------------------------------------------------------- finding 2: a bare claim


def test_a_bare_claim_has_its_writers_trust_and_is_no_evidence():
    g = poisoning_graph()
    assert path_trust(g, "C") == pytest.approx(0.2)  # no evidence: no trust beyond the writer's own
    d = ActionGate(g).decide("mallory", "low", ["C"], now=NOW)
    assert d.decision == Decision.CONFIRM and d.used == []
    assert d.excluded["C"].startswith("path trust 0.20 <")
    # a trusted writer's bare claim is trusted, but it is still no evidence for the gate
    g.add_node(Node(id="B", type="claim", text="bob says so", owner="bob", time=NOW - 10))
    assert path_trust(g, "B") == pytest.approx(1.0)
    d = ActionGate(g).decide("bob", "low", ["B"], now=NOW)
    assert d.decision == Decision.CONFIRM and d.excluded["B"] == "no evidence: no source in its lineage"


# ---------------------------------------------------------------- finding 3: revocation and independent support


def support_graph() -> ProvenanceGraph:
    """K is supported by S1 (via M1) and by S2 (disjoint ancestry); J is supported by S1 only; D derives from S1 and S2."""
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="reader", type="agent"),
            Node(id="S1", type="source", text="record one of reservation 4WQ150", trust=1.0, time=NOW - 100),
            Node(id="S2", type="source", text="record two of reservation 4WQ150", trust=0.8, time=NOW - 100),
            Node(id="M1", type="memory", text="memory of reservation 4WQ150 from record one", time=NOW - 90),
            Node(id="K", type="claim", text="reservation 4WQ150 is refundable", time=NOW - 80),
            Node(id="J", type="claim", text="reservation 4WQ150 was paid by card", time=NOW - 80),
            Node(id="D", type="memory", text="summary of reservation 4WQ150", time=NOW - 80),
        ]
    )
    g.add_edges(
        [
            Edge(src="M1", dst="S1", relation="derived_from"),
            Edge(src="M1", dst="K", relation="supports"),
            Edge(src="S2", dst="K", relation="supports"),
            Edge(src="S1", dst="J", relation="supports"),
            Edge(src="D", dst="S1", relation="summarises"),
            Edge(src="D", dst="S2", relation="derived_from"),
        ]
    )
    return g


def test_revocation_keeps_a_claim_with_an_independent_surviving_support():
    g = support_graph()
    pol = AccessPolicy(g)
    pol.revoke_source("S1", "license withdrawn")
    assert pol.can_read("reader", "K") == (True, "readable")  # S2 still supports it
    assert path_trust(g, "K") == pytest.approx(0.8)
    assert pol.can_read("reader", "J") == (False, "revoked: ancestor 'S1' is revoked")  # S1 was its only support
    assert pol.can_read("reader", "M1") == (False, "revoked: ancestor 'S1' is revoked")  # derivation carries it
    assert pol.can_read("reader", "D") == (False, "revoked: ancestor 'S1' is revoked")  # a summary carries it too
    res = Retriever(g, pol, scorer="bm25").retrieve("reader", "reservation 4WQ150", k=10)
    assert {h.id for h in res.hits} == {"S2", "K"}
    d = ActionGate(g, pol).decide("reader", "medium", ["K"], now=NOW)
    assert d.decision == Decision.ALLOW and d.used == ["K"]


# ---------------------------------------------------------------- finding 4: cycles


def test_a_derivation_cycle_is_refused_naming_its_nodes():
    g = ProvenanceGraph()
    g.add_nodes([Node(id=f"M{i}", type="memory") for i in (1, 2, 3)])
    g.add_edge(Edge(src="M1", dst="M2", relation="derived_from"))
    g.add_edge(Edge(src="M2", dst="M3", relation="derived_from"))
    with pytest.raises(GraphIntegrityError, match=r"cycle M3 -> M2 -> M1 -> M3") as info:
        g.add_edge(Edge(src="M3", dst="M1", relation="derived_from"))  # M3 derived from M1, which derives from M3
    assert info.value.cycle == ["M3", "M2", "M1"]
    with pytest.raises(GraphIntegrityError, match="cycle M1 -> M1"):
        g.add_edge(Edge(src="M1", dst="M1", relation="derived_from"))
    with pytest.raises(GraphIntegrityError, match="cycle M3 -> M2 -> M1 -> M4 -> M3"):
        with g.transaction():  # a cycle made inside one batch, through another relation, is refused too
            g.add_node(Node(id="M4", type="memory"))
            g.add_edge(Edge(src="M4", dst="M1", relation="derived_from"))
            g.add_edge(Edge(src="M4", dst="M3", relation="supports"))  # M4 would support M3, from which M4 derives
    assert "M4" not in g and g.parents("M3") == [] and g.parents("M1") == ["M2"]  # and nothing of the batch stays
    import networkx as nx

    assert nx.is_directed_acyclic_graph(g.to_networkx(lineage_only=True))


# ---------------------------------------------------------------- finding 5: validity intervals


def test_a_record_past_its_validity_is_stale_for_every_risk_class():
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="bot", type="agent"),
            Node(id="s1", type="source", text="fare valid until noon", time=NOW - 60, attributes={"valid_until": NOW - 10}),
            Node(id="s2", type="source", text="an independent record", time=NOW - 60),
        ]
    )
    gate = ActionGate(g)
    for risk in ("low", "medium", "high", "critical"):
        d = gate.decide("bot", risk, ["s1", "s2"], now=NOW)
        assert "s1" not in d.used, risk
        assert d.excluded["s1"] == f"stale: past its validity (valid_until {NOW - 10:.0f}, 10 s ago) for {risk} risk"
        assert any("past their validity: ['s1']" in r for r in d.reasons), risk
    assert gate.decide("bot", "high", ["s1", "s2"], now=NOW).decision == Decision.VERIFY
    assert gate.decide("bot", "high", ["s1", "s2"], now=NOW - 20).decision == Decision.ALLOW  # still valid then
    with pytest.raises(ValueError, match="attributes.valid_until"):
        Node(id="x", type="source", attributes={"valid_until": "tomorrow"})


# ---------------------------------------------------------------- finding 8: invalidation


def test_invalidation_drops_unsupported_records_and_marks_summaries_for_rederivation():
    g = support_graph()
    pol = AccessPolicy(g)
    assert path_trust(g, "D") == pytest.approx(1.0)
    g.invalidate("S1", reason="superseded by a newer record")
    res = Retriever(g, pol, scorer="bm25").retrieve("reader", "reservation 4WQ150", k=10)
    hits = {h.id: h for h in res.hits}
    # every support of M1 and J is invalidated: not returned
    assert res.excluded["M1"] == "unsupported: every support is invalidated (ancestor 'S1')"
    assert res.excluded["J"] == "unsupported: every support is invalidated (ancestor 'S1')"
    assert res.excluded["S1"] == "invalidated (superseded)"
    # K keeps S2's independent support, unmarked; D cites S1: marked for re-derivation, trust from S2 only
    assert hits["K"].rederive == [] and hits["K"].trust == pytest.approx(0.8)
    assert hits["D"].rederive == ["S1"] and hits["D"].trust == pytest.approx(0.8)
    gate = ActionGate(g, pol)
    d = gate.decide("reader", "low", ["D"], now=NOW)
    assert d.decision == Decision.VERIFY and d.excluded["D"] == "needs re-derivation: derived from invalidated ['S1']"
    d = gate.decide("reader", "low", ["M1"], now=NOW)
    assert d.decision == Decision.CONFIRM and d.excluded["M1"].startswith("unsupported")
    assert gate.decide("reader", "low", ["K"], now=NOW).decision == Decision.ALLOW


def test_invalidation_and_revocation_differ_only_where_documented():
    """Both: an unsupported record goes, an independently supported claim stays. They differ on a record
    *derived* from the removed one: revoked (unreadable) vs marked for re-derivation (readable, surviving trust)."""
    revoked, invalid = support_graph(), support_graph()
    AccessPolicy(revoked).revoke_source("S1", "withdrawn")
    invalid.invalidate("S1")
    rr = Retriever(revoked, scorer="bm25").retrieve("reader", "reservation", k=10)
    ri = Retriever(invalid, scorer="bm25").retrieve("reader", "reservation", k=10)
    assert {h.id for h in rr.hits} == {"S2", "K"} and {h.id for h in ri.hits} == {"S2", "K", "D"}
    assert set(rr.excluded) == {"S1", "M1", "J", "D"} and set(ri.excluded) == {"S1", "M1", "J"}


# ---------------------------------------------------------------- the property


AGENT_TRUST = 0.3


@st.composite
def edge_writes(draw):
    """A trusted graph (sources, memories, claims owned by the system or by 'carol'), the attacker 'eve'
    owning a few records, and a sequence of edge writes by eve between arbitrary records."""
    n = draw(st.integers(3, 9))
    nodes = []
    for i in range(n):
        t = "source" if i < 2 else draw(st.sampled_from(["source", "memory", "claim"]))
        owner = draw(st.sampled_from([None, "carol", "eve"]))
        nodes.append(Node(id=f"n{i}", type=t, trust=draw(st.sampled_from([0.5, 0.9, 1.0])), owner=owner,
                          labels=frozenset(draw(st.sampled_from([(), ("x",)])))))
    base = []
    for j in range(2, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=2)):
            base.append(Edge(src=f"n{j}", dst=f"n{i}", relation="derived_from"))
    writes = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from(["derived_from", "supports", "summarises"])), max_size=12))
    return nodes, base, writes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_writes())
def test_no_edge_writes_by_an_agent_raise_trust_beyond_its_own(case):
    nodes, base, writes = case
    g = ProvenanceGraph()
    g.add_nodes([Node(id="carol", type="agent"), Node(id="eve", type="agent", trust=AGENT_TRUST), *nodes])
    g.add_edges(base)
    ids = [n.id for n in nodes]
    before = path_trusts(g, ids)
    parents_before = {i: g.parents(i) for i in ids}
    for a, b, rel in writes:
        src, dst = f"n{a}", f"n{b}"
        try:
            g.add_edge(Edge(src=src, dst=dst, relation=rel, writer="eve"))
        except GraphIntegrityError:
            pass  # refused: not eve's record, not readable by eve, a cycle, or a type the relation does not join
    after = path_trusts(g, ids)
    for i in ids:
        # whatever eve wrote, no record is more trusted than before, or than eve's own trust allows
        assert after[i] <= max(before[i], AGENT_TRUST) + 1e-12, i
        if g.node(i).owner != "eve":
            assert g.parents(i) == parents_before[i], i  # nobody else's record got new lineage
    # and every record eve owns rests on at most her own trust times its best evidence
    for i in ids:
        if g.node(i).owner == "eve":
            assert after[i] <= AGENT_TRUST * g.node(i).trust + 1e-12


# ---------------------------------------------------------------- seams


def test_one_public_access_filter_serves_retriever_and_gate(monkeypatch):
    g = support_graph()
    pol = AccessPolicy(g)
    g.update_node("S2", reason="private", labels=frozenset({"ops"}))
    rows = g.indexed(["S1", "S2", "K"])
    ok, excluded = pol.filter("reader", rows)
    assert ok == ["S1"] and excluded == {
        "S2": "missing label 'ops' (carried by the record itself)",
        "K": "missing label 'ops' (carried by ancestor 'S2')",  # labels travel along every lineage relation
    }
    calls = []
    real = AccessPolicy.filter

    def spy(self, agent, rows):
        calls.append(sorted(rows))
        return real(self, agent, rows)

    monkeypatch.setattr(AccessPolicy, "filter", spy)
    Retriever(g, pol, scorer="bm25").retrieve("reader", "reservation", k=3, candidates=["S1", "S2"])
    ActionGate(g, pol).decide("reader", "low", ["S1", "S2"], now=NOW)
    assert calls == [["S1", "S2"], ["S1", "S2"]]


def test_errors_live_in_errors_py_and_old_paths_still_import():
    from lab.provenance import errors
    from lab.provenance.access import AccessError
    from lab.provenance.embed import ScorerUnavailable
    from lab.provenance.prov_export import ProvExportError
    from lab.provenance.trust import TrustError

    assert AccessError is errors.AccessError and TrustError is errors.TrustError
    assert ProvExportError is errors.ProvExportError and ScorerUnavailable is errors.ScorerUnavailable
    assert errors.LineageCycleError.__mro__[1] is errors.GraphIntegrityError


def test_one_lineage_closure_and_explicit_path_trust_algorithms():
    import inspect

    from lab.provenance import access, trust
    from lab.provenance.lineage import path_trusts_over

    assert not hasattr(access, "lineage_closure")
    assert "closure" not in inspect.signature(trust.path_trusts).parameters
    g = support_graph()
    scratch = path_trusts_over(g.lineage_closure(["K", "D"]))
    assert scratch["K"] == pytest.approx(path_trusts(g, ["K"])["K"]) and scratch["D"] == pytest.approx(path_trusts(g, ["D"])["D"])
