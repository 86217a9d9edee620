"""End to end: `make voila` serves the dashboard notebook; a real Chromium moves the slider and sees it change.

Needs Debian's Chromium (``make test`` installs it when run as root). Without it this
test fails, never skips, and says how to install it. The screenshot is written to
``$LAB_TEST_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

import pytest

from tests.browser import CHROMIUM_ARGS, check_dashboard_follows_slider, chromium, make_server


@pytest.mark.browser
@pytest.mark.slow
def test_voila_dashboard_renders_and_follows_the_slider(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with make_server("voila", "VOILA_PORT", tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1450, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            check_dashboard_follows_slider(page, "voila_queue_dashboard.png")
            assert not errors, errors
        finally:
            browser.close()
