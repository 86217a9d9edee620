"""lab.training.data: the plays through the registry, the character tokenizer, the split by play, the sampler."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lab.training import data as td
from lab.training.errors import TrainingError


@pytest.fixture(scope="module")
def plays() -> dict[str, str]:
    return td.load_plays()


@pytest.fixture(scope="module")
def corpus(plays) -> td.TextCorpus:
    return td.TextCorpus(texts=plays)


def test_the_42_texts_load_through_the_registry(plays):
    assert len(plays) == 42
    assert list(plays) == sorted(plays)
    assert {"hamlet", "sonnets", "henry_iv_part_1", "winters_tale"} <= set(plays)
    assert sum(len(t) for t in plays.values()) == 5_057_198  # ASCII: characters == bytes
    assert plays["hamlet"].startswith("HAMLET, PRINCE OF DENMARK")


def test_split_is_by_play_disjoint_and_complete(plays, corpus):
    train, val = td.split_plays(plays)
    assert val == sorted(td.VALIDATION_PLAYS) == corpus.val_plays
    assert train == corpus.train_plays and len(train) == 38
    assert not set(train) & set(val)
    assert set(train) | set(val) == set(plays)
    # the streams are exactly the texts joined in sorted order
    assert len(corpus.val_tokens) == sum(len(plays[n]) for n in val) + len(td.SEPARATOR) * (len(val) - 1) == 601_858
    assert len(corpus.train_tokens) == sum(len(plays[n]) for n in train) + len(td.SEPARATOR) * (len(train) - 1) == 4_455_420
    assert corpus.tokenizer.decode(corpus.val_tokens[:25]) == "HAMLET, PRINCE OF DENMARK"  # hamlet sorts first
    # no validation text leaks into the training stream
    train_text = corpus.tokenizer.decode(corpus.train_tokens)
    assert plays["hamlet"][1000:1200] not in train_text
    assert plays["macbeth"][1000:1200] in train_text


def test_split_refuses_unknown_or_empty():
    with pytest.raises(td.DataConfigError, match=r"\['hamlet_ii'\] are not among"):
        td.split_plays(["hamlet", "macbeth"], ["hamlet_ii"])
    with pytest.raises(td.DataConfigError, match="both must be non-empty"):
        td.split_plays(["hamlet"], ["hamlet"])
    assert issubclass(td.DataConfigError, TrainingError) and issubclass(td.DataConfigError, ValueError)


def test_tokenizer_is_built_from_the_training_text_and_round_trips(plays, corpus, tmp_path):
    tok = corpus.tokenizer
    assert tok.vocab_size == 85 and len(tok.chars) == 84
    assert list(tok.chars) == sorted(tok.chars) and "\n" in tok.chars and "\r" not in tok.chars
    assert corpus.n_unknown_val == 0
    for name in ("hamlet", "sonnets", "tempest"):
        ids = tok.encode(plays[name])
        assert ids.dtype == np.int64 and ids.shape == (len(plays[name]),)
        assert ids.min() >= 1 and ids.max() < tok.vocab_size
        assert tok.decode(ids) == plays[name]
        assert tok.decode(torch.from_numpy(ids)) == plays[name]
    # JSON save/load gives the same tokenizer
    path = tok.save(tmp_path / "vocab.json")
    raw = json.loads(path.read_text())
    assert raw["kind"] == "char" and raw["chars"] == tok.chars
    assert td.CharTokenizer.load(path) == tok
    # made-up text: unknown characters map to 0 and decode to U+FFFD
    small = td.CharTokenizer.from_text("abcab")
    assert small.chars == "abc" and small.vocab_size == 4
    assert small.encode("cab").tolist() == [3, 1, 2]
    assert small.encode("aXé").tolist() == [1, 0, 0]
    assert small.decode([1, 0, 3]) == "a\ufffdc"
    with pytest.raises(td.TokenizerError):
        small.decode([4])


def test_tokenizer_load_refuses_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "bpe"}')
    with pytest.raises(td.TokenizerError, match="not a CharTokenizer vocabulary"):
        td.CharTokenizer.load(bad)
    with pytest.raises(td.TokenizerError):
        td.CharTokenizer.load(tmp_path / "missing.json")


def test_sampler_is_a_pure_function_of_seed_step_rank_world():
    a = td.BatchSampler(100_000, 32, 4, world_size=2, seed=7)
    b = td.BatchSampler(100_000, 32, 4, world_size=2, seed=7)
    for step in (1, 2, 50, 10_000):
        for rank in (0, 1):
            assert np.array_equal(a.offsets(step, rank), b.offsets(step, rank))
    # called in any order, the answer is the same (no hidden state)
    first = a.offsets(3, 1).copy()
    a.offsets(99, 0)
    assert np.array_equal(a.offsets(3, 1), first)
    assert not np.array_equal(a.offsets(3, 1), a.offsets(4, 1))
    assert not np.array_equal(a.offsets(3, 1), td.BatchSampler(100_000, 32, 4, world_size=2, seed=8).offsets(3, 1))
    # the global batch depends on world_size * batch_size only
    one = td.BatchSampler(100_000, 32, 8, world_size=1, seed=7)
    assert np.array_equal(one.global_offsets(5), a.global_offsets(5))


def test_ranks_see_disjoint_windows_that_make_up_the_global_batch():
    s = td.BatchSampler(10_000, 16, 8, world_size=4, seed=0)
    for step in range(1, 20):
        parts = [s.offsets(step, r) for r in range(4)]
        assert all(p.shape == (8,) and p.dtype == np.int64 for p in parts)
        flat = np.concatenate(parts)
        assert len(set(flat.tolist())) == 32  # no two ranks (and no two rows) share a window start
        assert np.array_equal(flat, s.global_offsets(step))
        assert flat.min() >= 0 and flat.max() + 16 + 1 <= 10_000


def test_batches_are_next_token_windows(corpus):
    s = td.BatchSampler(len(corpus.train_tokens), 64, 4, world_size=2, seed=0)
    x, y = s.batch(corpus.train_tokens, 1, 1)
    assert x.shape == y.shape == (4, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    o = s.offsets(1, 1)
    assert torch.equal(x[2], corpus.train_tokens[o[2] : o[2] + 64])
    assert torch.equal(y[2], corpus.train_tokens[o[2] + 1 : o[2] + 65])


def test_eval_windows_are_evenly_spaced_and_seed_independent():
    a = td.BatchSampler(10_000, 16, 4, seed=0).eval_offsets(3)
    b = td.BatchSampler(10_000, 16, 4, seed=5).eval_offsets(3)
    assert a.shape == (3, 4) and np.array_equal(a, b)
    flat = a.reshape(-1)
    assert flat[0] == 0 and flat[-1] == 10_000 - 16 - 1 and np.all(np.diff(flat) > 0)


def test_sampler_refuses_impossible_requests():
    with pytest.raises(td.DataConfigError, match="need at least 8"):
        td.BatchSampler(20, 16, 4, world_size=2)
    with pytest.raises(td.DataConfigError, match="seed"):
        td.BatchSampler(1000, 16, 4, seed=-1)
    s = td.BatchSampler(1000, 16, 4, world_size=2)
    with pytest.raises(td.DataConfigError, match="rank"):
        s.offsets(1, 2)
    with pytest.raises(td.DataConfigError, match="step"):
        s.offsets(-1, 0)


def test_test_split_is_held_out_of_training_and_disjoint_from_validation(plays):
    c = td.TextCorpus(texts=plays, test_plays=td.TEST_PLAYS)
    assert c.test_plays == sorted(td.TEST_PLAYS) and c.val_plays == sorted(td.VALIDATION_PLAYS)
    assert len(c.train_plays) == 34 and not set(c.train_plays) & (set(td.TEST_PLAYS) | set(td.VALIDATION_PLAYS))
    assert len(c.test_tokens) == sum(len(plays[n]) for n in c.test_plays) + len(td.SEPARATOR) * 3
    assert len(c.train_tokens) + len(c.test_tokens) + len(td.SEPARATOR) * 4 == 4_455_420 + len(td.SEPARATOR) * 3
    assert c.tokenizer.vocab_size == 85 and c.n_unknown_test == 0
    train_text = c.tokenizer.decode(c.train_tokens)
    assert plays["macbeth"][1000:1200] not in train_text and plays["lear"][1000:1200] in train_text
    assert len(td.TextCorpus(texts=plays).test_tokens) == 0  # no test split unless one is named
    with pytest.raises(td.DataConfigError, match=r"\['hamlet'\] are in both"):
        td.split_plays(plays, td.VALIDATION_PLAYS, ["hamlet", "macbeth"])
    with pytest.raises(td.DataConfigError, match=r"test plays \['macbeth_ii'\]"):
        td.split_plays(plays, td.VALIDATION_PLAYS, ["macbeth_ii"])
