"""Export the execution graph as W3C PROV (PROV-DM via the ``prov`` package) and read it back.

Mapping
-------
==================== ==========================================================================
graph                PROV
==================== ==========================================================================
agent                ``prov:Agent``
source/memory/claim  ``prov:Entity`` with ``lab:type`` = ``"source"`` / ``"memory"`` / ``"claim"``
action               ``prov:Activity``
derived_from         ``wasDerivedFrom(src, dst)``
summarises           ``wasDerivedFrom(src, dst)`` with ``lab:relation = "summarises"`` (a PROV
                     derivation; the lab relation tells the two apart on reading)
used                 ``used(action, record)``
generated            ``wasGeneratedBy(record, action)``
attributed_to        ``wasAttributedTo(record, agent)``; ``wasAssociatedWith(action, agent)``
acted_on_behalf_of   ``actedOnBehalfOf(delegate, responsible)``
invalidated_by       ``wasInvalidatedBy(record, action)`` when ``dst`` is an action; otherwise
                     ``wasInfluencedBy(record, dst)`` with ``prov:type = lab:invalidatedBy``
supports             ``wasInfluencedBy(supported, evidence)`` with ``prov:type = lab:supports``:
                     PROV has no support relation, so this is a typed generic influence
==================== ==========================================================================

Node ids become ``lab:<id>`` (namespace ``lab`` = :data:`LAB_NS`); characters outside
``[A-Za-z0-9_.-]`` are percent-encoded in the local part and decoded on reading. Node fields are
``lab:`` attributes: ``lab:text``, ``lab:time`` (float), ``lab:owner`` and ``lab:run`` (absent when
None), ``lab:labels`` (a JSON list, sorted), ``lab:trust`` (float), ``lab:valid`` (bool) and
``lab:attributes`` (JSON). Each relation carries ``lab:relation`` (the graph relation), ``lab:time``
(float), ``lab:attributes`` (JSON) and, when the edge has one, ``lab:writer`` (the agent that wrote
it); ``used`` / ``wasGeneratedBy`` / ``wasInvalidatedBy`` also get
``prov:time`` (the same instant as a UTC datetime) for PROV consumers.

Round trips
-----------
``graph -> PROV-JSON -> graph`` (:func:`write_prov` then :func:`from_prov`) gives back identical
current nodes (every field) and edges. It does **not** carry the node version history
(:meth:`ProvenanceGraph.history`: only the current version is exported; the read-back graph has
one version per node) nor edge insertion order. PROV-N: prov 3.x can write *and* read PROV-N
(``from_prov(path, format="provn")``) and the test suite checks that round trip too. Reading back
restores edges as recorded: their writers are not checked again (they were when first written,
:meth:`ProvenanceGraph.add_edge`), but the lineage must be acyclic as always. PROV-N
writes ``prov:time`` with microsecond precision only, which is why the exact float travels in
``lab:time``. Attribute values that are not JSON-serializable cannot be exported
(:class:`ProvExportError`).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import prov.model as pm

from lab.provenance.errors import ProvExportError  # defined in errors.py; importable from here as before
from lab.provenance.graph import Edge, Node, NodeType, ProvenanceGraph, Relation

__all__ = ["LAB_NS", "ProvExportError", "to_prov", "write_prov", "from_prov"]

#: The namespace of node ids and lab attributes.
LAB_NS = "https://research-lab.example/ns#"

_ENTITY_TYPES = {NodeType.SOURCE, NodeType.MEMORY, NodeType.CLAIM}


def _qn(ns: pm.Namespace, node_id: str) -> pm.QualifiedName:
    return ns[quote(node_id, safe="-_.")]


def _json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ProvExportError(f"{what} is not JSON-serializable: {exc}") from exc


def _utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc)


def to_prov(graph: ProvenanceGraph, *, run: str | None = None) -> pm.ProvDocument:
    """The graph (or one ``run`` of it: its nodes and the edges between them) as a PROV document.

    Parameters
    ----------
    graph : ProvenanceGraph
    run : str, optional
        Only this run's nodes and the edges between them.

    Returns
    -------
    prov.model.ProvDocument

    Raises
    ------
    ProvExportError
        A node's or an edge's attributes are not JSON-serializable (naming it).
    """
    doc = pm.ProvDocument()
    ns = doc.add_namespace("lab", LAB_NS)
    nodes = {n.id: n for n in graph.nodes(run=run)}
    for n in nodes.values():
        attrs: dict[Any, Any] = {
            ns["text"]: n.text,
            ns["time"]: float(n.time),
            ns["labels"]: json.dumps(sorted(n.labels)),
            ns["trust"]: float(n.trust),
            ns["valid"]: bool(n.valid),
            ns["attributes"]: _json(n.attributes, f"attributes of node {n.id!r}"),
        }
        if n.owner is not None:
            attrs[ns["owner"]] = n.owner
        if n.run is not None:
            attrs[ns["run"]] = n.run
        qid = _qn(ns, n.id)
        if n.type == NodeType.AGENT:
            doc.agent(qid, attrs)
        elif n.type == NodeType.ACTION:
            doc.activity(qid, other_attributes=attrs)
        else:
            attrs[ns["type"]] = n.type.value
            doc.entity(qid, attrs)

    for e in graph.edges():
        if e.src not in nodes or e.dst not in nodes:
            continue
        src, dst = _qn(ns, e.src), _qn(ns, e.dst)
        attrs = {
            ns["relation"]: e.relation.value,
            ns["time"]: float(e.time),
            ns["attributes"]: _json(e.attributes, f"attributes of edge {e.src}-{e.relation.value}->{e.dst}"),
        }
        if e.writer is not None:
            attrs[ns["writer"]] = e.writer
        r = e.relation
        if r in (Relation.DERIVED_FROM, Relation.SUMMARISES):
            doc.wasDerivedFrom(src, dst, other_attributes=attrs)
        elif r == Relation.USED:
            doc.used(src, dst, _utc(e.time), other_attributes=attrs)
        elif r == Relation.GENERATED:
            doc.wasGeneratedBy(dst, src, _utc(e.time), other_attributes=attrs)
        elif r == Relation.ATTRIBUTED_TO:
            if nodes[e.src].type == NodeType.ACTION:
                doc.wasAssociatedWith(src, dst, other_attributes=attrs)
            else:
                doc.wasAttributedTo(src, dst, other_attributes=attrs)
        elif r == Relation.ACTED_ON_BEHALF_OF:
            doc.actedOnBehalfOf(src, dst, other_attributes=attrs)
        elif r == Relation.INVALIDATED_BY:
            if nodes[e.dst].type == NodeType.ACTION:
                doc.wasInvalidatedBy(src, dst, _utc(e.time), other_attributes=attrs)
            else:
                doc.wasInfluencedBy(src, dst, other_attributes={pm.PROV_TYPE: ns["invalidatedBy"], **attrs})
        elif r == Relation.SUPPORTS:
            # PROV has no "supports": the supported record is influenced by the evidence.
            doc.wasInfluencedBy(dst, src, other_attributes={pm.PROV_TYPE: ns["supports"], **attrs})
        else:  # pragma: no cover - every Relation is handled above
            raise ProvExportError(f"no PROV mapping for {r.value}")
    return doc


def write_prov(graph: ProvenanceGraph, path: str | Path, format: str = "json", *, run: str | None = None) -> Path:
    """Write :func:`to_prov` as PROV-JSON or PROV-N.

    Parameters
    ----------
    graph : ProvenanceGraph
    path : str or Path
        The file to write (its folder is created).
    format : {"json", "provn"}
    run : str, optional
        Only this run.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ProvExportError
        An unsupported ``format``, or attributes that are not JSON-serializable.
    """
    if format not in ("json", "provn"):
        raise ProvExportError(f"unsupported format {format!r}: use 'json' or 'provn'")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_prov(graph, run=run).serialize(format=format, **({"indent": 2} if format == "json" else {}))
    path.write_text(text, encoding="utf-8")
    return path


# -- reading back

_RELATION_OF = {  # PROV record class -> (graph relation, attribute holding src, attribute holding dst)
    pm.ProvDerivation: (Relation.DERIVED_FROM, pm.PROV_ATTR_GENERATED_ENTITY, pm.PROV_ATTR_USED_ENTITY),
    pm.ProvUsage: (Relation.USED, pm.PROV_ATTR_ACTIVITY, pm.PROV_ATTR_ENTITY),
    pm.ProvGeneration: (Relation.GENERATED, pm.PROV_ATTR_ACTIVITY, pm.PROV_ATTR_ENTITY),
    pm.ProvAttribution: (Relation.ATTRIBUTED_TO, pm.PROV_ATTR_ENTITY, pm.PROV_ATTR_AGENT),
    pm.ProvAssociation: (Relation.ATTRIBUTED_TO, pm.PROV_ATTR_ACTIVITY, pm.PROV_ATTR_AGENT),
    pm.ProvDelegation: (Relation.ACTED_ON_BEHALF_OF, pm.PROV_ATTR_DELEGATE, pm.PROV_ATTR_RESPONSIBLE),
    pm.ProvInvalidation: (Relation.INVALIDATED_BY, pm.PROV_ATTR_ENTITY, pm.PROV_ATTR_ACTIVITY),
}


def _local_id(q: Any) -> str:
    if isinstance(q, pm.QualifiedName):
        if q.namespace.uri != LAB_NS:
            raise ProvExportError(f"{q} is not in the lab namespace {LAB_NS}")
        return unquote(q.localpart)
    raise ProvExportError(f"expected a qualified name, got {q!r}")


def _extras(record: pm.ProvRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in record.attributes:
        if isinstance(k, pm.QualifiedName) and k.namespace.uri == LAB_NS:
            out[k.localpart] = v
        elif k == pm.PROV_TYPE:
            out["prov:type"] = v
        elif isinstance(k, pm.QualifiedName) and k.namespace.uri == pm.PROV.uri:
            out[f"prov:{k.localpart}"] = v
    return out


def _lit(v: Any) -> Any:
    return v.value if isinstance(v, pm.Literal) else v


def _node_from(record: pm.ProvElement, type_: NodeType) -> Node:
    x = {k: _lit(v) for k, v in _extras(record).items()}
    if type_ not in (NodeType.AGENT, NodeType.ACTION):
        type_ = NodeType(x.get("type", "source"))
    return Node(
        id=_local_id(record.identifier),
        type=type_,
        text=str(x.get("text", "")),
        time=float(x.get("time", 0.0)),
        owner=x.get("owner"),
        labels=frozenset(json.loads(x.get("labels", "[]"))),
        trust=float(x.get("trust", 1.0)),
        valid=x.get("valid", True) in (True, "true", "True", 1),
        run=x.get("run"),
        attributes=json.loads(x.get("attributes", "{}")),
    )


def _edge_from(record: pm.ProvRelation) -> Edge | None:
    x = _extras(record)
    attrs = dict(record.formal_attributes)
    rtype = x.get("prov:type")
    if isinstance(record, pm.ProvInfluence):
        influencee, influencer = attrs[pm.PROV_ATTR_INFLUENCEE], attrs[pm.PROV_ATTR_INFLUENCER]
        kind = rtype.localpart if isinstance(rtype, pm.QualifiedName) else str(rtype or "").split(":")[-1]
        if kind == "supports":
            relation, src, dst = Relation.SUPPORTS, influencer, influencee
        elif kind == "invalidatedBy":
            relation, src, dst = Relation.INVALIDATED_BY, influencee, influencer
        else:
            return None  # a generic influence the lab graph has no relation for
    else:
        spec = _RELATION_OF.get(type(record))
        if spec is None:
            return None
        relation, src_key, dst_key = spec
        src, dst = attrs[src_key], attrs[dst_key]
        if relation == Relation.DERIVED_FROM and _lit(x.get("relation")) == Relation.SUMMARISES.value:
            relation = Relation.SUMMARISES
    t = _lit(x.get("time"))
    if t is None:
        pt = attrs.get(pm.PROV_ATTR_TIME)
        t = pt.timestamp() if isinstance(pt, dt.datetime) else 0.0
    return Edge(
        src=_local_id(src),
        dst=_local_id(dst),
        relation=relation,
        time=float(t),
        writer=_lit(x["writer"]) if x.get("writer") is not None else None,
        attributes=json.loads(_lit(x.get("attributes", "{}"))),
    )


def from_prov(
    document_or_path: pm.ProvDocument | str | Path,
    *,
    format: str = "json",
    into: ProvenanceGraph | str | Path = ":memory:",
) -> ProvenanceGraph:
    """Rebuild a :class:`ProvenanceGraph` from a PROV document or a PROV-JSON / PROV-N file written by
    :func:`to_prov` / :func:`write_prov`.

    Parameters
    ----------
    document_or_path : prov.model.ProvDocument, str or Path
    format : {"json", "provn"}
        The file's format (ignored for a document).
    into : ProvenanceGraph, str or Path
        The graph (or SQLite path) to add the nodes and edges to, in one transaction. Relations that
        have no lab counterpart (e.g. an untyped ``wasInfluencedBy``) are skipped.

    Returns
    -------
    ProvenanceGraph

    Raises
    ------
    ProvExportError
        An unsupported format, or a qualified name outside the lab namespace.
    DuplicateNodeError, GraphIntegrityError
        ``into`` holds one of the nodes already, or the edges would close a derivation cycle; nothing
        of the document is written then.
    """
    if isinstance(document_or_path, pm.ProvDocument):
        doc = document_or_path
    else:
        if format not in ("json", "provn"):
            raise ProvExportError(f"unsupported format {format!r}: use 'json' or 'provn'")
        doc = pm.ProvDocument.deserialize(source=str(document_or_path), format=format)
    graph = into if isinstance(into, ProvenanceGraph) else ProvenanceGraph(into)
    nodes: list[Node] = []
    edges: list[Edge] = []
    for record in doc.get_records():
        if isinstance(record, pm.ProvAgent):
            nodes.append(_node_from(record, NodeType.AGENT))
        elif isinstance(record, pm.ProvActivity):
            nodes.append(_node_from(record, NodeType.ACTION))
        elif isinstance(record, pm.ProvEntity):
            nodes.append(_node_from(record, NodeType.SOURCE))
        elif isinstance(record, pm.ProvRelation):
            edge = _edge_from(record)
            if edge is not None:
                edges.append(edge)
    with graph.transaction():
        graph.add_nodes(nodes)
        graph.add_edges(edges, verify_writer=False)  # restored as recorded (module docstring)
    return graph
