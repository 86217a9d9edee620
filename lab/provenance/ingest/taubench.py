"""Ingest tau-bench trajectories (OpenAI chat format) into a :class:`~lab.provenance.graph.ProvenanceGraph`.

Input: a JSON list of ``{task_id, trial, reward, info: {task: {user_id, actions, instruction, ...}}, traj: [messages]}``
(``data.fetch("tau_bench_airline_trajectories")``). Each trajectory is one **run**, id
``tau-<domain>/task<task_id>/trial<trial>``.

Mapping (all node ids are prefixed with the run id)
---------------------------------------------------
``<run>/agent``       agent: the assistant; ``acted_on_behalf_of`` ``<run>/user``.
``<run>/user``        agent: the user (the principal), ``text`` = the task's ``user_id``.
``<run>/msg<k>``      source: the tool **result** at message ``k`` (text = its content; attributes: tool name, call id,
                      arguments, message index); owner = the assistant; trust 1.0 (the environment's database).
                      A result that looks like JSON (its first non-blank character is ``{`` or ``[``) must parse:
                      a cut or corrupted one is refused (:class:`~lab.provenance.errors.IngestError` naming the run,
                      the message index and the path ``[i].traj[k].content``), or, with
                      ``malformed_results="untrusted"``, kept as an *unparsed observation*: trust 0.0 and
                      ``attributes["unparsed"]`` = why, so nothing derived from it gets any path trust.
``<run>/msg<k>``      source: the **user** message at ``k`` (non-empty content): what the principal said; owner =
                      ``<run>/user``, ``attributed_to`` it, labels = the user's scope ``user:<user_id>``,
                      ``attributes["role"] = "user"``; trust :data:`USER_TRUST` (0.6): the user's word is enough for
                      a low- or medium-risk action (the gate's 0.5 rules) but not for a high or critical one (0.7,
                      0.9), which need records the environment returned; tau-bench users misremember ids and
                      claim what they do not have, and the airline policy has the agent check them with a tool.
``<run>/msg<k>/claim`` claim: an assistant text message ``k`` that is *grounded* (rule below); ``supports`` edges
                      from each grounding source; ``attributed_to`` the assistant.
``<run>/msg<k>/call<j>`` action: the ``j``-th **write** tool call of assistant message ``k`` (text = ``name(arguments)``);
                      ``attributed_to`` the assistant, ``used`` edges to the sources it depends on (rule below), and
                      the call's result source is ``generated`` by it. An action that ``used`` no source (no
                      lineage path) is flagged ``attributes["unsupported"] = True`` and counted in
                      ``IngestReport.unsupported``.

Read tool calls (``get_*``, ``search_*``, ``list_*``, ``calculate``, ``think``, ``transfer_to_human_agents``) make no
node of their own: their results are sources. Every other tool is a **write** (:data:`WRITE_TOOLS` lists the airline
domain's: book/cancel/update reservations, send_certificate); an unknown tool counts as a write (conservative).

Labelling rule
--------------
A tool result is **public** (``labels`` empty) when its tool returns no per-user data: :data:`PUBLIC_TOOLS` (flight
searches, airport list, calculator, think, transfer). Every other result (user details, reservation details, and
the results of write tools, which return the reservation or the user's certificate) carries the scope
``user:<user_id>`` of the task's user. A claim carries the union of the labels of the sources that support it (it
may repeat their content).

Grounding rule (claims)
-----------------------
From the text of an assistant message we extract *tokens*:

* identifiers: words of ``[A-Za-z0-9_]`` with at least one letter and one digit, 4+ characters
  (``HAT271``, ``credit_card_4196779``, ``NM1VX1``); matched in a source as a whole word;
* dates: ISO ``2024-05-26`` and ``May 26, 2024`` (normalised to ISO); matched as a substring;
* amounts: numbers with a ``$`` in front, or any number >= 100 (``$114``, ``7238``; dates removed first);
  matched as a whole number (``348`` also matches ``348.0``);
* capitalised words of 3+ letters (names, airport codes, reservation ids: ``Sophia``, ``ORD``, ``HATHAT``);
  matched only as a whole JSON string value (``"Sophia"``), so prose words do not match.

A source (a tool result or a user message) *supports* the claim when at least one token matches in it and the source's message comes **earlier**
in the same run; the edge records the matched tokens (``attributes["tokens"]``, sorted). An assistant message
with no supporting source makes no claim node.

Dependency rule (actions)
-------------------------
An action ``used`` every earlier source of its run (tool result or user message) that contains one of the
action's argument *values*: the string leaves of the arguments that contain a digit (flight numbers, dates,
payment ids, user ids) or are codes of 5+ capitals and digits (reservation ids such as ``IFOYYZ``), matched as
whole words; the edge records them (``attributes["values"]``).

Time: the trajectories carry **no timestamps**; a node's ``time`` is its message index in the run (a synthetic
monotone clock per run), also kept as ``attributes["message_index"]``; an edge's time is that of its later end.

Validation: a malformed file raises :class:`~lab.provenance.errors.IngestError` naming the file and the JSON
path (``[3].traj[7].tool_calls[0].function.arguments``). A file that is not valid JSON (e.g. cut short) is read
trajectory by trajectory to say where: the error names the trajectory it was reading (``[k]``, its byte
offset), the last complete one (its run id) and the byte offset, line and column of the fault. The whole
file is ingested in one :meth:`~lab.provenance.graph.ProvenanceGraph.transaction`: an error leaves the graph
as it was.

Idempotence: ingesting the same trajectories again writes nothing and says so (``IngestReport.present``,
``already_present``); a run stored in part, with the same content, gets only its missing nodes and edges
(``IngestReport.extended``: a trajectory ingested while in progress, then whole); a trajectory whose run ids
are stored with other content raises :class:`~lab.provenance.errors.ContentConflictError` naming the first
differing id and field (:func:`ingest_taubench`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from lab.provenance.errors import IngestError
from lab.provenance.graph import Edge, Node, NodeType, ProvenanceGraph, Relation
from lab.provenance.ingest._runs import IngestReport, apply, difference, verdict

__all__ = ["IngestReport", "ingest_taubench", "WRITE_TOOLS", "READ_TOOLS", "PUBLIC_TOOLS", "USER_TRUST", "claim_tokens", "match_tokens"]

#: Own trust of a user message (module docstring): above the gate's 0.5 rules for low and medium risk, below
#: its 0.7 and 0.9 rules for high and critical risk.
USER_TRUST = 0.6

#: The airline domain's write (state-changing) tools.
WRITE_TOOLS = frozenset(
    {
        "book_reservation",
        "cancel_reservation",
        "update_reservation_flights",
        "update_reservation_baggages",
        "update_reservation_passengers",
        "send_certificate",
    }
)
#: Read-only tools besides the ``get_*``, ``search_*`` and ``list_*`` families.
READ_TOOLS = frozenset({"calculate", "think", "transfer_to_human_agents"})
#: Tools whose results hold no per-user data (public sources).
PUBLIC_TOOLS = frozenset(
    {"search_direct_flight", "search_onestop_flight", "list_all_airports", "calculate", "think", "transfer_to_human_agents"}
)


def is_write_tool(name: str) -> bool:
    """True for a state-changing tool: not ``get_*``/``search_*``/``list_*`` and not in :data:`READ_TOOLS`."""
    if name in WRITE_TOOLS:
        return True
    return not (name.startswith(("get_", "search_", "list_")) or name in READ_TOOLS)


# -- tokens (grounding)

_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"]
_MONTH_RE = "|".join([m.capitalize() for m in _MONTHS] + [m[:3].capitalize() for m in _MONTHS if len(m) > 3])
_DATE_WORDS = re.compile(rf"\b({_MONTH_RE})\.? (\d{{1,2}})(?:st|nd|rd|th)?,? (\d{{4}})\b")
_ISO = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_IDENT = re.compile(r"(?<![A-Za-z0-9_])(?=[A-Za-z0-9_]*\d)(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{4,}(?![A-Za-z0-9_])")
_NUMBER = re.compile(r"(?<![\w.\-:/$])(\$\s?)?(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w\-:/]|\.\d)")
_WORD = re.compile(r"(?<![A-Za-z0-9_])[A-Z][A-Za-z]{2,}(?![A-Za-z0-9_])")


def _month(name: str) -> int:
    name = name.lower()
    return next(i for i, m in enumerate(_MONTHS, 1) if m.startswith(name))


def claim_tokens(text: str) -> set[tuple[str, str]]:
    """The ``(kind, token)`` pairs of a statement, kinds ``ident``, ``date``, ``number``, ``word`` (module docstring)."""
    tokens: set[tuple[str, str]] = set()
    for m in _DATE_WORDS.finditer(text):
        tokens.add(("date", f"{int(m.group(3)):04d}-{_month(m.group(1)):02d}-{int(m.group(2)):02d}"))
    tokens.update(("date", m.group(0)) for m in _ISO.finditer(text))
    rest = _ISO.sub(" ", _DATE_WORDS.sub(" ", text))
    tokens.update(("ident", m.group(0)) for m in _IDENT.finditer(rest))
    for m in _NUMBER.finditer(rest):
        value = float(m.group(2).replace(",", "") + (m.group(3) or ""))
        if m.group(1) or value >= 100:
            tokens.add(("number", str(int(value)) if value == int(value) else repr(value)))
    tokens.update(("word", m.group(0)) for m in _WORD.finditer(rest))
    return tokens


@lru_cache(maxsize=65536)
def _matcher(kind: str, token: str) -> re.Pattern[str]:
    t = re.escape(token)
    if kind == "ident":
        return re.compile(rf"(?<![A-Za-z0-9_]){t}(?![A-Za-z0-9_])")
    if kind == "number":
        return re.compile(rf"(?<![\w.\-]){t}(?:\.0+)?(?![\w\-]|\.\d)")
    if kind == "word":
        return re.compile(rf'"{t}"')
    return re.compile(t)  # date


def match_tokens(tokens: Iterable[tuple[str, str]], content: str) -> list[str]:
    """The tokens that occur in ``content`` under their kind's matching rule, sorted."""
    return sorted({tok for kind, tok in tokens if _matcher(kind, tok).search(content)})


