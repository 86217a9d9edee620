"""End to end: the research-lab JupyterLab extension in a real JupyterLab under a non-default base_url.

One JupyterLab (module fixture) on a free loopback port, served under ``/research/lab/`` with a token,
its root a temporary folder. Chromium checks that the launcher shows the Research Lab section with one
card per dashboard template and that a card saves a fresh copy of its notebook in the user's folder
and opens it, whose Run All (after the kernel reads Idle) draws the dashboard; that the side panel
lists a real Slurm testbed site (with its queue) and a real training run started by the test, and marks
the run dead after it is SIGKILLed, without a page reload. The server extension's handlers answer only
under the base_url and only with the token. Every page fails on any request off 127.0.0.1 and on
console errors (:class:`tests.browser.NetworkWatch`). Screenshots: ``lab_launcher.png``,
``lab_side_panel.png`` under ``$LAB_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from research_lab_ext.handlers import CATALOG
from tests.browser import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    KERNEL_IDLE_JS,
    ROOT,
    NetworkWatch,
    PageWatch,
    chromium,
    free_port,
    jupyter_env,
    run_all_cells,
    serve,
)
from tests.dashboard_checks import QUEUE, check_plot

BASE_URL = "/research/lab/"
TEMPLATES = sorted((ROOT / "notebooks" / "dashboards").glob("*.ipynb"))
LABELS = [CATALOG[p.stem][1] for p in TEMPLATES]  # one card per template, in file order
SECTION = ".jp-Launcher-section:has(.jp-Launcher-sectionTitle:text-is('Research Lab'))"
CARD_LABELS_JS = f"""() => Array.from(document.querySelectorAll(".jp-Launcher-section"))
  .filter(s => s.querySelector('.jp-Launcher-sectionTitle')?.innerText === 'Research Lab')
  .flatMap(s => Array.from(s.querySelectorAll('.jp-LauncherCard-label')).map(e => e.innerText.trim()))"""
TABS_JS = "() => Array.from(document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab .lm-TabBar-tabLabel')).map(e => e.innerText)"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab under BASE_URL; yields a dict: url (with the base_url), token, root, live (the folder the
    server extension searches for live things, ``LAB_LIVE_ROOTS``), env."""
    tmp = tmp_path_factory.mktemp("labext")
    root, live = tmp / "root", tmp / "live"
    root.mkdir()
    live.mkdir()
    token = secrets.token_urlsafe(16)
    env = jupyter_env(tmp / "jupyter", JUPYTER_TOKEN=token, LAB_LIVE_ROOTS=str(live),
                      JUPYTER_CONFIG_PATH=str(ROOT / "jupyter-config"))
    port = free_port()
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter), "lab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--ServerApp.root_dir={root}", f"--ServerApp.base_url={BASE_URL}",
           "--ServerApp.jpserver_extensions=notebook_shim=False", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = tmp / "lab.log"
    with serve(cmd, port, log, cwd=root, name="jupyter lab", env=env):
        url = f"http://127.0.0.1:{port}{BASE_URL}"
        deadline = time.monotonic() + 60
        while True:  # listening comes before the extensions are loaded
            try:
                urllib.request.urlopen(f"{url}api/status?token={token}", timeout=10)
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer /api/status:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield {"url": url, "port": port, "token": token, "root": root, "live": live, "env": env, "log": log}


def _get(url: str, **headers):
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read() or b"null")


def _post(url: str, body: bytes, **headers):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.mark.slow
def test_server_extension_answers_under_base_url_behind_the_token(lab):
    url, auth = lab["url"], {"Authorization": f"token {lab['token']}"}
    status, dashboards = _get(f"{url}research-lab/dashboards", **auth)
    assert status == 200 and [d["label"] for d in dashboards] == LABELS
    assert [d["file"] for d in dashboards] == [p.name for p in TEMPLATES]
    status, live = _get(f"{url}research-lab/live", **auth)
    assert status == 200 and set(live) == {"time", "sites", "runs", "services", "errors"}
    for path in ("research-lab/dashboards", "research-lab/live"):  # no token: refused
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}{path}", timeout=30)
        assert refused.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as outside:  # only under the base_url
        urllib.request.urlopen(f"http://127.0.0.1:{lab['port']}/research-lab/dashboards?token={lab['token']}", timeout=30)
    assert outside.value.code == 404
    # bad requests say what is wrong, and write nothing
    assert _post(f"{url}research-lab/dashboards/no-such", b"{}", **auth) == (
        404, {"message": f"no dashboard 'no-such'; known: {[d['id'] for d in dashboards]}"})
    assert _post(f"{url}research-lab/dashboards/site-queues", b'{"dir": "missing/folder"}', **auth) == (
        400, {"message": "no folder 'missing/folder' under the server root"})
    assert _post(f"{url}research-lab/dashboards/site-queues", b'{"dir": 3}', **auth)[0] == 400
    assert _post(f"{url}research-lab/dashboards/site-queues", b"not json", **auth)[0] == 400
    assert list(lab["root"].iterdir()) == []


