"""Per-operator regressors fitted on the sampler's measurements (one per kind, direction and precision).

Zhang et al., arXiv 2509.22832, Sec. III-B: tree ensembles (random forest, XGBoost) per (operator,
precision, forward/backward), hyper-parameters searched and the best model kept on a validation split.
Here, per (kind, direction, precision):

1. a **linear base** ``t0 = c0 + c1 FLOPs + c2 bytes`` (non-negative least squares in relative error,
   :func:`scipy.optimize.nnls`: a launch cost, a compute rate, a memory rate);
2. a **tree ensemble** on the log ratio ``log(t / t0)`` with features ``log`` of the shape dimensions,
   FLOPs and bytes: :class:`sklearn.ensemble.RandomForestRegressor` and
   :class:`sklearn.ensemble.GradientBoostingRegressor`, four settings each (equal budgets, :data:`CANDIDATES`);
3. the candidate with the lowest mean absolute percentage error on a **validation split of shapes**
   (25 % of the sampled shapes, never fitted on) is kept and refitted on all shapes.

Why the ratio and not the time itself: a tree predicts a step function, so a tree on ``log t`` is off by
up to half a grid step between sampled shapes (the benchmark's shapes are all between them); on the ratio
to a smooth base it only has to learn the kernel-efficiency corrections (cache and blocking effects,
auto-tuned kernel choices), which is what trees are good at.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor

__all__ = ["CANDIDATES", "OperatorRegressor", "PrimitiveModel", "fit_primitives", "mape"]

#: The tuning grid, the same number of settings per family.
CANDIDATES: dict[str, list[dict]] = {
    "random_forest": [dict(n_estimators=200, max_depth=None, min_samples_leaf=1),
                      dict(n_estimators=200, max_depth=None, min_samples_leaf=3),
                      dict(n_estimators=200, max_depth=8, min_samples_leaf=1),
                      dict(n_estimators=200, max_depth=6, min_samples_leaf=2)],
    "gradient_boosting": [dict(n_estimators=300, learning_rate=0.05, max_depth=3, subsample=0.8),
                          dict(n_estimators=300, learning_rate=0.1, max_depth=3, subsample=0.8),
                          dict(n_estimators=300, learning_rate=0.05, max_depth=4, subsample=0.8),
                          dict(n_estimators=150, learning_rate=0.1, max_depth=2, subsample=1.0)],
}


def mape(pred, true) -> float:
    """Mean absolute percentage error, in percent."""
    p, t = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(p - t) / t) * 100.0)


def _base_design(flops, nbytes):
    return np.column_stack([np.ones(len(flops)), np.asarray(flops, float) / 1e9, np.asarray(nbytes, float) / 1e9])


def _make(family, params, seed):
    if family == "random_forest":
        return RandomForestRegressor(random_state=seed, n_jobs=1, **params)
    return GradientBoostingRegressor(random_state=seed, **params)


@dataclass
class OperatorRegressor:
    """Time of one (kind, direction, precision) as a function of its shape.

    Attributes
    ----------
    kind, direction, precision : str
    feature_names : list of str
        Shape features in the order the model takes them (FLOPs and bytes are appended).
    base_coef : ndarray, shape (3,)
        ``c0`` (s), ``c1`` (s per GFLOP), ``c2`` (s per GB) of the linear base.
    family : str
        ``"random_forest"`` or ``"gradient_boosting"``.
    params : dict
        The chosen setting.
    validation_mape : dict
        ``{"linear_base": %, "<family>[i]": %, ...}`` on the held-out shapes, every candidate.
    n_train, n_validation : int
    """

    kind: str
    direction: str
    precision: str
    feature_names: list[str]
    base_coef: np.ndarray
    family: str
    params: dict
    model: object
    validation_mape: dict = field(default_factory=dict)
    n_train: int = 0
    n_validation: int = 0

    def _X(self, feats: list[dict], flops, nbytes) -> np.ndarray:
        cols = [[math.log(max(float(f[n]), 1e-9)) for n in self.feature_names] for f in feats]
        return np.column_stack([np.asarray(cols, float).reshape(len(feats), -1),
                                np.log(np.maximum(np.asarray(flops, float), 1.0)),
                                np.log(np.maximum(np.asarray(nbytes, float), 1.0))])

    def base(self, flops, nbytes) -> np.ndarray:
        """Linear base time (s) for arrays of FLOPs and bytes."""
        return _base_design(flops, nbytes) @ self.base_coef

    def predict(self, feats: list[dict], flops, nbytes) -> np.ndarray:
        """Seconds for each shape (``feats[i]`` the shape features, with its FLOPs and bytes)."""
        b = self.base(flops, nbytes)
        X = self._X(feats, flops, nbytes)
        if isinstance(self.model, RandomForestRegressor):
            # the forest's mean over its trees, without joblib's per-tree dispatch (about 0.5 ms a tree):
            # the same numbers as RandomForestRegressor.predict, 20x faster for a handful of rows
            X32 = np.ascontiguousarray(X, dtype=np.float32)
            y = np.mean([e.tree_.predict(X32).reshape(len(X32)) for e in self.model.estimators_], axis=0)
        else:
            y = self.model.predict(X)
        return b * np.exp(y)


def _fit_base(flops, nbytes, t) -> np.ndarray:
    A = _base_design(flops, nbytes) / np.asarray(t, float)[:, None]
    coef, _ = nnls(A, np.ones(len(t)))
    if coef[0] <= 0:  # keep the base positive for zero-FLOP, zero-byte shapes
        coef[0] = float(np.min(t)) * 1e-3
    return coef


def _fit_one(kind, direction, precision, rows, seed, val_fraction, chosen=None) -> OperatorRegressor:
    names = sorted(rows[0]["features"])
    idx = list(range(len(rows)))
    random.Random(seed).shuffle(idx)
    n_val = max(1, int(round(val_fraction * len(rows)))) if len(rows) >= 8 else 0
    val, train = idx[:n_val], idx[n_val:]

    def cols(ix):
        return ([rows[i]["features"] for i in ix], [rows[i]["flops"] for i in ix], [rows[i]["bytes"] for i in ix],
                np.array([rows[i]["time_s"] for i in ix], float))

    def fit(ix, family, params):
        feats, fl, by, t = cols(ix)
        coef = _fit_base(fl, by, t)
        reg = OperatorRegressor(kind, direction, precision, names, coef, family, params, None)
        y = np.log(t / np.maximum(reg.base(fl, by), 1e-12))
        reg.model = _make(family, params, seed).fit(reg._X(feats, fl, by), y)
        return reg

    scores: dict[str, float] = {}
    best = ("random_forest", CANDIDATES["random_forest"][0])
    if chosen is not None:  # a selection made before (the benchmark's): refit that candidate on all shapes
        final = fit(idx, chosen[0], dict(chosen[1]))
        final.n_train, final.n_validation = len(rows), 0
        return final
    if val:
        vf, vfl, vby, vt = cols(val)
        tf, tfl, tby, tt = cols(train)
        scores["linear_base"] = mape(_base_design(vfl, vby) @ _fit_base(tfl, tby, tt), vt)
        best_score = math.inf
        for family, settings in CANDIDATES.items():
            for i, params in enumerate(settings):
                reg = fit(train, family, params)
                sc = mape(reg.predict(vf, vfl, vby), vt)
                scores[f"{family}[{i}]"] = sc
                if sc < best_score:
                    best, best_score = (family, params), sc
    final = fit(idx, *best)
    final.validation_mape, final.n_train, final.n_validation = scores, len(train), len(val)
    return final


@dataclass
class PrimitiveModel:
    """The fitted regressors of one sampler run.

    Attributes
    ----------
    regressors : dict
        ``(kind, direction, precision) -> OperatorRegressor``.
    engine_overhead_s : float
        The autograd engine's fixed cost per backward call, measured by the sampler.
    device : str
    base_only : bool
        Predict with the linear bases only (:meth:`linear_base_only`).
    includes_engine_overhead : bool
        The backward regressors were fitted on whole backward calls (engine cost included).
    """

    regressors: dict
    engine_overhead_s: float
    device: str
    base_only: bool = False
    includes_engine_overhead: bool = True

    def predict(self, kind: str, direction: str, precision: str, features: dict, flops: float, nbytes: float) -> float:
        """Seconds of one primitive call.

        Raises
        ------
        KeyError
            No regressor for ``(kind, direction, precision)`` (the sampler did not profile it); the
            message lists the fitted ones.
        """
        try:
            reg = self.regressors[(kind, direction, precision)]
        except KeyError:
            raise KeyError(f"no regressor for {(kind, direction, precision)}; fitted: "
                           f"{sorted(self.regressors)}") from None
        if self.base_only:
            return float(reg.base([flops], [nbytes])[0])
        return float(reg.predict([features], [flops], [nbytes])[0])

    def predict_many(self, kind: str, direction: str, precision: str, items) -> list[float]:
        """Seconds of several calls of one regressor: ``items`` = ``[(features, flops, bytes), ...]``."""
        if not items:
            return []
        try:
            reg = self.regressors[(kind, direction, precision)]
        except KeyError:
            raise KeyError(f"no regressor for {(kind, direction, precision)}; fitted: "
                           f"{sorted(self.regressors)}") from None
        feats, flops, nbytes = zip(*items)
        out = reg.base(flops, nbytes) if self.base_only else reg.predict(list(feats), flops, nbytes)
        return [float(x) for x in out]

    def linear_base_only(self) -> PrimitiveModel:
        """The same model without the trees: the linear bases alone (the simplest strong baseline)."""
        return PrimitiveModel(self.regressors, self.engine_overhead_s, self.device, base_only=True,
                              includes_engine_overhead=self.includes_engine_overhead)

    def table(self) -> list[dict]:
        """One row per regressor: its key, chosen family, sample counts and validation MAPEs."""
        rows = []
        for (k, d, p), r in sorted(self.regressors.items()):
            fam = {n: s for n, s in r.validation_mape.items() if n != "linear_base"}
            rows.append({"kind": k, "direction": d, "precision": p, "chosen": r.family, "params": r.params,
                         "n_train": r.n_train, "n_validation": r.n_validation,
                         "validation_mape_chosen": min(fam.values()) if fam else None,
                         "validation_mape_best_random_forest": min((s for n, s in fam.items() if n.startswith("random")), default=None),
                         "validation_mape_best_gradient_boosting": min((s for n, s in fam.items() if n.startswith("gradient")), default=None),
                         "validation_mape_linear_base": r.validation_mape.get("linear_base")})
        return rows


def fit_primitives(samples: dict, *, seed: int = 0, val_fraction: float = 0.25,
                   subtract_engine_overhead: bool = False, chosen: list[dict] | None = None) -> PrimitiveModel:
    """Fit one :class:`OperatorRegressor` per (kind, direction, precision) of a sampler output.

    Parameters
    ----------
    samples : dict
        :func:`lab.training.perfmodel.profile.profile_configs`'s output.
    seed : int
        Validation split and tree seeds.
    val_fraction : float
        Share of each kind's sampled shapes held out for model selection.
    subtract_engine_overhead : bool
        Subtract the engine's per-call cost from backward samples before fitting. Default False: the
        regressors predict a backward *call* (engine cost included, well conditioned in relative error for
        small kernels) and :class:`lab.training.perfmodel.predict.LearnedPredictor` takes the cost out of
        each operator and charges it once per stage backward.

    chosen : list of dict, optional
        Rows of :meth:`PrimitiveModel.table` (``kind``, ``direction``, ``precision``, ``chosen``,
        ``params``): skip the selection and refit those candidates on all shapes (fast; the explorer).

    Raises
    ------
    ValueError
        No samples.
    """
    if not samples.get("samples"):
        raise ValueError("the sampler output has no samples")
    eo = float(samples.get("engine_overhead_s", 0.0))
    groups: dict = {}
    for s in samples["samples"]:
        row = dict(s)
        if s["direction"] == "bwd" and subtract_engine_overhead:
            row["time_s"] = max(s["time_s"] - eo, 0.05 * s["time_s"])
        groups.setdefault((s["kind"], s["direction"], samples.get("precision", "fp32")), []).append(row)
    pick = {(r["kind"], r["direction"], r["precision"]): (r["chosen"], r["params"]) for r in (chosen or [])}
    regs = {key: _fit_one(*key, rows, seed, val_fraction, pick.get(key) if chosen is not None else None)
            for key, rows in sorted(groups.items())}
    return PrimitiveModel(regs, eo, samples.get("device", "cpu"), includes_engine_overhead=not subtract_engine_overhead)
