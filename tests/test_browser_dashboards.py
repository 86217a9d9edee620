"""End to end: `make voila` opens notebooks/dashboards/, and each dashboard shows its widget first, drawing data.

One `make voila` (token, 127.0.0.1, the research-lab template) serves the notebooks folder for the module; its
printed URL is the dashboards folder's listing, which must list them all. Each test then opens one dashboard in
Chromium: the page's first cell is the one-line title whose link resolves to the lesson rendered by the same Voila;
the very next thing on the page is the widget (no output, text or explanation between them); the explanation is a
collapsed ``<details>`` below it; and the widget draws its data (plotly points, graph nodes, restored images, a
live training run's steps). Any notebook error, page error, console error or request off the machine fails the
test (:class:`tests.browser.PageWatch`, :class:`tests.browser.NetworkWatch`); each saves
``test-artifacts/voila_dashboard_<name>.png``. The perf-model dashboard is also opened from a what-if link
(``voila_dashboard_perf_model_query.png``): its controls and charts show the link's configuration. Fails (never
skips) without Chromium.
"""

from __future__ import annotations

import re
import secrets

import pytest

from tests.browser import ARTIFACTS, CHROMIUM_ARGS, ROOT, NetworkWatch, PageWatch, chromium, make_server

DASHBOARDS = sorted(p.name for p in (ROOT / "notebooks" / "dashboards").glob("*.ipynb"))

# Page order: the visible cells (markdown or code with something shown), what each holds, and where it is.
LAYOUT_JS = """() => {
    const cells = Array.from(document.querySelectorAll('.jp-Cell'))
        .filter(c => c.getBoundingClientRect().height > 1 && c.innerText.trim() + c.querySelectorAll('canvas, img, svg').length);
    const first = cells[0], second = cells[1];
    const link = first ? first.querySelector('a') : null;
    const out = second ? second.querySelector('.jp-OutputArea-output') : null;
    const widget = out ? out.querySelector('.jupyter-widgets, .lm-Widget') : null;
    const details = document.querySelector('details');
    const top = el => el ? el.getBoundingClientRect().top + window.scrollY : null;
    return {
        n: cells.length,
        firstIsMarkdown: !!first && first.classList.contains('jp-MarkdownCell'),
        title: first ? first.innerText.trim() : '',
        href: link ? link.href : null,
        secondIsCode: !!second && second.classList.contains('jp-CodeCell'),
        outputs: second ? second.querySelectorAll('.jp-OutputArea-output').length : 0,
        firstOutputIsWidget: !!widget && out.firstElementChild && out.firstElementChild.contains(widget),
        titleBottom: first ? first.getBoundingClientRect().bottom + window.scrollY : null,
        widgetTop: top(out),
        details: details ? {open: details.open, top: top(details)} : null,
    };
}"""
# How many lines, markers and bars plotly drew under ``root`` (paths with geometry, not empty traces)
PLOT_DRAWN_JS = """(root) => Array.from(document.querySelectorAll(root + ' .js-plotly-plot .trace path'))
    .filter(p => /^M[^Z]*[LHVZ]/.test(p.getAttribute('d') || '')).length"""
