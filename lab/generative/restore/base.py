"""The common shape of a restoration method (private to ``lab.generative.restore``).

A method is a small class: constructed with its hyper-parameters (validated once, the only state,
like a diffusers scheduler's config), then called on ``(y, operator, prior, nfe, generator)``.
Its ``run`` reads like the paper's algorithm box. :func:`lab.generative.restore.restore` builds it,
seeds the generator, times the call and checks the prior's evaluation counter against ``nfe``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from lab.generative.errors import MethodError, NFEBudgetError

__all__ = ["RestorationMethod", "RestorationResult", "METHODS", "register", "TimeStep", "timesteps"]


class TimeStep(NamedTuple):
    """One step of a time grid (see :func:`timesteps`)."""

    #: step index, 0 .. K-1
    k: int
    #: the query time ``t_k``
    t: float
    #: the step size: ``(end - start) / K`` exactly on a uniform grid, ``t_{k+1} - t_k`` otherwise
    dt: float
    #: ``t_{k+1}`` (``end`` exactly at the last step)
    t_next: float


def timesteps(K: int, start: float = 0.0, end: float = 1.0, power: float = 1.0) -> list[TimeStep]:
    """The time grid every method iterates: ``t_k = start + (end - start) (k / K)^power``, k = 0 .. K-1.

    The one copy of the grid rule (as a diffusers scheduler exposes ``timesteps``): ReBridge-Flow,
    Flower and PnP-Flow use ``timesteps(K)`` (``t_k = k / K``, ``dt = 1 / K``), OT-ODE
    ``timesteps(K, start=t0)``, D-Flow's Euler/midpoint solves ``timesteps(steps)``, the re-coupled
    ADMM variant ``timesteps(K, end=t_max, power=grid_power)`` and :meth:`FlowPrior.sample
    <lab.generative.priors.FlowPrior.sample>` ``timesteps(nfe)``.

    Parameters
    ----------
    K : int >= 1
        Number of steps (query times in ``[start, end)``).
    start, end : float, ``0 <= start < end <= 1``
        Flow times of the first query and of the end point.
    power : float > 0
        Grid warping; 1 is uniform.

    Returns
    -------
    list of TimeStep ``(k, t, dt, t_next)``, length ``K``.

    Raises
    ------
    MethodError
        ``K`` not an integer >= 1, or ``start``, ``end``, ``power`` out of range.
    """
    if int(K) != K or K < 1:
        raise MethodError(f"timesteps: K must be an integer >= 1, got {K!r}")
    K, start, end, power = int(K), float(start), float(end), float(power)
    if not (0.0 <= start < end <= 1.0):
        raise MethodError(f"timesteps: need 0 <= start < end <= 1, got start={start!r}, end={end!r}")
    if not power > 0 or power == float("inf"):
        raise MethodError(f"timesteps: power must be > 0 and finite, got {power!r}")
    span = end - start
    ts = [start + span * (k / K) ** power for k in range(K)] + [end]
    uniform = span / K
    return [TimeStep(k, ts[k], uniform if power == 1.0 else ts[k + 1] - ts[k], ts[k + 1]) for k in range(K)]


@dataclass
class RestorationResult:
    """What a restoration returns.

    Attributes
    ----------
    x : tensor (B, C, H, W)
        The restored images, same device and dtype as ``y``, on the [-1, 1] scale (not clipped).
    method : str
        Registry name of the method.
    nfe : int
        Prior evaluations actually used (0 for ``bayes``).
    seed : int or None
    hyper : dict
        The resolved hyper-parameters (defaults filled in, per-task defaults resolved).
    seconds : float
        Wall-clock time of the method call (device synchronised).
    trajectory : list or None
        Per-step records for methods that keep them (ReBridge-Flow: :class:`~lab.generative.restore.rebridge.BridgeStep`;
        the re-coupled ADMM variant: :class:`~lab.generative.restore.recoupled_admm.ADMMStep`).
    hyper_source : str
        Where the hyper-parameters came from: ``"paper"`` (the method's defaults, per-task defaults
        included) or ``"tuned:<prior kind>@nfe=<n>"`` (``lab/generative/restore/tuned.json``); keyword
        arguments given to :func:`~lab.generative.restore.restore` override either and add ``"+explicit"``.
    """

    x: torch.Tensor
    method: str
    nfe: int
    seed: int | None
    hyper: dict
    seconds: float = 0.0
    trajectory: list | None = None
    hyper_source: str = "paper"


class RestorationMethod:
    """Base class. Subclasses set ``name``, ``paper``, a ``Config`` dataclass and implement ``run``.

    ``Config`` fields are the hyper-parameters, named as in the paper; a field whose default is
    ``None`` takes a per-task default from ``TASK_DEFAULTS[operator.name]`` at call time.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: False for methods that use no network evaluation (``bayes``)
    uses_nfe: ClassVar[bool] = True
    #: per-task defaults: operator name -> {field: value}
    TASK_DEFAULTS: ClassVar[dict[str, dict[str, Any]]] = {}
    #: keyword aliases accepted by the constructor (e.g. "lambda" -> "lam")
    ALIASES: ClassVar[dict[str, str]] = {}

    @dataclass(frozen=True)
    class Config:
        pass

    def __init__(self, **hyper):
        hyper = {self.ALIASES.get(k, k): v for k, v in hyper.items()}
        names = {f.name for f in dataclasses.fields(self.Config)}
        unknown = sorted(set(hyper) - names)
        if unknown:
            raise MethodError(f"{self.name}: unknown hyper-parameter(s) {unknown}; known: {sorted(names)}")
        self.config = self.Config(**hyper)
        self.validate(self.config)

    def validate(self, config) -> None:
        """Check hyper-parameter values; raise :class:`MethodError` naming the bad one."""

    def resolve(self, operator) -> Any:
        """The config with ``None`` fields filled from ``TASK_DEFAULTS`` for this operator's task."""
        task = self.TASK_DEFAULTS.get(getattr(operator, "name", ""), {})
        updates = {k: v for k, v in task.items() if getattr(self.config, k) is None}
        cfg = dataclasses.replace(self.config, **updates)
        missing = [f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) is None and f.metadata.get("required")]
        if missing:
            raise MethodError(f"{self.name}: no default for {missing} on task {getattr(operator, 'name', '?')!r}; pass them explicitly")
        self.validate(cfg)
        return cfg

    def run(self, y, operator, prior, nfe: int, generator: torch.Generator, cfg) -> tuple[torch.Tensor, list | None]:
        """The algorithm: returns the restored batch and an optional trajectory."""
        raise NotImplementedError  # pragma: no cover

    @staticmethod
    def _check_positive(name: str, value, method: str, allow_zero: bool = True) -> None:
        v = float(value)
        if not (v >= 0 if allow_zero else v > 0) or v != v or v == float("inf"):
            raise MethodError(f"{method}: {name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {value!r}")

    @staticmethod
    def _split_budget(nfe: int, per_step: int, method: str, what: str = "steps") -> int:
        if nfe % per_step:
            raise NFEBudgetError(f"{method}: nfe={nfe} is not a multiple of {per_step} evaluations per {what[:-1]}")
        return nfe // per_step


#: registry: method name -> class
METHODS: dict[str, type[RestorationMethod]] = {}


def register(cls: type[RestorationMethod]) -> type[RestorationMethod]:
    """Class decorator adding a method to :data:`METHODS` under ``cls.name``."""
    if not cls.name:
        raise MethodError(f"{cls.__name__} has no name")
    METHODS[cls.name] = cls
    return cls


def required(**kw):
    """A dataclass field with default None that must be resolved (per-task default or explicit)."""
    return field(default=None, metadata={"required": True}, **kw)
