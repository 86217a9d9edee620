"""MAP-Graph task generator (shifted splits, hidden truth), methods, tuning and the benchmark's --quick form."""

import json
from collections import Counter

import pytest

from lab.provenance import tasks as T
from lab.provenance import tasks_eval as E
from lab.provenance.embed import make_scorer
from lab.provenance.gate import EvidenceRule


@pytest.fixture(scope="module")
def scorer():
    return make_scorer("bm25")


@pytest.fixture(scope="module")
def test_split():
    return T.generate(60, seed=3, params=T.TEST)


def test_generator_deterministic_balanced_and_split_aware(test_split):
    again = T.generate(60, seed=3, params=T.TEST)
    assert [(t.id, t.setting, t.risk, t.target, t.query, t.expected, t.hazard) for t in test_split] == [
        (t.id, t.setting, t.risk, t.target, t.query, t.expected, t.hazard) for t in again
    ]
    assert [n.model_dump() for n in test_split[5].nodes] == [n.model_dump() for n in again[5].nodes]
    assert len(test_split) == 180
    for domain in T.DOMAINS:
        counts = Counter(t.setting for t in test_split if t.domain == domain)
        assert set(counts) == set(T.SETTINGS) and max(counts.values()) - min(counts.values()) <= 1
    val = T.generate(60, seed=3, params=T.VALIDATION)
    assert {t.split for t in val} == {"validation"} and {t.split for t in test_split} == {"test"}
    assert [t.target for t in val] != [t.target for t in test_split]  # the split is part of the random stream
    with pytest.raises(ValueError, match="unknown domain 'shop'"):
        T.generate(3, domains=("shop",))


def test_validation_and_test_generators_are_shifted():
    v, t = T.VALIDATION.model_dump(), T.TEST.model_dump()
    for key in ("clean_trust", "untrusted_trust", "poison_trust", "fresh_age", "stale_age", "templates"):
        assert v[key] != t[key], key
    a, b = T.TEMPLATES["A"], T.TEMPLATES["B"]
    for role in a:
        assert not set(a[role]) & set(b[role]), role  # no wording shared between the splits
    # the test split's texts contain none of validation's summary templates' fixed phrases
    texts = " ".join(n.text for task in T.generate(30, seed=0, params=T.TEST) for n in task.nodes)
    assert "is eligible to" not in texts and "not eligible" not in texts


def test_features_overlap_so_no_threshold_separates_them():
    tasks = T.generate(300, seed=0, params=T.TEST)
    clean_trust = [n.trust for t in tasks if t.setting == "clean" for n in t.nodes if n.id.startswith("s")]
    untrusted = [n.trust for t in tasks if t.setting == "untrusted_summary" for n in t.nodes if n.id == "m1"]
    assert min(clean_trust) < 0.72 and max(untrusted) > 0.6 and min(clean_trust) < max(untrusted)
    # some stale records are fine for a low-risk action; some fresh-looking clean ones too old for a critical one
    assert any(t.expected == "allow" for t in tasks if t.setting == "stale_record")
    assert any(t.expected != "allow" for t in tasks if t.setting == "clean")
    # label noise: some records' hidden reliability disagrees with their setting
    flipped = sum(not h["reliable"] for t in tasks if t.setting == "clean" for i, h in t.truth.items() if i.startswith("s"))
    assert flipped > 0
    ages = [(T.NOW - n.time) / 86400 for t in tasks if t.setting == "stale_record" for n in t.nodes if n.id == "m1"]
    assert min(ages) < 6.5 < max(ages)


def test_oracle_by_hand():
    cur = {r: True for r in T.RISKS}
    old = {"low": True, "medium": True, "high": False, "critical": False}
    ok = {"reliable": True, "current": cur}
    assert T.expected_for("clean", "critical", {"s1": ok, "s2": ok, "m1": ok}, ["s1", "s2"], "m1") == ("allow", None)
    assert T.expected_for("clean", "critical", {"s1": ok, "m1": ok}, ["s1"], "m1") == ("block", "insufficient")
    stale = {"reliable": True, "current": old}
    assert T.expected_for("stale_record", "high", {"s1": stale, "s2": stale, "m1": stale}, ["s1", "s2"], "m1") == ("verify", "stale")
    assert T.expected_for("stale_record", "low", {"s1": stale, "m1": stale}, ["s1"], "m1") == ("allow", None)
    bad = {"reliable": False, "current": cur}
    assert T.expected_for("untrusted_summary", "medium", {"m1": bad}, [], "m1") == ("confirm", "low_trust")
    assert T.expected_for("untrusted_summary", "high", {"m1": bad}, [], "m1") == ("block", "low_trust")
    assert T.expected_for("private_derived", "low", {}, [], "m1") == ("confirm", "unreadable")
    assert T.expected_for("revoked_source", "low", {}, [], "m1") == ("block", "revoked")
    assert T.expected_for("poisoned_source", "medium", {}, [], "m1") == ("block", "injected")


