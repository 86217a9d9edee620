"""The floor of every restoration table: the naive estimate and Tikhonov-regularised least squares.

Neither uses the prior (0 network evaluations; ``nfe`` is ignored and the result reports 0). A
flow-prior method that scores below ``naive`` has made the measurement worse; one below
``tikhonov`` has not beaten the classical solver with one tuned parameter.

``naive`` -- the natural naive estimate of each task, the measurement read as an image:

- denoising, deblurring: ``y`` itself (the noisy / blurred image; the pseudo-inverse of a blur
  amplifies the noise, so it is not the natural naive answer);
- inpainting (random, box): ``y = M x + noise`` with the removed pixels 0 (mid-grey on [-1, 1]),
  which is also ``H^T y`` and the pseudo-inverse ``H^+ y``;
- super-resolution: the pseudo-inverse ``H^T (H H^T)^{-1} y`` (each low-resolution pixel replicated
  over its ``f x f`` block), because ``y`` is not image-shaped.

In general: ``y`` when it has the image's shape, else ``H^+ y``.

``tikhonov`` -- ``x = argmin ||H x - y||^2 + lam ||x||^2 = (H^T H + lam I)^{-1} H^T y`` (Tikhonov,
1963; for a circular blur it is the Wiener filter with a flat signal spectrum). Computed with the
push-through identity ``(H^T H + lam I)^{-1} H^T = H^T (H H^T + lam I)^{-1}`` and the operator's
closed-form :meth:`~lab.generative.operators.LinearOperator.solve_HHt_plus` (an FFT division for
the circular blur, a division for masks, block averaging and denoising), so no iterative solver and
no tolerance are involved; ``lam`` (> 0) is tuned on the validation split like every other method's
hyper-parameters (:mod:`lab.generative.tuning`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.generative.restore.base import RestorationMethod, register

__all__ = ["Naive", "Tikhonov", "naive_estimate", "tikhonov_solve"]


def naive_estimate(y: torch.Tensor, operator) -> torch.Tensor:
    """The naive estimate of ``x`` from ``y``: ``y`` itself when it is image-shaped, else ``H^+ y``.

    Parameters
    ----------
    y : tensor (B, *operator.measurement_shape)
    operator : LinearOperator

    Returns
    -------
    tensor (B, *operator.shape), same dtype and device as ``y``.
    """
    if tuple(y.shape[1:]) == tuple(operator.shape):
        return y.clone()
    return operator.H_adjoint(operator.solve_HHt_plus(y, 0.0))


def tikhonov_solve(y: torch.Tensor, operator, lam: float) -> torch.Tensor:
    """``(H^T H + lam I)^{-1} H^T y`` for ``lam > 0`` (computed as ``H^T (H H^T + lam I)^{-1} y``).

    Parameters
    ----------
    y : tensor (B, *operator.measurement_shape)
    operator : LinearOperator
    lam : float > 0
        Regularisation weight on the [-1, 1] image scale.

    Returns
    -------
    tensor (B, *operator.shape)
    """
    return operator.H_adjoint(operator.solve_HHt_plus(y, float(lam)))


@register
class Naive(RestorationMethod):
    """The degraded input (``y``) or, where ``y`` is not image-shaped (super-resolution), ``H^+ y``."""

    name = "naive"
    paper = "naive estimate: the measurement itself, or its pseudo-inverse when it is not image-shaped"
    uses_nfe = False

    @dataclass(frozen=True)
    class Config:
        pass

    @torch.no_grad()
    def run(self, y, operator, prior, nfe, generator, cfg):
        return naive_estimate(y, operator), None


@register
class Tikhonov(RestorationMethod):
    """Tikhonov-regularised least squares ``(H^T H + lam I)^{-1} H^T y`` (Wiener filter for the blur)."""

    name = "tikhonov"
    paper = "Tikhonov regularisation (Tikhonov 1963); Wiener deconvolution for a circular blur"
    uses_nfe = False

    @dataclass(frozen=True)
    class Config:
        lam: float = 0.01

    def validate(self, c) -> None:
        self._check_positive("lam", c.lam, self.name, allow_zero=False)

    @torch.no_grad()
    def run(self, y, operator, prior, nfe, generator, cfg):
        return tikhonov_solve(y, operator, cfg.lam), None
