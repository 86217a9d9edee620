"""Every teaching notebook runs top to bottom in a fresh kernel (nbclient), as a reader would run it.

Each notebook ends with an exercise: one code cell tagged ``exercise`` that ships with a placeholder,
and one tagged ``exercise-check`` (source hidden) that says "Exercise: not answered yet" for the
placeholder. In the same kernel, after the notebook has run, the reference solution
(``notebooks/solutions/<stem>.py``) followed by the check must print "Exercise: correct", and a
plausible wrong attempt (``<stem>.wrong.py``) followed by the check must raise AssertionError whose
message names the mistake (the wrong file's first line, ``# expect: <text>``, gives the text).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SOLUTIONS = Path(__file__).resolve().parents[1] / "notebooks" / "solutions"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/html", "") + out.data.get("text/plain", ""))
    return "\n".join(parts)


NEEDS_SLURM = {"02_federated_sites.ipynb"}


def _exercise(nb, path: Path):
    """The notebook's exercise cell and hidden check cell, and its reference and wrong solutions' sources."""
    tagged = {tag: [(i, c) for i, c in enumerate(nb.cells) if tag in c.get("metadata", {}).get("tags", [])] for tag in ("exercise", "exercise-check")}
    for tag, cells in tagged.items():
        assert len(cells) == 1 and cells[0][1].cell_type == "code", f"{path.name}: needs exactly one code cell tagged {tag!r}, has {len(cells)}"
    (i_ex, exercise), (i_check, check) = tagged["exercise"][0], tagged["exercise-check"][0]
    assert i_ex < i_check, f"{path.name}: the exercise-check cell must come after the exercise cell"
    assert check.metadata.get("jupyter", {}).get("source_hidden") is True, f"{path.name}: the exercise-check cell needs metadata jupyter.source_hidden = true"
    sources = []
    for name in (f"{path.stem}.py", f"{path.stem}.wrong.py"):
        file = SOLUTIONS / name
        assert file.is_file(), f"{path.name}: missing notebooks/solutions/{name}"
        sources.append(file.read_text())
    assert sources[0].strip() != exercise.source.strip(), f"{path.name}: the reference solution is the shipped exercise cell"
    expect = re.match(r"# expect: (.+?)   \(", sources[1])
    assert expect, f"{path.name}: {path.stem}.wrong.py must start with '# expect: <what the check says of this mistake>   (...'"
    return exercise, check, sources[0], sources[1], expect.group(1)


def _run_extra(client: NotebookClient, nb, source: str):
    """Execute ``source`` as one more cell in the notebook's running kernel (the cell is not kept in ``nb``)."""
    cell = nbformat.v4.new_code_cell(source)
    nb.cells.append(cell)
    try:
        client.execute_cell(cell, len(nb.cells) - 1)
    finally:
        nb.cells.pop()
    return cell


