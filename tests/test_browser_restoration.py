"""End to end: the RestorationDemo in JupyterLab and in Voila, read from what Chromium draws.

A one-cell notebook shows the demo on the Gaussian digits prior (box inpainting of test digit #1,
ReBridge-Flow as written, 50 NFE) compared with Flower. In the page, the test checks:

- the restored image is a decoded 168 x 168 PNG (8 x 8 at 21x), not blank, whose pixels are the ones
  ``lab.generative.demo.RestorationSession`` computes here for the same settings, and its PSNR label is
  that run's PSNR;
- no control is cut: every dropdown option fits its select, every label and button its box;
- the compare view shows two restorations of the same measurement, headed by the two methods, with
  their own PSNR (each equal to the kernel-independent run here);
- clicking an example of the gallery changes the input (the image picker, the ground truth, the result);
- the download link yields a valid PNG: the restored image at 8 x 8, with the run's pixels and file name,
  and the comparison strip;
- a run shows progress: the progress line passes through intermediate ``k/200 NFE`` states before ``done``;
- with Flower as the method, the b_bar panel and the defect chart say why they are empty (no grey square),
  and with the Bayes mean the step panels say it takes no steps;
- the step slider moves the chart's markers.

It fails on any page or notebook error and on any request that leaves 127.0.0.1 (tests/browser.py
PageWatch, NetworkWatch) and saves screenshots ``restoration_<lab|voila>_*.png`` under ``$LAB_TEST_ARTIFACTS``.
Needs Debian's Chromium: fails, never skips, without it.
"""

from __future__ import annotations

import base64
import io
import os
import re
import secrets

import numpy as np
import pytest

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

CELL = f"""
import os, sys
os.environ["OMP_NUM_THREADS"] = "1"
sys.path.insert(0, {str(ROOT)!r})
from widgets import RestorationDemo

demo = RestorationDemo(prior="gaussian-digits", image=1, task="inpaint_box", method="rebridge", nfe=50, compare="flower")
demo
"""
DEMO = ".lab-restoration-demo"
VISIBLE_IMAGES_JS = """(sel) => Array.from(document.querySelectorAll(sel))
    .filter(img => img.offsetParent !== null && img.complete && img.naturalWidth > 0).length"""
# the image's PNG bytes (blob: URL of ipywidgets' Image) as base64, and its decoded luminance spread
IMAGE_JS = """async (sel) => {
    const img = document.querySelector(sel);
    const bytes = new Uint8Array(await (await fetch(img.src)).arrayBuffer());
    let bin = ''; for (const b of bytes) bin += String.fromCharCode(b);
    const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
    const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    let lo = 255, hi = 0; for (let i = 0; i < d.length; i += 4) { lo = Math.min(lo, d[i]); hi = Math.max(hi, d[i]); }
    return {png: btoa(bin), w: img.naturalWidth, h: img.naturalHeight, lo, hi, src: img.src};
}"""
# every option of every select, every label and button of the demo: text wider than its box is cut
CUT_JS = """(root) => {
    const el = document.querySelector(root), cut = [];
    const ctx = document.createElement('canvas').getContext('2d');
    for (const sel of el.querySelectorAll('select')) {
        const cs = getComputedStyle(sel);
        ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
        const room = sel.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
        for (const o of sel.options) { const w = ctx.measureText(o.text).width; if (w > room) cut.push(`select option '${o.text}' ${w.toFixed(0)} > ${room.toFixed(0)} px`); }
    }
    for (const e of el.querySelectorAll('.widget-label, .widget-label-basic, button, .widget-readout, .lab-rd-progress-label')) {
        if (e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1) cut.push(`'${e.innerText}' ${e.scrollWidth} > ${e.clientWidth} px`);
    }
    return cut;
}"""
PROGRESS_OBSERVER_JS = """() => {
    const el = document.querySelector('.lab-rd-progress-label');
    window.__labProgressSeen = [el.innerText];
    new MutationObserver(() => window.__labProgressSeen.push(el.innerText))
        .observe(el, {subtree: true, childList: true, characterData: true});
}"""
CHART = f"{DEMO} .js-plotly-plot"
# where the defect chart's 'no defect terms' note is drawn, against the subplots' pixel extents
NOTE_PLACE_JS = f"""() => {{
    const el = document.querySelector({CHART!r}), size = el._fullLayout._size, box = el.getBoundingClientRect();
    const note = Array.from(el.querySelectorAll('.annotation')).find(g => g.textContent.includes('no defect terms'));
    const r = note.getBoundingClientRect(), d1 = el.layout.xaxis.domain, d2 = el.layout.xaxis2.domain;
    return {{center: r.left + r.width / 2 - box.left, right: r.right - box.left,
             left_mid: size.l + size.w * (d1[0] + d1[1]) / 2, right_start: size.l + size.w * d2[0]}};
}}"""


