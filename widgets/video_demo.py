"""Video demo: ConFiner's chain of experts against each expert alone and a real held-out clip.

A thin view over :class:`lab.generative.video.demo.VideoSession`. Controls: the refinement mode
(coordinated, spatial only, temporal only, naive alternation), control and refinement steps, T_e,
the noise seed, and Run. Outputs: five looping animated GIFs side by side (ConFiner, the control /
spatial / temporal experts alone at their full step counts on the same noise, a real held-out clip),
a frame scrubber with a play button that shows frame k of every video as a still, a progress bar
with the current stage, and a metrics table (subject consistency, motion smoothness, PSNR to the
nearest held-out frame, NFE, seconds).

The run happens in a background thread; each finished video is drawn as soon as it is ready and the
ConFiner panel shows the current clean-sample estimate while it runs, so the kernel never freezes.
A control change cancels the run in flight and starts a new one; ``wait()`` blocks until it ends.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as W

from lab.generative.video import confiner as cf
from lab.generative.video import demo as D

__all__ = ["VideoDemo"]

_TITLES = {"confiner": "ConFiner", "control": "control expert alone (8 steps)", "spatial": "spatial expert alone (100)",
           "temporal": "temporal expert alone (100)", "real": "real held-out clip"}
_MODES = [("coordinated (Eqs. 8-11)", "coordinated"), ("spatial only", "spatial_only"), ("temporal only", "temporal_only"),
          ("naive alternation (Eq. 7)", "naive_alternation")]
PX = 128


class VideoDemo(W.VBox):
    """Generate a short video with ConFiner and compare it, in the browser.

    Parameters
    ----------
    mode, control_steps, refine_steps, t_e, seed :
        Initial settings (see :class:`lab.generative.video.demo.VideoSession`).
    wait : bool
        Block until the first run has finished.
    """

    def __init__(self, mode: str = "coordinated", control_steps: int = 4, refine_steps: int = 5, t_e: int = 100,
                 seed: int = 0, wait: bool = False):
        self.session = D.VideoSession(mode, control_steps, refine_steps, t_e, seed)
        self._lock = threading.Lock()
        self.mode = W.Dropdown(options=_MODES, value=mode, description="refinement", style={"description_width": "80px"},
                               layout=W.Layout(width="300px"))
        self.control_steps = W.BoundedIntText(value=control_steps, min=1, max=16, description="control steps",
                                              style={"description_width": "90px"}, layout=W.Layout(width="160px"))
        self.refine_steps = W.BoundedIntText(value=refine_steps, min=1, max=20, description="refine steps",
                                             style={"description_width": "90px"}, layout=W.Layout(width="160px"))
        self.t_e = W.BoundedIntText(value=t_e, min=1, max=1000, description="T_e", style={"description_width": "40px"},
                                    layout=W.Layout(width="120px"))
        self.seed = W.BoundedIntText(value=seed, min=0, max=10_000, description="seed", style={"description_width": "40px"},
                                     layout=W.Layout(width="120px"))
        self.run_button = W.Button(description="Run", button_style="primary", layout=W.Layout(width="80px"))
        self.progress = W.IntProgress(min=0, max=1, value=0, layout=W.Layout(width="300px"))
        self.progress_label = W.HTML("", layout=W.Layout(width="420px"))
        self.progress_label.add_class("lab-vd-progress-label")
        self.images, self.stills, cols = {}, {}, []
        for name in D.VIDEO_NAMES:
            img = W.Image(format="gif", width=PX, height=PX)
            img.add_class("lab-vd-video")
            img.add_class(f"lab-vd-video-{name}")
            still = W.Image(format="png", width=PX, height=PX)
            still.add_class("lab-vd-still")
            still.add_class(f"lab-vd-still-{name}")
            self.images[name], self.stills[name] = img, still
            head = W.HTML(f"<b>{html.escape(_TITLES[name])}</b>", layout=W.Layout(width=f"{PX + 30}px", height="44px"))
            cols.append(W.VBox([head, img, still]))
        self.frame = W.IntSlider(value=0, min=0, max=D.FRAMES - 1, description="frame", readout=True,
                                 layout=W.Layout(width="400px"))
        self.frame.add_class("lab-vd-scrubber")
        self.play = W.Play(value=0, min=0, max=D.FRAMES - 1, interval=200, description="play")
        W.jslink((self.play, "value"), (self.frame, "value"))
        self.table = W.HTML("")
        self.table.add_class("lab-vd-metrics")
        self.status = W.HTML("")
        self.status.add_class("lab-vd-status")
        super().__init__([
            W.HBox([self.mode, self.control_steps, self.refine_steps, self.t_e, self.seed, self.run_button]),
            W.HBox([self.progress, self.progress_label]),
            W.HBox(cols), W.HBox([self.play, self.frame]), self.table, self.status,
        ])
        self.add_class("lab-video-demo")
        self.frame.observe(lambda _: self._draw_stills(), "value")
        for w in (self.mode, self.control_steps, self.refine_steps, self.t_e, self.seed):
            w.observe(lambda _: self.run(), "value")
        self.run_button.on_click(lambda _: self.run())
        self.run(wait=wait)

    # -------------------------------------------------------------------------------------------- running
    def run(self, wait: bool = False) -> None:
        """Cancel any run in flight and start one with the current controls."""
        with self._lock:
            old = self.session
            old.cancel()
            try:
                self.session = D.VideoSession(self.mode.value, self.control_steps.value, self.refine_steps.value,
                                              self.t_e.value, self.seed.value)
            except cf.ConFinerError as exc:
                self.status.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
                return
            s = self.session
            self.progress.max, self.progress.value = s.total_nfe(), 0
            self.progress_label.value = "starting"
            s.start(on_progress=lambda d, n, label: self._progress(s, d, n, label),
                    on_video=lambda name, v: self._video(s, name, v), on_done=lambda err: self._done(s, err))
        if wait:
            self.wait()

    def wait(self, timeout: float | None = 600) -> None:
        """Block until the current run has finished (and the view is updated)."""
        self.session.wait(timeout)

    def _progress(self, s, done, total, label):
        if s is self.session:
            self.progress.value = done
            self.progress_label.value = html.escape(f"{label}: {done}/{total} NFE" if label != "done" else f"done: {done}/{total} NFE")

    def _video(self, s, name, video):
        if s is not self.session:
            return
        if name.endswith(":preview"):
            name = name.split(":")[0]
            if name != "confiner":
                return
        self.images[name].value = D.gif_bytes(video, PX)
        self._draw_stills()

    def _draw_stills(self):
        k = self.frame.value
        for name, v in self.session.videos.items():
            self.stills[name].value = D.frame_png(v[k], PX)

    def _done(self, s, err):
        if s is not self.session:
            return
        if err is None:
            self._draw_stills()
            self.table.value = self._table(s)
            self.status.value = html.escape(f"mode {s.mode}, {s.control_steps} + {s.refine_steps} steps, T_e {s.t_e}, seed {s.seed}")
        elif not isinstance(err, D.RunCancelled):
            self.status.value = f"<span style='color:#b00'>run failed: {html.escape(repr(err))}</span>"

    @staticmethod
    def _table(s) -> str:
        head = "<tr><th>video</th><th>subject consistency</th><th>motion smoothness</th><th>PSNR to nearest real (dB)</th><th>NFE</th><th>s</th></tr>"
        body = "".join(
            f"<tr class='lab-vd-row-{n}'><td>{html.escape(_TITLES[n])}</td><td>{r['subject_consistency']:.4f}</td>"
            f"<td>{r['motion_smoothness']:.4f}</td><td>{'(is one)' if n == 'real' else format(r['psnr_nn'], '.2f')}</td><td>{r['nfe']}</td><td>{r['seconds']:.2f}</td></tr>"
            for n, r in s.rows.items())
        return f"<table class='lab-vd-table' style='border-collapse:collapse'>{head}{body}</table>"
