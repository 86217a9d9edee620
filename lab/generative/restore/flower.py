"""Flower: flow-matching solver for inverse problems (Pourya, El Rawas, Unser; ICLR 2026, arXiv 2509.26287),
as in the authors' code (github mehrsapo/Flower, ``pnpflow/methods/flower.py``).

On the grid ``t_k = k / K`` from ``x ~ N(0, I)``::

    for k = 0 .. K-1:
        b1     = x + (1 - t) v(x, t)                                   (1. destination estimate)
        nu_t^2 = (1 - t)^2 / (t^2 + (1 - t)^2)                         (isotropic Cov[x1 | x_t] under N(0, I) data)
        b1*    = argmin_b ||H b - y||^2 / (2 sigma_y^2) + ||b - b1||^2 / (2 nu_t^2)
               = b1 + H^T (H H^T + (sigma_y^2 / nu_t^2) I)^{-1} (y - H b1)      (2. refinement; closed form here,
                                                                                    CG with 50 iterations in the code)
        x      = (t + dt) b1* + (1 - t - dt) z,  z ~ N(0, I) fresh       (3. time progression)
    return x          (at the last step 1 - t - dt = 0, so x = b1*)

``num_samples`` independent runs are averaged (the code's option; default 1). NFE = ``K * num_samples``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.generative._tensor import randn
from lab.generative.errors import MethodError
from lab.generative.restore.base import RestorationMethod, register, timesteps

__all__ = ["Flower"]


@register
class Flower(RestorationMethod):
    """Flower (Pourya et al., ICLR 2026, Algorithm 1). ``K = nfe / num_samples`` steps."""

    name = "flower"
    paper = "Flower, Pourya, El Rawas, Unser, ICLR 2026 (arXiv 2509.26287), Algorithm 1"

    @dataclass(frozen=True)
    class Config:
        num_samples: int = 1

    def validate(self, c) -> None:
        if int(c.num_samples) != c.num_samples or c.num_samples < 1:
            raise MethodError(f"flower: num_samples must be an integer >= 1, got {c.num_samples!r}")

    @torch.no_grad()
    def run(self, y, operator, prior, nfe, generator, cfg):
        K = self._split_budget(int(nfe), int(cfg.num_samples), self.name, "samples")
        shape = (y.shape[0], *prior.shape)
        x_avg = torch.zeros(shape, device=y.device, dtype=y.dtype)
        for _ in range(int(cfg.num_samples)):
            x = randn(shape, generator, y)
            for _, t, dt, _ in timesteps(K):
                b1 = prior.clean_estimate(x, t)  # x + (1-t) v(x, t)
                nu2 = (1 - t) ** 2 / (t**2 + (1 - t) ** 2)
                b1_star = b1 + operator.H_adjoint(operator.solve_HHt_plus(y - operator.H(b1), operator.sigma_y**2 / nu2))
                z = randn(shape, generator, y)
                x = (t + dt) * b1_star + (1 - t - dt) * z
            x_avg += x
        return x_avg / cfg.num_samples, None
