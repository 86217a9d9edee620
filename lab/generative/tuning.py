"""Validation tuning of the restoration methods' hyper-parameters (never on test images).

For each prior kind, task, method and NFE, every point of a small grid over the hyper-parameters
the method's paper exposes is run on the **validation split** and the point with the highest mean
PSNR (per-image PSNR on [0, 1], clipped, :func:`lab.generative.metrics.psnr`) is kept. Ties keep the
first point in grid order, so the choice is deterministic. The result, with the split, the grids,
the seed and the command, is written to ``lab/generative/restore/tuned.json``;
``restore(..., hyper="tuned")`` reads it (:func:`tuned_hyper`).

Data and splits (``SPLITS``, index ranges into scikit-learn's ``load_digits``, 1,797 real 8x8
digits scaled to [-1, 1]; the order of the file, no shuffling)::

    train       [0, 1500)      fits the prior (GaussianPrior.fit(ridge=1e-3); EmpiricalPrior atoms)
    validation  [1500, 1600)   tuning only (this module)
    test        [1600, 1797)   reported results only (benchmarks, tests); never read here

Prior kinds (``PRIOR_KINDS``): ``gaussian-digits`` (the exact Gaussian prior, the one with a Bayes
ceiling) and ``empirical-digits`` (the exact empirical prior over the training images), and one kind
per shipped learned prior (``LEARNED_KINDS``: ``learned-mnist``, ``learned-natural32``,
``learned-medical32``; :func:`lab.generative.learned.load_learned_prior` sets ``tuning_key`` to it).
A learned kind is tuned on ``n_val`` images (default 16) evenly spaced over the **val** split of its
data set (:func:`lab.generative.datasets.load`; never the test split), in float32 on the network's
device, with the coarser ``LEARNED_GRIDS`` and at NFE 20 by default (each network evaluation costs
~0.1 s for 16 images on one CPU core; the NFE-20 values then serve every NFE, since the entry at the
tuned NFE nearest the request is used).

Grids (``GRIDS``; named as in each paper/code):

- ``pnp_flow``: ``lr`` (step size) x ``alpha`` (its decay ``(1 - t)^alpha``) x ``num_samples``;
- ``flower``: ``num_samples`` (the code's only knob: independent runs averaged, NFE split);
- ``ot_ode``: ``start_time`` x ``gamma`` schedule x ``init``;
- ``d_flow``: ``lmbda`` (regulariser) x ``alpha`` (initial blend) x ``steps`` (ODE steps per loss
  evaluation; the L-BFGS iterations follow from the budget);
- ``rebridge``: ``kappa`` x ``lam`` (``reading="paper"``: tuning keeps the method as written);
- ``recoupled_admm``: ``grid_power`` x ``t_max`` x ``dual_step`` x ``eta``.

A grid point that cannot spend the budget exactly (e.g. D-Flow's steps) is skipped and recorded
with a null score.

Commands (minutes on CPU; the committed learned kinds took 14-15 min each, three run side by side on
2 cores)::

    python -m lab.generative.tuning --prior gaussian-digits --out lab/generative/restore/tuned.json
    python -m lab.generative.tuning --prior learned-mnist --nfe 20
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

from lab.generative.errors import GenerativeError, MethodError, NFEBudgetError
from lab.generative.metrics import psnr
from lab.generative.operators import get_operator
from lab.generative.priors import EmpiricalPrior, FlowPrior, GaussianPrior

__all__ = [
    "SPLITS", "GRIDS", "TASKS", "NFES", "PRIOR_KINDS", "TUNED_PATH", "load_digit_images", "split_indices",
    "LEARNED_KINDS", "LEARNED_GRIDS", "LEARNED_N_VAL", "validation_set", "make_prior", "grid_points", "tune",
    "write_tuned", "load_tuned", "tuned_hyper", "main",
]

#: index ranges [start, stop) into load_digits (file order)
SPLITS: dict[str, tuple[int, int]] = {"train": (0, 1500), "validation": (1500, 1600), "test": (1600, 1797)}
TASKS: tuple[str, ...] = ("denoise", "deblur", "sr2", "inpaint_random", "inpaint_box")
NFES: tuple[int, ...] = (20, 50, 100)
#: the committed file restore(hyper="tuned") reads
TUNED_PATH = Path(__file__).resolve().parent / "restore" / "tuned.json"

GRIDS: dict[str, dict[str, list]] = {
    "pnp_flow": {"lr": [0.5, 1.0, 1.5, 2.0, 3.0], "alpha": [0.01, 0.1, 0.3, 0.5, 0.8, 1.0], "num_samples": [1, 5]},
    "flower": {"num_samples": [1, 2, 5, 10]},
    "ot_ode": {"start_time": [0.1, 0.2, 0.3, 0.4], "gamma": ["constant", "gamma_t"], "init": ["adjoint", "pinv"]},
    "d_flow": {"lmbda": [0.0, 0.0001, 0.001, 0.01], "alpha": [0.1, 0.5], "steps": [2, 5]},
    "rebridge": {"kappa": [1.0, 5.0, 10.0, 50.0, 200.0, 1000.0], "lam": [0.05, 0.2, 1.0, 5.0]},
    "recoupled_admm": {"grid_power": [0.5, 0.7, 1.0], "t_max": [0.6, 0.8, 1.0], "dual_step": [1.0, 1.6],
                       "eta": [0.0, 0.5]},
}

#: coarser grids for the learned priors (every point costs network evaluations): around the paper's
#: defaults and the values the digit priors chose, 4-12 points per method
LEARNED_GRIDS: dict[str, dict[str, list]] = {
    "pnp_flow": {"lr": [1.0, 3.0], "alpha": [0.01, 0.3, 0.8], "num_samples": [1, 5]},
    "flower": {"num_samples": [1, 2, 5, 10]},
    "ot_ode": {"start_time": [0.1, 0.2, 0.4], "gamma": ["constant", "gamma_t"], "init": ["adjoint"]},
    "d_flow": {"lmbda": [0.0, 0.01], "alpha": [0.1, 0.5], "steps": [2, 5]},
    "rebridge": {"kappa": [5.0, 50.0, 1000.0], "lam": [0.05, 1.0]},
    "recoupled_admm": {"grid_power": [0.5, 1.0], "t_max": [0.6, 0.8, 1.0], "dual_step": [1.0, 1.6], "eta": [0.0]},
}
#: prior kind of each shipped learned prior -> its name (lab.generative.learned.LEARNED_PRIORS)
LEARNED_KINDS: dict[str, str] = {"learned-mnist": "mnist", "learned-natural32": "natural32",
                                 "learned-medical32": "medical32"}
#: validation images per learned kind (evenly spaced over the data set's val split)
LEARNED_N_VAL = 16


def load_digit_images() -> torch.Tensor:
    """scikit-learn's 1,797 real 8x8 digits (values 0..16) as (1797, 1, 8, 8) float32 on [-1, 1], file order."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - scikit-learn ships with the lab's environment
        raise GenerativeError("lab.generative.tuning needs scikit-learn (its load_digits data): pip install scikit-learn") from exc
    return torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 8 - 1


