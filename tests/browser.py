"""Helpers for the browser tests: start a `make` server target on a free port, launch Debian's Chromium."""

from __future__ import annotations

import contextlib
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


def chromium() -> str:
    """Path of Debian's Chromium; fails the test (never skips) with how to install it."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.fail(
            "Chromium is not installed, so the browser test cannot run. Install Debian's package: "
            "`sudo apt-get install -y --no-install-recommends chromium` (make test does this itself when run as root)."
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(cmd: list[str], port: int, log_path: Path, *, cwd: Path = ROOT, name: str = "server", timeout_s: float = 120):
    """Run ``cmd`` (which listens on ``port``) in its own process group until the port accepts
    connections; yield the port; stop the group afterwards (SIGTERM, then SIGKILL after 30 s).
    If the server exits or never listens, the test fails with the tail of its log."""
    with log_path.open("w+") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"`{name}` exited with {proc.returncode}:\n{log.read()[-3000:]}")
                try:  # up once it accepts connections (pages render later)
                    with socket.create_connection(("127.0.0.1", port), timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        log.seek(0)
                        pytest.fail(f"`{name}` did not listen on port {port} within {timeout_s} s:\n{log.read()[-3000:]}")
                    time.sleep(0.5)
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def voila_notebook(code: str, path: Path) -> Path:
    """Write a one-cell notebook (``code``, python3 kernel) to ``path`` for :func:`voila_server`."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@contextlib.contextmanager
def voila_server(notebook: Path, log_path: Path, timeout_s: float = 120):
    """``voila NOTEBOOK`` from its folder on a free port until it accepts connections; yields the port."""
    import sys

    voila = Path(sys.executable).with_name("voila")
    port = free_port()
    cmd = [str(voila), "--no-browser", "--Voila.ip=127.0.0.1", f"--port={port}", notebook.name]
    with serve(cmd, port, log_path, cwd=notebook.parent, name="voila", timeout_s=timeout_s) as p:
        yield p


@contextlib.contextmanager
def make_server(target: str, port_var: str, log_path: Path, timeout_s: float = 120, **make_vars: str):
    """``make -s TARGET PORT_VAR=<free port> ...`` through :func:`serve`; yields the port."""
    port = free_port()
    args = [f"{port_var}={port}", *(f"{k}={v}" for k, v in make_vars.items())]
    with serve(["make", "-s", target, *args], port, log_path, name=f"make {target}", timeout_s=timeout_s) as p:
        yield p


def pending_at_day(day: float) -> list[int]:
    """Pending jobs at ``day`` days into each of the notebook's three sites, as lab.hpc.queue computes them."""
    from lab.hpc import QueueReplay, load_trace

    replays = [QueueReplay(load_trace(name)) for name in ("theta_2022", "theta_2023", "hpc2n")]
    return [r.snapshot(r.first_submit + day * 86400).pending for r in replays]


# One figure, one column of subplots per site: 7 traces and 2 marker lines per site.
STATE_JS = """() => { const el = document.querySelector('.js-plotly-plot');
    return [0, 1, 2].map(k => [el.layout.shapes[2 * k].x0, el.data[7 * k + 4].y[0]]); }"""
TABLES_JS = "() => Array.from(document.querySelectorAll('.lab-pending-table')).map(el => el.innerText)"


def check_dashboard_follows_slider(page, screenshot: str) -> None:
    """On a page showing 01_site_queues' dashboard: it opens at day 30; one day of slider moves
    every site's marker, "pending now" dot and pending-jobs table. Saves a screenshot."""
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length >= 3 * 6", timeout=300_000)
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.lab-pending-table')).filter(e => e.innerText.includes('longest-waiting')).length >= 2",
        timeout=60_000,
    )
    before_state, before_tables = page.evaluate(STATE_JS), page.evaluate(TABLES_JS)
    assert len(before_tables) == 3
    assert [x0 for x0, _ in before_state] == pytest.approx([30.0, 30.0, 30.0]), before_state  # opens at day 30
    assert [y for _, y in before_state] == pending_at_day(30)

    handle = page.locator(".widget-slider .noUi-handle").first
    handle.focus()
    for _ in range(4):  # 4 steps of 6 h, pressed without waiting: one day later
        page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "() => document.querySelector('.js-plotly-plot').layout.shapes.every(s => Math.abs(s.x0 - 31) < 1e-9)", timeout=60_000
    )
    page.wait_for_function(f"(before) => ({TABLES_JS})().some((t, i) => t !== before[i])", arg=before_tables, timeout=60_000)
    after_state, after_tables = page.evaluate(STATE_JS), page.evaluate(TABLES_JS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(".widget-slider").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / screenshot))
    assert after_tables[0] != before_tables[0]  # Theta 2022's queue a day later
    assert [x0 for x0, _ in after_state] == pytest.approx([31.0, 31.0, 31.0])
    assert [y for _, y in after_state] == pending_at_day(31)
