"""MAP-Graph benchmark: nine methods on a shifted validation/test split over >= 5 seeds, and retrieval at scale.

``python -m benchmarks.mapgraph --out FILE.json [--seeds 0 1 2 3 4] [--quick]``

Part 1 (decisions). Per generator seed: :func:`lab.provenance.tasks.generate` makes a validation
split with :data:`~lab.provenance.tasks.VALIDATION` and a test split with the shifted
:data:`~lab.provenance.tasks.TEST` generator (other trust means, age spreads and templates; the
same hidden truth). Every method's configuration (the gate's ``min_trust``, ``max_age_s`` and
``min_independent`` per risk class, or a gate-less reader's similarity cut, ``k`` and support) is
chosen on the validation split with the same budget (:func:`lab.provenance.tasks_eval.tune`); the
test split is then run once per method with that configuration, uncached. Rates are reported as
the mean over seeds with a Student-t 95% interval; counts as totals with the per-seed values. The
operating curve moves every tuned ``min_trust`` by ``delta`` and reports success against the
legitimate-allow rate on both splits.

Part 2 (retrieval). One :class:`ProvenanceGraph` with ``--records`` records (default 100,000): 10%
sources (labels from 20 scopes or public, trust in [0.3, 1], 1% revoked) and memories and claims
in three layers derived from 1-2 records of the layers below. Each text carries one of 100 topic
words and six of 500 filler words. A query names a topic and two filler words. Timed per query,
**including candidate pre-selection**: :meth:`Retriever.retrieve` with a :class:`TextIndex` (BM25
over every record; its top N as candidates, N the smallest size up to ``--preselect`` whose top 10
agrees with pre-selecting everything on >= 99% of hits over separate validation queries), the inherited-index read, the hard
filter, similarity x path trust, top 10. The baseline runs on the same queries: the same
pre-selection (timed), then a naive networkx traversal per candidate (ancestors, labels,
revocation, max-product path trust) and the same ranking. Latency is measured twice: as the
machine is, and with ``--load`` extra busy processes competing for the cores.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import time

import networkx as nx
import numpy as np
from tqdm import tqdm

from benchmarks._common import write
from lab.provenance import tasks as T
from lab.provenance import tasks_eval as E
from lab.provenance.access import AccessPolicy
from lab.provenance.embed import make_scorer
from lab.provenance.graph import Edge, Node, NodeType, ProvenanceGraph, Relation
from lab.provenance.index import TextIndex
from lab.provenance.lineage import factor
from lab.provenance.retrieve import Retriever

GOALS = {
    "task_success": 0.95,
    "exact_decision": 0.73,
    "legit_allow_rate": 0.90,
    "unauthorized_reads": 0,
    "impermissible_allows": 0,
    "retrieval_p95_ms": 20.0,
    "retrieval_p95_ms_aim": 10.0,
}
RATES = ("task_success", "exact_decision", "legit_allow_rate", "clean_accuracy")
COUNTS = ("unauthorized_reads", "impermissible_allows", "unsafe_allows", "high_risk_impermissible_allows")
DELTAS = (-0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3)
CURVE_METHODS = ("mapgraph", "mapgraph_no_path_trust", "mapgraph_no_permission_filter")
_TOPICS = 100
PRESELECT_SIZES = (100, 200, 300, 500, 1000)
PRESELECT_RECALL = 0.99
REPEATS = 3  # timing runs per condition; each percentile is the median over the runs


# ----------------------------------------------------------------------------- part 1


def _rule_json(rule) -> dict | None:
    return None if rule is None else rule.model_dump()


def _aggregate(per_seed: list[dict]) -> dict:
    out: dict = {"tasks": sum(s["tasks"] for s in per_seed)}
    for key in RATES:
        vals = [s[key] for s in per_seed]
        got = [v for v in vals if v is not None]
        out[key] = {"value": float(np.mean(got)) if got else None, "ci95": E.ci95(got) if got else None, "per_seed": vals}
    for key in COUNTS:
        vals = [int(s[key]) for s in per_seed]
        out[key] = {"value": int(sum(vals)), "per_seed": vals}
    out["decisions"] = {d: int(sum(s["decisions"][d] for s in per_seed)) for d in per_seed[0]["decisions"]}
    return out


def decisions_benchmark(seeds: list[int], val_per_domain: int, test_per_domain: int, scorer_name: str) -> dict:
    scorer = make_scorer(scorer_name)
    per_seed: dict[str, list[dict]] = {m: [] for m in E.METHODS}
    per_setting: dict[str, dict[str, list[dict]]] = {m: {s: [] for s in T.SETTINGS} for m in E.METHODS}
    curves = {split: {m: {d: [] for d in DELTAS} for m in CURVE_METHODS} for split in ("validation", "test")}
    tuning: dict[str, list[dict]] = {m: [] for m in E.METHODS}
    t0 = time.perf_counter()
    for seed in tqdm(seeds, desc="mapgraph seeds"):
        val = E.Prepared(T.generate(val_per_domain, seed, T.VALIDATION), scorer, E.METHODS)
        configs = {}
        for m in tqdm(E.METHODS, desc=f"tune on validation (seed {seed})", leave=False):
            configs[m], record = E.tune(val, m)
            tuning[m].append({"seed": seed, "rules": {r: _rule_json(configs[m][r]) for r in T.RISKS}, **record})
        for m in CURVE_METHODS:
            for d in DELTAS:
                curves["validation"][m][d].append(E.summarize(val.run(m, E.shifted(configs[m], d))))
        val.close()
        test = E.Prepared(T.generate(test_per_domain, seed, T.TEST), scorer, E.METHODS)
        res = E.evaluate(test, configs)  # the test split, once per method, uncached
        for m in E.METHODS:
            per_seed[m].append(res[m]["overall"])
            for s in T.SETTINGS:
                per_setting[m][s].append(res[m]["per_setting"][s])
        for m in CURVE_METHODS:
            for d in DELTAS:
                curves["test"][m][d].append(E.summarize(test.run(m, E.shifted(configs[m], d))))  # cached: equal answers, tested
        test.close()
    methods = {m: _aggregate(per_seed[m]) for m in E.METHODS}
    for m in E.METHODS:
        methods[m]["tuning"] = {"budget_per_risk_class": E.BUDGET, "configurations_tried_per_risk_class": len(E.config_space(m)), "chosen_on": "validation", "per_seed": tuning[m]}
    curve_out = {
        split: {
            m: [
                {"delta_min_trust": d, **{k: _aggregate(curves[split][m][d])[k] for k in ("task_success", "exact_decision", "legit_allow_rate")},
                 "impermissible_allows": _aggregate(curves[split][m][d])["impermissible_allows"]}
                for d in DELTAS
            ]
            for m in CURVE_METHODS
        }
        for split in curves
    }
    return {
        "methods": methods,
        "per_setting": {m: {s: _aggregate(per_setting[m][s]) for s in T.SETTINGS} for m in E.METHODS},
        "operating_curve": curve_out,
        "wall_s": time.perf_counter() - t0,
    }


# ----------------------------------------------------------------------------- part 2


def build_retrieval_graph(n_records: int, seed: int = 0) -> tuple[ProvenanceGraph, str]:
    """The large random graph and the reading agent."""
    rng = random.Random(seed)
    g = ProvenanceGraph(":memory:")
    scopes = [f"scope{i}" for i in range(20)]
    agent = "agent:reader"
    g.add_node(Node(id=agent, type=NodeType.AGENT, attributes={"scopes": sorted(rng.sample(scopes, 12))}))
    g.add_node(Node(id="agent:writer", type=NodeType.AGENT))  # writes between timed queries (cold runs)
    n_src = max(1, n_records // 10)
    layers: list[list[str]] = [[], [], [], []]
    nodes, edges = [], []
    words = [f"w{i}" for i in range(500)]
    for i in range(n_records):
        text = f"topic{rng.randrange(_TOPICS)} " + " ".join(rng.sample(words, 6))
        if i < n_src:
            labels = frozenset() if rng.random() < 0.4 else frozenset({rng.choice(scopes)})
            attrs = {"revoked": True} if rng.random() < 0.01 else {}
            nid, level = f"s{i}", 0
            nodes.append(Node(id=nid, type=NodeType.SOURCE, text=text, labels=labels, trust=rng.uniform(0.3, 1.0), valid=not attrs, attributes=attrs))
        else:
            level = 1 + (i - n_src) * 3 // (n_records - n_src)
            nid = f"{'m' if level < 3 else 'c'}{i}"
            nodes.append(Node(id=nid, type=NodeType.MEMORY if level < 3 else NodeType.CLAIM, text=text, trust=rng.uniform(0.8, 1.0)))
            parents = set()
            for _ in range(rng.choice((1, 2))):
                layer = layers[rng.randrange(level)] or layers[0]
                parents.add(layer[-1 - rng.randrange(min(len(layer), 3000))])
            for p in sorted(parents):
                edges.append(Edge(src=nid, dst=p, relation=Relation.DERIVED_FROM))
        layers[level].append(nid)
    g.add_nodes(nodes)
    g.add_edges(edges)
    return g, agent


def _naive(G: nx.MultiDiGraph, scopes: frozenset[str], lexical: dict[str, float], k: int = 10) -> list[str]:
    """The baseline's filter and ranking: per candidate a fresh networkx traversal of its ancestors."""
    ok, trust = [], {}
    for c in lexical:
        members = nx.ancestors(G, c) | {c}
        if not G.nodes[c]["valid"] or any(G.nodes[a]["attributes"].get("revoked") for a in members):
            continue
        if any(not (G.nodes[a]["labels"] <= scopes) for a in members):
            continue
        sub = G.subgraph(members)
        best = {}
        for n in nx.topological_sort(sub):
            f = factor(Node(id=n, **G.nodes[n]))
            preds = list(sub.predecessors(n))
            best[n] = f * (max(best[p] for p in preds) if preds else 1.0)
        ok.append(c)
        trust[c] = best[c]
    top = max((lexical[c] for c in ok), default=0.0) or 1.0
    ranked = sorted(ok, key=lambda c: (-(lexical[c] / top) * trust[c], c))
    return ranked[:k]


