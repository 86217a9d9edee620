"""Dependency-guided rollback repair benchmark (issue #20; arXiv 2608.10502).

``python -m benchmarks.rollback --out FILE.json [--n 150] [--stress 50] [--seeds 0 2 3] [--val-n 60] [--quick] [--posthoc]``

1. **Validation** (generator seed 1, ``--val-n`` cases, never used for the test numbers): the planner's
   rules (:class:`lab.provenance.repair.planner.PlannerRules`: support check, replay scope, ``expand``,
   ``confirm``) are chosen over a grid by recovery, then claim-invalidation F1, then benign kept, then the
   lower replay fraction; ties are broken in grid order (typed support first). The paper-faithful planner
   (``PAPER``) is fixed, not tuned. The case generator's knobs are fixed (``GeneratorKnobs()``).
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
    PlannerRules(support=s, replay=r, expand=e, confirm=c)
    for s, r, e, c in itertools.product(["typed", "field", "any", "none"], ["selective", "selective+memory", "suffix"], [True, False], [True, False])
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
        s = summarise(_score(cases, method_fn("", rules)), boot=50)
        table.append({"rules": rules.model_dump(), "recovery": s["recovery"], "claim_f1": s["claim_f1"], "benign_kept": s["benign_kept"], "replay_fraction": s["replay_fraction"], "recurrence": s["recurrence"], "_i": i})
    best = max(table, key=lambda r: (r["recovery"], r["claim_f1"], r["benign_kept"], -r["replay_fraction"], -r["_i"]))
    for r in table:
        r.pop("_i")
    return PlannerRules(**best["rules"]), table


def methods(ours: PlannerRules) -> dict:
    return {
        "ours": method_fn("", ours),
        "paper": method_fn("", PAPER),
        "ours_no_support": method_fn("", ours.model_copy(update={"support": "none"})),
        "ours_no_selective": method_fn("", ours.model_copy(update={"replay": "suffix"})),
        "paper_no_support": method_fn("", PAPER.model_copy(update={"support": "none"})),
        "paper_no_selective": method_fn("", PAPER.model_copy(update={"replay": "suffix"})),
        **{b: method_fn(b) for b in ("delete_source", "full_reset", "full_replay", "answer_only")},
    }


def _table(cases, ms, label):
    out = {}
    for name, fn in ms.items():
        rows = _score(cases, fn, f"{label}: {name}")
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
    ap.add_argument("--val-n", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 2, 3])
    ap.add_argument("--quick", action="store_true", help="12 controlled, 8 stress, 12 validation cases, one seed")
    ap.add_argument("--posthoc", action="store_true", help="add to --out's existing JSON the 'posthoc' entry: ours with replay "
                    "'selective+memory' (tied with 'selective' on validation, so not chosen), on the same test and stress cases")
    a = ap.parse_args(argv)
    if a.posthoc:
        import json
        from pathlib import Path

        out = json.loads(Path(a.out).read_text())
        rules = PlannerRules(**{**out["chosen_rules"], "replay": "selective+memory"})
        ms = {"ours_selective_memory": method_fn("", rules)}
        test = _prepare(generate_cases(out["config"]["n"], seed=0, knobs=GeneratorKnobs(**out["config"]["knobs"])))
        stress = _prepare(stress_cases(out["config"]["stress"], seed=0))
        out["posthoc"] = {"note": "added after the test run was reported: ours with replay='selective+memory', which tied with the chosen "
                          "'selective' on the validation split (no validation case left a memory hole) and lost the grid-order tie-break; "
                          "the stress set's derived faults show the difference. Not a validated choice.",
                          "rules": rules.model_dump(), "methods": _table(test, ms, "posthoc controlled"), "stress": _table(stress, ms, "posthoc stress")}
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
        return
    if a.quick:
        a.n, a.stress, a.val_n, a.seeds = 12, 8, 12, [0]
    t0 = time.time()
    knobs = GeneratorKnobs()
    val = _prepare(generate_cases(a.val_n, seed=1, knobs=knobs))
    ours, grid = choose_rules(val)
    ms = methods(ours)
    test = _prepare(generate_cases(a.n, seed=0, knobs=knobs))
    result = {"benchmark": "rollback", "config": {"n": a.n, "stress": a.stress, "val_n": a.val_n, "seeds": a.seeds, "knobs": knobs.model_dump(), "validation_seed": 1, "test_seed": 0}}
    result["chosen_rules"] = ours.model_dump()
    result["paper_rules"] = PAPER.model_dump()
    result["methods"] = _table(test, ms, "controlled")
    seeds = {}
    for seed in a.seeds:
        cases = test if seed == 0 else _prepare(generate_cases(a.n, seed=seed, knobs=knobs))
        seeds[seed] = {name: summarise(_score(cases, fn, f"seed {seed}: {name}"), boot=200) for name, fn in ms.items()}
    result["seeds"] = {}
    for name in ms:
        entry = {}
        for metric in ("recovery", "recurrence", "faulty_removed", "benign_kept", "claim_f1", "replay_fraction"):
            vals = [seeds[s][name][metric] for s in a.seeds]
            mean, ci = _t95(vals)
            entry[metric] = {"per_seed": vals, "mean": round(mean, 4), "ci95": ci}
        result["seeds"][name] = entry
    stress = _prepare(stress_cases(a.stress, seed=0))
    result["stress"] = _table(stress, ms, "stress")
    result["stress_cases"] = [{"case": c.id, "trajectory": c.meta["trajectory"], "key": c.meta["key"], "clean": c.meta["value"], "injected": c.meta["wrong"]} for c in stress]
    result["validation"] = sorted(grid, key=lambda r: (-r["recovery"], -r["claim_f1"]))[:12]
    result["seconds"] = round(time.time() - t0, 1)
    write(a.out, result)


if __name__ == "__main__":
    main()
