"""A dashboard's parameters from its page's URL query (``lab.url_query``, ``widgets.url_query``).

The parser is tested unit-level; the dashboards (notebooks/dashboards/) are run headless (nbclient) with
``QUERY_STRING`` set as Voila sets it, all in one kernel to keep it cheap: a bad query shows a message naming the
parameter and what it accepts, and no traceback, before anything heavy starts; a good query gives every
dashboard the values its widget's constructor takes (the heavy ones stop there, see ``_RECORD``); and the
provenance dashboard is built once from a query.
"""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
from pathlib import Path

import ipywidgets as W
import nbformat
import pytest
from nbclient import NotebookClient

from lab.url_query import Param, QueryError, describe, parse_query
from widgets.url_query import dashboard_query, page_query_string, query_message

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "notebooks" / "dashboards"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
README = (ROOT / "README.md").read_text()

SPEC = {
    "trace": Param(("a", "b", "c"), choices=("a", "b", "c"), many=True),
    "day": Param(30.0, float, minimum=0),
    "steps": Param(4, int, minimum=1, maximum=16),
    "mode": Param("x", choices=("x", "y")),
}


def test_defaults_when_the_query_gives_nothing_and_the_servers_keys_are_left_alone():
    assert parse_query("", SPEC) == {"trace": ("a", "b", "c"), "day": 30.0, "steps": 4, "mode": "x"}
    assert parse_query("?token=abc&voila-theme=dark", SPEC)["steps"] == 4


def test_values_are_read_decoded_typed_and_lists_split():
    q = parse_query("?trace=c,a,c&day=2.5&steps=16&mode=%79", SPEC)
    assert q == {"trace": ("c", "a"), "day": 2.5, "steps": 16, "mode": "y"}
    assert parse_query("trace=b", SPEC)["trace"] == ("b",)


@pytest.mark.parametrize("query, names", [
    ("steps=17", ["?steps=17", "an integer from 1 to 16"]),
    ("steps=2.5", ["?steps=2.5", "an integer from 1 to 16"]),
    ("day=-1", ["?day=-1", "a number >= 0"]),
    ("day=nan", ["?day=nan", "a number >= 0"]),
    ("mode=z", ["?mode=z", "one of x, y"]),
    ("trace=a,q", ["?trace=a,q", "'q'", "some of a, b, c"]),
    ("trace=", ["?trace=", "empty"]),
    ("stepz=3", ["?stepz=3", "no parameter 'stepz'", "trace, day, steps, mode"]),
    ("mode=x&mode=y", ["?mode", "more than once"]),
])
def test_a_bad_query_names_the_parameter_and_what_it_accepts(query, names):
    with pytest.raises(QueryError) as e:
        parse_query(query, SPEC)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_every_problem_is_listed_at_once_and_the_page_message_lists_every_parameter():
    with pytest.raises(QueryError) as e:
        parse_query("steps=0&mode=q&foo=1", SPEC)
    assert len(e.value.problems) == 3, e.value.problems
    box = query_message(e.value)
    assert isinstance(box, W.HTML) and "lab-query-error" in box._dom_classes
    assert all(line.split(":")[0] in box.value for line in describe(SPEC)) and "Traceback" not in box.value
    assert "&lt;script" in query_message(QueryError(["?x=<script>"], SPEC)).value  # the link's text is escaped


def test_the_page_query_comes_from_the_kernels_environment(monkeypatch):
    monkeypatch.delenv("VOILA_PREHEAT", raising=False)
    monkeypatch.setenv("QUERY_STRING", "steps=3")
    assert page_query_string() == "steps=3" and dashboard_query(**SPEC)["steps"] == 3
    monkeypatch.delenv("QUERY_STRING")
    assert dashboard_query(**SPEC)["steps"] == 4
    monkeypatch.setenv("QUERY_STRING", "steps=x")
    assert dashboard_query(**SPEC) is None  # and the message is displayed instead


# In the shared kernel, before a dashboard runs with a good query: dashboard_query records what it parsed and
# returns None, so the heavy dashboards (Slurm sites, training runs, restorations, videos) stop before starting.
_RECORD = """
import json as _json, widgets.url_query as _uq
_real = _uq.parse_query
def _recording(*a, **k):
    print("QUERY", _json.dumps(_real(_uq.page_query_string(), k)))
    return None
_uq.dashboard_query = _recording
"""

