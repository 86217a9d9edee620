"""AdamS: momentum itself as the normalizer (the dense base optimizer that SCAPE sparsifies).

Source: H. Zhang, B. Wang, L. Chen, "AdamS: Momentum Itself Can Be A Normalizer for LLM
Pretraining and Post-training", arXiv 2505.16363 (EMNLP 2025), and its official code
(``pku-huzhang/AdamS``, ``new_optimizers.py``); see ``../shared/notes/papers-scape.md`` §1.

Per element, at step ``t`` (``t = 1, 2, ...``), with ``c = 1 - beta1**t`` when bias correction is
on and ``c = 1`` when it is off::

    p      <- p * (1 - lr * weight_decay)                     # decoupled weight decay first
    v_t     = beta2 * (m_{t-1} / c)**2 + (1 - beta2) * g_t**2 # no second-moment state
    m_t     = beta1 * m_{t-1} + (1 - beta1) * g_t
    p      <- p - lr * (m_t / c) / (sqrt(v_t) + eps)

The paper writes the rule without bias correction; the official code divides both ``m_{t-1}``
(in the denominator) and ``m_t`` (in the numerator) by ``1 - beta1**t`` of the *current* step.
``bias_correction=True`` (the default) follows the official code, ``False`` the paper's formula.
The only state per parameter is ``exp_avg`` (``m``, same shape and dtype as the parameter) and
``step``: the memory of SGD with momentum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from lab.training.errors import OptimizerConfigError, TrainingError  # OptimizerConfigError is defined there, re-exported here

__all__ = ["AdamS", "OptimizerConfigError", "adams_update_", "validate_adams_hyperparameters"]


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def validate_adams_hyperparameters(owner: str, lr: Any, betas: Any, eps: Any, weight_decay: Any) -> None:
    """Check AdamS hyper-parameters, raising :class:`OptimizerConfigError` naming the first bad one.

    ``lr >= 0``, ``0 <= beta1 < 1``, ``0 <= beta2 < 1``, ``eps >= 0``, ``weight_decay >= 0``, all
    finite real numbers (Python ``int``/``float``); ``betas`` a pair.
    """
    if not _is_real(lr) or not math.isfinite(lr) or lr < 0:
        raise OptimizerConfigError(owner, "lr", lr, "a finite number >= 0")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise OptimizerConfigError(owner, "betas", betas, "a pair (beta1, beta2)")
    for i, b in enumerate(betas):
        if not _is_real(b) or not 0.0 <= b < 1.0:
            raise OptimizerConfigError(owner, f"betas[{i}]", b, "a number in [0, 1)")
    if not _is_real(eps) or not math.isfinite(eps) or eps < 0:
        raise OptimizerConfigError(owner, "eps", eps, "a finite number >= 0")
    if not _is_real(weight_decay) or not math.isfinite(weight_decay) or weight_decay < 0:
        raise OptimizerConfigError(owner, "weight_decay", weight_decay, "a finite number >= 0")


@torch.no_grad()
def adams_update_(
    param: torch.Tensor,
    exp_avg: torch.Tensor,
    grad: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction1: float = 1.0,
) -> None:
    """One AdamS step, in place on ``param`` and ``exp_avg`` (the shared kernel of AdamS and SCAPE).

    Parameters
    ----------
    param, exp_avg, grad : torch.Tensor
        Same shape and floating dtype, any shape (whole tensors for :class:`AdamS`, the gathered
        1-D masked coordinates for SCAPE). ``param`` and ``exp_avg`` are updated in place.
    lr, beta1, beta2, eps, weight_decay : float
        As in :class:`AdamS` (not validated here).
    bias_correction1 : float
        ``1 - beta1**t`` with bias correction, ``1.0`` without.

    The operation order is the official code's, so results are reproducible bit for bit.
    """
    if weight_decay != 0.0:
        param.mul_(1.0 - lr * weight_decay)
    m_prev_hat = exp_avg / bias_correction1 if bias_correction1 != 1.0 else exp_avg
    # (beta2 * m_hat) * m_hat + ((1 - beta2) * g) * g, the official code's rounding order
    denom = (m_prev_hat * beta2).mul_(m_prev_hat).add_((grad * (1.0 - beta2)).mul_(grad)).sqrt_().add_(eps)
    exp_avg.lerp_(grad, 1.0 - beta1)
    m_hat = exp_avg / bias_correction1 if bias_correction1 != 1.0 else exp_avg
    param.addcdiv_(m_hat, denom, value=-lr)


class AdamS(torch.optim.Optimizer):
    """AdamS (arXiv 2505.16363): Adam without a second-moment state, normalized by momentum.

    Parameters
    ----------
    params : iterable of torch.Tensor or of dict
        Parameters or parameter groups (as for any :class:`torch.optim.Optimizer`); groups may
        override every hyper-parameter below.
    lr : float, default 3e-4
        Learning rate (``>= 0``).
    betas : (float, float), default (0.9, 0.95)
        ``beta1`` for the momentum, ``beta2`` weighting ``m_{t-1}**2`` against ``g_t**2`` in the
        denominator; each in ``[0, 1)``. Defaults are the official code's.
    eps : float, default 1e-8
        Added to ``sqrt(v_t)``.
    weight_decay : float, default 0.1
        Decoupled (AdamW-style): ``p <- p * (1 - lr * weight_decay)`` before the update; it never
        enters ``m`` or the denominator.
    bias_correction : bool, default True
        Divide ``m_{t-1}`` and ``m_t`` by ``1 - beta1**t`` as the official code does; ``False`` gives
        the paper's formula exactly.

    State
    -----
    Per parameter: ``exp_avg`` (same shape/dtype/device as the parameter) and ``step`` (int).
    :meth:`state_dict` / :meth:`load_state_dict` round-trip them (the torch base class does it).

    Raises
    ------
    OptimizerConfigError
        (a :class:`ValueError`) naming the bad hyper-parameter, at construction or in
        :meth:`add_param_group`.
    TrainingError
        In :meth:`step`, for sparse gradients or non-floating parameters.

    Examples
    --------
    >>> opt = AdamS(model.parameters(), lr=1e-3, weight_decay=0.1)   # doctest: +SKIP
    >>> loss.backward(); opt.step(); opt.zero_grad()                  # doctest: +SKIP
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        bias_correction: bool = True,
    ):
        validate_adams_hyperparameters(type(self).__name__, lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, bias_correction=bool(bias_correction))
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (torch semantics), validating its hyper-parameters."""
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        validate_adams_hyperparameters(type(self).__name__, g["lr"], g["betas"], g["eps"], g["weight_decay"])
        if not isinstance(g["bias_correction"], bool):
            raise OptimizerConfigError(type(self).__name__, "bias_correction", g["bias_correction"], "a bool")
        for p in g["params"]:
            if not p.is_floating_point():
                raise TrainingError(f"{type(self).__name__}: parameters must be floating point, got {p.dtype}")

    @torch.no_grad()
    def step(self, closure=None):
        """Apply one AdamS step to every parameter that has a gradient.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss (called under ``torch.enable_grad``).

        Returns
        -------
        The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise TrainingError(f"{type(self).__name__} does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                bc1 = 1.0 - beta1 ** state["step"] if group["bias_correction"] else 1.0
                adams_update_(
                    p, state["exp_avg"], p.grad,
                    lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"], bias_correction1=bc1,
                )
        return loss