# What "draws data" means for each dashboard (a JS function returning a truthy value once drawn), and how long to wait.
DRAWN = {
    "01_queues.ipynb": (f"() => ({PLOT_DRAWN_JS})('.jp-OutputArea') >= 3 * 4", "the three sites' queue timelines and histograms", 300),
    "02_live_sites.ipynb": (f"() => ({PLOT_DRAWN_JS})('.lab-live-dashboard') >= 4", "the live sites' queue samples", 300),
    "03_provenance_explorer.ipynb": (
        "() => { const el = document.querySelector('.lab-pe-cy'); const host = el && el.closest('.lab-pe');"
        " const cy = host && host.parentElement.__cy; return cy && cy.nodes().length > 10 && cy.nodes().length; }",
        "the run's provenance graph (more than 10 nodes drawn)", 300),
    "05_training_monitor.ipynb": (
        "() => { const p = document.querySelector('.lab-training-chart .js-plotly-plot'); if (!p || !p.data) return false;"
        " const n = uid => (p.data.find(t => t.uid === uid) || {x: []}).x.length; return n('fp32:loss') >= 3 && n('fp8:loss') >= 3; }",
        "both training runs' first 3 steps", 420),
    "06b_perf_model.ipynb": (
        f"() => ({PLOT_DRAWN_JS})('.lab-perfmodel-bars') >= 10 && ({PLOT_DRAWN_JS})('.lab-perfmodel-gantt') >= 2 * 4 * 2",
        "the predicted step's stacked bars and its 2-stage schedule", 300),
    "07_restoration_demo.ipynb": (
        "() => Array.from(document.querySelectorAll('img.lab-rd-image'))"
        ".filter(i => i.offsetParent !== null && i.complete && i.naturalWidth > 0).length >= 4",
        "the restoration's four images, decoded", 300),
    "08_video_demo.ipynb": (
        "() => Array.from(document.querySelectorAll('img.lab-vd-video'))"
        ".filter(i => i.offsetParent !== null && i.complete && i.naturalWidth > 0).length >= 5",
        "the video demo's five videos, decoded", 300),
}


@pytest.fixture(scope="module")
def voila(tmp_path_factory):
    """`make voila` on a free port with a fresh token: yields (base URL, token, the server's log)."""
    token = secrets.token_urlsafe(16)
    log = tmp_path_factory.mktemp("voila") / "voila.log"
    with make_server("voila", "VOILA_PORT", log, VOILA_TOKEN=token) as port:
        yield f"http://127.0.0.1:{port}", token, log


def _name(notebook: str) -> str:
    return re.sub(r"^\d+[a-z]?_", "", notebook.removesuffix(".ipynb"))


@pytest.mark.browser
@pytest.mark.slow
def test_make_voila_opens_the_dashboards_folder(voila):
    from playwright.sync_api import sync_playwright

    base, token, log = voila
    url = f"{base}/voila/tree/dashboards?token={token}"
    assert url in log.read_text()  # the URL make voila prints
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            net = NetworkWatch(page, "voila_dashboards_tree", voila=True)
            page.goto(url, timeout=120_000)
            page.wait_for_function(f"() => {len(DASHBOARDS)} <= document.querySelectorAll('a[href*=\"/voila/render/dashboards/\"]').length",
                                   timeout=60_000)
            listed = page.evaluate("() => Array.from(document.querySelectorAll('a[href*=\"/voila/render/dashboards/\"]'))"
                                   ".map(a => decodeURIComponent(new URL(a.href).pathname).split('/').pop())")
            assert sorted(set(listed)) == DASHBOARDS, listed
            page.locator("a", has_text="05_training_monitor.ipynb").wait_for()  # a listing of the folder, not of notebooks/
            assert not page.locator("a", has_text="05_gradient_communication.ipynb").count()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "voila_dashboards_tree.png"), full_page=True)
            net.check()
        finally:
            browser.close()


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("notebook", [pytest.param(n, marks=[pytest.mark.slurm] if n == "02_live_sites.ipynb" else []) for n in DASHBOARDS])
def test_dashboard_shows_its_widget_first_and_draws(voila, notebook):
    from playwright.sync_api import sync_playwright

    base, token, _ = voila
    name = f"voila_dashboard_{_name(notebook)}"
    drawn, what, timeout_s = DRAWN[notebook]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            watch = PageWatch(page, name)
            net = NetworkWatch(page, name, voila=True)
            page.goto(f"{base}/voila/render/dashboards/{notebook}?token={token}", timeout=600_000)
            value = watch.wait_for(drawn, what=what, timeout_s=timeout_s)
            layout = page.evaluate(LAYOUT_JS)
            assert layout["firstIsMarkdown"] and "\n" not in layout["title"], layout  # a one-line title first
            lesson = re.search(r"\]\(\.\./([\w.-]+\.ipynb)\)", (ROOT / "notebooks" / "dashboards" / notebook).read_text()).group(1)
            assert layout["href"] == f"{base}/voila/render/{lesson}", layout  # the lesson, rendered by the same Voila
            assert layout["secondIsCode"] and layout["firstOutputIsWidget"], layout  # then the widget, before anything else
            assert 0 <= layout["widgetTop"] - layout["titleBottom"] < 80, layout  # right below the title
            assert layout["details"] and not layout["details"]["open"] and layout["details"]["top"] > layout["widgetTop"], layout
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
            watch.check("the end")
            assert not watch.page_errors, watch.page_errors
            net.check()
            assert value
        finally:
            browser.close()


