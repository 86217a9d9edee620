"""Logic of the video demo (:class:`widgets.VideoDemo`): one ConFiner run beside each expert alone and a real clip.

:class:`VideoSession` holds the settings (mode, control / refinement steps, T_e, seed) and runs, in a
background thread (:meth:`VideoSession.start`), ConFiner and then each expert alone at its full step count
on the same initial noise, calling ``on_progress(done_nfe, total_nfe, label)`` after every denoising step
and ``on_video(name, video)`` as each video finishes (the clean-sample estimate ``x0_hat`` of the current
step is streamed as ``name + ":preview"``). :meth:`VideoSession.cancel` stops a run at its next step.
Videos come back as ``(F, H, W)`` float arrays on [-1, 1]; :func:`gif_bytes` and :func:`frame_png` turn
them into an animated GIF and one frame's PNG (PIL, nearest-neighbour upscaling);
:func:`video_metrics` gives the table (VBench subject consistency and motion smoothness, PSNR to the
nearest held-out frame, NFE, seconds).
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lab.generative.video import confiner as cf
from lab.generative.video import datasets, metrics
from lab.generative.video.experts import EXPERTS, load_expert

__all__ = ["VideoSession", "RunCancelled", "gif_bytes", "frame_png", "video_metrics", "VIDEO_NAMES", "load_all"]

FRAMES, SIZE = 8, 32
#: the videos a run produces, in order
VIDEO_NAMES = ("confiner", "control", "spatial", "temporal", "real")

_LOCK = threading.Lock()
_CACHE: dict = {}


def load_all() -> dict:
    """The three experts and the feature encoder (loaded once, verified)."""
    with _LOCK:
        if not _CACHE:
            _CACHE.update({k: load_expert(k) for k in EXPERTS})
            _CACHE["encoder"] = metrics.load_encoder()
            _CACHE["real_frames"] = datasets.frames("test", SIZE)
            _CACHE["real_clips"] = datasets.clips("test", FRAMES, SIZE)
    return _CACHE


class RunCancelled(Exception):
    """Raised inside a run's thread when :meth:`VideoSession.cancel` was called."""


def _to_uint8(frame: np.ndarray, size: int) -> np.ndarray:
    u = np.round((np.clip(np.asarray(frame, np.float64), -1, 1) + 1) * 127.5).astype(np.uint8)
    k = max(1, size // u.shape[0])
    return np.kron(u, np.ones((k, k), np.uint8))


def gif_bytes(video: np.ndarray, size: int = 128, ms_per_frame: int = 150) -> bytes:
    """An endlessly looping animated GIF of ``video`` (F, H, W) on [-1, 1], upscaled to ``size`` px."""
    from PIL import Image

    imgs = [Image.fromarray(_to_uint8(f, size), "L") for f in video]
    buf = io.BytesIO()
    imgs[0].save(buf, format="GIF", save_all=True, append_images=imgs[1:], duration=ms_per_frame, loop=0)
    return buf.getvalue()


def frame_png(frame: np.ndarray, size: int = 128) -> bytes:
    """One frame (H, W) on [-1, 1] as a grey PNG upscaled to ``size`` px."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_to_uint8(frame, size), "L").save(buf, format="PNG")
    return buf.getvalue()


def video_metrics(video: np.ndarray) -> dict:
    """``subject_consistency``, ``motion_smoothness`` and ``psnr_nn`` (dB) of one video (F, H, W)."""
    c = load_all()
    v = torch.as_tensor(np.asarray(video), dtype=torch.float32).unsqueeze(0)
    f = metrics.features(c["encoder"], v)
    psnr, _ = metrics.nearest_psnr_ssim(v, c["real_frames"])
    return {"subject_consistency": float(metrics.subject_consistency(f)[0]),
            "motion_smoothness": float(metrics.motion_smoothness(v)[0]), "psnr_nn": float(psnr[0])}


@dataclass
class VideoSession:
    """The demo's settings and its latest results.

    Parameters
    ----------
    mode : one of :data:`lab.generative.video.confiner.MODES`
    control_steps, refine_steps : int
    t_e : int
        1..1000.
    seed : int
        The initial noise's seed (the same noise for ConFiner and every expert alone).
    real : int
        Index of the held-out test clip shown as the real reference.
    """

    mode: str = "coordinated"
    control_steps: int = 4
    refine_steps: int = 5
    t_e: int = 100
    seed: int = 0
    real: int = 0
    videos: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in cf.MODES:
            raise cf.ConFinerError(f"unknown ConFiner mode {self.mode!r}; known: {', '.join(cf.MODES)}")
        if not 1 <= int(self.t_e) <= 1000:
            raise cf.ConFinerError(f"T_e must lie in 1..1000, got {self.t_e}")
        self._cancel = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def total_nfe(self) -> int:
        per_step = 3 if self.mode in ("coordinated", "naive_alternation") else 1
        return self.control_steps + per_step * self.refine_steps + sum(EXPERTS[k][2] for k in EXPERTS)

    def cancel(self) -> None:
        self._cancel.set()

    def run(self, on_progress=None, on_video=None) -> dict:
        """Generate every video of :data:`VIDEO_NAMES` (blocking); returns ``{name: (F, H, W) array}``."""
        c = load_all()
        noise = torch.randn((1, FRAMES, SIZE, SIZE), generator=torch.Generator().manual_seed(int(self.seed)))
        total, done = self.total_nfe(), [0]
        on_progress = on_progress or (lambda *a: None)
        on_video = on_video or (lambda *a: None)

        def step(label, name):
            def cb(*args):
                if self._cancel.is_set():
                    raise RunCancelled()
                done[0] += 3 if label == "refine" and self.mode == "coordinated" else 1
                on_progress(min(done[0], total), total, f"{name}: {label} step {args[-3]}/{args[-2]}")
                on_video(name + ":preview", args[-1][0].numpy())
            return cb

        real = c["real_clips"][int(self.real) % len(c["real_clips"])].numpy()
        self.videos = {"real": real}
        self.rows = {"real": {**video_metrics(real), "nfe": 0, "seconds": 0.0}}
        on_video("real", real)
        g = cf.confiner(noise, c["control"], c["spatial"], c["temporal"], self.control_steps, self.refine_steps,
                        self.t_e, self.mode, seed=self.seed, callback=lambda st, i, n, x0: step(st, "confiner")(i, n, x0))
        self._finish("confiner", g, on_video)
        for k in EXPERTS:
            g = cf.sample_expert(c[k], noise, callback=step("alone", k))
            self._finish(k, g, on_video)
        on_progress(total, total, "done")
        return self.videos

    def _finish(self, name, g, on_video):
        v = g.video[0].clamp(-1, 1).numpy()
        self.videos[name] = v
        self.rows[name] = {**video_metrics(v), "nfe": g.nfe, "seconds": g.seconds}
        on_video(name, v)

    def start(self, on_progress=None, on_video=None, on_done=None) -> threading.Thread:
        """:meth:`run` in a daemon thread; ``on_done(error_or_None)`` at the end (``RunCancelled`` when cancelled)."""
        self._cancel.clear()

        def target():
            err = None
            try:
                self.run(on_progress, on_video)
            except BaseException as exc:  # reported to on_done, never lost
                err = exc
            self.error = err
            if on_done:
                on_done(err)

        self.thread = threading.Thread(target=target, daemon=True, name="video-demo-run")
        self.thread.start()
        return self.thread

    def wait(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                raise TimeoutError(f"the video demo run did not finish in {timeout} s")