def test_airline_entities_come_from_tau_bench():
    db = T.airline_db()
    t = T.generate(6, seed=0, domains=("airline",))[0]
    assert t.target in db["reservations"] and t.owner.removeprefix("user:") in db["users"]


def test_reader_cues_cover_validation_wording_but_not_all_of_test():
    fields = dict(system="ledger", noun="account", target="ACC-1", detail="x", name="Ana", verb="pay", channel="email")
    caught = lambda tpl: bool(E._NEGATION.search(tpl.format(**fields)))  # noqa: E731
    assert all(caught(tpl) for tpl in T.TEMPLATES["A"]["negative"])
    assert not all(caught(tpl) for tpl in T.TEMPLATES["B"]["negative"])  # the shift the reader must live with
    for split in "AB":
        for role in ("summary", "confirmation", "record", "injected"):
            assert not any(caught(tpl) for tpl in T.TEMPLATES[split][role]), (split, role)


def _row(task, decision, cats):
    class Ctx:
        readable = {}

    return E.score_row(task, decision, [], cats, Ctx())


def test_success_needs_the_expected_decision_or_the_right_reason(test_split):
    revoked = next(t for t in test_split if t.setting == "revoked_source" and t.risk == "low")
    assert revoked.expected == "block"
    assert _row(revoked, "block", set())["success"] and _row(revoked, "block", set())["exact"]
    assert _row(revoked, "confirm", {"revoked"})["success"] and not _row(revoked, "confirm", {"revoked"})["exact"]
    assert not _row(revoked, "confirm", {"insufficient"})["success"]  # any non-allow is not enough
    assert _row(revoked, "allow", {"revoked"})["impermissible"]
    untrusted = next(t for t in test_split if t.setting == "untrusted_summary" and t.expected == "confirm")
    assert not _row(untrusted, "block", {"policy"})["success"]  # what block_all says
    assert _row(untrusted, "block", {"low_trust"})["success"]
    clean = next(t for t in test_split if t.expected == "allow")
    assert not _row(clean, "confirm", {"low_trust"})["success"] and _row(clean, "allow", set())["legit"]


def test_reason_categories_cover_every_gate_and_filter_reason(scorer):
    prep = E.Prepared(T.generate(24, seed=1, params=T.TEST), scorer, ("mapgraph",))
    try:
        config = {r: EvidenceRule(min_trust=0.6, min_independent=1 + (r in T.HIGH_RISK), max_age_s=2 * 86400) for r in T.RISKS}
        seen = set()
        for task, ctx, s1 in zip(prep.tasks, prep.ctx, prep.s1["mapgraph"]):
            support, _ = E.read(ctx, s1.ranked)
            from lab.provenance.gate import ActionGate, Risk

            gd = ActionGate(ctx.graph, ctx.policy, {Risk(task.risk): config[task.risk]}).decide(task.agent, task.risk, support, now=task.now)
            for why in [*gd.excluded.values(), *ctx.filter_reason.values()]:
                cats = E.reason_categories(why)
                assert "other" not in cats, why  # a new reason wording must be classified, not silently lost
                seen |= cats
        assert {"revoked", "unreadable", "low_trust"} <= seen
    finally:
        prep.close()


def test_cached_tuning_answers_equal_the_gate_called_directly(scorer):
    prep = E.Prepared(T.generate(18, seed=2, params=T.VALIDATION), scorer, ("mapgraph", "lineage_no_trust"))
    try:
        for m in ("mapgraph", "lineage_no_trust"):
            for rule in E.config_space(m)[::23]:
                config = {r: rule for r in T.RISKS}
                assert prep.run(m, config, cached=True) == prep.run(m, config, cached=False), (m, rule)
    finally:
        prep.close()


