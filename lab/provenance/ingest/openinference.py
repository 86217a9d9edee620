"""Ingest OpenInference / OpenTelemetry GenAI spans (JSON) into a :class:`~lab.provenance.graph.ProvenanceGraph`.

Input, in any of three forms:

* **OTLP JSON**, as OpenTelemetry and OpenInference exporters write it (the OTLP/HTTP JSON body, the Collector's
  file exporter, ``google.protobuf.json_format`` of an ``ExportTraceServiceRequest``):
  ``{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"scope": {...}, "spans": [...]}]}]}``,
  each span ``{traceId, spanId, parentSpanId, name, kind, startTimeUnixNano, endTimeUnixNano, attributes,
  status}`` with attributes as ``[{"key": k, "value": {"stringValue" | "intValue" | "doubleValue" | "boolValue"
  | "arrayValue" | "kvlistValue" | "bytesValue": ...}}]``; ids in hex (the OTLP/JSON rule) or base64 (protobuf's
  JSON mapping), 64-bit integers as decimal strings. Error paths start at the span
  (``resourceSpans[0].scopeSpans[0].spans[3].attributes.retrieval.documents.0.document.id``).
* **OTLP protobuf** (a binary ``TracesData`` / ``ExportTraceServiceRequest``, as the OTLP/HTTP exporter sends it;
  read with ``opentelemetry-proto``): a file whose first byte is not ``{`` or ``[``, or ``bytes``.
* A **flat span list** (Phoenix-style; or ``{"spans": [...]}``), each ``{span_id | context.span_id, parent_id |
  parent_span_id, name, start_time, end_time, attributes}`` with the trace id in ``trace_id`` or
  ``context.trace_id``; ``attributes`` flat dotted keys or nested objects/lists, flattened to dotted keys; error
  paths ``[2].attributes.retrieval.documents.0.document.id``. ``start_time``: ISO 8601 (UTC when naive), epoch
  seconds, or epoch nanoseconds.

Attributes the mapping below does not turn into node fields or other nodes are **kept** on every node the span
makes, in ``attributes["span_attributes"]`` (``session.id``, ``user.id``, ``llm.token_count.*``,
``tool.description``, ``tag.tags``, ``llm.model_name``, custom ones...; OTLP resource attributes such as
``service.name`` in ``attributes["resource"]``, the span's status in ``attributes["status"]``). Attributes the
conventions define as JSON strings (``metadata``, ``llm.invocation_parameters``, ``tool.parameters``, and each
document's ``metadata``) are parsed; one that does not parse is refused, naming its path.

Span kind: ``openinference.span.kind``, else from ``gen_ai.operation.name`` (``invoke_agent``/``create_agent``
-> AGENT, ``execute_tool`` -> TOOL, ``retrieval`` -> RETRIEVER, ``chat``/``text_completion``/``generate_content``
-> LLM); the memory operations (``search_memory``, ``update_memory``, ``delete_memory``) take precedence.
Every OpenInference span kind (LLM, CHAIN, TOOL, RETRIEVER, EMBEDDING, RERANKER, GUARDRAIL, EVALUATOR, AGENT,
PROMPT, DECISION, UNKNOWN) maps to a node type below or is kept as a **generic step**; no span is dropped. The
run id is the trace id (``"otel"`` when absent); node ids are ``<run>/<span_id>...``. The span's **agent** is its
nearest AGENT ancestor (itself for an agent span); every record and action is owned by and ``attributed_to`` it.

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
  ``supported`` by each; an ungrounded LLM call is a generic step (it is no evidence of anything).
* RERANKER -> a source ``<run>/<span_id>/doc<i>`` per ``reranker.output_documents.<i>.document`` (id, content,
  score as for a retriever), ``derived_from`` each earlier record of the run with the same document id (the
  document as first retrieved); a reranker without output documents is a generic step.
* CHAIN, EMBEDDING, GUARDRAIL, EVALUATOR, PROMPT, DECISION, UNKNOWN, a span without a kind, a read TOOL without
  output -> a **generic step**: an action node ``<run>/<span_id>`` with ``attributes["write"] = False`` and
  ``attributes["span_kind"]`` (a PROV activity; text ``<KIND> <span name>``), ``attributed_to`` its agent,
  ``used`` the records its input consumed (an EMBEDDING's input: its ``embedding.embeddings.*.embedding.text``).
  ``IngestReport.steps`` counts them, ``IngestReport.actions`` only writes.

A write action that ``used`` no record has no lineage path: it is flagged ``attributes["unsupported"] = True``
and counted in ``IngestReport.unsupported``.

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

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.provenance.errors import GraphIntegrityError, IngestError
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
#: Attribute keys (and key prefixes) the mapping turns into node fields or other nodes; every other attribute is
#: kept on the span's nodes (``attributes["span_attributes"]``).
_MAPPED = {"openinference.span.kind", "input.value", "output.value", "tool.write"}
_MAPPED_PREFIXES = ("retrieval.documents.", "reranker.input_documents.", "reranker.output_documents.", "llm.input_messages.",
                    "llm.output_messages.", "embedding.embeddings.")
#: Attributes the OpenInference conventions define as JSON strings (parsed; refused when they do not parse).
_JSON_ATTRIBUTES = {"metadata", "llm.invocation_parameters", "tool.parameters", "tool.json_schema"}


class _Bad(Exception):
    """A malformed field inside an OTLP value: ``where`` is its path below the attribute."""

    def __init__(self, reason: str, where: str = ""):
        super().__init__(reason)
        self.reason, self.where = reason, where


def _any_value(v: Any) -> Any:
    """Python value of an OTLP ``AnyValue`` (``{"stringValue": ...}``, ``{"intValue": "7"}``, arrays, kv lists)."""
    if not isinstance(v, dict):
        raise _Bad(f"an OTLP AnyValue must be an object, got {type(v).__name__}")
    if not v:
        return None
    if len(v) != 1:
        raise _Bad(f"an OTLP AnyValue holds one typed value, got {sorted(v)}")
    (kind, x), = v.items()
    kind = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), kind)  # protobuf field names (string_value) too
    if kind == "stringValue" and isinstance(x, str):
        return x
    if kind == "boolValue" and isinstance(x, bool):
        return x
    if kind == "intValue" and (isinstance(x, int) and not isinstance(x, bool) or isinstance(x, str) and re.fullmatch(r"-?\d+", x)):
        return int(x)
    if kind == "doubleValue" and (isinstance(x, int | float) and not isinstance(x, bool) or x in ("NaN", "Infinity", "-Infinity")):
        return float(x)
    if kind == "bytesValue" and isinstance(x, str):
        return x  # base64, as written
    if kind == "arrayValue" and isinstance(x, dict):
        vals = x.get("values", [])
        if not isinstance(vals, list):
            raise _Bad("arrayValue.values must be a list", ".arrayValue.values")
        out = []
        for i, e in enumerate(vals):
            try:
                out.append(_any_value(e))
            except _Bad as bad:
                raise _Bad(bad.reason, f".arrayValue.values[{i}]{bad.where}") from None
        return out
    if kind == "kvlistValue" and isinstance(x, dict):
        try:
            return _key_values(x.get("values", []))
        except _Bad as bad:
            raise _Bad(bad.reason, f".kvlistValue.values{bad.where}") from None
    raise _Bad(f"unknown or ill-typed OTLP value {kind!r}: {x!r}"[:200])


def _key_values(kvs: Any) -> dict[str, Any]:
    """``[{"key": k, "value": AnyValue}, ...]`` as a dict."""
    if not isinstance(kvs, list):
        raise _Bad(f"OTLP attributes must be a list of key/value objects, got {type(kvs).__name__}")
    out: dict[str, Any] = {}
    for i, kv in enumerate(kvs):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise _Bad("an OTLP attribute needs a string 'key'", f"[{i}].key")
        try:
            out[kv["key"]] = _any_value(kv.get("value", {}))
        except _Bad as bad:
            raise _Bad(bad.reason, f"[{i}].value{bad.where}") from None
    return out


def _otlp_id(value: Any, size: int) -> str | None:
    """A trace (16 bytes) or span (8 bytes) id as lower-case hex: given in hex (OTLP/JSON) or base64 (protobuf's
    JSON mapping); ``""``/absent: ``None``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Bad(f"an id must be a string, got {type(value).__name__}")
    if len(value) == 2 * size and re.fullmatch(r"[0-9a-fA-F]+", value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise _Bad(f"{value!r} is neither {2 * size} hex digits nor the base64 of {size} bytes")
    return raw.hex()


def _nanos(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d+", value):
        return int(value)
    return None


def _from_otlp(doc: dict[str, Any], err) -> list[dict[str, Any]]:
    """The spans of an OTLP ``TracesData`` dict as flat span dicts (ids in hex, times in ns, attributes as a
    dict), each with its ``_path`` (``resourceSpans[r].scopeSpans[s].spans[k]``), ``_resource`` and ``_scope``."""
    out: list[dict[str, Any]] = []
    rss = doc.get("resourceSpans", doc.get("resource_spans"))
    if not isinstance(rss, list):
        raise err("'resourceSpans' must be a list", "resourceSpans")
    for r, rs in enumerate(rss):
        rp = f"resourceSpans[{r}]"
        if not isinstance(rs, dict):
            raise err(f"expected an object, got {type(rs).__name__}", rp)
        res = rs.get("resource") or {}
        try:
            resource = _key_values(res.get("attributes", [])) if isinstance(res, dict) else None
        except _Bad as bad:
            raise err(bad.reason, f"{rp}.resource.attributes{bad.where}") from None
        if resource is None:
            raise err("'resource' must be an object", f"{rp}.resource")
        sss = rs.get("scopeSpans", rs.get("scope_spans", rs.get("instrumentationLibrarySpans", [])))
        if not isinstance(sss, list):
            raise err("'scopeSpans' must be a list", f"{rp}.scopeSpans")
        for k, ss in enumerate(sss):
            sp = f"{rp}.scopeSpans[{k}]"
            if not isinstance(ss, dict) or not isinstance(ss.get("spans", []), list):
                raise err("expected an object with a list of 'spans'", sp)
            scope = ss.get("scope") if isinstance(ss.get("scope"), dict) else {}
            for j, span in enumerate(ss.get("spans", [])):
                p = f"{sp}.spans[{j}]"
                if not isinstance(span, dict):
                    raise err(f"expected a span object, got {type(span).__name__}", p)
                ids = {}
                for key, size in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
                    try:
                        ids[key] = _otlp_id(span.get(key, span.get(re.sub(r"([A-Z])", r"_\1", key).lower())), size)
                    except _Bad as bad:
                        raise err(bad.reason, f"{p}.{key}") from None
                try:
                    attrs = _key_values(span.get("attributes", []))
                except _Bad as bad:
                    raise err(bad.reason, f"{p}.attributes{bad.where}") from None
                start = _nanos(span.get("startTimeUnixNano", span.get("start_time_unix_nano")))
                if start is None:
                    raise err(f"missing or unreadable 'startTimeUnixNano' {span.get('startTimeUnixNano')!r}", f"{p}.startTimeUnixNano")
                end = _nanos(span.get("endTimeUnixNano", span.get("end_time_unix_nano")))
                out.append({
                    "span_id": ids["spanId"], "trace_id": ids["traceId"], "parent_id": ids["parentSpanId"], "name": span.get("name"),
                    "start_time": start, "end_time": end, "attributes": attrs, "status": span.get("status") or None, "_path": p,
                    "_resource": resource, "_scope": scope.get("name"),
                })
    return out


def _read_export(source: Any, file: str, err) -> Any:
    """The export as JSON-like data: OTLP protobuf bytes are decoded (``opentelemetry-proto``) to OTLP JSON."""
    if isinstance(source, str | Path):
        with open(source, "rb") as fh:
            raw = fh.read()
        if raw.lstrip()[:1] in (b"{", b"["):
            return _load(source, file)
        source = raw
    if isinstance(source, bytes | bytearray):
        try:
            from google.protobuf.json_format import MessageToDict
            from google.protobuf.message import DecodeError
            from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
        except ImportError as exc:  # pragma: no cover - a dependency of the project
            raise IngestError(f"reading OTLP protobuf needs opentelemetry-proto ({exc})", file=file) from None
        try:
            msg = TracesData.FromString(bytes(source))
        except DecodeError as exc:
            raise IngestError(f"neither JSON nor OTLP protobuf (TracesData / ExportTraceServiceRequest): {exc}", file=file) from None
        return MessageToDict(msg)
    return source
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
    parts += [v for k, v in sorted(attrs.items()) if k.startswith("embedding.embeddings.") and k.endswith(".embedding.text")]
    return "\n".join(str(p) for p in parts if p is not None)


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _json_attribute(value: Any, err, where: str) -> Any:
    """A convention's JSON-string attribute, parsed; :class:`IngestError` at ``where`` when it does not parse."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise err(f"{where.rsplit('.attributes.', 1)[-1]} must be a JSON string, does not parse: {exc.msg} (char {exc.pos})", where) from None


def _kept(attrs: dict[str, Any], err, p: str) -> dict[str, Any]:
    """The span's attributes no node field holds (module docstring), JSON-string ones parsed."""
    out = {}
    for k, v in attrs.items():
        if k in _MAPPED or k.startswith(_MAPPED_PREFIXES):
            continue
        out[k] = _json_attribute(v, err, f"{p}.{k}") if k in _JSON_ATTRIBUTES else v
    return out


def ingest_spans(graph: ProvenanceGraph, spans_or_path: list[dict] | dict | bytes | str | Path) -> IngestReport:
    """Ingest a span export into ``graph``, all or nothing.

    Parameters
    ----------
    graph : ProvenanceGraph
    spans_or_path : list of dict, dict, bytes, str or Path
        A flat span list, an OTLP JSON dict (``{"resourceSpans": [...]}``) or ``{"spans": [...]}``, OTLP protobuf
        bytes, or the path of a file holding any of them (JSON, or OTLP protobuf when its first byte is not
        ``{`` or ``[``).

    Returns
    -------
    IngestReport
        Each run (trace id) counted once: written from scratch (``runs``, ``run_ids``), extended (``extended``,
        ``extended_ids``: stored in part, its missing writes written), found stored (``present``,
        ``present_ids``) or with nothing to write (``empty``, ``empty_ids``: e.g. CHAIN spans only); what was
        actually added: nodes by type (``memories`` counts new memory records; re-versioned ones are not new),
        ``versions`` (memory updates and deletes) and ``edges``; ``actions`` counts writes and ``steps`` generic
        steps; ``unsupported`` the write actions without a lineage path; ``already_present`` when nothing at all
        was written and some run was found stored.

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
        A malformed span, with the file (``<spans>`` for an in-memory list) and the path of the bad field (for
        OTLP, from ``resourceSpans[r].scopeSpans[s].spans[k]``). Also a write the graph refuses (e.g. a
        :class:`~lab.provenance.errors.GraphIntegrityError` for a derivation cycle that ``update_memory`` spans
        would close): ``path`` is the span that planned it, ``span_id`` its id, ``cycle`` the cycle's node ids and
        ``cycle_spans`` the spans of this export that wrote each of them; the graph is unchanged.
    ContentConflictError
        (a :class:`~lab.provenance.errors.DuplicateNodeError`) A run stored already with other content: ``id`` and
        ``field`` name the first differing node, edge or memory version and field, ``stored`` and ``given`` the
        two values, ``run`` the run. Nothing of the whole call is written (no run of the export): the graph is
        unchanged.
    """
    file = str(spans_or_path) if isinstance(spans_or_path, str | Path) else "<spans>"

    def err(reason: str, where: str) -> IngestError:
        return IngestError(reason, file=file, path=where)

    doc = _read_export(spans_or_path, file, err)
    if isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc):
        doc = _from_otlp(doc, err)
    elif isinstance(doc, dict) and isinstance(doc.get("spans"), list):
        doc = doc["spans"]
    if not isinstance(doc, list):
        keys = f" with keys {sorted(doc)[:5]}" if isinstance(doc, dict) else ""
        raise IngestError(
            f"expected OTLP JSON ({{'resourceSpans': [...]}}), OTLP protobuf or a JSON list of spans, got {type(doc).__name__}{keys}", file=file
        )

    # -- validate and normalise every span first
    spans: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(doc):
        p = s.get("_path", f"[{i}]") if isinstance(s, dict) else f"[{i}]"
        if not isinstance(s, dict):
            raise err(f"expected a span object, got {type(s).__name__}", p)
        ctx = s.get("context") if isinstance(s.get("context"), dict) else {}
        sid = s.get("span_id", ctx.get("span_id"))
        if not isinstance(sid, str) or not sid:
            raise err("span without a 'span_id'", f"{p}.span_id")
        if sid in seen:
            raise err(f"duplicate span_id {sid!r} (first at {seen[sid]})", f"{p}.span_id")
        seen[sid] = p
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
        extra = {"span_attributes": _kept(attrs, err, f"{p}.attributes")}
        end = _time(s.get("end_time"))
        if end is not None:
            extra["end_time"] = end
        for key in ("status", "_resource", "_scope"):
            if s.get(key):
                extra[key.lstrip("_")] = s[key]
        spans.append({"i": i, "p": p, "id": sid, "parent": parent, "start": start, "attrs": attrs, "kind": kind, "op": op, "run": run,
                      "name": s.get("name") or sid, "extra": extra})

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
    origin: dict[tuple[str, int], dict] = {}  # the span that planned each write
    writers: dict[str, list[str]] = {}  # node id -> the span ids that create or re-version it
    current: list[dict] = []  # the span being planned

    def write(run: str, w: Write) -> None:
        if isinstance(w, Edge):
            if w.key in edge_keys:
                return  # the graph keeps one edge per src, dst and relation: the first
            edge_keys.add(w.key)
        elif isinstance(w, Node):
            created.add(w.id)
        if not isinstance(w, Edge):
            writers.setdefault(w.id if isinstance(w, Node) else w.node, []).append(current[0]["id"])
        origin[(run, len(plan.setdefault(run, [])))] = current[0]
        order.append((run, len(plan[run])))
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
            current[:] = [s]
            a, p, run, t = s["attrs"], f"{s['p']}.attributes", s["run"], s["start"]
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
            base = {"span_id": s["id"], "span_name": s["name"], **s["extra"]}
            step = False  # whether the span is kept as a generic step (module docstring)

            def documents(prefix: str) -> list[tuple[int, str, str, Any, dict]]:
                """``(i, id, content, score, metadata)`` of each ``<prefix>.<i>.document``, validated."""
                out = []
                for d in sorted({int(k.split(".")[2]) for k in a if re.fullmatch(rf"{re.escape(prefix)}\.\d+\.document\..+", k)}):
                    dp = f"{prefix}.{d}.document"
                    doc_id, content, score = a.get(f"{dp}.id"), a.get(f"{dp}.content"), a.get(f"{dp}.score")
                    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or doc_id == "":
                        raise err(f"{'retrieved' if prefix.startswith('retrieval') else 'reranked'} document without an id", f"{p}.{dp}.id")
                    if not isinstance(content, str):
                        raise err(f"{'retrieved' if prefix.startswith('retrieval') else 'reranked'} document without a string content", f"{p}.{dp}.content")
                    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
                        raise err(f"document score must be a number, got {score!r}", f"{p}.{dp}.score")
                    if isinstance(a.get(f"{dp}.metadata"), str):  # the conventions' form: a JSON string
                        meta = _json_attribute(a[f"{dp}.metadata"], err, f"{p}.{dp}.metadata")
                        if not isinstance(meta, dict):
                            raise err(f"document metadata must be a JSON object, got {type(meta).__name__}", f"{p}.{dp}.metadata")
                    else:
                        meta = {k[len(dp) + 10 :]: v for k, v in a.items() if k.startswith(f"{dp}.metadata.")}
                    out.append((d, str(doc_id), content, score, meta))
                return out

            if kind == "AGENT":
                aid = f"{run}/{s['id']}"
                name = a.get("gen_ai.agent.name") or a.get("graph.node.id") or s["name"]
                nodes.append(Node(id=aid, type=NodeType.AGENT, text=str(name), time=t, run=run, attributes={**base, "agent_id": a.get("gen_ai.agent.id"), "input": a.get("input.value"), "output": a.get("output.value")}))
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
                    used = [Edge(src=action, dst=rid, relation=Relation.USED, time=t, attributes=why) for rid, why in consumed()]
                    flags = {"write": True} if used else {"write": True, "unsupported": True}  # no lineage path
                    nodes.append(Node(id=action, type=NodeType.ACTION, text=f"{name}({inp if inp is not None else ''})", time=t, owner=agent, run=run, attributes={**attrs, **flags}))
                    if agent is not None:
                        edges.append(Edge(src=action, dst=agent, relation=Relation.ATTRIBUTED_TO, time=t))
                    edges += used
                elif out is None:
                    step = True  # a read tool that returned nothing
                if out is not None:
                    src = f"{run}/{s['id']}/output"
                    record(Node(id=src, type=NodeType.SOURCE, text=str(out), time=t, owner=agent, run=run, attributes=attrs), call_id)
                    if action is not None:
                        edges.append(Edge(src=action, dst=src, relation=Relation.GENERATED, time=t))
            elif kind == "RETRIEVER":
                for d, doc_id, content, score, meta in documents("retrieval.documents"):
                    record(
                        Node(id=f"{run}/{s['id']}/doc{d}", type=NodeType.SOURCE, text=content, time=t, owner=agent, run=run,
                             attributes={**base, "document_id": doc_id, "score": score, "query": a.get("input.value"), "metadata": meta}),
                        doc_id,
                    )
            elif kind == "RERANKER":
                docs = documents("reranker.output_documents")
                documents("reranker.input_documents")  # validated; the inputs are the records retrieved before
                for d, doc_id, content, score, meta in docs:
                    did = f"{run}/{s['id']}/doc{d}"
                    record(
                        Node(id=did, type=NodeType.SOURCE, text=content, time=t, owner=agent, run=run,
                             attributes={**base, "document_id": doc_id, "score": score, "query": a.get("reranker.query"), "metadata": meta}),
                        doc_id,
                    )
                    edges += [Edge(src=did, dst=rid, relation=Relation.DERIVED_FROM, time=t, attributes={"match": "id"})
                              for rid, _, ext in records.get(run, []) if ext == doc_id]
                step = not docs
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
                else:
                    step = True  # an ungrounded LLM output is no evidence: kept as a step
            else:  # CHAIN, EMBEDDING, GUARDRAIL, EVALUATOR, PROMPT, DECISION, UNKNOWN, no kind, anything else
                step = True
            if step:
                sid_ = f"{run}/{s['id']}"
                inp, out = a.get("input.value"), a.get("output.value")
                nodes.append(Node(id=sid_, type=NodeType.ACTION, text=f"{kind or 'UNKNOWN'} {s['name']}", time=t, owner=agent, run=run,
                                  attributes={**base, "span_kind": kind or "UNKNOWN", "input": inp, "output": out, "write": False}))
                if agent is not None:
                    edges.append(Edge(src=sid_, dst=agent, relation=Relation.ATTRIBUTED_TO, time=t))
                edges += [Edge(src=sid_, dst=rid, relation=Relation.USED, time=t, attributes=why) for rid, why in consumed()]

            for w in (*nodes, *edges):
                write(run, w)
            records.setdefault(run, []).extend(made)

        # -- each run: stored (skip it), new (write it), stored in part (write the rest) or a conflict (raise: nothing is written)
        verdicts: dict[str, Verdict] = {run: verdict((difference(graph, w) for w in plan.get(run, [])), run, file) for run in runs}
        todo = {(run, k) for run, v in verdicts.items() for k in v.missing}
        for run, k in order:  # in the planned order, across runs too (an edge may end at another run's agent)
            if (run, k) in todo:
                try:
                    apply(graph, plan[run][k])
                except GraphIntegrityError as exc:  # e.g. a derivation cycle: name the spans, write nothing
                    s = origin[(run, k)]
                    cycle = getattr(exc, "cycle", None) or []
                    made = "; ".join(f"{n!r} by span(s) {writers[n]}" for n in dict.fromkeys(cycle) if n in writers)
                    error = IngestError(
                        f"span {s['id']!r} ({s['name']}) writes what the graph refuses: {exc}" + (f" (written here: {made})" if made else "")
                        + "; nothing of the export was written", file=file, path=s["p"],
                    )
                    error.span_id, error.cycle = s["id"], list(cycle)
                    error.cycle_spans = {n: writers[n] for n in dict.fromkeys(cycle) if n in writers}
                    raise error from exc
        for run, v in verdicts.items():
            report._count(run, v.status, [plan[run][k] for k in v.missing])
    return report