_CODE = re.compile(r"[A-Z0-9]{5,}")


def _digit_strings(value: Any) -> set[str]:
    """String leaves of a JSON value that identify something: 3+ characters with a digit, or a code of 5+
    capitals and digits (reservation ids such as ``IFOYYZ`` have no digit)."""
    if isinstance(value, str):
        return {value} if (any(c.isdigit() for c in value) and len(value) >= 3) or _CODE.fullmatch(value) else set()
    if isinstance(value, dict):
        return set().union(*(_digit_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_digit_strings(v) for v in value)) if value else set()
    return set()


def _word_in(value: str, content: str) -> bool:
    return _matcher("ident", value).search(content) is not None


# -- ingest

_ROLES = {"system", "user", "assistant", "tool"}


def _load(path: str | Path, file: str) -> Any:
    """The JSON document in ``path``; :class:`IngestError` naming the file, line and column when it is not JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise IngestError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", file=file) from None
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", file=file) from None


def _run_id(t: Any, domain: str) -> str | None:
    if isinstance(t, dict) and isinstance(t.get("task_id"), int | str):
        return f"tau-{domain}/task{t['task_id']}/trial{t.get('trial', 0)}"
    return None


def _load_trajectories(path: str | Path, file: str, domain: str) -> Any:
    """The JSON document in ``path``. When it is not valid JSON, the top-level list is read again element by
    element (:meth:`json.JSONDecoder.raw_decode`) so that the :class:`IngestError` names the trajectory being read
    (``[k]`` and the byte where it starts), the last complete one and its run id, and the byte offset, line and
    column of the fault (a file cut short, a missing comma)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", file=file) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as whole:
        fault = whole
    decoder, ws = json.JSONDecoder(), re.compile(r"[ \t\n\r]*")

    def at(pos: int) -> str:
        line = text.count("\n", 0, pos) + 1
        return f"byte {len(text[:pos].encode('utf-8'))}, line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"

    def fault_at(exc: json.JSONDecodeError) -> str:  # "Unterminated string starting at byte ..."
        return f"{exc.msg} {at(exc.pos)}" if exc.msg.endswith(" at") else f"{exc.msg} at {at(exc.pos)}"

    pos = ws.match(text).end()
    if not text.startswith("[", pos):
        raise IngestError(f"not valid JSON: {fault_at(fault)}", file=file)
    pos = ws.match(text, pos + 1).end()
    k, last = 0, None
    while True:
        after = f"the last complete trajectory is [{k - 1}] ({last or 'no run id'})" if k else "no trajectory is complete"
        if text.startswith("]", pos):  # the list closed: the fault is after it
            raise IngestError(f"not valid JSON after the list of {k} trajectories: {fault_at(fault)}", file=file)
        if pos >= len(text):
            raise IngestError(f"the file ends before the list of trajectories is closed (cut short?); {after}, ending before {at(pos)}", file=file)
        try:
            t, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise IngestError(
                f"not valid JSON in trajectory [{k}] (it starts at {at(pos)}; {after}): {fault_at(exc)}", file=file, path=f"[{k}]"
            ) from None
        k, last = k + 1, _run_id(t, domain)
        pos = ws.match(text, end).end()
        if text.startswith(",", pos):
            pos = ws.match(text, pos + 1).end()
        elif not text.startswith("]", pos):
            after = f"the last complete trajectory is [{k - 1}] ({last or 'no run id'})"
            if pos >= len(text):
                raise IngestError(f"the file ends before the list of trajectories is closed (cut short?); {after}, ending before {at(pos)}", file=file)
            raise IngestError(f"not valid JSON after trajectory [{k - 1}]: expected ',' or ']' at {at(pos)}; {after}", file=file, path=f"[{k}]")


