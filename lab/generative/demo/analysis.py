"""Analysis helpers of notebook 07: ReBridge-Flow's total guidance weight and a method x task table.
Part of :mod:`lab.generative.demo`."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from lab.generative.metrics import psnr
from lab.generative.operators import get_operator
from lab.generative.demo.catalogue import DemoPrior, load_prior, parse_method


# --------------------------------------------------------------------------------------------- analysis helpers
def rebridge_guidance_weight(kappa: float = 5.0, lam: float = 1.0, nfe: int | None = None) -> float:
    """Total weight of the measurement in ReBridge-Flow's update, ``int_0^1 c(t) dt`` with
    ``c(t) = 1 + kappa t (1 - t) / (lambda + kappa (1 - t)^2)``.

    Substituting Eq. 7-8 into Eq. 9 gives ``b_bar - a_bar = v + c(t) (b_bar - b_hat)``: the
    measurement's correction ``b_bar - b_hat`` enters with weight ``c(t) dt`` per step. With
    ``nfe`` the left Riemann sum on the method's grid, else the integral (1.41 at kappa = 5,
    lambda = 1). See ``../shared/notes/rebridge-reproduction.md``."""
    def c(t):
        return 1 + kappa * t * (1 - t) / (lam + kappa * (1 - t) ** 2)

    if nfe is not None:
        from lab.generative.restore.base import timesteps

        return float(sum(c(s.t) for s in timesteps(int(nfe))) / nfe)
    n = 20000
    ts = (np.arange(n) + 0.5) / n
    return float(np.mean(c(ts)))


def compare_methods(prior: DemoPrior | str, tasks, methods, nfe: int = 50, n_images: int = 48, seed: int = 0,
                    hyper: str | None = None, progress: Callable[[str], None] | None = None):
    """Mean PSNR (dB, [0, 1]) of each method on the prior's first ``n_images`` test images, per task.

    ``methods`` are keys of :data:`METHOD_CHOICES`; ``"bayes"`` is the exact posterior mean.
    Returns a pandas DataFrame (rows: tasks, columns: methods) with the NFE and image count in
    ``attrs``. ``progress`` is called with the task name after each task (e.g. a tqdm update).
    """
    import pandas as pd

    from lab.generative.restore import restore

    p = load_prior(prior) if isinstance(prior, str) else prior
    x = p.test_images[: int(n_images)].to(p.device, p.dtype)
    rows = {}
    for task in tasks:
        op = get_operator(task, p.shape)
        y = op.measure(x, torch.Generator().manual_seed(seed))
        row = {}
        for key in methods:
            name, fixed = parse_method(key)
            out = restore(name, y, op, p.prior, nfe=int(nfe), seed=seed, hyper=hyper, **fixed)
            row[key] = float(psnr(out.x, x).mean())
        rows[task] = row
        if progress is not None:
            progress(task)
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "task"
    df.attrs.update({"nfe": int(nfe), "n_images": int(x.shape[0]), "prior": p.name, "metric": "mean PSNR (dB, [0, 1])"})
    return df
