"""Placement: choose the site for a job from live queue and resource state (Diamond Agent, placement skill).

Each policy sees, per site, what can be known at submission time: whether the site
accepts the request (:meth:`lab.hpc.sites.Site.check`), its live queue
(:meth:`~lab.hpc.schedulers.base.Scheduler.queue`), the scheduler's estimated start
for this request (:meth:`~lab.hpc.schedulers.base.Scheduler.estimated_start`:
Slurm's backfill via ``sbatch --test-only``), and how long moving the job's input
there would take.

The policies are pure functions over one site-view protocol (:class:`SiteView`:
``site``, ``eligible``, ``pending``, ``free``, ``predicted_completion``), the only copy
of each: :func:`place` applies them to live :class:`Candidate` s, and the trace replay
(``benchmarks.placement_replay``) to :class:`SiteState` s built from
:meth:`lab.hpc.sim.SiteTimeline.observe` with a :class:`lab.hpc.sim.QueuePredictor`'s
predicted completion. Policies (:data:`POLICIES`):

``fixed_site``
    always the named (home) site: the baseline of the paper's evaluation.
``least_pending``
    fewest pending jobs, ties broken by more free (idle) processors.
``idle_first``
    among the sites with at least the job's processors free now, the least pending;
    when none has, the least pending of all (the simple heuristic a user applies).
``earliest_completion``
    smallest predicted completion (optionally, predictions within ``tie_within_s`` of the best
    count as ties, broken by ``least_pending``'s key); live, predicted completion =
    max(now, estimated start, data arrival) + requested walltime, where data arrival =
    now + transfer estimate (the job cannot start before its input is there).

Ties: after its own key every policy breaks ties by site name (lexicographic,
:func:`str` order), whatever order the sites are listed in, so the same views give the
same choice everywhere. Only eligible sites are chosen (``fixed_site`` raises when its
home is not eligible).

Every :class:`PlacementDecision` keeps the inputs each site showed (a
:class:`Candidate` per site) so a decision can be replayed and audited.
Times are epoch seconds (UTC), durations seconds, data sizes bytes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, Field

from lab.hpc.errors import PlacementError, PolicyViolation, SchedulerError  # PlacementError: defined in lab.hpc.errors, re-exported here
from lab.hpc.schedulers.base import JobSpec, Scheduler
from lab.hpc.sites import Site

__all__ = [
    "Candidate",
    "PlacementDecision",
    "PlacementError",
    "POLICIES",
    "SiteView",
    "SiteState",
    "choose",
    "earliest_completion",
    "fixed_site",
    "idle_first",
    "least_pending",
    "place",
]

#: The policies the skills expose (``choose_site``, ``submit_task``).
PolicyName = Literal["fixed_site", "least_pending", "earliest_completion"]
#: Every policy :func:`place` and :func:`choose` know.
AnyPolicyName = Literal["fixed_site", "least_pending", "idle_first", "earliest_completion"]


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

    @property
    def free(self) -> int:
        """Idle CPUs the site showed (0 when unknown): the :class:`SiteView` field."""
        return int(self.idle_cpus or 0)


class PlacementDecision(BaseModel):
    """A placement, with everything it was based on."""

    policy: str
    chosen: str
    time: float
    spec: JobSpec
    candidates: list[Candidate]

    def candidate(self, site: str) -> Candidate:
        return next(c for c in self.candidates if c.site == site)


# --------------------------------------------------------------------------------------------- policies


@runtime_checkable
class SiteView(Protocol):
    """What a placement policy reads of one site (the one protocol every policy takes).

    Attributes
    ----------
    site : str
        The site's name (ties are broken by it).
    eligible : bool
        Whether the site can take the job at all (its limits allow it, it answers).
    pending : int or None
        Jobs pending in its queue (None when unknown: only for ineligible sites).
    free : int
        Processors (CPUs, or nodes where the site counts nodes) idle and usable now; 0 when down.
    predicted_completion : float or None
        Predicted completion of the job there, seconds on any common clock (epoch seconds live,
        seconds after submission in the replay); None when not predicted.
    """

    @property
    def site(self) -> str: ...

    @property
    def eligible(self) -> bool: ...

    @property
    def pending(self) -> int | None: ...

    @property
    def free(self) -> int: ...

    @property
    def predicted_completion(self) -> float | None: ...


@dataclass(frozen=True)
class SiteState:
    """A plain :class:`SiteView` (what the trace replay builds from a :class:`lab.hpc.sim.SiteObservation`)."""

    site: str
    pending: int
    free: int
    predicted_completion: float | None = None
    eligible: bool = True


V = TypeVar("V", bound=SiteView)


def _eligible(views: Iterable[V], policy: str) -> list[V]:
    out = [v for v in views if v.eligible]
    if not out:
        raise PlacementError(f"{policy}: no eligible site among {[v.site for v in views]}")
    return out


def fixed_site(views: Sequence[V], *, home: str) -> V:
    """The view of ``home``.

    Raises
    ------
    PlacementError
        No view is named ``home``, or that site is not eligible (its reason is quoted when it has one).
    """
    for v in views:
        if v.site == home:
            if not v.eligible:
                raise PlacementError(f"fixed_site: home site {home!r} cannot take the job: {getattr(v, 'reason', None)}")
            return v
    raise PlacementError(f"fixed_site: no site named {home!r} among {[v.site for v in views]}")


def _least_pending_key(v: SiteView) -> tuple:
    return (v.pending if v.pending is not None else math.inf, -int(v.free), v.site)


def least_pending(views: Sequence[V]) -> V:
    """The eligible site with the fewest pending jobs; ties: more free processors, then site name.

    Raises
    ------
    PlacementError
        No site is eligible.
    """
    return min(_eligible(views, "least_pending"), key=_least_pending_key)


def idle_first(views: Sequence[V], *, processors: int) -> V:
    """Among the eligible sites with at least ``processors`` free now, the least pending
    (:func:`least_pending`'s key); when none has, :func:`least_pending` over all eligible sites.

    Raises
    ------
    PlacementError
        No site is eligible.
    """
    ok = _eligible(views, "idle_first")
    idle = [v for v in ok if int(v.free) >= int(processors)]
    return min(idle or ok, key=_least_pending_key)


def earliest_completion(views: Sequence[V], *, tie_within_s: float = 0.0) -> V:
    """The eligible site with the smallest ``predicted_completion`` (None counts as never); ties: site name.

    Parameters
    ----------
    views : sequence of SiteView
    tie_within_s : float
        Seconds, >= 0. Sites predicted to complete within this of the best are taken as tied (the
        predictions cannot tell them apart) and :func:`least_pending`'s key decides among them (fewest
        pending, then more free processors, then name): the exact live signals break what the forecast
        cannot. 0 (default): the smallest prediction, ties by name.

    Raises
    ------
    PlacementError
        No site is eligible, or ``tie_within_s`` is negative or not finite.
    """

    def pred(v: SiteView) -> float:
        c = v.predicted_completion
        return math.inf if c is None or math.isnan(c) else float(c)

    ok = _eligible(views, "earliest_completion")
    if not (math.isfinite(tie_within_s) and tie_within_s >= 0):
        raise PlacementError(f"earliest_completion: tie_within_s must be a finite number of seconds >= 0, not {tie_within_s!r}")
    best = min(ok, key=lambda v: (pred(v), v.site))
    if tie_within_s == 0 or not math.isfinite(pred(best)):
        return best
    near = [v for v in ok if pred(v) <= pred(best) + tie_within_s]
    return min(near, key=_least_pending_key)


#: Policy name -> function ``(views, *, home, processors) -> view``.
POLICIES: dict[str, Callable[..., SiteView]] = {
    "fixed_site": lambda views, *, home=None, processors=1: fixed_site(views, home=_need_home(home)),
    "least_pending": lambda views, *, home=None, processors=1: least_pending(views),
    "idle_first": lambda views, *, home=None, processors=1: idle_first(views, processors=processors),
    "earliest_completion": lambda views, *, home=None, processors=1, tie_within_s=0.0: earliest_completion(views, tie_within_s=tie_within_s),
}


def _need_home(home: str | None) -> str:
    if home is None:
        raise PlacementError("fixed_site needs home=<site name>")
    return home


def choose(policy: str, views: Sequence[V], *, home: str | None = None, processors: int = 1, tie_within_s: float = 0.0) -> V:
    """The view ``policy`` picks.

    Parameters
    ----------
    policy : {"fixed_site", "least_pending", "idle_first", "earliest_completion"}
    views : sequence of SiteView
        One per site (any order: ties go by site name).
    home : str, optional
        The site ``fixed_site`` always picks.
    processors : int
        The job's processors (``idle_first`` compares them with each site's ``free``).
    tie_within_s : float
        ``earliest_completion`` only (:func:`earliest_completion`); ignored by the others.

    Raises
    ------
    PlacementError
        Unknown policy, ``fixed_site`` without ``home``, or no eligible site.
    """
    if policy not in POLICIES:
        raise PlacementError(f"unknown placement policy {policy!r}; choose one of {sorted(POLICIES)}")
    if policy == "earliest_completion":
        return POLICIES[policy](views, home=home, processors=processors, tie_within_s=tie_within_s)
    return POLICIES[policy](views, home=home, processors=processors)


def place(
    spec: JobSpec,
    sites: Mapping[str, Site],
    schedulers: Mapping[str, Scheduler],
    policy: AnyPolicyName = "earliest_completion",
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
    policy : {"fixed_site", "least_pending", "idle_first", "earliest_completion"}
        See :data:`POLICIES` (``idle_first`` compares ``spec.ntasks`` with each site's idle CPUs).
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
        Every site refuses the request or is unavailable (the message lists each site's reason),
        an unknown policy, or ``fixed_site`` without ``home`` or with an ineligible home.
    """
    if policy not in POLICIES:
        raise PlacementError(f"unknown placement policy {policy!r}; choose one of {sorted(POLICIES)}")
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
    chosen = choose(policy, candidates, home=home, processors=spec.ntasks)
    return PlacementDecision(policy=policy, chosen=chosen.site, time=now, spec=spec, candidates=candidates)
