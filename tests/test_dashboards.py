"""The Voila dashboards (notebooks/dashboards/): one short notebook per widget, widget first, the lesson a link away.

Each dashboard is a one-line title that links to its teaching notebook, then the code cell that builds the
widget through ``lab`` calls and shows it as its first output, then (optionally) one more code cell, and the
explanation collapsed in a ``<details>`` block at the end. Run headless (nbclient), each must show a widget as
the first output of the page, raise nothing, and leave nothing behind when its kernel ends: the dashboards that
start processes (Slurm sites, training runs) stop them and remove their folders at the kernel's exit.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DASHBOARDS = sorted((NOTEBOOKS / "dashboards").glob("*.ipynb"))
LINK_RE = re.compile(r"\]\(\.\./([\w.-]+\.ipynb)\)")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NEEDS_SLURM = {"02_live_sites.ipynb"}
# Counts the points a widget's plotly charts draw (a LiveChart's figure, or a FigureWidget's traces), through its children.
POINTS = """
def _points(w):
    fig, data = getattr(w, "figure", None), getattr(w, "data", None)
    n = sum(len(d.get("x") or []) for d in fig.get("data", [])) if isinstance(fig, dict) else 0
    n += sum(len(getattr(d, "x", None) or []) for d in data) if isinstance(data, tuple) else 0
    return n + sum(_points(c) for c in getattr(w, "children", ()))
"""
# What each dashboard's widget (``_shown``) must have drawn before the test ends its kernel: Python run in that
# kernel, which fails (AssertionError) if the widget shows no data within the time given.
DRAWS = {
    "01_queues.ipynb": "assert _points(_shown) > 0, _points(_shown)",
    "02_live_sites.ipynb": """
import time as _t
_deadline = _t.time() + 90
while _t.time() < _deadline and _points(_shown) == 0:
    _shown.refresh()
    _t.sleep(1)
assert _points(_shown) > 0, "no queue sample drawn in 90 s"
""",
    "03_provenance_explorer.ipynb": "assert len(_shown.elements.get('nodes', [])) > 10, list(_shown.elements)",
    "05_training_monitor.ipynb": """
import time as _t
_deadline = _t.time() + 240
while _t.time() < _deadline and min(len(_shown.trace(r, "loss")[0]) for r in ("fp32", "fp8")) < 3:
    _shown.refresh()
    _t.sleep(1)
assert all(len(_shown.trace(r, "loss")[0]) >= 3 for r in ("fp32", "fp8")), _shown.status.value
""",
    "06b_perf_model.ipynb": """
_bars = {t["name"]: t for t in _shown.bars.figure["data"]}
_fwd = next(t for t in _shown.gantt.figure["data"] if t["name"] == "forward")
assert {"linear", "attention", "pp_p2p", "measured step"} <= set(_bars), sorted(_bars)   # the benchmark's PP = 2 run
assert _bars["linear"]["x"] == ["stage 0", "stage 1"] and all(y > 0 for y in _bars["linear"]["y"]), _bars["linear"]
assert len(_fwd["x"]) == 2 * 4 and set(_fwd["y"]) == {"stage 0", "stage 1"} and min(_fwd["x"]) > 0, _fwd   # 4 micro-batches
assert _points(_shown.bars) >= 10 and _points(_shown.gantt) >= 16, (_points(_shown.bars), _points(_shown.gantt))
""",
    "07_restoration_demo.ipynb": """
import time as _t
_deadline = _t.time() + 180
while _t.time() < _deadline and (_shown.result is None or _points(_shown) == 0):   # the chart is drawn just after the result
    _t.sleep(0.5)
assert _shown.result is not None and _points(_shown) > 0, "no restoration drawn in 180 s"
""",
    "08_video_demo.ipynb": """
import time as _t
_deadline = _t.time() + 240
while _t.time() < _deadline and "lab-vd-row-real" not in _shown.table.value:
    _t.sleep(0.5)
