"""Selective replay and the repair entry point, plus the baselines the benchmark compares with.

:func:`repair` runs the five stages on a failed run: build the graph, trace, check independent support, plan
(:mod:`lab.provenance.repair.planner`), then apply the memory ops and re-execute the planned steps against the
repaired memory, in trace order, at their original logical times (the answer is always regenerated). A replayed
side-effecting step first undoes its earlier effect through the environment's registered compensation; an
effect with none (money paid out, an e-mail sent) is **not** replayed and is listed in
``RepairResult.irreversible`` (with the plan entry ``irreversible``), never hidden. Everything is done on the
given store and environment: the store's changes are one MemTX database transaction
(:meth:`~lab.provenance.repair.store.MemTXMemory.atomic`) and the environment is snapshotted, so when repair
refuses (a typed error) both are as they were.

(Dependency-guided rollback repair, arXiv 2608.10502, stage 5; its limitation on irreversible external effects.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lab.provenance.errors import IrreversibleEffectError, RepairError
from lab.provenance.repair.envs import ToolEnv
from lab.provenance.repair.graph import build_graph, step_node
from lab.provenance.repair.planner import FAULT_OPS, Plan, PlanEntry, PlannerRules, plan_repair
from lab.provenance.repair.runner import Program, Trace, execute_step
from lab.provenance.repair.store import MemoryRecord, MemTXMemory

__all__ = ["RepairResult", "repair", "BASELINES", "run_baseline", "apply_ops"]


@dataclass
class RepairResult:
    """The outcome of a repair: the corrected ``answer``, the repaired ``trace`` (old steps kept, replayed ones
    appended with their generation), the repaired ``store`` and ``env`` (the objects passed in, changed),
    the ``plan``, the step ids ``replayed`` (in order), the ``irreversible`` effects left in place,
    ``replay_steps`` (step executions, including a shadow run's) and ``rebuilt`` (memory records rewritten from
    a recorded tool result, no step executed: ``PlannerRules.rebuild``)."""

    answer: Any
    trace: Trace
    store: MemTXMemory
    env: ToolEnv
    plan: Plan | None
    replayed: list[str] = field(default_factory=list)
    irreversible: list[str] = field(default_factory=list)
    replay_steps: int = 0
    rebuilt: list[str] = field(default_factory=list)


def apply_ops(store: MemTXMemory, plan: Plan) -> None:
    """Apply the plan's memory ops (quarantine, delete, deactivate, reinstate) to ``store``."""
    for nid, e in plan.entries.items():
        if e.type != "memory":
            continue
        if e.op in ("quarantine", "delete", "deactivate"):
            store.set_status(nid, {"quarantine": "quarantined", "delete": "deleted", "deactivate": "deactivated"}[e.op], e.why)
        elif e.op == "reinstate":
            store.set_status(nid, "active", e.why)


def _blocked(store: MemTXMemory) -> set[tuple[str, str]]:
    """``(key, value)`` of the quarantined records: a replayed read that brings one back is not re-admitted."""
    return {(r.key, repr(r.value)) for r in store.records() if r.status == "quarantined"}


def _readmit(store: MemTXMemory, produced: list[str], blocked: set[tuple[str, str]]) -> None:
    for p in produced:
        if p in store:
            r = store.get(p)
            if r.status == "active" and (r.key, repr(r.value)) in blocked:
                store.set_status(p, "quarantined", "re-admission of a quarantined value blocked")
                old = [x for x in store.records() if x.key == r.key and x.status == "superseded" and x.reason == f"superseded by {p}"]
                for x in old:
                    store.set_status(x.id, "active", f"reinstated: {p} was quarantined")


