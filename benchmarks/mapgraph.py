"""MAP-Graph benchmark: seven methods on synthetic templated tasks, and retrieval latency at scale.

``python -m benchmarks.mapgraph --out FILE.json [--per-domain 900] [--scorer bm25|minilm]``

Part 1 (decisions): :func:`lab.provenance.tasks.generate` makes ``3 x per_domain`` tasks
(airline from the real tau-bench databases, banking and workspace synthetic), balanced over six
settings; :func:`lab.provenance.tasks.evaluate` runs every method on every task.
The default scorer is BM25: MiniLM is available (``--scorer minilm``) but embedding every task's
records on CPU makes the full run several times slower.

Part 2 (retrieval): one :class:`ProvenanceGraph` with ``--records`` records (default 100,000): 10%
sources (labels from 20 scopes or public, trust in [0.3, 1], 1% revoked) and derived memories
and claims in three layers, each derived from 1-2 records of the layers below (a random DAG of
depth <= 3). Each record's text carries one of 100 topic words. A query names a topic; a cheap
inverted index (topic -> record ids, built once, untimed) pre-selects the ~1,000 records with that
topic as candidates. Timed per query: :meth:`Retriever.retrieve` as implemented (one read of
the graph's inherited index for the candidates, which every write keeps current; hard filter,
BM25 over the eligible candidates, x path trust, top 10). Also timed: what the index costs
writers (adding one derived memory; revoking a source with many descendants, then the next
retrieval, which must already exclude them). Reference, timed per query: the same filter and
ranking over Python dicts precomputed once (a lower bound that goes stale on any write).
Baseline, timed per query: a naive networkx traversal over
``graph.to_networkx(lineage_only=True)`` (built once): for each candidate ``nx.ancestors``, its
labels and revocation from node attributes, its path trust by a max-product pass over the
ancestor subgraph, then the same BM25 and ranking.
"""

from __future__ import annotations

import argparse
import random
import time

import networkx as nx
import numpy as np

from benchmarks._common import write
from lab.provenance.access import AccessPolicy
from lab.provenance.embed import make_scorer
from lab.provenance.graph import Edge, Node, NodeType, ProvenanceGraph, Relation
from lab.provenance.retrieve import Retriever
from lab.provenance.tasks import SETTINGS, evaluate, generate
from lab.provenance.trust import factor

GOALS = {"task_success": 0.95, "exact_decision": 0.73, "unauthorized_reads": 0, "high_risk_impermissible_allow": 0, "retrieval_p95_ms": 20.0}
_TOPICS = 100


