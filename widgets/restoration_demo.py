"""Restoration demo: pick an image, a degradation, one or two methods, NFE and hyper-parameters; see, compare,
scrub and download the result.

A thin view over :class:`lab.generative.demo.RestorationSession` (and, comparing two methods,
:func:`lab.generative.demo_compare.run_comparison`). Controls: the prior, the image (a picker of the
prior's held-out test images, a gallery of them to click, or the user's own PNG/JPEG through the
upload button), the degradation, the method (every method of :mod:`lab.generative.restore`,
ReBridge-Flow once per reading, and the lab's re-coupled ADMM variant), a second method to compare
with, NFE (20/50/100), the method's hyper-parameters (paper or validation-tuned values, editable)
and a Run button. Outputs: degraded, restored, ground truth and Bayes ceiling side by side with
PSNR/SSIM; download links for the restored image (PNG at the prior's resolution) and the comparison
strip; the two methods' restorations of the same measurement side by side; a step slider (with a
play button) scrubbing the trajectory's ``x``, ``a_hat``, ``b_hat`` and ``b_bar``, and one plotly
chart (:class:`widgets.live_chart.LiveChart`) of the defect terms and the measurement mismatch per
step, with a marker at the current step. An output with nothing to draw says why
(:func:`lab.generative.demo.empty_reasons`), never a blank square.

Every run happens in a background thread (:class:`lab.generative.demo.BackgroundRun`) with a
progress bar over the NFE steps and tqdm's meter (:func:`lab.generative.demo.progress_text`), so
the kernel stays responsive and the page shows the run advancing; a new run (any control change,
or Run) cancels the one in flight. The constructor returns at once (``wait=True`` waits for the
first run); ``run(wait=True)`` / :meth:`RestorationDemo.wait` block until the view is updated (for
tests and scripts). Images are PNG bytes (PIL) in ``ipywidgets.Image``, upscaled with nearest
neighbour.
"""

from __future__ import annotations

import base64
import html
import json
import textwrap
import threading
import time

import ipywidgets as W
import numpy as np
from plotly.subplots import make_subplots

from lab.generative import demo as D
from lab.generative.demo_compare import Comparison, run_comparison
from widgets.image_gallery import ImageGallery
from widgets.live_chart import LiveChart

__all__ = ["RestorationDemo"]

_PANELS = (("degraded", "degraded"), ("restored", "restored"), ("truth", "ground truth"), ("bayes", "Bayes ceiling"))
_STEP_PANELS = (("x", "state x"), ("a_hat", "a_hat (source)"), ("b_hat", "b_hat (clean)"), ("b_bar", "b_bar (anchored)"))
_TERM_TRACES = (
    ("measurement_defect", "measurement defect", "#d62728"),
    ("clean_prior_deviation", "clean-side deviation", "#1f77b4"),
    ("source_prior_deviation", "source-side deviation", "#17becf"),
    ("bridge_residual", "bridge residual", "#2ca02c"),
    ("multiplier", "|multiplier term|", "#9467bd"),
    ("defect", "total defect", "#000000"),
)
_MISMATCH_TRACES = (("mismatch_hat", "H b_hat - y", "#ff7f0e"), ("mismatch_bar", "H b_bar - y", "#8c564b"))
_NO_COMPARE = ""
_CHAR_PX = 7.6  # a generous average glyph width of JupyterLab's 13 px UI font, for sizing dropdowns to their longest option


def _positive(a) -> list:
    """Values for a log axis: non-positive or non-finite entries become gaps."""
    return [float(v) if np.isfinite(v) and v > 0 else None for v in np.abs(np.asarray(a, dtype=float))]


def _fit_width(labels, description_px: int) -> str:
    """A dropdown width that shows its longest option whole (description, text, the arrow and padding)."""
    longest = max((len(str(s)) for s in labels), default=10)
    return f"{int(description_px + _CHAR_PX * longest + 44)}px"


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