def split_indices(name: str) -> range:
    """The indices of a split (``"train"``, ``"validation"``, ``"test"``)."""
    if name not in SPLITS:
        raise GenerativeError(f"unknown split {name!r}; known: {', '.join(SPLITS)}")
    return range(*SPLITS[name])


def _gaussian(images: torch.Tensor) -> FlowPrior:
    return GaussianPrior.fit(images, ridge=1e-3)


def _empirical(images: torch.Tensor) -> FlowPrior:
    return EmpiricalPrior(images)


#: prior kind -> builder from the training images
PRIOR_KINDS: dict[str, Callable[[torch.Tensor], FlowPrior]] = {"gaussian-digits": _gaussian, "empirical-digits": _empirical}


def make_prior(kind: str, images: torch.Tensor | None = None) -> FlowPrior:
    """The prior of ``kind`` fitted to the training split (a learned kind: its shipped network), with
    ``tuning_key = kind`` (so ``restore(..., hyper="tuned")`` finds its values)."""
    if kind in LEARNED_KINDS:
        from lab.generative.learned import load_learned_prior

        return load_learned_prior(LEARNED_KINDS[kind])
    if kind not in PRIOR_KINDS:
        raise GenerativeError(f"unknown prior kind {kind!r}; known: {', '.join([*PRIOR_KINDS, *LEARNED_KINDS])}")
    images = load_digit_images() if images is None else images
    prior = PRIOR_KINDS[kind](images[slice(*SPLITS["train"])])
    prior.tuning_key = kind
    return prior


