"""ConFiner video generation: each expert alone at its full step count against ConFiner's modes, and ConFiner-Long.

    OMP_NUM_THREADS=1 python -m benchmarks.video --out benchmarks/results/video.json [--videos 64] [--modes ...]
        [--long-videos 16] [--no-long] [--seed 0] [--reselect]
    python -m benchmarks.video --out benchmarks/results/video.json --table     # the README's tables

Rows are merged into ``--out`` by mode, so the benchmark can be run in pieces (``--modes a b`` then
``--modes c``; ``--only-long``). Every mode generates the same ``--videos`` unconditional 8-frame 32x32
videos from the same seeded noise (video ``i``'s control / expert noise is drawn from seed ``seed + i``).

Modes (``results`` rows): ``control_expert_alone`` (8 Euler/DDIM steps, flow_sigma), ``control_stage_4`` (the
same expert at 4 steps: ConFiner's V0 before refinement, the input every 4 + 5 row refines), ``spatial_expert_alone``
and ``temporal_expert_alone`` (100 DDIM steps each, their own schedules), ``confiner_coordinated`` (4 + 5
steps), ``confiner_coordinated_18`` (8 + 10), ``confiner_coordinated_other_renoise`` (4 + 5, the re-noising
``eps`` of Eqs. 9/11 that was not chosen), ``confiner_spatial_only``, ``confiner_temporal_only`` (4 + 5) and
``confiner_naive_alternation`` (Eq. 7, 4 + 15 steps: the coordinated NFE). **Tuning** (:func:`select`, equal
budget): every ConFiner row gets its own T_e from the same grid :data:`T_E_GRID` (10 values), chosen by the
lowest Frechet distance to the **validation** frames over 64 videos from seeds 10000+ (never the test seeds);
the coordinated rows' re-noising reading (fresh Gaussian or predicted noise) is a second choice on the same
split (its 4 + 5 grid is therefore 2 x 10). The test numbers are computed once, after the selection.
Reference rows: ``real_heldout`` (test-split clips, stride 1: scored against themselves, a ceiling no model
trained on the other frames can reach), ``real_train_clips`` (64 random *training* clips, seed 0: what a
perfect model of the training clips would score, the practical floor of the held-out metrics), and
``static_train_frame`` (the do-nothing generator: one *training* frame repeated 8 times, 64 frames evenly
spaced over the training split; it scores perfect consistency and smoothness, which is what those two
metrics alone reward, and ``motion_distance`` exposes it).

Metrics (:mod:`lab.generative.video.metrics`), features from a small autoencoder trained on the training
frames (seed 0, shipped as ``encoder.safetensors``): ``frame_quality`` = Frechet distance of generated frames' features to the held-out test
frames' (lower is better; 95 % BCa interval by bootstrap over videos, 200 resamples); ``frame_quality_train``
the same against the training frames (FID's usual reference set); ``frame_quality_minus_control`` the
paired difference to ``control_expert_alone`` (video ``i`` of every mode starts from the same noise; one
bootstrap resample of video indices serves both, 1000 resamples: an interval excluding 0 is a real
difference); ``psnr_nn`` / ``ssim_nn``
to the nearest held-out frame, ``subject_consistency`` (VBench), ``motion_smoothness`` (VBench's score
with a linear interpolator), ``motion_distance`` (:func:`~lab.generative.video.metrics.motion_distance`: how
far the distribution of frame-to-frame feature jumps is from the stride-1 *training* clips', the motion the
experts were taught; BCa interval over videos), ``motion_distance_heldout`` (the same against the stride-1 test
clips: the few test blocks happen to be calmer than the training ones, so this reference rewards stillness; the
README gives the mean jumps), ``mean_frame_jump``, ``subject_consistency_minus_control`` (paired per video, t
interval), the 4 + 5 rows' paired differences to ``control_stage_4`` (``frame_quality_minus_control_stage``,
``subject_consistency_minus_control_stage``: does refinement improve on its own input?), ``nfe`` (expert calls
per video: a call on a batch counts once per video) and ``s_per_video`` (wall time of a batch of 16 / 16, one
thread); intervals are 95 % t intervals over videos (over batches for time). ``long``: ConFiner-Long, 64
frames, T_e chosen by :func:`select_long` on validation seeds, with every strategy, none, and each one switched
off; ``seam_jump`` = mean feature jump across the 7 segment seams, ``seam_flicker`` = that over the mean jump
inside segments (1 = seams invisible). ``paired``: the comparisons of :data:`PAIRS` (ConFiner against each expert
alone, the ablation rows against coordinated ConFiner) on the same noise seeds, FD (paired BCa), consistency (t)
and motion distance (paired BCa) differences. ``denoising`` (:func:`denoising`): each expert's clean-sample
estimate from real test clips at the same noise-to-signal ratios, the premise the refinement rests on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from lab.generative.video import confiner as cf
from lab.generative.video import datasets, metrics
from lab.generative.video.experts import load_expert

FRAMES, SIZE, BATCH = 8, 32, 16
MODES = ["control_expert_alone", "control_stage_4", "spatial_expert_alone", "temporal_expert_alone", "confiner_coordinated",
         "confiner_coordinated_18", "confiner_coordinated_other_renoise", "confiner_spatial_only", "confiner_temporal_only", "confiner_naive_alternation",
         "real_heldout", "real_train_clips", "static_train_frame"]
#: T_e values every ConFiner mode is tuned over (on the validation split): an earlier grid (10 ... 200) had its best
#: point on its lower edge (16x16 experts), a later one (2 ... 400) on its upper edge (32x32), so it spans 2 ... 1000
T_E_GRID = (2, 5, 10, 25, 50, 100, 200, 400, 700, 1000)
#: ConFiner-Long's grid (the same values)
T_E_GRID_LONG = T_E_GRID
#: ConFiner rows: (refinement mode, control steps, refinement steps)
CONFINER = {"confiner_coordinated": ("coordinated", 4, 5), "confiner_coordinated_18": ("coordinated", 8, 10),
            "confiner_coordinated_other_renoise": ("coordinated", 4, 5), "confiner_spatial_only": ("spatial_only", 4, 5),
            "confiner_temporal_only": ("temporal_only", 4, 5), "confiner_naive_alternation": ("naive_alternation", 4, 5)}
#: paired comparisons, (row, reference): the issue's goal (ConFiner against each expert alone at its full step count)
#: and the paper's ablation (Table 5: every other refinement against coordinated ConFiner)
PAIRS = (("confiner_coordinated", "spatial_expert_alone"), ("confiner_coordinated", "temporal_expert_alone"),
         ("confiner_coordinated", "control_expert_alone"), ("confiner_coordinated_18", "spatial_expert_alone"),
         ("confiner_coordinated_18", "temporal_expert_alone"), ("confiner_spatial_only", "confiner_coordinated"),
         ("confiner_temporal_only", "confiner_coordinated"), ("confiner_naive_alternation", "confiner_coordinated"))
#: noise-to-signal ratios sigma_t / alpha_t of the denoising diagnostic (t = 10 ... 850 on the three schedules)
NOISE_TO_SIGNAL = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
LONG = {"all_strategies": (True, True, True), "none": (False, False, False), "no_consistency_init": (False, True, True),
        "no_coherence_guidance": (True, False, True), "no_staggered": (True, True, False)}


def _noise(i0: int, n: int, seed: int) -> torch.Tensor:
    return torch.stack([torch.randn((FRAMES, SIZE, SIZE), generator=torch.Generator().manual_seed(seed + i)) for i in range(i0, i0 + n)])


def select(ex: dict, enc, seed: int, n: int = 64) -> dict:
    """Tune every ConFiner row on the **validation** split with the same grid :data:`T_E_GRID`: the T_e with the
    lowest Frechet distance to the val frames over ``n`` videos from seeds ``seed + 10000 ...`` (not the test
    videos' seeds). The coordinated 4 + 5 row also chooses its re-noising reading (fresh / predicted) there;
    ``confiner_coordinated_other_renoise`` then takes the other reading at its own best T_e."""
    val_feats = metrics.features(enc, datasets.frames("val", SIZE)[:, 0].unsqueeze(0)).numpy()[0]
    z = _noise(10_000, n, seed)
    grid = []

    def run(row, renoise):
        mode, c, r = CONFINER[row]
        for t_e in T_E_GRID:
            g = cf.confiner(z, ex["control"], ex["spatial"], ex["temporal"], c, r, t_e, mode, seed=seed + 10_000, renoise=renoise)
            f = metrics.features(enc, g.video.clamp(-1, 1))
            grid.append({"row": row, "mode": mode, "control_steps": c, "refine_steps": r, "renoise": renoise, "t_e": t_e,
                         "val_frame_quality": metrics.frechet_distance(f.flatten(0, 1).numpy(), val_feats),
                         "val_subject_consistency": float(metrics.subject_consistency(f).mean())})
        return min((q for q in grid if q["row"] == row and q["renoise"] == renoise), key=lambda q: q["val_frame_quality"])

    with tqdm(total=7, desc="select (val)") as bar:
        fresh, pred = run("confiner_coordinated", "fresh"), run("confiner_coordinated", "predicted")
        bar.update(2)
        coord, other = (fresh, pred) if fresh["val_frame_quality"] <= pred["val_frame_quality"] else (pred, fresh)
        chosen = {"confiner_coordinated": {"t_e": coord["t_e"], "renoise": coord["renoise"]},
                  "confiner_coordinated_other_renoise": {"t_e": other["t_e"], "renoise": other["renoise"]}}
        chosen["confiner_coordinated_18"] = {"t_e": run("confiner_coordinated_18", coord["renoise"])["t_e"], "renoise": coord["renoise"]}
        bar.update(1)
        for row in ("confiner_spatial_only", "confiner_temporal_only", "confiner_naive_alternation"):
            chosen[row] = {"t_e": run(row, "fresh")["t_e"], "renoise": "unused by this mode"}
            bar.update(1)
    return {"rule": f"per row, the T_e in {list(T_E_GRID)} with the lowest Frechet distance to the validation frames, "
                    f"{n} videos (seeds {seed + 10_000}+); the coordinated row also picks the re-noising reading",
            "grid": grid, "chosen": chosen}


def select_long(ex: dict, enc, seed: int, n: int = 4) -> dict:
    """ConFiner-Long's T_e, chosen apart from the single-segment rows (a seam needs noise to be repaired): the value
    in :data:`T_E_GRID_LONG` with the lowest mean **seam jump** (:func:`~lab.generative.video.metrics.seam_jump`) of
    the all-strategies configuration over ``n`` 64-frame videos from seeds ``seed + 10000 ...`` (the test videos use
    ``seed + i``); fresh re-noising (confiner_long's default). Not the seam *flicker* ratio: that one falls as T_e
    grows because every frame then jumps more (the last run picked 700 by it, with 64-frame consistency 0.38)."""
    grid = []
    for t_e in tqdm(T_E_GRID_LONG, desc="select long (val seeds)"):
        fl, sj = [], []
        for i in range(n):
            g = cf.confiner_long(64, ex["control"], ex["spatial"], ex["temporal"], FRAMES, SIZE, seed=seed + 10_000 + i, t_e=t_e,
                                 renoise="fresh")
            f = metrics.features(enc, g.video.clamp(-1, 1))
            fl.append(float(metrics.seam_flicker(f, FRAMES)[0]))
            sj.append(float(metrics.seam_jump(f, FRAMES)[0]))
        grid.append({"t_e": t_e, "val_seam_jump": float(np.mean(sj)), "val_seam_flicker": float(np.mean(fl))})
    best = min(grid, key=lambda q: q["val_seam_jump"])
    return {"rule": f"T_e in {list(T_E_GRID_LONG)} with the lowest mean seam jump, all strategies on, {n} videos (seeds {seed + 10_000}+)",
            "grid": grid, "t_e": best["t_e"]}


def generate(mode: str, ex: dict, n: int, seed: int, chosen: dict | None = None):
    """(videos (n, F, H, W), nfe per video, seconds per video of each batch)."""
    if mode == "real_heldout":
        v = datasets.clips("test", FRAMES, SIZE, stride=1)
        return v, 0, [0.0]
    if mode == "real_train_clips":
        c = datasets.clips("train", FRAMES, SIZE)
        idx = torch.randint(0, c.shape[0], (n,), generator=torch.Generator().manual_seed(seed))
        return c[idx], 0, [0.0]
    if mode == "static_train_frame":
        f = datasets.frames("train", SIZE)[:, 0]
        idx = torch.linspace(0, f.shape[0] - 1, n).round().long()
        return f[idx].unsqueeze(1).expand(n, FRAMES, SIZE, SIZE).contiguous(), 0, [0.0]
    vids, secs, nfe = [], [], None
    for i0 in tqdm(range(0, n, BATCH), desc=mode, leave=False):
        b = min(BATCH, n - i0)
        z = _noise(i0, b, seed)
        if mode.endswith("_alone"):
            g = cf.sample_expert(ex[mode.split("_")[0]], z)
        elif mode == "control_stage_4":
            g = cf.sample_expert(ex["control"], z, 4)
        else:
            mode_, c, r = CONFINER[mode]
            ch = (chosen or {}).get(mode, {"renoise": "fresh", "t_e": 100})
            ren = ch["renoise"] if mode_ == "coordinated" else "fresh"  # the other modes never re-noise
            g = cf.confiner(z, ex["control"], ex["spatial"], ex["temporal"], c, r, ch["t_e"], mode_, seed=seed + i0, renoise=ren)
        vids.append(g.video.clamp(-1, 1))
        secs.append(g.seconds / b)
        nfe = g.nfe
    return torch.cat(vids), nfe, secs


def video_bootstrap_ci(stat, n: int, seed: int, n_boot: int = 1000) -> list[float]:
    """95 % BCa interval (``scipy.stats.bootstrap``) of ``stat(idx)``, a statistic of the videos ``idx`` (an index
    array into ``n`` videos), resampling videos. BCa, not the percentile interval: a Frechet distance is biased
    upward on a resample (repeated videos shrink its covariance), so percentile intervals sat above the estimate.
    A degenerate resampling distribution (every video the same) gives ``[stat, stat]``."""
    from scipy.stats import bootstrap

    est = float(stat(np.arange(n)))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate resampling distribution warns; it is handled below
        res = bootstrap((np.arange(n),), lambda i: stat(np.asarray(i, int)), vectorized=False, n_resamples=n_boot,
                        confidence_level=0.95, method="BCa", random_state=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return [est, est] if not (np.isfinite(lo) and np.isfinite(hi)) else [lo, hi]


def paired_fd_difference(fa: np.ndarray, fb: np.ndarray, real_feats: np.ndarray, seed: int, n_boot: int = 1000) -> dict:
    """FD(a) - FD(b) for two sets of videos paired by index (same noise), features (N, F, d); a 95 % BCa interval
    from bootstrap resamples of the video indices shared by both (:func:`video_bootstrap_ci`)."""
    d = fa.shape[-1]
    fd = lambda x: metrics.frechet_distance(x.reshape(-1, d), real_feats)  # noqa: E731
    diff = lambda i: fd(fa[i]) - fd(fb[i])  # noqa: E731
    return {"mean": diff(np.arange(len(fa))), "ci95": video_bootstrap_ci(diff, len(fa), seed, n_boot), "n": len(fa),
            "what": "paired BCa bootstrap over videos (same noise seeds) of FD(this) - FD(reference), test frames"}


def score(v: torch.Tensor, enc, real_feats: np.ndarray, real_frames: torch.Tensor, seed: int, train_feats: np.ndarray | None = None,
          motion_refs: dict | None = None) -> dict:
    feats = metrics.features(enc, v)
    fl = feats.numpy()
    extra = {}
    for key, (ref, what) in (motion_refs or {}).items():
        md = lambda i, ref=ref: metrics.motion_distance(feats[i], ref)  # noqa: E731
        extra[key] = {"mean": md(np.arange(len(fl))), "ci95": video_bootstrap_ci(md, len(fl), seed, 200), "n": len(fl),
                      "what": f"1-D Wasserstein distance of frame-to-frame feature jumps to {what}', BCa bootstrap over videos "
                              "(0 = the reference's motion; a still video scores the reference's mean jump)"}
    if motion_refs:
        extra["mean_frame_jump"] = metrics.mean_ci(metrics.frame_jumps(feats).mean(1).numpy())
    fdi = lambda i: metrics.frechet_distance(fl[i].reshape(-1, fl.shape[-1]), real_feats)  # noqa: E731
    fd = fdi(np.arange(len(fl)))
    psnr, ssim = metrics.nearest_psnr_ssim(v, real_frames)
    if train_feats is not None:
        extra["frame_quality_train"] = {"mean": metrics.frechet_distance(fl.reshape(-1, fl.shape[-1]), train_feats), "n": len(fl),
                                        "what": "Frechet distance to the training frames (encoder features)"}
    return {
        **extra,
        "frame_quality": {"mean": fd, "ci95": video_bootstrap_ci(fdi, len(fl), seed, 200), "n": len(fl),
                          "what": "Frechet distance to held-out test frames (encoder features), BCa bootstrap over videos"},
        "psnr_nn": metrics.mean_ci(psnr.numpy()), "ssim_nn": metrics.mean_ci(ssim.numpy()),
        "subject_consistency": metrics.mean_ci(metrics.subject_consistency(feats).numpy()),
        "motion_smoothness": metrics.mean_ci(metrics.motion_smoothness(v).numpy()),
    }


def paired_row(mode: str, ref: str, fa: torch.Tensor, fb: torch.Tensor, real_feats: np.ndarray, motion_ref: torch.Tensor,
               seed: int) -> dict:
    """``mode`` minus ``ref`` on the same noise seeds (features (N, F, d) of each): Frechet distance (paired BCa),
    subject consistency (per video, t interval) and motion distance to the training clips (paired BCa)."""
    md = lambda i: metrics.motion_distance(fa[i], motion_ref) - metrics.motion_distance(fb[i], motion_ref)  # noqa: E731
    return {"mode": mode, "versus": ref,
            "frame_quality_diff": paired_fd_difference(fa.numpy(), fb.numpy(), real_feats, seed),
            "subject_consistency_diff": {**metrics.mean_ci((metrics.subject_consistency(fa) - metrics.subject_consistency(fb)).numpy()),
                                         "what": "paired per video (same noise), t interval"},
            "motion_distance_diff": {"mean": md(np.arange(len(fa))), "ci95": video_bootstrap_ci(md, len(fa), seed, 1000), "n": len(fa),
                                     "what": "paired BCa bootstrap over videos of motion distance (training clips) differences"}}


def denoising(ex: dict, seed: int, draws: int = 8) -> dict:
    """Each expert's clean-sample estimate from the non-overlapping test clips at the same noise-to-signal ratios
    (:data:`NOISE_TO_SIGNAL`; ``draws`` noise draws per clip shared by the experts, seed ``seed``; PSNR averaged over
    the draws): which expert recovers held-out frames best from the same corruption. ConFiner's premise is that the spatial expert does
    (its Stable Diffusion 1.5 gives the best aesthetic and imaging scores in the paper's Table 5, spatial-only row);
    ``spatial_minus_<expert>`` is the paired per-clip PSNR difference."""
    clips = datasets.clips("test", FRAMES, SIZE, stride=FRAMES)
    n = clips.shape[0]
    clips = clips.repeat(draws, 1, 1, 1)
    eps = torch.randn(clips.shape, generator=torch.Generator().manual_seed(seed))
    rows = []
    for r in NOISE_TO_SIGNAL:
        psnr = {}
        for name, e in ex.items():
            t, p = metrics.denoising_psnr(e, clips, r, eps)
            psnr[name] = p.view(draws, n).mean(0)
            rows.append({"noise_to_signal": r, "expert": name, "schedule": e.schedule.name, "t": t,
                         "psnr": metrics.mean_ci(psnr[name].numpy())})
        row = next(q for q in rows if q["noise_to_signal"] == r and q["expert"] == "spatial")
        for name in psnr:
            if name != "spatial":
                row[f"spatial_minus_{name}"] = metrics.mean_ci((psnr["spatial"] - psnr[name]).numpy())
    return {"clips": n, "draws": draws, "seed": seed,
            "what": "PSNR (dB, range 2) of x0_hat from x_t = alpha_t x + sigma_t eps, each expert at its own t for the "
                    "ratio sigma_t / alpha_t, averaged over the noise draws; t intervals over the non-overlapping test clips",
            "rows": rows}


LABELS = {"control_expert_alone": "control expert alone", "control_stage_4": "control expert, 4 steps (ConFiner's V0)",
          "spatial_expert_alone": "spatial expert alone", "temporal_expert_alone": "temporal expert alone",
          "confiner_coordinated": "**ConFiner coordinated (4+5)**", "confiner_coordinated_18": "ConFiner coordinated (8+10)",
          "confiner_coordinated_other_renoise": "coordinated, other re-noising", "confiner_spatial_only": "refinement spatial only",
          "confiner_temporal_only": "refinement temporal only", "confiner_naive_alternation": "naive alternation (Eq. 7)",
          "real_heldout": "real held-out clips (scored against themselves)", "real_train_clips": "real *training* clips (64)",
          "static_train_frame": "one training frame repeated (do-nothing floor)"}


def table(doc: dict) -> str:
    """The README's Markdown tables (main rows in :data:`MODES` order, then ConFiner-Long) from a results document."""
    def ci(m, d=1):
        if m is None:
            return ""
        lo, hi = m["ci95"]
        return f"{m['mean']:.{d}f}" if lo == hi else f"{m['mean']:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"

    rows = {r["mode"]: r for r in doc["results"]}
    out = ["| mode | T_e | NFE | FD to test frames | FD minus control (paired) | FD minus its 4-step input (paired) "
           "| subject consistency | consistency minus control (paired) | motion distance | motion smoothness |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for mode in MODES:
        if mode not in rows:
            continue
        r = rows[mode]
        st = r.get("setting")
        t_e = f"{st['t_e']} ({st['renoise']})" if st and st["mode"] == "coordinated" else (str(st["t_e"]) if st else "")
        sc = r["subject_consistency"]
        out.append(f"| {LABELS[mode]} | {t_e} | {r['nfe']['mean']} | {ci(r['frame_quality'])} | {ci(r.get('frame_quality_minus_control'))} "
                   f"| {ci(r.get('frame_quality_minus_control_stage'))} | {ci(sc, 3)} | {ci(r.get('subject_consistency_minus_control'), 3)} "
                   f"| {ci(r.get('motion_distance'), 2)} | {ci(r['motion_smoothness'], 3)} |")
    if doc.get("paired"):
        out += ["", "| row | versus (same noise seeds) | FD difference | subject consistency difference | motion distance difference |",
                "|---|---|---|---|---|"]
        for q in doc["paired"]:
            out.append(f"| {LABELS[q['mode']]} | {LABELS[q['versus']]} | {ci(q['frame_quality_diff'])} "
                       f"| {ci(q['subject_consistency_diff'], 3)} | {ci(q['motion_distance_diff'], 2)} |")
    if doc.get("denoising"):
        rows, names = doc["denoising"]["rows"], ("control", "spatial", "temporal")
        out += ["", "| sigma_t / alpha_t | " + " | ".join(f"{k} expert: t, PSNR of x0_hat (dB)" for k in names)
                + " | spatial minus control | spatial minus temporal |", "|---" * (3 + len(names)) + "|"]
        for r in sorted({q["noise_to_signal"] for q in rows}):
            by = {q["expert"]: q for q in rows if q["noise_to_signal"] == r}
            out.append(f"| {r:g} | " + " | ".join(f"{by[k]['t']}: {ci(by[k]['psnr'], 2)}" for k in names)
                       + f" | {ci(by['spatial']['spatial_minus_control'], 2)} | {ci(by['spatial']['spatial_minus_temporal'], 2)} |")
    if doc.get("long"):
        out += ["", "| ConFiner-Long (64 frames) | T_e | NFE | seam jump | seam flicker | subject consistency (64 frames) |",
                "|---|---|---|---|---|---|"]
        for r in doc["long"]:
            out.append(f"| {r['config'].replace('_', ' ')} | {r['t_e']} | {r['nfe']} | {ci(r['seam_jump'], 2)} | {ci(r['seam_flicker'], 2)} "
                       f"| {ci(r['subject_consistency_64'], 3)} |")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--videos", type=int, default=64)
    p.add_argument("--modes", nargs="*", default=MODES, choices=MODES)
    p.add_argument("--long-videos", type=int, default=16)
    p.add_argument("--no-long", action="store_true")
    p.add_argument("--only-long", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reselect", action="store_true", help="redo the validation selection of T_e / re-noising")
    p.add_argument("--select-videos", type=int, default=64, help="validation videos per setting in the selection")
    p.add_argument("--table", action="store_true", help="print --out's tables as Markdown (the README's) and exit")
    a = p.parse_args(argv)
    if a.table:
        print(table(json.loads(Path(a.out).read_text())))
        return
    torch.set_num_threads(1)
    out = Path(a.out)
    doc = json.loads(out.read_text()) if out.exists() else {"results": [], "long": []}
    enc = metrics.load_encoder()
    real_frames = datasets.frames("test", SIZE)
    real_feats = metrics.features(enc, real_frames[:, 0].unsqueeze(0)).numpy()[0]
    motion_refs = {"motion_distance": (metrics.features(enc, datasets.clips("train", FRAMES, SIZE, stride=1)), "the training clips (stride 1)"),
                   "motion_distance_heldout": (metrics.features(enc, datasets.clips("test", FRAMES, SIZE, stride=1)), "the test clips (stride 1)")}
    train_feats = metrics.features(enc, datasets.frames("train", SIZE)[:, 0].unsqueeze(0)).numpy()[0]
    ex = {k: load_expert(k) for k in ("control", "spatial", "temporal")}
    sizes = {k: e.meta.get("size") for k, e in ex.items()} | {"encoder": enc.size}
    if set(sizes.values()) != {SIZE}:
        raise SystemExit(f"benchmarks.video generates {SIZE}x{SIZE} videos, but the shipped weights are sized {sizes}")
    if not a.only_long and ("selection" not in doc or a.reselect or "confiner_coordinated" not in doc["selection"]["chosen"]):
        doc["selection"] = select(ex, enc, a.seed, a.select_videos)
        print(json.dumps(doc["selection"]["chosen"]), flush=True)
    chosen = doc["selection"]["chosen"] if "selection" in doc else {}
    if not a.no_long and ("selection_long" not in doc or a.reselect):
        doc["selection_long"] = select_long(ex, enc, a.seed)
        print(json.dumps({"long_t_e": doc["selection_long"]["t_e"]}), flush=True)
    if not a.only_long:
        doc["denoising"] = denoising(ex, a.seed)
    refs = {}  # mode -> features (N, F, d) of this run's generated videos
    for mode in ([] if a.only_long else a.modes):
        v, nfe, secs = generate(mode, ex, a.videos, a.seed, chosen)
        feats = metrics.features(enc, v)
        row = {"mode": mode, "videos": int(v.shape[0]), "nfe": {"mean": nfe, "ci95": [nfe, nfe], "n": int(v.shape[0])},
               "s_per_video": metrics.mean_ci(secs), **score(v, enc, real_feats, real_frames, a.seed, train_feats, motion_refs)}
        if mode in chosen:
            row["setting"] = {"mode": CONFINER[mode][0], "control_steps": CONFINER[mode][1], "refine_steps": CONFINER[mode][2], **chosen[mode]}
        versus = [("control_expert_alone", "control")]
        if CONFINER.get(mode, (None, 0))[1] == 4:
            versus.append(("control_stage_4", "control_stage"))
        for ref, key in versus:
            if mode == ref or ref not in refs or not nfe or v.shape[0] != refs[ref].shape[0]:
                continue
            row[f"frame_quality_minus_{key}"] = {**paired_fd_difference(feats.numpy(), refs[ref].numpy(), real_feats, a.seed),
                                                 "versus": ref}
            row[f"subject_consistency_minus_{key}"] = {**metrics.mean_ci((metrics.subject_consistency(feats) - metrics.subject_consistency(refs[ref])).numpy()),
                                                       "versus": ref, "what": "paired per video (same noise), t interval"}
        if nfe:
            refs[mode] = feats
        doc["results"] = [r for r in doc["results"] if r["mode"] != mode] + [row]
        print(json.dumps({"mode": mode, "fd": round(row["frame_quality"]["mean"], 3),
                          "sc": round(row["subject_consistency"]["mean"], 4), "ms": round(row["motion_smoothness"]["mean"], 4),
                          "nfe": nfe, "s": round(row["s_per_video"]["mean"], 3)}), flush=True)
        out.write_text(json.dumps(doc, indent=1))
    for mode, ref in PAIRS:  # the goal's and the ablation's comparisons, where this run generated both rows
        if mode in refs and ref in refs and refs[mode].shape[0] == refs[ref].shape[0]:
            row = paired_row(mode, ref, refs[mode], refs[ref], real_feats, motion_refs["motion_distance"][0], a.seed)
            doc["paired"] = [q for q in doc.get("paired", []) if (q["mode"], q["versus"]) != (mode, ref)] + [row]
    doc["paired"] = sorted(doc.get("paired", []), key=lambda q: PAIRS.index((q["mode"], q["versus"])))
    out.write_text(json.dumps(doc, indent=1))
    if not a.no_long:
        ch = {"t_e": doc["selection_long"]["t_e"], "renoise": "fresh"}
        for name, (ci, cg, st) in tqdm(LONG.items(), desc="long"):
            flick, sj, sc, secs = [], [], [], []
            for i in range(a.long_videos):
                g = cf.confiner_long(64, ex["control"], ex["spatial"], ex["temporal"], FRAMES, SIZE, seed=a.seed + i,
                                     t_e=ch["t_e"], renoise=ch["renoise"],
                                     consistency_init=ci, coherence_guidance=cg, staggered=st)
                f = metrics.features(enc, g.video.clamp(-1, 1))
                flick.append(float(metrics.seam_flicker(f, FRAMES)[0]))
                sj.append(float(metrics.seam_jump(f, FRAMES)[0]))
                sc.append(float(metrics.subject_consistency(f)[0]))
                secs.append(g.seconds)
            row = {"config": name, "t_e": ch["t_e"], "renoise": ch["renoise"], "consistency_init": ci, "coherence_guidance": cg, "staggered": st, "frames": 64,
                   "videos": a.long_videos, "nfe": g.nfe, "seam_flicker": metrics.mean_ci(flick), "seam_jump": metrics.mean_ci(sj),
                   "subject_consistency_64": metrics.mean_ci(sc), "s_per_video": metrics.mean_ci(secs)}
            doc["long"] = [r for r in doc["long"] if r["config"] != name] + [row]
            print(json.dumps({"long": name, "flicker": round(row["seam_flicker"]["mean"], 3), "nfe": g.nfe}), flush=True)
            out.write_text(json.dumps(doc, indent=1))
    doc["setup"] = {"frames": FRAMES, "size": SIZE, "videos_per_mode": a.videos, "seed": a.seed, "chosen": chosen,
                    "encoder": "shipped FrameEncoder (lab/generative/weights/video/encoder.json): autoencoder, 1500 steps on the training frames, seed 0",
                    "conditioning": "unconditional (no text encoder offline)",
                    "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1,
                                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
                    "command": "python -m benchmarks.video " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
                    "earlier_commands": [*doc.get("setup", {}).get("earlier_commands", []), doc["setup"]["command"]] if "setup" in doc else []}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
