"""End to end: `make voila` serves the dashboard notebook; a real Chromium moves the slider and sees it change.

Needs Debian's Chromium (``make test`` installs it when run as root). Without it this
test fails, never skips, and says how to install it. The screenshot is written to
``$LAB_TEST_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LAB_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]

# Per site: where the time marker sits in the pending-jobs plot, and the value of the "pending now" dot.
# One figure, one column of subplots per site: 7 traces and 2 marker lines per site.
STATE_JS = """() => { const el = document.querySelector('.js-plotly-plot');
    return [0, 1, 2].map(k => [el.layout.shapes[2 * k].x0, el.data[7 * k + 4].y[0]]); }"""
TABLES_JS = "() => Array.from(document.querySelectorAll('.lab-pending-table')).map(el => el.innerText)"


def _pending_at_day(day: float) -> list[int]:
    from lab.hpc import QueueReplay, load_trace

    replays = [QueueReplay(load_trace(name)) for name in ("theta_2022", "theta_2023", "hpc2n")]  # the notebook's sites
    return [r.snapshot(r.first_submit + day * 86400).pending for r in replays]


def _chromium() -> str:
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.fail(
            "Chromium is not installed, so the browser test cannot run. Install Debian's package: "
            "`sudo apt-get install -y --no-install-recommends chromium` (make test does this itself when run as root)."
        )
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def voila_url(tmp_path):
    port = _free_port()
    log = (tmp_path / "voila.log").open("w+")
    proc = subprocess.Popen(
        ["make", "-s", "voila", f"VOILA_PORT={port}"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"`make voila` exited with {proc.returncode}:\n{log.read()[-3000:]}")
            try:  # the server is up once it accepts connections (the page itself renders later)
                with socket.create_connection(("127.0.0.1", port), timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"Voila did not answer on {url} within 120 s:\n{log.read()[-3000:]}")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.browser
@pytest.mark.slow
def test_dashboard_renders_and_follows_the_slider(voila_url):
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1450, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(voila_url, timeout=300_000)
            # Three sites, one figure each, drawn with their traces.
            page.wait_for_function(
                "() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length >= 3 * 6", timeout=300_000
            )
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.lab-pending-table')).filter(e => e.innerText.includes('longest-waiting')).length >= 2",
                timeout=60_000,
            )
            before_state, before_tables = page.evaluate(STATE_JS), page.evaluate(TABLES_JS)
            assert len(before_state) == 3 and len(before_tables) == 3
            assert [x0 for x0, _ in before_state] == pytest.approx([30.0, 30.0, 30.0]), before_state  # opens at day 30

            handle = page.locator(".widget-slider .noUi-handle").first
            handle.focus()
            for _ in range(4):  # 4 steps of 6 h: one day later
                page.keyboard.press("ArrowRight")
            page.wait_for_function(
                "() => document.querySelector('.js-plotly-plot').layout.shapes.every(s => Math.abs(s.x0 - 31) < 1e-9)",
                timeout=60_000,
            )
            page.wait_for_function(f"(before) => ({TABLES_JS})().some((t, i) => t !== before[i])", arg=before_tables, timeout=60_000)
            after_state, after_tables = page.evaluate(STATE_JS), page.evaluate(TABLES_JS)
            page.locator(".widget-slider").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "voila_queue_dashboard.png"))
            # Theta's queue is busy at day 30 and 31: its table lists different jobs or waits a day apart.
            assert after_tables[0] != before_tables[0]
            assert [x0 for x0, _ in after_state] == pytest.approx([31.0, 31.0, 31.0])
            # The dots show what lab.hpc.queue computes for day 30, then day 31, of each trace.
            assert [y for _, y in before_state] == _pending_at_day(30)
            assert [y for _, y in after_state] == _pending_at_day(31)
            assert not errors, errors
        finally:
            browser.close()
