"""Scheduler adapters behind one interface (:class:`~lab.hpc.schedulers.base.Scheduler`), found by name.

Importing this package registers the built-in adapters: ``"local"``
(:class:`~lab.hpc.schedulers.local.LocalScheduler`) and ``"slurm"``
(:class:`~lab.hpc.schedulers.slurm.SlurmScheduler`). Another adapter registers itself with
:func:`~lab.hpc.schedulers.base.register_scheduler` and is then named by a site's ``scheduler`` field.
"""

from lab.hpc.schedulers.base import (
    TERMINAL_STATES,
    Capabilities,
    JobSpec,
    JobState,
    JobStatus,
    Scheduler,
    SiteQueue,
    register_scheduler,
    scheduler_class,
    scheduler_names,
)
from lab.hpc.schedulers import local as _local, slurm as _slurm  # noqa: E402,F401  (register "local", "slurm")

__all__ = [
    "TERMINAL_STATES", "Capabilities", "JobSpec", "JobState", "JobStatus", "Scheduler", "SiteQueue",
    "register_scheduler", "scheduler_class", "scheduler_names",
]