def _text(page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def _psnr(text: str) -> str:
    m = re.search(r"PSNR ([\d.]+) dB", text)
    assert m, text
    return m.group(1)


def _decode(png: bytes) -> np.ndarray:
    from PIL import Image

    assert png.startswith(b"\x89PNG\r\n\x1a\n"), png[:16]
    return np.asarray(Image.open(io.BytesIO(png)))


def _expected(image: int, method: str, compare: str = "flower", nfe: int = 50):
    """The same runs as the kernel's, computed in this process (deterministic: same seed, float64)."""
    from lab.generative import demo as D
    from lab.generative.demo_compare import run_comparison

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    s = [D.RestorationSession("gaussian-digits", image, "inpaint_box", m, nfe=nfe, seed=0) for m in (method, compare)]
    return run_comparison(*s)


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def check_demo(watch: PageWatch, prefix: str) -> None:
    """Everything the module docstring lists, on a page showing :data:`CELL`'s demo."""
    from lab.generative import demo as D

    page = watch.page
    watch.wait_for(page.locator(DEMO), what="the restoration demo", timeout_s=300)
    watch.wait_for(f"() => ({VISIBLE_IMAGES_JS})('img.lab-rd-image') === 4", what="the four image panels, decoded", timeout_s=120)
    watch.wait_for(f"() => ({VISIBLE_IMAGES_JS})('img.lab-rd-compare-image') === 2", what="the two compared images, decoded")
    watch.wait_for("() => document.querySelector('.lab-rd-progress-label').innerText.includes('done')", what="the first run's end")
    exp = _expected(1, "rebridge")
    r = exp.first

    # the restored image: decoded, 8 x 8 at 21x, not blank, the run's pixels; its PSNR label is the run's
    got = page.evaluate(IMAGE_JS, "img.lab-rd-restored")
    assert (got["w"], got["h"]) == (168, 168) and got["hi"] - got["lo"] > 100, got | {"png": "..."}
    np.testing.assert_array_equal(_decode(base64.b64decode(got["png"])), _decode(D.image_png(r.restored, size=168)))
    assert _psnr(_text(page, ".lab-rd-metric-restored")) == f"{r.metrics['restored']['psnr']:.2f}"
    assert _psnr(_text(page, ".lab-rd-metric-bayes")) == f"{r.metrics['bayes']['psnr']:.2f}"
    assert "ReBridge-Flow (as written)" in _text(page, ".lab-rd-status")

    # no control is cut
    cut = page.evaluate(CUT_JS, DEMO)
    assert not cut, cut
    assert "done: 100/100 NFE" in _text(page, ".lab-rd-progress-label")  # 50 + 50 NFE, shown whole

    # the compare view: the two methods' restorations of one y, each with its own PSNR
    assert _text(page, ".lab-rd-compare-head-first") == "ReBridge-Flow (as written)"
    assert _text(page, ".lab-rd-compare-head-second") == "Flower"
    for side, res in (("first", exp.first), ("second", exp.second)):
        assert _psnr(_text(page, f".lab-rd-compare-metric-{side}")) == f"{res.metrics['restored']['psnr']:.2f}", side
        shown = page.evaluate(IMAGE_JS, f"img.lab-rd-compare-{side}")
        np.testing.assert_array_equal(_decode(base64.b64decode(shown["png"])), _decode(D.image_png(res.restored, size=168)))
    assert f"{exp.psnr_gain:+.2f} dB" in _text(page, ".lab-rd-compare-summary")

    # the chart: rebridge's 5 defect terms, 2 mismatches and sigma_y, markers at the last step; the slider moves them
    watch.wait_for(f"() => {{ const el = document.querySelector({CHART!r}); return el && el.data.length === 8"
                   " && el.data.every(d => d.x.length > 0) && el.layout.shapes.length === 2 && el.layout.shapes.every(s => s.x0 === 49); }",
                   what="the chart's 8 series, markers at step 49")
    _shot(page, f"restoration_{prefix}_start.png")
    page.locator(".lab-rd-slider .noUi-handle").first.focus()
    for _ in range(10):
        page.keyboard.press("ArrowLeft")
    watch.wait_for(f"() => document.querySelector('.lab-rd-step').innerText.includes('step 39 ') &&"
                   f" document.querySelector({CHART!r}).layout.shapes.every(s => s.x0 === 39)",
                   what="step 39 on the label and the chart")

    # download: the restored PNG at the prior's 8 x 8, the run's pixels and name; the comparison strip
    with page.expect_download() as dl:
        page.locator(".lab-rd-download-restored").click()
    assert dl.value.suggested_filename == r.download_name("restored") == "restored_gaussian-digits_inpaint_box_rebridge_50nfe_seed0_test1.png"
    pixels = _decode(open(dl.value.path(), "rb").read())
    assert pixels.shape == (8, 8) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, np.round(255 * (np.clip(r.restored[0].astype(np.float64), -1, 1) + 1) / 2))
    with page.expect_download() as dl:
        page.locator(".lab-rd-download-compare").click()
    strip = _decode(open(dl.value.path(), "rb").read())
    assert strip.shape[:2] == (96, 4 * 96 + 3 * 4) and dl.value.suggested_filename == exp.download_name()

    # the gallery: clicking example #3 makes test digit #3 the input
    digits = D.load_prior("gaussian-digits")
    truth_before = page.evaluate(IMAGE_JS, "img.lab-rd-truth")["png"]
    page.locator(".lab-rd-gallery .lab-gallery-item[data-index='3']").click()
    name = digits.test_names[3]
    watch.wait_for("(name) => document.querySelector('.lab-rd-metric-truth').innerText.includes(name)", arg=name,
                   what=f"the ground truth to be {name}")
    exp3 = _expected(3, "rebridge")
    watch.wait_for("(p) => document.querySelector('.lab-rd-metric-restored').innerText.includes(p)",
                   arg=f"PSNR {exp3.first.metrics['restored']['psnr']:.2f} dB", what="the restored PSNR of test digit #3")
    truth = page.evaluate(IMAGE_JS, "img.lab-rd-truth")["png"]
    assert truth != truth_before
    np.testing.assert_array_equal(_decode(base64.b64decode(truth)), _decode(D.image_png(digits.test_images[3], size=168)))
    picked = page.evaluate("() => { const s = document.querySelector('.lab-rd-image-picker select'); return s.options[s.selectedIndex].text.replace(/\u00a0/g, ' '); }")
    assert picked == name
    assert page.locator(".lab-gallery-item.lab-gallery-selected").get_attribute("data-index") == "3"
    _shot(page, f"restoration_{prefix}_gallery.png")

    # progress: 100 NFE for each method; the progress line passes through intermediate states
    page.evaluate(PROGRESS_OBSERVER_JS)
    page.locator(".lab-rd-nfe button", has_text=re.compile(r"^100$")).click()
    watch.wait_for("() => document.querySelector('.lab-rd-progress-label').innerText.includes('done: 200/200 NFE')",
                   what="the 200-NFE run's end")
    seen = page.evaluate("() => window.__labProgressSeen")
    steps = {int(m.group(1)) for s in seen for m in [re.search(r"(\d+)/200 NFE", s)] if m}
    assert any(0 < k < 200 for k in steps), seen

    # empty states: Flower has no b_bar and no defect terms, and says so; the Bayes mean takes no steps
    page.locator(".lab-rd-method select").select_option(label="Flower")
    watch.wait_for("() => document.querySelector('.lab-rd-status').innerText.startsWith('Flower:')", what="Flower's run")
    watch.wait_for("() => { const n = document.querySelector('.lab-rd-note-b_bar'); return n && n.offsetParent !== null"
                   " && n.innerText.includes('Flower refines b_hat') && document.querySelector('img.lab-rd-step-b_bar').offsetParent === null; }",
                   what="the b_bar panel to say why Flower has none")
    watch.wait_for(f"() => Array.from(document.querySelectorAll({CHART!r} + ' .annotation-text'))"
                   ".some(a => a.textContent.includes('no defect terms'))", what="the defect chart to say why it is empty")
    # ... in the middle of the left subplot's area, clear of the right one
    note = page.evaluate(NOTE_PLACE_JS)
    assert abs(note["center"] - note["left_mid"]) < 15 and note["right"] < note["right_start"], note
    assert page.evaluate(f"() => ({VISIBLE_IMAGES_JS})('img.lab-rd-step-image')") == 3  # x, a_hat, b_hat drawn
    _shot(page, f"restoration_{prefix}_flower.png")
    page.locator(".lab-rd-method select").select_option(label="Bayes posterior mean (exact priors)")
    watch.wait_for("() => Array.from(document.querySelectorAll('.lab-rd-note')).filter(n => n.offsetParent !== null"
                   " && n.innerText.includes('closed form')).length === 4", what="the four step panels to say the Bayes mean takes no steps")
    assert page.evaluate(f"() => ({VISIBLE_IMAGES_JS})('img.lab-rd-step-image')") == 0
    watch.check("the end")
    assert not watch.page_errors, watch.page_errors


