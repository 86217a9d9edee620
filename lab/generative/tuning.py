"""Validation tuning of the restoration methods' hyper-parameters (never on test images), at equal budgets.

For each prior kind, task, method and NFE, the method's own hyper-parameters (``SPACES``, named as
in its paper/code) are searched on the **validation split** by one rule for every method
(:func:`budgeted_search`): the same number of validation evaluations (``BUDGET`` = 8), a starting
grid of at most 6 points, then one point at a time -- first extending any axis whose best value lies
on the edge of what was tried, then switching a choice, then refining around the best value. The
point with the highest mean PSNR (per-image PSNR on [0, 1], clipped, :func:`lab.generative.metrics.psnr`)
is kept; ties keep the earliest point, so the choice is deterministic. The result, with every trial,
the evaluations spent (``tuning_budget`` in the benchmark), the split, the spaces, the seed and the
command, is written to ``lab/generative/restore/tuned.json``; ``restore(..., hyper="tuned")`` reads it
(:func:`tuned_hyper`). A method whose space is smaller than the budget (Flower's ``num_samples`` must
divide the NFE) spends fewer evaluations; the file says how many.

Data and splits (``SPLITS``, index ranges into scikit-learn's ``load_digits``, 1,797 real 8x8
digits scaled to [-1, 1]; the order of the file, no shuffling)::

    train       [0, 1500)      fits the prior (GaussianPrior.fit(ridge=1e-3); EmpiricalPrior atoms)
    validation  [1500, 1600)   tuning only (this module)
    test        [1600, 1797)   reported results only (benchmarks, tests); never read here

Prior kinds (``PRIOR_KINDS``): ``gaussian-digits`` (the exact Gaussian prior, the one with a Bayes
ceiling, on real digits), ``gaussian-samples`` (the same Gaussian on images drawn from it,
:func:`gaussian_samples`: 100 validation draws, seed 1500; the benchmark's test draws use seed 1600;
there its posterior mean is the MMSE ceiling), ``empirical-digits`` (the exact empirical prior over
the training images), and one kind per shipped learned prior (``LEARNED_KINDS``: ``learned-mnist``,
``learned-natural32``, ``learned-medical32``; :func:`lab.generative.learned.load_learned_prior` sets
``tuning_key`` to it). A learned kind is tuned on ``n_val`` images (default 16) evenly spaced over
the **val** split of its data set (:func:`lab.generative.datasets.load`; never the test split), in
float32 on the network's device, at NFE 20 by default (each network evaluation costs ~0.1 s for 16
images on one CPU core; the NFE-20 values then serve every NFE, since the entry at the tuned NFE
nearest the request is used).

Spaces (``SPACES``): ``tikhonov``: ``lam``; ``pnp_flow``: ``lr`` x ``alpha`` (the step's decay
``(1 - t)^alpha``) x ``num_samples``; ``flower``: ``num_samples`` (independent runs averaged, NFE
split); ``ot_ode``: ``start_time`` x ``gamma`` schedule x ``init``; ``d_flow``: ``lmbda`` x ``alpha``
(initial blend) x ``steps`` (ODE steps per loss evaluation); ``rebridge``: ``kappa`` x ``lam``
(``reading="paper"``: tuning keeps the method as written); ``recoupled_admm``: ``grid_power`` x
``t_max`` x ``dual_step`` x ``eta``. A point that cannot spend the NFE budget exactly (e.g. D-Flow's
steps) is recorded with a null score and not counted.

Commands (minutes on CPU)::

    python -m lab.generative.tuning --prior gaussian-digits --prior gaussian-samples --prior empirical-digits
    python -m lab.generative.tuning --prior learned-mnist --nfe 20
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
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
    "SPLITS", "Axis", "SPACES", "BUDGET", "budgeted_search", "TASKS", "NFES", "PRIOR_KINDS", "SAMPLE_SEEDS",
    "gaussian_samples", "TUNED_PATH", "load_digit_images", "split_indices", "tuning_budget",
    "LEARNED_KINDS", "LEARNED_N_VAL", "validation_set", "make_prior", "grid_points", "tune",
    "write_tuned", "load_tuned", "tuned_hyper", "main",
]

#: index ranges [start, stop) into load_digits (file order)
SPLITS: dict[str, tuple[int, int]] = {"train": (0, 1500), "validation": (1500, 1600), "test": (1600, 1797)}
TASKS: tuple[str, ...] = ("denoise", "deblur", "sr2", "inpaint_random", "inpaint_box")
NFES: tuple[int, ...] = (20, 50, 100)
#: the committed file restore(hyper="tuned") reads
TUNED_PATH = Path(__file__).resolve().parent / "restore" / "tuned.json"

@dataclass(frozen=True)
class Axis:
    """One hyper-parameter's search space.

    Attributes
    ----------
    initial : tuple
        The values of the starting grid.
    kind : ``"log"``, ``"linear"``, ``"int"`` or ``"choice"``
        ``log``: a positive float stepped by the factor ``step`` (> 1); ``linear``: a float stepped by
        ``step``; ``int``: a positive integer stepped by the factor ``step``, rounded; ``choice``: one of
        ``options`` (tried by switching the best point's value).
    step : float
    lo, hi : float or None
        Inclusive bounds of a numeric axis (None: unbounded).
    options : tuple
        A ``choice`` axis's values (``initial`` is a subset).
    """

    initial: tuple
    kind: str = "log"
    step: float = 2.0
    lo: float | None = None
    hi: float | None = None
    options: tuple = ()

    def outward(self, v, up: bool):
        """The next value beyond ``v`` (None when out of bounds)."""
        if self.kind == "linear":
            w = v + self.step if up else v - self.step
        elif self.kind == "int":
            w = int(round(v * self.step)) if up else int(round(v / self.step))
            w = w if w != v else (v + 1 if up else v - 1)
        else:
            w = v * self.step if up else v / self.step
        return self._ok(w)

    def between(self, a, b) -> list:
        """Values strictly between ``a`` and ``b``: the midpoint (geometric on a log axis); on an int axis
        every integer between them, the one nearest the geometric midpoint first (some may not divide the NFE)."""
        if self.kind == "int":
            mid = math.sqrt(a * b)
            lo, hi = sorted((a, b))
            return sorted(range(lo + 1, hi), key=lambda w: (abs(w - mid), w))
        w = self._ok((a + b) / 2 if self.kind == "linear" else math.sqrt(a * b))
        return [] if w is None or w in (a, b) else [w]

    def _ok(self, w):
        if self.kind != "int":
            w = float(f"{w:.4g}")
        if (self.lo is not None and w < self.lo) or (self.hi is not None and w > self.hi):
            return None
        if self.kind in ("log", "int") and w <= 0:
            return None
        return w


#: evaluations on the validation split every method gets (the same for every method, task, NFE and prior kind)
BUDGET = 8

#: each method's own hyper-parameters (named as in its paper/code) and where the search starts. The rule
#: is the same for every method (:func:`budgeted_search`): the starting grid (at most 6 points), then
#: one point at a time, up to :data:`BUDGET` evaluations, first extending an axis whose best value
#: lies on the edge of what was tried, then switching a choice, then refining between the best value
#: and its neighbours.
SPACES: dict[str, dict[str, Axis]] = {
    "tikhonov": {"lam": Axis((1e-3, 1e-2, 1e-1), "log", 10.0, 1e-8, 1e3)},
    "pnp_flow": {"lr": Axis((0.5, 2.0), "log", 2.0, 0.05, 20.0), "alpha": Axis((0.1, 0.8), "linear", 0.35, 0.0, 3.0),
                 "num_samples": Axis((1,), "int", 5.0, 1, None)},
    "flower": {"num_samples": Axis((1, 2, 5), "int", 2.0, 1, None)},
    "ot_ode": {"start_time": Axis((0.1, 0.3), "linear", 0.1, 0.05, 0.9),
               "gamma": Axis(("constant", "gamma_t"), "choice", options=("constant", "gamma_t")),
               "init": Axis(("adjoint",), "choice", options=("adjoint", "pinv"))},
    "d_flow": {"lmbda": Axis((1e-4, 1e-2), "log", 10.0, 1e-7, 1.0), "alpha": Axis((0.1, 0.5), "linear", 0.2, 0.0, 1.0),
               "steps": Axis((2,), "int", 2.5, 1, None)},
    "rebridge": {"kappa": Axis((5.0, 50.0, 500.0), "log", 10.0, 0.1, 1e5), "lam": Axis((0.05, 1.0), "log", 4.0, 1e-3, 100.0)},
    "recoupled_admm": {"grid_power": Axis((0.5, 1.0), "linear", 0.25, 0.2, 2.0),
                       "t_max": Axis((0.6, 1.0), "linear", 0.2, 0.3, 1.0),
                       "dual_step": Axis((1.6,), "linear", 0.3, 0.4, 1.6), "eta": Axis((0.0,), "linear", 0.5, 0.0, 1.0)},
}


def budgeted_search(evaluate: Callable[[dict], float | None], space: dict[str, Axis], budget: int = BUDGET) -> dict:
    """The one tuning rule: at most ``budget`` evaluations over one method's own space, the best kept.

    1. Evaluate the starting grid (the Cartesian product of every axis's ``initial`` values, first
       axis slowest).
    2. While evaluations are left: take the best point so far (highest score, the earliest on ties)
       and evaluate the first untried candidate of: (a) for each numeric axis on which the best
       value is the largest (smallest) value tried, the next value outward -- the grid is extended
       while its best point lies on its edge; (b) the best point with a choice axis switched; (c)
       the midpoints between the best value and its neighbours on each numeric axis.
    3. Stop when the budget is spent or no untried candidate is left (a small space, e.g. Flower's
       ``num_samples`` must divide the NFE).

    ``evaluate(point)`` returns the mean validation PSNR, or None when the point cannot run (e.g. it
    cannot spend the NFE budget exactly); such a point is recorded but not counted as an evaluation.

    Returns
    -------
    dict with ``best`` (the point), ``best_psnr``, ``trials`` (``[point, psnr or None]`` in order),
    ``evaluations`` (points that ran: the budget spent), ``budget``, ``edge_extensions`` (points of
    step 2a) and ``best_on_edge`` (the best value still on a tried edge of a numeric axis that could be
    extended further: the budget ran out before the edge was left).

    Raises
    ------
    GenerativeError
        The starting grid exceeds the budget, or no point ran.
    """
    names = list(space)
    start = grid_points({n: list(space[n].initial) for n in names})
    if len(start) > budget:
        raise GenerativeError(f"starting grid of {len(start)} points exceeds the budget of {budget} evaluations")
    trials: list[list] = []
    tried: set = set()
    spent = extensions = 0

    def key(p):
        return tuple(p[n] for n in names)

    def run(p, edge=False):
        nonlocal spent, extensions
        tried.add(key(p))
        v = evaluate(dict(p))
        v = v if v is not None and math.isfinite(v) else None
        trials.append([dict(p), None if v is None else round(float(v), 4)])
        if v is not None:
            spent += 1
            extensions += edge

    def best():
        ok = [(t[1], -i) for i, t in enumerate(trials) if t[1] is not None]
        return trials[-max(ok)[1]][0] if ok else None

    def values(n):  # the values that ran (a point that could not run marks no edge)
        return sorted({t[0][n] for t in trials if t[1] is not None})

    def candidates(b):
        edge, switch, refine = [], [], []
        for n in names:
            ax = space[n]
            if ax.kind == "choice":
                switch += [dict(b, **{n: o}) for o in ax.options if o != b[n]]
                continue
            vals = values(n)
            i = vals.index(b[n])
            for up, at_edge in ((True, i == len(vals) - 1), (False, i == 0)):
                w = ax.outward(b[n], up) if at_edge else None
                if w is not None:
                    edge.append(dict(b, **{n: w}))
            for j in (i - 1, i + 1):
                if 0 <= j < len(vals):
                    refine += [dict(b, **{n: w}) for w in ax.between(b[n], vals[j])]
        return [(p, True) for p in edge] + [(p, False) for p in switch + refine]

    for p in start:
        run(p)
    attempts = 0
    while spent < budget and attempts < 8 * budget:
        b = best()
        if b is None:
            break
        nxt = next(((p, e) for p, e in candidates(b) if key(p) not in tried), None)
        if nxt is None:
            break
        attempts += 1
        run(*nxt)
    b = best()
    if b is None:
        raise GenerativeError("no grid point ran")
    on_edge = any(e for p, e in candidates(b) if key(p) not in tried)
    return {"best": b, "best_psnr": max(t[1] for t in trials if t[1] is not None), "trials": trials,
            "evaluations": spent, "budget": int(budget), "edge_extensions": extensions, "best_on_edge": bool(on_edge)}


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


#: prior kind -> builder from the training images. ``gaussian-samples`` is the same Gaussian as
#: ``gaussian-digits``, evaluated on images drawn from it (:func:`gaussian_samples`), where its posterior
#: mean is the MMSE ceiling; its hyper-parameters are tuned on such draws.
PRIOR_KINDS: dict[str, Callable[[torch.Tensor], FlowPrior]] = {"gaussian-digits": _gaussian, "empirical-digits": _empirical,
                                                               "gaussian-samples": _gaussian}
#: seeds of the draws from the Gaussian prior per split (kind ``gaussian-samples``); disjoint streams
SAMPLE_SEEDS: dict[str, int] = {"validation": 1500, "test": 1600}


def gaussian_samples(prior, split: str, n: int) -> torch.Tensor:
    """``n`` images (n, 1, 8, 8) float64 drawn from the Gaussian prior ``prior`` (``sample_clean``), seeded by
    :data:`SAMPLE_SEEDS` [split]: the validation draws tune, the test draws are reported. Raises
    :class:`GenerativeError` for another split."""
    if split not in SAMPLE_SEEDS:
        raise GenerativeError(f"gaussian_samples: split must be one of {', '.join(SAMPLE_SEEDS)}, got {split!r}")
    return prior.sample_clean(int(n), torch.Generator().manual_seed(SAMPLE_SEEDS[split]), dtype=torch.float64)


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
    if kind == "gaussian-samples":
        n = int(n_val or 100)
        record = {"dataset": "draws from GaussianPrior.fit(load_digits train 0-1499, ridge 1e-3)",
                  "validation_used": {"n": n, "seed": SAMPLE_SEEDS["validation"]}, "test_seed": SAMPLE_SEEDS["test"]}
        return prior, gaussian_samples(prior, "validation", n), record
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
         nfes: Iterable[int] = NFES, spaces: dict[str, dict[str, Axis]] | None = None, budget: int = BUDGET, seed: int = 0,
         n_val: int | None = None, images: torch.Tensor | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Tune every method on the validation split with the same budget (:func:`budgeted_search`); the JSON-able record.

    Parameters
    ----------
    prior_kind : a key of :data:`PRIOR_KINDS` or :data:`LEARNED_KINDS`
    methods : method names (default: every method of ``spaces``)
    tasks, nfes : operator names and NFE budgets (a learned kind's tasks use ``sr4`` for ``sr2``:
        its images are 28-32 px, as in the benchmark). ``tikhonov`` uses no network evaluation and
        is tuned once per task (its entry is stored under every NFE).
    spaces : method -> {name: Axis} (default :data:`SPACES`)
    budget : validation evaluations per (task, NFE, method), the same for every method (default :data:`BUDGET`)
    seed : seeds the measurement noise (``operator.measure``) and every method's draws
    n_val : validation images (:func:`validation_set`)
    images : the full (1797, 1, 8, 8) digit array (default :func:`load_digit_images`); only the train
        and validation ranges are read
    progress : called with a line per (task, nfe, method)

    Returns
    -------
    dict with ``tuned`` ({task: {method: {nfe: values}}}), ``search`` (same nesting: each search's
    ``trials``, ``evaluations``, ``budget``, ``edge_extensions``, ``best_on_edge``), ``spaces``,
    ``budget``, ``split``, ``seed``, ``metric``, ``n_images``.

    Raises
    ------
    MethodError
        Unknown method, or one without a search space.
    GenerativeError
        No point of a search ran.
    """
    from lab.generative.restore import METHODS, restore  # lazy: restore imports this module lazily too

    learned = prior_kind in LEARNED_KINDS
    spaces = dict(SPACES if spaces is None else spaces)
    methods = list(spaces) if methods is None else list(methods)
    for m in methods:
        if m not in METHODS:
            raise MethodError(f"unknown restoration method {m!r}")
        if m not in spaces:
            raise MethodError(f"no search space for {m!r}; spaces exist for {', '.join(spaces)}")
    prior, x, split = validation_set(prior_kind, n_val, images)
    if learned:
        tasks = ["sr4" if t == "sr2" else t for t in tasks]
    tuned: dict = {}
    search: dict = {}
    for task in tasks:
        op = get_operator(task, tuple(prior.shape))
        y = op.measure(x, torch.Generator().manual_seed(seed))
        for m in methods:
            once = not METHODS[m].uses_nfe
            res = None
            for nfe in nfes:
                t0 = time.perf_counter()
                if res is None or not once:
                    def evaluate(hp, m=m, nfe=nfe):
                        try:
                            out = restore(m, y, op, prior, nfe=int(nfe), seed=seed, **hp)
                        except NFEBudgetError:
                            return None
                        return float(psnr(out.x, x).mean())

                    try:
                        res = budgeted_search(evaluate, spaces[m], budget)
                    except GenerativeError as exc:
                        raise GenerativeError(f"tuning {m} on {task} at nfe={nfe}: {exc}") from None
                tuned.setdefault(task, {}).setdefault(m, {})[str(nfe)] = res["best"]
                search.setdefault(task, {}).setdefault(m, {})[str(nfe)] = {k: v for k, v in res.items() if k != "best"}
                if progress:
                    progress(f"{prior_kind} {task:15s} nfe={nfe:<4d} {m:15s} best {res['best_psnr']:.2f} dB {res['best']} "
                             f"({res['evaluations']} evaluations, {time.perf_counter() - t0:.1f} s)")
    return {
        "prior": prior_kind,
        "tuned": tuned,
        "search": search,
        "split": split,
        "spaces": {m: {n: dataclasses.asdict(ax) for n, ax in spaces[m].items()} for m in methods},
        "budget": int(budget),
        "rule": budgeted_search.__doc__.split("\n\n")[1].strip(),
        "tasks": list(tasks),
        "nfes": [int(n) for n in nfes],
        "seed": int(seed),
        "metric": "mean over validation images of per-image PSNR (dB, [0, 1], clipped); ties keep the earliest point",
        "n_images": int(x.shape[0]),
    }


def write_tuned(record: dict, path: str | Path = TUNED_PATH, command: str | None = None, update: bool = False) -> dict:
    """Merge one :func:`tune` record into the JSON file at ``path`` (other prior kinds are kept); returns the file's content.

    ``update=True`` merges the record's methods into the kind's existing entry instead of replacing it
    (the other methods' values and records are kept, and a method's entries at the NFEs the record does not
    tune; ``updates`` lists each such merge with its command, budget and split), e.g. to tune one new method
    without re-running the others, or one method at one more NFE.
    """
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("format", "lab.generative tuned hyper-parameters, version 1")
    data.setdefault("how_to_use", "restore(method, y, operator, prior, nfe, hyper='tuned') with prior.tuning_key = <kind>, "
                                  "or hyper='tuned:<kind>'; the entry at the tuned NFE nearest nfe is used")
    entry = dict(record)
    entry["command"] = command or "python -m lab.generative.tuning " + " ".join(sys.argv[1:])
    entry["machine"] = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}
    old = data.setdefault("kinds", {}).get(record["prior"])
    if update and old:
        merged = json.loads(json.dumps(old))
        for key in ("tuned", "search"):
            for task, by_m in record[key].items():
                for m, by_nfe in by_m.items():  # per NFE: an update at another NFE keeps the method's other entries
                    merged.setdefault(key, {}).setdefault(task, {}).setdefault(m, {}).update(by_nfe)
        merged.setdefault("updates", []).append({k: entry[k] for k in ("command", "machine", "spaces", "budget", "split",
                                                                      "tasks", "nfes", "seed", "n_images", "rule")})
        entry = merged
    data["kinds"][record["prior"]] = entry
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


