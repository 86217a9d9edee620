"""Access (inherited scopes, revocation, the pre-ranking filter) and trust (path trust, independent support)."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.provenance import Edge, Node, ProvenanceGraph
from lab.provenance.access import AccessError, AccessPolicy
from lab.provenance.graph import LINEAGE
from lab.provenance.lineage import CARRYING
from lab.provenance.trust import (
    TrustError,
    independent_support_set,
    independent_supports,
    path_trust,
    path_trusts,
    record_trust,
    source_ancestry,
)

# ---------------------------------------------------------------- hand-built cases


def chain_graph() -> ProvenanceGraph:
    """s1 (finance) -> m1 -> c1 -> x1 ; s2 (public) -> c1 ; agents alice, bob."""
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="alice", type="agent"),
            Node(id="bob", type="agent"),
            Node(id="s1", type="source", trust=0.9, labels=frozenset({"finance"})),
            Node(id="s2", type="source", trust=0.5),
            Node(id="m1", type="memory", trust=0.8),
            Node(id="c1", type="claim", trust=0.5),
            Node(id="x1", type="action"),
        ]
    )
    g.add_edges(
        [
            Edge(src="m1", dst="s1", relation="derived_from"),
            Edge(src="m1", dst="c1", relation="supports"),
            Edge(src="s2", dst="c1", relation="supports"),
            Edge(src="x1", dst="c1", relation="used"),
        ]
    )
    return g


def test_labels_propagate_and_reasons():
    g = chain_graph()
    pol = AccessPolicy(g)
    assert pol.effective_labels("s2") == frozenset()
    assert pol.effective_labels("x1") == {"finance"}
    assert pol.can_read("bob", "s2") == (True, "readable")
    ok, why = pol.can_read("bob", "x1")
    assert not ok and why == "missing label 'finance' (carried by ancestor 's1')"
    assert pol.can_read("bob", "s1") == (False, "missing label 'finance' (carried by the record itself)")
    pol.grant("bob", "finance")
    assert pol.can_read("bob", "x1") == (True, "readable")
    assert "grant finance" in [reason for _, reason, _ in g.history("bob")]
    pol.revoke_grant("bob", "finance")
    assert pol.can_read("bob", "x1")[0] is False
    # an agent's own id is a scope
    g.update_node("s2", reason="private", labels=frozenset({"alice"}))
    assert pol.can_read("alice", "s2")[0] and not pol.can_read("bob", "s2")[0]
    with pytest.raises(AccessError, match="not an agent"):
        pol.grant("s1", "x")
    with pytest.raises(AccessError, match="not a source"):
        pol.revoke_source("m1", "nope")


def test_revocation_and_eligible():
    g = chain_graph()
    pol = AccessPolicy(g)
    pol.grant("bob", "finance")
    ok, excluded = pol.eligible("bob", ["x1", "m1", "s2", "c1"])
    assert ok == ["x1", "m1", "s2", "c1"] and excluded == {}
    pol.revoke_source("s1", "license withdrawn")
    node = g.node("s1")
    assert node.valid is False and node.attributes["revoked"] is True and node.attributes["revoked_reason"] == "license withdrawn"
    # m1 derives from s1: revoked with it; c1 is supported by m1 and, independently, by s2: it stays (and x1 on it)
    assert pol.revoked("m1") and pol.revoked("s1") and not pol.revoked("s2") and not pol.revoked("c1") and not pol.revoked("x1")
    ok, excluded = pol.eligible("bob", ["x1", "m1", "s2", "c1"])
    assert ok == ["x1", "s2", "c1"]
    assert excluded == {"m1": "revoked: ancestor 's1' is revoked"}
    pol.revoke_source("s2", "withdrawn too")  # now every support of c1 is revoked: c1 goes, and x1, which used it
    ok, excluded = pol.eligible("bob", ["x1", "m1", "s2", "c1"])
    assert ok == [] and excluded["c1"] == "revoked: ancestor 's1' is revoked"
    assert excluded["x1"] == "revoked: ancestor 's1' is revoked"
    assert pol.can_read("bob", "s1") == (False, "revoked: it is revoked")


def test_path_trust_chain_hand_computed():
    g = chain_graph()
    assert path_trust(g, "s1") == pytest.approx(0.9)
    assert path_trust(g, "m1") == pytest.approx(0.9 * 0.8)
    # c1: best of (s1 -> m1 -> c1) = 0.9*0.8*0.5 = 0.36 and (s2 -> c1) = 0.5*0.5 = 0.25
    assert path_trust(g, "c1") == pytest.approx(0.36)
    assert path_trust(g, "x1") == pytest.approx(0.36)
    g.invalidate("s1")  # invalid sources contribute 0: the other path wins
    assert path_trust(g, "c1") == pytest.approx(0.25)
    assert path_trusts(g, ["m1", "s2"]) == {"m1": 0.0, "s2": 0.5}


def support_graph() -> ProvenanceGraph:
    """c has supporters m1, m2 (both from s1), m3 (from s2), m4 (from s3, weak), m5 (from s1 and s4)."""
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="s1", type="source", trust=0.9),
            Node(id="s2", type="source", trust=0.8),
            Node(id="s3", type="source", trust=0.2),
            Node(id="s4", type="source", trust=0.7),
            *(Node(id=f"m{i}", type="memory") for i in range(1, 6)),
            Node(id="c", type="claim"),
        ]
    )
    g.add_edges(
        [
            Edge(src="m1", dst="s1", relation="derived_from"),
            Edge(src="m2", dst="s1", relation="derived_from"),
            Edge(src="m3", dst="s2", relation="derived_from"),
            Edge(src="m4", dst="s3", relation="derived_from"),
            Edge(src="m5", dst="s1", relation="derived_from"),
            Edge(src="m5", dst="s4", relation="derived_from"),
            *(Edge(src=f"m{i}", dst="c", relation="supports") for i in range(1, 6)),
        ]
    )
    return g


def test_independent_supports_hand_built():
    g = support_graph()
    assert source_ancestry(g, "m5") == {"s1", "s4"}
    # m1, m2, m5 share s1: only one of them counts; plus m3 and m4
    assert independent_supports(g, "c") == 3
    assert independent_supports(g, "c", min_trust=0.5) == 2  # m4 (0.2) drops out
    assert independent_support_set(g, "c", min_trust=0.5) in (["m1", "m3"], ["m2", "m3"], ["m3", "m5"])
    # two supporters sharing one source count once
    h = ProvenanceGraph()
    h.add_nodes([Node(id="s", type="source"), Node(id="a", type="memory"), Node(id="b", type="memory"), Node(id="c", type="claim")])
    h.add_edges([Edge(src="a", dst="s", relation="derived_from"), Edge(src="b", dst="s", relation="derived_from"),
                 Edge(src="a", dst="c", relation="supports"), Edge(src="b", dst="c", relation="supports")])
    assert independent_supports(h, "c") == 1
    AccessPolicy(g).revoke_source("s2", "poisoned")  # revoked sources contribute 0
    assert independent_supports(g, "c", min_trust=0.5) == 1


def test_record_trust_modes():
    g = support_graph()
    assert record_trust(g, "c") == pytest.approx(0.9) == pytest.approx(path_trust(g, "c"))
    # noisy-or over the best independent set {m1|m2|m5 (0.9), m3 (0.8), m4 (0.2)}
    assert record_trust(g, "c", mode="noisy_or") == pytest.approx(1 - 0.1 * 0.2 * 0.8)
    assert record_trust(g, "c", mode="noisy_or", min_trust=0.5) == pytest.approx(1 - 0.1 * 0.2)
    assert record_trust(g, "s3") == pytest.approx(0.2)
    with pytest.raises(TrustError, match="unknown mode"):
        record_trust(g, "c", mode="mean")


# ---------------------------------------------------------------- property tests on random DAGs

LABELS = ["a", "b", "c"]
TYPES = ["source", "memory", "claim", "action"]


@st.composite
def dags(draw):
    n = draw(st.integers(2, 14))
    nodes = []
    for i in range(n):
        t = "source" if i == 0 else draw(st.sampled_from(TYPES))
        nodes.append(Node(id=f"n{i}", type=t, labels=frozenset(draw(st.lists(st.sampled_from(LABELS), max_size=1))),
                          trust=draw(st.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0]))))
    edges = []
    for j in range(1, n):
        for i in draw(st.sets(st.integers(0, j - 1), max_size=3)):
            # parent n{i} -> child n{j}: pick a relation whose lineage goes that way, if the types allow
            pt, ct = nodes[i].type, nodes[j].type
            if ct == "action":
                edges.append(Edge(src=f"n{j}", dst=f"n{i}", relation="used") if pt != "action" else None)
            elif pt == "action":
                edges.append(Edge(src=f"n{i}", dst=f"n{j}", relation="generated"))
            elif ct == "source" or draw(st.booleans()):
                edges.append(Edge(src=f"n{j}", dst=f"n{i}", relation="derived_from"))
            else:
                edges.append(Edge(src=f"n{i}", dst=f"n{j}", relation="supports") if ct != "source" else None)
    scopes = draw(st.sets(st.sampled_from(LABELS)))
    return nodes, [e for e in edges if e is not None], scopes


def build(nodes, edges, scopes):
    g = ProvenanceGraph()
    g.add_nodes([Node(id="agent", type="agent"), *nodes])
    g.add_edges(edges)
    pol = AccessPolicy(g)
    for s in scopes:
        pol.grant("agent", s)
    return g, pol


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(dags())
def test_eligible_agrees_with_can_read(case):
    g, pol = build(*case)
    ids = [n.id for n in case[0]]
    ok, excluded = pol.eligible("agent", ids)
    assert set(ok) | set(excluded) == set(ids) and not set(ok) & set(excluded)
    for i in ids:
        allowed, reason = pol.can_read("agent", i)
        assert allowed == (i in ok)
        if not allowed:
            assert excluded[i] == reason
        # most-restrictive: readable iff every effective label is held
        assert allowed == (pol.effective_labels(i) <= pol.scopes("agent"))


@FAST
@given(dags(), st.sampled_from(LABELS))
def test_root_label_reaches_every_descendant(case, label):
    g, pol = build(*case)
    g.update_node("n0", reason="restrict", labels=frozenset({label}))
    for d in g.descendants("n0") | {"n0"}:
        assert label in pol.effective_labels(d)
    for n in case[0]:  # and effective labels are exactly the union over the ancestry
        expect = set(g.node(n.id).labels).union(*(g.node(a).labels for a in g.ancestors(n.id)))
        assert pol.effective_labels(n.id) == expect


@FAST
@given(dags())
def test_revocation_is_immediate(case):
    g, pol = build(*case)
    for s in ("a", "b", "c"):
        pol.grant("agent", s)
    ids = [n.id for n in case[0]]
    before, _ = pol.eligible("agent", ids)
    assert before == ids  # everything readable with all scopes
    pol.revoke_source("n0", "poisoned")
    ok, excluded = pol.eligible("agent", ids)
    affected = reference_revoked(g, {"n0"})
    assert set(excluded) == affected and set(ok) == set(ids) - affected
    assert affected <= g.descendants("n0") | {"n0"}
    assert all(r.startswith("revoked") for r in excluded.values())


def reference_revoked(g: ProvenanceGraph, revoked: set[str]) -> set[str]:
    """Revocation by its definition, over networkx: a node is revoked if it is revoked itself, if a parent
    reached through a carrying relation is, or if it has lineage parents and every one of them is."""
    lineage = nx.DiGraph()
    lineage.add_nodes_from(n.id for n in g.nodes())
    into: dict[str, list[tuple[str, str]]] = {n: [] for n in lineage}
    for e in g.edges():
        side = LINEAGE.get(e.relation)
        if side is not None:
            parent, child = (e.dst, e.src) if side == "dst" else (e.src, e.dst)
            lineage.add_edge(parent, child)
            into[child].append((parent, e.relation.value))
    out: set[str] = set()
    for n in nx.topological_sort(lineage):
        ins = into[n]
        if n in revoked or any(p in out and rel in CARRYING for p, rel in ins) or (ins and all(p in out for p, _ in ins)):
            out.add(n)
    return out


@FAST
@given(dags())
def test_path_trust_bounds(case):
    g, _ = build(*case)
    ids = [n.id for n in case[0]]
    pts = path_trusts(g, ids)
    for i in ids:
        assert 0.0 <= pts[i] <= 1.0
        assert pts[i] == pytest.approx(path_trust(g, i))
        parents = g.parents(i)
        node = g.node(i)
        if parents:
            assert pts[i] <= max(pts[p] for p in parents) + 1e-12
            assert pts[i] == pytest.approx(node.trust * max(pts[p] for p in parents))
        else:
            assert pts[i] == pytest.approx(node.trust)
        assert 0 <= independent_supports(g, i) <= len(parents)
        assert record_trust(g, i) == pytest.approx(pts[i])
        assert record_trust(g, i, mode="noisy_or") >= record_trust(g, i) - 1e-12


def test_long_chain_product_and_many_candidates():
    g = ProvenanceGraph()
    trusts = [0.9, 0.95, 0.8, 1.0, 0.7, 0.99] * 50
    g.add_nodes([Node(id="agent", type="agent"), Node(id="n0", type="source", trust=trusts[0], labels=frozenset({"x"}))])
    g.add_nodes(Node(id=f"n{i}", type="memory", trust=t) for i, t in enumerate(trusts) if i)
    g.add_edges(Edge(src=f"n{i}", dst=f"n{i - 1}", relation="derived_from") for i in range(1, len(trusts)))
    assert path_trust(g, f"n{len(trusts) - 1}") == pytest.approx(math.prod(trusts))
    ok, excluded = AccessPolicy(g).eligible("agent", [f"n{i}" for i in range(len(trusts))])
    assert ok == [] and len(excluded) == len(trusts)
    assert excluded["n299"] == "missing label 'x' (carried by ancestor 'n0')"
