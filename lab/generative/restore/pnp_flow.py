"""PnP-Flow: plug-and-play image restoration with flow matching (Martin, Gagneux, Hagemann, Steidl; ICLR 2025,
arXiv 2410.02423), Algorithm 3, as in the authors' code (github annegnx/PnP-Flow, ``pnpflow/methods/pnp_flow.py``).

On the grid ``t_n = n / N`` (n = 0 .. N-1), from any ``x`` (the code starts at ``H^T 1``; it is
irrelevant because ``t_0 = 0``)::

    for n = 0 .. N-1:
        gamma_n = lr * sigma_y^2 * (1 - t_n)^alpha                       (step size, "alpha_1_minus_t")
        z       = x - gamma_n * H^T (H x - y) / sigma_y^2                (gradient step on the data fit)
        x       = mean over num_samples draws eps ~ N(0, I) of
                  D_t(t_n z + (1 - t_n) eps),   D_t(u) = u + (1 - t_n) v(u, t_n)   (interpolation + denoiser)
    return x

The code multiplies ``lr`` by ``sigma_y^2`` and divides the gradient by it; the two cancel, and we
write ``z = x - (lr / L) (1 - t_n)^alpha H^T (H x - y)`` (so ``sigma_y = 0`` works too), with
``L = ||H||^2`` (``operator.lipschitz``). Every operator of the code has ``L = 1`` (identity, masks,
normalised blur, and its super-resolution, which *decimates*), so this is the code's step there; our
super-resolution block-averages (``L = 1/factor^2``) and ``lr = 1`` keeps meaning "one full gradient step".

Hyper-parameters: ``lr`` (``lr_pnp``, 1.0 in every benchmark script), ``alpha`` (per task, the
CelebA script ``scripts/script_test.sh``: denoise 0.8, deblur 0.01, SR 0.3, box inpainting 0.5,
random inpainting 0.01), ``num_samples`` (the scripts use 5; default 1 here so that ``N = nfe``
at equal NFE). NFE = ``N * num_samples``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.generative._tensor import randn
from lab.generative.errors import MethodError
from lab.generative.restore.base import RestorationMethod, register, required, timesteps

__all__ = ["PnPFlow"]


@register
class PnPFlow(RestorationMethod):
    """PnP-Flow (Martin et al., ICLR 2025, Algorithm 3). ``N = nfe / num_samples`` steps."""

    name = "pnp_flow"
    paper = "PnP-Flow, Martin et al., ICLR 2025 (arXiv 2410.02423), Algorithm 3"
    TASK_DEFAULTS = {
        "denoise": {"alpha": 0.8},
        "deblur": {"alpha": 0.01},
        "sr2": {"alpha": 0.3},
        "sr4": {"alpha": 0.3},
        "inpaint_box": {"alpha": 0.5},
        "inpaint_random": {"alpha": 0.01},
    }

    @dataclass(frozen=True)
    class Config:
        lr: float = 1.0
        alpha: float | None = required()
        num_samples: int = 1

    def validate(self, c) -> None:
        self._check_positive("lr", c.lr, self.name, allow_zero=False)
        if c.alpha is not None:
            self._check_positive("alpha", c.alpha, self.name)
        if int(c.num_samples) != c.num_samples or c.num_samples < 1:
            raise MethodError(f"pnp_flow: num_samples must be an integer >= 1, got {c.num_samples!r}")

    @torch.no_grad()
    def run(self, y, operator, prior, nfe, generator, cfg):
        N = self._split_budget(int(nfe), int(cfg.num_samples), self.name, "samples")
        L = operator.lipschitz or 1.0
        x = operator.H_adjoint(torch.ones_like(y))  # initialisation of the code (irrelevant: t_0 = 0)
        for _, t, _, _ in timesteps(N):
            lr_t = cfg.lr / L * (1 - t) ** cfg.alpha
            z = x - lr_t * operator.H_adjoint(operator.H(x) - y)  # gradient step on ||Hx - y||^2 / 2
            x_new = torch.zeros_like(x)
            for _ in range(int(cfg.num_samples)):
                z_tilde = t * z + (1 - t) * randn(z.shape, generator, z)  # interpolation step
                x_new += prior.denoiser(z_tilde, t)  # D_t = z~ + (1-t) v(z~, t)
            x = x_new / cfg.num_samples
        return x, None
