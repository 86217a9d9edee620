"""Scoring a repair against a case's oracle (the metrics of arXiv 2608.10502, section 4).

Per case: **recovered** (the answer, the environment state and the active memory ``{key: value}`` all equal
the oracle's), **recurred** (the follow-up query's answer after repair differs from its answer on the oracle
state), **faulty_removed** (no diagnosed faulty record is active), **benign_kept** (the share of benign records
still there: a prior session's record by its id, this run's by an active record of its key with its value;
benign = active after the failed run, not faulty, and agreeing with the oracle memory), claim-invalidation
counts (the claims that must be invalidated are the claim steps whose text differs from the oracle run's; the
predicted ones are those the method invalidated or replayed), **replay_steps** (step executions; full
replay = the number of steps) and **rebuilt** (memory records rewritten from a recorded tool result, no step
executed; summed as ``memory_rebuilt``). :func:`summarise` pools cases with Wilson / bootstrap 95% intervals.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable

from lab.provenance.errors import RepairError
from lab.provenance.repair.cases import Case
from lab.provenance.repair.planner import PlannerRules
from lab.provenance.repair.replay import BASELINES, RepairResult, repair, run_baseline
from lab.provenance.repair.runner import Program, Trace, followup, run_program

__all__ = ["CaseScore", "Outcome", "run_failed", "run_oracle", "score_case", "summarise", "method_fn"]


@dataclass
class Outcome:
    """A run's trace, store, environment and follow-up answer."""

    trace: Trace
    store: Any
    env: Any
    follow: Any


@dataclass
class CaseScore:
    """One method on one case (module docstring)."""

    case: str
    domain: str
    failure: str
    recovered: bool
    answer_ok: bool
    state_ok: bool
    memory_ok: bool
    recurred: bool
    faulty_removed: float
    benign_kept: float
    claim_tp: int
    claim_fp: int
    claim_fn: int
    replay_steps: int
    steps: int
    irreversible: int
    refused: str = ""
    rebuilt: int = 0
    replay_unchanged: int = 0


def run_failed(case: Case) -> Outcome:
    """The failed run: the policy on the faulty world (copies; the case is not changed)."""
    env, store = case.env.copy(), case.store.copy()
    trace = run_program(case.program, env, store, inject=case.inject)
    return Outcome(trace, store, env, None)


def run_oracle(case: Case) -> Outcome:
    """The oracle: the policy on the clean data, and its follow-up answer."""
    env, store = case.clean_env.copy(), case.clean_store.copy()
    trace = run_program(case.program, env, store)
    return Outcome(trace, store, env, followup(case.program, env, store))


def method_fn(name: str, rules: PlannerRules | None = None) -> Callable[[Program, Trace, Any, Any, dict], RepairResult]:
    """A callable ``(program, trace, store, env, faulty) -> RepairResult`` for a baseline name or planner rules."""
    if rules is not None:
        return lambda p, t, s, e, f: repair(p, t, s, e, f, rules)
    if name not in BASELINES:
        raise RepairError(f"unknown method {name!r}; one of {sorted(BASELINES)} or planner rules", step=name)
    return lambda p, t, s, e, f: run_baseline(name, p, t, s, e, f)


def _claims(trace: Trace) -> dict[str, str]:
    return {s.step: trace.records[s.produces[0]].content for s in trace.steps if s.kind == "claim" and s.generation == 0 and s.produces}


def score_case(case: Case, fn: Callable, failed: Outcome | None = None, oracle: Outcome | None = None) -> CaseScore:
    """Run method ``fn`` on ``case`` and score it against the oracle."""
    failed = failed or run_failed(case)
    oracle = oracle or run_oracle(case)
    env, store = failed.env.copy(), failed.store.copy()
    truth = oracle.store.active()
    benign = [r for r in store.records() if r.status == "active" and r.id not in case.faulty and truth.get(r.key) == r.value]
    try:
        res = fn(case.program, failed.trace, store, env, dict(case.faulty))
        refused = ""
    except RepairError as e:  # the repair refused; store and environment are as the failed run left them
        res = RepairResult(failed.trace.answer, failed.trace, store, env, None)
        refused = f"{type(e).__name__}: {e}"
    active = store.active()
    answer_ok = res.answer == oracle.trace.answer
    state_ok = env.outcome() == oracle.env.outcome()
    memory_ok = active == truth
    follow = followup(case.program, env, store)
    kept = 0
    for r in benign:
        if r.session == "prior":
            kept += store.get(r.id).status == "active"
        else:
            kept += active.get(r.key) == r.value
    must = {k for k, v in _claims(failed.trace).items() if _claims(oracle.trace).get(k) != v}
    if res.plan is not None:
        pred = {_step_of(e.node, failed.trace) for e in res.plan.entries.values() if e.type == "claim" and e.op == "invalidate"}
    else:
        pred = {st for st in res.replayed if case.program.step(st).kind == "claim"}
    removed = sum(store.get(f).status != "active" for f in case.faulty) / max(1, len(case.faulty))
    return CaseScore(
        case.id, case.domain, case.failure, answer_ok and state_ok and memory_ok, answer_ok, state_ok, memory_ok,
        follow != oracle.follow, removed, kept / len(benign) if benign else 1.0,
        len(must & pred), len(pred - must), len(must - pred), res.replay_steps, len(case.program.steps), len(res.irreversible), refused,
        len(res.rebuilt), _unchanged(res, failed.store, store),
    )


