"""Candidate pre-selection for retrieval: an Okapi BM25 inverted index over a graph's record texts.

MAP-Graph (arXiv 2608.10509, Sec. 3) filters by permission *before* ranking; over a large store
the ranking itself must start from a small candidate set, or each query pays for every record.
:class:`TextIndex` keeps, per token, the records whose text holds it (sources, memories and
claims; current versions only) and answers a query with the ``limit`` records of highest BM25
(Robertson and Zaragoza 2009, Eq. 3.4; ``idf = ln(1 + (N - n + 0.5) / (n + 0.5))``, the form
Lucene uses, which never goes negative). :class:`~lab.provenance.retrieve.Retriever` calls it
inside every query, so the pre-selection is part of the measured latency.

Freshness: before every search the index reads the store's version log past the last version it
saw (one indexed range query; a store another process wrote is caught up the same way), so a new
record, a changed text or a node that is no longer a record takes effect on the next search.
Access control is **not** applied here: what the index returns are candidates, and the hard filter
(:class:`~lab.provenance.access.AccessPolicy`) runs on them before anything is ranked.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np

from lab.provenance.graph import NodeType, ProvenanceGraph

__all__ = ["TextIndex", "tokens", "store_version"]

_TOKEN = re.compile(r"[a-z0-9]+")
_RECORD_TYPES = frozenset({NodeType.SOURCE.value, NodeType.MEMORY.value, NodeType.CLAIM.value})


def store_version(graph: ProvenanceGraph) -> tuple[int, int] | None:
    """A value that changes whenever anything is written to ``graph``'s store, or ``None`` inside an
    open transaction (whose reads may see writes a rollback undoes: nothing read there may be cached).

    ``(PRAGMA data_version, total_changes)``: SQLite changes the first when another connection
    (another process) commits, the second counts this connection's own writes.
    """
    if graph._depth:  # the graph offers no public view of its connection or transaction depth
        return None
    conn = graph._conn
    return (conn.execute("PRAGMA data_version").fetchone()[0], conn.total_changes)


def tokens(text: str) -> list[str]:
    """Lower-cased alphanumeric word tokens (the tokenizer of :class:`~lab.provenance.embed.BM25Scorer`)."""
    return _TOKEN.findall(text.lower())


class TextIndex:
    """Okapi BM25 over the texts of a graph's sources, memories and claims, kept current by its version log.

    Parameters
    ----------
    graph : ProvenanceGraph
        The store to index (read only).
    k1, b : float
        BM25's term-frequency saturation and length normalization (defaults: rank_bm25's 1.5, 0.75).

    Notes
    -----
    Memory: one posting (doc number, term count) per distinct token of each indexed version; a
    record whose text changes leaves a dead posting behind (skipped by a liveness mask).
    """

    def __init__(self, graph: ProvenanceGraph, *, k1: float = 1.5, b: float = 0.75):
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.graph, self.k1, self.b = graph, float(k1), float(b)
        self._seen = 0  # highest node_versions rowid indexed
        self._ids: list[str] = []  # doc number -> record id
        self._runs: list[str | None] = []
        self._doc_of: dict[str, int] = {}  # record id -> doc number of its current version
        self._alive = np.zeros(0, bool)
        self._length = np.zeros(0, np.float64)
        self._postings: dict[str, tuple[list[int], list[int]]] = {}
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._df: Counter[str] = Counter()  # live documents per token
        self._terms: list[tuple[str, ...]] = []  # doc number -> its distinct tokens
        self._total_length = 0.0
        self._norm: np.ndarray | None = None  # BM25's per-document length term, recomputed after a change
        self.refresh()

    def __len__(self) -> int:
        """The number of records indexed (current versions)."""
        return len(self._doc_of)

    def refresh(self) -> int:
        """Index every node version written since the last call; returns how many were read."""
        # the version log is the store's own table; the graph offers no public cursor over it
        rows = self.graph._conn.execute(
            "SELECT rowid, id, type, body FROM node_versions WHERE rowid > ? ORDER BY rowid", (self._seen,)
        ).fetchall()
        if not rows:
            return 0
        latest: dict[str, tuple[str, str]] = {}
        for _, node_id, typ, body in rows:
            latest[node_id] = (typ, body)  # only a node's newest version counts
        grow = len(self._ids) + len(latest)
        if grow > len(self._alive):
            cap = max(grow, 2 * len(self._alive), 1024)
            self._alive = np.concatenate([self._alive, np.zeros(cap - len(self._alive), bool)])
            self._length = np.concatenate([self._length, np.zeros(cap - len(self._length))])
        changed = False
        for node_id, (typ, body) in latest.items():
            old = self._doc_of.pop(node_id, None)
            if old is not None:
                self._kill(old)
                changed = True
            if typ not in _RECORD_TYPES:
                continue
            changed = True
            data = json.loads(body)
            counts = Counter(tokens(data.get("text", "")))
            doc = len(self._ids)
            self._ids.append(node_id)
            self._runs.append(data.get("run"))
            self._doc_of[node_id] = doc
            self._alive[doc] = True
            n = sum(counts.values())
            self._length[doc] = n
            self._total_length += n
            self._terms.append(tuple(counts))
            for term, tf in counts.items():
                plist = self._postings.get(term)
                if plist is None:
                    plist = self._postings[term] = ([], [])
                plist[0].append(doc)
                plist[1].append(tf)
                self._df[term] += 1
                self._arrays.pop(term, None)
        self._seen = rows[-1][0]
        if changed:
            self._norm = None
        return len(rows)

    def _kill(self, doc: int) -> None:
        self._alive[doc] = False
        self._total_length -= self._length[doc]
        for term in self._terms[doc]:
            self._df[term] -= 1

    def _array(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        arr = self._arrays.get(term)
        if arr is None:
            plist = self._postings.get(term)
            if plist is None:
                return None
            arr = self._arrays[term] = (np.asarray(plist[0], np.int64), np.asarray(plist[1], np.float64))
        return arr

    def search(self, query: str, *, limit: int = 1000, run: str | None = None) -> list[tuple[str, float]]:
        """The ``limit`` records of highest BM25 for ``query`` (score > 0), best first.

        Parameters
        ----------
        query : str
        limit : int
            How many candidates at most (>= 1).
        run : str, optional
            Only records of this agent run.

        Returns
        -------
        list of (str, float)
            ``(record id, BM25 score)``, scores descending (ties: the earlier-written record first).

        Raises
        ------
        ValueError
            ``limit`` < 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.refresh()
        n_docs = len(self._doc_of)
        if n_docs == 0:
            return []
        avgdl = max(self._total_length / n_docs, 1e-9)
        size = len(self._ids)
        scores = np.zeros(size)
        touched = []
        if self._norm is None or len(self._norm) != size:
            self._norm = self.k1 * (1 - self.b + self.b * self._length[:size] / avgdl)
        norm = self._norm
        for term in dict.fromkeys(tokens(query)):
            arr = self._array(term)
            df = self._df.get(term, 0)
            if arr is None or df <= 0:
                continue
            docs, tf = arr
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            scores[docs] += idf * tf * (self.k1 + 1) / (tf + norm[docs])
            touched.append(docs)
        if not touched:
            return []
        hit = np.flatnonzero(scores)  # the documents holding a query token (BM25 terms are > 0)
        hit = hit[self._alive[hit]]
        if run is not None:
            hit = hit[np.asarray([self._runs[d] == run for d in hit], bool)]
        hit = hit[scores[hit] > 0]
        if len(hit) > limit:
            hit = hit[np.argpartition(-scores[hit], limit - 1)[:limit]]
        order = hit[np.lexsort((hit, -scores[hit]))]
        ids = self._ids
        return [(ids[d], s) for d, s in zip(order.tolist(), scores[order].tolist())]