def ingest_taubench(
    graph: ProvenanceGraph,
    path: str | Path | None = None,
    *,
    runs: Sequence[int] | None = None,
    domain: str = "airline",
    progress: bool = False,
    malformed_results: Literal["refuse", "untrusted"] = "refuse",
    user_trust: float = USER_TRUST,
) -> IngestReport:
    """Ingest tau-bench trajectories into ``graph``, all or nothing (see the module docstring for the rules).

    Parameters
    ----------
    graph : ProvenanceGraph
    path : str or Path, optional
        The trajectories file; default ``data.fetch(f"tau_bench_{domain}_trajectories")``.
    runs : sequence of int, optional
        Indices of the trajectories to ingest (default: all), in the order given.
    domain : str
        Part of the run ids (``tau-<domain>/task<id>/trial<n>``).
    progress : bool, default False
        Show a tqdm bar over the trajectories (the 200-run file takes several seconds).
    malformed_results : {"refuse", "untrusted"}, default "refuse"
        A tool result that looks like JSON but does not parse (cut, corrupted): ``"refuse"`` raises
        :class:`IngestError` (nothing is written); ``"untrusted"`` stores it as an unparsed observation with
        trust 0.0 and ``attributes["unparsed"]`` saying why, never as a trusted source.
    user_trust : float in [0, 1], default :data:`USER_TRUST`
        Own trust of the user-message sources.

    Returns
    -------
    IngestReport
        Each run counted once: written from scratch (``runs``, ``run_ids``), extended (``extended``,
        ``extended_ids``: stored in part, its missing nodes and edges written) or found stored (``present``,
        ``present_ids``); the nodes by type and the edges actually added; ``already_present`` when nothing at all
        was written and some run was found stored; ``unsupported``: the actions written without any lineage
        path (flagged ``attributes["unsupported"]``).

    Re-ingesting is a no-op, and completes a run stored in part: the unit is the **run** (one trajectory). Each
    planned node and edge of a run is compared with the graph (a node with the version it was created as:
    grants, revocations and other later versions do not count). A run the graph holds whole, each node and edge
    exactly as planned, is skipped (``present``); a run none of whose nodes and edges is stored is written
    (``runs``); a run the graph holds in part, each stored node and edge exactly as planned, gets exactly the
    missing ones, nodes before edges in the run's order (``extended``: e.g. a trajectory ingested while in
    progress, then whole). A stored node or edge with other content is a conflict.

    Raises
    ------
    IngestError
        A malformed file, naming the file and the JSON path of the bad field (``[2].traj[5].content`` for a tool
        result that looks like JSON and does not parse, with its run id and message index; for a file that is
        not JSON, the trajectory being read, the last complete one and the byte offset); the graph is left
        unchanged.
    ContentConflictError
        (a :class:`~lab.provenance.errors.DuplicateNodeError`) A run stored already with other content: ``id`` and
        ``field`` name the first differing node or edge and field, ``stored`` and ``given`` the two values, ``run``
        the run. Nothing of the whole call is written (no run, not even those before it): the graph is left unchanged.
    """
    if path is None:
        from lab import data

        path = data.fetch(f"tau_bench_{domain}_trajectories")
    file = str(path)
    if malformed_results not in ("refuse", "untrusted"):
        raise ValueError(f"malformed_results must be 'refuse' or 'untrusted', got {malformed_results!r}")
    if not 0.0 <= user_trust <= 1.0:
        raise ValueError(f"user_trust must be in [0, 1], got {user_trust!r}")
    doc = _load_trajectories(path, file, domain)
    if not isinstance(doc, list):
        raise IngestError(f"expected a JSON list of trajectories, got {type(doc).__name__}", file=file)
    indices = range(len(doc)) if runs is None else list(runs)
    report = IngestReport()
    if progress:
        from tqdm.auto import tqdm

        indices = tqdm(indices, desc="ingesting trajectories", unit="run")
    with graph.transaction():
        for i in indices:
            if not isinstance(i, int) or not 0 <= i < len(doc):
                raise IngestError(f"run index {i!r} out of range (the file holds {len(doc)} trajectories)", file=file)
            nodes, edges, run = _trajectory(doc[i], i, file, domain, malformed_results, user_trust)
            writes = [*nodes, *edges]
            v = verdict((difference(graph, w) for w in writes), run, file)
            written = [writes[k] for k in v.missing]
            for w in written:
                apply(graph, w)
            report._count(run, v.status, written)
    return report


