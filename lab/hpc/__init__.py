"""Federated HPC facet: workload traces, queue replay, sites, schedulers, placement, data movement, continuation.

Submodules
----------
swf, queue
    Standard Workload Format traces (:func:`~lab.hpc.swf.read_swf`) and their vectorized queue
    replay (:class:`~lab.hpc.queue.QueueReplay`).
sites, schedulers, testbed
    Typed site descriptions (:class:`~lab.hpc.sites.Site`), scheduler adapters behind one interface,
    registered by name (Slurm through its CLI, a local subprocess scheduler, or your own:
    :func:`~lab.hpc.schedulers.base.register_scheduler`), and real local Slurm sites for tests and demos.
skills, mcp_server
    The agent's typed skills over a :class:`~lab.hpc.skills.Federation`, also served over MCP.
placement, transfer, continuation, live
    Site choice from live queues, verified data movement (the :mod:`lab.hpc.transfer` package: base,
    local, globus), the event-driven
    continuation service, and the live view the dashboard shows.
sim
    Trace-driven site models (EASY backfill, probe insertion, start-time predictor) for the placement benchmark.
errors
    :class:`~lab.hpc.errors.HPCError` and its subclasses: every error a user can trigger in the facet
    (``ArgumentError`` names the function, argument and value; ``SiteError``/``UnknownSchedulerError``
    the file and field; ``PlacementError``, ``ContinuationError``, ``TestbedError`` live there too).
"""

from lab.hpc.errors import (
    ArgumentError,
    ContinuationError,
    HPCError,
    PlacementError,
    PolicyViolation,
    ReplayError,
    SchedulerError,
    SiteError,
    SiteUnavailable,
    SWFError,
    TestbedError,
    TransferError,
    UnknownSchedulerError,
)
from lab.hpc.queue import QueueReplay, QueueSnapshot
from lab.hpc.sites import Site, load_site, load_sites
from lab.hpc.swf import SWFHeader, SWFTrace, load_trace, parse_swf, read_swf, write_swf

__all__ = [
    "ArgumentError",
    "ContinuationError",
    "PlacementError",
    "TestbedError",
    "UnknownSchedulerError",
    "HPCError",
    "PolicyViolation",
    "ReplayError",
    "SchedulerError",
    "SiteError",
    "SiteUnavailable",
    "SWFError",
    "TransferError",
    "SWFHeader",
    "SWFTrace",
    "QueueReplay",
    "QueueSnapshot",
    "Site",
    "load_site",
    "load_sites",
    "load_trace",
    "parse_swf",
    "read_swf",
    "write_swf",
]
