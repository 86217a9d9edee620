"""A replayable agent runner: scripted policies over deterministic tool environments, recording for every
step what it read and what it produced.

A policy is a :class:`Program`, a list of :class:`StepSpec` (no language model runs here). Step kinds:

``fetch``   call a read tool; its result becomes a **source** record; ``writes`` stores parts of it as memory
            records (``(key, path)``). With ``cache=True`` the step is a *lookup*: when every key it writes
            already has an active record (e.g. left by a prior session), the call is skipped and those records
            are cited instead (where a stale memory gets in).
``derive``  a memory record computed from other keys (``fn``: ``sum``, ``min``, ``max``, ``first``, ``concat``,
            ``difference``, ``inc``, ``excess`` (``max(0, a - b)``), ``map`` (a policy table, JSON in ``template``));
            with ``cache=True`` an active record of the key is reused.
``claim``   an assertion (text from ``template`` and the values of ``inputs``).
``action``  a write tool call whose arguments hold :class:`Ref` placeholders resolved against memory; its side
            effect is journaled by the environment (and is replayed only through its compensation).
``answer``  the final answer (text from ``template``, ``inputs`` and the texts of ``claims``).

Every key read resolves to the newest active record of the key in the :class:`~lab.provenance.repair.store.MemTXMemory`
(MemTX's store)
and is recorded as a *cite* of that record id; every record made is recorded as *produced* by the step; a
memory write that replaces an active record of its key records the *supersede*. These ids are all the graph
builder (:mod:`lab.provenance.repair.graph`) needs: edges come from trace ids, never inferred.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

from lab.provenance.errors import MissingProvenanceError
from lab.provenance.repair.envs import ToolEnv
from lab.provenance.repair.store import MemoryRecord, MemTXMemory

__all__ = ["Ref", "StepSpec", "Program", "Record", "StepRecord", "Trace", "run_program", "execute_step", "extract", "followup", "KINDS"]

KINDS = ("fetch", "derive", "claim", "action", "answer")


@dataclass(frozen=True)
class Ref:
    """A placeholder for the value of memory key ``key`` (resolved when the step runs)."""

    key: str


@dataclass(frozen=True)
class StepSpec:
    """One step of a scripted policy (module docstring for the kinds and fields)."""

    id: str
    kind: str
    tool: str | None = None
    args: Any = None
    writes: tuple[tuple[str, str], ...] = ()
    cache: bool = False
    key: str | None = None
    fn: str | None = None
    inputs: tuple[str, ...] = ()
    template: str = ""
    claims: tuple[str, ...] = ()

    def keys_read(self) -> list[str]:
        """Memory keys the step reads (its ``inputs`` and the :class:`Ref` leaves of its ``args``)."""
        return list(self.inputs) + _refs(self.args)

    def keys_written(self) -> list[str]:
        return [k for k, _ in self.writes] + ([self.key] if self.kind == "derive" and self.key else [])


@dataclass(frozen=True)
class Program:
    """A scripted policy: ``steps`` in order, for run ``run`` in ``domain``; ``followup``: the steps of a
    follow-up query in a later session (cached lookups, derivations and an answer; it measures recurrence)."""

    run: str
    domain: str
    steps: tuple[StepSpec, ...]
    followup: tuple[StepSpec, ...] = ()

    def step(self, step_id: str) -> StepSpec:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise MissingProvenanceError(f"run {self.run}: no step {step_id!r} in the policy", step=step_id)


@dataclass(frozen=True)
class Record:
    """A non-memory record of a trace: ``type`` ``source`` (a tool result; ``call``: the tool call that returned
    it), ``claim``, ``answer`` or ``effect``."""

    id: str
    type: str
    content: Any
    step: str
    time: int
    trust: float = 1.0
    call: str = ""


@dataclass
class StepRecord:
    """What one executed step read (``reads``: record ids), produced (``produces``) and superseded
    (``supersedes``: ``(new id, old id)``), its ``output`` and ``time``; ``skipped``: a cache hit."""

    step: str
    kind: str
    time: int
    reads: list[str] = field(default_factory=list)
    produces: list[str] = field(default_factory=list)
    supersedes: list[tuple[str, str]] = field(default_factory=list)
    output: Any = None
    skipped: bool = False
    generation: int = 0


@dataclass
class Trace:
    """An executed run: ``steps`` (in order), the non-memory ``records`` by id, and the ``answer``."""

    run: str
    domain: str
    steps: list[StepRecord] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)
    answer: Any = None

    def step(self, step_id: str) -> StepRecord:
        for s in self.steps:
            if s.step == step_id:
                return s
        raise MissingProvenanceError(f"run {self.run}: the trace has no step {step_id!r}", step=step_id)

    def copy(self) -> Trace:
        return Trace(self.run, self.domain, copy.deepcopy(self.steps), dict(self.records), copy.deepcopy(self.answer))


def _refs(value: Any) -> list[str]:
    if isinstance(value, Ref):
        return [value.key]
    if isinstance(value, dict):
        return [k for v in value.values() for k in _refs(v)]
    if isinstance(value, (list, tuple)):
        return [k for v in value for k in _refs(v)]
    return []


def _fill(value: Any, values: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        return copy.deepcopy(values[value.key])
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_fill(v, values) for v in value]
    return value


def extract(result: Any, path: str) -> Any:
    """The part of a JSON ``result`` at ``path`` (``"a/b/0"``; ``""`` is the whole result); ``None`` if absent."""
    cur = result
    for part in [p for p in path.split("/") if p]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and re.fullmatch(r"\d+", part) and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return copy.deepcopy(cur)


def _derive(fn: str | None, values: list[Any], table: str = "") -> Any:
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if fn == "sum":
        total = sum(nums)
        return int(total) if total == int(total) else round(total, 2)
    if fn == "min":
        return min(values)
    if fn == "max":
        return max(values)
    if fn == "first":
        return values[0]
    if fn == "concat":
        return " ".join(str(v) for v in values)
    if fn == "calc":  # an arithmetic expression, numbers filled in from the inputs
        return _calc(table.format(*values))
    if fn == "map":  # a policy table, JSON in the step's template
        return json.loads(table)[str(values[0])]
    if fn == "inc":
        return nums[0] + 1
    if fn == "excess":
        return max(0, int(nums[0] - nums[1]))
    if fn == "difference":
        d = nums[0] - nums[1]
        return int(d) if d == int(d) else round(d, 2)
    raise MissingProvenanceError(f"unknown derive function {fn!r}", step=None)


def _calc(expr: str) -> Any:
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in ops:
            return ops[type(n.op)](ev(n.operand))
        raise MissingProvenanceError(f"calculate: {expr!r} is not plain arithmetic", step=None)

    v = ev(ast.parse(expr, mode="eval"))
    return int(v) if float(v) == int(v) else round(float(v), 2)


def _text(template: str, values: list[Any]) -> str:
    return template.format(*[v if not isinstance(v, (dict, list)) else json.dumps(v, sort_keys=True) for v in values])


def execute_step(spec: StepSpec, env: ToolEnv, store: MemTXMemory, trace: Trace, *, time: int, generation: int = 0, context: dict[str, tuple[str, Any]] | None = None, keep_equal: bool = False, recorded: dict[str, Any] | None = None, inject: dict[str, Any] | None = None) -> StepRecord:
    """Execute one step against ``env`` and ``store``, append its :class:`StepRecord` to ``trace``, return it.

    ``context`` (replay only): ``{key: (record id, value)}`` to use instead of resolving those keys (the
    paper's *fixed context* of safe prior outputs). Record ids made in replay carry ``@r<generation>``.
    ``keep_equal`` (replay): a memory write whose value equals the active record of its key writes nothing and
    cites that record (a re-read of unchanged state keeps the benign record instead of replacing it).
    ``recorded`` (replay): ``{call: result}`` of the failed run's tool results; a read whose call (tool and
    resolved arguments) is among them reuses that result instead of re-reading the live environment, which
    by then also holds the effects of later steps (a re-read of a reservation after its own bag update would
    count the bag twice).
    ``inject`` (benchmark fault injection): ``{memory record id: value}``; such a record is written with that
    value instead of what the tool returned (a corrupted memory write; the source record keeps the true result).

    Raises
    ------
    MissingProvenanceError
        A key the step reads has no active record and no ``context`` entry (a read with no recorded
        source), naming the step and the key.
    """
    sfx = f"@r{generation}" if generation else ""
    rec = StepRecord(spec.id, spec.kind, time, generation=generation)
    values: dict[str, Any] = {}
    if spec.kind == "derive" and spec.cache and store.resolve(spec.key) is not None:
        r = store.resolve(spec.key)
        rec.skipped, rec.output = True, r.value
        rec.reads.append(r.id)
        trace.steps.append(rec)
        return rec
    for key in spec.keys_read():
        if context is not None and key in context:
            rid, val = context[key]
        else:
            r = store.resolve(key)
            if r is None:
                raise MissingProvenanceError(f"run {trace.run}: step {spec.id} reads {key!r}, which no active memory record holds", step=spec.id)
            rid, val = r.id, r.value
        values[key] = val
        if rid not in rec.reads:
            rec.reads.append(rid)
    if spec.kind == "fetch":
        if spec.cache and spec.writes and all(store.resolve(k) is not None for k, _ in spec.writes):
            rec.skipped = True
            for k, _ in spec.writes:
                r = store.resolve(k)
                rec.reads.append(r.id)
            rec.output = {k: store.resolve(k).value for k, _ in spec.writes}
        else:
            tool = env.tool(spec.tool)
            args = _fill(spec.args or {}, values)
            call = f"{spec.tool}({json.dumps(args, sort_keys=True)})"
            result = copy.deepcopy(recorded[call]) if recorded is not None and call in recorded else env.call(spec.tool, args)
            sid = f"{trace.run}/{spec.id}/result{sfx}"
            trace.records[sid] = Record(sid, "source", result, spec.id, time, tool.trust, call)
            rec.produces.append(sid)
            rec.output = result
            for i, (key, path) in enumerate(spec.writes):
                if extract(result, path) is None:  # nothing there to remember (e.g. no review for the product)
                    continue
                old = store.resolve(key)
                if keep_equal and old is not None and old.value == extract(result, path):
                    rec.reads.append(old.id)
                    continue
                mid = f"{trace.run}/{spec.id}/m{i}{sfx}"
                value = inject[mid] if inject and mid in inject else extract(result, path)
                m = store.write(MemoryRecord(mid, key, value, time, tool.trust, trace.run, spec.id))
                rec.produces.append(m.id)
                if old is not None and m.status == "active" and store.get(old.id).status == "superseded":
                    rec.supersedes.append((m.id, old.id))
    elif spec.kind == "derive":
        val = _derive(spec.fn, [values[k] for k in spec.inputs], spec.template)
        trust = min([store.get(r).trust for r in rec.reads if r in store] or [1.0])
        old = store.resolve(spec.key)
        m = store.write(MemoryRecord(f"{trace.run}/{spec.id}/m0{sfx}", spec.key, val, time, trust, trace.run, spec.id))
        rec.produces.append(m.id)
        if old is not None and m.status == "active" and store.get(old.id).status == "superseded":
            rec.supersedes.append((m.id, old.id))
        rec.output = val
    elif spec.kind in ("claim", "answer"):
        texts = []
        for cid in spec.claims:
            c = _latest(trace, cid)
            if c is None:
                raise MissingProvenanceError(f"run {trace.run}: step {spec.id} repeats claim step {cid!r}, which produced no claim", step=spec.id)
            texts.append(trace.records[c].content)
            rec.reads.append(c)
        text = _text(spec.template, [values[k] for k in spec.inputs])
        out = " ".join([text, *texts]).strip() if spec.kind == "answer" else text
        rid = f"{trace.run}/{spec.id}/{spec.kind}{sfx}"
        trace.records[rid] = Record(rid, spec.kind, out, spec.id, time)
        rec.produces.append(rid)
        rec.output = out
        if spec.kind == "answer":
            trace.answer = out
    elif spec.kind == "action":
        args = _fill(spec.args or {}, values)
        eid = f"{trace.run}/{spec.id}/effect{sfx}"
        env.call(spec.tool, args, effect_id=eid)
        trace.records[eid] = Record(eid, "effect", {"tool": spec.tool, "args": args}, spec.id, time)
        rec.produces.append(eid)
        rec.output = {"tool": spec.tool, "args": args}
    else:
        raise MissingProvenanceError(f"run {trace.run}: step {spec.id} has unknown kind {spec.kind!r}", step=spec.id)
    trace.steps.append(rec)
    return rec


def _latest(trace: Trace, step_id: str) -> str | None:
    for s in reversed(trace.steps):
        if s.step == step_id and s.produces:
            return s.produces[0]
    return None


def run_program(program: Program, env: ToolEnv, store: MemTXMemory, *, inject: dict[str, Any] | None = None) -> Trace:
    """Run every step of ``program`` in order (times 0, 1, ...) and return the :class:`Trace`.

    ``inject`` (benchmark fault injection): ``{memory record id: value}``; the step that writes such a record
    writes that value instead of what its tool returned (a corrupted memory write)."""
    trace = Trace(program.run, program.domain)
    for t, spec in enumerate(program.steps):
        execute_step(spec, env, store, trace, time=t, inject=inject)
    return trace


class _WhatIf(Exception):
    """Ends a what-if session: its MemTX transaction rolls back."""


def followup(program: Program, env: ToolEnv, store: MemTXMemory) -> Any:
    """The answer of the follow-up query ``program.followup`` (a later session: its cached lookups reuse whatever
    memory is still active, so a fault left active re-occurs), run as a what-if: its memory writes are one MemTX
    transaction that is rolled back, and it runs on a copy of ``env`` when it has side-effecting steps, so
    neither is changed."""
    if not program.followup:
        return None
    trace = Trace(program.run + "/followup", program.domain)
    env2 = env.copy() if any(s.kind == "action" for s in program.followup) else env
    try:
        with store.atomic():
            for t, spec in enumerate(program.followup):
                execute_step(spec, env2, store, trace, time=10_000 + t)
            raise _WhatIf
    except _WhatIf:
        pass
    return trace.answer