def _trajectory(t: Any, i: int, file: str, domain: str, malformed: str = "refuse", user_trust: float = USER_TRUST) -> tuple[list[Node], list[Edge], str]:
    """Validate one trajectory and build its nodes and edges (nothing is written here)."""
    p = f"[{i}]"

    def err(reason: str, where: str) -> IngestError:
        return IngestError(reason, file=file, path=where)

    if not isinstance(t, dict):
        raise err(f"expected an object, got {type(t).__name__}", p)
    if "traj" not in t:
        raise err("missing 'traj'", f"{p}.traj")
    traj = t["traj"]
    if not isinstance(traj, list):
        raise err(f"'traj' must be a list, got {type(traj).__name__}", f"{p}.traj")
    task_id = t.get("task_id")
    if not isinstance(task_id, int | str) or isinstance(task_id, bool):
        raise err("missing or invalid 'task_id'", f"{p}.task_id")
    trial = t.get("trial", 0)
    if not isinstance(trial, int | str) or isinstance(trial, bool):
        raise err("invalid 'trial'", f"{p}.trial")
    task = (t.get("info") or {}).get("task") if isinstance(t.get("info"), dict) else None
    user_id = task.get("user_id") if isinstance(task, dict) else None
    if not isinstance(user_id, str) or not user_id:
        raise err("missing 'user_id' of the task", f"{p}.info.task.user_id")

    run = f"tau-{domain}/task{task_id}/trial{trial}"
    agent, user = f"{run}/agent", f"{run}/user"
    scope = frozenset({f"user:{user_id}"})
    nodes = [
        Node(id=agent, type=NodeType.AGENT, text="assistant", run=run, attributes={"role": "assistant"}),
        Node(id=user, type=NodeType.AGENT, text=user_id, run=run, attributes={"role": "user", "user_id": user_id}),
    ]
    edges = [Edge(src=agent, dst=user, relation=Relation.ACTED_ON_BEHALF_OF, time=0.0)]
    calls: dict[str, tuple[int, str, dict, str | None]] = {}  # call id -> (message index, tool name, arguments, action id)
    sources: list[tuple[str, str, frozenset[str], int]] = []  # (node id, content, labels, index), in message order

    for k, m in enumerate(traj):
        mp = f"{p}.traj[{k}]"
        if not isinstance(m, dict):
            raise err(f"expected a message object, got {type(m).__name__}", mp)
        if "role" not in m:
            raise err("message without 'role'", f"{mp}.role")
        role = m["role"]
        if role not in _ROLES:
            raise err(f"unknown role {role!r} (expected one of {sorted(_ROLES)})", f"{mp}.role")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise err(f"'content' must be a string or null, got {type(content).__name__}", f"{mp}.content")

        if role == "assistant":
            tool_calls = m.get("tool_calls") or []
            if not isinstance(tool_calls, list):
                raise err("'tool_calls' must be a list", f"{mp}.tool_calls")
            for j, call in enumerate(tool_calls):
                cp = f"{mp}.tool_calls[{j}]"
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    raise err("tool call without a 'function' object", f"{cp}.function")
                call_id = call.get("id")
                if not isinstance(call_id, str) or not call_id:
                    raise err("tool call without an 'id'", f"{cp}.id")
                name = fn.get("name")
                if not isinstance(name, str) or not name:
                    raise err("tool call without a function name", f"{cp}.function.name")
                raw = fn.get("arguments")
                if not isinstance(raw, str):
                    raise err(f"function.arguments must be a JSON string, got {type(raw).__name__}", f"{cp}.function.arguments")
                try:
                    args = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise err(f"function.arguments is not valid JSON: {exc.msg} (char {exc.pos})", f"{cp}.function.arguments") from None
                if not isinstance(args, dict):
                    raise err(f"function.arguments must be a JSON object, got {type(args).__name__}", f"{cp}.function.arguments")
                action = None
                if is_write_tool(name):
                    action = f"{run}/msg{k}/call{j}"
                    values = _digit_strings(args)
                    used = []
                    for sid, scontent, _, si in sources:
                        hit = sorted(v for v in values if _word_in(v, scontent))
                        if hit:
                            used.append(Edge(src=action, dst=sid, relation=Relation.USED, time=float(k), attributes={"values": hit}))
                    attrs = {"tool": name, "call_id": call_id, "arguments": args, "message_index": k, "write": True}
                    if not used:
                        attrs["unsupported"] = True  # no lineage path: no earlier tool result or user message holds its arguments
                    nodes.append(
                        Node(
                            id=action,
                            type=NodeType.ACTION,
                            text=f"{name}({json.dumps(args, sort_keys=True, separators=(',', ':'))})",
                            time=float(k),
                            owner=agent,
                            run=run,
                            attributes=attrs,
                        )
                    )
                    edges.append(Edge(src=action, dst=agent, relation=Relation.ATTRIBUTED_TO, time=float(k)))
                    edges.extend(used)
                calls[call_id] = (k, name, args, action)
            if content and content.strip():
                tokens = claim_tokens(content)
                support = [(sid, labels, match_tokens(tokens, sc)) for sid, sc, labels, _ in sources] if tokens else []
                support = [s for s in support if s[2]]
                if support:
                    claim = f"{run}/msg{k}/claim"
                    nodes.append(
                        Node(
                            id=claim,
                            type=NodeType.CLAIM,
                            text=content,
                            time=float(k),
                            owner=agent,
                            labels=frozenset().union(*(labels for _, labels, _ in support)),
                            run=run,
                            attributes={"message_index": k},
                        )
                    )
                    edges.append(Edge(src=claim, dst=agent, relation=Relation.ATTRIBUTED_TO, time=float(k)))
                    edges.extend(Edge(src=sid, dst=claim, relation=Relation.SUPPORTS, time=float(k), attributes={"tokens": toks}) for sid, _, toks in support)

        elif role == "user" and content and content.strip():  # what the principal said: a source owned by the user
            sid = f"{run}/msg{k}"
            nodes.append(
                Node(id=sid, type=NodeType.SOURCE, text=content, time=float(k), owner=user, labels=scope, trust=user_trust, run=run,
                     attributes={"role": "user", "message_index": k})
            )
            edges.append(Edge(src=sid, dst=user, relation=Relation.ATTRIBUTED_TO, time=float(k)))
            sources.append((sid, content, scope, k))

        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise err("tool message without 'tool_call_id'", f"{mp}.tool_call_id")
            if call_id not in calls:
                raise err(f"tool_call_id {call_id!r} matches no earlier tool call", f"{mp}.tool_call_id")
            _, name, args, action = calls[call_id]
            if m.get("name") is not None and m["name"] != name:
                raise err(f"tool message name {m['name']!r} differs from its call's function name {name!r}", f"{mp}.name")
            text = content or ""
            labels = frozenset() if name in PUBLIC_TOOLS else scope
            sid = f"{run}/msg{k}"
            attrs = {"tool": name, "call_id": call_id, "arguments": args, "message_index": k}
            trust = 1.0
            if text.lstrip()[:1] in ("{", "["):  # it claims to be JSON: it must parse
                try:
                    json.loads(text)
                except json.JSONDecodeError as exc:
                    why = f"looks like JSON but does not parse: {exc.msg}{'' if exc.msg.endswith(' at') else ' at'} char {exc.pos} of {len(text)}"
                    if malformed == "refuse":
                        raise err(
                            f"tool result of {name!r} (run {run!r}, message {k}) {why}: a cut or corrupted result is never "
                            f"stored as a trusted source (malformed_results='untrusted' keeps it as an unparsed observation with trust 0)",
                            f"{mp}.content",
                        ) from None
                    attrs["unparsed"], trust = why, 0.0
            nodes.append(
                Node(id=sid, type=NodeType.SOURCE, text=text, time=float(k), owner=agent, labels=labels, trust=trust, run=run, attributes=attrs)
            )
            if action is not None:
                edges.append(Edge(src=action, dst=sid, relation=Relation.GENERATED, time=float(k)))
            sources.append((sid, text, labels, k))
    return nodes, edges, run