def build_retrieval_graph(n_records: int, seed: int = 0) -> tuple[ProvenanceGraph, str, dict[int, list[str]]]:
    """The large random graph, the reading agent, and the topic -> record ids index."""
    rng = random.Random(seed)
    g = ProvenanceGraph(":memory:")
    scopes = [f"scope{i}" for i in range(20)]
    agent = "agent:reader"
    g.add_node(Node(id=agent, type=NodeType.AGENT, attributes={"scopes": sorted(rng.sample(scopes, 12))}))
    n_src = max(1, n_records // 10)
    layers: list[list[str]] = [[], [], [], []]
    index: dict[int, list[str]] = {t: [] for t in range(_TOPICS)}
    nodes, edges = [], []
    words = [f"w{i}" for i in range(500)]
    for i in range(n_records):
        topic = rng.randrange(_TOPICS)
        text = f"topic{topic} " + " ".join(rng.sample(words, 6))
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
        index[topic].append(nid)
    g.add_nodes(nodes)
    g.add_edges(edges)
    return g, agent, index


def _naive(G: nx.MultiDiGraph, scopes: frozenset[str], scorer, query: str, cands: list[str], k: int = 10) -> list[str]:
    ok, trust = [], {}
    for c in cands:
        anc = nx.ancestors(G, c)
        members = anc | {c}
        if any(G.nodes[a]["attributes"].get("revoked") for a in members):
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
    sims = scorer.scores(query, [G.nodes[c]["text"] for c in ok])
    ranked = sorted(zip(ok, sims), key=lambda x: (-x[1] * trust[x[0]], x[0]))
    return [c for c, _ in ranked[:k]]


def retrieval_benchmark(n_records: int, n_queries: int, n_baseline: int, scorer_name: str, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    g, agent, index = build_retrieval_graph(n_records, seed)
    build_s = time.perf_counter() - t0
    scorer = make_scorer(scorer_name)
    retriever = Retriever(g, AccessPolicy(g), scorer)
    rng = random.Random(seed + 1)
    queries = []
    for _ in range(n_queries):
        t = rng.randrange(_TOPICS)
        queries.append((f"topic{t} w{rng.randrange(500)} w{rng.randrange(500)}", index[t][:1000]))
    retriever.retrieve(agent, queries[0][0], k=10, candidates=queries[0][1])  # warm-up
    lat, excluded, eligible = [], [], []
    for q, cands in queries:
        t1 = time.perf_counter()
        res = retriever.retrieve(agent, q, k=10, candidates=cands)
        lat.append((time.perf_counter() - t1) * 1000)
        excluded.append(len(res.excluded))
        eligible.append(len(cands) - len(res.excluded))
    G = g.to_networkx(lineage_only=True)
    scopes = AccessPolicy(g).scopes(agent)
    # reference: effective labels, revocation and path trust precomputed into dicts for every record
    # in one topological pass (untimed; goes stale on any write)
    eff, trust = {}, {}
    for n in nx.topological_sort(G):
        attrs = G.nodes[n]
        if attrs["type"] == NodeType.AGENT:
            continue
        preds = list(G.predecessors(n))
        labels = set(attrs["labels"])
        revoked = bool(attrs["attributes"].get("revoked"))
        for p in preds:
            labels |= eff[p][0]
            revoked = revoked or eff[p][1]
        eff[n] = (frozenset(labels), revoked)
        f = factor(Node(id=n, **attrs))
        trust[n] = f * (max(trust[p] for p in preds) if preds else 1.0)
    ilat = []
    for q, cands in queries:
        t1 = time.perf_counter()
        ok = [c for c in cands if not eff[c][1] and eff[c][0] <= scopes and G.nodes[c]["valid"]]
        sims = scorer.scores(q, [G.nodes[c]["text"] for c in ok])
        sorted(zip(ok, sims), key=lambda x: (-x[1] * trust[x[0]], x[0]))[:10]
        ilat.append((time.perf_counter() - t1) * 1000)
    base, agree = [], 0
    for q, cands in queries[:n_baseline]:
        t1 = time.perf_counter()
        top = _naive(G, scopes, scorer, q, cands)
        base.append((time.perf_counter() - t1) * 1000)
        agree += top == [h.id for h in retriever.retrieve(agent, q, k=10, candidates=cands).hits]
    # what keeping the index current costs a writer
    add_ms = []
    for j in range(20):
        parent = index[j][-1]  # a deep record: its whole ancestry is recomputed for the new one
        t1 = time.perf_counter()
        with g.transaction():
            g.add_node(Node(id=f"new{j}", type=NodeType.MEMORY, text=f"topic{j} fresh"))
            g.add_edge(Edge(src=f"new{j}", dst=parent, relation=Relation.DERIVED_FROM))
        add_ms.append((time.perf_counter() - t1) * 1000)
    src = max((n for n in G.nodes if G.nodes[n]["type"] == NodeType.SOURCE and not G.nodes[n]["attributes"].get("revoked")), key=lambda n: len(nx.descendants(G, n)))
    n_desc = len(nx.descendants(G, src))
    t1 = time.perf_counter()
    AccessPolicy(g).revoke_source(src, "benchmark")
    revoke_ms = (time.perf_counter() - t1) * 1000
    victim = sorted(nx.descendants(G, src))[0]
    res = retriever.retrieve(agent, queries[0][0], k=10, candidates=[victim, *queries[0][1]])
    assert res.excluded[victim].startswith("revoked"), res.excluded.get(victim)
    p95, b95 = float(np.percentile(lat, 95)), float(np.percentile(base, 95))
    g.close()
    return {
        "records": n_records,
        "graph_build_s": build_s,
        "queries": n_queries,
        "candidates_per_query": float(np.mean([len(c) for _, c in queries])),
        "eligible_per_query": float(np.mean(eligible)),
        "excluded_per_query": float(np.mean(excluded)),
        "candidate_selection": "inverted topic index (untimed), ~1,000 candidates per query; Retriever as implemented, k=10",
        "scorer": scorer_name,
        "p50_ms": float(np.percentile(lat, 50)),
        "p95_ms": p95,
        "baseline_queries": n_baseline,
        "baseline_p50_ms": float(np.percentile(base, 50)),
        "baseline_p95_ms": b95,
        "baseline_over_mapgraph_p95": b95 / p95,
        "baseline_same_top10": f"{agree}/{n_baseline}",
        "precomputed_dict_p50_ms": float(np.percentile(ilat, 50)),
        "precomputed_dict_p95_ms": float(np.percentile(ilat, 95)),
        "precomputed_dict_note": "labels/revocation/path trust in Python dicts computed once (a lower bound; stale after any write)",
        "index_add_derived_memory_p50_ms": float(np.percentile(add_ms, 50)),
        "index_revoke_source_ms": revoke_ms,
        "index_revoked_source_descendants": n_desc,
        "index_revocation_seen_by_next_retrieval": True,
        "goal_p95_ms": GOALS["retrieval_p95_ms"],
        "goal_p95_met": p95 <= GOALS["retrieval_p95_ms"],
    }


def run(per_domain: int = 900, scorer: str = "bm25", records: int = 100_000, queries: int = 200, baseline_queries: int = 20, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    tasks = generate(per_domain, seed)
    res = evaluate(tasks, make_scorer(scorer))
    tasks_s = time.perf_counter() - t0
    m = res["methods"]["mapgraph"]
    goals = {
        "task_success>=0.95": {"value": m["task_success"], "met": m["task_success"] >= GOALS["task_success"]},
        "exact_decision>=0.73": {"value": m["exact_decision"], "met": m["exact_decision"] >= GOALS["exact_decision"]},
        "unauthorized_reads==0": {"value": m["unauthorized_reads"], "met": m["unauthorized_reads"] == 0},
        "no_high_risk_impermissible_allow": {"value": m["unsafe_actions"]["high_risk_impermissible_allow"], "met": m["unsafe_actions"]["high_risk_impermissible_allow"] == 0},
    }
    retrieval = retrieval_benchmark(records, queries, baseline_queries, scorer, seed)
    goals["retrieval_p95<=20ms"] = {"value": retrieval["p95_ms"], "met": retrieval["goal_p95_met"]}
    return {
        "benchmark": "mapgraph",
        "config": {"per_domain": per_domain, "tasks": len(tasks), "scorer": scorer, "seed": seed, "settings": list(SETTINGS), "tasks_wall_s": tasks_s},
        "methods": res["methods"],
        "per_setting": res["per_setting"],
        "retrieval": retrieval,
        "goals": goals,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-domain", type=int, default=900)
    ap.add_argument("--scorer", choices=("bm25", "minilm"), default="bm25")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--baseline-queries", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    write(a.out, run(a.per_domain, a.scorer, a.records, a.queries, a.baseline_queries, a.seed))


if __name__ == "__main__":
    main()
