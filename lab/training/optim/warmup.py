"""Deep Gradient Compression's sparsity warm-up (Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression",
ICLR 2018, arXiv 1712.01887, Sec. 3.3 "Warm-up training"): early in training the gradients change fast and
a high sparsity delays too much of them, so the sparsity is raised exponentially over the first part of
training. DGC uses 75%, 93.75%, 98.4375%, 99.6% over its first four epochs (the density divided by 4 at
each stage), then its target 99.9%.

:func:`dgc_warmup_sparsity` gives that schedule for a target sparsity and a warm-up length in optimizer
steps: the warm-up is divided into ``stages`` equal stages; stage ``i`` (0-based) runs at
``min(target, 1 - factor ** (i + 1))``; after the warm-up the target. By default ``stages`` is the number
of factor-``factor`` reductions of the density needed to reach the target,
``ceil(log(1 - target) / log(factor))`` (target 0.99, factor 1/4: 4 stages, 75%, 93.75%, 98.4375%, 99%;
target 0.9: 2 stages, 75%, 90%). :class:`~lab.training.optim.scape.SCAPE` takes it as
``sparsity_warmup`` (steps) and ``sparsity_warmup_factor``.
"""

from __future__ import annotations

import math

from lab.training.errors import OptimizerConfigError

__all__ = ["dgc_warmup_sparsity", "dgc_warmup_stages"]


def _check(target: object, warmup_steps: object, factor: object) -> None:
    real = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)  # noqa: E731
    if not real(target) or not 0.0 <= target < 1.0:
        raise OptimizerConfigError("sparsity warm-up", "sparsity", target, "a number in [0, 1)")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise OptimizerConfigError("sparsity warm-up", "sparsity_warmup", warmup_steps, "an int >= 0 (steps)")
    if not real(factor) or not 0.0 < factor < 1.0:
        raise OptimizerConfigError("sparsity warm-up", "sparsity_warmup_factor", factor, "a number in (0, 1)")


def dgc_warmup_stages(target: float, factor: float = 0.25) -> int:
    """Stages of a DGC warm-up to ``target``: the smallest ``s >= 1`` with ``1 - factor ** s >= target``.

    Parameters
    ----------
    target : float
        Final sparsity in ``[0, 1)`` (fraction of coordinates not sent).
    factor : float
        Density kept per stage, in ``(0, 1)`` (DGC: 1/4).

    Returns
    -------
    int

    Raises
    ------
    OptimizerConfigError
        ``target`` or ``factor`` out of range (the error names it).
    """
    _check(target, 0, factor)
    s = 1
    while 1.0 - factor**s < target - 1e-12:
        s += 1
    return s


def dgc_warmup_sparsity(step: int, target: float, warmup_steps: int, factor: float = 0.25,
                        stages: int | None = None) -> float:
    """Sparsity at 1-based optimizer step ``step`` under DGC's exponential warm-up (Sec. 3.3).

    Parameters
    ----------
    step : int
        1-based step (``>= 1``).
    target : float
        Final sparsity in ``[0, 1)``.
    warmup_steps : int
        Length of the warm-up in steps (0: ``target`` from the start).
    factor : float
        Density kept per stage (DGC: 0.25, i.e. 75%, 93.75%, 98.4375%, ...).
    stages : int, optional
        Number of equal stages (default :func:`dgc_warmup_stages`; DGC: 4, one per epoch). With more
        stages than needed the last ones sit at ``target``.

    Returns
    -------
    float
        ``min(target, 1 - factor ** (i + 1))`` with ``i = floor((step - 1) * stages / warmup_steps)``
        while ``step <= warmup_steps``, else ``target``.

    Raises
    ------
    OptimizerConfigError
        A bad argument (named).

    Examples
    --------
    >>> [dgc_warmup_sparsity(t, 0.99, 400) for t in (1, 100, 101, 201, 301, 400, 401)]
    [0.75, 0.75, 0.9375, 0.984375, 0.99, 0.99, 0.99]
    """
    _check(target, warmup_steps, factor)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise OptimizerConfigError("sparsity warm-up", "step", step, "an int >= 1 (1-based)")
    if stages is None:
        stages = dgc_warmup_stages(target, factor)
    elif isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise OptimizerConfigError("sparsity warm-up", "stages", stages, "an int >= 1")
    if warmup_steps == 0 or step > warmup_steps:
        return float(target)
    i = (step - 1) * stages // warmup_steps
    return float(min(target, 1.0 - factor ** (i + 1)))
