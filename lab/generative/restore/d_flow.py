"""D-Flow: differentiating through flows for controlled generation (Ben-Hamu, Puny, Gat, Karrer, Singer, Lipman;
ICML 2024, arXiv 2402.14017), Sec. 3-4, with the inverse-problem set-up of PnP-Flow's re-implementation
(github annegnx/PnP-Flow, ``pnpflow/methods/d_flow.py``), which ReBridge-Flow's comparison uses.

The restored image is ``Phi(z)``, the flow's ODE solution from the source point ``z``; D-Flow
optimises ``z``::

    z0 = Phi^{-1}(H^T y)                                  (invert the flow from t = 1 to 0)
    z  = sqrt(alpha) z0 + sqrt(1 - alpha) eps             (blended initialisation, alpha = 0.1)
    minimise over z with L-BFGS (strong Wolfe line search, history 100):
        L(z) = ||H Phi(z) - y||^2 + lmbda * R(z),   R(z) = ||z||^2 / 2 - (d - 1) log ||z||   (-log chi_d density)
    return Phi(z)

Budget (every velocity evaluation counts, forward and inversion): ``nfe = inversion NFE + n * forward
NFE`` where one loss evaluation (one ``Phi``) costs ``steps`` (Euler) or ``2 * steps`` (midpoint)
evaluations. Exactly ``n`` loss evaluations are made; the output is, per image, the ``Phi(z)`` of the
evaluated ``z`` with the lowest loss (so no extra solve is needed). Inversion steps backwards from
t = 1 with the same solver but never queries t = 1 itself (an exact empirical prior's velocity is
singular there): Euler steps use the velocity at each interval's midpoint; midpoint steps take their
half step with the velocity at ``t_{k+1} - dt/4``.

Departures, stated: the code inverts with dopri5 (adaptive, uncounted) and solves forward with
5 midpoint steps; here both are counted and ``steps``/``solver`` are budget knobs (default 5 Euler
steps). PnP-Flow's code adds ``+ lmbda * log chi_d(||z||)`` (the opposite sign of the paper's
regulariser); we follow the paper. Defaults from PnP-Flow's CelebA script: ``lmbda = 0.001``,
``alpha = 0.1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lab.generative._tensor import randn
from lab.generative.errors import MethodError, NFEBudgetError
from lab.generative.restore.base import RestorationMethod, register, timesteps

__all__ = ["DFlow"]


class _BudgetExhausted(Exception):
    pass


@register
class DFlow(RestorationMethod):
    """D-Flow (Ben-Hamu et al., ICML 2024). Hyper-parameters: ``lmbda`` (regulariser weight), ``alpha``
    (initial blend), ``steps`` and ``solver`` (``"euler"``/``"midpoint"``) of the forward solve,
    ``inversion_steps`` (None = ``steps``), ``lbfgs_history``."""

    name = "d_flow"
    paper = "D-Flow, Ben-Hamu et al., ICML 2024 (arXiv 2402.14017), Sec. 3-4"

    @dataclass(frozen=True)
    class Config:
        lmbda: float = 0.001
        alpha: float = 0.1
        steps: int = 5
        solver: str = "euler"
        inversion_steps: int | None = None
        lbfgs_history: int = 100

    def validate(self, c) -> None:
        self._check_positive("lmbda", c.lmbda, self.name)
        if not 0.0 <= float(c.alpha) <= 1.0:
            raise MethodError(f"d_flow: alpha must be in [0, 1], got {c.alpha!r}")
        if c.solver not in ("euler", "midpoint"):
            raise MethodError(f"d_flow: solver must be 'euler' or 'midpoint', got {c.solver!r}")
        for n in ("steps", "inversion_steps", "lbfgs_history"):
            v = getattr(c, n)
            if v is not None and (int(v) != v or v < 1):
                raise MethodError(f"d_flow: {n} must be an integer >= 1, got {v!r}")

    # ------------------------------------------------------------------ ODE solves
    @staticmethod
    def _forward(prior, z, steps, solver):
        for _, t, dt, _ in timesteps(steps):
            if solver == "euler":
                z = z + dt * prior.velocity(z, t)
            else:
                z = z + dt * prior.velocity(z + 0.5 * dt * prior.velocity(z, t), t + 0.5 * dt)
        return z

    @staticmethod
    @torch.no_grad()
    def _inverse(prior, x, steps, solver):
        for _, t, dt, t_next in reversed(timesteps(steps)):
            tm = 0.5 * (t + t_next)  # interval midpoint
            if solver == "euler":
                x = x - dt * prior.velocity(x, tm)
            else:
                x = x - dt * prior.velocity(x - 0.5 * dt * prior.velocity(x, tm + 0.25 * dt), tm)
        return x

    def run(self, y, operator, prior, nfe, generator, cfg):
        per_eval = cfg.steps * (1 if cfg.solver == "euler" else 2)
        inv_steps = cfg.inversion_steps or cfg.steps
        per_inv = inv_steps * (1 if cfg.solver == "euler" else 2)
        rest = int(nfe) - per_inv
        if rest < per_eval or rest % per_eval:
            raise NFEBudgetError(
                f"d_flow: nfe={nfe} must be {per_inv} (inversion) + n x {per_eval} (one loss evaluation), n >= 1; "
                f"change steps/inversion_steps/solver"
            )
        n_evals = rest // per_eval
        B = y.shape[0]
        d = math.prod(prior.shape)

        z0 = self._inverse(prior, operator.H_adjoint(y), inv_steps, cfg.solver)
        z = (math.sqrt(cfg.alpha) * z0 + math.sqrt(1 - cfg.alpha) * randn(z0.shape, generator, z0)).detach()
        z.requires_grad_(True)
        opt = torch.optim.LBFGS([z], lr=1.0, max_iter=20, history_size=int(cfg.lbfgs_history), line_search_fn="strong_wolfe")
        state = {"evals": 0, "best_loss": torch.full((B,), math.inf, device=y.device, dtype=torch.float64),
                 "best_x": torch.zeros_like(z0)}

        def closure():
            if state["evals"] >= n_evals:
                raise _BudgetExhausted
            state["evals"] += 1
            opt.zero_grad()
            out = self._forward(prior, z, cfg.steps, cfg.solver)
            data = ((operator.H(out) - y) ** 2).flatten(1).sum(1)
            r = z.flatten(1).norm(dim=1)
            reg = 0.5 * r**2 - (d - 1) * torch.log(r + 1e-5)
            per_image = data + cfg.lmbda * reg
            with torch.no_grad():
                better = per_image.detach().double() < state["best_loss"]
                state["best_loss"] = torch.where(better, per_image.detach().double(), state["best_loss"])
                state["best_x"] = torch.where(better.reshape(B, 1, 1, 1), out.detach(), state["best_x"])
            loss = per_image.sum()
            loss.backward()
            return loss

        with torch.enable_grad():
            try:
                while True:
                    opt.step(closure)
            except _BudgetExhausted:
                pass
        return state["best_x"].detach(), None
