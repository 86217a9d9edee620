"""The Bayes posterior mean ``E[x1 | y]`` as a restoration "method": the reference ceiling.

For a :class:`~lab.generative.priors.GaussianPrior` and a linear operator with Gaussian noise, the
posterior mean ``mu + Sigma H^T (H Sigma H^T + sigma_y^2 I)^{-1} (y - H mu)`` minimises the expected
squared error given ``y``: no method's expected PSNR can exceed it (in expectation over images drawn
from the prior). For an :class:`~lab.generative.priors.EmpiricalPrior` it is the softmax average of
the set's images under the likelihood. It uses no network evaluation (``nfe`` is ignored; the
result reports 0). Source: the exact-prior check of ``../shared/notes/rebridge-reproduction.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.generative.errors import MethodError
from lab.generative.restore.base import RestorationMethod, register

__all__ = ["Bayes"]


@register
class Bayes(RestorationMethod):
    """Exact posterior mean of an exact prior (``prior.posterior_mean(y, operator)``); no hyper-parameters."""

    name = "bayes"
    paper = "Bayes posterior mean (MMSE estimator) of an exact prior"
    uses_nfe = False

    @dataclass(frozen=True)
    class Config:
        pass

    @torch.no_grad()
    def run(self, y, operator, prior, nfe, generator, cfg):
        if not hasattr(prior, "posterior_mean"):
            raise MethodError(f"bayes: needs an exact prior with posterior_mean (GaussianPrior, EmpiricalPrior), got {type(prior).__name__}")
        return prior.posterior_mean(y, operator), None
