"""Restoration demo: pick an image, a degradation, a method, NFE and hyper-parameters; see and scrub the result.

A thin view over :class:`lab.generative.demo.RestorationSession`. Controls: the prior, the image
(held-out test images of the prior's data set, or the user's own PNG/JPEG through the upload
button), the degradation, the method (every method of :mod:`lab.generative.restore`, ReBridge-Flow
once per reading, and the lab's re-coupled ADMM variant), NFE (20/50/100), the method's
hyper-parameters (paper or validation-tuned values, editable) and a Run button. Outputs: degraded,
restored, ground truth and Bayes ceiling side by side with PSNR/SSIM; a step slider (with a play
button) scrubbing the trajectory's ``x``, ``a_hat``, ``b_hat`` and ``b_bar``, and one plotly figure
of the defect terms and the measurement mismatch on observed pixels per step, with a marker at the
current step.

Every run happens in a background thread (:class:`lab.generative.demo.BackgroundRun`) with a
progress bar, so the kernel stays responsive; a new run (any control change, or Run) cancels the
one in flight. ``run(wait=True)`` / :meth:`RestorationDemo.wait` block until the view is updated
(for tests and scripts). Images are PNG bytes (PIL) in ``ipywidgets.Image``, upscaled with nearest
neighbour.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.generative import demo as D

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
_BLANK = D.image_png(np.zeros((8, 8)), size=8)


def _positive(a) -> list:
    """Values for a log axis: non-positive or non-finite entries become gaps."""
    return [float(v) if np.isfinite(v) and v > 0 else None for v in np.abs(np.asarray(a, dtype=float))]


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
    auto_run : bool
        Re-run whenever a control changes (default); else only on Run.
    image_px : int
        Approximate on-screen size of each image (nearest-neighbour upscaling by an integer factor).
    n_test_images : int
        How many test images the picker lists.

    Attributes
    ----------
    result : lab.generative.demo.DemoResult or None
        What the view shows.
    panels : dict
        ``name -> (Image, HTML metric label)`` for ``degraded``, ``restored``, ``truth``, ``bayes``.
    step_slider, step_images, figure, progress, status : the trajectory controls and outputs.
    """

    def __init__(self, prior: str = "gaussian-digits", image: int = 0, task: str = "denoise", method: str = "rebridge",
                 nfe: int = 50, seed: int = 0, *, auto_run: bool = True, image_px: int = 168, n_test_images: int = 12):
        self.auto_run = auto_run
        self.image_px = int(image_px)
        self.n_test_images = int(n_test_images)
        self.result: D.DemoResult | None = None
        self._bundle = D.load_prior(prior)
        self._uploads: dict[str, np.ndarray] = {}
        self._job: D.BackgroundRun | None = None
        self._lock = threading.RLock()
        self._suspended = 0
        self._last_progress = -1

        full = W.Layout(width="auto")
        style = {"description_width": "80px"}
        self.prior_picker = W.Dropdown(options=[(desc, name) for name, desc in D.available_priors().items()], value=prior,
                                       description="prior", style=style, layout=W.Layout(width="380px"))
        self.image_picker = W.Dropdown(options=self._image_options(), value=("test", int(image)), description="image",
                                       style=style, layout=W.Layout(width="300px"))
        self.upload = W.FileUpload(accept="image/*", multiple=False, description="upload image", layout=W.Layout(width="150px"))
        self.invert_picker = W.Dropdown(options=[("auto", "auto"), ("no", False), ("yes", True)], value="auto",
                                        description="invert", style={"description_width": "45px"}, layout=W.Layout(width="130px"))
        self.task_picker = W.Dropdown(options=D.TASK_CHOICES, value=task, description="degradation", style=style,
                                      layout=W.Layout(width="380px"))
        self.method_picker = W.Dropdown(options=D.METHOD_CHOICES, value=method, description="method", style=style,
                                        layout=W.Layout(width="330px"))
        self.nfe_picker = W.ToggleButtons(options=list(D.NFE_CHOICES), value=int(nfe), description="NFE",
                                          style={"description_width": "40px", "button_width": "48px"})
        self.seed_box = W.BoundedIntText(value=int(seed), min=0, max=2**31 - 1, description="seed",
                                         style={"description_width": "40px"}, layout=W.Layout(width="130px"))
        self.values_picker = W.ToggleButtons(options=[("paper values", "paper"), ("tuned values", "tuned")], value="paper",
                                             style={"button_width": "115px"},
                                             tooltips=["the method's published hyper-parameters",
                                                       "chosen on the validation split (lab.generative.tuning)"])
        self.hyper_box = W.HBox(layout=W.Layout(flex_flow="row wrap"))
        self.hyper_widgets: dict[str, W.ValueWidget] = {}
        self.run_button = W.Button(description="Run", button_style="primary", icon="play", layout=W.Layout(width="90px"))
        self.progress = W.IntProgress(value=0, min=0, max=int(nfe), description="NFE 0/" + str(nfe),
                                      style={"description_width": "80px"}, layout=W.Layout(width="330px"))
        self.status = W.HTML()
        for w, cls in ((self.status, "lab-rd-status"), (self.method_picker, "lab-rd-method"), (self.task_picker, "lab-rd-task"),
                       (self.run_button, "lab-rd-run"), (self.progress, "lab-rd-progress"), (self.image_picker, "lab-rd-image-picker")):
            w.add_class(cls)

        self.panels: dict[str, tuple[W.Image, W.HTML]] = {}
        cols = []
        for name, title in _PANELS:
            img = W.Image(value=_BLANK, format="png", layout=W.Layout(width=f"{self.image_px}px", height=f"{self.image_px}px"))
            img.add_class("lab-rd-image")
            img.add_class(f"lab-rd-{name}")
            label = W.HTML()
            label.add_class("lab-rd-metric")
            label.add_class(f"lab-rd-metric-{name}")
            head = W.HTML(f"<b>{html.escape(title)}</b>")
            self.panels[name] = (img, label)
            cols.append(W.VBox([head, img, label], layout=W.Layout(margin="0 10px 0 0", width=f"{self.image_px + 30}px")))
        self.panel_row = W.HBox(cols)

        self.step_slider = W.IntSlider(value=0, min=0, max=0, description="step", continuous_update=True,
                                       style={"description_width": "40px"}, layout=W.Layout(width="520px"))
        self.player = W.Play(value=0, min=0, max=0, interval=120, description="play the trajectory")
        W.jslink((self.player, "value"), (self.step_slider, "value"))
        W.jslink((self.player, "max"), (self.step_slider, "max"))
        self.step_slider.add_class("lab-rd-slider")
        self.step_label = W.HTML()
        self.step_label.add_class("lab-rd-step")
        self.step_images: dict[str, W.Image] = {}
        step_cols = []
        small = max(64, int(self.image_px * 0.75))
        for name, title in _STEP_PANELS:
            img = W.Image(value=_BLANK, format="png", layout=W.Layout(width=f"{small}px", height=f"{small}px"))
            img.add_class("lab-rd-step-image")
            self.step_images[name] = img
            step_cols.append(W.VBox([W.HTML(f"<b>{html.escape(title)}</b>"), img], layout=W.Layout(margin="0 8px 0 0")))
        self.figure = self._make_figure()
        self.chart_box = W.Box([self.figure])

        controls = W.VBox([
            W.HBox([self.prior_picker, self.image_picker, self.upload, self.invert_picker], layout=full),
            W.HBox([self.task_picker, self.method_picker, self.seed_box], layout=full),
            W.HBox([self.nfe_picker, self.values_picker], layout=full),
            self.hyper_box,
            W.HBox([self.run_button, self.progress, self.status], layout=full),
        ])
        trajectory = W.VBox([
            W.HTML("<b>trajectory</b>: scrub the steps (each step is one prior evaluation)"),
            W.HBox([self.player, self.step_slider, self.step_label]),
            W.HBox(step_cols),
            self.chart_box,
        ])
        super().__init__([controls, self.panel_row, trajectory])
        self.add_class("lab-restoration-demo")

        self._rebuild_hyper()
        for w in (self.image_picker, self.invert_picker, self.seed_box):
            w.observe(self._on_change, "value")
        for w in (self.task_picker, self.method_picker, self.nfe_picker, self.values_picker):
            w.observe(self._on_method_change, "value")
        self.prior_picker.observe(self._on_prior_change, "value")
        self.upload.observe(self._on_upload, "value")
        self.step_slider.observe(lambda ch: self._show_step(ch["new"]), "value")
        self.run_button.on_click(lambda _: self.run())
        self.run(wait=True)

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
        self._set_status(f"running {html.escape(D.method_label(params['method']))}…")
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
            self.image_picker.value = ("upload", name)
        self._maybe_run(force=True)

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

    def _params(self) -> dict:
        return {"prior": self.prior_picker.value, "image": self.image_picker.value, "invert": self.invert_picker.value,
                "task": self.task_picker.value, "method": self.method_picker.value, "nfe": int(self.nfe_picker.value),
                "seed": int(self.seed_box.value), "hyper": dict(self.hyper), "values": self.values_picker.value}

    class _Suspend:
        def __init__(self, owner):
            self.owner = owner

        def __enter__(self):
            self.owner._suspended += 1

        def __exit__(self, *exc):
            self.owner._suspended -= 1

    def _suspend(self):
        return self._Suspend(self)

    def _maybe_run(self, force: bool = False) -> None:
        if self._suspended:
            return
        if self.auto_run or force:
            self.run()

    def _on_change(self, _change=None) -> None:
        self._maybe_run()

    def _on_method_change(self, _change=None) -> None:
        if self._suspended:
            return
        self._rebuild_hyper()
        self._maybe_run()

    def _on_prior_change(self, change) -> None:
        if self._suspended:
            return
        # the prior loads in the background run (a Gaussian fit can take seconds); the image
        # picker and the hyper-parameter fields follow when its result arrives
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
    def _compute(self, params, progress, cancel) -> D.DemoResult:
        bundle = D.load_prior(params["prior"])
        hyper = params["hyper"]
        if bundle is not self._bundle:  # a new prior: its own defaults (tuned values exist for some priors only)
            source = D.hyper_source(params["method"], params["task"], bundle, params["nfe"], params["values"])
            hyper = D.default_hyper(params["method"], params["task"], bundle, params["nfe"], source)
        kind, ref = params["image"]
        if kind == "test":
            image = int(ref) if int(ref) < bundle.test_images.shape[0] else 0
        else:
            image = self._uploads[ref]
        session = D.RestorationSession(bundle, image=image, task=params["task"], method=params["method"], nfe=params["nfe"],
                                       hyper=hyper, seed=params["seed"], invert=params["invert"])
        result = session.run(progress=progress, cancel=cancel)
        if kind == "test":
            result.image_info["label"] = bundle.test_names[image]
        else:
            result.image_info["label"] = f"upload: {ref}"
        return result

    def _on_progress(self, job, done: int, total: int) -> None:
        if job is not self._job:
            return
        step = max(1, total // 25) if total else 1
        if done in (0, total) or done - self._last_progress >= step:
            self._last_progress = done
            self.progress.max = max(1, total)
            self.progress.value = done if total else 1
            self.progress.description = f"NFE {done}/{total}"

    # ------------------------------------------------------------------ the view
    def _set_status(self, text: str, error: bool = False) -> None:
        colour = "#d62728" if error else "#444"
        self.status.value = f"<span style='color:{colour}'>{text}</span>"

    def _show_error(self, job, exc) -> None:
        with self._lock:
            if job is not self._job:
                return
            self._set_status(f"{type(exc).__name__}: {html.escape(str(exc))}", error=True)

    def _show_result(self, job, r: D.DemoResult) -> None:
        with self._lock:
            if job is not self._job:
                return
            if r.prior != self._bundle.name:  # the prior changed: its test images and hyper-parameter fields
                self._bundle = D.load_prior(r.prior)
                with self._suspend():
                    old = self.image_picker.value
                    self.image_picker.options = self._image_options()
                    self.image_picker.value = old if old in [v for _, v in self.image_picker.options] else ("test", 0)
                    self._rebuild_hyper()
            self.result = r
            px = self.image_px
            images = {"degraded": (r.degraded, r.observed if r.degraded_kind == "y" else None), "restored": (r.restored, None),
                      "truth": (r.truth, None), "bayes": (r.bayes, None)}
            for name, (img, label) in self.panels.items():
                arr, mask = images[name]
                if arr is None:
                    img.value = _BLANK
                    label.value = "<span class='lab-rd-na'>no exact posterior for this prior</span>"
                    continue
                img.value = D.image_png(arr, size=px, mask=mask)
                if name == "truth":
                    info = r.image_info
                    extra = " (inverted)" if info.get("inverted") else ""
                    label.value = f"<span>{html.escape(str(info.get('label', info.get('name', ''))))}{extra}</span>"
                else:
                    m = r.metrics[name]
                    what = {"degraded": f"<br><small>{html.escape(r.degraded_kind)}</small>", "restored": "",
                            "bayes": "<br><small>E[x | y], exact</small>"}[name]
                    label.value = f"<span>PSNR <b>{m['psnr']:.2f} dB</b> · SSIM <b>{m['ssim']:.3f}</b>{what}</span>"
            hyper = ", ".join(f"{k}={v}" for k, v in r.hyper.items()) or "none"
            self._set_status(f"{html.escape(D.method_label(r.method_key))}: {r.nfe} NFE in {r.seconds:.2f} s "
                             f"<small>({html.escape(hyper)})</small>")
            self._show_trajectory(r.trajectory)

    @staticmethod
    def _make_figure(traj: D.Trajectory | None = None, step: int = 0) -> go.FigureWidget:
        """A new figure holding the trajectory's series (built with its data: a FigureWidget shown later
        starts from its constructor's state, so in-place edits made before it is displayed would be lost)."""
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
            if traj.sigma_y > 0:
                ranges[2].append(traj.sigma_y)
                fig.add_scatter(x=[0, traj.steps - 1], y=[traj.sigma_y] * 2, mode="lines", name="sigma_y", legendgroup="mismatch",
                                line=dict(color="#7f7f7f", dash="dash", width=1), row=1, col=2)
            if not traj.terms:
                fig.add_annotation(text="no defect terms: this method keeps no per-step record", showarrow=False,
                                   xref="x domain", yref="y domain", x=0.5, y=0.5)
        else:
            for col in (1, 2):
                fig.add_annotation(text="no steps (the Bayes mean is computed in closed form)", showarrow=False,
                                   xref=f"x{'' if col == 1 else 2} domain", yref=f"y{'' if col == 1 else 2} domain", x=0.5, y=0.5)
        for col in (1, 2):
            fig.add_vline(x=step, line=dict(color="black", width=1, dash="dot"), row=1, col=col)
            fig.update_yaxes(type="log", exponentformat="e", row=1, col=col)
            if ranges[col]:  # at most 8 decades below the largest value (a term that is exactly 0 at t = 0 would stretch it)
                hi = max(ranges[col])
                lo = max(min(ranges[col]), hi * 1e-8)
                fig.update_yaxes(range=[np.log10(lo) - 0.2, np.log10(hi) + 0.2], row=1, col=col)
            fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_layout(height=340, width=960, margin=dict(l=50, r=10, t=40, b=40), legend=dict(font=dict(size=10)))
        return go.FigureWidget(fig)

    def _show_trajectory(self, traj: D.Trajectory | None) -> None:
        last = max(0, (traj.steps if traj else 1) - 1)
        old, self.figure = self.figure, self._make_figure(traj, last)
        self.chart_box.children = (self.figure,)
        old.close()
        with self._suspend():
            self.step_slider.max = last
            self.player.max = last
            self.step_slider.disabled = traj is None
            self.step_slider.value = last
        self._show_step(self.step_slider.value)

    def _show_step(self, k: int) -> None:
        with self._lock:  # a result may be arriving from the worker thread
            self._draw_step(k)

    def _draw_step(self, k: int) -> None:
        r = self.result
        traj = r.trajectory if r is not None else None
        if traj is None:
            for img in self.step_images.values():
                img.value = _BLANK
            self.step_label.value = "<i>no per-step record (the Bayes mean needs no steps)</i>"
            return
        k = min(int(k), traj.steps - 1)
        at = traj.at(k)
        size = max(64, int(self.image_px * 0.75))
        for name, img in self.step_images.items():
            img.value = D.image_png(at[name], size=size) if name in at else _BLANK
        parts = [f"step {k}", f"t = {at['t']:.3f}"]
        for key, label in (("mismatch_hat", "mismatch b_hat"), ("mismatch_bar", "mismatch b_bar"), ("measurement_defect", "meas. defect"),
                           ("bridge_residual", "bridge residual"), ("defect", "total defect")):
            if key in at:
                parts.append(f"{label} {at[key]:.4g}")
        src = "" if traj.source == "method" else " <small>(prior queries: this method keeps no per-step record)</small>"
        self.step_label.value = "<span>" + " · ".join(parts) + src + "</span>"
        with self.figure.batch_update():
            for shape in self.figure.layout.shapes:
                shape.x0 = shape.x1 = k