def test_block_all_and_allow_all_score_badly_and_mapgraph_reads_nothing_unauthorized(scorer):
    prep = E.Prepared(T.generate(24, seed=1, params=T.TEST), scorer, E.METHODS)
    try:
        configs = {m: {r: E.config_space(m)[len(E.config_space(m)) // 2] for r in T.RISKS} for m in E.METHODS}
        res = E.evaluate(prep, configs)
    finally:
        prep.close()
    block, allow = res["block_all"]["overall"], res["allow_all"]["overall"]
    assert block["legit_allow_rate"] == 0.0 and block["task_success"] < 0.7 and block["impermissible_allows"] == 0
    assert allow["legit_allow_rate"] == 1.0 and allow["impermissible_allows"] > 0 and allow["task_success"] < 0.3
    assert res["mapgraph"]["overall"]["unauthorized_reads"] == 0 and res["semantic"]["overall"]["unauthorized_reads"] > 0


def test_ci95():
    lo, hi = E.ci95([0.9, 0.92, 0.94, 0.91, 0.93])
    assert lo < 0.92 < hi and hi - lo == pytest.approx(2 * 2.776 * 0.01581 / 5**0.5, rel=1e-3)
    assert E.ci95([0.5]) == [0.5, 0.5]


def test_benchmark_quick(tmp_path, scorer):
    from benchmarks import mapgraph

    out = tmp_path / "mg.json"
    mapgraph.main(["--out", str(out), "--quick"])
    data = json.loads(out.read_text())
    assert data["seeds"] == [0, 1] and data["inputs"]["shifted_split"] is True
    assert data["inputs"]["validation"]["templates"] == "A" and data["inputs"]["test"]["templates"] == "B"
    assert data["inputs"]["validation"]["clean_trust"] != data["inputs"]["test"]["clean_trust"]
    assert set(E.METHODS) == set(data["methods"])
    for name, m in data["methods"].items():
        for key in ("task_success", "exact_decision", "legit_allow_rate"):
            v = m[key]
            assert set(v) >= {"value", "ci95"} and len(v["per_seed"]) == 2, (name, key)
            assert v["ci95"][0] <= v["value"] <= v["ci95"][1], (name, key)
        for key in ("unauthorized_reads", "impermissible_allows"):
            assert isinstance(m[key]["value"], int) and m[key]["value"] == sum(m[key]["per_seed"])
        assert m["tuning"]["chosen_on"] == "validation"
        assert m["tuning"]["configurations_tried_per_risk_class"] <= m["tuning"]["budget_per_risk_class"] == E.BUDGET
    assert data["methods"]["block_all"]["legit_allow_rate"]["value"] == 0.0
    assert data["methods"]["allow_all"]["impermissible_allows"]["value"] > 0
    assert data["methods"]["mapgraph"]["unauthorized_reads"]["value"] == 0
    # the thresholds came from the validation split: re-tuning on it gives them back, on the test split it need not
    val = E.Prepared(T.generate(24, 0, T.VALIDATION), scorer, ("mapgraph",))
    try:
        config, _ = E.tune(val, "mapgraph")
    finally:
        val.close()
    stored = data["methods"]["mapgraph"]["tuning"]["per_seed"][0]["rules"]
    assert {r: config[r].model_dump() for r in T.RISKS} == stored
    curve = data["operating_curve"]["test"]["mapgraph"]
    assert [p["delta_min_trust"] for p in curve] == sorted(p["delta_min_trust"] for p in curve)
    assert curve[0]["legit_allow_rate"]["value"] >= curve[-1]["legit_allow_rate"]["value"]  # stricter trust, fewer allows
    assert set(data["per_setting"]["mapgraph"]) == set(T.SETTINGS)
    r = data["retrieval"]
    assert r["records"] == 3000 and r["p95_ms"] > 0 and set(r["latency_ms"]) == {"warm_idle", "warm_loaded", "cold_idle", "cold_loaded"}
    assert r["index_revocation_seen_by_next_retrieval"] is True and r["new_record_seen_by_next_query"] is True
    assert r["baseline_same_top10"].split("/")[0] == r["baseline_same_top10"].split("/")[1]
    for goal in data["goals"].values():
        assert goal["met"] in (True, False)