GOOD = {  # a good query per dashboard, and what it must give (the widget's constructor's keywords, where it has them)
    "01_queues.ipynb": ("trace=hpc2n,theta_2022&day=10", {"trace": ["hpc2n", "theta_2022"], "day": 10.0}),
    "02_live_sites.ipynb": ("sites=nasa&policy=least_pending", {"sites": ["nasa"], "policy": "least_pending"}),
    "03_provenance_explorer.ipynb": ("task=7&trial=2", {"trace": "airline", "task": 7, "trial": 2}),
    "05_training_monitor.ipynb": ("runs=fp8&steps=20", {"runs": ["fp8"], "steps": 20}),
    "06b_perf_model.ipynb": ("hardware=perlmutter_a100&d_model=4096&n_head=32&pp=4&schedule=afab",
                             {"hardware": "perlmutter_a100", "d_model": 4096, "n_head": 32, "pp": 4, "schedule": "afab",
                              "n_layer": 2, "tp": 1, "tier": "loopback"}),
    "07_restoration_demo.ipynb": ("method=pnp_flow&task=denoise&prior=gaussian-digits&nfe=20",
                                  {"method": "pnp_flow", "task": "denoise", "prior": "gaussian-digits", "nfe": 20, "image": 0}),
    "08_video_demo.ipynb": ("mode=spatial_only&refine_steps=3&seed=7", {"mode": "spatial_only", "refine_steps": 3, "seed": 7}),
}
BAD = {  # a bad query per dashboard, and what its message must name
    "01_queues.ipynb": ("trace=hpc3n", ["?trace=hpc3n", "theta_2022, theta_2023, hpc2n"]),
    "02_live_sites.ipynb": ("policy=fastest", ["?policy=fastest", "fixed_site, least_pending, earliest_completion"]),
    "03_provenance_explorer.ipynb": ("task=50", ["?task=50", "an integer from 0 to 49"]),
    "05_training_monitor.ipynb": ("runs=fp16", ["?runs=fp16", "some of fp32, fp8"]),
    "06b_perf_model.ipynb": ("d_model=100&n_layer=49&hardware=h100",
                             ["?d_model=100", "one of 64, 128, 192", "?n_layer=49", "an integer from 1 to 48",
                              "?hardware=h100", "local, perlmutter_a100, vista_gh200"]),
    "07_restoration_demo.ipynb": ("method=magic", ["?method=magic", "rebridge, rebridge:clean_side_only"]),
    "08_video_demo.ipynb": ("steps=3", ["no parameter 'steps'", "control_steps", "refine_steps"]),
}
CONSTRUCTOR = {"06b_perf_model.ipynb": "PerfModelExplorer", "07_restoration_demo.ipynb": "RestorationDemo",
               "08_video_demo.ipynb": "VideoDemo"}


def _exec(client, cell) -> None:
    client.nb.cells.append(cell)
    client.execute_cell(cell, len(client.nb.cells) - 1)


def _run(client, nb, query: str) -> list:
    """Run ``nb``'s cells in the client's kernel with the page's query ``query``; every output of its code cells."""
    _exec(client, nbformat.v4.new_code_cell(f"import os; os.environ['QUERY_STRING'] = {query!r}; os.environ.pop('VOILA_PREHEAT', None)"))
    for cell in nb.cells:
        if cell.cell_type == "code":
            _exec(client, cell)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