def _attempt_exercise(client: NotebookClient, nb, path: Path, check, solution: str, wrong: str, expect: str) -> None:
    """After the shipped run: the solution passes the check, and the wrong attempt makes it raise."""
    shipped = _text(check)
    assert "Exercise: not answered yet" in shipped, f"{path.name}: the shipped check said {shipped!r}"
    _run_extra(client, nb, solution)
    passed = _text(_run_extra(client, nb, check.source))
    assert "Exercise: correct" in passed, f"{path.name}: the reference solution's check said {passed!r}"
    _run_extra(client, nb, wrong)  # a wrong attempt still runs; only the check refuses it
    with pytest.raises(CellExecutionError) as refused:
        _run_extra(client, nb, check.source)
    assert refused.value.ename == "AssertionError", f"{path.name}: the check should fail the wrong attempt with AssertionError, not {refused.value.ename}"
    assert expect in refused.value.evalue, f"{path.name}: the check refused the wrong attempt without naming its mistake ({expect!r}): {refused.value.evalue!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_exercise(path):
    _exercise(nbformat.read(path, as_version=4), path)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=[pytest.mark.slurm] if p.name in NEEDS_SLURM else []) for p in NOTEBOOKS], ids=[p.name for p in NOTEBOOKS]
)
def test_notebook_runs_headless(path, monkeypatch):
    # The kernel's temporary folders (the notebooks' tempfile.mkdtemp), IPython profile and connection files go to
    # one scratch folder, removed afterwards: a run leaves nothing in /tmp, ~/.ipython or the notebooks folder.
    # It is short (Slurm's sockets live under notebook 02's folder), hence not pytest's tmp_path.
    before = set(path.parent.iterdir())
    scratch = Path(tempfile.mkdtemp(prefix="nb-"))
    for var, sub in (("TMPDIR", "tmp"), ("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "runtime")):
        (scratch / sub).mkdir()
        monkeypatch.setenv(var, str(scratch / sub))
    try:
        _run_notebook(path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert set(path.parent.iterdir()) == before, f"the run left {sorted(p.name for p in set(path.parent.iterdir()) - before)} in notebooks/"


def _run_notebook(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    exercise, check, solution, wrong, expect = _exercise(nb, path)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    with client.setup_kernel():  # one kernel: the notebook as shipped, then the exercise's attempts
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        _attempt_exercise(client, nb, path, check, solution, wrong, expect)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    if path.name == "01_site_queues.ipynb":
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "3,170" in _text(code[0])  # the HPC2N trace displayed through kernels_ext
        widget = [c for c in code if "QueueDashboard(" in c.source][0]
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in widget.outputs)
        answer = _text([c for c in code if "median wait of jobs started days 38-45" in c.source][0])
        for site in ("Theta 2022", "Theta 2023", "HPC2N"):
            assert site in answer
    if path.name == "03_provenance.ipynb":
        out = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
        assert re.search(r"runs\s+200\n", out)  # all 200 real trajectories ingested
        assert "missing label 'user:sophia_silva_7557'" in out  # another user's assistant is refused
        gate = [c for c in nb.cells if c.cell_type == "code" and "revoke_source" in c.source][0]
        assert "allow" in _text(gate) and "block" in _text(gate)  # the gate before and after the revocation
        assert "round trip: 19 nodes, 31 edges" in out and "agent(lab:tau-airline%2Ftask32%2Ftrial1%2Fagent" in out
    if path.name == "05_gradient_communication.ipynb":
        code = [c for c in nb.cells if c.cell_type == "code"]
        out = "\n".join(_text(c) for c in code)
        assert "4,455,420 training and 601,858 validation characters" in out  # the 42 plays through lab.data
        assert "{'fp32': 0, 'fp8': 0, 'gift_fp8': 0, 'scape90': 0}" in out  # four 2-rank torchrun jobs, all exit 0
        assert "all runs finished: True" in out and "fewest bytes: scape90 (0.100 of fp32)" in out
        assert "by hand == FP8Codec('e4m3').encode(g): True" in out  # the FP8 formula, byte for byte
        assert "every layer's error lower with GIFT: True" in out  # B^{-1/2} G A^{-1/2} on the fresh model's layers
        assert "(computed at the end of step 2): True" in out and "unmasked coordinates frozen (parameter and m unchanged): True" in out
        assert "every run's median step sent exactly the formula's bytes: True" in out  # the byte accounting
        assert not list(path.parent.glob("runs-*")), "notebook 05 writes its runs into a temporary folder, not next to itself"
        widget = [c for c in code if "TrainingMonitor(" in c.source][0]
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in widget.outputs)
        root = re.search(r"^runs and their event log in (\S+)$", out, re.M)
        assert root and Path(root.group(1)).name.startswith("lab05-"), out
    if path.name == "07_image_restoration.ipynb":
        code = [c for c in nb.cells if c.cell_type == "code"]
        out = "\n".join(_text(c) for c in code)
        assert "|grad_a J| = " in out and "J at the minimiser" in out  # the closed form minimises the defect
        assert "total measurement weight int c(t) dt = 1.410" in out  # kappa = 5
        rows = re.findall(r"^(\w+): bayes ([\d.]+) variant ([\d.]+) flower ([\d.]+) pnp_flow ([\d.]+) rebridge ([\d.]+)$", out, re.M)
        assert [r[0] for r in rows] == ["denoise", "deblur", "sr2", "inpaint_random", "inpaint_box"], rows
        for task, bayes, variant, flower, pnp, rebridge in rows:
            bayes, variant, flower, pnp, rebridge = map(float, (bayes, variant, flower, pnp, rebridge))
            assert abs(variant - bayes) <= 0.5, (task, bayes, variant)  # the variant within 0.5 dB of the Bayes ceiling
            assert rebridge < flower and rebridge < pnp, (task, rebridge, flower, pnp)  # ReBridge-Flow as written under both
            assert bayes >= flower, (task, bayes, flower)
        widget = [c for c in code if "RestorationDemo(" in c.source][0]
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in widget.outputs)
        assert re.search(r"ReBridge-Flow \(as written\) on inpaint_box at 50 NFE: degraded [\d.]+ dB", out)
        # the committed benchmark's learned-prior table: variant vs Flower per learned prior and NFE
        goals = re.findall(r"^(\w+)\s+NFE\s+(\d+): variant - Flower \(dB\) .* -> wins (\d)/5$", out, re.M)
        assert sorted((p, int(n)) for p, n, _ in goals) == sorted(
            (p, n) for p in ("mnist", "natural32", "medical32") for n in (20, 50, 100)), goals
    if path.name == "02_federated_sites.ipynb":
        out = "\n".join(_text(c) for c in nb.cells if c.cell_type == "code")
        assert "job.completed exit code 0 -> output: 800000" in out  # wc -l of the staged input, via the continuation
        assert "sha256 verified: True" in out
        assert "['theta', 'polaris', 'hpc2n', 'nasa']" in out  # every site stopped at the end


def test_notebooks_exist():
    assert [p.name for p in NOTEBOOKS][:3] == ["01_site_queues.ipynb", "02_federated_sites.ipynb", "03_provenance.ipynb"]
