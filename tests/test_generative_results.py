"""The committed benchmark results shipped with lab (lab.generative.results): the shipped restoration.json is
byte for byte benchmarks/results/restoration.json, is package data, and a missing or broken file is a typed
error naming the file."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

import lab
from lab.generative import GenerativeError
from lab.generative import results as R

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_copy_is_the_committed_benchmark_output():
    """Nothing may drift: `make bench` writes both (benchmarks.restoration --ship); a hand edit of either fails here."""
    committed = ROOT / "benchmarks" / "results" / "restoration.json"
    shipped = R.results_path("restoration")
    assert shipped == ROOT / "lab" / "generative" / "results" / "restoration.json"
    assert shipped.read_bytes() == committed.read_bytes(), (
        f"{shipped} differs from {committed}: rerun the benchmark with --ship, or copy the committed run over the shipped one"
    )


def test_the_shipped_copy_is_package_data():
    """An installed wheel carries the file (pyproject's package-data), so the notebook does not need the checkout."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data.get("lab.generative.results", [])
    assert [n for n in R.SHIPPED if any(fnmatch(f"{n}.json", g) for g in globs)] == list(R.SHIPPED), globs
    assert R.names() == sorted(R.SHIPPED)


def test_load_results_reads_the_committed_run():
    bench = R.load_results("restoration")
    assert bench["benchmark"] == "restoration"
    binding = sorted((g["prior"], g["nfe"]) for g in bench["goals"] if g.get("binding"))
    assert binding == sorted((p, n) for p in ("mnist", "natural32", "medical32") for n in (20, 50, 100))


def test_a_missing_file_is_a_typed_error_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "RESULTS_DIR", tmp_path)
    with pytest.raises(R.ResultsNotFoundError) as missing:
        R.load_results("restoration")
    err = missing.value
    assert isinstance(err, GenerativeError) and isinstance(err, lab.LabError) and isinstance(err, FileNotFoundError)
    assert err.name == "restoration" and err.path == tmp_path / "restoration.json"
    assert str(tmp_path / "restoration.json") in str(err)
    assert "benchmarks/results/restoration.json" in str(err) and "--ship" in str(err)  # how to get it back


def test_an_unknown_name_and_a_broken_file_are_refused_naming_the_file(tmp_path, monkeypatch):
    with pytest.raises(R.ResultsNotFoundError, match=r"no shipped benchmark result named 'restorations'.*shipped: restoration"):
        R.load_results("restorations")
    with pytest.raises(R.ResultsError, match="plain name"):
        R.load_results("../benchmarks/results/restoration")
    monkeypatch.setattr(R, "RESULTS_DIR", tmp_path)
    (tmp_path / "restoration.json").write_text('{"benchmark": "restoration", ')
    with pytest.raises(R.ResultsError, match=r"restoration\.json is not valid JSON") as broken:
        R.load_results("restoration")
    assert not isinstance(broken.value, FileNotFoundError) and broken.value.path == tmp_path / "restoration.json"
    (tmp_path / "restoration.json").write_text("[1, 2]")
    with pytest.raises(R.ResultsError, match="holds a JSON list, not an object"):
        R.load_results("restoration")