def validation_set(kind: str, n_val: int | None = None, images: torch.Tensor | None = None
                   ) -> tuple[FlowPrior, torch.Tensor, dict]:
    """``(prior, x_val, split_record)`` for tuning prior ``kind``.

    ``x_val`` is ``(n, 1, H, W)`` on [-1, 1]. Digit kinds: the first ``n_val`` (default all 100) images
    of the validation range, 8 x 8, float64. Learned kinds: ``n_val`` (default :data:`LEARNED_N_VAL`)
    images evenly spaced over the data set's ``val`` split (28 or 32 px), float32 on the network's
    device; ``split_record`` names the indices used. Raises :class:`GenerativeError` for an unknown
    kind, :class:`lab.generative.datasets.DatasetError` when the data set cannot be read.
    """
    if kind in LEARNED_KINDS:
        from lab.generative import datasets

        name = LEARNED_KINDS[kind]
        prior = make_prior(kind)
        val = datasets.load(name, "val")
        n = min(int(n_val or LEARNED_N_VAL), val.shape[0])
        idx = torch.linspace(0, val.shape[0] - 1, n).round().long()
        device = next(prior.net.parameters()).device
        record = {"dataset": f"lab.generative.datasets.load({name!r}, 'val')", "val_size": int(val.shape[0]),
                  "validation_used": [int(i) for i in idx], "rule": "evenly spaced indices over the val split"}
        return prior, val[idx].to(device=device, dtype=torch.float32), record
    images = load_digit_images() if images is None else images
    prior = make_prior(kind, images)
    val = split_indices("validation")
    if n_val is not None:
        val = val[: int(n_val)]
    record = {"dataset": "sklearn.datasets.load_digits (1797 real 8x8 digits, file order, [-1, 1])",
              **{k: list(v) for k, v in SPLITS.items()}, "validation_used": [val.start, val.stop]}
    return prior, images[val.start: val.stop].to(torch.float64), record


def grid_points(grid: dict[str, list]) -> list[dict]:
    """The Cartesian product of a grid, in a fixed order (the first name varies slowest)."""
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


