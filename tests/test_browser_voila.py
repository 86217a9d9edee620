"""End to end: `make voila` serves the dashboard notebook with a token; a real Chromium moves the slider and sees it change.
Every request the page makes stays on 127.0.0.1 and it logs no console error (:class:`tests.browser.NetworkWatch`).

Needs Debian's Chromium (``make test`` installs it when run as root). Without it this
test fails, never skips, and says how to install it. The screenshot is written to
``$LAB_TEST_ARTIFACTS`` (default ``test-artifacts/``). A second test proves that a notebook
that raises fails the browser wait at once, with the notebook's error, instead of a timeout.
"""

from __future__ import annotations

import http.client
import secrets
import time

import pytest

from tests.browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    NetworkWatch,
    PageWatch,
    chromium,
    make_server,
    voila_notebook,
    voila_server,
)
from tests.dashboard_checks import QUEUE, STATUS_JS, check_candidates, check_fits, check_plot, check_queue_dashboard, check_sites_live


@pytest.mark.browser
@pytest.mark.slow
def test_voila_dashboard_renders_and_follows_the_slider(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    token = secrets.token_urlsafe(16)
    log = tmp_path / "voila.log"
    with make_server("voila", "VOILA_PORT", log, VOILA_TOKEN=token) as port, sync_playwright() as pw:
        base = f"http://127.0.0.1:{port}"
        assert f"{base}/voila/tree/dashboards?token={token}" in log.read_text()  # make voila prints the dashboards' URL with its token
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # without the token: the login page
        conn.request("GET", "/")
        refused = conn.getresponse()
        assert (refused.status, refused.getheader("Location")) == (302, "/login?next=%2F")
        conn.close()

        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})  # a laptop's window: all three sites fit
            watch = PageWatch(page, "queue_voila")
            net = NetworkWatch(page, "queue_voila", voila=True)
            page.goto(f"{base}/voila/render/dashboards/01_queues.ipynb?token={token}", timeout=300_000)  # the queues' dashboard
            check_queue_dashboard(watch, "queue_voila.png")
            assert not watch.page_errors, watch.page_errors
            net.check()  # every request went to 127.0.0.1 (no Font Awesome from a CDN), no console error
            assert any("/voila/templates/research-lab/static/" in r for r in net.requests)  # the project's template
            assert page.evaluate(FONT_AWESOME_JS) == FONT_AWESOME_5  # icons still have their font, served locally
            # a shared link: the dashboard reads its parameters from the URL query (one site, day 10)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            watch = PageWatch(page, "queue_voila_query")
            net = NetworkWatch(page, "queue_voila_query", voila=True)
            page.goto(f"{base}/voila/render/dashboards/01_queues.ipynb?token={token}&trace=hpc2n&day=10", timeout=300_000)
            drawn = check_plot(watch, QUEUE, lines=4, points=2, bars=1)
            assert drawn["areas"] == 3, drawn  # one site x 3 panels
            marker = page.evaluate(f"() => document.querySelector('{QUEUE} .js-plotly-plot').layout.shapes[0].x0")
            assert marker == pytest.approx(10.0)
            assert "HPC2N" in page.locator(QUEUE).inner_text() and "Theta" not in page.locator(QUEUE).inner_text()
            net.check()
            # a bad link (widgets.url_query): the page names the parameter and what it accepts, no traceback, no dashboard
            # (01 again: its preheated kernel, refilled since the last visit, has the logs read, so this costs a page load)
            page = browser.new_page(viewport={"width": 1280, "height": 700})
            watch = PageWatch(page, "queue_voila_bad_query")
            net = NetworkWatch(page, "queue_voila_bad_query", voila=True)
            page.goto(f"{base}/voila/render/dashboards/01_queues.ipynb?token={token}&trace=hpc2n&day=soon", timeout=300_000)
            watch.wait_for(".lab-query-error", what="the bad query's message", timeout_s=120)
            message = page.locator(".lab-query-error").inner_text()
            assert "?day=soon" in message and "a number >= 0" in message and "theta_2022, theta_2023, hpc2n" in message, message
            assert page.locator(QUEUE).count() == 0 and not watch.errors() and not watch.page_errors
            page.screenshot(path=str(ARTIFACTS / "queue_voila_bad_query.png"))
            net.check()
        finally:
            browser.close()
    assert "deprecated" not in log.read_text().lower()


