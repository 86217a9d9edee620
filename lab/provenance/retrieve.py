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

import heapq
from collections.abc import Iterable

from pydantic import BaseModel

from lab.provenance.access import AccessPolicy
from lab.provenance.embed import make_scorer
from lab.provenance.graph import NodeType, ProvenanceGraph
from lab.provenance.index import TextIndex, store_version
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
    scorer : {"minilm", "bm25", "index"} or an object with ``scores(query, texts)``
        ``"index"``: the BM25 score ``index`` gave each candidate, divided by the best candidate's
        (corpus-wide statistics; no second scoring pass). Needs ``index``.
    index : TextIndex, optional
        Candidate pre-selection (:class:`lab.provenance.index.TextIndex`): when a query names no
        ``candidates``, the ``preselect`` records of highest BM25 are its candidates, selected
        inside :meth:`retrieve` (so timed with it). Without it every record is a candidate.
    preselect : int
        How many candidates the index pre-selects per query (default 1000).

    Raises
    ------
    ValueError
        ``scorer="index"`` without an ``index``, or ``preselect`` < 1.
    """

    def __init__(self, graph: ProvenanceGraph, policy: AccessPolicy | None = None, scorer="minilm", *, index: TextIndex | None = None, preselect: int = 1000):
        self.graph = graph
        self.policy = policy or AccessPolicy(graph)
        if scorer == "index" and index is None:
            raise ValueError("scorer='index' ranks by the pre-selection's BM25: pass index=TextIndex(graph)")
        if preselect < 1:
            raise ValueError(f"preselect must be >= 1, got {preselect}")
        self.index, self.preselect = index, int(preselect)
        self._rows: dict[str, tuple] = {}  # inherited-index rows read while the store did not change
        self._rows_at: tuple[int, int] | None = None
        self.scorer = scorer if scorer == "index" else make_scorer(scorer) if isinstance(scorer, str) else scorer

    def retrieve(self, agent: str, query: str, *, k: int = 5, candidates: Iterable[str] | None = None, run: str | None = None) -> RetrievalResult:
        """The ``k`` best records for ``query`` among those ``agent`` may read.

        ``candidates``: record ids to consider (default: every valid source, memory and claim,
        of ``run`` if given). Invalid (superseded) records are excluded with that reason.
        Raises :class:`~lab.provenance.errors.UnknownNodeError` for an unknown agent or candidate.
        """
        if candidates is None and self.index is not None and self.scorer == "index":
            return self._retrieve_preselected(agent, query, k, run)
        lexical: dict[str, float] = {}
        if candidates is None and self.index is not None:  # pre-selection is part of the query
            lexical = dict(self.index.search(query, limit=self.preselect, run=run))
            ids = list(lexical)
        elif candidates is None:
            ids = [n.id for t in RECORD_TYPES for n in self.graph.nodes(t, run=run)]
        else:
            ids = list(dict.fromkeys(candidates))
        rows = self._indexed(ids)  # one read of the inherited index serves the filter and the trust
        readable, excluded = self.policy.filter(agent, rows)  # filtering happens before any scoring
        valid = []
        for i in readable:
            why = standing(i, *rows[i])
            if why is None:
                valid.append(i)
            else:
                excluded[i] = why
        if self.scorer == "index":
            lexical = lexical or dict(self.index.search(query, limit=max(1, len(self.index))))
            top = max((lexical.get(i, 0.0) for i in valid), default=0.0) or 1.0
            sims = [lexical.get(i, 0.0) / top for i in valid]
        else:
            sims = self.scorer.scores(query, [rows[i][0].text for i in valid])
        ranked = heapq.nsmallest(k, ((float(s) * rows[i][1].path_trust, i, float(s)) for i, s in zip(valid, sims)), key=lambda r: (-r[0], r[1]))
        hits = [
            Hit(id=i, score=score, similarity=s, trust=rows[i][1].path_trust, text=rows[i][0].text, rederive=list(rows[i][1].rederive)) for score, i, s in ranked[:k]
        ]
        return RetrievalResult(agent=agent, query=query, hits=hits, excluded=excluded, candidates=len(ids))

    def _indexed(self, ids: list[str]) -> dict[str, tuple]:
        """:meth:`ProvenanceGraph.indexed`, reusing rows read since the store last changed (any write,
        from any connection, empties the reuse; nothing read inside an open transaction is kept)."""
        at = store_version(self.graph)
        if at is None:
            return self.graph.indexed(ids)
        if at != self._rows_at or len(self._rows) > 500_000:
            self._rows, self._rows_at = {}, at
        rows = self._rows
        missing = [i for i in ids if i not in rows]
        if missing:
            rows.update(self.graph.indexed(missing))
        return {i: rows[i] for i in dict.fromkeys(ids)}

    def _retrieve_preselected(self, agent: str, query: str, k: int, run: str | None) -> RetrievalResult:
        """Pre-select by the index's BM25, then filter and rank in batches of falling similarity,
        stopping once no unread candidate can enter the top ``k`` (Fagin's threshold algorithm:
        a score is ``similarity x trust`` with trust <= 1, so a candidate's similarity bounds its score).

        Exact: the hits equal filtering and ranking all ``preselect`` candidates. Similarities are
        divided by the best pre-selected candidate's BM25 (readable or not), so the ranking, not the
        scale, matches the unbatched path. ``excluded`` and ``candidates`` cover the candidates read.
        """
        pre = self.index.search(query, limit=self.preselect, run=run)
        top = pre[0][1] if pre else 1.0
        excluded: dict[str, str] = {}
        scored: list[tuple[float, str, float, tuple]] = []
        best: list[tuple[float, str, float, tuple]] = []
        pos, batch = 0, max(4 * k, 32)
        while pos < len(pre):
            chunk = pre[pos : pos + batch]
            pos, batch = pos + len(chunk), batch * 2
            rows = self._indexed([i for i, _ in chunk])  # the inherited index: filter and trust in one read
            readable, why_not = self.policy.filter(agent, rows)  # filtering happens before any scoring
            excluded.update(why_not)
            lexical = dict(chunk)
            for i in readable:
                why = standing(i, *rows[i])
                if why is not None:
                    excluded[i] = why
                    continue
                sim = lexical[i] / top
                scored.append((sim * rows[i][1].path_trust, i, sim, rows[i]))
            best = heapq.nsmallest(k, scored, key=lambda r: (-r[0], r[1]))
            if len(best) == k and pos < len(pre) and best[-1][0] > pre[pos][1] / top:
                break  # every unread candidate scores at most its similarity, below the k-th hit
        hits = [Hit(id=i, score=score, similarity=s, trust=row[1].path_trust, text=row[0].text, rederive=list(row[1].rederive)) for score, i, s, row in best]
        return RetrievalResult(agent=agent, query=query, hits=hits, excluded=excluded, candidates=pos)
