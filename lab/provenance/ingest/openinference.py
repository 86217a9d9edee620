"""Ingest OpenInference / OpenTelemetry GenAI spans (JSON) into a :class:`~lab.provenance.graph.ProvenanceGraph`.

Input: a JSON list of spans (or ``{"spans": [...]}``), each ``{span_id | context.span_id, parent_id |
parent_span_id, name, start_time, attributes}`` with the trace id in ``trace_id`` or ``context.trace_id``.
``attributes`` may be flat dotted keys (``retrieval.documents.0.document.id``) or nested objects/lists; they are
flattened to dotted keys, and error paths use them (``[2].attributes.retrieval.documents.0.document.id``).
``start_time``: ISO 8601 (UTC when naive), epoch seconds, or epoch nanoseconds (OTLP ``*UnixNano``).

Span kind: ``openinference.span.kind``, else from ``gen_ai.operation.name`` (``invoke_agent``/``create_agent``
-> AGENT, ``execute_tool`` -> TOOL, ``retrieval`` -> RETRIEVER, ``chat``/``text_completion``/``generate_content``
-> LLM); the memory operations (``search_memory``, ``update_memory``, ``delete_memory``) take precedence.
Other kinds (CHAIN, EMBEDDING, ...) add no node but still count as ancestors. The run id is the trace id
(``"otel"`` when absent); node ids are ``<run>/<span_id>...``. The span's **agent** is its nearest AGENT
ancestor (itself for an agent span); every record and action is owned by and ``attributed_to`` it.

Mapping
-------
* AGENT -> agent ``<run>/<span_id>`` (text: ``gen_ai.agent.name``, ``graph.node.id`` or the span name);
  a nested agent ``acted_on_behalf_of`` its parent agent.
* TOOL -> a **write** when ``tool.write`` is true (``true`` or ``"true"``; the conventions carry no
  read/write flag, so the trace producer marks writes): an action ``<run>/<span_id>`` (text
  ``name(input.value)``) that ``used`` the records it consumed, and its ``output.value``, if any, a source
  ``<run>/<span_id>/output`` ``generated`` by it. A read tool: only the source of its output.
* RETRIEVER -> a source ``<run>/<span_id>/doc<i>`` per ``retrieval.documents.<i>.document`` (``id`` and
  ``content`` required, ``score`` optional and numeric).
* ``update_memory`` -> memory ``<run>/memory/<gen_ai.memory.record.id>`` with text ``input.value``,
  ``derived_from`` the records it consumed (a second update of a record writes a new version);
  ``search_memory`` -> the memory record it returned (``output.value``), created if new, made available to
  later spans; ``delete_memory`` -> the memory is invalidated.
* LLM -> a claim ``<run>/<span_id>/claim`` (text ``output.value``) when it consumed at least one record,
  ``supported`` by each; an ungrounded LLM output makes no node.

Consumption rule: a span *consumed* a record produced by a span that started **earlier** in the same trace when
the span's input (``input.value`` plus ``llm.input_messages.*.message.content``) contains the record's text
verbatim, contains its external id (document id, memory record id), or shares an identifier token with it
(letters and digits, 4+ characters, as in :mod:`lab.provenance.ingest.taubench`); the edge records why
(``attributes["match"]``: ``"text"``, ``"id"`` or the shared tokens).

All spans of a file are written in one transaction; a malformed span raises
:class:`~lab.provenance.errors.IngestError` and leaves the graph unchanged. Ingesting the same export again
writes nothing and says so (``IngestReport.present``); ingesting it again after it has grown (a live trace
re-exported: the same spans and new ones) writes only what the new spans add (``IngestReport.extended``); a run
stored with other content raises :class:`~lab.provenance.errors.ContentConflictError` (:func:`ingest_spans`).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.provenance.errors import IngestError
from lab.provenance.graph import Edge, Node, NodeType, ProvenanceGraph, Relation
from lab.provenance.ingest._runs import IngestReport, Verdict, Version, Write, apply, difference, verdict
from lab.provenance.ingest.taubench import _load

__all__ = ["ingest_spans"]

_GENAI_KIND = {
    "invoke_agent": "AGENT",
    "create_agent": "AGENT",
    "execute_tool": "TOOL",
    "retrieval": "RETRIEVER",
    "chat": "LLM",
    "text_completion": "LLM",
    "generate_content": "LLM",
}
_MEMORY_OPS = {"search_memory", "update_memory", "delete_memory"}
_IDENT = re.compile(r"(?<![A-Za-z0-9_])(?=[A-Za-z0-9_]*\d)(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{4,}(?![A-Za-z0-9_])")


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and prefix.startswith(("retrieval.documents", "llm.input_messages", "llm.output_messages")):
        for k, v in enumerate(value):
            _flatten(v, f"{prefix}.{k}", out)
    else:
        out[prefix] = value
    return out


def _time(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value / 1e9 if value > 1e12 else float(value)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    return None


def _input_text(attrs: dict[str, Any]) -> str:
    parts = [attrs.get("input.value")]
    parts += [v for k, v in sorted(attrs.items()) if k.startswith("llm.input_messages.") and k.endswith(".message.content")]
    return "\n".join(str(p) for p in parts if p is not None)


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def ingest_spans(graph: ProvenanceGraph, spans_or_path: list[dict] | str | Path) -> IngestReport:
    """Ingest a span export (a list of span dicts, or a JSON file) into ``graph``, all or nothing.

    Returns
    -------
    IngestReport
        Each run (trace id) counted once: written from scratch (``runs``, ``run_ids``), extended (``extended``,
        ``extended_ids``: stored in part, its missing writes written), found stored (``present``,
        ``present_ids``) or with nothing to write (``empty``, ``empty_ids``: e.g. CHAIN spans only); what was
        actually added: nodes by type (``memories`` counts new memory records; re-versioned ones are not new),
        ``versions`` (memory updates and deletes) and ``edges``; ``already_present`` when nothing at all was
        written and some run was found stored.

    Re-ingesting is a no-op, and a grown export adds only what is new: the unit is the **run** (a trace id; its
    spans in this export). Each planned write of a run is compared with the graph: each node as it was created,
    each edge, and each memory update or delete as the version it wrote, found by its reason
    (``update_memory span <span_id>``). A run the graph holds whole, each write exactly as planned, is skipped
    (``present``); a run none of whose writes is stored is written (``runs``); a run the graph holds in part,
    each stored write exactly as planned, gets exactly the missing writes, in the planned order (nodes before
    their edges and versions; ``extended``: a live trace re-exported with new spans, e.g. a new
    ``update_memory``, whose version is written after the stored ones). A stored write with other content is a
    conflict. Memory records of the same trace stored by an earlier ingest of *other* spans are updated,
    searched and deleted as before.

    Raises
    ------
    IngestError
        A malformed span, with the file (``<spans>`` for an in-memory list) and the path of the bad field.
    ContentConflictError
        (a :class:`~lab.provenance.errors.DuplicateNodeError`) A run stored already with other content: ``id`` and
        ``field`` name the first differing node, edge or memory version and field, ``stored`` and ``given`` the
        two values, ``run`` the run. Nothing of the whole call is written (no run of the export): the graph is
        unchanged.
    """
    if isinstance(spans_or_path, str | Path):
        file = str(spans_or_path)
        doc = _load(spans_or_path, file)
    else:
        file, doc = "<spans>", spans_or_path
    if isinstance(doc, dict) and isinstance(doc.get("spans"), list):
        doc = doc["spans"]
    if not isinstance(doc, list):
        raise IngestError(f"expected a JSON list of spans, got {type(doc).__name__}", file=file)

    def err(reason: str, where: str) -> IngestError:
        return IngestError(reason, file=file, path=where)

    # -- validate and normalise every span first
    spans: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(doc):
        p = f"[{i}]"
        if not isinstance(s, dict):
            raise err(f"expected a span object, got {type(s).__name__}", p)
        ctx = s.get("context") if isinstance(s.get("context"), dict) else {}
        sid = s.get("span_id", ctx.get("span_id"))
        if not isinstance(sid, str) or not sid:
            raise err("span without a 'span_id'", f"{p}.span_id")
        if sid in seen:
            raise err(f"duplicate span_id {sid!r} (first at [{seen[sid]}])", f"{p}.span_id")
        seen[sid] = i
        parent = s.get("parent_id", s.get("parent_span_id"))
        if parent is not None and not isinstance(parent, str):
            raise err("parent id must be a string or null", f"{p}.parent_id")
        start = _time(s.get("start_time"))
        if start is None:
            raise err(f"missing or unreadable 'start_time' {s.get('start_time')!r}", f"{p}.start_time")
        raw = s.get("attributes", {})
        if not isinstance(raw, dict):
            raise err(f"'attributes' must be an object, got {type(raw).__name__}", f"{p}.attributes")
        attrs = _flatten(raw, "", {})
        op = attrs.get("gen_ai.operation.name")
        kind = "MEMORY" if op in _MEMORY_OPS else str(attrs.get("openinference.span.kind") or _GENAI_KIND.get(op, "")).upper()
        run = str(s.get("trace_id", ctx.get("trace_id")) or "otel")
        spans.append({"i": i, "id": sid, "parent": parent, "start": start, "attrs": attrs, "kind": kind, "op": op, "run": run, "name": s.get("name") or sid})

    by_id = {s["id"]: s for s in spans}

    def agent_of(s: dict) -> str | None:
        cur, hops = s, 0
        while cur is not None and hops <= len(spans):
            if cur["kind"] == "AGENT":
                return f"{cur['run']}/{cur['id']}"
            cur, hops = by_id.get(cur["parent"]), hops + 1
        return None

    # -- plan every write (nothing is written until each run is known to be new, stored, stored in part, or a conflict)
    run_spans: dict[str, set[str]] = {}
    for s in spans:
        run_spans.setdefault(s["run"], set()).add(s["id"])
    plan: dict[str, list[Write]] = {}  # per run, in write order
    order: list[tuple[str, int]] = []  # (run, index in plan[run]) in the order the spans write them
    created: set[str] = set()  # node ids the plan creates
    edge_keys: set[str] = set()

    def write(run: str, w: Write) -> None:
        if isinstance(w, Edge):
            if w.key in edge_keys:
                return  # the graph keeps one edge per src, dst and relation: the first
            edge_keys.add(w.key)
        elif isinstance(w, Node):
            created.add(w.id)
        order.append((run, len(plan.setdefault(run, []))))
        plan[run].append(w)

    def exists(mid: str, run: str) -> bool:
        """Whether memory ``mid`` exists before this span: created earlier in this file, or stored by an earlier
        ingest of *other* spans (one this file created itself is planned again, to be recognised as stored)."""
        if mid in created:
            return True
        return mid in graph and graph.history(mid)[0][2].attributes.get("span_id") not in run_spans[run]

    report = IngestReport()
    with graph.transaction():  # one snapshot for the plan (it reads stored memories) and the writes
        runs: list[str] = []
        # records available for consumption, per run: (node id, text, external id or None, start)
        records: dict[str, list[tuple[str, str, str | None]]] = {}
        for s in sorted(spans, key=lambda s: (s["start"], s["i"])):
            a, p, run, t = s["attrs"], f"[{s['i']}].attributes", s["run"], s["start"]
            if run not in runs:
                runs.append(run)
            agent = None if s["kind"] == "AGENT" else agent_of(s)
            made: list[tuple[str, str, str | None]] = []
            nodes: list[Node] = []
            edges: list[Edge] = []

            def record(node: Node, ext: str | None = None) -> None:
                nodes.append(node)
                if agent is not None:
                    edges.append(Edge(src=node.id, dst=agent, relation=Relation.ATTRIBUTED_TO, time=t))
                made.append((node.id, node.text, ext))

            def consumed() -> list[tuple[str, dict]]:
                text = _input_text(a)
                if not text:
                    return []
                toks = set(_IDENT.findall(text))
                out = []
                for rid, rtext, ext in records.get(run, []):
                    if rtext.strip() and rtext.strip() in text:
                        out.append((rid, {"match": "text"}))
                    elif ext and ext in text:
                        out.append((rid, {"match": "id"}))
                    elif shared := sorted(toks & set(_IDENT.findall(rtext))):
                        out.append((rid, {"match": shared}))
                return out

            kind = s["kind"]
            base = {"span_id": s["id"], "span_name": s["name"]}
            if kind == "AGENT":
                aid = f"{run}/{s['id']}"
                name = a.get("gen_ai.agent.name") or a.get("graph.node.id") or s["name"]
                nodes.append(Node(id=aid, type=NodeType.AGENT, text=str(name), time=t, run=run, attributes={**base, "agent_id": a.get("gen_ai.agent.id")}))
                boss = agent_of(by_id[s["parent"]]) if s["parent"] in by_id else None
                if boss is not None:
                    edges.append(Edge(src=aid, dst=boss, relation=Relation.ACTED_ON_BEHALF_OF, time=t))
            elif kind == "TOOL":
                name = a.get("tool.name", a.get("gen_ai.tool.name"))
                if not isinstance(name, str) or not name:
                    raise err("tool span without 'tool.name' or 'gen_ai.tool.name'", f"{p}.tool.name")
                call_id = a.get("gen_ai.tool.call.id")
                inp, out = a.get("input.value"), a.get("output.value")
                attrs = {**base, "tool": name, "call_id": call_id, "input": inp}
                action = None
                if _truthy(a.get("tool.write")):
                    action = f"{run}/{s['id']}"
                    nodes.append(Node(id=action, type=NodeType.ACTION, text=f"{name}({inp if inp is not None else ''})", time=t, owner=agent, run=run, attributes={**attrs, "write": True}))
                    if agent is not None:
                        edges.append(Edge(src=action, dst=agent, relation=Relation.ATTRIBUTED_TO, time=t))
                    edges += [Edge(src=action, dst=rid, relation=Relation.USED, time=t, attributes=why) for rid, why in consumed()]
                if out is not None:
                    src = f"{run}/{s['id']}/output"
                    record(Node(id=src, type=NodeType.SOURCE, text=str(out), time=t, owner=agent, run=run, attributes=attrs), call_id)
                    if action is not None:
                        edges.append(Edge(src=action, dst=src, relation=Relation.GENERATED, time=t))
            elif kind == "RETRIEVER":
                idx = sorted({int(k.split(".")[2]) for k in a if re.fullmatch(r"retrieval\.documents\.\d+\.document\..+", k)})
                for d in idx:
                    dp = f"retrieval.documents.{d}.document"
                    doc_id, content, score = a.get(f"{dp}.id"), a.get(f"{dp}.content"), a.get(f"{dp}.score")
                    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or doc_id == "":
                        raise err("retrieved document without an id", f"{p}.{dp}.id")
                    if not isinstance(content, str):
                        raise err("retrieved document without a string content", f"{p}.{dp}.content")
                    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
                        raise err(f"document score must be a number, got {score!r}", f"{p}.{dp}.score")
                    meta = {k[len(dp) + 10 :]: v for k, v in a.items() if k.startswith(f"{dp}.metadata.")}
                    record(
                        Node(id=f"{run}/{s['id']}/doc{d}", type=NodeType.SOURCE, text=content, time=t, owner=agent, run=run,
                             attributes={**base, "document_id": str(doc_id), "score": score, "query": a.get("input.value"), "metadata": meta}),
                        str(doc_id),
                    )
            elif kind == "MEMORY":
                rec = a.get("gen_ai.memory.record.id")
                if not isinstance(rec, str) or not rec:
                    raise err(f"{s['op']} span without 'gen_ai.memory.record.id'", f"{p}.gen_ai.memory.record.id")
                mid = f"{run}/memory/{rec}"
                attrs = {**base, "record_id": rec, "store_id": a.get("gen_ai.memory.store.id"), "operation": s["op"]}
                if s["op"] == "delete_memory":
                    if not exists(mid, run):
                        raise err(f"delete_memory of unknown record {rec!r}", f"{p}.gen_ai.memory.record.id")
                    write(run, Version(mid, f"delete_memory span {s['id']}", {"valid": False}))  # ProvenanceGraph.invalidate
                else:
                    text = a.get("input.value") if s["op"] == "update_memory" else a.get("output.value")
                    if not isinstance(text, str):
                        key = "input.value" if s["op"] == "update_memory" else "output.value"
                        raise err(f"{s['op']} span without a string '{key}'", f"{p}.{key}")
                    if exists(mid, run):
                        if s["op"] == "update_memory":
                            write(run, Version(mid, f"update_memory span {s['id']}", {"text": text, "time": t}))
                        made.append((mid, text, rec))
                    else:
                        record(Node(id=mid, type=NodeType.MEMORY, text=text, time=t, owner=agent, run=run, attributes=attrs), rec)
                    if s["op"] == "update_memory":
                        edges += [Edge(src=mid, dst=rid, relation=Relation.DERIVED_FROM, time=t, attributes=why) for rid, why in consumed() if rid != mid]
            elif kind == "LLM":
                out = a.get("output.value")
                if out is None:
                    out = next((v for k, v in sorted(a.items()) if k.startswith("llm.output_messages.") and k.endswith(".message.content")), None)
                support = consumed() if isinstance(out, str) and out.strip() else []
                if support:
                    cid = f"{run}/{s['id']}/claim"
                    record(Node(id=cid, type=NodeType.CLAIM, text=out, time=t, owner=agent, run=run, attributes={**base, "model": a.get("llm.model_name", a.get("gen_ai.request.model"))}))
                    edges += [Edge(src=rid, dst=cid, relation=Relation.SUPPORTS, time=t, attributes=why) for rid, why in support]

            for w in (*nodes, *edges):
                write(run, w)
            records.setdefault(run, []).extend(made)

        # -- each run: stored (skip it), new (write it), stored in part (write the rest) or a conflict (raise: nothing is written)
        verdicts: dict[str, Verdict] = {run: verdict((difference(graph, w) for w in plan.get(run, [])), run, file) for run in runs}
        todo = {(run, k) for run, v in verdicts.items() for k in v.missing}
        for run, k in order:  # in the planned order, across runs too (an edge may end at another run's agent)
            if (run, k) in todo:
                apply(graph, plan[run][k])
        for run, v in verdicts.items():
            report._count(run, v.status, [plan[run][k] for k in v.missing])
    return report
