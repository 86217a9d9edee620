"""Operator-level performance model of distributed GPT training (issue #25; in progress).

Re-implements the analytical half of Zhang et al., "Efficient Fine-Grained GPU Performance Modeling for
Distributed Deep Learning of LLM" (arXiv 2509.22832, HiPC 2025): the operator decomposition with FLOP
and byte counts (:mod:`~lab.training.perfmodel.operators`), the pipeline composition
(:mod:`~lab.training.perfmodel.compose`), hardware description files
(:mod:`~lab.training.perfmodel.hardware`) and the roofline baseline
(:mod:`~lab.training.perfmodel.roofline`). The profiled per-operator regressors come later.
"""

from lab.training.perfmodel.compose import StepPrediction, compose, simulate_pipeline
from lab.training.perfmodel.config import BYTES_PER_ELEMENT, PerfConfig
from lab.training.perfmodel.hardware import Hardware, available_hardware, load_hardware
from lab.training.perfmodel.operators import Operator, decompose, stage_parameters
from lab.training.perfmodel.roofline import Roofline, collective_time

__all__ = ["BYTES_PER_ELEMENT", "Hardware", "Operator", "PerfConfig", "Roofline", "StepPrediction",
           "available_hardware", "collective_time", "compose", "decompose", "load_hardware",
           "simulate_pipeline", "stage_parameters"]
