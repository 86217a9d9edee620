"""The demo's hyper-parameter fields (:class:`HyperField`) and defaults; values are resolved by
:func:`lab.generative.restore.resolve_hyper`. Part of :mod:`lab.generative.demo`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


from lab.generative.errors import MethodError
from lab.generative.operators import get_operator
from lab.generative.demo.catalogue import _CHOICE_FIELDS, _FIELD_HELP, _FIELD_LABELS, _HIDDEN_FIELDS, DemoPrior, parse_method


# --------------------------------------------------------------------------------------------- hyper-parameters
@dataclass(frozen=True)
class HyperField:
    """One hyper-parameter the demo exposes: ``kind`` is ``"float"``, ``"int"`` or ``"choice"``."""

    name: str
    label: str
    kind: str
    value: Any
    choices: tuple = ()
    help: str = ""


def tuned_available(key: str, task: str, prior: DemoPrior, nfe: int) -> bool:
    """Whether ``tuned.json`` holds values for this method, task and prior."""
    if prior.tuning_key is None:
        return False
    try:
        default_hyper(key, task, prior, nfe, "tuned")
        return True
    except MethodError:
        return False


def hyper_source(key: str, task: str, prior: DemoPrior, nfe: int, requested: str) -> str:
    """The values to show for a request: ``requested`` (``"paper"`` or ``"tuned"``), or ``"paper"`` when
    tuned values were asked for but ``tuned.json`` has none for this method, task and prior."""
    return "paper" if requested == "tuned" and not tuned_available(key, task, prior, nfe) else requested


def default_hyper(key: str, task: str, prior: DemoPrior | None = None, nfe: int = 50, source: str = "paper") -> dict:
    """The method's hyper-parameters for ``task``: the paper's (``Config`` defaults with per-task
    defaults resolved) or, with ``source="tuned"``, the validation-tuned values of ``tuned.json``
    for the prior's ``tuning_key`` (at the tuned NFE nearest ``nfe``), both resolved by
    :func:`lab.generative.restore.resolve_hyper`. Hidden fields (``record``, ``reading``) are left
    out. Raises :class:`MethodError` when no tuned values exist."""
    from lab.generative.restore import METHODS, resolve_hyper

    if source not in ("paper", "tuned"):
        raise MethodError(f"source must be 'paper' or 'tuned', got {source!r}")
    name, fixed = parse_method(key)
    cls = METHODS[name]
    op = get_operator(task, prior.shape if prior is not None else (1, 8, 8))
    if source == "tuned" and (prior is None or prior.tuning_key is None):
        raise MethodError(f"{name}: no tuned values for this prior (tuned kinds are the digits and the learned priors)")
    values, _ = resolve_hyper(name, source, op, prior.prior if prior is not None else None, int(nfe))
    cfg = dataclasses.asdict(cls(**{**values, **fixed}).resolve(op))
    return {k: v for k, v in cfg.items() if k not in _HIDDEN_FIELDS and v is not None}


def hyper_fields(key: str, task: str, prior: DemoPrior | None = None, nfe: int = 50, source: str = "paper") -> list[HyperField]:
    """The method's exposed hyper-parameters as :class:`HyperField` s with their default values
    (see :func:`default_hyper`): e.g. ``rho``, ``lambda``, ``kappa`` for ReBridge-Flow."""
    name, _ = parse_method(key)
    out = []
    for fname, value in default_hyper(key, task, prior, nfe, source).items():
        choices = _CHOICE_FIELDS.get((name, fname), ())
        if choices:
            kind = "choice"
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            kind = "int"
        elif isinstance(value, float):
            kind = "float"
        else:
            continue
        out.append(HyperField(fname, _FIELD_LABELS.get(fname, fname), kind, value, choices, _FIELD_HELP.get((name, fname), "")))
    return out
