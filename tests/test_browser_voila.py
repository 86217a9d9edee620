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
    check_dashboard_follows_slider,
    chromium,
    make_server,
    voila_notebook,
    voila_server,
)


@pytest.mark.browser
@pytest.mark.slow
def test_voila_dashboard_renders_and_follows_the_slider(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    token = secrets.token_urlsafe(16)
    log = tmp_path / "voila.log"
    with make_server("voila", "VOILA_PORT", log, VOILA_TOKEN=token) as port, sync_playwright() as pw:
        base = f"http://127.0.0.1:{port}"
        assert f"{base}/?token={token}" in log.read_text()  # make voila prints the URL with its token
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # without the token: the login page
        conn.request("GET", "/")
        refused = conn.getresponse()
        assert (refused.status, refused.getheader("Location")) == (302, "/login?next=%2F")
        conn.close()

        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1450, "height": 1100})
            watch = PageWatch(page, "voila_queue_dashboard")
            net = NetworkWatch(page, "voila_queue_dashboard", voila=True)
            page.goto(f"{base}/?token={token}", timeout=300_000)
            check_dashboard_follows_slider(watch, "voila_queue_dashboard.png")
            assert not watch.page_errors, watch.page_errors
            net.check()  # every request went to 127.0.0.1 (no Font Awesome from a CDN), no console error
            assert any("/voila/templates/research-lab/static/" in r for r in net.requests)  # the project's template
            assert page.evaluate(FONT_AWESOME_JS) == FONT_AWESOME_5  # icons still have their font, served locally
        finally:
            browser.close()
    assert "deprecated" not in log.read_text().lower()


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