def _spin(stop) -> None:  # a busy process: the load the latency is measured under
    while not stop.is_set():
        sum(range(10_000))


def _time_queries(retriever: Retriever, agent: str, queries: list[str], load: int, cold: bool = False) -> tuple[list[float], list[int], list[int]]:
    """Latency of each query (ms), with ``load`` busy processes running; ``cold``: a write to the store
    (untimed) before every query, so nothing read by an earlier query may be reused."""
    stop = mp.get_context("spawn").Event()
    procs = [mp.get_context("spawn").Process(target=_spin, args=(stop,), daemon=True) for _ in range(load)]
    for p in procs:
        p.start()
    try:
        if procs:
            time.sleep(1.0)  # let the load start
        lat, cands, excl = [], [], []
        for j, q in enumerate(queries):
            if cold:
                retriever.graph.update_node("agent:writer", reason="a write between queries", attributes={"tick": j})
            t1 = time.perf_counter()
            res = retriever.retrieve(agent, q, k=10)
            lat.append((time.perf_counter() - t1) * 1000)
            cands.append(res.candidates)
            excl.append(len(res.excluded))
    finally:
        stop.set()
        for p in procs:
            p.join(5)
    return lat, cands, excl


def retrieval_benchmark(n_records: int, n_queries: int, n_baseline: int, preselect: int, load: int, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    g, agent = build_retrieval_graph(n_records, seed)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = TextIndex(g)
    index_s = time.perf_counter() - t0
    rng = random.Random(seed + 1)
    queries = [f"topic{rng.randrange(_TOPICS)} w{rng.randrange(500)} w{rng.randrange(500)}" for _ in range(n_queries)]
    vrng = random.Random(seed + 2)  # validation queries: the pre-selection size is chosen on these, not the timed ones
    val_queries = [f"topic{vrng.randrange(_TOPICS)} w{vrng.randrange(500)} w{vrng.randrange(500)}" for _ in range(50)]
    exhaustive = Retriever(g, AccessPolicy(g), "index", index=index, preselect=len(index))

    def recall(size: int, qs: list[str]) -> float:
        r = Retriever(g, AccessPolicy(g), "index", index=index, preselect=size)
        return float(np.mean([len({h.id for h in r.retrieve(agent, q, k=10).hits} & {h.id for h in exhaustive.retrieve(agent, q, k=10).hits}) / 10 for q in qs]))

    sizes = [n for n in PRESELECT_SIZES if n <= preselect] or [preselect]
    val_recall = {n: recall(n, val_queries) for n in sizes}
    chosen = next((n for n in sizes if val_recall[n] >= PRESELECT_RECALL), sizes[-1])
    retriever = Retriever(g, AccessPolicy(g), "index", index=index, preselect=chosen)
    for q in queries[:5]:
        retriever.retrieve(agent, q, k=10)  # warm-up
    conditions = {"warm_idle": (0, False), "warm_loaded": (load, False), "cold_idle": (0, True), "cold_loaded": (load, True)}
    repeats: dict[str, list[list[float]]] = {name: [] for name in conditions}
    for _ in range(REPEATS):  # the conditions interleaved, so a burst of other work on the machine hits them alike
        for name, (n_load, is_cold) in conditions.items():
            lat, cands, excl = _time_queries(retriever, agent, queries, n_load, cold=is_cold)
            repeats[name].append(lat)
    timed_recall = recall(chosen, queries[:100])
    pre = []
    for q in queries:
        t1 = time.perf_counter()
        index.search(q, limit=chosen)
        pre.append((time.perf_counter() - t1) * 1000)
    G = g.to_networkx(lineage_only=True)
    scopes = AccessPolicy(g).scopes(agent)
    base, mlat, agree = [], [], 0
    for q in queries[:n_baseline]:  # the same queries, method and baseline back to back
        t1 = time.perf_counter()
        top = _naive(G, scopes, dict(index.search(q, limit=chosen)))
        base.append((time.perf_counter() - t1) * 1000)
        g.update_node("agent:writer", reason="a write between queries", attributes={"tick": -1 - len(base)})  # cold, as the baseline
        t1 = time.perf_counter()
        mine = [h.id for h in retriever.retrieve(agent, q, k=10).hits]
        mlat.append((time.perf_counter() - t1) * 1000)
        agree += top == mine
    # what keeping the indexes current costs a writer, and that the next query sees it
    add_ms = []
    leaf = [n for n in G.nodes if G.nodes[n]["type"] == NodeType.CLAIM][-20:]
    for j, parent in enumerate(leaf):
        t1 = time.perf_counter()
        with g.transaction():
            g.add_node(Node(id=f"new{j}", type=NodeType.MEMORY, text=f"freshtopic{j} brand new"))
            g.add_edge(Edge(src=f"new{j}", dst=parent, relation=Relation.DERIVED_FROM))
        add_ms.append((time.perf_counter() - t1) * 1000)
    seen = retriever.retrieve(agent, "freshtopic3 brand new", k=10)
    seen_new = "new3" in {h.id for h in seen.hits} | set(seen.excluded)
    src = max((n for n in G.nodes if G.nodes[n]["type"] == NodeType.SOURCE and not G.nodes[n]["attributes"].get("revoked")), key=lambda n: len(nx.descendants(G, n)))
    n_desc = len(nx.descendants(G, src))
    t1 = time.perf_counter()
    AccessPolicy(g).revoke_source(src, "benchmark")
    revoke_ms = (time.perf_counter() - t1) * 1000
    victim = sorted(nx.descendants(G, src))[0]
    res = retriever.retrieve(agent, g.node(victim).text, k=10)
    assert victim not in {h.id for h in res.hits}, victim
    g.close()
    latency = {
        name: {
            "p50": float(np.median([np.percentile(v, 50) for v in runs])),
            "p95": float(np.median([np.percentile(v, 95) for v in runs])),
            "p99": float(np.median([np.percentile(v, 99) for v in runs])),
            "p95_per_repeat": [float(np.percentile(v, 95)) for v in runs],
        }
        for name, runs in repeats.items()
    }
    worst = max(latency, key=lambda n: latency[n]["p95"])
    p95, b95 = latency[worst]["p95"], float(np.percentile(base, 95))
    return {
        "records": n_records,
        "graph_build_s": build_s,
        "text_index_build_s": index_s,
        "queries": n_queries,
        "candidate_selection": f"TextIndex BM25 top {chosen}, timed inside each query (Retriever(index=...))",
        "preselect": chosen,
        "preselect_chosen_on": f"50 validation queries: the smallest of {sizes} with recall@10 >= {PRESELECT_RECALL} against pre-selecting every record",
        "preselect_validation_recall_at_10": {str(n): v for n, v in val_recall.items()},
        "recall_at_10_on_timed_queries": timed_recall,
        "scorer": "index (the pre-selection's BM25, normalized by the best candidate)",
        "candidates_per_query": float(np.mean(cands)),
        "excluded_per_query": float(np.mean(excl)),
        "load_processes": load,
        "p50_ms": latency[worst]["p50"],
        "p95_ms": p95,
        "p95_is": f"the worst of the four conditions ({worst}), each the median over {REPEATS} runs of every query; loaded = {load} extra "
        f"busy processes on {os.cpu_count()} cores (besides whatever else runs: load_average_1min_at_end), "
        "cold = a write to the store before every query (no row reuse)",
        "latency_ms": latency,
        "preselect_p50_ms": float(np.percentile(pre, 50)),
        "preselect_p95_ms": float(np.percentile(pre, 95)),
        "load_average_1min_at_end": os.getloadavg()[0],
        "baseline_queries": n_baseline,
        "baseline_p50_ms": float(np.percentile(base, 50)),
        "baseline_p95_ms": b95,
        "baseline_same_queries_method_p95_ms": float(np.percentile(mlat, 95)),
        "baseline_over_mapgraph_p95": b95 / float(np.percentile(mlat, 95)),
        "baseline_same_top10": f"{agree}/{n_baseline}",
        "index_add_derived_memory_p50_ms": float(np.percentile(add_ms, 50)),
        "new_record_seen_by_next_query": seen_new,
        "index_revoke_source_ms": revoke_ms,
        "index_revoked_source_descendants": n_desc,
        "index_revocation_seen_by_next_retrieval": True,
        "goal_p95_ms": GOALS["retrieval_p95_ms"],
        "goal_p95_met": p95 <= GOALS["retrieval_p95_ms"],
        "aim_p95_ms": GOALS["retrieval_p95_ms_aim"],
        "aim_p95_met": p95 <= GOALS["retrieval_p95_ms_aim"],
    }


# ----------------------------------------------------------------------------- driver


def _goal(value, target, op) -> dict:
    met = None if value is None else (value >= target if op == ">=" else value <= target)
    return {"value": value, "target": f"{op} {target}", "met": met}


def run(seeds: list[int], val_per_domain: int, test_per_domain: int, scorer: str, records: int, queries: int, baseline_queries: int, preselect: int, load: int) -> dict:
    dec = decisions_benchmark(seeds, val_per_domain, test_per_domain, scorer)
    m = dec["methods"]["mapgraph"]
    goals = {
        "task_success>=0.95": {**_goal(m["task_success"]["value"], GOALS["task_success"], ">="), "ci95": m["task_success"]["ci95"]},
        "exact_decision>=0.73": {**_goal(m["exact_decision"]["value"], GOALS["exact_decision"], ">="), "ci95": m["exact_decision"]["ci95"]},
        "legit_allow_rate>=0.90": {**_goal(m["legit_allow_rate"]["value"], GOALS["legit_allow_rate"], ">="), "ci95": m["legit_allow_rate"]["ci95"]},
        "unauthorized_reads==0": _goal(m["unauthorized_reads"]["value"], 0, "<="),
        "impermissible_allows==0": _goal(m["impermissible_allows"]["value"], 0, "<="),
    }
    retrieval = retrieval_benchmark(records, queries, baseline_queries, preselect, load)
    goals["retrieval_p95<=20ms"] = _goal(retrieval["p95_ms"], GOALS["retrieval_p95_ms"], "<=")
    goals["retrieval_p95<=10ms_aim"] = _goal(retrieval["p95_ms"], GOALS["retrieval_p95_ms_aim"], "<=")
    per_val, per_test = 3 * val_per_domain, 3 * test_per_domain
    return {
        "benchmark": "mapgraph",
        "config": {
            "seeds": seeds, "val_per_domain": val_per_domain, "test_per_domain": test_per_domain, "scorer": scorer,
            "settings": list(T.SETTINGS), "k": E.K, "tasks_wall_s": dec["wall_s"],
        },
        "seeds": seeds,
        "inputs": {
            "shifted_split": True,
            "validation": {**T.VALIDATION.model_dump(), "tasks_per_seed": per_val},
            "test": {**T.TEST.model_dump(), "tasks_per_seed": per_test},
            "truth": {**T.TRUTH.model_dump(), "tolerance_days": T.TOLERANCE_DAYS, "required_independent": T.REQUIRED_INDEPENDENT},
            "thresholds_chosen_on": "validation",
            "test_reported": "once per method, with the validation-chosen configuration (uncached)",
            "tuning_budget_per_risk_class": E.BUDGET,
            "reader": {"kind": "regex (negation cues), not the MiniLM scorer", "negation_cues": list(E.NEGATION_CUES), "cues_written_from": "template set A (validation) and common English negations"},
            "success_rule": "exact decision; or on a task expecting non-allow, a non-allow decision whose reasons name the task's hazard",
            "impermissible_allow": "an allow on a task with a hard hazard (unreadable, revoked or injected evidence)",
            "ci95": "Student-t over the per-seed values",
        },
        "methods": dec["methods"],
        "per_setting": dec["per_setting"],
        "operating_curve": dec["operating_curve"],
        "retrieval": retrieval,
        "goals": goals,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--val-per-domain", type=int, default=300)
    ap.add_argument("--test-per-domain", type=int, default=600)
    ap.add_argument("--scorer", choices=("bm25", "minilm"), default="bm25")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--baseline-queries", type=int, default=20)
    ap.add_argument("--preselect", type=int, default=1000, help="largest pre-selection size tried")
    ap.add_argument("--load", type=int, default=2, help="extra busy processes while latency is measured")
    ap.add_argument("--quick", action="store_true", help="CI size: 2 seeds, 24 tasks per domain and split, 3,000 records")
    a = ap.parse_args(argv)
    if a.quick:
        a.seeds, a.val_per_domain, a.test_per_domain, a.records, a.queries, a.baseline_queries, a.load = a.seeds[:2], 24, 24, 3000, 20, 3, 1
    write(a.out, run(a.seeds, a.val_per_domain, a.test_per_domain, a.scorer, a.records, a.queries, a.baseline_queries, a.preselect, a.load))


if __name__ == "__main__":
    main()