LIVE_CELL = """
import subprocess, sys
from pathlib import Path

from lab.hpc import skills
from lab.hpc.testbed import Testbed
from widgets import QueueDashboard

work = Path({work!r})
testbed = Testbed(work / "testbed")
testbed.up(["alpha", "beta"], cpus=[2, 1], memory_mb=[2000, 1000])
db = work / "lab.db"
service = subprocess.Popen([sys.executable, "-m", "lab.hpc.continuation", "serve", "--sites", str(testbed.sites_dir), "--db", str(db),
                            "--poll-s", "0.3"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
(work / "service.pid").write_text(str(service.pid))
fed = skills.Federation.from_folder(testbed.sites_dir, db=db, workdir=work / "jobs")


def hold(site, ntasks, walltime_s):
    request = skills.ResourceRequest(name="load", command="sleep 300", ntasks=ntasks, walltime_s=walltime_s)
    return skills.submit_task(fed, skills.SubmitTaskInput(site=site, request=request))


for site, ntasks, walltime_s in [("beta", 1, 300), ("beta", 1, 240), ("beta", 1, 120), ("alpha", 2, 600), ("alpha", 1, 60)]:
    hold(site, ntasks, walltime_s)
request = skills.ResourceRequest(name="count", command="true", ntasks=1, walltime_s=60)
skills.choose_site(fed, skills.ChooseSiteInput(request=request, policy="earliest_completion"))
dashboard = QueueDashboard.live(db, ["alpha", "beta"])
dashboard.start(interval_s=1.0)
dashboard
"""


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.slurm
def test_voila_live_sites_dashboard(tmp_path):
    """Two real Slurm sites with a backlog, the continuation service and the live dashboard in Voila at a 1280 px
    window: both sites drawn, the jobs table with Slurm's estimated starts sorts and filters, what each site showed
    the decision is a table; a site that goes down is shown unavailable, and once the service stops, stale."""
    import os
    import shutil
    import signal
    import tempfile
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    from lab.hpc.testbed import Testbed

    executable = chromium()
    work = Path(tempfile.mkdtemp(prefix="labv", dir="/tmp"))  # short: Slurm's sockets live here
    notebook = voila_notebook(LIVE_CELL.format(work=str(work)), tmp_path / "sites.ipynb")
    try:
        with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                watch = PageWatch(page, "sites_voila")
                net = NetworkWatch(page, "sites_voila", voila=True)
                page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
                jobs = check_sites_live(watch, ["alpha", "beta"], "sites_voila_live.png", pending_on="beta")
                assert sum(i.startswith("beta/") and g == "pending" for i, g in zip(jobs["ids"], jobs["groups"])) == 2, jobs
                check_candidates(watch, ["alpha", "beta"])
                Testbed(work / "testbed").stop_site("beta")  # the site goes down: the service reports it unavailable
                watch.wait_for(f"() => /beta: unavailable/.test(({STATUS_JS})())", what="beta shown unavailable", timeout_s=60)
                os.kill(int((work / "service.pid").read_text()), signal.SIGTERM)  # no more samples: alpha turns stale
                watch.wait_for(f"() => /alpha: stopped or not polled: no sample for/.test(({STATUS_JS})())", what="alpha shown stale",
                               timeout_s=90)  # the service's 30 s heartbeat and three 1 s polls, then stale
                page.wait_for_function(
                    "() => Array.from(document.querySelectorAll('.lab-live-jobs tbody tr')).every(r => r.classList.contains('lab-muted'))",
                    timeout=10_000)
                check_fits(page, ".lab-live-dashboard")  # with the long "unavailable" error in the status line
                page.locator(".lab-live-dashboard").scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / "sites_voila_stale.png"), full_page=True)
                assert not watch.page_errors, watch.page_errors
                net.check()
            finally:
                browser.close()
    finally:
        pid_file = work / "service.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
        Testbed(work / "testbed").down()
        shutil.rmtree(work, ignore_errors=True)


# An ipywidgets Button's icon: Font Awesome 5's "check" glyph in its own font (the CSS and fonts Voila's bundle inlines).
FONT_AWESOME_JS = """() => { const i = document.createElement('i'); i.className = 'fa fa-check'; document.body.appendChild(i);
    const s = getComputedStyle(i, '::before'); const out = [s.fontFamily, s.content]; i.remove(); return out; }"""
FONT_AWESOME_5 = ['"Font Awesome 5 Free"', '"\uf00c"']


RAISING_CELL = """
import warnings
warnings.warn("only a warning, not an error")

class DataNotFoundError(FileNotFoundError):
    pass

raise DataNotFoundError("no copy of theta_2022.swf here (this test's own error)")
"""


@pytest.mark.browser
@pytest.mark.slow
def test_a_notebook_error_fails_the_wait_at_once_with_its_text(tmp_path):
    """The dashboard tests wait up to 300 s for the figure; a notebook that raises must end that wait
    within seconds, with the exception's text, not the warning printed above it."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    notebook = voila_notebook(RAISING_CELL, tmp_path / "raises.ipynb")
    screenshot = ARTIFACTS / "voila_raising_notebook-failure.png"
    screenshot.unlink(missing_ok=True)
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            watch = PageWatch(page, "voila_raising_notebook")
            net = NetworkWatch(page, "voila_raising_notebook", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
            start = time.monotonic()
            with pytest.raises(pytest.fail.Exception) as failed:
                watch.wait_for(page.locator(".js-plotly-plot"), what="the figure", timeout_s=300)
            elapsed = time.monotonic() - start
            net.check()  # voila_server's page too: nothing off the machine
        finally:
            browser.close()
    message = str(failed.value)
    assert elapsed < 10, elapsed
    assert "the notebook raised while waiting for the figure" in message
    assert "DataNotFoundError: no copy of theta_2022.swf here (this test's own error)" in message
    assert "only a warning" not in message  # the stderr output above the error is no error
    assert f"screenshot: {screenshot}" in message and screenshot.exists()