@pytest.mark.browser
@pytest.mark.slow
def test_voila_restoration_demo(tmp_path):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    notebook = voila_notebook(CELL, tmp_path / "restoration_demo.ipynb")
    with voila_server(notebook, tmp_path / "voila.log") as port, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1700}, accept_downloads=True)
            watch = PageWatch(page, "restoration_voila")
            net = NetworkWatch(page, "restoration_voila", voila=True)
            page.goto(f"http://127.0.0.1:{port}/", timeout=300_000)
            check_demo(watch, "voila")
            net.check()
        finally:
            browser.close()


@pytest.mark.browser
@pytest.mark.slow
def test_lab_restoration_demo(tmp_path):
    import nbformat
    from playwright.sync_api import sync_playwright

    executable = chromium()
    root = tmp_path / "notebooks"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL.strip())]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "restoration.ipynb")
    token = secrets.token_urlsafe(16)
    with make_server("lab", "LAB_PORT", tmp_path / "lab.log", LAB_TOKEN=token, LAB_ROOT=str(root)) as port:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2000}, accept_downloads=True)
                watch = PageWatch(page, "restoration_lab")
                net = NetworkWatch(page, "restoration_lab")
                page.goto(f"http://127.0.0.1:{port}/lab/tree/restoration.ipynb?token={token}", timeout=300_000)
                watch.wait_for(KERNEL_IDLE_JS, what="the kernel", timeout_s=180)
                run_all_cells(page)
                check_demo(watch, "lab")
                net.check()
            finally:
                browser.close()
