"""Placement: choose the site for a job from live queue and resource state (Diamond Agent, placement skill).

Each policy sees, per site, what can be known at submission time: whether the site
accepts the request (:meth:`lab.hpc.sites.Site.check`), its live queue
(:meth:`~lab.hpc.schedulers.base.Scheduler.queue`), the scheduler's estimated start
for this request (:meth:`~lab.hpc.schedulers.base.Scheduler.estimated_start`:
Slurm's backfill via ``sbatch --test-only``), and how long moving the job's input
there would take. Policies:

``fixed_site``
    always the named (home) site: the baseline of the paper's evaluation.
``least_pending``
    fewest pending jobs, ties broken by more idle CPUs.
``earliest_completion``
    smallest predicted completion = max(now, estimated start, data arrival)
    + requested walltime, where data arrival = now + transfer estimate
    (the job cannot start before its input is there).

Every :class:`PlacementDecision` keeps the inputs each site showed (a
:class:`Candidate` per site) so a decision can be replayed and audited.
Times are epoch seconds (UTC), durations seconds, data sizes bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, Field

from lab.hpc.errors import HPCError, PolicyViolation, SchedulerError
from lab.hpc.schedulers.base import JobSpec, Scheduler
from lab.hpc.sites import Site

__all__ = ["Candidate", "PlacementDecision", "PlacementError", "POLICIES", "place"]

PolicyName = Literal["fixed_site", "least_pending", "earliest_completion"]


class PlacementError(HPCError):
    """No site can take the job (all refuse it or are unavailable); the message lists why, per site."""


class Candidate(BaseModel):
    """What one site showed when the decision was made."""

    site: str
    eligible: bool
    reason: str | None = Field(None, description="why the site is not eligible")
    pending: int | None = None
    running: int | None = None
    idle_cpus: int | None = None
    total_cpus: int | None = None
    estimated_start: float | None = Field(None, description="epoch s; the scheduler's estimate for this request")
    transfer_s: float = Field(0.0, description="seconds to move the job's input to the site")
    walltime_s: int = 0
    predicted_completion: float | None = Field(None, description="epoch s")


class PlacementDecision(BaseModel):
    """A placement, with everything it was based on."""

    policy: str
    chosen: str
    time: float
    spec: JobSpec
    candidates: list[Candidate]

    def candidate(self, site: str) -> Candidate:
        return next(c for c in self.candidates if c.site == site)


def _fixed(home: str | None):
    def choose(candidates: list[Candidate]) -> Candidate:
        if home is None:
            raise ValueError("fixed_site needs home=<site name>")
        for c in candidates:
            if c.site == home:
                if not c.eligible:
                    raise PlacementError(f"fixed_site: home site {home!r} cannot take the job: {c.reason}")
                return c
        raise PlacementError(f"fixed_site: no site named {home!r} among {[c.site for c in candidates]}")

    return choose


def _least_pending(candidates: list[Candidate]) -> Candidate:
    return min((c for c in candidates if c.eligible), key=lambda c: (c.pending, -(c.idle_cpus or 0), c.site))


def _earliest_completion(candidates: list[Candidate]) -> Candidate:
    return min((c for c in candidates if c.eligible), key=lambda c: (c.predicted_completion, c.site))


POLICIES: dict[str, Callable[..., object]] = {
    "fixed_site": _fixed,
    "least_pending": lambda home=None: _least_pending,
    "earliest_completion": lambda home=None: _earliest_completion,
}


def place(
    spec: JobSpec,
    sites: Mapping[str, Site],
    schedulers: Mapping[str, Scheduler],
    policy: PolicyName = "earliest_completion",
    *,
    home: str | None = None,
    transfer_s: Mapping[str, float] | None = None,
    now: float | None = None,
) -> PlacementDecision:
    """Choose a site for ``spec``.

    Parameters
    ----------
    spec : JobSpec
        The request (site-independent; each site's :meth:`~lab.hpc.sites.Site.check` completes it).
    sites, schedulers : mapping of site name to Site / Scheduler
        The federation and a connected adapter per site.
    policy : {"fixed_site", "least_pending", "earliest_completion"}
    home : str, optional
        The site ``fixed_site`` always picks.
    transfer_s : mapping of site name to seconds, optional
        Estimated time to move the job's input to each site (0 where absent), e.g. from
        :meth:`lab.hpc.transfer.TransferBackend.estimate_s`.
    now : float, optional
        Decision time, epoch seconds (default: the clock).

    Returns
    -------
    PlacementDecision

    Raises
    ------
    PlacementError
        Every site refuses the request or is unavailable (the message lists each site's reason).
    ValueError
        Unknown policy, or ``fixed_site`` without ``home``.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; choose one of {sorted(POLICIES)}")
    now = time.time() if now is None else now
    transfer_s = transfer_s or {}
    candidates = []
    for name, site in sites.items():
        cand = Candidate(site=name, eligible=False, walltime_s=spec.walltime_s, transfer_s=float(transfer_s.get(name, 0.0)))
        try:
            site_spec = site.check(spec)
            sched = schedulers[name]
            queue = sched.queue()
            start = sched.estimated_start(site_spec)
        except PolicyViolation as exc:
            cand.reason = str(exc)
        except SchedulerError as exc:  # includes SiteUnavailable: the site shows as unavailable, the others go on
            cand.reason = f"unavailable: {exc}"
        else:
            cand.eligible = True
            cand.pending, cand.running = queue.pending, queue.running
            cand.idle_cpus, cand.total_cpus = queue.idle_cpus, queue.total_cpus
            cand.estimated_start = start
            ready = max(now, start if start is not None else now, now + cand.transfer_s)
            cand.predicted_completion = ready + spec.walltime_s
        candidates.append(cand)
    if policy != "fixed_site" and not any(c.eligible for c in candidates):
        raise PlacementError("no site can take the job: " + "; ".join(f"{c.site}: {c.reason}" for c in candidates))
    chosen = POLICIES[policy](home)(candidates)
    return PlacementDecision(policy=policy, chosen=chosen.site, time=now, spec=spec, candidates=candidates)
