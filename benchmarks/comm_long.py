"""SCAPE against dense AdamS over a long horizon: does the validation-loss gap shrink, hold or grow?

    python -m benchmarks.comm --out FILE.json --part long_run [--long-steps 3000] [--long-seeds 0 1 2]

Issue 23 item 4: SCAPE at 99% ended +19.6% above dense AdamS after 400 steps (90%: +3.6%), and 400 steps may
be dominated by the start. Every method here is one ``launch(config, nproc)`` run per seed (2 ranks, gloo,
sequential), the training part's model, batch and schedule (linear warm-up, cosine to 0.1 of the peak over
``steps``), evaluated every ``eval_interval`` steps on the same fixed held-out windows.

Methods and their settings come from the committed training part (``training_detail.tuning`` of
``benchmarks/results/comm.json``): each one's best variant and learning rate at 400 steps, tuned there on
the validation split with the same three-point grid per variant (extended at an edge). They are *not*
re-tuned for the longer horizon (a cosine over 3,000 steps spends longer at high rates; the rates that
suit 400 steps may not suit 3,000): the table says so. ``scape99_warmup`` adds Deep Gradient Compression's
exponential sparsity warm-up (``sparsity_warmup``: 75%, 93.75%, 98.4%, 99% over the first
``warmup_fraction`` of the run) to SCAPE-99's best variant, at its rate.

``nvfp4`` is dense AdamS with its gradients all-reduced in NVFP4 (:mod:`lab.training.comm.codecs`, 0.14 of
fp32's bytes), at dense AdamS's rate: issue 23 item 3 asks whether Euclidean low precision hurts anywhere.

``scape99_momentum_correction`` is SCAPE-99 with Deep Gradient Compression's momentum correction and
momentum factor masking (``momentum_correction``, ``mask_score="accum"``), ``scape90_momentum_correction``
SCAPE-90 with them on its random mask, each at the rate its own grid chose.
``--long-methods`` runs only some methods (dense AdamS always runs, as the reference of the gaps); the
file's other methods are kept, and the re-run dense AdamS is compared with the committed one
(``adams_rerun_max_abs_diff``); the new methods' gaps are to that re-run (``gap_reference``).

JSON (``long_run``): ``steps``, ``seeds``, ``methods`` (name -> optimizer, kwargs, lr, source), ``val_loss``
(name -> checkpoint step -> per-seed list), ``gap`` (name -> step -> mean relative gap to dense AdamS over
the seeds, paired by seed, with a 95% t interval), ``bytes_vs_dense`` (name -> mean over the seeds) and
``runs`` (every run's summary).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.comm_time import t_ci95

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "benchmarks" / "results" / "comm.json"


def _committed_methods(path: Path, warmup_steps: int) -> dict[str, dict]:
    """The dense AdamS, SCAPE-90 and SCAPE-99 rows of the committed training part: best variant and rate."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run `python -m benchmarks.comm --part training` first (its tuned settings are the inputs)")
    tuning = json.loads(path.read_text())["training_detail"]["tuning"]
    out = {}
    for name, sparsity in (("adams", None), ("scape90", 0.9), ("scape99", 0.99)):
        t = tuning[name]
        v = t["best_variant"]
        kwargs = dict(t["variants"][v]["optimizer_kwargs"])
        if "betas" in kwargs:
            kwargs["betas"] = tuple(kwargs["betas"])
        spec = {"lr": float(t["best_lr"]), "optimizer": "adams" if sparsity is None else "scape",
                "optimizer_kwargs": kwargs if sparsity is None else {"sparsity": sparsity, **kwargs}}
        out[name] = {**spec, "source": f"{path.name} training_detail.tuning.{name}: variant {v}, lr {t['best_lr']:g} (400 steps)"}
    # dense AdamS with its gradients all-reduced in NVFP4 (the lowest format here, 9.5% relative error), at dense
    # AdamS's rate: does a Euclidean error that does not hurt at 400 steps hurt over the long horizon?
    out["nvfp4"] = {**{k: v for k, v in out["adams"].items() if k != "source"}, "comm": "nvfp4", "comm_kwargs": {},
                    "source": out["adams"]["source"] + " with comm nvfp4"}
    w = dict(out["scape99"])
    w["optimizer_kwargs"] = {**w["optimizer_kwargs"], "sparsity_warmup": warmup_steps}
    w["source"] = out["scape99"]["source"] + f" + sparsity_warmup={warmup_steps}"
    out["scape99_warmup"] = w
    # DGC's momentum correction (99%: with DGC's top-|accumulator| mask; 90%: the random mask), each at its
    # own tuned rate, when it was tuned
    for name, sparsity, variant in (("scape90", 0.9, "momentum_correction"), ("scape99", 0.99, "momentum_correction_accum")):
        mc = tuning[name]["variants"].get(variant)
        if mc is not None:
            kwargs = {k: (tuple(v) if k == "betas" else v) for k, v in mc["optimizer_kwargs"].items()}
            out[f"{name}_momentum_correction"] = {
                "lr": float(mc["best_lr"]), "optimizer": "scape", "optimizer_kwargs": {"sparsity": sparsity, **kwargs},
                "source": f"{path.name} training_detail.tuning.{name}: variant {variant}, lr {mc['best_lr']:g} (400 steps)"}
    return out


