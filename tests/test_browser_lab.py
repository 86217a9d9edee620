"""End to end: `make lab` serves JupyterLab with a token; a real Chromium opens 01_site_queues.ipynb,
runs every cell, and drives the dashboard as a new user would.

The notebooks are copied to a temporary root (``LAB_ROOT``) so that JupyterLab's autosave never
writes outputs into the checked-in notebook, and every Jupyter folder (config, data, runtime, lab
settings and workspaces, temp) is under ``tmp_path`` (:func:`tests.browser.jupyter_env`). The user's
workspaces folder holds a stale workspace with 07_image_restoration.ipynb open, as after an earlier
lab: `make lab` must ignore it, open exactly the notebook in its URL and start one kernel. A second
test proves that a notebook that raises ends the wait at once with the kernel's error. Both fail on any
request that leaves 127.0.0.1 and on console errors (:class:`tests.browser.NetworkWatch`).
Fails (never skips) without Chromium.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    ERROR_OUTPUTS_JS,
    KERNEL_IDLE_JS,
    ROOT,
    NetworkWatch,
    PageWatch,
    chromium,
    jupyter_env,
    make_server,
    run_all_cells,
    voila_notebook,
)
from tests.dashboard_checks import STATUS_JS, check_candidates, check_fits, check_queue_dashboard, check_sites_live

TABS_JS = "() => Array.from(document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab .lm-TabBar-tabLabel')).map(e => e.innerText)"
DISABLED_JS = "() => JSON.parse(document.getElementById('jupyter-config-data').textContent).disabledExtensions"
ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"
# A window whose notebook output area is about 1150 px wide (JupyterLab 4.6, the file browser open), where the
# dashboards used to be wider than the area and clipped their last site.
LAB_VIEWPORT, OUTPUT_AREA = 1582, (1100, 1200)


def stale_workspace(folder: Path) -> None:
    """The default workspace an earlier lab left, with 07_image_restoration.ipynb open."""
    widget = "notebook:07_image_restoration.ipynb"
    data = {
        "layout-restorer:data": {"main": {"dock": {"type": "tab-area", "currentIndex": 0, "widgets": [widget]}, "current": widget}},
        widget: {"data": {"path": "07_image_restoration.ipynb", "factory": "Notebook"}},
    }
    (folder / "default-37a8.jupyterlab-workspace").write_text(json.dumps({"data": data, "metadata": {"id": "default"}}))


@pytest.mark.browser
@pytest.mark.slow
def test_lab_runs_the_notebook_and_the_dashboard_follows_the_slider(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    token = secrets.token_urlsafe(16)
    env = jupyter_env(tmp_path / "jupyter")
    stale_workspace(Path(env["JUPYTERLAB_WORKSPACES_DIR"]))
    run_workspaces = lambda: list(Path(env["TMPDIR"]).glob("research-lab-workspaces.*"))  # noqa: E731
    log = tmp_path / "lab.log"
    with make_server("lab", "LAB_PORT", log, env=env, LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        base = f"http://127.0.0.1:{port}"
        assert f"{base}/lab/tree/01_site_queues.ipynb?token={token}" in log.read_text()
        assert len(run_workspaces()) == 1  # this run's own workspaces folder
        with pytest.raises(urllib.error.HTTPError) as refused:  # the token is required
            urllib.request.urlopen(f"{base}/api/contents", timeout=30)
        assert refused.value.code == 403
        # make lab loads the research-lab server extension (default base_url): the launcher's dashboards
        listed = json.load(urllib.request.urlopen(f"{base}/research-lab/dashboards?token={token}", timeout=30))
        assert [d["file"] for d in listed] == sorted(p.name for p in (ROOT / "notebooks" / "dashboards").glob("*.ipynb"))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": LAB_VIEWPORT, "height": 1100})
                watch = PageWatch(page, "queue_lab")
                net = NetworkWatch(page, "queue_lab")
                page.goto(f"{base}/lab/tree/01_site_queues.ipynb?token={token}", timeout=300_000)
                watch.wait_for(KERNEL_IDLE_JS, what="the kernel (status bar: Python 3 | Idle)", timeout_s=180)
                # a clean workspace: exactly the notebook in the URL, one kernel
                assert page.evaluate(TABS_JS) == ["01_site_queues.ipynb"]
                kernels = json.load(urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=30))
                assert len(kernels) == 1, kernels
                run_all_cells(page)
                check_queue_dashboard(watch, "queue_lab.png", area_width=OUTPUT_AREA)
                # every code cell ran, none wrote to stderr (tracebacks render there)
                stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                assert stderr.count() == 0, stderr.all_inner_texts()
                # no "get notified about official Jupyter news?" toast: its plugin is disabled
                assert ANNOUNCEMENTS in page.evaluate(DISABLED_JS)
                toasts = page.locator(".Toastify__toast").all_inner_texts()
                assert not [t for t in toasts if "official Jupyter news" in t], toasts
                net.check()  # every request went to 127.0.0.1, no console error, no shared-module version warning
            finally:
                browser.close()
    assert run_workspaces() == []  # removed when the lab stopped
    assert "deprecated" not in log.read_text().lower()


SITES = ["theta", "polaris", "hpc2n", "nasa"]  # notebook 02's four Slurm sites


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.slurm
def test_lab_runs_notebook_02_and_the_live_dashboard_shows_the_sites(tmp_path):
    """Run All of 02_federated_sites.ipynb: while its load runs, the live dashboard draws all four sites inside a
    1150 px output area and lists the jobs with Slurm's estimated starts (sortable, filterable); once the notebook
    has stopped everything, the view says it stopped and shows what each site showed the decision."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    token = secrets.token_urlsafe(16)
    env = jupyter_env(tmp_path / "jupyter")
    with make_server("lab", "LAB_PORT", tmp_path / "lab.log", env=env, LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": LAB_VIEWPORT, "height": 1100})
                watch = PageWatch(page, "sites_lab")
                net = NetworkWatch(page, "sites_lab")
                page.goto(f"http://127.0.0.1:{port}/lab/tree/02_federated_sites.ipynb?token={token}", timeout=300_000)
                watch.wait_for(KERNEL_IDLE_JS, what="the kernel (status bar: Python 3 | Idle)", timeout_s=180)
                run_all_cells(page)
                check_sites_live(watch, SITES, "sites_lab_live.png", area_width=OUTPUT_AREA, pending_on="theta")
                # the last cell stops the dashboard, the service and the sites: the view says so
                watch.wait_for(f"() => ({STATUS_JS})().includes('stopped at')", what="the dashboard's 'stopped' line", timeout_s=400)
                watch.wait_for(KERNEL_IDLE_JS, what="the notebook's end", timeout_s=60)
                assert "this view no longer refreshes" in page.evaluate(STATUS_JS)
                page.locator(".lab-live-candidates").scroll_into_view_if_needed()
                check_candidates(watch, SITES)
                check_fits(page, ".lab-live-dashboard", area_width=OUTPUT_AREA)  # with every event listed (long transfer ids)
                page.screenshot(path=str(ARTIFACTS / "sites_lab.png"))
                stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                assert stderr.count() == 0, stderr.all_inner_texts()
                net.check()
            finally:
                browser.close()


RAISING_CELL = """
class DataNotFoundError(FileNotFoundError):
    pass

raise DataNotFoundError("no copy of theta_2022.swf here (this test's own error)")
"""


@pytest.mark.browser
@pytest.mark.slow
def test_a_lab_notebook_error_fails_the_wait_at_once_with_the_kernels_error(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    root = tmp_path / "notebooks"
    root.mkdir()
    voila_notebook(RAISING_CELL, root / "raises.ipynb")
    token = secrets.token_urlsafe(16)
    with make_server("lab", "LAB_PORT", tmp_path / "lab.log", LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 800})
                watch = PageWatch(page, "lab_raising_notebook")
                net = NetworkWatch(page, "lab_raising_notebook")
                page.goto(f"http://127.0.0.1:{port}/lab/tree/raises.ipynb?token={token}", timeout=300_000)
                watch.wait_for(KERNEL_IDLE_JS, what="the kernel", timeout_s=180)
                run_all_cells(page)
                start = time.monotonic()
                with pytest.raises(pytest.fail.Exception) as failed:
                    watch.wait_for(page.locator(".js-plotly-plot"), what="the figure", timeout_s=300)
                elapsed = time.monotonic() - start
                # the page's error output is read as one too (the kernel's message may come first)
                page.wait_for_function(f"() => ({ERROR_OUTPUTS_JS})().length === 1", timeout=10_000)
                page_error = page.evaluate(ERROR_OUTPUTS_JS)[0]
                net.check()
            finally:
                browser.close()
    message = str(failed.value)
    assert elapsed < 15, elapsed
    assert "the notebook raised while waiting for the figure" in message
    assert "DataNotFoundError: no copy of theta_2022.swf here (this test's own error)" in message
    assert len(watch.kernel_errors) == 1 and "Traceback (most recent call last)" in watch.kernel_errors[0]
    assert "DataNotFoundError: no copy of theta_2022.swf here" in page_error