def tune(prior_kind: str = "gaussian-digits", methods: Iterable[str] | None = None, tasks: Iterable[str] = TASKS,
         nfes: Iterable[int] = NFES, grids: dict[str, dict[str, list]] | None = None, seed: int = 0,
         n_val: int | None = None, images: torch.Tensor | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Tune every method's grid on the validation split; returns the JSON-able record.

    Parameters
    ----------
    prior_kind : a key of :data:`PRIOR_KINDS` or :data:`LEARNED_KINDS`
    methods : method names (default: every method with a grid)
    tasks, nfes : operator names and NFE budgets (a learned kind's tasks use ``sr4`` for ``sr2``:
        its images are 28-32 px, as in the benchmark)
    grids : method -> {name: values} (default :data:`GRIDS`; :data:`LEARNED_GRIDS` for a learned kind)
    seed : seeds the measurement noise (``operator.measure``) and every method's draws
    n_val : validation images (:func:`validation_set`)
    images : the full (1797, 1, 8, 8) digit array (default :func:`load_digit_images`); only the train
        and validation ranges are read
    progress : called with a line per (task, nfe, method)

    Returns
    -------
    dict with ``tuned`` ({kind: {task: {method: {nfe: values}}}}), ``scores`` (every grid point's mean
    validation PSNR, same nesting, a list aligned with the grid), ``split``, ``grids``, ``seed``,
    ``metric``, ``n_images``.
    """
    from lab.generative.restore import METHODS, restore  # lazy: restore imports this module lazily too

    learned = prior_kind in LEARNED_KINDS
    grids = dict((LEARNED_GRIDS if learned else GRIDS) if grids is None else grids)
    methods = list(grids) if methods is None else list(methods)
    for m in methods:
        if m not in METHODS:
            raise MethodError(f"unknown restoration method {m!r}")
        if m not in grids:
            raise MethodError(f"no tuning grid for {m!r}; grids exist for {', '.join(grids)}")
    prior, x, split = validation_set(prior_kind, n_val, images)
    if learned:
        tasks = ["sr4" if t == "sr2" else t for t in tasks]
    tuned: dict = {}
    scores: dict = {}
    for task in tasks:
        op = get_operator(task, tuple(prior.shape))
        y = op.measure(x, torch.Generator().manual_seed(seed))
        for nfe in nfes:
            for m in methods:
                points = grid_points(grids[m])
                vals: list[float | None] = []
                t0 = time.perf_counter()
                for hp in points:
                    try:
                        out = restore(m, y, op, prior, nfe=int(nfe), seed=seed, **hp)
                    except NFEBudgetError:
                        vals.append(None)
                        continue
                    p = float(psnr(out.x, x).mean())
                    vals.append(p if math.isfinite(p) else None)
                finite = [(v, i) for i, v in enumerate(vals) if v is not None]
                if not finite:
                    raise GenerativeError(f"tuning {m} on {task} at nfe={nfe}: no grid point ran")
                best = max(finite, key=lambda vi: (vi[0], -vi[1]))[1]  # highest PSNR, first in grid order on ties
                tuned.setdefault(task, {}).setdefault(m, {})[str(nfe)] = points[best]
                scores.setdefault(task, {}).setdefault(m, {})[str(nfe)] = [None if v is None else round(v, 4) for v in vals]
                if progress:
                    progress(f"{prior_kind} {task:15s} nfe={nfe:<4d} {m:15s} best {vals[best]:.2f} dB {points[best]} "
                             f"({len(points)} points, {time.perf_counter() - t0:.1f} s)")
    return {
        "prior": prior_kind,
        "tuned": tuned,
        "scores": scores,
        "split": split,
        "grids": {m: grids[m] for m in methods},
        "tasks": list(tasks),
        "nfes": [int(n) for n in nfes],
        "seed": int(seed),
        "metric": "mean over validation images of per-image PSNR (dB, [0, 1], clipped); ties keep the first grid point",
        "n_images": int(x.shape[0]),
    }


def write_tuned(record: dict, path: str | Path = TUNED_PATH, command: str | None = None) -> dict:
    """Merge one :func:`tune` record into the JSON file at ``path`` (other prior kinds are kept); returns the file's content."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("format", "lab.generative tuned hyper-parameters, version 1")
    data.setdefault("how_to_use", "restore(method, y, operator, prior, nfe, hyper='tuned') with prior.tuning_key = <kind>, "
                                  "or hyper='tuned:<kind>'; the entry at the tuned NFE nearest nfe is used")
    entry = dict(record)
    entry["command"] = command or "python -m lab.generative.tuning " + " ".join(sys.argv[1:])
    entry["machine"] = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}
    data.setdefault("kinds", {})[record["prior"]] = entry
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def load_tuned(path: str | Path = TUNED_PATH) -> dict:
    """The tuned file's content (``{}`` when it does not exist)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def tuned_hyper(kind: str, task: str, method: str, nfe: int, path: str | Path = TUNED_PATH) -> tuple[dict, int]:
    """The tuned values for (prior kind, task, method) at the tuned NFE nearest ``nfe`` (the smaller on ties).

    Returns ``(values, tuned_nfe)``. A method without hyper-parameters (``bayes``) returns ``({}, nfe)``.
    Raises :class:`MethodError` naming what exists when there is no entry.
    """
    from lab.generative.restore import METHODS

    if method in METHODS and not dataclasses.fields(METHODS[method].Config):
        return {}, int(nfe)
    data = load_tuned(path)
    kinds = data.get("kinds", {})
    if kind not in kinds:
        raise MethodError(f"no tuned hyper-parameters for prior kind {kind!r} in {path}; tuned kinds: {sorted(kinds) or 'none'}")
    by_task = kinds[kind]["tuned"]
    if task not in by_task or method not in by_task[task]:
        have = sorted(by_task.get(task, {}))
        raise MethodError(f"no tuned hyper-parameters for {method!r} on task {task!r} (prior {kind!r}); "
                          f"tuned there: {have or 'none'} (tasks {sorted(by_task)})")
    by_nfe = by_task[task][method]
    best = min((int(n) for n in by_nfe), key=lambda n: (abs(n - int(nfe)), n))
    return dict(by_nfe[str(best)]), best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.generative.tuning", description=__doc__.split("\n")[0])
    ap.add_argument("--prior", action="append", choices=sorted([*PRIOR_KINDS, *LEARNED_KINDS]),
                    help="prior kind (repeat the option for several: --prior A --prior B); default gaussian-digits")
    ap.add_argument("--out", default=str(TUNED_PATH), help="JSON file to merge the result into (default: the committed tuned.json)")
    ap.add_argument("--methods", nargs="+", default=None, help=f"default: {' '.join(GRIDS)}")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS),
                    help=f"default: {' '.join(TASKS)} (a learned kind, 28-32 px images, runs sr4 for sr2)")
    ap.add_argument("--nfe", nargs="+", type=int, default=None, help="default 20 50 100 (20 for a learned kind)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-val", type=int, default=None,
                    help=f"validation images (default: all 100 digits; {LEARNED_N_VAL} for a learned kind)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    command = "python -m lab.generative.tuning " + " ".join(sys.argv[1:] if argv is None else argv)
    for kind in args.prior or ["gaussian-digits"]:
        t0 = time.perf_counter()
        nfes = args.nfe or ([20] if kind in LEARNED_KINDS else list(NFES))
        rec = tune(kind, methods=args.methods, tasks=args.tasks, nfes=nfes, seed=args.seed, n_val=args.n_val,
                   progress=None if args.quiet else (lambda s: print(s, flush=True)))
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        write_tuned(rec, args.out, command)
        print(f"{kind}: tuned {len(rec['tasks'])} tasks x {len(rec['nfes'])} NFE x {len(rec['grids'])} methods "
              f"in {rec['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
