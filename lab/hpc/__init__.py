"""Federated HPC facet: SWF workload traces, queue replay, (later) sites, schedulers, placement, transfer.

Submodules
----------
swf
    Standard Workload Format reader/writer (:func:`~lab.hpc.swf.read_swf`).
queue
    Vectorized replay of a trace's queue state (:class:`~lab.hpc.queue.QueueReplay`).
errors
    :class:`~lab.hpc.errors.HPCError` and its subclasses.
"""

from lab.hpc.errors import HPCError, ReplayError, SWFError
from lab.hpc.queue import QueueReplay, QueueSnapshot
from lab.hpc.swf import SWFHeader, SWFTrace, load_trace, parse_swf, read_swf, write_swf

__all__ = [
    "HPCError",
    "ReplayError",
    "SWFError",
    "SWFHeader",
    "SWFTrace",
    "QueueReplay",
    "QueueSnapshot",
    "load_trace",
    "parse_swf",
    "read_swf",
    "write_swf",
]
