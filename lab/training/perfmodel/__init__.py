"""Operator-level performance model of distributed GPT training (issue #25; in progress).

Re-implements the analytical half of Zhang et al., "Efficient Fine-Grained GPU Performance Modeling for
Distributed Deep Learning of LLM" (arXiv 2509.22832, HiPC 2025): the operator decomposition with FLOP
and byte counts (:mod:`~lab.training.perfmodel.operators`), the pipeline composition
(:mod:`~lab.training.perfmodel.compose`), hardware description files
(:mod:`~lab.training.perfmodel.hardware`) and the roofline baseline
(:mod:`~lab.training.perfmodel.roofline`). The profiled per-operator regressors come later.
"""

from lab.training.perfmodel.config import BYTES_PER_ELEMENT, PerfConfig
from lab.training.perfmodel.operators import Operator, decompose, stage_parameters

__all__ = ["BYTES_PER_ELEMENT", "Operator", "PerfConfig", "decompose", "stage_parameters"]