assert _shown.table.value.count("<tr class=") == 5 and all(i.value for i in _shown.images.values()), "no videos drawn in 240 s"
""",
}


# Lessons that teach a method on a widget another lesson's dashboard already shares (and why): every other
# lesson has exactly one dashboard, so a new lesson fails here until it gets one or is listed with its reason.
LESSONS_ON_ANOTHER_DASHBOARD = {
    "04_memory_transactions.ipynb": "the provenance explorer (03's dashboard) with memtx=store",
    "04b_rollback_repair.ipynb": "the provenance explorer (03's dashboard) with repair=...",
    "06_resilient_training.ipynb": "the training monitor (05's dashboard), which shows hot swaps",
}


# Lessons whose widget has no dashboard yet: a known gap, named with its issue, not a rule. Remove the entry
# when the dashboard lands (the test then checks it like every other).
LESSONS_WITHOUT_A_DASHBOARD_YET: dict[str, str] = {}


def test_there_is_one_dashboard_per_widget_lesson():
    lessons = sorted(LINK_RE.search(nbformat.read(p, as_version=4).cells[0].source).group(1) for p in DASHBOARDS)
    exempt = set(LESSONS_ON_ANOTHER_DASHBOARD) | set(LESSONS_WITHOUT_A_DASHBOARD_YET)
    expected = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.name not in exempt)
    assert lessons == expected, lessons
    assert exempt <= {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert not set(LESSONS_WITHOUT_A_DASHBOARD_YET) & set(lessons), "a lesson with a dashboard is still listed as without one"
    assert sorted(p.name for p in DASHBOARDS) == sorted(DRAWS)


def test_every_dashboard_has_a_launcher_card_with_an_icon_the_extension_draws():
    from research_lab_ext.handlers import CATALOG

    icons = set(re.findall(r"^  (\w+): svg\(", (ROOT / "widgets/labextension/src/icons.ts").read_text(), re.M))
    assert sorted(CATALOG) == sorted(p.stem for p in DASHBOARDS), "a dashboard without its card (or a card without its dashboard)"
    ids = [entry[0] for entry in CATALOG.values()]
    assert len(set(ids)) == len(ids), ids
    for stem, (ident, label, caption, icon) in CATALOG.items():
        assert re.fullmatch(r"[a-z0-9-]+", ident) and label and caption, (stem, ident, label, caption)
        assert icon in icons, (stem, icon, sorted(icons))


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_is_a_title_the_widget_and_the_explanation_collapsed(path):
    cells = nbformat.read(path, as_version=4).cells
    title = cells[0]
    assert title.cell_type == "markdown" and len(title.source.strip().splitlines()) == 1 and title.source.startswith("#"), (
        f"{path.name}: the first cell must be a one-line title")
    link = LINK_RE.search(title.source)
    assert link and (NOTEBOOKS / link.group(1)).is_file(), f"{path.name}: the title must link to its teaching notebook (../NN_name.ipynb)"
    assert cells[1].cell_type == "code", f"{path.name}: the widget's cell comes right after the title"
    code = [c for c in cells if c.cell_type == "code"]
    assert 1 <= len(code) <= 2, f"{path.name}: a dashboard builds its widget in as few cells as possible, it has {len(code)}"
    for c in cells[2:]:
        if c.cell_type == "markdown":
            assert c.source.startswith("<details>") and c.source.rstrip().endswith("</details>"), (
                f"{path.name}: explanations after the widget are collapsed (<details>)")
    assert all(not c.get("outputs") for c in code), f"{path.name}: shipped without outputs"


def _text(cell) -> str:
    return "\n".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=[pytest.mark.slurm] if p.name in NEEDS_SLURM else []) for p in DASHBOARDS],
    ids=[p.name for p in DASHBOARDS],
)
def test_dashboard_runs_headless_shows_its_widget_first_and_cleans_up(path, monkeypatch):
    before = set(path.parent.iterdir())
    scratch = Path(tempfile.mkdtemp(prefix="nbd-"))
    for var, sub in (("TMPDIR", "tmp"), ("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "runtime")):
        (scratch / sub).mkdir()
        monkeypatch.setenv(var, str(scratch / sub))
    try:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
            errors = [o for o in outputs if o.output_type == "error"]
            assert not errors, errors
            shown = [o for o in outputs if o.output_type in ("display_data", "execute_result")]
            assert shown and WIDGET_VIEW in shown[0].get("data", {}), f"{path.name}: the first thing shown is not a widget: {shown[:1]}"
            assert len(shown) == 1, f"{path.name}: shows more than its widget: {[o.get('data', {}).get('text/plain') for o in shown[1:]]}"
            # the widget the page shows, by its model id, and what it drew
            probe = nbformat.v4.new_code_cell(
                "from ipywidgets.widgets.widget import _instances\n"
                f"_shown = _instances[{shown[0]['data'][WIDGET_VIEW]['model_id']!r}]\n"
                + POINTS + DRAWS[path.name].strip()
                + "\nprint('folders:', *[str(v) for v in (globals().get('work'), globals().get('root')) if v is not None])"
            )
            nb.cells.append(probe)
            client.execute_cell(probe, len(nb.cells) - 1)
            assert not [o for o in probe.outputs if o.output_type == "error"], probe.outputs
            folders = [Path(p) for p in re.search(r"^folders:(.*)$", _text(probe), re.M).group(1).split()]
        # the kernel has ended: what the dashboard started is stopped and its folders removed (atexit)
        deadline = time.monotonic() + 60
        while any(f.exists() for f in folders) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [f for f in folders if f.exists()], f"{path.name}: left {folders} behind after its kernel ended"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert set(path.parent.iterdir()) == before, f"the run left {sorted(p.name for p in set(path.parent.iterdir()) - before)} in dashboards/"