def merge_long(old: dict | None, new: dict) -> dict:
    """``new`` (some methods beside a dense AdamS re-run) folded into the committed ``old`` block (same steps
    and seeds): methods, losses, gaps, bytes and runs added. The gaps of ``new`` are against its own dense
    re-run, kept as ``val_loss["adams_beside_<method>"]`` (runs ``adams_beside_<method>_seed<s>``) and named in
    ``gap_reference``; ``adams_rerun_max_abs_diff`` compares the re-run with the committed dense AdamS."""
    if not old or not new.get("methods_run") or old.get("steps") != new["steps"] or old.get("seeds") != new["seeds"]:
        return new
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in old.items()}
    added = [m for m in new["methods_run"] if m != "adams"]
    ref = f"adams_beside_{'_'.join(added)}"
    for key in ("methods", "gap", "bytes_vs_dense"):
        out[key].update({m: v for m, v in new[key].items() if m != "adams"})
    out["val_loss"].update({m: new["val_loss"][m] for m in added})
    out["val_loss"][ref] = new["val_loss"]["adams"]
    out["runs"].update({(k.replace("adams_", f"{ref}_", 1) if k.startswith("adams_seed") else k): v for k, v in new["runs"].items()})
    out["gap_reference"] = {**old.get("gap_reference", {}), **dict.fromkeys(added, ref)}
    a_old, a_new = old["val_loss"]["adams"], new["val_loss"]["adams"]
    out["adams_rerun_max_abs_diff"] = {**old.get("adams_rerun_max_abs_diff", {}),
                                       ref: max(abs(x - y) for t in a_old for x, y in zip(a_old[t], a_new.get(t, a_old[t])))}
    out["wall_s"] = old.get("wall_s", 0.0) + new["wall_s"]
    out["notes"] = [*old.get("notes", []), f"{', '.join(added)}: run later beside a re-run of dense AdamS ({ref}); "
                    "their gaps are to that re-run (gap_reference)"]
    out.pop("methods_run", None)
    return out


def summarize(val: dict[str, dict[int, dict[int, float]]], seeds: list[int]) -> dict:
    """``val``: method -> seed -> {step: val loss}. Per method and checkpoint: the per-seed losses, and
    the gap to ``adams`` ((method - adams) / adams, paired by seed) with its mean and 95% t interval."""
    steps = sorted(set.intersection(*(set(v[s]) for v in val.values() for s in seeds if s in v)))
    table = {m: {str(t): [v[s][t] for s in seeds if s in v] for t in steps} for m, v in val.items()}
    gap = {}
    for m, v in val.items():
        if m == "adams":
            continue
        gap[m] = {}
        for t in steps:
            g = [(v[s][t] - val["adams"][s][t]) / val["adams"][s][t] for s in seeds if s in v and s in val["adams"]]
            gap[m][str(t)] = {"mean": statistics.fmean(g), "ci95": t_ci95(g), "per_seed": g}
    return {"checkpoints": steps, "val_loss": table, "gap": gap}


def run_long(steps: int = 3000, seeds: tuple[int, ...] = (0, 1, 2), eval_interval: int = 250,
             warmup_fraction: float = 0.1, workdir: Path | None = None, committed: Path = COMMITTED,
             methods: tuple[str, ...] | None = None) -> dict:
    """Every method at every seed for ``steps`` steps; returns the ``long_run`` block (see the module docstring)."""
    from benchmarks.comm import FULL, _Runner

    specs = _committed_methods(committed, int(round(warmup_fraction * steps)))
    if methods:
        specs = {k: v for k, v in specs.items() if k in methods or k == "adams"}
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="lab-comm-long-"))
    t0 = time.perf_counter()
    val: dict[str, dict[int, dict[int, float]]] = {m: {} for m in specs}
    runs: dict[str, dict] = {}
    for seed in seeds:
        s = dataclasses.replace(FULL, train_steps=steps, eval_interval=eval_interval, seed=seed)
        runner = _Runner(s, wd / f"seed{seed}")
        res = runner.run_many({f"{m}_seed{seed}": {k: v for k, v in spec.items() if k != "source"} for m, spec in specs.items()})
        for m in specs:
            r = res[f"{m}_seed{seed}"]
            val[m][seed] = {int(k): v for k, v in r["val_loss_by_step"].items()}
            runs[f"{m}_seed{seed}"] = {k: r[k] for k in ("val_loss", "train_loss", "bytes_per_step", "bytes_vs_dense", "step_s",
                                                        "wall_s", "lr", "optimizer_kwargs", "mask_coverage") if k in r}
    out = {"steps": steps, "seeds": list(seeds), "eval_interval": eval_interval, "model": FULL.train_model,
           "ranks": FULL.nproc, "batch_size_per_rank": FULL.batch_size,
           "methods": specs, **summarize(val, list(seeds)),
           "bytes_vs_dense": {m: statistics.fmean(runs[f"{m}_seed{s}"]["bytes_vs_dense"] for s in seeds) for m in specs},
           "runs": runs, "wall_s": time.perf_counter() - t0, "methods_run": sorted(specs) if methods else None,
           "notes": ["rates and variants tuned at 400 steps on the validation split (training part), not re-tuned for this horizon",
                     "gap = (method - adams) / adams in validation loss, paired by seed; 95% t interval over the seeds"]}
    return out