def _unchanged(res: RepairResult, before, after) -> int:
    """Replayed steps whose re-execution changed nothing: the same claim / answer text, derived value, action
    arguments, or (a fetch) no memory value written other than what its first execution wrote."""
    if not res.replayed or res.trace is None:
        return 0
    first = {s.step: s for s in res.trace.steps if s.generation == 0}
    gen = max(s.generation for s in res.trace.steps)
    n = 0
    for s in res.trace.steps:
        if s.generation != gen or s.generation == 0 or s.step not in first:
            continue
        old = first[s.step]
        if s.kind == "fetch":
            new_mem = [after.get(p) for p in s.produces if p in after]
            old_vals = {(before.get(p).key, repr(before.get(p).value)) for p in old.produces if p in before}
            n += all((m.key, repr(m.value)) in old_vals for m in new_mem)
        else:
            n += s.output == old.output
    return n


def _step_of(record_id: str, trace: Trace) -> str:
    return trace.records[record_id].step


def _wilson(k: int, n: int) -> list[float]:
    if n == 0:
        return [0.0, 0.0]
    z, p = 1.96, k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, c - h), 4), round(min(1.0, c + h), 4)]


def _f1(rows: list[CaseScore]) -> tuple[float, float, float]:
    tp, fp, fn = sum(r.claim_tp for r in rows), sum(r.claim_fp for r in rows), sum(r.claim_fn for r in rows)
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def summarise(rows: list[CaseScore], *, boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Pooled metrics with 95% intervals (Wilson for rates, case bootstrap for F1 and replay fraction)."""
    n = len(rows)
    rec, recur = sum(r.recovered for r in rows), sum(r.recurred for r in rows)
    p, rc, f1 = _f1(rows)
    rng = random.Random(seed)
    f1s, fracs = [], []
    for _ in range(boot):
        sample = [rows[rng.randrange(n)] for _ in range(n)]
        f1s.append(_f1(sample)[2])
        fracs.append(sum(r.replay_steps for r in sample) / sum(r.steps for r in sample))
    f1s.sort()
    fracs.sort()
    lo, hi = int(0.025 * boot), int(0.975 * boot) - 1
    return {
        "n": n,
        "recovery": round(rec / n, 4), "recovery_ci": _wilson(rec, n),
        "recurrence": round(recur / n, 4), "recurrence_ci": _wilson(recur, n),
        "faulty_removed": round(sum(r.faulty_removed for r in rows) / n, 4),
        "benign_kept": round(sum(r.benign_kept for r in rows) / n, 4),
        "claim_precision": round(p, 4), "claim_recall": round(rc, 4), "claim_f1": round(f1, 4), "claim_f1_ci": [round(f1s[lo], 4), round(f1s[hi], 4)],
        "replay_fraction": round(sum(r.replay_steps for r in rows) / sum(r.steps for r in rows), 4), "replay_fraction_ci": [round(fracs[lo], 4), round(fracs[hi], 4)],
        "answer_ok": round(sum(r.answer_ok for r in rows) / n, 4), "state_ok": round(sum(r.state_ok for r in rows) / n, 4), "memory_ok": round(sum(r.memory_ok for r in rows) / n, 4),
        "irreversible_effects": sum(r.irreversible for r in rows),
        "memory_rebuilt": sum(r.rebuilt for r in rows),
        "replay_unchanged": sum(r.replay_unchanged for r in rows),
        "refused": sum(bool(r.refused) for r in rows),
    }
