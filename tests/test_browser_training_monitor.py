"""End to end: TrainingMonitor in JupyterLab and in Voila draws a run live, from its first logged step.

A notebook shows ``TrainingMonitor`` on an event log that is still empty, refreshing from a kernel
thread. The test (standing in for a training run) then writes the run's events into that log at its
own pace, from this process, as ``lab.training.run`` does: the page must first say it is waiting for
the first step, then draw plotly traces with points once steps are logged, and more points after
more steps, while the run is live. In JupyterLab the notebook's next cell keeps the kernel busy the
whole time, as notebook 05 does while it waits for its runs; once it is idle, the chart's controls
(y axes to log, x axis to wall time) are clicked and the table's run names checked against the run's
chart colour. Any page error or notebook error fails
the test; screenshots go to ``test-artifacts/``. Fails (never skips) without Chromium.

(Before the fix the chart was a plotly ``FigureWidget``: its 5 MB module often missed anywidget's
two-second start-up window on a busy machine, after which the browser dropped every update and showed
empty default axes; and nothing said the monitor was waiting.)
"""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import pytest

from lab.training.monitor import RunRecorder
from tests.browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    KERNEL_IDLE_JS,
    ROOT,
    NetworkWatch,
    PageWatch,
    chromium,
    make_server,
    run_all_cells,
    voila_notebook,
    voila_server,
)

CELL = """
import sys
sys.path.insert(0, {root!r})
from widgets import TrainingMonitor
monitor = TrainingMonitor({path!r}, heartbeat_timeout_s=120)
monitor.start(interval_s=0.5)
monitor
"""
# notebook 05's second cell waits for its runs: the kernel stays busy while the thread refreshes
BUSY_CELL = """
import pathlib, time
deadline = time.time() + 240
while not pathlib.Path({flag!r}).exists() and time.time() < deadline:
    time.sleep(0.2)
print("the runs are done")
"""

PLOT = ".lab-training-chart .js-plotly-plot"
WAITING_JS = f"""() => {{
    const status = document.querySelector('.lab-training-status');
    const plot = document.querySelector({PLOT!r});
    const notes = plot ? Array.from(plot.querySelectorAll('.annotation-text')).map(e => e.textContent) : [];
    return !!status && status.innerText.includes('waiting for the first step')
        && notes.includes('waiting for the first step') && notes.length >= 5;  // 4 titles + the waiting note
}}"""
# drawn data: the loss trace's points, and how many trace lines in plotly's plot area have a drawn path
DRAWN_JS = f"""() => {{
    const plot = document.querySelector({PLOT!r});
    if (!plot || !plot.data) return null;
    const loss = plot.data.find(t => t.uid === 'fp8:loss');
    const paths = Array.from(plot.querySelectorAll('.scatterlayer .trace path.js-line'))
        .filter(p => /^M[^Z]*L/.test(p.getAttribute('d') || ''));
    const notes = Array.from(plot.querySelectorAll('.annotation-text')).map(e => e.textContent);
    return {{points: loss ? loss.x.length : 0, paths: paths.length, waiting: notes.includes('waiting for the first step'),
             table: (document.querySelector('.lab-training-table') || {{}}).innerText || ''}};
}}"""


