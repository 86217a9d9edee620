"""OpenInference ingest of what the real exporters write (issue #15, finding 7).

The spans are made by OpenInference's own tracer (``openinference-instrumentation``'s ``OITracer`` over the
OpenTelemetry SDK, an in-memory span exporter) and encoded by OpenTelemetry's OTLP encoder
(``opentelemetry-exporter-otlp-proto-common``): as OTLP protobuf bytes (what the OTLP/HTTP exporter sends), as
protobuf's JSON mapping of the same message (base64 ids) and as OTLP/JSON (hex ids, the OTLP specification's
rule). All three must give the same graph, keep the attributes the mapping does not use, parse the JSON-string
metadata and map every OpenInference span kind.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from openinference.instrumentation import (
    OITracer,
    TraceConfig,
    get_embedding_attributes,
    get_llm_attributes,
    get_reranker_attributes,
    get_retriever_attributes,
    using_attributes,
)
from openinference.semconv.trace import OpenInferenceSpanKindValues
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lab.provenance import IngestError, NodeType, ProvenanceGraph
from lab.provenance.ingest import ingest_spans

DOC = "Orders can be refunded within 30 days of delivery."
KINDS = ["AGENT", "RETRIEVER", "RERANKER", "EMBEDDING", "TOOL", "TOOL", "LLM", "GUARDRAIL", "EVALUATOR", "CHAIN", "UNKNOWN", "LLM"]


def _export() -> tuple[list, object]:
    """A support agent's trace, as OpenInference's tracer records it; returns the SDK spans and the OTLP request."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-bot"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OITracer(provider.get_tracer("lab-tests"), config=TraceConfig())
    with using_attributes(session_id="sess-1", user_id="u-42", tags=["prod", "refunds"], metadata={"tenant": "acme"}):
        with tracer.start_as_current_span("support_agent", openinference_span_kind="agent") as agent:
            agent.set_input("Can I get a refund for ORDER7781?")
            with tracer.start_as_current_span("retrieve", openinference_span_kind="retriever") as span:
                span.set_input("refund policy")
                span.set_attributes(get_retriever_attributes(documents=[
                    {"id": "doc-17", "content": DOC, "score": 0.91, "metadata": {"section": "refunds", "version": 3}},
                    {"id": "doc-42", "content": "Gift cards are not refundable.", "score": 0.35},
                ]))
            with tracer.start_as_current_span("rerank", openinference_span_kind="reranker") as span:
                span.set_attributes(get_reranker_attributes(
                    query="refund policy", model_name="cross-encoder", top_k=1,
                    input_documents=[{"id": "doc-17", "content": DOC, "score": 0.91}, {"id": "doc-42", "content": "Gift cards are not refundable.", "score": 0.35}],
                    output_documents=[{"id": "doc-17", "content": DOC, "score": 0.97}],
                ))
            with tracer.start_as_current_span("embed", openinference_span_kind="embedding") as span:
                span.set_attributes(get_embedding_attributes(model_name="minilm", embeddings=[{"text": "refund policy", "vector": [0.1, 0.2]}]))
            with tracer.start_as_current_span("lookup_order", openinference_span_kind="tool") as span:
                span.set_tool(name="lookup_order", description="Look an order up by id", parameters={"order_id": {"type": "string"}})
                span.set_input({"order_id": "ORDER7781"})
                span.set_output({"order_id": "ORDER7781", "status": "delivered", "delivered_days_ago": 12})
            with tracer.start_as_current_span("issue_refund", openinference_span_kind="tool") as span:
                span.set_tool(name="issue_refund", description="Refund an order", parameters={"order_id": {"type": "string"}})
                span.set_attribute("tool.write", True)  # the producer marks writes (the conventions have no flag)
                span.set_attribute("refund.policy_version", 3)  # a custom attribute
                span.set_input({"order_id": "ORDER7781", "amount": 40.0})
                span.set_output("Refund REF5512 issued for ORDER7781")
            with tracer.start_as_current_span("ChatCompletion", openinference_span_kind="llm") as span:
                span.set_attributes(get_llm_attributes(
                    model_name="gpt-4o", invocation_parameters={"temperature": 0.0},
                    input_messages=[{"role": "system", "content": f"Context: {DOC}"}, {"role": "user", "content": "Refund ORDER7781?"}],
                    output_messages=[{"role": "assistant", "content": "Yes: ORDER7781 was delivered 12 days ago, so it can be refunded."}],
                    token_count={"prompt": 31, "completion": 14, "total": 45},
                ))
            with tracer.start_as_current_span("pii_guard", openinference_span_kind="guardrail") as span:
                span.set_input("Yes: ORDER7781 was delivered 12 days ago, so it can be refunded.")
                span.set_output("pass")
            with tracer.start_as_current_span("judge", openinference_span_kind="evaluator") as span:
                span.set_input("Yes: ORDER7781 was delivered 12 days ago, so it can be refunded.")
                span.set_output('{"faithful": true}')
            with tracer.start_as_current_span("format_reply", openinference_span_kind="chain") as span:
                span.set_input("reply")
                span.set_output("formatted reply")
            with tracer.start_as_current_span("misc", openinference_span_kind=OpenInferenceSpanKindValues.UNKNOWN):
                pass
            with tracer.start_as_current_span("ChatCompletion", openinference_span_kind="llm") as span:
                span.set_input("Say goodbye.")
                span.set_output("Goodbye!")
            agent.set_output("Refund issued.")
    spans = exporter.get_finished_spans()
    return spans, encode_spans(spans)


