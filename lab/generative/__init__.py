"""Generative facet: flow-matching priors, degradation operators and restoration methods.

Three separate objects, as in diffusers (model / scheduler / pipeline):

- an operator (:mod:`lab.generative.operators`): ``H``, ``H^T``, ``(H H^T + gamma I)^{-1}``, noise ``sigma_y``;
- a prior (:mod:`lab.generative.priors`): a velocity ``v(x_t, t)`` with an evaluation counter; exact
  Gaussian and empirical priors, or a learned network (the shipped UNet priors ``"mnist"``,
  ``"natural32"``, ``"medical32"``: :func:`load_learned_prior`, trained by
  ``python -m lab.generative.train_prior`` on :mod:`lab.generative.datasets`);
- a restoration method (:mod:`lab.generative.restore`): ``restore(method, y, operator, prior, nfe, seed)``
  (``from lab.generative.restore import restore``).

Conventions: images ``(B, C, H, W)`` float on [-1, 1]; flow time 0 = noise, 1 = clean;
``x_t = (1 - t) x0 + t x1``; PSNR on [0, 1] (:mod:`lab.generative.metrics`).
Errors derive from :class:`lab.generative.errors.GenerativeError` (itself a :class:`lab.LabError`).
"""

from __future__ import annotations

from lab.generative.errors import GenerativeError, MethodError, NFEBudgetError, OperatorError, PriorError
from lab.generative.operators import get_operator
from lab.generative.priors import EmpiricalPrior, FlowPrior, GaussianPrior, LearnedPrior
from lab.generative.learned import load_learned_prior

__all__ = [
    "GenerativeError", "OperatorError", "PriorError", "MethodError", "NFEBudgetError",
    "get_operator", "FlowPrior", "GaussianPrior", "EmpiricalPrior", "LearnedPrior", "load_learned_prior",
]
