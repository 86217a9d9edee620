"""End to end: the PerfModelExplorer in Voila, read from what Chromium draws.

A one-cell notebook shows ``PerfModelExplorer()`` over the committed benchmark files, on the benchmark's
PP = 2 configuration. The test checks that the stacked bar has one trace per operator group with drawn bars
and a measured bar equal to the benchmark's measured step, that the Gantt chart draws forward and backward
bars on two stages, and that the status names the measured step; then it sets PP to 1 in the page and waits
for the Gantt chart to redraw on one stage, and sets TP to 8 (4 heads) to see the configuration refused with its reason.
It fails on any page or notebook error and on any request that leaves 127.0.0.1 and saves
``perfmodel_voila_*.png`` under ``$LAB_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import json

import pytest

from tests.browser import ARTIFACTS, CHROMIUM_ARGS, ROOT, NetworkWatch, PageWatch, chromium, voila_notebook, voila_server

CELL = f"""
import os, sys
os.environ["OMP_NUM_THREADS"] = "1"
sys.path.insert(0, {str(ROOT)!r})
from widgets import PerfModelExplorer

explorer = PerfModelExplorer()
explorer
"""
DRAWN_JS = """(sel) => {
    const plot = document.querySelector(sel + ' .js-plotly-plot');
    if (!plot || !plot.data) return null;
    const bars = Array.from(plot.querySelectorAll('.barlayer .point path'))
        .filter(p => /^M[\\d.]+,[\\d.]+V?/.test(p.getAttribute('d') || '') && (p.getAttribute('d') || '').length > 8);
    return {names: plot.data.map(t => t.name), bars: bars.length,
            ys: plot.data.map(t => t.y), xs: plot.data.map(t => t.x)};
}"""


@pytest.mark.browser
@pytest.mark.slow
def test_voila_perfmodel_explorer(tmp_path):
    from playwright.sync_api import sync_playwright

    runs = json.loads((ROOT / "benchmarks" / "results" / "perfmodel_runs.json").read_text())["runs"]
    want = {"n_layer": 2, "d_model": 128, "n_head": 4, "seq_len": 64, "micro_batch": 2, "n_micro_batches": 4, "pp": 2}
    measured = next(r["measured"]["overall"] for r in runs
                    if r["tier"] == "loopback" and all(r["config"][k] == v for k, v in want.items())
                    and r["config"]["dp"] == r["config"]["tp"] == 1)
    notebook = voila_notebook(CELL, tmp_path / "perfmodel_explorer.ipynb")
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1100})
            watch = PageWatch(page, "perfmodel_voila")
            net = NetworkWatch(page, "perfmodel_voila", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            watch.wait_for(page.locator(".lab-perfmodel-explorer"), what="the explorer", timeout_s=300)
            watch.wait_for(f"() => {{ const d = ({DRAWN_JS})('.lab-perfmodel-bars'); return d && d.bars >= 10; }}",
                           what="the stacked bars", timeout_s=120)
            bars = page.evaluate(DRAWN_JS, ".lab-perfmodel-bars")
            for group in ("linear", "attention", "optimizer_step", "pp_p2p", "measured step"):
                assert group in bars["names"], bars["names"]
            i = bars["names"].index("measured step")
            assert bars["ys"][i][0] == pytest.approx(measured * 1e3, rel=1e-6)
            assert bars["xs"][bars["names"].index("linear")] == ["stage 0", "stage 1"]
            status = page.locator(".lab-perfmodel-status").inner_text()
            assert "measured" in status and "error" in status, status
            watch.wait_for(f"() => {{ const d = ({DRAWN_JS})('.lab-perfmodel-gantt'); return d && d.bars >= 16; }}",
                           what="the Gantt chart (4 micro-batches x 2 stages x F/B)")
            gantt = page.evaluate(DRAWN_JS, ".lab-perfmodel-gantt")
            assert {"forward", "backward"} <= set(gantt["names"])
            assert set(gantt["ys"][gantt["names"].index("forward")]) == {"stage 0", "stage 1"}
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "perfmodel_voila_pp2.png"), full_page=True)

            # PP -> 1: the schedule is redrawn on one stage
            page.locator(".lab-perfmodel-explorer .widget-dropdown", has_text="PP").locator("select").select_option("1")
            watch.wait_for("() => { const p = document.querySelector('.lab-perfmodel-gantt .js-plotly-plot');"
                           " const f = p && p.data && p.data.find(t => t.name === 'forward');"
                           " return f && f.y.length === 4 && f.y.every(y => y === 'stage 0'); }",
                           what="the Gantt chart on one stage")
            page.screenshot(path=str(ARTIFACTS / "perfmodel_voila_pp1.png"), full_page=True)

            # an inconsistent configuration is refused with its reason (4 heads cannot split over TP 8)
            page.locator(".lab-perfmodel-explorer .widget-dropdown", has_text="TP").locator("select").select_option("8")
            watch.wait_for("() => document.querySelector('.lab-perfmodel-status').innerText.includes("
                           "'n_head (4) must be divisible by tp (8)')", what="the refused configuration's reason")
            watch.check("the end")
            net.check()
        finally:
            browser.close()