class Run:
    """One 2-rank run's events, written like lab.training.run writes them."""

    def __init__(self, path: Path, steps: int):
        self.steps = steps
        self.ranks = [RunRecorder(path, "fp8", r) for r in range(2)]
        self.done = 0

    def start(self) -> None:
        self.ranks[0].run_started(config={"optimizer": "adams", "comm": "fp8", "steps": self.steps}, world_size=2, n_params=1000)
        for r in self.ranks:
            r.status("started", 0)

    def advance(self, n: int, pause_s: float = 0.05) -> None:
        for _ in range(n):
            s = self.done = self.done + 1
            self.ranks[0].step(s, loss=4.0 / s, lr=1e-3, step_s=0.2, compute_s=0.15, comm_s=0.05, bytes_sent=1004, grad_rel_err=0.03)
            if s % 5 == 0:
                self.ranks[0].eval(s, 4.5 / s)
            for r in self.ranks:
                r.status("heartbeat", s)
            time.sleep(pause_s)

    def finish(self) -> None:
        for r in self.ranks:
            r.status("finished", self.done, param_sha256="abc")
            r.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(PLOT).scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def check_live(watch: PageWatch, run: Run, prefix: str) -> None:
    """On a page showing the monitor over ``run``'s still-empty log: waiting, then drawn, then growing."""
    page = watch.page
    watch.wait_for(WAITING_JS, what="the monitor's 'waiting for the first step' state", timeout_s=300)
    shot(page, f"{prefix}_waiting.png")
    run.start()
    run.advance(3)
    first = watch.wait_for(
        # the chart and the run table are separate widgets, synced separately: wait for both, not the chart alone
        f"() => {{ const d = ({DRAWN_JS})(); return d && d.points >= 3 && d.paths >= 4 && !d.waiting && d.table.includes('running') && d; }}",
        what="the first 3 steps drawn (loss trace with points, 4 trace lines with paths) and the run table saying running", timeout_s=60,
        state=f"() => ({DRAWN_JS})()",
    )
    assert first["points"] == 3 and "running" in first["table"], first
    shot(page, f"{prefix}_live.png")
    run.advance(12)
    later = watch.wait_for(
        f"() => {{ const d = ({DRAWN_JS})(); return d && d.points >= 15 && d; }}",
        what="15 steps drawn (more points while the run is live)", timeout_s=60,
    )
    assert later["points"] == 15 > first["points"] and later["paths"] >= first["paths"], (first, later)
    run.finish()
    watch.wait_for(
        "() => (document.querySelector('.lab-training-table') || {}).innerText.includes('finished')",
        what="the table to show the run finished",
    )
    shot(page, f"{prefix}_finished.png")
    watch.check("the end of the run")
    assert not watch.page_errors, watch.page_errors


CONTROLS_JS = f"""() => {{
    const plot = document.querySelector({PLOT!r});
    const smooth = plot.data.find(t => t.uid === 'fp8:loss:smoothed');
    const cell = document.querySelector('.lab-training-table b');
    return {{y: plot.layout.yaxis.type, x: plot.layout.xaxis.title.text, smoothed: smooth ? smooth.x.length : 0,
             line: plot.data.find(t => t.uid === 'fp8:loss').line.color, table: cell ? getComputedStyle(cell).color : null}};
}}"""


# the loss panel's y tick labels (plotly's first subplot): their boxes, top to bottom
LOSS_TICKS_JS = f"""() => Array.from(document.querySelectorAll({PLOT!r} + ' .subplot.xy .yaxislayer-above .ytick text'))
    .map(t => {{ const r = t.getBoundingClientRect(); return {{text: t.textContent, top: r.top, bottom: r.bottom}}; }})
    .filter(r => r.bottom > r.top).sort((a, b) => a.top - b.top)"""
# what the chart draws of the run: every curve's x and y, and the smoothed ones'
SHOWN_JS = f"""() => Object.fromEntries(document.querySelector({PLOT!r}).data
    .filter(t => t.visible !== false && t.visible !== 'legendonly' && t.x.length).map(t => [t.uid, [Array.from(t.x), Array.from(t.y)]]))"""


def check_log_ticks(watch: PageWatch) -> list[dict]:
    """On a log loss panel, no two tick labels overlap (plotly's own labelled every digit of a decade)."""
    ticks = watch.wait_for(f"() => {{ const t = ({LOSS_TICKS_JS})(); return t.length >= 2 && t; }}", what="the loss panel's log ticks")
    overlaps = [(a["text"], b["text"]) for a, b in zip(ticks, ticks[1:]) if b["top"] < a["bottom"] - 0.5]
    assert not overlaps, f"overlapping log ticks on the loss panel: {overlaps} in {ticks}"
    return ticks


