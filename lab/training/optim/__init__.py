"""Optimizers of the training facet: AdamS and SCAPE (sparse-communication AdamS).

Modules
-------
adams
    :class:`~lab.training.optim.adams.AdamS` (arXiv 2505.16363): Adam without a second-moment
    state, ``m_t / (sqrt(beta2 m_{t-1}^2 + (1 - beta2) g_t^2) + eps)``, decoupled weight decay,
    bias correction as the official code (``bias_correction=False`` for the paper's formula);
    :func:`~lab.training.optim.adams.adams_update_`, the element-wise kernel both optimizers share.
scape
    :class:`~lab.training.optim.scape.SCAPE` (arXiv 2607.01678 §4): data-parallel AdamS whose only
    per-step gradient collective is one all_reduce of the ``k`` gradient values at a mask chosen
    from the first moment one step earlier (partitioned across ranks, synced by an async
    all_gather that overlaps compute); unmasked coordinates frozen; error feedback and mask
    exploration against 99%-sparsity lock-in; exact per-step byte accounting
    (:class:`~lab.training.optim.scape.ScapeStepStats`) and mask coverage.

Errors: :class:`~lab.training.errors.OptimizerConfigError` (a ``ValueError`` naming the bad
hyper-parameter) and :class:`~lab.training.errors.ScapeError`, both
:class:`~lab.training.errors.TrainingError` (re-exported here). SCAPE's options as one validated,
frozen value: :class:`~lab.training.optim.scape.ScapeConfig`.
"""

from lab.training.optim.adams import AdamS, OptimizerConfigError, adams_update_
from lab.training.optim.scape import SCAPE, ScapeConfig, ScapeError, ScapeStepStats

__all__ = ["AdamS", "OptimizerConfigError", "SCAPE", "ScapeConfig", "ScapeError", "ScapeStepStats", "adams_update_"]
