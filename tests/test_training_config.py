"""Typed comm / optimizer settings of a run (lab.training.config) and TrainConfig's two ways of taking them."""

from __future__ import annotations

import json
import warnings

import pytest
from pydantic import ValidationError

from lab.training.comm import GiftConfig, GiftHookState
from lab.training.config import (
    AdamSOptimizer,
    CodecComm,
    GiftComm,
    ScapeOptimizer,
    comm_from_name,
    optimizer_from_name,
)
from lab.training.model import GPT, GPTConfig
from lab.training.optim import ScapeConfig
from lab.training.run import TrainConfig, _fingerprint, _make_optimizer, _resolve_hook


def _cfg(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(run_dir=tmp_path / "r", model=GPTConfig.tiny(85), **kw)


def test_by_name_and_typed_give_the_same_config_and_the_earlier_json(tmp_path):
    gift = {"measure_error": True, "damping": 1.0, "ema": 0.5, "refresh_every": 10, "layers": ["blocks.0.mlp.fc2"]}
    old = _cfg(tmp_path, optimizer="adams", optimizer_kwargs={"betas": (0.9, 0.99)}, comm="gift_fp8", comm_kwargs=gift)
    typed = _cfg(tmp_path, optimizer=AdamSOptimizer(betas=(0.9, 0.99)),
                 comm=GiftComm(hook="gift_fp8", measure_error=True,
                               gift=GiftConfig(damping=1.0, ema=0.5, refresh_every=10, layers=("blocks.0.mlp.fc2",))))
    assert old == typed
    assert isinstance(old.comm, GiftComm) and old.comm.gift.damping == 1.0 and old.comm.gift.n_eigenpairs == 32
    assert old.comm_kwargs == {**gift, "layers": ("blocks.0.mlp.fc2",)} and old.optimizer_kwargs == {"betas": (0.9, 0.99)}
    # written the earlier way (the monitor's run table reads cfg["optimizer"], cfg["comm"]) and read back equal
    d = json.loads(old.model_dump_json())
    assert (d["optimizer"], d["optimizer_kwargs"], d["comm"], d["comm_kwargs"]) == ("adams", {"betas": [0.9, 0.99]}, "gift_fp8", gift)
    path = old.save(tmp_path / "c.json")
    assert TrainConfig.load(path) == old
    # an earlier checkpoint's fingerprint (the fields as the dict-typed config held them) still matches
    fp = _fingerprint(old, old.model)
    assert (fp["optimizer"], fp["optimizer_kwargs"], fp["comm"]) == ("adams", {"betas": (0.9, 0.99)}, "gift_fp8")
    assert fp["comm_kwargs"] == {**gift, "layers": ("blocks.0.mlp.fc2",)}
    plain = _cfg(tmp_path)
    assert (plain.optimizer.name, plain.comm.hook, plain.optimizer_kwargs, plain.comm_kwargs) == ("adamw", "fp32", {}, {})


def test_bad_settings_raise_a_validation_error_naming_the_field(tmp_path):
    cases = [
        (dict(comm="fp8", comm_kwargs={"block_size": 0}), ("comm", "fp8", "block_size")),
        (dict(comm="fp8", comm_kwargs={"bogus": 1}), ("comm", "fp8", "bogus")),
        (dict(comm="gift_fp8", comm_kwargs={"damping": -1.0}), ("comm", "gift_fp8", "gift", "damping")),
        (dict(optimizer="adams", optimizer_kwargs={"betas": (0.9, 1.5)}), ("optimizer", "adams", "betas")),
        (dict(optimizer="scape", optimizer_kwargs={"sparsity": 1.5}), ("optimizer", "scape", "scape")),
        (dict(optimizer="adamw", optimizer_kwargs={"eps": -1.0}), ("optimizer", "adamw", "eps")),
    ]
    for kw, loc in cases:
        with pytest.raises(ValidationError) as info:
            _cfg(tmp_path, **kw)
        assert tuple(info.value.errors()[0]["loc"]) == loc, (kw, info.value.errors()[0])
    with pytest.raises(ValidationError, match="sparsity must be a number in"):
        _cfg(tmp_path, optimizer="scape", optimizer_kwargs={"sparsity": 1.5})
    with pytest.raises(ValidationError, match="'sgd' found using 'name' does not match"):
        _cfg(tmp_path, optimizer="sgd")
    with pytest.raises(ValidationError, match="not a setting of 'fp8_ef'"):
        _cfg(tmp_path, comm="fp8_ef", comm_kwargs={"error_feedback": False})
    with pytest.raises(ValidationError, match="fmt / block_size are settings of the fp8 hooks"):
        _cfg(tmp_path, comm="nvfp4", comm_kwargs={"fmt": "e5m2"})
    with pytest.raises(ValidationError, match="comm_kwargs goes with comm given by name"):
        _cfg(tmp_path, comm=CodecComm(hook="fp8"), comm_kwargs={"fmt": "e5m2"})
    with pytest.raises(ValidationError, match="must not hold 'weight_decay'"):
        _cfg(tmp_path, optimizer_kwargs={"weight_decay": 0.0})
    with pytest.raises(ValidationError, match="comm must be 'fp32'"):
        _cfg(tmp_path, optimizer="scape", comm="fp8")
    with pytest.raises(ValidationError, match="frozen"):
        plain = _cfg(tmp_path)
        plain.optimizer.eps = 1.0


def test_the_run_builds_the_hook_and_optimizer_from_the_typed_settings(tmp_path):
    model = GPT(GPTConfig.tiny(85))
    cfg = _cfg(tmp_path, comm="gift_fp8", comm_kwargs={"damping": 1.0, "n_eigenpairs": 4, "measure_error": True})
    state, _hook, _ = _resolve_hook(cfg, model)
    assert isinstance(state, GiftHookState) and state.config is cfg.comm.gift and state.measure_error
    assert state.n_eigenpairs == 4 and state.history.maxlen == 16
    state.close()
    state, _hook, _ = _resolve_hook(_cfg(tmp_path, comm="nvfp4", comm_kwargs={"error_feedback": True}), model)
    assert type(state).__name__ == "ErrorFeedbackState"
    opt = _make_optimizer(_cfg(tmp_path, optimizer="scape", optimizer_kwargs={"sparsity": 0.99}, seed=7), model)
    assert opt.config == ScapeConfig(sparsity=0.99, seed=7)  # the run's seed unless one is given
    opt = _make_optimizer(_cfg(tmp_path, optimizer="scape", optimizer_kwargs={"sparsity": 0.99, "seed": 3}, seed=7), model)
    assert opt.config.seed == 3
    warm = _make_optimizer(_cfg(tmp_path, optimizer="scape", optimizer_kwargs={"sparsity": 0.99, "sparsity_warmup": 40}), model)
    assert warm.config.sparsity_warmup == 40 and warm.sparsity_at(1) == 0.75 and warm.sparsity_at(41) == 0.99
    adams = _make_optimizer(_cfg(tmp_path, optimizer="adams", optimizer_kwargs={"betas": (0.8, 0.9)}), model)
    assert adams.param_groups[0]["betas"] == (0.8, 0.9)


def test_spec_helpers_and_the_deprecated_eigenpairs_alias():
    assert comm_from_name("fp8", {"fmt": "e5m2"}).kwargs() == {"fmt": "e5m2"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = comm_from_name("gift_fp8", {"rank": 8})  # an earlier run's comm_kwargs key
    assert spec.gift.n_eigenpairs == 8 and any(issubclass(w.category, DeprecationWarning) for w in caught)
    scape = optimizer_from_name("scape", {"sparsity": 0.9, "betas": (0.9, 0.95)})
    assert isinstance(scape, ScapeOptimizer) and scape.kwargs() == {"betas": (0.9, 0.95), "sparsity": 0.9}


def test_test_split_settings_are_checked_and_fingerprinted(tmp_path):
    with pytest.raises(ValidationError, match="eval_test needs test_plays"):
        TrainConfig(run_dir=tmp_path / "r", eval_test=True)
    with pytest.raises(ValidationError, match=r"test_plays \['hamlet'\] are also in val_plays"):
        TrainConfig(run_dir=tmp_path / "r", test_plays=["hamlet", "macbeth"])
    plain = TrainConfig(run_dir=tmp_path / "r")
    held = TrainConfig(run_dir=tmp_path / "r", test_plays=["macbeth"], eval_test=True)
    model = GPTConfig(vocab_size=85)
    assert "test_plays" not in _fingerprint(plain, model)  # earlier checkpoints still resume
    assert _fingerprint(held, model)["test_plays"] == ["macbeth"]  # another training stream: no resume across
    assert TrainConfig.model_validate_json(held.model_dump_json()) == held
