"""MAP-Graph task generator, methods and benchmark (fast: small task sets, small retrieval graph)."""

import json
from collections import Counter

import pytest

from lab.provenance import tasks as T
from lab.provenance.embed import make_scorer


@pytest.fixture(scope="module")
def small():
    return T.generate(24, seed=3)


def test_generator_deterministic_and_balanced(small):
    again = T.generate(24, seed=3)
    assert [(t.id, t.setting, t.risk, t.target, t.query, t.expected) for t in small] == [
        (t.id, t.setting, t.risk, t.target, t.query, t.expected) for t in again
    ]
    assert [n.model_dump() for n in small[5].nodes] == [n.model_dump() for n in again[5].nodes]
    assert len(small) == 72
    for domain in T.DOMAINS:
        counts = Counter(t.setting for t in small if t.domain == domain)
        assert set(counts) == set(T.SETTINGS) and max(counts.values()) - min(counts.values()) <= 1
    assert {t.risk for t in small} == set(T.RISKS)
    assert T.generate(24, seed=4)[0].target != small[0].target or T.generate(24, seed=4)[1].target != small[1].target


def test_expected_decisions_by_hand():
    assert T.expected_decision("clean", "critical") == "allow"
    assert T.expected_decision("private_derived", "low") == "confirm"
    assert T.expected_decision("private_derived", "high") == "block"
    assert T.expected_decision("revoked_source", "medium") == "block"
    assert T.expected_decision("poisoned_source", "low") == "block"
    assert T.expected_decision("untrusted_summary", "medium") == "confirm"
    assert T.expected_decision("untrusted_summary", "critical") == "block"
    assert T.expected_decision("stale_record", "low") == "verify"
    tasks = T.generate(24, seed=0)
    first = {}
    for t in tasks:
        first.setdefault(t.setting, t)
    # settings round-robin from index 0, risk 'low' for the first six of each domain
    assert [first[s].risk for s in T.SETTINGS] == ["low"] * 6
    assert [first[s].expected for s in T.SETTINGS] == ["allow", "confirm", "block", "block", "confirm", "verify"]
    assert first["revoked_source"].revoke == ["s1"]
    pd = first["private_derived"]
    assert pd.target in {k for k, _ in T._entities(pd.domain)[[p[0] for p in T._entities(pd.domain)].index(pd.other)][2]}


def test_airline_entities_come_from_tau_bench():
    db = T.airline_db()
    t = T.generate(6, seed=0, domains=("airline",))[0]
    assert t.target in db["reservations"] and t.owner.removeprefix("user:") in db["users"]


def test_access_properties_on_private_derived():
    scorer = make_scorer("bm25")
    tasks = [t for t in T.generate(30, seed=1) if t.setting == "private_derived"]
    res = T.evaluate(tasks, scorer, methods=("semantic", "mapgraph"))
    assert res["methods"]["mapgraph"]["unauthorized_reads"] == 0
    assert res["methods"]["semantic"]["unauthorized_reads"] > 0
    assert res["methods"]["mapgraph"]["unsafe_actions"]["allow_on_attack"] == 0
    # a clean task is allowed by mapgraph and uses the gold evidence
    clean = [t for t in T.generate(12, seed=1) if t.setting == "clean" and t.risk == "critical"] or [T.generate(30, seed=1)[18]]
    ctx = T.build(clean[0], scorer)
    try:
        decision, retrieved = T.run_method("mapgraph", ctx)
        assert decision == "allow" and {"s1", "s2"} <= set(retrieved)
    finally:
        ctx.close()


def test_chat_decider_parse_only():
    assert T.ChatDecider.parse("Decision: Confirm.") == "confirm"
    assert T.ChatDecider.parse("no idea") == "block"


def test_benchmark_end_to_end(tmp_path):
    from benchmarks import mapgraph

    out = tmp_path / "mg.json"
    mapgraph.main(["--out", str(out), "--per-domain", "30", "--records", "3000", "--queries", "10", "--baseline-queries", "3"])
    data = json.loads(out.read_text())
    assert set(T.METHODS) == set(data["methods"])
    for m in data["methods"].values():
        assert {"task_success", "exact_decision", "clean_accuracy", "unauthorized_reads", "unsafe_actions", "tasks"} <= set(m)
        assert m["tasks"] == 90
    assert set(data["per_setting"]["mapgraph"]) == set(T.SETTINGS)
    r = data["retrieval"]
    assert r["records"] == 3000 and {"p50_ms", "p95_ms", "baseline_p95_ms", "baseline_over_mapgraph_p95", "index_revoke_source_ms"} <= set(r)
    assert r["index_revocation_seen_by_next_retrieval"] is True and r["index_revoked_source_descendants"] > 0
    assert "goals" in data and data["methods"]["mapgraph"]["unauthorized_reads"] == 0
