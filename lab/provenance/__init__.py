"""Provenance facet: typed execution graphs of LLM-agent runs (and, as it grows, permission- and
trust-aware memory, the risk gate, transactional commit and repair).

Submodules
----------
graph
    :class:`~lab.provenance.graph.ProvenanceGraph`: the append-only SQLite store of typed nodes and edges.
errors
    :class:`~lab.provenance.errors.ProvenanceError` and its subclasses.
"""

from lab.provenance.errors import DuplicateNodeError, GraphIntegrityError, IngestError, ProvenanceError, UnknownNodeError
from lab.provenance.graph import LINEAGE, Edge, Node, NodeType, ProvenanceGraph, Relation

__all__ = [
    "DuplicateNodeError",
    "GraphIntegrityError",
    "IngestError",
    "ProvenanceError",
    "UnknownNodeError",
    "LINEAGE",
    "Edge",
    "Node",
    "NodeType",
    "ProvenanceGraph",
    "Relation",
]