@pytest.mark.browser
@pytest.mark.slow
def test_launcher_cards_open_a_fresh_dashboard_that_runs(lab):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 950})
            watch = PageWatch(page, "lab_launcher")
            net = NetworkWatch(page, "lab_launcher")
            page.goto(f"{lab['url']}lab?token={lab['token']}", timeout=300_000)
            watch.wait_for(f"() => ({CARD_LABELS_JS})().length === {len(LABELS)}", what="the Research Lab launcher cards",
                           timeout_s=120)
            assert page.evaluate(CARD_LABELS_JS) == LABELS
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "lab_launcher.png"))
            # the same as a menu
            page.locator(".lm-MenuBar-item", has_text="Research Lab").click()
            items = page.locator(".lm-Menu-content .lm-Menu-itemLabel").all_inner_texts()
            assert [i for i in items if i in LABELS] == LABELS, items
            page.keyboard.press("Escape")
            # a card saves a fresh copy in the user's folder and opens it
            page.locator(SECTION).locator(".jp-LauncherCard", has_text="Site queues").click()
            watch.wait_for(f"() => ({TABS_JS})().includes('01_queues.ipynb')", what="the copied notebook's tab")
            assert (lab["root"] / "01_queues.ipynb").read_bytes() == (ROOT / "notebooks/dashboards/01_queues.ipynb").read_bytes()
            watch.wait_for(KERNEL_IDLE_JS, what="the kernel (status bar: Python 3 | Idle)", timeout_s=180)
            run_all_cells(page)
            check_plot(watch, QUEUE, lines=3 * 4, points=3 * 2, bars=3)
            page.screenshot(path=str(ARTIFACTS / "lab_launcher_dashboard.png"))
            # a second click: another fresh copy, the first one untouched
            page.locator(".lm-MenuBar-item", has_text="Research Lab").click()
            page.locator(".lm-Menu-content .lm-Menu-item", has_text="Site queues").click()
            watch.wait_for(f"() => ({TABS_JS})().includes('01_queues-1.ipynb')", what="the second copy's tab")
            assert (lab["root"] / "01_queues-1.ipynb").is_file()
            net.check()
        finally:
            browser.close()


def _panel_state(page):
    return page.evaluate("""() => ({
      sites: Array.from(document.querySelectorAll('.rl-site')).map(e => [e.dataset.name, e.dataset.state,
             e.querySelector('.rl-item-detail').innerText]),
      runs: Array.from(document.querySelectorAll('.rl-run')).map(e => [e.dataset.name, e.dataset.state,
             Number(e.dataset.step), e.dataset.alive]),
      updated: Number(document.querySelector('.rl-LivePanel-status')?.dataset.time || 0)})""")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.slurm
def test_side_panel_lists_a_live_site_and_run_and_marks_the_run_dead(lab):
    from playwright.sync_api import sync_playwright

    from lab.hpc.schedulers.base import JobSpec
    from lab.hpc.testbed import Testbed, TestbedError
    from lab.training.model import GPTConfig
    from lab.training.monitor import RunMonitor
    from lab.training.run import TrainConfig, launch

    executable = chromium()
    testbed = Testbed(lab["live"] / "tb", timeout_s=30, grace_s=5)
    proc = None
    try:
        try:
            testbed.up(["alpha"], cpus=[2], memory_mb=[2000])
        except TestbedError as exc:
            pytest.fail(f"could not start the Slurm testbed: {exc}")
        sched = testbed.site("alpha").scheduler()
        sched.submit(JobSpec(name="busy", command="sleep 120", ntasks=2, walltime_s=300, workdir=lab["live"]))
        sched.submit(JobSpec(name="waiting", command="sleep 120", ntasks=2, walltime_s=300, workdir=lab["live"]))
        cfg = TrainConfig(run_dir=lab["live"] / "run" / "panel-run", events_path=lab["live"] / "run" / "events.sqlite",
                          model=GPTConfig.tiny(), steps=100_000, batch_size=8, lr=3e-3, warmup_steps=2,
                          eval_interval=1000, eval_batches=1, checkpoint_interval=0, heartbeat_s=0.5)
        proc = launch(cfg, 1)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 950})
                watch = PageWatch(page, "lab_side_panel")
                net = NetworkWatch(page, "lab_side_panel")
                page.goto(f"{lab['url']}lab?token={lab['token']}", timeout=300_000)
                page.locator(".jp-SideBar .lm-TabBar-tab[data-id='research-lab-live']").click()
                watch.wait_for(
                    """() => { const s = document.querySelector(".rl-site[data-name='alpha']");
                       return s && s.dataset.state === 'up' && /1 pending, 1 running/.test(s.innerText); }""",
                    what="site alpha up with 1 pending and 1 running job", timeout_s=60)
                watch.wait_for("() => { const r = document.querySelector(\".rl-run[data-name='panel-run']\");"
                               " return r && r.dataset.state === 'running' && Number(r.dataset.step) > 0; }",
                               what="the run, running, with a step logged", timeout_s=120)
                page.evaluate("() => { window.__notReloaded = true; }")
                first = _panel_state(page)
                watch.wait_for(f"() => Number(document.querySelector(\".rl-run[data-name='panel-run']\").dataset.step) > "
                               f"{first['runs'][0][2]}", what="the run's step to advance without a reload", timeout_s=60)
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "lab_side_panel.png"))
                # the rank's own process SIGKILLed (as the OOM killer does): it writes nothing more
                with RunMonitor(cfg.events_path) as mon:
                    pids = [int(p) for p in mon.status("panel-run")["pid"]]
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                watch.wait_for("() => document.querySelector(\".rl-run[data-name='panel-run']\").dataset.state === 'dead'",
                               what="the SIGKILLed run marked dead", timeout_s=30)
                after = _panel_state(page)
                assert after["runs"][0][3] == "false"  # its process is gone
                assert page.evaluate("() => window.__notReloaded === true")
                assert after["sites"][0][:2] == ["alpha", "up"]
                page.screenshot(path=str(ARTIFACTS / "lab_side_panel_dead.png"))
                net.check()
            finally:
                browser.close()
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        testbed.down()
