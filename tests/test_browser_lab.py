"""End to end: `make lab` serves JupyterLab with a token; a real Chromium opens 01_site_queues.ipynb,
runs every cell, and drives the dashboard as a new user would.

The notebooks are copied to a temporary root (``LAB_ROOT``) so that JupyterLab's autosave never
writes outputs into the checked-in notebook. Fails (never skips) without Chromium.
"""

from __future__ import annotations

import re
import secrets
import shutil
import urllib.error
import urllib.request

import pytest

from tests.browser import CHROMIUM_ARGS, ROOT, check_dashboard_follows_slider, chromium, make_server


@pytest.mark.browser
@pytest.mark.slow
def test_lab_runs_the_notebook_and_the_dashboard_follows_the_slider(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    executable = chromium()
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    token = secrets.token_urlsafe(16)
    with make_server("lab", "LAB_PORT", tmp_path / "lab.log", LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        base = f"http://127.0.0.1:{port}"
        with pytest.raises(urllib.error.HTTPError) as refused:  # the token is required
            urllib.request.urlopen(f"{base}/api/contents", timeout=30)
        assert refused.value.code == 403
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1100})
                page.goto(f"{base}/lab/tree/01_site_queues.ipynb?token={token}", timeout=300_000)
                # The toolbar reads idle before the kernel is ready; the status bar's "| Idle" is reliable.
                expect(page.locator(".jp-StatusBar-Widget", has_text="Python 3").first).to_contain_text("Idle", timeout=180_000)
                page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
                page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
                check_dashboard_follows_slider(page, "lab_queue_dashboard.png")
                # every code cell ran, none wrote to stderr (tracebacks render there)
                stderr = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                assert stderr.count() == 0, stderr.all_inner_texts()
            finally:
                browser.close()
