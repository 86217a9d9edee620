"""Operator-level performance model of distributed GPT training (issue #25).

Re-implements Zhang et al., "Efficient Fine-Grained GPU Performance Modeling for Distributed Deep Learning
of LLM" (arXiv 2509.22832, HiPC 2025): the operator decomposition with FLOP and byte counts
(:mod:`~lab.training.perfmodel.operators`), the pipeline composition (:mod:`~lab.training.perfmodel.compose`),
hardware description files (:mod:`~lab.training.perfmodel.hardware`), the roofline baseline
(:mod:`~lab.training.perfmodel.roofline`), the sampler that times each primitive alone
(:mod:`~lab.training.perfmodel.profile`, on the functions of :mod:`~lab.training.perfmodel.primitives`), the
per-operator tree-ensemble regressors (:mod:`~lab.training.perfmodel.regress`), the measured gloo collectives
per network tier (:mod:`~lab.training.perfmodel.comm`), the learned predictor and its in-situ calibration
(:mod:`~lab.training.perfmodel.predict`) and the measured DP / TP / PP training steps it is validated against
(:mod:`~lab.training.perfmodel.parallel`). ``python -m benchmarks.perfmodel`` runs the whole comparison.
"""

from lab.training.perfmodel.compose import StepPrediction, compose, simulate_pipeline
from lab.training.perfmodel.config import BYTES_PER_ELEMENT, PerfConfig
from lab.training.perfmodel.hardware import Hardware, available_hardware, load_hardware
from lab.training.perfmodel.operators import Operator, decompose, stage_parameters
from lab.training.perfmodel.roofline import Roofline, collective_time

__all__ = ["BYTES_PER_ELEMENT", "Hardware", "Operator", "PerfConfig", "Roofline", "StepPrediction",
           "available_hardware", "collective_time", "compose", "decompose", "load_hardware",
           "simulate_pipeline", "stage_parameters"]