def tuning_budget(kind: str | None, task: str, method: str, nfe: int, path: str | Path = TUNED_PATH) -> int:
    """Validation evaluations spent choosing (kind, task, method)'s values at the tuned NFE nearest ``nfe``.

    0 for a method without hyper-parameters, a kind or method without an entry (the paper's values), or
    ``kind`` None. Entries written before the budget rule (a ``scores`` grid) count their grid points that ran.
    """
    from lab.generative.restore import METHODS

    if kind is None or (method in METHODS and not dataclasses.fields(METHODS[method].Config)):
        return 0
    entry = load_tuned(path).get("kinds", {}).get(kind, {})
    by_nfe = entry.get("search", {}).get(task, {}).get(method) or entry.get("scores", {}).get(task, {}).get(method)
    if not by_nfe:
        return 0
    best = min((int(n) for n in by_nfe), key=lambda n: (abs(n - int(nfe)), n))
    rec = by_nfe[str(best)]
    return int(rec["evaluations"]) if isinstance(rec, dict) else sum(v is not None for v in rec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.generative.tuning", description=__doc__.split("\n")[0])
    ap.add_argument("--prior", action="append", choices=sorted([*PRIOR_KINDS, *LEARNED_KINDS]),
                    help="prior kind (repeat the option for several: --prior A --prior B); default gaussian-digits")
    ap.add_argument("--out", default=str(TUNED_PATH), help="JSON file to merge the result into (default: the committed tuned.json)")
    ap.add_argument("--methods", nargs="+", default=None, help=f"default: {' '.join(SPACES)}")
    ap.add_argument("--budget", type=int, default=BUDGET, help=f"validation evaluations per method (default {BUDGET})")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS),
                    help=f"default: {' '.join(TASKS)} (a learned kind, 28-32 px images, runs sr4 for sr2)")
    ap.add_argument("--nfe", nargs="+", type=int, default=None, help="default 20 50 100 (20 for a learned kind)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-val", type=int, default=None,
                    help=f"validation images (default: all 100 digits; {LEARNED_N_VAL} for a learned kind)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--update", action="store_true",
                    help="merge the tuned methods into the kind's existing entry (keep the other methods' values)")
    args = ap.parse_args(argv)
    command = "python -m lab.generative.tuning " + " ".join(sys.argv[1:] if argv is None else argv)
    for kind in args.prior or ["gaussian-digits"]:
        t0 = time.perf_counter()
        nfes = args.nfe or ([20] if kind in LEARNED_KINDS else list(NFES))
        rec = tune(kind, methods=args.methods, tasks=args.tasks, nfes=nfes, budget=args.budget, seed=args.seed, n_val=args.n_val,
                   progress=None if args.quiet else (lambda s: print(s, flush=True)))
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        write_tuned(rec, args.out, command, update=args.update)
        print(f"{kind}: tuned {len(rec['tasks'])} tasks x {len(rec['nfes'])} NFE x {len(rec['spaces'])} methods "
              f"in {rec['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