@pytest.fixture(scope="module")
def kernel():
    scratch = Path(tempfile.mkdtemp(prefix="nbq-"))
    nb = nbformat.v4.new_notebook()
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(DASHBOARDS)}})
    with client.setup_kernel(env={**__import__("os").environ, "TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"}):
        yield client
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.notebook
def test_every_dashboard_reads_its_parameters_from_the_url(kernel):
    assert sorted(GOOD) == sorted(BAD) == sorted(p.name for p in DASHBOARDS.glob("*.ipynb"))
    for name, (query, names) in BAD.items():
        nb = nbformat.read(DASHBOARDS / name, as_version=4)
        outputs = _run(kernel, nb, query)
        assert not [o for o in outputs if o.output_type == "error"], (name, outputs)
        shown = [o for o in outputs if o.output_type in ("display_data", "execute_result")]
        assert len(shown) == 1 and WIDGET_VIEW in shown[0]["data"], (name, shown)
        probe = nbformat.v4.new_code_cell(
            "from ipywidgets.widgets.widget import _instances\n"
            f"_m = _instances[{shown[0]['data'][WIDGET_VIEW]['model_id']!r}]\n"
            "print('MSG', _m._dom_classes, _m.value)\n"
            "print('STARTED', [v for v in ('testbed', 'procs', 'graph', 'monitor') if v in globals()])")
        _exec(kernel, probe)
        text = "".join(o.get("text", "") for o in probe.outputs)
        assert "lab-query-error" in text and all(n in text for n in names), (name, text)
        assert "STARTED []" in text, (name, text)  # a bad link starts nothing
    _exec(kernel, nbformat.v4.new_code_cell(_RECORD))
    for name, (query, expected) in GOOD.items():
        nb = nbformat.read(DASHBOARDS / name, as_version=4)
        outputs = _run(kernel, nb, query)
        assert not [o for o in outputs if o.output_type == "error"], (name, outputs)
        # stdout may arrive in several stream outputs that split a line ("QUERY" then " {...}"): join them first
        stdout = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.get("name") == "stdout")
        lines = [line for line in stdout.splitlines() if line.startswith("QUERY ")]
        assert len(lines) == 1, (name, outputs)
        got = json.loads(lines[0][6:])
        assert {k: got[k] for k in expected} == expected, (name, got)
        row = next(line for line in README.splitlines() if line.startswith(f"| `{name[:-len('.ipynb')]}` |"))
        assert all(f"`{k}`" in row for k in got), (name, "the README's Voila table does not list", sorted(got), row)
        if name in CONSTRUCTOR:  # every parameter is one its widget's constructor takes
            import widgets
            inspect.signature(getattr(widgets, CONSTRUCTOR[name])).bind(**got)


@pytest.mark.notebook
@pytest.mark.slow
def test_the_provenance_dashboard_opens_the_run_the_link_names(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("QUERY_STRING", "token=t&task=0&trial=3")
    nb = nbformat.read(DASHBOARDS / "03_provenance_explorer.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(DASHBOARDS)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"], outputs
        probe = nbformat.v4.new_code_cell(
            "from ipywidgets.widgets.widget import _instances\n"
            f"_e = _instances[{outputs[0]['data'][WIDGET_VIEW]['model_id']!r}]\n"
            "print('RUN', _e.run, len(decisions), sorted({n['data']['id'].split('/')[2] for n in _e.elements['nodes'] if n['data']['id'].count('/') >= 2}))")
        _exec(client, probe)
        text = "".join(o.get("text", "") for o in probe.outputs)
    assert "RUN tau-airline/task0/trial3 8 ['trial3']" in text, text


def test_the_perf_model_link_sets_the_explorers_controls_and_an_inconsistent_one_is_refused_in_the_explorer(monkeypatch):
    """The perf-model dashboard's fields are checked one by one (each against its control); a combination the
    model refuses (4 heads over TP 8) still opens the explorer, on those controls, saying why and drawing nothing."""
    monkeypatch.delenv("VOILA_PREHEAT", raising=False)
    cell = nbformat.read(DASHBOARDS / "06b_perf_model.ipynb", as_version=4).cells[1].source
    shown = []
    monkeypatch.setenv("QUERY_STRING", "token=t&tp=8&hardware=vista_gh200&schedule=afab")
    exec(cell, {"display": shown.append})
    (w,) = shown
    assert (w.tp.value, w.n_head.value, w.hardware.value, w.schedule.value) == (8, 4, "vista_gh200", "afab")
    assert "not a valid configuration" in w.status.value and "n_head (4) must be divisible by tp (8)" in w.status.value
    assert w.result is None and w.bars.figure.get("data", []) == [] and w.gantt.figure.get("data", []) == []
    w.tp.value = 2  # the user fixes it in the page: drawn on the Vista roofline
    assert w.result.model == "roofline" and w.result.hardware == "vista_gh200" and w.bars.figure["data"]