class _Slot(W.VBox):
    """An image, or in its place a box of the same size saying why there is nothing to draw."""

    def __init__(self, px: int, name: str, classes: tuple[str, ...]):
        self.image = W.Image(format="png", layout=W.Layout(width=f"{px}px", height=f"{px}px"))
        for c in classes:
            self.image.add_class(c)
        self.note = W.HTML(layout=W.Layout(width=f"{px}px", height=f"{px}px", display="none"))
        self.note.add_class("lab-rd-note")
        self.note.add_class(f"lab-rd-note-{name}")
        super().__init__([self.image, self.note])
        self.reason: str | None = "not run yet"
        self.empty("not run yet")

    def show(self, png: bytes) -> None:
        self.image.value = png
        self.image.layout.display = None
        self.note.layout.display = "none"
        self.reason = None

    def empty(self, reason: str) -> None:
        self.reason = reason
        self.note.value = ("<div style='box-sizing:border-box;height:100%;border:1px dashed #999;padding:6px;display:flex;"
                           "align-items:center;justify-content:center;text-align:center;font-size:11px;line-height:1.3;"
                           f"color:#555;overflow-wrap:anywhere'>{html.escape(reason)}</div>")
        self.note.layout.display = None
        self.image.layout.display = "none"


class RestorationDemo(W.VBox):
    """Interactive flow-matching restoration of one image (see the module docstring).

    Parameters
    ----------
    prior : str
        A prior of :func:`lab.generative.demo.available_priors` (``"gaussian-digits"``, ``"gaussian-mnist"``, ...).
    image : int
        Index of the test image shown first.
    task, method : str
        A task of :data:`~lab.generative.demo.TASK_CHOICES`, a method key of :data:`~lab.generative.demo.METHOD_CHOICES`.
    nfe : int
        20, 50 or 100.
    seed : int
    compare : str or None
        A second method key to restore the same measurement with, side by side (None: none).
    auto_run : bool
        Re-run whenever a control changes (default); else only on Run.
    wait : bool
        Wait for the first run before returning (default False: it runs in the background, and the view shows its progress).
    image_px : int
        Approximate on-screen size of each image (nearest-neighbour upscaling by an integer factor).
    n_test_images : int
        How many test images the picker and the example gallery list.

    Attributes
    ----------
    result : lab.generative.demo.DemoResult or None
        What the view shows (the first method's run).
    comparison : lab.generative.demo_compare.Comparison or None
        Both runs, when a second method is chosen.
    panels : dict
        ``name -> (Image, HTML metric label)`` for ``degraded``, ``restored``, ``truth``, ``bayes``; ``slots[name]``
        holds the image or, when it has nothing to draw, the note saying why (``slots[name].reason``).
    gallery, compare_picker, compare_slots, downloads : the example gallery, the compare view and the download links.
    step_slider, step_slots, chart, progress, progress_label, status : the trajectory controls and outputs.
    """

    def __init__(self, prior: str = "gaussian-digits", image: int = 0, task: str = "denoise", method: str = "rebridge",
                 nfe: int = 50, seed: int = 0, *, compare: str | None = None, auto_run: bool = True, wait: bool = False,
                 image_px: int = 168, n_test_images: int = 12):
        self.auto_run = auto_run
        self.image_px = int(image_px)
        self.n_test_images = int(n_test_images)
        self.result: D.DemoResult | None = None
        self.comparison: Comparison | None = None
        self._bundle = D.load_prior(prior)
        self._uploads: dict[str, np.ndarray] = {}
        self._job: D.BackgroundRun | None = None
        self._lock = threading.RLock()
        self._local = threading.local()  # per thread: how deep in _suspend() (see _Suspend)
        self._last_progress = (-1, 0.0)
        self._started = time.perf_counter()
        self._total = 0
        self._chart_base: dict = {}

        style = {"description_width": "80px"}
        priors = [(desc, name) for name, desc in D.available_priors().items()]
        self.prior_picker = W.Dropdown(options=priors, value=prior, description="prior", style=style,
                                       layout=W.Layout(width=_fit_width([d for d, _ in priors], 80)))
        self.image_picker = W.Dropdown(options=self._image_options(), value=("test", int(image)), description="image",
                                       style={"description_width": "45px"})
        self._fit(self.image_picker, 45)
        self.upload = W.FileUpload(accept="image/*", multiple=False, description="upload image", layout=W.Layout(width="160px"))
        self.invert_picker = W.Dropdown(options=[("auto", "auto"), ("no", False), ("yes", True)], value="auto",
                                        description="invert", style={"description_width": "45px"}, layout=W.Layout(width="130px"))
        self.gallery = ImageGallery(self._gallery_items(), thumb_px=44)
        self.gallery.add_class("lab-rd-gallery")
        self.task_picker = W.Dropdown(options=D.TASK_CHOICES, value=task, description="degradation", style=style,
                                      layout=W.Layout(width=_fit_width([lab for lab, _ in D.TASK_CHOICES], 80)))
        methods = [lab for lab, _ in D.METHOD_CHOICES]
        self.method_picker = W.Dropdown(options=D.METHOD_CHOICES, value=method, description="method", style=style,
                                        layout=W.Layout(width=_fit_width(methods, 80)))
        self.compare_picker = W.Dropdown(options=[("none", _NO_COMPARE), *D.METHOD_CHOICES], value=compare or _NO_COMPARE,
                                         description="compare with", style={"description_width": "90px"},
                                         layout=W.Layout(width=_fit_width(methods, 90)))
        self.nfe_picker = W.ToggleButtons(options=list(D.NFE_CHOICES), value=int(nfe),
                                          tooltips=[f"{n} prior evaluations" for n in D.NFE_CHOICES],
                                          style={"button_width": "48px"})
        self.seed_box = W.BoundedIntText(value=int(seed), min=0, max=2**31 - 1, description="seed",
                                         style={"description_width": "40px"}, layout=W.Layout(width="140px"))
        self.values_picker = W.ToggleButtons(options=[("paper values", "paper"), ("tuned values", "tuned")], value="paper",
                                             style={"button_width": "115px"},
                                             tooltips=["the method's published hyper-parameters",
                                                       "chosen on the validation split (lab.generative.tuning)"])
        self.hyper_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.hyper_widgets: dict[str, W.ValueWidget] = {}
        self.run_button = W.Button(description="Run", button_style="primary", icon="play", layout=W.Layout(width="90px"))
        self.progress = W.IntProgress(value=0, min=0, max=int(nfe), layout=W.Layout(width="220px"))
        self.progress_label = W.HTML()
        self.status = W.HTML(layout=W.Layout(flex="1 1 auto"))
        for w, cls in ((self.status, "lab-rd-status"), (self.method_picker, "lab-rd-method"), (self.task_picker, "lab-rd-task"),
                       (self.run_button, "lab-rd-run"), (self.progress, "lab-rd-progress"), (self.image_picker, "lab-rd-image-picker"),
                       (self.progress_label, "lab-rd-progress-label"), (self.compare_picker, "lab-rd-compare-picker"),
                       (self.nfe_picker, "lab-rd-nfe"), (self.prior_picker, "lab-rd-prior")):
            w.add_class(cls)

        px = self.image_px
        self.panels: dict[str, tuple[W.Image, W.HTML]] = {}
        self.slots: dict[str, _Slot] = {}
        cols = []
        for name, title in _PANELS:
            slot = _Slot(px, name, ("lab-rd-image", f"lab-rd-{name}"))
            label = W.HTML()
            label.add_class("lab-rd-metric")
            label.add_class(f"lab-rd-metric-{name}")
            self.slots[name] = slot
            self.panels[name] = (slot.image, label)
            cols.append(W.VBox([W.HTML(f"<b>{html.escape(title)}</b>"), slot, label],
                               layout=W.Layout(margin="0 10px 0 0", width=f"{px + 30}px")))
        self.panel_row = W.HBox(cols)
        self.downloads = W.HTML()
        self.downloads.add_class("lab-rd-downloads")

        self.compare_slots: dict[str, _Slot] = {}
        self.compare_labels: dict[str, W.HTML] = {}
        self.compare_heads: dict[str, W.HTML] = {}
        ccols = []
        for side in ("first", "second"):
            slot = _Slot(px, f"compare-{side}", ("lab-rd-compare-image", f"lab-rd-compare-{side}"))
            head, label = W.HTML(), W.HTML()
            head.add_class(f"lab-rd-compare-head-{side}")
            label.add_class("lab-rd-compare-metric")
            label.add_class(f"lab-rd-compare-metric-{side}")
            self.compare_slots[side], self.compare_labels[side], self.compare_heads[side] = slot, label, head
            ccols.append(W.VBox([head, slot, label], layout=W.Layout(margin="0 10px 0 0", width=f"{px + 90}px")))
        self.compare_summary = W.HTML()
        self.compare_summary.add_class("lab-rd-compare-summary")
        self.compare_box = W.VBox([W.HTML("<b>compare</b>: two methods on the same measurement"), W.HBox(ccols), self.compare_summary])
        self.compare_box.add_class("lab-rd-compare")

        self.step_slider = W.IntSlider(value=0, min=0, max=0, description="step", continuous_update=True,
                                       style={"description_width": "40px"}, layout=W.Layout(width="520px"))
        self.player = W.Play(value=0, min=0, max=0, interval=120, description="play the trajectory")
        W.jslink((self.player, "value"), (self.step_slider, "value"))
        W.jslink((self.player, "max"), (self.step_slider, "max"))
        self.step_slider.add_class("lab-rd-slider")
        self.step_label = W.HTML()
        self.step_label.add_class("lab-rd-step")
        self.step_slots: dict[str, _Slot] = {}
        step_cols = []
        small = max(64, int(px * 0.75))
        for name, title in _STEP_PANELS:
            slot = _Slot(small, name, ("lab-rd-step-image", f"lab-rd-step-{name}"))
            self.step_slots[name] = slot
            step_cols.append(W.VBox([W.HTML(f"<b>{html.escape(title)}</b>"), slot], layout=W.Layout(margin="0 8px 0 0")))
        self.chart = LiveChart(self._chart_figure(None, 0, {"terms": "not run yet", "mismatch": "not run yet"}))
        self.chart.add_class("lab-rd-chart")

        full = W.Layout(width="auto", flex_flow="row wrap")
        controls = W.VBox([
            W.HBox([self.prior_picker, self.image_picker, self.upload, self.invert_picker], layout=full),
            W.HBox([W.HTML("<b>examples</b>", layout=W.Layout(width="80px")), self.gallery], layout=full),
            W.HBox([self.task_picker, self.method_picker, self.compare_picker], layout=full),
            W.HBox([W.Label("NFE", layout=W.Layout(width="80px")), self.nfe_picker, self.values_picker, self.seed_box], layout=full),
            self.hyper_box,
            W.HBox([self.run_button, self.progress, self.progress_label, self.status], layout=full),
        ])
        trajectory = W.VBox([
            W.HTML("<b>trajectory</b>: scrub the steps (each step is one prior evaluation)"),
            W.HBox([self.player, self.step_slider, self.step_label]),
            W.HBox(step_cols),
            self.chart,
        ])
        super().__init__([controls, self.panel_row, self.downloads, self.compare_box, trajectory])
        self.add_class("lab-restoration-demo")

        self._rebuild_hyper()
        for w in (self.image_picker, self.invert_picker, self.seed_box, self.compare_picker):
            w.observe(self._on_change, "value")
        for w in (self.task_picker, self.method_picker, self.nfe_picker, self.values_picker):
            w.observe(self._on_method_change, "value")
        self.prior_picker.observe(self._on_prior_change, "value")
        self.upload.observe(self._on_upload, "value")
        self.gallery.observe(self._on_gallery, "selected")
        self.step_slider.observe(lambda ch: self._show_step(ch["new"]), "value")
        self.run_button.on_click(lambda _: self.run())
        self._sync_gallery()
        self._show_compare_off()
        self.run(wait=wait)

    # ------------------------------------------------------------------ public
    def run(self, wait: bool = False) -> D.DemoResult | None:
        """Run the current settings in a background thread (cancelling a run in flight); with
        ``wait`` block until the view shows the result and return it."""
        params = self._params()
        holder: list[D.BackgroundRun] = []
        with self._lock:
            job = D.BackgroundRun(lambda progress, cancel: self._compute(params, progress, cancel),
                                  progress=lambda done, total: self._on_progress(holder[0], done, total),
                                  on_done=lambda result: self._show_result(holder[0], result),
                                  on_error=lambda exc: self._show_error(holder[0], exc), after=self._job, start=False)
            holder.append(job)
            self._job = job
        what = D.method_label(params["method"]) + (f" and {D.method_label(params['compare'])}" if params["compare"] else "")
        self._set_status(f"running {html.escape(what)}…")
        if self.result is None:
            for slot in self.slots.values():
                slot.empty(f"running {what}…")
        job.start()
        if wait:
            return self.wait()
        return None

    def wait(self, timeout: float | None = 600) -> D.DemoResult | None:
        """Wait until the latest run has finished and been shown; returns :attr:`result`."""
        while True:
            with self._lock:
                job = self._job
            if job is None:
                return self.result
            job.wait(timeout)
            with self._lock:
                if job is self._job:
                    return self.result

    def add_upload(self, name: str, data: bytes) -> None:
        """Add an uploaded image (PNG/JPEG bytes) to the picker, select it and run."""
        try:
            arr = D.read_image_bytes(data)
        except D.ImageError as exc:
            self._set_status(f"{html.escape(name)}: {html.escape(str(exc))}", error=True)
            return
        self._uploads[name] = arr
        with self._suspend():
            self.image_picker.options = self._image_options()
            self._fit(self.image_picker, 45)
            self.image_picker.value = ("upload", name)
            self._sync_gallery()
        self._maybe_run(force=True)

    @property
    def step_images(self) -> dict[str, W.Image]:
        """``name -> Image`` of the step panels (``x``, ``a_hat``, ``b_hat``, ``b_bar``); ``step_slots[name].reason``
        says why one shows no image."""
        return {name: slot.image for name, slot in self.step_slots.items()}

    @property
    def hyper(self) -> dict:
        """The hyper-parameter fields' current values."""
        return {name: w.value for name, w in self.hyper_widgets.items()}

    # ------------------------------------------------------------------ controls
    def _image_options(self) -> list:
        n = min(self.n_test_images, self._bundle.test_images.shape[0])
        opts = [(self._bundle.test_names[i], ("test", i)) for i in range(n)]
        opts += [(f"upload: {name}", ("upload", name)) for name in self._uploads]
        return opts

    def _gallery_items(self) -> list[dict]:
        return D.gallery(self._bundle, self.n_test_images, size=44)

    @staticmethod
    def _fit(dropdown: W.Dropdown, description_px: int) -> None:
        dropdown.layout.width = _fit_width([lab for lab, _ in dropdown.options], description_px)

    def _sync_gallery(self) -> None:
        kind, ref = self.image_picker.value
        self.gallery.selected = int(ref) if kind == "test" else -1

    def _params(self) -> dict:
        return {"prior": self.prior_picker.value, "image": self.image_picker.value, "invert": self.invert_picker.value,
                "task": self.task_picker.value, "method": self.method_picker.value, "nfe": int(self.nfe_picker.value),
                "seed": int(self.seed_box.value), "hyper": dict(self.hyper), "values": self.values_picker.value,
                "compare": self.compare_picker.value}

    class _Suspend:
        """Silences the control observers for changes this thread makes (the view updating its own controls).
        Per thread: while the worker thread redraws, a change the user makes (handled in the kernel's main
        thread) must still run, not be dropped as if the view had made it."""

        def __init__(self, owner):
            self.owner = owner

        def __enter__(self):
            self.owner._local.depth = self.owner._suspended + 1

        def __exit__(self, *exc):
            self.owner._local.depth -= 1

    def _suspend(self):
        return self._Suspend(self)

    @property
    def _suspended(self) -> int:
        return getattr(self._local, "depth", 0)

    def _maybe_run(self, force: bool = False) -> None:
        if self._suspended:
            return
        if self.auto_run or force:
            self.run()

    def _on_change(self, change=None) -> None:
        if self._suspended:
            return
        with self._lock:  # after a result being drawn by the worker thread
            if change is not None and change["owner"] is self.image_picker:
                with self._suspend():
                    self._sync_gallery()
            self._maybe_run()

    def _on_gallery(self, change) -> None:
        i = change["new"]
        if self._suspended or i < 0 or ("test", i) not in [v for _, v in self.image_picker.options]:
            return
        self.image_picker.value = ("test", i)  # -> _on_change -> run

    def _on_method_change(self, _change=None) -> None:
        if self._suspended:
            return
        with self._lock:
            self._rebuild_hyper()
            self._maybe_run()

    def _on_prior_change(self, change) -> None:
        if self._suspended:
            return
        # the prior loads in the background run (a Gaussian fit can take seconds); the image
        # picker, the gallery and the hyper-parameter fields follow when its result arrives
        self._set_status(f"loading prior {html.escape(change['new'])}…" if self.auto_run
                         else f"prior {html.escape(change['new'])}: press Run to load it")
        self._maybe_run()

    def _on_upload(self, change) -> None:
        for f in change["new"] or ():
            content = f["content"]
            self.add_upload(f.get("name", "upload"), bytes(content.tobytes() if hasattr(content, "tobytes") else content))

    def _rebuild_hyper(self) -> None:
        key, task, nfe = self.method_picker.value, self.task_picker.value, int(self.nfe_picker.value)
        source = D.hyper_source(key, task, self._bundle, nfe, self.values_picker.value)
        note = "no tuned values for this prior / task / method: paper values shown" if source != self.values_picker.value else ""
        fields = D.hyper_fields(key, task, self._bundle, nfe, source)
        widgets = {}
        for f in fields:
            common = dict(description=f.label, style={"description_width": "initial"}, layout=W.Layout(width="190px"),
                          tooltip=f.help or f.name)
            if f.kind == "choice":
                w = W.Dropdown(options=list(f.choices), value=f.value, **common)
            elif f.kind == "int":
                w = W.IntText(value=int(f.value), **common)
            else:
                w = W.FloatText(value=float(f.value), **common)
            w.add_class(f"lab-rd-hyper-{f.name}")
            w.observe(self._on_change, "value")
            widgets[f.name] = w
        self.hyper_widgets = widgets
        children = list(widgets.values()) or [W.HTML("<i>no hyper-parameters</i>")]
        if note:
            children.append(W.HTML(f"<i>{html.escape(note)}</i>"))
        self.hyper_box.children = children

    # ------------------------------------------------------------------ the work (background thread)
    def _compute(self, params, progress, cancel) -> D.DemoResult | Comparison:
        bundle = D.load_prior(params["prior"])
        hyper = params["hyper"]
        if bundle is not self._bundle:  # a new prior: its own defaults (tuned values exist for some priors only)
            source = D.hyper_source(params["method"], params["task"], bundle, params["nfe"], params["values"])
            hyper = D.default_hyper(params["method"], params["task"], bundle, params["nfe"], source)
        kind, ref = params["image"]
        if kind == "test":
            image = int(ref) if int(ref) < bundle.test_images.shape[0] else 0
            label = bundle.test_names[image]
        else:
            image, label = self._uploads[ref], f"upload: {ref}"

        def session(method, values):
            return D.RestorationSession(bundle, image=image, task=params["task"], method=method, nfe=params["nfe"],
                                        hyper=values, seed=params["seed"], invert=params["invert"])

        first = session(params["method"], hyper)
        if params["compare"]:
            key = params["compare"]
            source = D.hyper_source(key, params["task"], bundle, params["nfe"], params["values"])
            second = session(key, D.default_hyper(key, params["task"], bundle, params["nfe"], source))
            out = run_comparison(first, second, progress=progress, cancel=cancel)
            for r in (out.first, out.second):
                r.image_info["label"] = label
            return out
        result = first.run(progress=progress, cancel=cancel)
        result.image_info["label"] = label
        return result

    def _on_progress(self, job, done: int, total: int) -> None:
        if job is not self._job:
            return
        now = time.perf_counter()
        if done == 0:
            self._started, self._total = now, int(total)
        last_done, last_t = self._last_progress
        # at most about 25 updates a run, and at least one every 0.25 s
        if done in (0, total) or done < last_done or done - last_done >= max(1, total // 25) or now - last_t >= 0.25:
            self._last_progress = (done, now)
            self.progress.max = max(1, total)
            self.progress.value = done if total else 1
            self.progress.bar_style = ""
            self.progress_label.value = f"<span>{html.escape(D.progress_text(done, total, now - self._started))}</span>"

    # ------------------------------------------------------------------ the view
    def _set_status(self, text: str, error: bool = False) -> None:
        colour = "#d62728" if error else "#444"
        self.status.value = f"<span style='color:{colour}'>{text}</span>"

    def _show_error(self, job, exc) -> None:
        with self._lock:
            if job is not self._job:
                return
            self.progress.bar_style = "danger"
            done = self._last_progress[0]
            self.progress_label.value = f"<span>stopped at {max(0, done)}/{self.progress.max} NFE</span>"
            self._set_status(f"{type(exc).__name__}: {html.escape(str(exc))}"
                             + (" <small>(the view keeps the last result)</small>" if self.result is not None else ""), error=True)
            if self.result is None:
                for slot in self.slots.values():
                    slot.empty(f"no result: {type(exc).__name__}: {exc}")

    def _show_result(self, job, out: D.DemoResult | Comparison) -> None:
        with self._lock:
            if job is not self._job:
                return
            comparison = out if isinstance(out, Comparison) else None
            r = comparison.first if comparison is not None else out
            if r.prior != self._bundle.name:  # the prior changed: its test images, gallery and hyper-parameter fields
                self._bundle = D.load_prior(r.prior)
                with self._suspend():
                    old = self.image_picker.value
                    self.image_picker.options = self._image_options()
                    self._fit(self.image_picker, 45)
                    self.image_picker.value = old if old in [v for _, v in self.image_picker.options] else ("test", 0)
                    self.gallery.set_items(self._gallery_items())
                    self._sync_gallery()
                    self._rebuild_hyper()
            self.result, self.comparison = r, comparison
            self.progress.bar_style = "success"
            total = self._total
            self.progress_label.value = f"<span>done: {html.escape(D.progress_text(total, total, time.perf_counter() - self._started))}</span>"
            reasons = D.empty_reasons(r)
            px = self.image_px
            images = {"degraded": (r.degraded, r.observed if r.degraded_kind == "y" else None), "restored": (r.restored, None),
                      "truth": (r.truth, None), "bayes": (r.bayes, None)}
            for name, (_, label) in self.panels.items():
                arr, mask = images[name]
                if arr is None:
                    self.slots[name].empty(reasons[name])
                    label.value = ""
                    continue
                self.slots[name].show(D.image_png(arr, size=px, mask=mask))
                if name == "truth":
                    info = r.image_info
                    extra = " (inverted)" if info.get("inverted") else ""
                    label.value = f"<span>{html.escape(str(info.get('label', info.get('name', ''))))}{extra}</span>"
                else:
                    label.value = self._metric_html(r.metrics[name], {"degraded": html.escape(r.degraded_kind), "restored": "",
                                                                      "bayes": "E[x | y], exact"}[name])
            self._show_downloads(r, comparison)
            if comparison is None:
                self._show_compare_off()
            else:
                self._show_compare(comparison)
            hyper = ", ".join(f"{k}={v}" for k, v in r.hyper.items()) or "none"
            self._set_status(f"{html.escape(D.method_label(r.method_key))}: {r.nfe} NFE in {r.seconds:.2f} s "
                             f"<small>({html.escape(hyper)})</small>")
            self._show_trajectory(r.trajectory, reasons)

    @staticmethod
    def _metric_html(m: dict, note: str = "") -> str:
        extra = f"<br><small>{note}</small>" if note else ""
        return f"<span>PSNR <b>{m['psnr']:.2f} dB</b> · SSIM <b>{m['ssim']:.3f}</b>{extra}</span>"

    def _show_downloads(self, r: D.DemoResult, comparison: Comparison | None) -> None:
        h, w = r.restored.shape[-2:]
        links = [(r.download_name("restored"), r.png("restored"), f"download restored PNG ({h}×{w}, as computed)", "restored")]
        if comparison is not None:
            links.append((comparison.download_name(), comparison.png(size=96), "download comparison PNG (truth, degraded, both methods)",
                          "compare"))
        self.downloads.value = " ".join(
            f"<a class='jupyter-button lab-rd-download lab-rd-download-{cls}' style='display:inline-block;padding:0 10px;"
            f"margin-right:8px;text-decoration:none;color:inherit' download='{html.escape(name)}' href='{_data_url(png)}'>"
            f"⬇ {html.escape(text)}</a>" for name, png, text, cls in links)

    def _show_compare_off(self) -> None:
        for side, slot in self.compare_slots.items():
            slot.empty("pick a second method in 'compare with' to restore the same measurement with it, side by side")
            self.compare_heads[side].value = "<b>first method</b>" if side == "first" else "<b>second method</b>"
            self.compare_labels[side].value = ""
        self.compare_summary.value = "<i>no comparison: 'compare with' is none</i>"

    def _show_compare(self, c: Comparison) -> None:
        for side, res in (("first", c.first), ("second", c.second)):
            self.compare_heads[side].value = f"<b>{html.escape(D.method_label(res.method_key))}</b>"
            self.compare_slots[side].show(D.image_png(res.restored, size=self.image_px))
            hyper = ", ".join(f"{k}={v}" for k, v in res.hyper.items()) or "no hyper-parameters"
            self.compare_labels[side].value = self._metric_html(res.metrics["restored"], f"{res.nfe} NFE · {html.escape(hyper)}")
        a, b = D.method_label(c.first.method_key), D.method_label(c.second.method_key)
        self.compare_summary.value = (f"<span>{html.escape(b)} − {html.escape(a)}: <b>{c.psnr_gain:+.2f} dB</b> PSNR, "
                                      f"<b>{c.ssim_gain:+.3f}</b> SSIM on the same y (seed {c.first.seed})</span>")

    def _chart_figure(self, traj: D.Trajectory | None, step: int, reasons: dict) -> dict:
        """The chart as plotly JSON: defect terms (left) and measurement mismatch (right) per step, a marker at
        ``step``; a subplot with no series says why in its middle (``reasons``) and draws no axes."""
        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                            subplot_titles=("defect terms at the step's endpoints", "measurement mismatch on observed pixels (RMS)"))
        ranges: dict[int, list[float]] = {1: [], 2: []}
        if traj is not None:
            steps = list(range(traj.steps))
            for col, series, traces, group in ((1, traj.terms, _TERM_TRACES, "terms"), (2, traj.mismatch, _MISMATCH_TRACES, "mismatch")):
                for key, name, colour in traces:
                    if key in series:
                        y = _positive(series[key])
                        ranges[col] += [v for v in y if v is not None]
                        fig.add_scatter(x=steps, y=y, mode="lines", name=name, legendgroup=group,
                                        line=dict(color=colour, width=1.5), row=1, col=col)
            if traj.sigma_y > 0 and traj.mismatch:
                ranges[2].append(traj.sigma_y)
                fig.add_scatter(x=[0, traj.steps - 1], y=[traj.sigma_y] * 2, mode="lines", name="sigma_y", legendgroup="mismatch",
                                line=dict(color="#7f7f7f", dash="dash", width=1), row=1, col=2)
        for col, key in ((1, "terms"), (2, "mismatch")):
            suffix = "" if col == 1 else "2"
            if key in reasons:
                # in paper coordinates: plotly.js draws nothing referenced to a hidden axis
                x0, x1 = fig.layout[f"xaxis{suffix}"].domain
                fig.add_annotation(text="<br>".join(textwrap.wrap(reasons[key], 48)), showarrow=False, xref="paper",
                                   yref="paper", x=(x0 + x1) / 2, y=0.5, xanchor="center", yanchor="middle",
                                   font=dict(size=12, color="#555"),
                                   bgcolor="#f4f4f4", bordercolor="#999", borderpad=6)
                fig.update_xaxes(visible=False, row=1, col=col)
                fig.update_yaxes(visible=False, row=1, col=col)
                continue
            fig.add_vline(x=step, line=dict(color="black", width=1, dash="dot"), row=1, col=col)
            fig.update_yaxes(type="log", exponentformat="e", row=1, col=col)
            if ranges[col]:  # at most 8 decades below the largest value (a term that is exactly 0 at t = 0 would stretch it)
                hi = max(ranges[col])
                lo = max(min(ranges[col]), hi * 1e-8)
                fig.update_yaxes(range=[np.log10(lo) - 0.2, np.log10(hi) + 0.2], row=1, col=col)
            fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_layout(height=340, width=960, margin=dict(l=50, r=10, t=40, b=40), legend=dict(font=dict(size=10)),
                          plot_bgcolor="#e5ecf6")
        return json.loads(fig.to_json())

    def _show_trajectory(self, traj: D.Trajectory | None, reasons: dict) -> None:
        last = max(0, (traj.steps if traj else 1) - 1)
        self._chart_base = self._chart_figure(traj, last, reasons)
        self.chart.figure = self._chart_base
        with self._suspend():
            self.step_slider.max = last
            self.player.max = last
            self.step_slider.disabled = traj is None
            # the play button is jslinked to the slider: a view rendering later copies the player's value onto the
            # slider, so both hold the step
            self.player.value = last
            self.step_slider.value = last
        self._show_step(self.step_slider.value)

    def _show_step(self, k: int) -> None:
        with self._lock:  # a result may be arriving from the worker thread
            self._draw_step(k)

    def _draw_step(self, k: int) -> None:
        r = self.result
        traj = r.trajectory if r is not None else None
        reasons = D.empty_reasons(r) if r is not None else {}
        if traj is None:
            for name, slot in self.step_slots.items():
                slot.empty(reasons.get(name, "not run yet"))
            self.step_label.value = f"<i>{html.escape(reasons.get('x', 'not run yet'))}</i>"
            return
        k = min(int(k), traj.steps - 1)
        at = traj.at(k)
        size = max(64, int(self.image_px * 0.75))
        for name, slot in self.step_slots.items():
            if name in at:
                slot.show(D.image_png(at[name], size=size))
            else:
                slot.empty(reasons.get(name, f"no {name} at this step"))
        parts = [f"step {k}", f"t = {at['t']:.3f}"]
        for key, label in (("mismatch_hat", "mismatch b_hat"), ("mismatch_bar", "mismatch b_bar"), ("measurement_defect", "meas. defect"),
                           ("bridge_residual", "bridge residual"), ("defect", "total defect")):
            if key in at:
                parts.append(f"{label} {at[key]:.4g}")
        src = "" if traj.source == "method" else " <small>(prior queries: this method keeps no per-step record)</small>"
        self.step_label.value = "<span>" + " · ".join(parts) + src + "</span>"
        base = self._chart_base
        if base.get("layout", {}).get("shapes"):
            shapes = [{**s, "x0": k, "x1": k} for s in base["layout"]["shapes"]]
            self.chart.figure = {"data": base["data"], "layout": {**base["layout"], "shapes": shapes}}
