"""Training facet: low-precision and sparse gradient communication (GIFT, SCAPE), optimizers and monitoring.

Submodules
----------
comm
    Gradient codecs (:mod:`lab.training.comm.codecs`: FP8 E4M3/E5M2, NVFP4, fp32 baseline) and, as the
    facet grows, the GIFT transform and DDP communication hooks.
optim
    AdamS and SCAPE (:mod:`lab.training.optim`: sparse, mask-synchronised AdamS communication).
errors
    :class:`~lab.training.errors.TrainingError` and its subclasses.
"""

from lab.training.errors import CodecError, NonFiniteError, TrainingError

__all__ = ["CodecError", "NonFiniteError", "TrainingError"]
