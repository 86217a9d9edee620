"""Roofline + alpha-beta predictor: the analytical baseline the learned model has to beat.

Compute operator (Williams, Waterman and Patterson, "Roofline", CACM 2009)::

    t = max(FLOPs / peak, bytes / memory_bandwidth)

with ``peak`` the precision's tensor-core rate for matmuls and the fp32 vector rate otherwise
(:meth:`Hardware.peak`). Collective, per call, on the link tier its group uses (:meth:`Hardware.link`),
``n`` ranks, message ``S`` bytes, latency ``alpha``, per-direction bandwidth ``beta`` (Thakur,
Rabenseifner and Gropp 2005, ring algorithms; Chan et al. 2007)::

    all_reduce      2 (n - 1) alpha + 2 (n - 1) / n * S / beta
    all_gather      (n - 1) alpha + (n - 1) / n * S / beta      (S = gathered size)
    reduce_scatter  (n - 1) alpha + (n - 1) / n * S / beta      (S = input size)
    send_recv       alpha + S / beta

and zero for ``n = 1`` or ``S = 0``. Operator times then compose by
:func:`lab.training.perfmodel.compose.compose`. Like ``llm-analysis``'s analytical model this assumes
every kernel reaches peak on its bound; it has no kernel launch overheads, no efficiency curves and no
contention, which is what the measured regressors are for.
"""

from __future__ import annotations

from lab.training.perfmodel.compose import StepPrediction, compose
from lab.training.perfmodel.config import PerfConfig
from lab.training.perfmodel.hardware import Hardware
from lab.training.perfmodel.operators import Operator, decompose

__all__ = ["Roofline", "collective_time"]


def collective_time(kind: str, n: int, message_bytes: float, alpha: float, beta: float) -> float:
    """Alpha-beta time (seconds) of one collective call (formulas in the module docstring).

    Parameters
    ----------
    kind : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    n : int
        Ranks in the group.
    message_bytes : float
        ``S`` in bytes.
    alpha : float
        Latency per message, seconds.
    beta : float
        Bandwidth per direction, B/s.

    Raises
    ------
    ValueError
        Unknown ``kind``.
    """
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * message_bytes / beta
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) * alpha + (n - 1) / n * message_bytes / beta
    if kind == "send_recv":
        return alpha + message_bytes / beta
    raise ValueError(f"unknown collective {kind!r}")


class Roofline:
    """Per-operator roofline / alpha-beta times on one hardware description.

    Parameters
    ----------
    hardware : Hardware
        From :func:`lab.training.perfmodel.hardware.load_hardware`.
    precision : str
        ``PerfConfig.precision`` (which peak a matmul gets).
    """

    def __init__(self, hardware: Hardware, precision: str):
        self.hardware, self.precision = hardware, precision

    def op_time(self, op: Operator, direction: str) -> float:
        """Seconds of ``op`` in ``direction`` (``"fwd"`` or ``"bwd"``), all its ``calls`` together."""
        flops = op.fwd_flops if direction == "fwd" else op.bwd_flops
        nbytes = op.fwd_bytes if direction == "fwd" else op.bwd_bytes
        if op.collective is not None:
            link = self.hardware.link(op.group_size, op.group_stride)
            return op.calls * collective_time(op.collective, op.group_size, nbytes, link.latency.value,
                                              link.bandwidth.value)
        t = 0.0
        if flops:
            t = flops / self.hardware.peak(self.precision, op.matmul)
        if nbytes:
            t = max(t, nbytes / self.hardware.memory_bandwidth.value)
        return op.calls * t

    def __call__(self, op: Operator, direction: str) -> float:
        return self.op_time(op, direction)

    @classmethod
    def predict(cls, config: PerfConfig, hardware: Hardware, **compose_kw) -> StepPrediction:
        """Roofline step time of ``config`` on ``hardware``.

        Parameters
        ----------
        config : PerfConfig
        hardware : Hardware
        **compose_kw
            ``schedule``, ``method``, ``overlap_grad_sync`` of :func:`~lab.training.perfmodel.compose.compose`.
        """
        return compose(config, decompose(config), cls(hardware, config.precision), **compose_kw)