def check_export(watch: PageWatch, x_column: str) -> None:
    """The export button downloads a CSV whose rows are exactly the points drawn (raw and smoothed), by the x shown."""
    import csv
    import io

    page = watch.page
    shown = page.evaluate(SHOWN_JS)
    button = page.locator(".lab-training-export button")
    with page.expect_download(timeout=30_000) as info:
        button.click()
    download = info.value
    text = Path(download.path()).read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert download.suggested_filename == f"training-runs-{'step' if x_column == 'step' else 'time'}.csv"
    assert rows and list(rows[0]) == ["run_id", "metric", "unit", x_column, "value", "smoothed", "smoothing"], rows[:1]
    assert f"({len(rows)} rows)" in button.inner_text()
    curves: dict[str, list[dict]] = {}
    for r in rows:
        curves.setdefault(f"{r['run_id']}:{r['metric']}", []).append(r)
    raw = {uid: xy for uid, xy in shown.items() if not uid.endswith(":smoothed")}
    assert set(curves) == set(raw), (sorted(curves), sorted(raw))  # every drawn curve, and only those
    for uid, got in curves.items():
        x, y = raw[uid]
        assert [float(r[x_column]) for r in got] == pytest.approx(x, rel=1e-12) and [float(r["value"]) for r in got] == pytest.approx(y, rel=1e-12), uid
        smooth = shown.get(f"{uid}:smoothed")
        if smooth:
            assert [float(r["smoothed"]) for r in got] == pytest.approx(smooth[1], rel=1e-12), uid
        else:
            assert all(r["smoothed"] == "" for r in got), uid
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{watch.name}_export.csv").write_text(text, encoding="utf-8")


def check_controls(watch: PageWatch, prefix: str) -> None:
    """The chart's controls, clicked in the page (the kernel must be idle to hear them): smoothing drawn over
    the values, the y axes to log (ticks that do not overlap), the x axis to wall time; the table's run name in
    the run's chart colour; the export button's CSV holds the points drawn, by step and by wall time."""
    page = watch.page
    before = page.evaluate(CONTROLS_JS)
    assert before["y"] == "linear" and before["x"] == "step" and before["smoothed"] == 15, before
    rgb = tuple(int(before["line"][i:i + 2], 16) for i in (1, 3, 5))
    assert before["table"] == f"rgb({rgb[0]}, {rgb[1]}, {rgb[2]})", before
    check_export(watch, "step")
    page.locator(".widget-toggle-buttons button", has_text=re.compile(r"^log$")).click()
    watch.wait_for(f"() => ({CONTROLS_JS})().y === 'log'", what="the y axes to turn logarithmic")
    check_log_ticks(watch)
    page.locator(".widget-toggle-buttons button", has_text="wall time").click()
    watch.wait_for(f"() => ({CONTROLS_JS})().x.startsWith('wall time')", what="the x axis to show wall time")
    watch.wait_for(".lab-training-export button[data-filename='training-runs-time.csv']", what="the export button to follow the x axis")
    check_export(watch, "wall_time_s")
    shot(page, f"{prefix}_log_time.png")
    watch.check("the controls")
    assert not watch.page_errors, watch.page_errors


@pytest.mark.browser
@pytest.mark.slow
def test_lab_training_monitor_waits_then_draws_the_run_live(tmp_path):
    import nbformat
    from playwright.sync_api import sync_playwright

    executable = chromium()
    log, flag = tmp_path / "runs" / "events.sqlite", tmp_path / "runs-done"
    root = tmp_path / "notebooks"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL.format(root=str(ROOT), path=str(log)).strip()),
                nbformat.v4.new_code_cell(BUSY_CELL.format(flag=str(flag)).strip())]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "monitor.ipynb")
    token = secrets.token_urlsafe(16)
    run = Run(log, steps=15)
    with make_server("lab", "LAB_PORT", tmp_path / "lab.log", LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                watch = PageWatch(page, "lab_training_monitor")
                net = NetworkWatch(page, "lab_training_monitor")
                page.goto(f"http://127.0.0.1:{port}/lab/tree/monitor.ipynb?token={token}", timeout=300_000)
                watch.wait_for(
                    KERNEL_IDLE_JS,
                    what="the kernel", timeout_s=180,
                )
                run_all_cells(page)
                check_live(watch, run, "lab_training_monitor")
                flag.touch()
                watch.wait_for("() => document.body.innerText.includes('the runs are done')", what="the busy cell to end")
                check_controls(watch, "lab_training_monitor")
                net.check()
            finally:
                flag.touch()
                browser.close()


@pytest.mark.browser
@pytest.mark.slow
def test_voila_training_monitor_waits_then_draws_the_run_live(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    log = tmp_path / "runs" / "events.sqlite"
    notebook = voila_notebook(CELL.format(root=str(ROOT), path=str(log)), tmp_path / "monitor.ipynb")
    run = Run(log, steps=15)
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            watch = PageWatch(page, "voila_training_monitor")
            net = NetworkWatch(page, "voila_training_monitor", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            check_live(watch, run, "voila_training_monitor")
            check_controls(watch, "voila_training_monitor")
            net.check()
        finally:
            browser.close()
