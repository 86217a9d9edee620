"""The committed benchmark results that the notebooks show, shipped with the package.

``restoration.json`` here is the committed run of ``python -m benchmarks.restoration`` (every method x task x
prior at NFE 20, 50 and 100), byte for byte the same file as ``benchmarks/results/restoration.json``:
``make bench`` writes both (``--ship``), and ``tests/test_generative_results.py`` fails when they differ.
It ships as package data, so notebook 07 reads it through :func:`load_results` from any folder (a copy of the
notebook outside the checkout, an installed wheel), never by looking for ``benchmarks/`` beside it.

>>> from lab.generative.results import load_results
>>> bench = load_results("restoration")            # doctest: +SKIP
>>> sorted(bench)[:3]                               # doctest: +SKIP
['benchmark', 'claims', 'degraded']
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.generative.errors import ResultsError, ResultsNotFoundError

__all__ = ["RESULTS_DIR", "SHIPPED", "names", "results_path", "load_results", "ResultsError", "ResultsNotFoundError"]

#: the folder of the shipped results (inside the package: it travels with a clone, an editable install and a wheel)
RESULTS_DIR = Path(__file__).resolve().parent
#: the benchmarks whose committed result ships here (each is ``benchmarks/results/<name>.json``)
SHIPPED = ("restoration",)


def names() -> list[str]:
    """The shipped results, sorted (``"restoration"``)."""
    return sorted(p.stem for p in RESULTS_DIR.glob("*.json"))


def results_path(name: str = "restoration") -> Path:
    """The shipped file of benchmark ``name``, ``lab/generative/results/<name>.json`` (it may be missing)."""
    if not isinstance(name, str) or not name or Path(name).name != name or name.startswith("."):
        raise ResultsError(f"benchmark result name must be a plain name such as 'restoration', not {name!r}",
                           name=str(name), path=None)
    return RESULTS_DIR / f"{name}.json"


def load_results(name: str = "restoration") -> dict:
    """The committed results of benchmark ``name`` (the JSON its ``--out`` wrote), as a dict.

    Raises
    ------
    ResultsNotFoundError
        ``name`` is not a shipped result, or its file is missing; the message names the file, lists what is
        shipped and says how to restore it.
    ResultsError
        The file exists but is not a JSON object (the message names the file and the parse error).
    """
    path = results_path(name)
    if name not in SHIPPED:
        raise ResultsNotFoundError(
            f"no shipped benchmark result named {name!r} (no {path}); shipped: {', '.join(SHIPPED)}", name=name, path=path
        )
    if not path.is_file():
        shipped = ", ".join(names()) or "none"
        raise ResultsNotFoundError(
            f"benchmark result {name!r}: {path} is missing (shipped results: {shipped}). It is package data of "
            f"research-lab, a copy of benchmarks/results/{name}.json: reinstall the package (`make setup`), or "
            f"rerun the benchmark with `python -m benchmarks.{name} --out benchmarks/results/{name}.json --ship`",
            name=name, path=path,
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"benchmark result {name!r}: {path} is not valid JSON ({exc})", name=name, path=path) from None
    if not isinstance(data, dict):
        raise ResultsError(f"benchmark result {name!r}: {path} holds a JSON {type(data).__name__}, not an object",
                           name=name, path=path)
    return data
