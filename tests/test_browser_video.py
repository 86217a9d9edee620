"""End to end: the VideoDemo in Voila, read from what Chromium draws.

A one-cell notebook shows ``VideoDemo()`` (coordinated ConFiner, 4 + 5 steps, T_e 100, seed 0). In the page the
test checks that the five videos (ConFiner, each expert alone, a real held-out clip) are decoded, animated GIFs of
8 frames at 128 px and not blank, that ConFiner's first frame is the one :class:`lab.generative.video.demo.VideoSession`
computes here for the same settings, that the progress line reaches ``done`` through intermediate NFE counts, that
the metrics table has the five rows with ConFiner's 19 NFE, and that the frame scrubber changes the stills to frame k.
It fails on any page or notebook error and on any request that leaves 127.0.0.1 (PageWatch, NetworkWatch) and
saves ``video_voila_*.png`` under ``$LAB_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import base64
import io
import os
import time

import numpy as np
import pytest

from tests.browser import ARTIFACTS, CHROMIUM_ARGS, ROOT, NetworkWatch, PageWatch, chromium, voila_notebook, voila_server

CELL = f"""
import os, sys
os.environ["OMP_NUM_THREADS"] = "1"
sys.path.insert(0, {str(ROOT)!r})
from widgets import VideoDemo

demo = VideoDemo(mode="coordinated", control_steps=4, refine_steps=5, t_e=100, seed=0)
demo
"""
IMAGE_JS = """async (sel) => {
    const img = document.querySelector(sel);
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let bin = ''; for (const b of bytes) bin += String.fromCharCode(b);
    return {data: btoa(bin), w: img.naturalWidth, h: img.naturalHeight};
}"""
DECODED_JS = """(sel) => Array.from(document.querySelectorAll(sel))
    .filter(i => i.offsetParent !== null && i.complete && i.naturalWidth > 0).length"""
PROGRESS_OBSERVER_JS = """() => {
    const el = document.querySelector('.lab-vd-progress-label');
    window.__seen = [el.innerText];
    new MutationObserver(() => window.__seen.push(el.innerText)).observe(el, {subtree: true, childList: true, characterData: true});
}"""


def _frames(data: bytes) -> list[np.ndarray]:
    from PIL import Image, ImageSequence

    im = Image.open(io.BytesIO(data))
    return [np.asarray(f.convert("L")) for f in ImageSequence.Iterator(im)]


@pytest.mark.browser
@pytest.mark.slow
def test_voila_video_demo(tmp_path):
    from playwright.sync_api import sync_playwright

    from lab.generative.video import demo as D

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    expected = D.VideoSession("coordinated", 4, 5, 100, 0)
    expected.run()
    notebook = voila_notebook(CELL, tmp_path / "video_demo.ipynb")
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1000})
            watch = PageWatch(page, "video_voila")
            net = NetworkWatch(page, "video_voila", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            watch.wait_for(page.locator(".lab-video-demo"), what="the video demo", timeout_s=300)
            watch.wait_for("() => document.querySelector('.lab-vd-progress-label').innerText.includes('done')",
                           what="the first run's end", timeout_s=240)
            watch.wait_for(f"() => ({DECODED_JS})('img.lab-vd-video') === 5 && ({DECODED_JS})('img.lab-vd-still') === 5",
                           what="five videos and five stills, decoded")
            for name in D.VIDEO_NAMES:
                got = page.evaluate(IMAGE_JS, f"img.lab-vd-video-{name}")
                frames = _frames(base64.b64decode(got["data"]))
                assert (got["w"], got["h"]) == (128, 128) and len(frames) == 8, (name, got["w"], len(frames))
                assert int(frames[0].max()) - int(frames[0].min()) > 30, name  # not blank
                if name == "confiner":  # the kernel's run is this process's run (same seed, one thread)
                    want = _frames(D.gif_bytes(expected.videos["confiner"], 128))
                    assert np.abs(frames[0].astype(int) - want[0].astype(int)).max() <= 2
            table = page.locator(".lab-vd-table").inner_text()
            assert table.count("\n") >= 5 and "ConFiner" in table and "real held-out clip" in table, table
            row = page.locator(".lab-vd-row-confiner").inner_text()
            assert "\t19\t" in row or " 19 " in f" {row} ", row
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "video_voila_start.png"), full_page=True)

            # the scrubber: frame 5 of every video as a still
            before = page.evaluate(IMAGE_JS, "img.lab-vd-still-confiner")["data"]
            page.locator(".lab-vd-scrubber .noUi-handle").first.focus()
            for _ in range(5):
                page.keyboard.press("ArrowRight")
            watch.wait_for("() => document.querySelector('.lab-vd-scrubber .widget-readout').innerText.trim() === '5'",
                           what="the scrubber at frame 5")
            watch.wait_for("(b) => fetch(document.querySelector('img.lab-vd-still-confiner').src).then(r => r.arrayBuffer())"
                           ".then(a => { let s = ''; for (const x of new Uint8Array(a)) s += String.fromCharCode(x); return btoa(s) !== b; })",
                           arg=before, what="the ConFiner still to change")
            # The readout reaches 5 as soon as the slider does; the stills of frames 1-4 may still be arriving from the
            # kernel then, so wait (bounded) for the still of frame 5 rather than read whichever came first.
            want = _frames(D.frame_png(expected.videos["confiner"][5], 128))[0]
            deadline, diff = time.monotonic() + 30, None
            while time.monotonic() < deadline:
                still = _frames(base64.b64decode(page.evaluate(IMAGE_JS, "img.lab-vd-still-confiner")["data"]))[0]
                diff = int(np.abs(still.astype(int) - want.astype(int)).max())
                if diff <= 2:
                    break
                page.wait_for_timeout(250)
            assert diff is not None and diff <= 2, f"the ConFiner still never showed frame 5 (max pixel difference {diff})"

            # the play button animates the scrubber (and the stills) on its own
            page.locator(".lab-video-demo .widget-play button").first.click()
            watch.wait_for("() => document.querySelector('.lab-vd-scrubber .widget-readout').innerText.trim() !== '5'",
                           what="the play button to move the scrubber")

            # a new run (seed 1) streams progress through intermediate NFE counts
            page.evaluate(PROGRESS_OBSERVER_JS)
            page.locator(".lab-video-demo input[type='number']").nth(3).fill("1")
            page.keyboard.press("Enter")
            watch.wait_for("() => { const i = window.__seen.indexOf('starting');"
                           " return i >= 0 && window.__seen.slice(i).some(s => s.includes('done')); }",
                           what="the seed-1 run's start and end", timeout_s=240)
            seen = page.evaluate("() => window.__seen.slice(window.__seen.indexOf('starting'))")
            assert any("NFE" in s and "done" not in s for s in seen), seen
            page.screenshot(path=str(ARTIFACTS / "video_voila_scrubbed.png"), full_page=True)
            watch.check("the end")
            net.check()
        finally:
            browser.close()
