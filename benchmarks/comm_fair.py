"""The 400-step training table made fair: one tuning budget and rule for every method on the validation
split, then the held-out test split once, over fresh seeds, with paired intervals against dense fp32.

    python -m benchmarks.comm --out FILE.json --part training_fair [--fair-methods NAME ...]

Issue 23's rigor item: the committed training part tuned dense AdamS on 9 runs, SCAPE-99 on 27 and FP8 and
GIFT on none (they took dense's rate), chose and reported on the same validation loss, with one seed.
Here:

Splits
    Training leaves out both :data:`lab.training.data.VALIDATION_PLAYS` and :data:`TEST_PLAYS` (four more
    plays of the same four kinds) in every run, tuning and test alike, so the training stream is the
    same for both. Tuning runs never evaluate the test split (``TrainConfig.eval_test`` off); the test
    runs evaluate it once, after their last step.

Configurations (fixed before this part runs)
    Each method is one configuration read from the committed training part
    (``training_detail.tuning`` of ``benchmarks/results/comm.json``): dense AdamS at its chosen beta1 for
    ``fp32`` (the all-reduce hook), ``bf16``, ``fp8`` and ``gift_fp8`` (GIFT with the committed damping and
    EMA); ``fp8_e5m2``, ``nvfp4`` and their GIFT forms ``gift_fp8_e5m2``, ``gift_nvfp4`` (:data:`LOW_PRECISION`:
    the same dense AdamS, issue 23 item 3's lower formats); SCAPE-90 and SCAPE-99 at their chosen mask variant. That exploration (``exploratory_runs``: 9
    runs for AdamS's beta1, 12 for SCAPE-90's variants, 27 for SCAPE-99's, none for the codecs) was on
    the validation split too; it favours SCAPE, whose variants got the most runs.

Tuning (the same for every method)
    One hyper-parameter, the peak learning rate, on a log scale, with a budget of ``budget`` training
    runs at the tuning seed, all from the same start grid (:func:`search_lr`: the best point at an edge
    is extended by a factor 2 past it, an interior best is bracketed by bisecting, in log scale, the wider
    of the two intervals beside it; so a grid never ends with its best point on an edge unless the budget ran out,
    which ``best_on_edge`` reports). The rule picks the lowest final validation loss.

Test
    Each method at its chosen rate, at each of ``test_seeds`` (none of them the tuning seed: new
    initialisations and batch orders), reports the test-split loss; ``vs_fp32`` is the paired relative
    difference ``(method - fp32) / fp32`` per seed with a 95% Student-t interval. A difference is a win
    or a loss only where its interval excludes zero.

Floors
    ``floors``: the test split's cross-entropy under a uniform distribution over the vocabulary and under
    the training split's unigram frequencies (a model that ignores context): every trained row must be far
    below both.

JSON (``training_fair``): ``protocol``, ``floors``, ``methods`` (name -> configuration, source,
``exploratory_runs``, ``tuning``: ``budget``, ``grid`` lr -> validation loss in the order run, ``best_lr``,
``best_on_edge``), ``table`` (rows: ``method``, ``lr``, ``tuning_budget``, ``test_loss`` mean, per seed and
``ci95``, ``val_loss`` mean, ``vs_fp32`` mean, per seed and ``ci95``, ``verdict``, ``bytes_vs_dense``) and
``runs`` (every run's summary).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.comm_time import t_ci95

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "benchmarks" / "results" / "comm.json"
METHODS = ("fp32", "bf16", "fp8", "gift_fp8", "fp8_e5m2", "gift_fp8_e5m2", "nvfp4", "gift_nvfp4", "scape90", "scape99")
#: The lower-precision formats (issue 23, item 3: a regime where Euclidean low precision hurts), each beside
#: GIFT in the same format: (name, hook, hook keywords beyond GIFT's).
LOW_PRECISION = (("fp8_e5m2", "fp8", {"fmt": "e5m2"}), ("gift_fp8_e5m2", "gift_fp8", {"fmt": "e5m2"}),
                 ("nvfp4", "nvfp4", {}), ("gift_nvfp4", "gift_nvfp4", {}))
START_GRID = (2e-3, 4e-3, 8e-3)
BUDGET = 8
TUNING_SEED = 0
TEST_SEEDS = (1, 2, 3)


def search_lr(evaluate: Callable[[float], float], start: Sequence[float] = START_GRID, budget: int = BUDGET) -> dict:
    """Tune one learning rate with a fixed number of evaluations.

    Evaluates the ``start`` grid, then, while evaluations are left: if the best rate is the smallest
    (largest) evaluated, the next is half (twice) it; otherwise the geometric mean of the best and the
    neighbour across the wider of the two intervals beside it (equal widths: the better neighbour), so
    the bracket around the best shrinks on both sides in turn. Ties in loss go to the smaller rate.

    Parameters
    ----------
    evaluate : callable
        ``lr -> loss`` (lower is better), e.g. one training run's final validation loss.
    start : sequence of float
        At least two positive, distinct rates.
    budget : int
        Total evaluations, ``>= len(start)``.

    Returns
    -------
    dict
        ``budget``, ``order`` (rates in the order evaluated), ``grid`` (``"lr" -> loss`` in that order),
        ``best_lr``, ``best_loss`` and ``best_on_edge`` (the best rate is the smallest or largest evaluated).

    Raises
    ------
    ValueError
        Fewer than two distinct start rates, a non-positive rate, or ``budget < len(start)``.
    """
    start = [float(x) for x in start]
    if len(set(start)) < 2 or len(set(start)) != len(start) or min(start) <= 0:
        raise ValueError(f"start must hold at least two distinct positive rates, got {start}")
    if budget < len(start):
        raise ValueError(f"budget {budget} is smaller than the start grid ({len(start)} rates)")
    loss: dict[float, float] = {}
    order: list[float] = []

    def run(lr: float) -> None:
        loss[lr] = float(evaluate(lr))
        order.append(lr)

    for lr in start:
        run(lr)
    while len(order) < budget:
        lrs = sorted(loss)
        i = min(range(len(lrs)), key=lambda j: (loss[lrs[j]], lrs[j]))
        if i == 0:
            nxt = lrs[0] / 2
        elif i == len(lrs) - 1:
            nxt = lrs[-1] * 2
        else:  # bisect (in log scale) the wider of the two intervals beside the best: a shrinking bracket
            lo, hi = lrs[i] / lrs[i - 1], lrs[i + 1] / lrs[i]
            if math.isclose(lo, hi, rel_tol=1e-9):
                j = i - 1 if loss[lrs[i - 1]] <= loss[lrs[i + 1]] else i + 1
            else:
                j = i - 1 if lo > hi else i + 1
            nxt = math.sqrt(lrs[i] * lrs[j])
        run(nxt)
    lrs = sorted(loss)
    best = min(lrs, key=lambda x: (loss[x], x))
    return {"budget": budget, "order": order, "grid": {f"{lr:.6g}": loss[lr] for lr in order}, "best_lr": best,
            "best_loss": loss[best], "best_on_edge": best in (lrs[0], lrs[-1])}


def floors(test_plays: Sequence[str]) -> dict:
    """Test-split cross-entropy (nats per token) of two context-free predictors: uniform over the
    tokenizer's vocabulary, and the training split's unigram frequencies (add-one smoothed)."""
    import torch

    from lab.training.data import VALIDATION_PLAYS, TextCorpus

    corpus = TextCorpus(VALIDATION_PLAYS, test_plays=test_plays)
    v = corpus.tokenizer.vocab_size
    counts = torch.bincount(corpus.train_tokens, minlength=v).double() + 1
    logp = torch.log(counts / counts.sum())
    return {"uniform": math.log(v), "unigram": float(-logp[corpus.test_tokens].mean()), "vocab_size": v,
            "test_tokens": int(corpus.test_tokens.numel()), "train_tokens": int(corpus.train_tokens.numel()),
            "n_unknown_test": corpus.n_unknown_test}


def configurations(path: Path = COMMITTED) -> dict[str, dict]:
    """Each method's fixed configuration (no ``lr``) from the committed training part, with ``source`` and
    ``exploratory_runs``."""
    from benchmarks.comm import FULL, _gift_kwargs

    if not path.is_file():
        raise FileNotFoundError(f"{path}: run `python -m benchmarks.comm --part training` first (its choices are the inputs)")
    detail = json.loads(path.read_text())["training_detail"]
    tuning = detail["tuning"]

    def kwargs_of(method: str, variant: str) -> dict:
        kw = dict(tuning[method]["variants"][variant]["optimizer_kwargs"])
        if "betas" in kw:
            kw["betas"] = tuple(kw["betas"])
        return kw

    def runs_of(method: str) -> int:
        return sum(len(e["grid"]) for e in tuning[method]["variants"].values())

    dv = tuning["adams"]["best_variant"]
    dense_kw = kwargs_of("adams", dv)
    gk = detail["gift_kwargs"]
    gift = _gift_kwargs(dataclasses.replace(FULL, gift_ema=gk["ema"]), gk["damping"])
    src = f"{path.name} training_detail.tuning"
    out = {}
    dense = (("fp32", "fp32", {}), ("bf16", "bf16", {}), ("fp8", "fp8", {}), ("gift_fp8", "gift_fp8", {}), *LOW_PRECISION)
    for name, comm, fmt_kwargs in dense:
        is_gift = comm.startswith("gift")
        out[name] = {"optimizer": "adams", "optimizer_kwargs": dense_kw, "comm": comm,
                     "comm_kwargs": {**gift, **fmt_kwargs} if is_gift else dict(fmt_kwargs),
                     "source": f"{src}.adams variant {dv} (beta1)" + (f"; GIFT damping {gk['damping']:g}, ema {gk['ema']:g}"
                                                                      if is_gift else ""),
                     "exploratory_runs": runs_of("adams") if name == "fp32" else 0}
    for name, sparsity in (("scape90", 0.9), ("scape99", 0.99)):
        v = tuning[name]["best_variant"]
        out[name] = {"optimizer": "scape", "optimizer_kwargs": {"sparsity": sparsity, **kwargs_of(name, v)},
                     "source": f"{src}.{name} variant {v}", "exploratory_runs": runs_of(name)}
    return out


def _verdict(ci: list[float] | None) -> str:
    if ci is None:
        return "no interval"
    if ci[1] < 0:
        return "lower than fp32"
    if ci[0] > 0:
        return "higher than fp32"
    return "not distinguishable from fp32"


def summarize(names: Sequence[str], tuned: dict[str, dict], configs: dict[str, dict], test: dict[str, dict[int, dict]],
              seeds: Sequence[int]) -> list[dict]:
    """The ``table`` rows: per method its tuned rate and budget, the test ``seeds``, test loss (mean, per seed,
    95% t interval), validation loss (mean, per seed; ``val_loss_ci95`` its 95% t interval), bytes and, but
    for ``fp32``, the paired relative difference to ``fp32`` by seed with its interval and verdict. ``test``: method -> seed -> one run's summary (``test_loss``, ``val_loss``,
    ``bytes_vs_dense``)."""
    table = []
    for n in names:
        per = [test[n][sd]["test_loss"] for sd in seeds]
        ref = [test["fp32"][sd]["test_loss"] for sd in seeds]
        rel = [(a - b) / b for a, b in zip(per, ref)]
        val = [test[n][sd]["val_loss"] for sd in seeds]
        row = {"method": n, "lr": tuned[n]["best_lr"], "tuning_budget": tuned[n]["budget"],
               "best_on_edge": tuned[n]["best_on_edge"], "exploratory_runs": configs[n]["exploratory_runs"],
               "seeds": list(seeds),
               "test_loss": {"mean": statistics.fmean(per), "per_seed": per, "ci95": t_ci95(per)},
               "val_loss": {"mean": statistics.fmean(val), "per_seed": val}, "val_loss_ci95": t_ci95(val),
               "bytes_vs_dense": statistics.fmean(test[n][sd]["bytes_vs_dense"] for sd in seeds)}
        if n != "fp32":
            ci = t_ci95(rel)
            row["vs_fp32"] = {"mean": statistics.fmean(rel), "per_seed": rel, "ci95": ci}
            row["verdict"] = _verdict(ci)
        table.append(row)
    return table


def run_fair(methods: Sequence[str] | None = None, *, budget: int = BUDGET, start: Sequence[float] = START_GRID,
             test_seeds: Sequence[int] = TEST_SEEDS, workdir: Path | None = None, committed: Path = COMMITTED,
             settings=None) -> dict:
    """Tune every method by :func:`search_lr` on validation, then test each at ``test_seeds``; the
    ``training_fair`` block (see the module docstring). ``fp32`` always runs (the reference)."""
    from benchmarks.comm import FULL, _Runner
    from lab.training.data import TEST_PLAYS

    s = settings or FULL
    configs = configurations(committed)
    names = [m for m in METHODS if m in set(methods or METHODS) | {"fp32"}]
    unknown = sorted(set(methods or ()) - set(METHODS))
    if unknown:
        raise KeyError(f"training_fair has no method {unknown}; known: {', '.join(METHODS)}")
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="lab-comm-fair-"))
    t0 = time.perf_counter()
    split = {"test_plays": list(TEST_PLAYS)}

    def spec(name: str, lr: float, **extra) -> dict:
        c = configs[name]
        return {"lr": lr, **{k: v for k, v in c.items() if k not in ("source", "exploratory_runs")}, **split, **extra}

    tune_runner = _Runner(dataclasses.replace(s, seed=TUNING_SEED), wd / "tuning")
    tuned: dict[str, dict] = {}
    for name in names:
        def evaluate(lr: float, name=name) -> float:
            rid = f"{name}_lr{lr:.6g}"
            return tune_runner.run_many({rid: spec(name, lr)})[rid]["val_loss"]

        tuned[name] = search_lr(evaluate, start, budget)
    test: dict[str, dict[int, dict]] = {n: {} for n in names}
    runs = {f"tuning/{k}": v for k, v in tune_runner.results.items()}
    for seed in test_seeds:
        runner = _Runner(dataclasses.replace(s, seed=seed), wd / f"test_seed{seed}")
        res = runner.run_many({f"{n}_seed{seed}": spec(n, tuned[n]["best_lr"], eval_test=True) for n in names})
        for n in names:
            test[n][seed] = res[f"{n}_seed{seed}"]
        runs.update({f"test/{k}": v for k, v in runner.results.items()})
    table = summarize(names, tuned, configs, test, list(test_seeds))
    keep = ("val_loss", "test_loss", "train_loss", "bytes_per_step", "bytes_vs_dense", "step_s", "wall_s", "lr",
            "optimizer", "comm", "optimizer_kwargs", "mask_coverage")
    return {
        "protocol": {"steps": s.train_steps, "model": s.train_model, "ranks": s.nproc, "batch_size_per_rank": s.batch_size,
                     "hyper_parameter": "peak learning rate (log scale)", "budget": budget, "start_grid": list(start),
                     "rule": "search_lr: extend x2 past an edge best, else bisect (log scale) the wider interval beside the best "
                             "(equal widths: towards the better neighbour); lowest final validation loss wins",
                     "tuning_seed": TUNING_SEED, "test_seeds": list(test_seeds), "test_plays": list(TEST_PLAYS),
                     "interval": "95% Student-t over the test seeds, of the mean or of the paired relative difference to fp32"},
        "floors": floors(TEST_PLAYS),
        "methods": {n: {**configs[n], "tuning": tuned[n]} for n in names},
        "table": table,
        "runs": {k: {f: v[f] for f in keep if f in v} for k, v in runs.items()},
        "wall_s": time.perf_counter() - t0,
        "methods_run": names,
    }


def merge_fair(old: dict | None, new: dict) -> dict:
    """``new``'s methods replace ``old``'s; the rest of ``old``'s rows stay only if the reference re-ran
    identically (the tuning and test of fp32 are deterministic), else ``new`` alone."""
    if not old:
        return new
    same = [r for r in old["table"] if r["method"] == "fp32"] == [r for r in new["table"] if r["method"] == "fp32"]
    if not same:
        return new
    rows = {r["method"]: r for r in old["table"]}
    rows.update({r["method"]: r for r in new["table"]})
    return {**new, "methods": {**old["methods"], **new["methods"]}, "runs": {**old["runs"], **new["runs"]},
            "table": [rows[m] for m in METHODS if m in rows], "methods_run": [m for m in METHODS if m in rows]}
