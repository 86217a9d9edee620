"""Dependency-guided rollback repair of an agent's memory, trace and answer (arXiv 2608.10502), issue #20.

Submodules
----------
store
    :class:`~lab.provenance.repair.store.MemTXMemory`: the agent's memory on MemTX's store
    (:mod:`lab.provenance.txn`, SQLite or PostgreSQL), and :class:`~lab.provenance.repair.store.MemoryRecord`.
envs
    Deterministic, resettable tool environments: tau-bench airline, shop, support desk; compensations and
    irreversible effects.
runner
    Scripted policies (:class:`~lab.provenance.repair.runner.Program`) and the replayable runner recording what
    every step read and produced.
graph
    The typed memory-to-action graph (cite, support, produce, update, derive, supersede) from trace ids.
planner
    Downstream tracing, the independent-support check and the deactivate / delete / quarantine / preserve plan.
replay
    Selective replay, :func:`~lab.provenance.repair.replay.repair`, and the baselines.
cases, taubench
    The controlled benchmark (3 domains x 4 failure types) and the stress test from real tau-bench runs.
evaluate
    Recovery, recurrence, faulty removed, benign kept, claim-invalidation F1, replay fraction.
"""

from lab.provenance.repair.planner import MEMORY_REPLAY, PAPER, SELECTIVE, Plan, PlanEntry, PlannerRules, plan_repair
from lab.provenance.repair.replay import BASELINES, RepairResult, repair, run_baseline
from lab.provenance.repair.runner import Program, Ref, StepSpec, Trace, run_program
from lab.provenance.repair.store import AGENT_MEMORY, MemoryRecord, MemTXMemory

__all__ = [
    "MEMORY_REPLAY", "PAPER", "SELECTIVE", "Plan", "PlanEntry", "PlannerRules", "plan_repair",
    "BASELINES", "RepairResult", "repair", "run_baseline",
    "Program", "Ref", "StepSpec", "Trace", "run_program",
    "AGENT_MEMORY", "MemoryRecord", "MemTXMemory",
]