@pytest.fixture(scope="module")
def export():
    return _export()


def _hex_ids(doc: dict) -> dict:
    """protobuf's JSON mapping (base64 ids) rewritten to OTLP/JSON (hex ids)."""
    doc = copy.deepcopy(doc)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
    return doc


def _snapshot(g: ProvenanceGraph) -> tuple:
    return sorted(json.dumps(n.model_dump(mode="json"), sort_keys=True) for n in g.nodes()), sorted(json.dumps(e.model_dump(mode="json"), sort_keys=True) for e in g.edges())


def test_otlp_json_protobuf_and_hex_give_one_graph(tmp_path, export):
    spans, request = export
    b64 = MessageToDict(request)
    assert "resourceSpans" in b64 and len(b64["resourceSpans"][0]["scopeSpans"][0]["spans"]) == len(spans) == 12
    (tmp_path / "trace.json").write_text(json.dumps(_hex_ids(b64)))  # OTLP/JSON as the spec writes it
    (tmp_path / "trace.pb").write_bytes(request.SerializeToString())  # OTLP protobuf, as the HTTP exporter sends it
    graphs = []
    snake = MessageToDict(request, preserving_proto_field_name=True)  # resource_spans, span_id, string_value
    for source in (tmp_path / "trace.json", tmp_path / "trace.pb", b64, snake, request.SerializeToString()):
        g = ProvenanceGraph()
        report = ingest_spans(g, source)
        assert report.runs == 1
        graphs.append(g)
    assert all(_snapshot(g) == _snapshot(graphs[0]) for g in graphs[1:])
    # re-ingesting the same trace in another encoding is a no-op
    assert ingest_spans(graphs[0], tmp_path / "trace.pb").already_present


