"""The stress test: real tau-bench airline trajectories turned into replayable scripted policies, with faults
injected into their recorded memory writes.

Conversion of one trajectory (``lab.data`` ``tau_bench_airline_trajectories``: GPT-4o runs, 50 tasks x 4
trials) into a :class:`~lab.provenance.repair.runner.Program`:

* each **read tool call** (``get_user_details``, ``get_reservation_details``, ``search_*_flight``...) is a
  ``fetch`` step; its recorded result is served by the environment for that exact call (a read whose arguments
  change in replay, e.g. a corrected reservation id, is answered from the tau-bench databases); it remembers
  every identifying leaf of the result (ids, codes, dates, numbers) under ``<entity>/<path>`` keys, the entity
  being the call (``get_reservation_details:4WQ150``); ``get_user_details`` is a cached lookup (a profile a
  prior session stored is reused);
* an argument of a later call that equals a remembered value (identifiers with a digit, codes of 5+ capitals,
  dates, numbers) is bound to that memory key (:class:`~lab.provenance.repair.runner.Ref`); other values are
  the user's words, kept as constants;
* ``calculate`` is a ``derive`` step (its numbers bound the same way), assistant messages with bound tokens
  are ``claim`` steps (the text with those tokens filled in), write calls are ``action`` steps on the
  environment (``send_certificate`` irreversible), and the last claim is repeated by the ``answer``.

Faults (one per case, on a memory record some action or the answer reads): ``poisoned`` (the write is
corrupted to a planted value of the same field found elsewhere in that result, e.g. another flight number of
the search), ``misattributed`` (to the same field's value of another user
or reservation of the databases), ``stale`` (a prior session left the profile with one old value; the cached
lookup reuses it), ``derived`` (a number a ``calculate`` step uses is corrupted). The oracle is the same policy
re-run on the clean data. A fault whose failed run cannot execute (it changed a later call's arguments and a
step lost the record it reads) is skipped for the next trajectory; ``Case.meta["trajectory"]`` says which run.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

from lab.provenance.errors import IngestError
from lab.provenance.ingest.taubench import claim_tokens, is_write_tool
from lab.provenance.repair.cases import Case
from lab.provenance.repair.envs import Tool, ToolEnv
from lab.provenance.repair.runner import Program, Ref, StepSpec
from lab.provenance.repair.store import MemoryRecord, MemTXMemory

__all__ = ["program_from_trajectory", "stress_cases", "load_trajectories"]

_ID = re.compile(r"(?=.*\d)[A-Za-z0-9_\-:.]{3,}|[A-Z0-9]{5,}")
_SKIP = {"think", "transfer_to_human_agents", "list_all_airports"}


def load_trajectories() -> list[dict]:
    """The 200 recorded GPT-4o airline runs (``lab.data``)."""
    from lab import data

    return json.loads(data.fetch("tau_bench_airline_trajectories").read_text())


def _bindable(v: Any) -> bool:
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, (int, float)):
        return abs(v) >= 2
    return isinstance(v, str) and bool(_ID.fullmatch(v))


def _flat(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _flat(v, f"{path}/{k}" if path else str(k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _flat(v, f"{path}/{i}" if path else str(i))]
    return [(path, value)]


def _entity(tool: str, args: dict) -> str:
    short = {"get_user_details": "user", "get_reservation_details": "res", "search_direct_flight": "direct", "search_onestop_flight": "onestop"}.get(tool, tool)
    return f"{short}:" + ",".join(str(v) for _, v in sorted(args.items()))


def program_from_trajectory(t: dict, run: str) -> tuple[Program, dict[str, Any], list[str]]:
    """The scripted policy of trajectory ``t`` (module docstring), the recorded ``{call: result}`` and the
    keys each action step reads.

    Raises
    ------
    IngestError
        A tool call whose arguments are not JSON, or whose result (a read) is not JSON, naming the message.
    """
    traj = t["traj"]
    results: dict[str, Any] = {}
    def answers(k: int) -> dict:
        """The tool messages answering assistant message ``k``: those right after it (the recorded runs reuse
        call ids, so an id is matched only there)."""
        out, i = {}, k + 1
        while i < len(traj) and traj[i].get("role") == "tool":
            out.setdefault(traj[i].get("tool_call_id"), (i, traj[i]))
            i += 1
        return out

    latest: dict[str, str] = {}  # string value -> memory key
    steps: list[StepSpec] = []
    n_claim = 0

    def bind(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: bind(x) for k, x in v.items()}
        if isinstance(v, list):
            return [bind(x) for x in v]
        if _bindable(v) and str(v) in latest:
            return Ref(latest[str(v)])
        return v

    def remember(key_prefix: str, result: Any) -> tuple[tuple[str, str], ...]:
        writes = []
        for path, v in _flat(result):
            if _bindable(v):
                key = f"{key_prefix}/{path}"
                writes.append((key, path))
                latest[str(v)] = key
        return tuple(writes)

    for k, m in enumerate(traj):
        if m.get("role") != "assistant":
            continue
        by_id = answers(k)
        for j, tc in enumerate(m.get("tool_calls") or []):
            name = tc["function"]["name"]
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
            except json.JSONDecodeError as e:
                raise IngestError(f"{run}: message {k} call {j}: arguments are not JSON ({e})", path=f"traj[{k}].tool_calls[{j}].function.arguments") from None
            sid = f"m{k}.{name}{j}"
            if name in _SKIP:
                continue
            if name == "calculate":
                expr = str(args.get("expression", ""))
                inputs, parts, last = [], [], 0
                for mt in re.finditer(r"\d+(?:\.\d+)?", expr):
                    tok = mt.group(0)
                    val = float(tok) if "." in tok else int(tok)
                    if _bindable(val) and str(val) in latest:
                        parts.append(expr[last:mt.start()].replace("{", "{{").replace("}", "}}") + "{%d}" % len(inputs))
                        inputs.append(latest[str(val)])
                        last = mt.end()
                template = "".join(parts) + expr[last:].replace("{", "{{").replace("}", "}}")
                key = f"calc:m{k}/result"
                steps.append(StepSpec(sid, "derive", key=key, fn="calc", inputs=tuple(inputs), template=template))
                res = by_id.get(tc.get("id"))
                if res is not None:
                    latest[res[1].get("content", "").strip()] = key
                continue
            if is_write_tool(name):
                steps.append(StepSpec(sid, "action", name, bind(args)))
                continue
            res = by_id.get(tc.get("id"))
            content = res[1].get("content", "") if res else ""
            try:
                result = json.loads(content)
            except (json.JSONDecodeError, TypeError):
                result = {"text": content}
            bound = bind(args)
            call = f"{name}({json.dumps(args, sort_keys=True)})"
            results[call] = result
            writes = remember(_entity(name, args), result)
            steps.append(StepSpec(sid, "fetch", name, bound, writes, cache=(name == "get_user_details")))
        text = m.get("content") or ""
        if text and not m.get("tool_calls"):
            toks = [tok for kind, tok in claim_tokens(text) if kind in ("ident", "date", "number") and tok in latest]
            if toks:
                template, inputs = text.replace("{", "{{").replace("}", "}}"), []
                for tok in sorted(set(toks), key=len, reverse=True):
                    pat = re.compile(r"(?<![\w.])" + re.escape(tok) + r"(?![\w])")
                    if pat.search(template):
                        template = pat.sub("{%d}" % len(inputs), template)
                        inputs.append(latest[tok])
                if inputs:
                    steps.append(StepSpec(f"m{k}.claim", "claim", inputs=tuple(inputs), template=template))
                    n_claim += 1
    last_claim = [s.id for s in steps if s.kind == "claim"][-1:]
    steps.append(StepSpec("answer", "answer", template="", claims=tuple(last_claim)))
    readers = [k for s in steps if s.kind == "action" for k in s.keys_read()]
    return Program(run, "airline", tuple(steps)), results, readers


def _stress_env(results: dict[str, Any]) -> ToolEnv:
    from lab.provenance.tasks import airline_db

    src = airline_db()

    def get(table, arg):
        return lambda db, a: src[table].get(str(a.get(arg)), {"error": f"{table[:-1]} not found"})

    tools = [
        Tool("get_user_details", "read", get("users", "user_id")),
        Tool("get_reservation_details", "read", get("reservations", "reservation_id")),
        Tool("search_direct_flight", "read", lambda db, a: [f for f in src["flights"].values() if f["origin"] == a.get("origin") and f["destination"] == a.get("destination")][:5]),
        Tool("search_onestop_flight", "read", lambda db, a: []),
        Tool("get_flight_status", "read", lambda db, a: src["flights"].get(str(a.get("flight_number")), {}).get("dates", {}).get(str(a.get("date")), {})),
    ]
    for name in ("book_reservation", "cancel_reservation", "update_reservation_flights", "update_reservation_baggages", "update_reservation_passengers"):
        tools.append(Tool(name, "write", table="actions"))
    tools.append(Tool("send_certificate", "write", table="certificates", reversible=False))
    env = ToolEnv("airline", {"actions": {}, "certificates": {}}, tools)
    env.overrides = copy.deepcopy(results)
    return env


def _wrong(value: Any, rng: random.Random, others: list[Any]) -> Any:
    pool = [o for o in others if o != value and type(o) is type(value)]
    if pool:
        return rng.choice(sorted(pool, key=str))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value + rng.choice([-50, -20, 20, 50]) if abs(value) > 60 else value + rng.choice([1, 2])
    return str(value)[:-1] + ("7" if not str(value).endswith("7") else "3")


def stress_cases(n: int = 50, seed: int = 0, trajectories: list[dict] | None = None, exclude: set[int] | frozenset[int] = frozenset()) -> list[Case]:
    """``n`` stress cases over the real runs, cycling over the four failure types (module docstring);
    ``exclude``: trajectory indices not to use (a validation split disjoint from the test set's runs)."""
    from lab.provenance.tasks import airline_db
    from lab.provenance.repair.cases import FAILURES

    trajs = trajectories if trajectories is not None else load_trajectories()
    src = airline_db()
    rng = random.Random(f"repair-stress/{seed}")
    order = list(range(len(trajs)))
    rng.shuffle(order)
    cases: list[Case] = []
    want = [FAILURES[i % 4] for i in range(n)]
    used: set[int] = set(exclude)
    for failure in want:
        for i in order:
            if i in used:
                continue
            case = _make(trajs[i], i, failure, rng, src)
            if case is not None and _runs(case):
                used.add(i)
                cases.append(case)
                break
    return cases


def _runs(case: Case) -> bool:
    """Whether both the clean and the faulty run execute (a fault that changes a later call's arguments can
    leave a step without the record it reads; such a case is replaced by the next trajectory)."""
    from lab.provenance.errors import RepairError
    from lab.provenance.repair.evaluate import run_failed, run_oracle

    try:
        run_failed(case)
        run_oracle(case)
    except RepairError:
        return False
    return True


def _make(t: dict, i: int, failure: str, rng: random.Random, src: dict) -> Case | None:
    run = f"tau-airline/task{t['task_id']}/trial{t['trial']}"
    program, results, readers = program_from_trajectory(t, run)
    if not any(s.kind == "action" for s in program.steps):
        return None
    writers = {k: s for s in program.steps if s.kind == "fetch" for k, _ in s.writes}
    env = _stress_env(results)
    clean_store, bad_store = MemTXMemory(), MemTXMemory()
    inject: dict[str, Any] = {}
    faulty: dict[str, str] = {}
    meta: dict[str, Any] = {"trajectory": i}
    if failure == "derived":
        calc_inputs = [k for s in program.steps if s.kind == "derive" for k in s.inputs]
        cands = [k for k in calc_inputs if k in writers]
    elif failure == "stale":
        cands = [k for k in readers if k in writers and writers[k].tool == "get_user_details"]
    else:
        cands = [k for k in readers if k in writers]
    if not cands:
        return None
    key = rng.choice(sorted(set(cands)))
    spec = writers[key]
    path = dict((k, p) for k, p in spec.writes)[key]
    call_args = {a: v for a, v in (spec.args or {}).items() if not isinstance(v, Ref)}
    if len(call_args) != len(spec.args or {}):
        return None
    result = results[f"{spec.tool}({json.dumps(call_args, sort_keys=True)})"]
    value = dict(_flat(result)).get(path)
    field = path.rsplit("/", 1)[-1]
    if failure == "misattributed":
        others = [v for table in ("users", "reservations") for row in list(src[table].values())[:300] for p, v in _flat(row) if p.rsplit("/", 1)[-1] == field]
    else:
        # a planted value of the same field: another flight number of the search, another payment id
        others = [v for p, v in _flat(result) if p.rsplit("/", 1)[-1] == field] if failure == "poisoned" else []
    wrong = _wrong(value, rng, others)
    idx = [k for k, _ in spec.writes].index(key)
    rid = f"{run}/{spec.id}/m{idx}"
    if failure == "stale":
        # a prior session stored this user's profile; one value is out of date
        for k2, p2 in spec.writes:
            v2 = dict(_flat(result)).get(p2)
            clean_store.write(MemoryRecord(f"prior/{k2}", k2, v2, -1000, 1.0, "prior"))
            bad_store.write(MemoryRecord(f"prior/{k2}", k2, wrong if k2 == key else v2, -1000, 1.0, "prior"))
        rid = f"prior/{key}"
    else:
        inject[rid] = wrong
    faulty[rid] = failure
    # follow-up (a later session): the cached lookup, the calculations that used the key (reused when still
    # remembered), and an answer stating them
    derived = [s for s in program.steps if s.kind == "derive" and key in s.inputs]
    follow_steps = [StepSpec(spec.id + ".f", "fetch", spec.tool, spec.args, spec.writes, cache=True)]
    for d in derived:
        for k in d.inputs:
            w = writers.get(k)
            if w is not None and w is not spec and not any(isinstance(v, Ref) for v in (w.args or {}).values()):
                follow_steps.append(StepSpec(w.id + ".f", "fetch", w.tool, w.args, w.writes, cache=True))
        follow_steps.append(StepSpec(d.id + ".f", "derive", key=d.key, fn=d.fn, inputs=d.inputs, template=d.template, cache=True))
    keys = (key,) + tuple(d.key for d in derived)
    follow = tuple(follow_steps) + (StepSpec("f.answer", "answer", inputs=keys, template=" ".join("{%d}" % j for j in range(len(keys)))),)
    program = Program(program.run, program.domain, program.steps, follow)
    meta.update(key=key, value=value, wrong=wrong)
    return Case(f"{run}/{failure}", "airline", failure, program, env, bad_store, env.copy(), clean_store, faulty, meta, inject)