def _confirm(trace: Trace, store: MemTXMemory, plan: Plan, old: list, rec) -> None:
    """A replayed product identical to what the step produced before: keep the old one (``preserve``)."""
    before = [p for s in old for p in s.produces]
    for p in rec.produces:
        if p in store:
            new = store.get(p)
            for q in before:
                if q in store and q in plan.invalid and store.get(q).key == new.key and store.get(q).value == new.value and new.status == "active":
                    store.set_status(p, "deactivated", f"identical to {q}")
                    store.set_status(q, "active", "re-derived identical in replay: kept")
                    plan.entries[q] = PlanEntry(q, "memory", "preserve", "re-derived identical in replay")
        elif p in trace.records and trace.records[p].type == "claim":
            for q in before:
                if q in trace.records and trace.records[q].type == "claim" and trace.records[q].content == trace.records[p].content and q in plan.invalid:
                    plan.entries[q] = PlanEntry(q, "claim", "preserve", "re-derived identical in replay")


def _replay(program: Program, trace: Trace, store: MemTXMemory, env: ToolEnv, steps: list[str], plan: Plan | None, result: RepairResult) -> None:
    blocked = _blocked(store)
    gen = 1 + max((s.generation for s in trace.steps), default=0)
    times = {s.step: s.time for s in trace.steps if s.generation == 0}
    recorded = {r.call: r.content for r in trace.records.values() if r.type == "source" and r.call}
    # undo the effects of the actions to be replayed first, newest first, so no replayed step sees them
    stuck: set[str] = set()
    effects = {old.produces[0]: old.step for old in trace.steps if old.step in steps and old.kind == "action" and old.produces}
    for e in reversed(list(env.journal)):
        if e.id in effects:
            try:
                env.compensate(e.id)
            except IrreversibleEffectError:
                st = effects[e.id]
                stuck.add(st)
                result.irreversible.append(e.id)
                if plan is not None:
                    plan.entries[step_node(trace.run, st)] = PlanEntry(step_node(trace.run, st), "step", "irreversible", f"{e.id} ({e.tool}) has no compensation: left in place, reported")
    for st in steps:
        spec = program.step(st)
        old = [s for s in trace.steps if s.step == st]
        if st in stuck:
            continue
        for s in old:
            for p in s.produces:
                if p in store and store.get(p).status in ("active", "superseded"):
                    store.set_status(p, "deactivated", f"replaced by the replay of {st}")
        rec = execute_step(spec, env, store, trace, time=times.get(st, len(trace.steps)), generation=gen, keep_equal=True, recorded=recorded)
        _readmit(store, rec.produces, blocked)
        if plan is not None and plan.rules.confirm:
            _confirm(trace, store, plan, old, rec)
        result.replayed.append(st)
        result.replay_steps += 1


def repair(program: Program, trace: Trace, store: MemTXMemory, env: ToolEnv, faulty: dict[str, str], rules: PlannerRules = PlannerRules()) -> RepairResult:
    """Dependency-guided rollback repair of a failed run.

    Parameters
    ----------
    program : Program
        The scripted policy that ran (its steps are what replay re-executes).
    trace : Trace
        The failed run's trace (not changed; the result holds a repaired copy).
    store : MemTXMemory
        The memory after the failed run; changed in place.
    env : ToolEnv
        The environment after the failed run; changed in place (effects compensated, replayed).
    faulty : dict
        Diagnosed faulty memory ids -> failure type (``poisoned``/``stale``/``misattributed``/``derived``).
    rules : PlannerRules
        ``PlannerRules()`` (ours, the rules chosen on the validation split) or ``PAPER``.

    Returns
    -------
    RepairResult

    Raises
    ------
    RepairError
        A faulty id not in the graph, an unknown failure type; ``MissingProvenanceError``: a read with no
        recorded source; ``LineageCycleError``: a dependency cycle. The store and environment are then as
        they were.
    """
    env_db, env_journal = env.state(), list(env.journal)
    try:
        with store.atomic():  # one MemTX database transaction: a refusal rolls back every write and transition
            g = build_graph(trace, store)
            plan = plan_repair(program, trace, g, faulty, rules)
            repaired = trace.copy()
            result = RepairResult(None, repaired, store, env, plan)
            apply_ops(store, plan)
            for fid, (key, value, src) in plan.rebuild.items():
                f = store.get(fid)
                r = store.write(MemoryRecord(f"{fid}@rebuilt", key, value, f.time, repaired.records[src].trust, f.session, f.step))
                result.rebuilt.append(r.id)
            if rules.replay == "all":
                for r in store.records():
                    if r.session == trace.run and r.status in ("active", "superseded") and r.id not in plan.entries:
                        store.set_status(r.id, "deactivated", "full replay")
            _replay(program, repaired, store, env, plan.replay, plan, result)
            result.answer = repaired.answer
            return result
    except Exception:
        env.db, env.journal = env_db, env_journal
        raise


