"""The notebooks read what they need through `lab` (the data registry, package data), never through paths
relative to the checkout, so a copy of a notebook runs from any folder.

Notebook 07 is run headless (nbclient) from a copy in pytest's ``tmp_path``, outside the repository, with the
kernel's working directory there: before the fix it stopped with a bare StopIteration, looking for
``benchmarks/results`` among the working directory's parents. A static check keeps every notebook free of
such lookups.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# A code cell that looks for the checkout: the working directory's parents, this file's folder, or the repository's
# own folders named as paths (benchmarks/results, lab/data/files, tests/, notebooks/).
REPO_RELATIVE = re.compile(
    r"Path\.cwd\(\)\.parents|os\.getcwd\(\).*\.\.|__file__|\.\./"
    r"|[\"'/](benchmarks|lab/data/files|tests|notebooks)/|[\"']benchmarks[\"']\s*\)?\s*/"
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_notebook_reads_a_path_relative_to_the_repository(path):
    nb = nbformat.read(path, as_version=4)
    found = [(i, m.group(0)) for i, c in enumerate(nb.cells) if c.cell_type == "code"
             for line in c.source.splitlines() if not line.lstrip().startswith("#")
             for m in [REPO_RELATIVE.search(line.split("  #")[0])] if m]
    assert not found, f"{path.name}: code cells reading paths relative to the checkout (read them through lab instead): {found}"


def _outputs(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_07_runs_from_a_copy_outside_the_repository(tmp_path, monkeypatch):
    assert ROOT not in tmp_path.parents and not any((d / "benchmarks" / "results").is_dir() for d in (tmp_path, *tmp_path.parents))
    copy = tmp_path / "07_image_restoration.ipynb"
    shutil.copy(ROOT / "notebooks" / "07_image_restoration.ipynb", copy)
    for var, sub in (("TMPDIR", "tmp"), ("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "runtime")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    probe = nbformat.v4.new_code_cell("import os; print(os.getcwd())")
    with client.setup_kernel():  # each cell raises CellExecutionError with its traceback on an error
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        nb.cells.append(probe)
        client.execute_cell(probe, len(nb.cells) - 1)
        nb.cells.pop()
    assert _outputs(probe).strip() == str(tmp_path)  # the kernel ran in the copy's folder, outside the checkout
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    # the committed benchmark's learned-prior table, read through lab.generative.results
    bench_cell = next(c for c in code if "load_results(" in c.source)
    goals = re.findall(r"^(\w+)\s+NFE\s+(\d+): variant - Flower \(dB\) .* -> wins (\d)/5$", _outputs(bench_cell), re.M)
    assert sorted((p, int(n)) for p, n, _ in goals) == sorted((p, n) for p in ("mnist", "natural32", "medical32") for n in (20, 50, 100))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["07_image_restoration.ipynb", "ipython", "runtime", "tmp"]
