"""Flow-matching image restoration: one entry point, one module per method.

>>> from lab.generative.operators import get_operator
>>> from lab.generative.priors import GaussianPrior
>>> from lab.generative.restore import restore
>>> out = restore("rebridge", y, op, prior, nfe=100, seed=0)        # doctest: +SKIP
>>> out.x.shape, out.nfe, out.trajectory[10].terms["bridge_residual"]  # doctest: +SKIP

Methods (``METHODS``), each reading like its paper's algorithm box:

=============  =====================================================================
``rebridge``   ReBridge-Flow, arXiv 2609.00811 (Algorithm 1), with its readings and ablations
``pnp_flow``   PnP-Flow, Martin et al., ICLR 2025 (Algorithm 3)
``flower``     Flower, Pourya et al., ICLR 2026 (Algorithm 1)
``ot_ode``     OT-ODE, Pokle et al., TMLR 2024 (Algorithm 1)
``d_flow``     D-Flow, Ben-Hamu et al., ICML 2024
``bayes``      the exact posterior mean of an exact prior (the ceiling; 0 NFE)
``naive``      the floor: ``y`` itself, or ``H^+ y`` where ``y`` is not image-shaped (0 NFE)
``tikhonov``   the classical solver ``(H^T H + lam I)^{-1} H^T y`` (0 NFE; ``lam`` tuned)
=============  =====================================================================

and the lab's own variant (not a paper's method):

==================  ================================================================
``recoupled_admm``  ReBridge-Flow's endpoints (Eqs. 3, 7) in a scaled ADMM splitting: the
                    source endpoint carries the multiplier, the state is re-projected onto
                    the re-coupled bridge (:mod:`~lab.generative.restore.recoupled_admm`)
==================  ================================================================

Every method other than ``bayes``, ``naive`` and ``tikhonov`` spends exactly ``nfe`` prior evaluations; :func:`restore`
checks it on the prior's counter and raises :class:`~lab.generative.errors.NFEBudgetError` otherwise.

Hyper-parameters: by default each method runs with its paper's values (``Config`` defaults and
per-task ``TASK_DEFAULTS``), so "as written" results never depend on a file. ``hyper="tuned"``
opts in to the values chosen on a validation split by :mod:`lab.generative.tuning` and committed in
``lab/generative/restore/tuned.json`` for the prior's ``tuning_key`` (``hyper="tuned:<kind>"`` names
the kind explicitly); explicit keyword arguments override either.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from lab.generative._tensor import check_batch, make_generator
from lab.generative.errors import MethodError, NFEBudgetError
from lab.generative.restore import bayes, classical, d_flow, flower, ot_ode, pnp_flow, rebridge, recoupled_admm  # noqa: F401  (register)
from lab.generative.restore.base import METHODS, RestorationMethod, RestorationResult, register

__all__ = ["restore", "resolve_hyper", "METHODS", "RestorationMethod", "RestorationResult", "register", "available_methods",
           "get_method"]


def available_methods() -> list[str]:
    """Registered method names."""
    return sorted(METHODS)


def get_method(method: str | RestorationMethod, **hyper) -> RestorationMethod:
    """A method instance from its name and hyper-parameters (or the instance itself, without hyper)."""
    if isinstance(method, RestorationMethod):
        if hyper:
            raise MethodError("pass hyper-parameters either to the method instance or to restore(), not both")
        return method
    if method not in METHODS:
        raise MethodError(f"unknown restoration method {method!r}; known: {', '.join(available_methods())}")
    return METHODS[method](**hyper)


def restore(method: str | RestorationMethod, y: torch.Tensor, operator, prior, nfe: int, seed: int | None = 0,
            hyper: str | dict | None = None, **kw) -> RestorationResult:
    """Restore ``x`` from ``y = H x + sigma_y n`` with a flow prior, at a fixed number of network evaluations.

    Parameters
    ----------
    method : str or RestorationMethod
        A name from :func:`available_methods` (``"rebridge"``, ``"pnp_flow"``, ``"flower"``,
        ``"ot_ode"``, ``"d_flow"``, ``"recoupled_admm"``, ``"bayes"``, ``"naive"``, ``"tikhonov"``) or an instance.
    y : tensor (B, *operator.measurement_shape)
        Float measurements on the [-1, 1] scale, on any device (the result lives there too).
    operator : lab.generative.operators.LinearOperator
    prior : lab.generative.priors.FlowPrior
        Same image shape as the operator; its ``nfe`` counter is used to check the budget.
    nfe : int >= 1
        Prior evaluations to spend (one batched ``velocity``/``clean_estimate`` call = 1).
    seed : int or None
        Seeds a CPU generator for every random draw (same result on every device up to rounding).
    hyper : None, "paper", "tuned", "tuned:<kind>" or dict
        Where hyper-parameters come from. None/``"paper"`` (default): the paper's values.
        ``"tuned"``: the values of ``lab/generative/restore/tuned.json`` for ``prior.tuning_key``, the
        operator's task and this method, at the tuned NFE nearest ``nfe``
        (:func:`lab.generative.tuning.tuned_hyper`); ``"tuned:<kind>"`` names the prior kind. A dict
        is used as the base values. Raises :class:`MethodError` when no tuned entry exists.
    **kw
        The method's hyper-parameters (see its ``Config``); they override ``hyper``.

    Returns
    -------
    RestorationResult
        ``hyper`` holds the resolved values, ``hyper_source`` where they came from.

    Raises
    ------
    MethodError
        Unknown method or hyper-parameter, no tuned values, or shapes that do not fit together.
    NFEBudgetError
        ``nfe`` cannot be split as the method needs, or the method used a different number.
    """
    base, source = resolve_hyper(method, hyper, operator, prior, nfe)
    if kw:
        source += "+explicit"
    hyper = {**base, **kw}
    m = get_method(method, **hyper)
    if tuple(operator.shape) != tuple(prior.shape):
        raise MethodError(f"{m.name}: operator images {tuple(operator.shape)} and prior images {tuple(prior.shape)} differ")
    check_batch(y, operator.measurement_shape, f"restore[{m.name}]", "y", MethodError)
    if m.uses_nfe and (int(nfe) != nfe or nfe < 1):
        raise NFEBudgetError(f"{m.name}: nfe must be an integer >= 1, got {nfe!r}")
    cfg = m.resolve(operator)
    generator = make_generator(seed)
    start = prior.nfe
    if y.is_cuda:
        torch.cuda.synchronize(y.device)
    t0 = time.perf_counter()
    x, trajectory = m.run(y, operator, prior, int(nfe) if m.uses_nfe else 0, generator, cfg)
    if y.is_cuda:
        torch.cuda.synchronize(y.device)
    seconds = time.perf_counter() - t0
    used = prior.nfe - start
    if m.uses_nfe and used != int(nfe):
        raise NFEBudgetError(f"{m.name}: used {used} prior evaluations, budget was {nfe}")
    return RestorationResult(x=x.detach(), method=m.name, nfe=used, seed=seed, hyper=dataclasses.asdict(cfg),
                             seconds=seconds, trajectory=trajectory, hyper_source=source)


def resolve_hyper(method, hyper, operator, prior, nfe) -> tuple[dict, str]:
    """The one place hyper-parameters are resolved: the base values for a ``hyper`` request and their source.

    :func:`restore` and the demo (:mod:`lab.generative.demo`) both call it, so a result's
    ``hyper_source`` reads the same wherever it was produced.

    Parameters
    ----------
    method : str or RestorationMethod
    hyper : None, "paper", "tuned", "tuned:<kind>" or dict
        As in :func:`restore`.
    operator : LinearOperator or None
        Its ``name`` is the task looked up in ``tuned.json``.
    prior : FlowPrior or None
        Its ``tuning_key`` is the kind for ``hyper="tuned"``.
    nfe : int
        The tuned NFE nearest it is used.

    Returns
    -------
    (dict, str)
        The base values (``{}`` for the paper's: the method's ``Config`` and ``TASK_DEFAULTS`` fill
        them) and the source: ``"paper"``, ``"explicit"`` (a dict) or ``"tuned:<kind>@nfe=<n>"``.

    Raises
    ------
    MethodError
        No kind for ``"tuned"``, no tuned entry, an instance with ``"tuned"``, or an unknown request.
    """
    if hyper is None or hyper == "paper":
        return {}, "paper"
    if isinstance(hyper, dict):
        return dict(hyper), "explicit"
    if isinstance(hyper, str) and (hyper == "tuned" or hyper.startswith("tuned:")):
        if isinstance(method, RestorationMethod):
            raise MethodError("hyper='tuned' needs a method name, not an instance (the instance already holds its values)")
        name = method
        kind = hyper.partition(":")[2] or (prior.tuning_key if prior is not None else None)
        if not kind:
            raise MethodError(
                f"{name}: hyper='tuned' needs the prior's kind: set prior.tuning_key (e.g. 'gaussian-digits') "
                f"or pass hyper='tuned:<kind>'"
            )
        from lab.generative.tuning import tuned_hyper  # lazy: tuning imports this package

        values, tuned_nfe = tuned_hyper(kind, getattr(operator, "name", "?"), name, int(nfe) if nfe else 0)
        return values, f"tuned:{kind}@nfe={tuned_nfe}"
    raise MethodError(f"hyper must be None, 'paper', 'tuned', 'tuned:<kind>' or a dict, got {hyper!r}")
