"""Permission- and trust-aware retrieval (MAP-Graph, steps 1-3).

For a reading agent and a query: trace each candidate's ancestry, drop every record the agent
may not read (its own or any ancestor's labels, or a revoked ancestor: :class:`AccessPolicy`)
**before** anything is scored, then rank the eligible records by
``similarity(query, text) x path_trust`` (:func:`lab.provenance.trust.path_trusts`). Similarity comes
from the offline MiniLM model or BM25 (:mod:`lab.provenance.embed`), chosen explicitly.
MAP-Graph (arXiv 2608.10509) gives the pipeline; its exact score formula is not published, and
this product (path trust maximised over ancestry paths) is the natural reading of its abstract.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from lab.provenance.access import AccessPolicy, lineage_closure
from lab.provenance.embed import make_scorer
from lab.provenance.graph import NodeType, ProvenanceGraph
from lab.provenance.trust import path_trusts

__all__ = ["Hit", "RetrievalResult", "Retriever"]

RECORD_TYPES = (NodeType.SOURCE, NodeType.MEMORY, NodeType.CLAIM)


class Hit(BaseModel):
    id: str
    score: float
    similarity: float
    trust: float
    text: str


class RetrievalResult(BaseModel):
    """``hits``: the top eligible records, best first; ``excluded``: every candidate filtered out, with why."""

    agent: str
    query: str
    hits: list[Hit]
    excluded: dict[str, str]
    candidates: int


class Retriever:
    """Rank the records an agent may read.

    Parameters
    ----------
    graph : ProvenanceGraph
    policy : AccessPolicy, optional
        Default: a policy over ``graph``.
    scorer : {"minilm", "bm25"} or an object with ``scores(query, texts)``
    """

    def __init__(self, graph: ProvenanceGraph, policy: AccessPolicy | None = None, scorer="minilm"):
        self.graph = graph
        self.policy = policy or AccessPolicy(graph)
        self.scorer = make_scorer(scorer) if isinstance(scorer, str) else scorer

    def retrieve(self, agent: str, query: str, *, k: int = 5, candidates: Iterable[str] | None = None, run: str | None = None) -> RetrievalResult:
        """The ``k`` best records for ``query`` among those ``agent`` may read.

        ``candidates``: record ids to consider (default: every valid source, memory and claim,
        of ``run`` if given). Invalid (superseded) records are excluded with that reason.
        Raises :class:`~lab.provenance.errors.UnknownNodeError` for an unknown agent or candidate.
        """
        if candidates is None:
            ids = [n.id for t in RECORD_TYPES for n in self.graph.nodes(t, run=run)]
        else:
            ids = list(dict.fromkeys(candidates))
        closure = lineage_closure(self.graph, ids)  # one ancestry query serves the filter and the trust
        eligible, excluded = self.policy.eligible(agent, ids, closure=closure)  # filtering happens before any scoring
        excluded = dict(excluded)
        nodes = closure.nodes
        valid = []
        for i in eligible:
            if nodes[i].valid:
                valid.append(i)
            else:
                excluded[i] = "invalidated (superseded)"
        trust = path_trusts(self.graph, valid, closure=closure) if valid else {}
        sims = self.scorer.scores(query, [nodes[i].text for i in valid])
        hits = [Hit(id=i, score=float(s) * trust[i], similarity=float(s), trust=trust[i], text=nodes[i].text) for i, s in zip(valid, sims)]
        hits.sort(key=lambda h: (-h.score, h.id))
        return RetrievalResult(agent=agent, query=query, hits=hits[:k], excluded=excluded, candidates=len(ids))
