"""Two restoration methods on one measurement, side by side: what the restoration demo's compare view shows.

:func:`run_comparison` runs two :class:`~lab.generative.demo.RestorationSession` s that share the
prior, the image, the task, the NFE budget and the seed, so both methods see the same measurement
``y = H x + sigma_y n`` (checked: a comparison whose measurements differ is refused). Progress is
reported over both runs together (``total`` = the two budgets), and one ``threading.Event`` cancels
either. :class:`Comparison` holds the two :class:`~lab.generative.demo.DemoResult` s and the PSNR/SSIM
difference; :meth:`Comparison.png` is one strip (ground truth, degraded, first, second) to download.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from lab.generative import demo as D
from lab.generative.errors import GenerativeError

__all__ = ["Comparison", "run_comparison"]


@dataclass
class Comparison:
    """Two results on one measurement (see the module docstring).

    Attributes
    ----------
    first, second : lab.generative.demo.DemoResult
        The two methods' runs; ``first.measurement`` equals ``second.measurement``.
    """

    first: D.DemoResult
    second: D.DemoResult

    @property
    def psnr_gain(self) -> float:
        """Restored PSNR of ``second`` minus that of ``first`` (dB, [0, 1] scale): positive when the second wins."""
        return self.second.metrics["restored"]["psnr"] - self.first.metrics["restored"]["psnr"]

    @property
    def ssim_gain(self) -> float:
        """Restored SSIM of ``second`` minus that of ``first``."""
        return self.second.metrics["restored"]["ssim"] - self.first.metrics["restored"]["ssim"]

    def summary(self) -> str:
        """One line: both methods' restored PSNR/SSIM and the difference."""
        a, b = self.first, self.second
        ma, mb = a.metrics["restored"], b.metrics["restored"]
        return (f"{D.method_label(a.method_key)} {ma['psnr']:.2f} dB / {ma['ssim']:.3f} vs "
                f"{D.method_label(b.method_key)} {mb['psnr']:.2f} dB / {mb['ssim']:.3f} "
                f"({self.psnr_gain:+.2f} dB) on {a.task} at {a.nfe}/{b.nfe} NFE")

    def png(self, size: int = 96) -> bytes:
        """One PNG strip: ground truth, degraded, ``first`` and ``second`` restored (:func:`~lab.generative.demo.grid_png`)."""
        r = self.first
        return D.grid_png([r.truth, r.degraded, r.restored, self.second.restored], ncols=4, size=size)

    def download_name(self) -> str:
        """A file name for :meth:`png`, e.g. ``compare_gaussian-digits_denoise_rebridge_vs_flower_seed0_test1.png``."""
        a, b = self.first, self.second
        image = f"test{a.image_info['test_index']}" if "test_index" in a.image_info else "upload"
        return (f"compare_{a.prior}_{a.task}_{a.method_key.replace(':', '-')}_vs_{b.method_key.replace(':', '-')}"
                f"_seed{a.seed}_{image}.png")


def run_comparison(first: D.RestorationSession, second: D.RestorationSession,
                   progress: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None) -> Comparison:
    """Run ``first`` then ``second`` (two sessions on the same prior, image, task and seed) and pair them.

    Parameters
    ----------
    first, second : RestorationSession
        Built with the same prior, image, task, ``operator_kw`` and seed; methods, NFE and
        hyper-parameters may differ.
    progress : callable(done, total), optional
        Called after each prior evaluation of either run; ``total`` is ``first.budget + second.budget``.
    cancel : threading.Event, optional
        Stops either run at its next evaluation (:class:`~lab.generative.demo.RunCancelled`).

    Raises
    ------
    GenerativeError
        When the two sessions do not share prior, task, seed and ground truth, or their measurements
        differ (then they were not comparable).
    """
    for what, a, b in (("prior", first.prior.name, second.prior.name), ("task", first.task, second.task),
                       ("seed", first.seed, second.seed)):
        if a != b:
            raise GenerativeError(f"run_comparison: the two sessions differ in {what} ({a!r} vs {b!r}); compare on one measurement")
    if not np.array_equal(first.truth.cpu().numpy(), second.truth.cpu().numpy()):
        raise GenerativeError("run_comparison: the two sessions restore different images")
    total = first.budget + second.budget

    def shifted(offset: int):
        if progress is None:
            return None
        return lambda done, _total: progress(offset + done, total)

    a = first.run(progress=shifted(0), cancel=cancel)
    b = second.run(progress=shifted(first.budget), cancel=cancel)
    if not np.array_equal(a.measurement, b.measurement):
        raise GenerativeError("run_comparison: the two runs measured different y (same seed and operator expected)")
    return Comparison(a, b)
