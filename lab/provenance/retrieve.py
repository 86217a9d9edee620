"""Permission- and trust-aware retrieval (MAP-Graph, steps 1-3).

For a reading agent and a query: trace each candidate's ancestry, drop every record the agent
may not read (its own or any ancestor's labels, or a revoked ancestor: :meth:`AccessPolicy.filter`)
and every record that does not stand (invalidated, or left without support by an invalidation:
:func:`lab.provenance.lineage.standing`) **before** anything is scored, then rank the rest by
``similarity(query, text) x path_trust`` (:func:`lab.provenance.trust.path_trusts`). Similarity comes
from the offline MiniLM model or BM25 (:mod:`lab.provenance.embed`), chosen explicitly.
MAP-Graph (arXiv 2608.10509) gives the pipeline; its exact score formula is not published, and
this product (path trust maximised over ancestry paths) is the natural reading of its abstract.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from lab.provenance.access import AccessPolicy
from lab.provenance.embed import make_scorer
from lab.provenance.graph import NodeType, ProvenanceGraph
from lab.provenance.lineage import standing

__all__ = ["Hit", "RetrievalResult", "Retriever"]

RECORD_TYPES = (NodeType.SOURCE, NodeType.MEMORY, NodeType.CLAIM)


class Hit(BaseModel):
    """One retrieved record.

    Parameters
    ----------
    id : str
    score : float
        ``similarity * trust``, what the hits are ranked by.
    similarity : float
        The scorer's similarity of the query and the text, in [0, 1].
    trust : float
        The record's path trust, in [0, 1].
    text : str
    rederive : list of str
        The invalidated records it carries content of (it was derived from them): re-derive it before
        relying on it. Empty for a record untouched by invalidation.
    """

    id: str
    score: float
    similarity: float
    trust: float
    text: str
    rederive: list[str] = []


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
        rows = self.graph.indexed(ids)  # one read of the inherited index serves the filter and the trust
        readable, excluded = self.policy.filter(agent, rows)  # filtering happens before any scoring
        valid = []
        for i in readable:
            why = standing(i, *rows[i])
            if why is None:
                valid.append(i)
            else:
                excluded[i] = why
        sims = self.scorer.scores(query, [rows[i][0].text for i in valid])
        ranked = sorted(((float(s) * rows[i][1].path_trust, i, float(s)) for i, s in zip(valid, sims)), key=lambda r: (-r[0], r[1]))
        hits = [
            Hit(id=i, score=score, similarity=s, trust=rows[i][1].path_trust, text=rows[i][0].text, rederive=list(rows[i][1].rederive)) for score, i, s in ranked[:k]
        ]
        return RetrievalResult(agent=agent, query=query, hits=hits, excluded=excluded, candidates=len(ids))
