"""Scheduler adapters behind one interface (:class:`~lab.hpc.schedulers.base.Scheduler`)."""

from lab.hpc.schedulers.base import TERMINAL_STATES, Capabilities, JobSpec, JobState, JobStatus, Scheduler, SiteQueue

__all__ = ["TERMINAL_STATES", "Capabilities", "JobSpec", "JobState", "JobStatus", "Scheduler", "SiteQueue"]