def _faulty_ops(store: MemTXMemory, faulty: dict[str, str]) -> None:
    for fid, kind in faulty.items():
        store.set_status(fid, {"quarantine": "quarantined", "delete": "deleted", "deactivate": "deactivated"}[FAULT_OPS[kind]], f"diagnosed {kind}")


def _undo_all(trace: Trace, env: ToolEnv, result: RepairResult) -> None:
    for e in reversed(list(env.journal)):
        if e.id.startswith(trace.run + "/"):
            try:
                env.compensate(e.id)
            except IrreversibleEffectError:
                result.irreversible.append(e.id)


def run_baseline(name: str, program: Program, trace: Trace, store: MemTXMemory, env: ToolEnv, faulty: dict[str, str]) -> RepairResult:
    """One of :data:`BASELINES` on a failed run (same inputs and outputs as :func:`repair`).

    ``delete_source``: remove the faulty records only (answer, claims and effects left as they are).
    ``full_reset``: empty the store (prior sessions' records too), undo every reversible effect, re-run the policy.
    ``full_replay``: remove the faulty records and this run's records, undo every reversible effect, re-run it all.
    ``answer_only``: re-run the policy in a shadow copy without the faulty records and take its answer; the memory
    and the environment are left as they are (the faulty records stay active).
    """
    repaired = trace.copy()
    result = RepairResult(trace.answer, repaired, store, env, None)
    n = len(program.steps)
    if name == "delete_source":
        _faulty_ops(store, faulty)
    elif name in ("full_reset", "full_replay"):
        _faulty_ops(store, {k: v for k, v in faulty.items() if name == "full_replay"})
        for r in store.records():
            if r.status in ("active", "superseded") and (name == "full_reset" or r.session == trace.run):
                store.set_status(r.id, "deactivated", name)
        _undo_all(trace, env, result)
        if result.irreversible:
            keep = set(result.irreversible)
            steps = [s.id for s in program.steps if not (s.kind == "action" and any(p in keep for x in trace.steps if x.step == s.id for p in x.produces))]
        else:
            steps = [s.id for s in program.steps]
        gen = 1
        times = {s.step: s.time for s in trace.steps}
        blocked = _blocked(store)
        recorded = {r.call: r.content for r in trace.records.values() if r.type == "source" and r.call}
        for st in steps:
            rec = execute_step(program.step(st), env, store, repaired, time=times.get(st, 0), generation=gen, keep_equal=True, recorded=recorded)
            _readmit(store, rec.produces, blocked)
            result.replayed.append(st)
        result.replay_steps = len(steps)
        result.answer = repaired.answer
    elif name == "answer_only":
        shadow_store = store.copy()
        _faulty_ops(shadow_store, faulty)
        shadow_env = env.copy()
        _undo_all(trace, shadow_env, RepairResult(None, trace, shadow_store, shadow_env, None))
        for r in shadow_store.records():
            if r.session == trace.run and r.status in ("active", "superseded"):
                shadow_store.set_status(r.id, "deactivated", "shadow")
        shadow = _run_blocked(dataclasses.replace(program, run=program.run + "/shadow"), shadow_env, shadow_store)
        result.answer = shadow.answer
        result.replay_steps = n
    else:
        raise RepairError(f"unknown baseline {name!r}; one of {BASELINES}", step=name)
    return result


def _run_blocked(program: Program, env: ToolEnv, store: MemTXMemory) -> Trace:
    blocked = _blocked(store)
    trace = Trace(program.run, program.domain)
    for t, spec in enumerate(program.steps):
        rec = execute_step(spec, env, store, trace, time=t)
        _readmit(store, rec.produces, blocked)
    return trace


BASELINES = ("delete_source", "full_reset", "full_replay", "answer_only")
