"""PROV export: every node type and relation, PROV-JSON and PROV-N round trips, PROV-N statements."""

from __future__ import annotations

import json

import prov.model as pm
import pytest

from lab.provenance import Edge, Node, ProvenanceGraph
from lab.provenance.prov_export import LAB_NS, ProvExportError, from_prov, to_prov, write_prov


def full_graph() -> ProvenanceGraph:
    g = ProvenanceGraph()
    g.add_nodes(
        [
            Node(id="alice", type="agent", text="planner", time=1.0, attributes={"scopes": ["ops"]}),
            Node(id="bob", type="agent", owner=None, run="r1"),
            Node(id="s1", type="source", text='flight "HAT001" costs $120\nline two', time=1700000000.123456789,
                 owner="alice", labels=frozenset({"finance", "alice"}), trust=0.9, run="r1",
                 attributes={"tool": "search", "args": {"q": "HAT", "n": [1, 2.5, None, True]}}),
            Node(id="s2", type="source", text="gold member", trust=0.1 + 0.2, valid=False, run="r1"),
            Node(id="m1", type="memory", text="", time=3.25, owner="bob", run="r1"),
            Node(id="c1", type="claim", text="cheapest is HAT001", trust=0.75, run="r2", labels=frozenset({"ops"})),
            Node(id="x1", type="action", text="book HAT001", time=5.0, run="r1", attributes={"risk": "high"}),
            Node(id="x2", type="action", text="refund", run="r2"),
            Node(id="odd id/with:colon %", type="memory", text="weird id"),
        ]
    )
    g.add_edges(
        [
            Edge(src="m1", dst="s1", relation="derived_from", time=2.0, attributes={"how": "summary"}),
            Edge(src="s1", dst="c1", relation="supports", time=2.5),
            Edge(src="m1", dst="x1", relation="supports"),
            Edge(src="x1", dst="m1", relation="used", time=4.0),
            Edge(src="x2", dst="c1", relation="generated", time=6.5),
            Edge(src="c1", dst="alice", relation="attributed_to"),
            Edge(src="x1", dst="alice", relation="attributed_to"),
            Edge(src="bob", dst="alice", relation="acted_on_behalf_of", time=0.5),
            Edge(src="s2", dst="x2", relation="invalidated_by", time=7.0),
            Edge(src="m1", dst="s2", relation="invalidated_by", time=8.0),
            Edge(src="odd id/with:colon %", dst="m1", relation="derived_from"),
            Edge(src="m1", dst="s2", relation="summarises", time=8.5, writer="bob"),  # bob owns m1 and may read s2
        ]
    )
    return g


def snapshot(g: ProvenanceGraph):
    nodes = sorted((n.model_dump() for n in g.nodes()), key=lambda d: d["id"])
    edges = sorted((e.model_dump(mode="json") for e in g.edges()), key=lambda d: (d["src"], d["dst"], d["relation"]))
    return nodes, edges


def test_mapping_uses_prov_types():
    doc = to_prov(full_graph())
    kinds = {type(r).__name__ for r in doc.get_records()}
    assert {"ProvAgent", "ProvEntity", "ProvActivity", "ProvDerivation", "ProvUsage", "ProvGeneration",
            "ProvAttribution", "ProvAssociation", "ProvDelegation", "ProvInvalidation", "ProvInfluence"} <= kinds
    ns = pm.Namespace("lab", LAB_NS)
    c1 = doc.get_record(ns["c1"])[0]
    assert isinstance(c1, pm.ProvEntity) and c1.get_attribute(ns["type"]) == {"claim"}
    supports = [r for r in doc.get_records(pm.ProvInfluence) if ns["supports"] in r.get_attribute(pm.PROV_TYPE)]
    assert len(supports) == 2


def test_prov_json_round_trip(tmp_path):
    g = full_graph()
    path = write_prov(g, tmp_path / "g.json")
    json.loads(path.read_text())  # valid JSON
    back = from_prov(path)
    assert snapshot(back) == snapshot(g)
    # also straight from a document object, into a file-backed store
    back2 = from_prov(to_prov(g), into=tmp_path / "back.db")
    assert snapshot(back2) == snapshot(g)


def test_provn_statements_and_round_trip(tmp_path):
    g = full_graph()
    path = write_prov(g, tmp_path / "g.provn", format="provn")
    text = path.read_text()
    for statement in (
        "wasDerivedFrom(lab:m1, lab:s1",
        "used(lab:x1, lab:m1, ",
        "wasGeneratedBy(lab:c1, lab:x2, ",
        "wasAttributedTo(lab:c1, lab:alice",
        "wasAssociatedWith(lab:x1, lab:alice",
        "actedOnBehalfOf(lab:bob, lab:alice",
        "wasInvalidatedBy(lab:s2, lab:x2, ",
        "wasInfluencedBy(lab:c1, lab:s1, [prov:type='lab:supports'",
        "wasInfluencedBy(lab:m1, lab:s2, [prov:type='lab:invalidatedBy'",
        "entity(lab:s1, ",
        "activity(lab:x1, ",
        "agent(lab:alice, ",
    ):
        assert statement in text, statement
    assert snapshot(from_prov(path, format="provn")) == snapshot(g)


def test_run_filter_and_errors(tmp_path):
    g = full_graph()
    doc = to_prov(g, run="r1")
    ids = {r.identifier.localpart for r in doc.get_records(pm.ProvElement)}
    assert ids == {"bob", "s1", "s2", "m1", "x1"}
    back = from_prov(doc)
    assert {(e.src, e.relation.value, e.dst) for e in back.edges()} == {
        ("m1", "derived_from", "s1"), ("m1", "supports", "x1"), ("x1", "used", "m1"), ("m1", "invalidated_by", "s2"),
        ("m1", "summarises", "s2")}
    assert [e.writer for e in back.edges(relation="summarises")] == ["bob"] and {e.writer for e in back.edges(relation="used")} == {None}
    with pytest.raises(ProvExportError, match="unsupported format"):
        write_prov(g, tmp_path / "x.ttl", format="turtle")