def test_every_span_kind_maps_to_a_node(export):
    spans, request = export
    g = ProvenanceGraph()
    report = ingest_spans(g, MessageToDict(request))
    run = format(spans[0].context.trace_id, "032x")
    assert report.run_ids == [run]
    ordered = sorted(spans, key=lambda s: s.start_time)  # the exporter lists them as they end
    llms = [s for s in ordered if s.name == "ChatCompletion"]
    sid = {s.name if s.name != "ChatCompletion" else f"ChatCompletion#{llms.index(s) + 1}": format(s.context.span_id, "016x") for s in ordered}
    by_span: dict[str, list] = {}
    for n in g.nodes():
        by_span.setdefault(n.attributes["span_id"], []).append(n)
    assert set(by_span) == {format(s.context.span_id, "016x") for s in spans}  # no span is dropped
    kinds = {s.attributes["openinference.span.kind"] for s in spans}
    assert kinds == set(KINDS)

    def one(name: str):
        (n,) = by_span[sid[name]]
        return n

    agent = one("support_agent")
    assert agent.type == NodeType.AGENT and agent.id == f"{run}/{sid['support_agent']}"
    docs = sorted(by_span[sid["retrieve"]], key=lambda n: n.id)
    assert [(n.type, n.attributes["document_id"], n.attributes["score"]) for n in docs] == [(NodeType.SOURCE, "doc-17", 0.91), (NodeType.SOURCE, "doc-42", 0.35)]
    reranked = one("rerank")
    assert (reranked.type, reranked.attributes["document_id"], reranked.attributes["score"], reranked.attributes["query"]) == (NodeType.SOURCE, "doc-17", 0.97, "refund policy")
    assert [(e.dst, e.attributes) for e in g.edges(src=reranked.id, relation="derived_from")] == [(docs[0].id, {"match": "id"})]
    assert one("embed").type == NodeType.ACTION and one("embed").attributes["span_kind"] == "EMBEDDING" and one("embed").attributes["write"] is False
    assert [e.dst for e in g.edges(src=one("embed").id, relation="used")] == []  # "refund policy" repeats no record
    lookup = one("lookup_order")
    assert lookup.type == NodeType.SOURCE and json.loads(lookup.text)["status"] == "delivered"
    refund = [n for n in by_span[sid["issue_refund"]] if n.type == NodeType.ACTION]
    assert len(refund) == 1 and refund[0].attributes["write"] is True and "unsupported" not in refund[0].attributes
    assert [e.dst for e in g.edges(src=refund[0].id, relation="used")] == [lookup.id]
    claim = one("ChatCompletion#1")
    assert claim.type == NodeType.CLAIM and claim.text.startswith("Yes: ORDER7781")
    assert {e.src for e in g.edges(dst=claim.id, relation="supports")} >= {docs[0].id, lookup.id}
    for name, kind in (("pii_guard", "GUARDRAIL"), ("judge", "EVALUATOR"), ("format_reply", "CHAIN"), ("misc", "UNKNOWN")):
        step = one(name)
        assert (step.type, step.attributes["span_kind"], step.attributes["write"], step.owner) == (NodeType.ACTION, kind, False, agent.id)
    assert one("pii_guard").attributes["output"] == "pass"
    goodbye = one("ChatCompletion#2")
    assert (goodbye.type, goodbye.attributes["span_kind"]) == (NodeType.ACTION, "LLM")  # ungrounded: a step, not a claim
    assert (report.steps, report.actions, report.sources, report.claims, report.agents) == (6, 1, 5, 1, 1)


def test_unknown_attributes_are_kept_and_metadata_parsed(export):
    spans, request = export
    g = ProvenanceGraph()
    ingest_spans(g, MessageToDict(request))
    nodes = {n.attributes["span_name"]: n for n in g.nodes()}
    for n in g.nodes():  # the context attributes reach every node
        kept = n.attributes["span_attributes"]
        assert (kept["session.id"], kept["user.id"], kept["tag.tags"], kept["metadata"]) == ("sess-1", "u-42", ["prod", "refunds"], {"tenant": "acme"})
        assert n.attributes["resource"]["service.name"] == "support-bot" and n.attributes["scope"] == "lab-tests"
        assert n.attributes["end_time"] >= n.time
    llm = next(n for n in g.nodes("claim"))
    kept = llm.attributes["span_attributes"]
    assert (kept["llm.token_count.prompt"], kept["llm.token_count.completion"], kept["llm.token_count.total"]) == (31, 14, 45)
    assert kept["llm.model_name"] == "gpt-4o" and kept["llm.invocation_parameters"] == {"temperature": 0.0}
    assert not any(k.startswith(("llm.input_messages", "llm.output_messages")) for k in kept)  # held by the claim and its edges
    refund = next(n for n in g.nodes("action") if n.attributes.get("write"))
    assert refund.attributes["span_attributes"]["tool.description"] == "Refund an order"
    assert refund.attributes["span_attributes"]["tool.parameters"] == {"order_id": {"type": "string"}}
    assert refund.attributes["span_attributes"]["refund.policy_version"] == 3  # custom, an intValue
    doc = next(n for n in g.nodes("source") if n.attributes.get("document_id") == "doc-17" and n.attributes["span_name"] == "retrieve")
    assert doc.attributes["metadata"] == {"section": "refunds", "version": 3}  # written as a JSON string
    assert nodes["rerank"].attributes["span_attributes"]["reranker.model_name"] == "cross-encoder"
    assert nodes["rerank"].attributes["span_attributes"]["reranker.top_k"] == 1


