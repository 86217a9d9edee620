"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.hpc.testbed import Testbed, TestbedError
from tests.memtx_support import pg_server  # noqa: F401  (one PostgreSQL server for the whole session, not one per module)


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


@pytest.fixture(scope="module")
def testbed(tmp_path_factory) -> Testbed:
    """Two real local Slurm sites, ``alpha`` (2 CPUs) and ``beta`` (1 CPU), per test module; always torn down.

    Fails (never skips) when Slurm cannot start, e.g. without Debian's slurm-wlm.
    """
    tb = Testbed(tmp_path_factory.mktemp("tb"), timeout_s=30, grace_s=10)
    try:
        tb.up(["alpha", "beta"], cpus=[2, 1], memory_mb=[4000, 2000])
    except TestbedError as exc:
        tb.down()
        pytest.fail(f"could not start the Slurm testbed: {exc}")
    try:
        yield tb
    finally:
        tb.down()
