"""Dependency-guided rollback repair benchmark (issue #20; arXiv 2608.10502).

``python -m benchmarks.rollback --out FILE.json [--n 150] [--stress 50] [--seeds 0 2 3] [--val-n 48] [--val-stress 24] [--stage all|validate|test] [--quick]``

Every memory store is MemTX's (:class:`lab.provenance.repair.store.MemTXMemory` on SQLite in memory).

1. **Validation** (never used for the test numbers): generator seed 1 (``--val-n`` controlled cases) and
   ``--val-stress`` stress cases of seed 1 on tau-bench runs the test stress set does not use. The planner's
   rules (:class:`lab.provenance.repair.planner.PlannerRules`: support check, replay scope, ``expand``,
   ``confirm``, ``rebuild``) are chosen over a grid on the pooled validation cases by recovery, then
   claim-invalidation F1, then benign kept, then the lower replay fraction; ties are broken in grid order
   (typed support first). The paper-faithful planner (``PAPER``) is fixed, not tuned. The case generator's
   knobs are fixed (``GeneratorKnobs()``). ``--stage validate`` runs only this and writes ``chosen_rules``
   to ``--out``; ``--stage test`` then reads them from there (the two halves fit the machine's time slots).
2. **Controlled test**: 150 cases (3 domains x 4 failure types) of generator seed 0 (``methods``), repeated
   for every ``--seeds`` seed (``seeds``: per-seed values, mean and Student-t 95% interval over seeds).
3. **Stress test**: 50 cases from the real tau-bench airline trajectories with injected faults (``stress``).

Methods: ``ours`` (the chosen rules), ``paper`` (support ``any``, selective replay), the ablations
``ours_no_support``, ``ours_no_selective`` (replay every step from the first tainted one), ``paper_no_support``,
``paper_no_selective``, and the baselines ``delete_source``, ``full_reset``, ``full_replay``, ``answer_only``.
Per method (:func:`lab.provenance.repair.evaluate.summarise`): ``recovery``, ``recurrence``, ``faulty_removed``,
``benign_kept``, ``claim_precision``/``claim_recall``/``claim_f1``, ``replay_fraction`` (step executions over
full replay's), with 95% intervals (Wilson; case bootstrap for F1 and replay), and ``by_failure`` recovery.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time

from tqdm import tqdm

from benchmarks._common import write
from lab.provenance.repair.cases import GeneratorKnobs, generate_cases
from lab.provenance.repair.evaluate import method_fn, run_failed, run_oracle, score_case, summarise
from lab.provenance.repair.planner import PAPER, PlannerRules
from lab.provenance.repair.taubench import stress_cases

GRID = [
    PlannerRules(support=s, replay=r, expand=e, confirm=c, rebuild=b)
    for s, r, e, c, b in itertools.product(["typed", "field", "any", "none"], ["selective", "selective+memory", "suffix"], [True, False], [True, False], [True, False])
]


def _score(cases, fn, desc=None):
    rows = []
    for c in tqdm(cases, desc=desc, leave=False, disable=desc is None):
        rows.append(score_case(c, fn, c._failed, c._oracle))
    return rows


def _prepare(cases):
    for c in cases:
        c._failed, c._oracle = run_failed(c), run_oracle(c)
    return cases


def choose_rules(cases) -> tuple[PlannerRules, list[dict]]:
    """The grid's best rules on ``cases`` (module docstring) and every candidate's validation scores."""
    table = []
    for i, rules in enumerate(tqdm(GRID, desc="validation grid")):
        rows = _score(cases, method_fn("", rules))
        s = summarise(rows, boot=50)
        stress = [r for r in rows if r.case.startswith("tau-")]
        table.append({"rules": rules.model_dump(), "recovery": s["recovery"], "claim_f1": s["claim_f1"], "benign_kept": s["benign_kept"], "replay_fraction": s["replay_fraction"], "recurrence": s["recurrence"],
                      "stress_recovery": round(sum(r.recovered for r in stress) / max(1, len(stress)), 4), "stress_replay_fraction": round(sum(r.replay_steps for r in stress) / max(1, sum(r.steps for r in stress)), 4), "_i": i})
    best = max(table, key=lambda r: (r["recovery"], r["claim_f1"], r["benign_kept"], -r["replay_fraction"], -r["_i"]))
    for r in table:
        r.pop("_i")
    return PlannerRules(**best["rules"]), table


def methods(ours: PlannerRules) -> dict:
    return {
        "ours": method_fn("", ours),
        "ours_no_rebuild": method_fn("", ours.model_copy(update={"rebuild": False})),
        "ours_selective_only": method_fn("", ours.model_copy(update={"replay": "selective"})),
        "paper": method_fn("", PAPER),
        "ours_no_support": method_fn("", ours.model_copy(update={"support": "none"})),
        "ours_no_selective": method_fn("", ours.model_copy(update={"replay": "suffix"})),
        "paper_no_support": method_fn("", PAPER.model_copy(update={"support": "none"})),
        "paper_no_selective": method_fn("", PAPER.model_copy(update={"replay": "suffix"})),
        **{b: method_fn(b) for b in ("delete_source", "full_reset", "full_replay", "answer_only")},
    }


def _table(cases, ms, label, keep=None):
    out = {}
    for name, fn in ms.items():
        rows = _score(cases, fn, f"{label}: {name}")
        if keep is not None:
            keep[name] = rows
        s = summarise(rows)
        s["by_failure"] = {f: round(sum(r.recovered for r in rows if r.failure == f) / max(1, sum(r.failure == f for r in rows)), 4) for f in sorted({r.failure for r in rows})}
        s["by_domain"] = {d: round(sum(r.recovered for r in rows if r.domain == d) / max(1, sum(r.domain == d for r in rows)), 4) for d in sorted({r.domain for r in rows})}
        s["failed_cases"] = [r.case for r in rows if not r.recovered][:30]
        out[name] = s
    return out


def _t95(values):
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return m, [m, m]
    from scipy import stats

    h = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return m, [round(m - h, 4), round(m + h, 4)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--stress", type=int, default=50)
    ap.add_argument("--val-n", type=int, default=48)
    ap.add_argument("--val-stress", type=int, default=24)
    ap.add_argument("--stage", choices=["all", "validate", "test"], default="all")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 2, 3])
    ap.add_argument("--quick", action="store_true", help="12 controlled, 8 stress, 12 validation cases, one seed")
    a = ap.parse_args(argv)
    if a.quick:
        a.n, a.stress, a.val_n, a.val_stress, a.seeds = 12, 8, 12, 8, [0]
    t0 = time.time()
    knobs = GeneratorKnobs()
    from lab.provenance.repair.taubench import load_trajectories

    trajs = load_trajectories()
    stress_test = stress_cases(a.stress, seed=0, trajectories=trajs)
    config = {"n": a.n, "stress": a.stress, "val_n": a.val_n, "val_stress": a.val_stress, "seeds": a.seeds, "knobs": knobs.model_dump(), "validation_seed": 1, "test_seed": 0,
              "store": "MemTX (lab.provenance.txn.MemTXStore) on SQLite in memory, features AGENT_MEMORY"}
    if a.stage == "test":
        import json
        from pathlib import Path

        prev = json.loads(Path(a.out).read_text())
        ours, grid, val_seconds = PlannerRules(**prev["chosen_rules"]), prev["validation"], prev.get("seconds_validation", 0)
    else:
        val = _prepare(generate_cases(a.val_n, seed=1, knobs=knobs))
        val += _prepare(stress_cases(a.val_stress, seed=1, trajectories=trajs, exclude={c.meta["trajectory"] for c in stress_test}))
        ours, grid = choose_rules(val)
        grid = sorted(grid, key=lambda r: (-r["recovery"], -r["claim_f1"], -r["benign_kept"], r["replay_fraction"]))[:16]
        val_seconds = round(time.time() - t0, 1)
        if a.stage == "validate":
            write(a.out, {"benchmark": "rollback", "config": config, "chosen_rules": ours.model_dump(), "validation": grid, "seconds_validation": val_seconds})
            return
    ms = methods(ours)
    test = _prepare(generate_cases(a.n, seed=0, knobs=knobs))
    result = {"benchmark": "rollback", "config": config}
    result["chosen_rules"] = ours.model_dump()
    result["paper_rules"] = PAPER.model_dump()
    rows0: dict = {}
    result["methods"] = _table(test, ms, "controlled", rows0)
    seeds = {}
    for seed in a.seeds:
        cases = test if seed == 0 else _prepare(generate_cases(a.n, seed=seed, knobs=knobs))
        seeds[seed] = {name: summarise(rows0[name] if seed == 0 else _score(cases, fn, f"seed {seed}: {name}"), boot=200) for name, fn in ms.items()}
    result["seeds"] = {}
    for name in ms:
        entry = {}
        for metric in ("recovery", "recurrence", "faulty_removed", "benign_kept", "claim_f1", "replay_fraction"):
            vals = [seeds[s][name][metric] for s in a.seeds]
            mean, ci = _t95(vals)
            entry[metric] = {"per_seed": vals, "mean": round(mean, 4), "ci95": ci}
        result["seeds"][name] = entry
    stress = _prepare(stress_test)
    result["stress"] = _table(stress, ms, "stress")
    result["stress_cases"] = [{"case": c.id, "trajectory": c.meta["trajectory"], "key": c.meta["key"], "clean": c.meta["value"], "injected": c.meta["wrong"]} for c in stress]
    result["validation"] = grid
    result["seconds_validation"] = val_seconds
    result["seconds"] = round(time.time() - t0, 1) + (val_seconds if a.stage == "test" else 0)
    write(a.out, result)


if __name__ == "__main__":
    main()