# A what-if link to the perf-model dashboard: 8 layers of d 1024 over 4 pipeline stages on Perlmutter's A100 roofline,
# 8 micro-batches, all-forward-all-backward. What the charts hold, read from the page's plotly figures.
PERF_QUERY = "hardware=perlmutter_a100&d_model=1024&n_head=16&n_layer=8&pp=4&n_micro_batches=8&schedule=afab"
PERF_DRAWN_JS = """() => {
    const fig = sel => { const p = document.querySelector(sel + ' .js-plotly-plot'); return p && p.data ? p.data : null; };
    const bars = fig('.lab-perfmodel-bars'), gantt = fig('.lab-perfmodel-gantt');
    if (!bars || !gantt) return null;
    const trace = name => gantt.find(t => t.name === name) || {x: [], y: [], base: []};
    return {bars: bars.map(t => [t.name, t.x]), forward: trace('forward'), backward: trace('backward'),
            status: document.querySelector('.lab-perfmodel-status').innerText,
            selects: Array.from(document.querySelectorAll('.lab-perfmodel-explorer select'))
                .map(s => s.options[s.selectedIndex].text.replace(/\u00a0/g, ' ')),
            sliders: Array.from(document.querySelectorAll('.lab-perfmodel-explorer .widget-readout')).map(r => r.innerText.trim())};
}"""


@pytest.mark.browser
@pytest.mark.slow
def test_perf_model_dashboard_opens_the_configuration_its_link_names(voila):
    from playwright.sync_api import sync_playwright

    base, token, _ = voila
    name = "voila_dashboard_perf_model_query"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            watch = PageWatch(page, name)
            net = NetworkWatch(page, name, voila=True)
            page.goto(f"{base}/voila/render/dashboards/06b_perf_model.ipynb?token={token}&{PERF_QUERY}", timeout=600_000)
            watch.wait_for(f"() => ({PLOT_DRAWN_JS})('.lab-perfmodel-gantt') >= 2 * 8 * 4",
                           what="the 4-stage schedule of 8 micro-batches", timeout_s=300)
            d = page.evaluate(PERF_DRAWN_JS)
            # the controls show the link's values
            assert d["sliders"] == ["8", "16", "2", "8"], d["sliders"]  # layers, heads, micro-batch, micro-batches
            assert d["selects"] == ["1024", "64", "1", "1", "4", "perlmutter_a100 (roofline)", "loopback (one tier)", "all-F-all-B"], d["selects"]
            # the roofline on the A100 file, nothing measured on this machine for it
            assert "roofline, perlmutter_a100" in d["status"] and "not measured here" in d["status"], d["status"]
            stages = [f"stage {s}" for s in range(4)]
            assert dict(d["bars"])["linear"] == stages and "measured step" not in dict(d["bars"]), d["bars"]
            fwd, bwd = d["forward"], d["backward"]
            assert len(fwd["x"]) == len(bwd["x"]) == 8 * 4 and sorted(set(fwd["y"])) == stages, fwd
            for st in stages:  # all forwards, then all backwards on every stage (afab, not 1F1B)
                f_end = max(b + x for b, x, y in zip(fwd["base"], fwd["x"], fwd["y"]) if y == st)
                b_start = min(b for b, y in zip(bwd["base"], bwd["y"]) if y == st)
                assert f_end <= b_start + 1e-9, (st, f_end, b_start)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
            watch.check("the end")
            assert not watch.page_errors, watch.page_errors
            net.check()
        finally:
            browser.close()
