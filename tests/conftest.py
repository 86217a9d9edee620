"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tmp_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``$LAB_DATA_CACHE`` (so no test reads or writes the user's pooch cache)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("LAB_DATA_CACHE", str(cache))
    return cache


@pytest.fixture
def tmp_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache_dir: Path) -> Path:
    """An empty ``$LAB_DATA_DIR``, with an empty ``$LAB_DATA_CACHE`` beside it (see ``tmp_cache_dir``)."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("LAB_DATA_DIR", str(data))
    return data
