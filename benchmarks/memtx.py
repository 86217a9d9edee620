"""MemTX benchmark (issue #19): the exhaustive model check, the corruption suites over every method, the
model-vs-store replay, and commit throughput on SQLite and PostgreSQL.

``python -m benchmarks.memtx --out benchmarks/results/memtx.json`` runs every part; ``--part`` runs one
(``enumeration``, ``suites``, ``replay``, ``throughput``) and merges it into an existing ``--out`` file, so a
long run can be split. No language model runs: the agents are scripted policies acting on whatever their
memory reads return (:mod:`lab.provenance.txn.suite`).

JSON keys: ``enumeration`` (``states``, ``transitions``, ``violations``, ``seconds``, ``states_per_s``,
``cumulative_states`` and ``cumulative_seconds`` per depth: the scaling with the bound; ``broken_variants``),
``methods`` (per method: ``task_success``, ``harm``, ``allow_rate_controls``, ``abort_recall``,
``rollback_recall``, ``permission_enforcement``, ``verifier_calls_per_case``, per suite, with 95% bootstrap CIs
and ``harm_by_family``), ``ablation_guards``, ``replay``, ``commits_per_s`` (``sqlite`` / ``postgresql`` ->
writers -> commits per second).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks._common import write
from lab.provenance.txn import MemTXStore
from lab.provenance.txn.model import enumerate_states, replay, traces
from lab.provenance.txn.suite import FAMILIES, GUARDS, METHODS, hardened_suite, load_entities, main_suite, run_case

SEEDS = [0, 1, 2, 3, 4]


def _ci(values: list[float], rng: np.random.Generator, n_boot: int = 2000) -> list[float]:
    if not values:
        return [float("nan"), float("nan")]
    v = np.asarray(values, dtype=float)
    boots = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
    return [round(float(np.quantile(boots, 0.025)), 4), round(float(np.quantile(boots, 0.975)), 4)]


def _metric(values, rng):
    return {"mean": round(float(np.mean(values)), 4) if values else None, "ci95": _ci(values, rng), "n": len(values)}


def part_suites(progress: bool = True) -> dict:
    rng = np.random.default_rng(19)
    cases = {}
    for seed in SEEDS:
        ents = load_entities(random.Random(seed), 60)
        cases.setdefault("main", []).extend(main_suite(ents, seed))
        cases.setdefault("hardened", []).extend(hardened_suite(ents, seed))
    out: dict = {}
    t0 = time.perf_counter()
    for name, features in tqdm(list(METHODS.items()), desc="methods", disable=not progress):
        per = {}
        for suite, cs in cases.items():
            rs = [run_case(c, features) for c in cs]
            traps = [r for r in rs if r.trap]
            ctrls = [r for r in rs if not r.trap]
            rep = [r.repaired for r in traps if r.repaired]
            per[suite] = {
                "task_success": _metric([r.success for r in rs], rng),
                "harm": _metric([r.harm for r in traps], rng),
                "allow_rate_controls": _metric([bool(r.allowed) for r in ctrls], rng),
                "abort_recall": _metric([r.aborted for r in traps if r.aborted is not None], rng),
                "rollback_recall": {"mean": round(sum(a for a, _ in rep) / max(1, sum(b for _, b in rep)), 4), "n_targets": sum(b for _, b in rep)},
                "permission_enforcement": _metric([r.enforced for r in traps if r.enforced is not None], rng),
                "verifier_calls_per_case": round(float(np.mean([r.verifier_calls for r in rs])), 3),
                "harm_by_family": {f: round(float(np.mean([r.harm for r in traps if f in r.families])), 4) for f in FAMILIES},
                "cases": len(rs),
            }
        m = per["main"]
        out[name] = {"task_success": m["task_success"]["mean"], "harm": m["harm"]["mean"], "allow_rate_controls": m["allow_rate_controls"]["mean"],
                     "abort_recall": m["abort_recall"]["mean"], "rollback_recall": m["rollback_recall"]["mean"],
                     "permission_enforcement": m["permission_enforcement"]["mean"], "hardened_task_success": per["hardened"]["task_success"]["mean"],
                     "hardened_harm": per["hardened"]["harm"]["mean"], "suites": per}
    guards = {f: {"family": fam, "harm_on_family": out[f"memtx-no-{f}"]["suites"]["main"]["harm_by_family"][fam],
                  "memtx_harm_on_family": out["memtx"]["suites"]["main"]["harm_by_family"][fam]} for f, fam in GUARDS.items()}
    return {"methods": out, "ablation_guards": guards, "suite_seconds": round(time.perf_counter() - t0, 1),
            "suite_setup": {"seeds": SEEDS, "main_cases_per_seed": 90, "hardened_cases_per_seed": 56,
                            "agents": "scripted policies acting on whatever their memory reads return; no language model",
                            "thresholds": "the paper's (evidence: confidence >= 0.6 unless authority >= 0.9); nothing tuned, so no validation split is used"}}


def part_enumeration(depth: int, progress: bool = True) -> dict:
    import resource

    load0 = os.getloadavg()[0]
    r = enumerate_states(4, 3, depth, progress=progress)
    d = r.as_dict()
    d["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
    d["load_average_1min"] = {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2), "cores": os.cpu_count()}
    broken = {}
    for v in ("gate_off", "cascade_skips_summaries"):
        b = enumerate_states(4, 3, 6, variant=v, keep_traces=True, stop_at_first=True)
        broken[v] = {"violations_found": b.violations, "first": b.as_dict()["examples"][:1], "bound": "4 records, 3 transactions, depth 6"}
    d["broken_variants"] = broken
    return {"enumeration": d}


def part_replay(n_sqlite: int, n_pg: int) -> dict:
    from lab.provenance.txn.pgserver import LocalPostgres

    out = {}
    trs = traces(n_sqlite, depth=14, seed=19)
    t0 = time.perf_counter()
    bad = sum(bool(replay(t, lambda: MemTXStore(":memory:"))) for t in tqdm(trs, desc="replay sqlite", mininterval=2))
    out["sqlite"] = {"traces": len(trs), "steps": sum(map(len, trs)), "mismatching_traces": bad, "seconds": round(time.perf_counter() - t0, 1)}
    with LocalPostgres() as pg:
        trs = traces(n_pg, depth=14, seed=20)
        t0 = time.perf_counter()
        bad = 0
        for i, t in enumerate(tqdm(trs, desc="replay postgresql", mininterval=2)):
            dsn = pg.fresh_database(f"replay{i}")
            bad += bool(replay(t, lambda: MemTXStore(dsn)))
        out["postgresql"] = {"traces": len(trs), "steps": sum(map(len, trs)), "mismatching_traces": bad, "seconds": round(time.perf_counter() - t0, 1)}
    return {"replay": out}


def _writer(where: str, k: int, seconds: float, start, q) -> None:
    s = MemTXStore(where)
    start.wait()
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        tx = s.begin(f"w{k}")
        tx.stage(dict(id=f"w{k}-{n}", type="belief", entity=f"w{k}-e{n % 50}", attribute="v", value=n,
                      evidence=dict(source="bench", authority=0.8, confidence=0.9), permission=dict(owner=f"w{k}", scope="shared")))
        tx.commit()
        n += 1
    s.close()
    q.put(n)


def part_throughput(seconds: float, writers=(1, 2, 4, 8)) -> dict:
    from lab.provenance.txn.pgserver import LocalPostgres

    ctx = mp.get_context("fork")
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp, LocalPostgres() as pg:
        for backend in ("sqlite", "postgresql"):
            out[backend] = {}
            for w in writers:
                where = str(Path(tmp) / f"tp{w}.db") if backend == "sqlite" else pg.fresh_database(f"tp{w}")
                MemTXStore(where).close()
                start, q = ctx.Event(), ctx.Queue()
                ps = [ctx.Process(target=_writer, args=(where, k, seconds, start, q)) for k in range(w)]
                for p in ps:
                    p.start()
                time.sleep(0.5)
                start.set()
                total = sum(q.get(timeout=seconds + 120) for _ in ps)
                for p in ps:
                    p.join()
                out[backend][str(w)] = round(total / seconds, 1)
                print(f"{backend} writers={w}: {out[backend][str(w)]} commits/s", flush=True)
    return {"commits_per_s": out, "throughput_setup": {"seconds_per_point": seconds, "cores": os.cpu_count(),
                                                        "commit": "begin + stage one belief + commit (full pipeline), one process per writer"}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", choices=["all", "enumeration", "suites", "replay", "throughput"], default="all")
    ap.add_argument("--depth", type=int, default=9, help="enumeration depth (4 records, 3 transactions)")
    ap.add_argument("--replay-sqlite", type=int, default=3000)
    ap.add_argument("--replay-pg", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=4.0, help="throughput: seconds per point")
    args = ap.parse_args(argv)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() and args.part != "all" else {}
    parts = ["enumeration", "suites", "replay", "throughput"] if args.part == "all" else [args.part]
    for p in parts:
        t0 = time.perf_counter()
        if p == "enumeration":
            result.update(part_enumeration(args.depth))
        elif p == "suites":
            result.update(part_suites())
        elif p == "replay":
            result.update(part_replay(args.replay_sqlite, args.replay_pg))
        else:
            result.update(part_throughput(args.seconds))
        result.setdefault("part_seconds", {})[p] = round(time.perf_counter() - t0, 1)
        result.pop("machine", None)
        result.pop("when", None)
        result["benchmark"] = "memtx"
        write(out, result)
        print(f"{p}: done in {result['part_seconds'][p]} s -> {out}", flush=True)


if __name__ == "__main__":
    main()
