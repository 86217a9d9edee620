"""Provenance facet: typed execution graphs of LLM-agent runs (and, as it grows, permission- and
trust-aware memory, the risk gate, transactional commit and repair).

Submodules
----------
graph
    :class:`~lab.provenance.graph.ProvenanceGraph`: the append-only SQLite store of typed nodes and edges.
ingest
    Real agent traces into the graph: tau-bench trajectories, OpenInference / OTel GenAI spans.
prov_export
    W3C PROV (PROV-JSON, PROV-N through the ``prov`` package) and back.
access, trust
    Scopes, grants and revocation with restrictions inherited along derivations; multiplicative
    path trust and independent support.
embed, retrieve, gate
    Similarity (offline MiniLM or BM25), permission-filtered trust-weighted retrieval, and the
    risk-sensitive action gate (MAP-Graph).
errors
    :class:`~lab.provenance.errors.ProvenanceError` and its subclasses.
"""

from lab.provenance.errors import ContentConflictError, DuplicateNodeError, GraphIntegrityError, IngestError, ProvenanceError, UnknownNodeError
from lab.provenance.graph import LINEAGE, Difference, Edge, Node, NodeType, ProvenanceGraph, Relation

__all__ = [
    "ContentConflictError",
    "DuplicateNodeError",
    "GraphIntegrityError",
    "IngestError",
    "ProvenanceError",
    "UnknownNodeError",
    "LINEAGE",
    "Difference",
    "Edge",
    "Node",
    "NodeType",
    "ProvenanceGraph",
    "Relation",
]