def _spans_of(doc: dict) -> list[dict]:
    return doc["resourceSpans"][0]["scopeSpans"][0]["spans"]


def test_malformed_otlp_is_refused_with_its_path(export):
    _, request = export
    good = _hex_ids(MessageToDict(request))
    g = ProvenanceGraph()
    ingest_spans(g, copy.deepcopy(good))
    before = _snapshot(g)
    k = next(i for i, s in enumerate(_spans_of(good)) if s["name"] == "retrieve")
    j = next(i for i, a in enumerate(_spans_of(good)[k]["attributes"]) if a["key"] == "retrieval.documents.0.document.metadata")

    def broken(change) -> dict:
        doc = copy.deepcopy(good)
        change(doc)
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "ab" * 16  # another trace: it must not be written either
        return doc

    where = f"resourceSpans[0].scopeSpans[0].spans[{k}]"
    cases = [
        (lambda d: _spans_of(d)[k]["attributes"][j]["value"].__setitem__("stringValue", '{"section": "refu'),
         f"<spans> at {where}.attributes.retrieval.documents.0.document.metadata: retrieval.documents.0.document.metadata must be a JSON string, does not parse"),
        (lambda d: _spans_of(d)[k].__setitem__("spanId", "not-an-id"),
         f"<spans> at {where}.spanId: 'not-an-id' is neither 16 hex digits nor the base64 of 8 bytes"),
        (lambda d: _spans_of(d)[k]["attributes"][j].__setitem__("value", {"intValue": "x"}),
         f"<spans> at {where}.attributes[{j}].value: unknown or ill-typed OTLP value 'intValue'"),
        (lambda d: _spans_of(d)[k].pop("startTimeUnixNano"), f"<spans> at {where}.startTimeUnixNano: missing or unreadable"),
    ]
    for change, message in cases:
        with pytest.raises(IngestError) as info:
            ingest_spans(g, broken(change))
        assert str(info.value).startswith(message), str(info.value)
        assert _snapshot(g) == before
    with pytest.raises(IngestError, match=r"neither JSON nor OTLP protobuf"):
        ingest_spans(g, b"\x0a\xff\xff\xff")
    with pytest.raises(IngestError, match=r"expected OTLP JSON \(\{'resourceSpans': \[...\]\}\), OTLP protobuf or a JSON list of spans, got dict with keys \['traces'\]"):
        ingest_spans(g, {"traces": []})
    assert _snapshot(g) == before


def test_phoenix_style_document_metadata_as_a_json_string():
    spans = json.loads((Path(__file__).parent / "data" / "openinference_spans.json").read_text())
    spans[2]["attributes"]["retrieval"]["documents"][1]["document"]["metadata"] = '{"section": "gift", "lang": "en"}'
    g = ProvenanceGraph()
    ingest_spans(g, spans)
    assert g.node("t1/s3/doc1").attributes["metadata"] == {"section": "gift", "lang": "en"}


def test_a_derivation_cycle_names_the_spans_and_writes_nothing():
    # three update_memory spans: B derives from A, then A is updated from B; the graph keeps the lineage acyclic
    def update(span_id: str, record: str, text: str, start: int) -> dict:
        return {"name": f"update {record}", "context": {"trace_id": "t9", "span_id": span_id}, "start_time": start,
                "attributes": {"gen_ai.operation.name": "update_memory", "gen_ai.memory.record.id": record, "input.value": text}}

    spans = [update("a", "A", "alpha ABC123", 1), update("b", "B", "beta ABC123", 2), update("c", "A", "alpha again ABC123", 3)]
    g = ProvenanceGraph()
    ingest_spans(g, json.loads((Path(__file__).parent / "data" / "openinference_spans.json").read_text()))
    before = _snapshot(g)
    with pytest.raises(IngestError) as info:
        ingest_spans(g, spans)
    e = info.value
    assert (e.path, e.span_id) == ("[2]", "c") and set(e.cycle) == {"t9/memory/A", "t9/memory/B"}
    assert e.cycle_spans == {"t9/memory/A": ["a", "c"], "t9/memory/B": ["b"]}
    assert "nothing of the export was written" in str(e) and _snapshot(g) == before
