"""ConFiner: video generation by a chain of diffusion experts with coordinated denoising (and its baselines).

Li, Cao, Su et al., "Decoupled Video Generation with Chain of Training-free Diffusion Model Experts"
(ConFiner, arXiv 2408.13423, v4), Sec. 3 and Alg. 1. The experts are :class:`~lab.generative.video.experts.Expert`
objects (``predict(x_t, t) -> (x0_hat, eps_hat)`` on the expert's own schedule); videos are ``(B, F, H, W)``
float32 on [-1, 1]; timesteps are integers in ``0..1000``. Every sampler returns a :class:`Generation`
with the network evaluations it used (``nfe``: expert calls on the batch, one per denoising step and expert).

Stages
------
1. **Control stage** (:func:`sample_expert` with the control expert): ``control_steps`` uniformly spaced
   DDIM steps from ``t = 1000`` give a coarse video ``V0``.
2. **Structure noising** to ``T_e`` (:func:`noise_structure`), Eq. 6: ``V'_Te = alpha_Te(S_s) V0 + sigma_Te(S_s) eps``
   on the **spatial expert's** schedule ``S_s``. (Alg. 1, line 4 writes ``Add_noise(V0, T_e, Con)``, the
   control expert's schedule.) We follow Eq. 6: the first refinement call is the spatial expert at ``T_e``,
   and only a sample noised on *its* schedule has the noise level it was trained for at that timestep
   (here ``flow_sigma`` at t = 100 is sigma 0.10 while ``ddpm_linear`` is 0.32: noising on the control
   schedule would hand the spatial expert a sample 3x less noisy than its timestep says). ``refine_mode
   = "temporal_only"`` noises on the temporal expert's schedule for the same reason.
3. **Refinement**, ``refine_steps`` DDIM steps from ``T_e`` to 0 (timesteps ``T_e, T_e (n-1)/n, ...``):

   ``spatial_only`` / ``temporal_only``
       one expert, its own schedule (Table 5's "only spatial" / "only temporal" rows).
   ``coordinated`` (Eqs. 8-11), per step ``t_k``: ``x0_S = spatial(V', t_k)``;
       ``V'' = alpha_tk(S_t) x0_S + sigma_tk(S_t) eps`` (re-noise on the temporal schedule);
       ``x0_T = temporal(V'', t_k)``; ``V' = alpha_tk(S_s) x0_T + sigma_tk(S_s) eps`` (back on the spatial
       schedule); then the spatial expert's DDIM step from ``V'`` to ``t_{k-1}``: three calls per step.
       The clean-sample estimate ``x0`` is the hinge between the two schedules. The paper writes only
       ``eps`` for the noise of a re-noising: a fresh Gaussian draw (``renoise="fresh"``, what a
       diffusers ``scheduler.add_noise(x0, randn, t)`` does; :func:`confiner`'s default) or the noise the
       previous expert predicted (``renoise="predicted"``: deterministic, DDIM-consistent, and with two
       identical experts the chain reduces exactly to plain DDIM). The benchmark chooses between them
       on the validation split (``benchmarks/video.py``).
   ``naive_alternation`` (Eq. 7, the paper's failing baseline)
       the experts take turns, one step each (spatial, temporal, spatial, ...), each treating the
       current sample as if it were on *its own* schedule at ``t_k`` (no hinge); by default it takes
       ``3 * refine_steps`` steps so that its NFE equals the coordinated mode's.

ConFiner-Long (:func:`confiner_long`): segments of ``F`` frames with three switchable strategies,
consistency initialisation (frame-wise shuffles of one base noise), coherence guidance (Eq. 12) and
staggered refinement (Eq. 13).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lab.generative.video.experts import Expert
from lab.generative.video.schedules import T, timesteps

__all__ = ["Generation", "MODES", "sample_expert", "noise_structure", "refine", "confiner", "confiner_long",
           "shuffled_noise", "ConFinerError"]

MODES = ("coordinated", "spatial_only", "temporal_only", "naive_alternation")


class ConFinerError(ValueError):
    """An invalid ConFiner setting (mode, steps, T_e, frame count), named in the message."""


@dataclass
class Generation:
    """Result of a sampler: ``video`` (B, F, H, W) on [-1, 1], ``nfe`` expert calls (per expert in
    ``nfe_by_expert``), ``seconds`` of wall time, and ``stages`` (intermediate videos: ``control``,
    ``structure``) where the sampler has them."""

    video: torch.Tensor
    nfe: int
    nfe_by_expert: dict = field(default_factory=dict)
    seconds: float = 0.0
    stages: dict = field(default_factory=dict)


def _calls(experts) -> dict:
    return {e.name: e.nfe for e in experts}


def sample_expert(expert: Expert, noise: torch.Tensor, steps: int | None = None, callback=None) -> Generation:
    """One expert alone: ``steps`` (default its ``full_steps``) deterministic DDIM steps from ``t = 1000``.

    ``noise`` (B, F, H, W) standard Gaussian is ``x_1000``; ``callback(i, n, x0_hat)`` after each step.
    """
    steps = steps or expert.full_steps
    t0, n0 = time.perf_counter(), expert.nfe
    ts = timesteps(steps, T)
    x = noise
    for i, t in enumerate(ts):
        x0, eps = expert.predict(x, t)
        t_prev = ts[i + 1] if i + 1 < len(ts) else 0
        x = expert.schedule.ddim_step(x0, eps, t_prev)
        if callback is not None:
            callback(i + 1, len(ts), x0)
    return Generation(x, expert.nfe - n0, {expert.name: expert.nfe - n0}, time.perf_counter() - t0)


def noise_structure(v0: torch.Tensor, t_e: int, expert: Expert, eps: torch.Tensor) -> torch.Tensor:
    """Eq. 6: ``V'_Te = alpha_Te v0 + sigma_Te eps`` on ``expert``'s schedule (the spatial expert's in ConFiner)."""
    if not 1 <= int(t_e) <= T:
        raise ConFinerError(f"T_e must lie in 1..{T}, got {t_e}")
    return expert.schedule.add_noise(v0, eps, int(t_e))


def refine(x: torch.Tensor, t_e: int, steps: int, spatial: Expert, temporal: Expert, mode: str = "coordinated",
           renoise: str = "predicted", generator: torch.Generator | None = None, naive_steps: int | None = None,
           temporal_call=None, callback=None) -> torch.Tensor:
    """The refinement stage from ``x`` at ``T_e`` (on the schedule the mode expects) to a clean video.

    Parameters
    ----------
    x : torch.Tensor
        (B, F, H, W), noised to ``t_e`` on the spatial schedule (``temporal_only``: the temporal one).
    mode : one of :data:`MODES`
    renoise : {"predicted", "fresh"}
        The ``eps`` of Eqs. 9 and 11 (coordinated mode).
    naive_steps : int, optional
        Steps of ``naive_alternation`` (default ``3 * steps``: the coordinated mode's NFE).
    temporal_call : callable, optional
        ``temporal_call(x_t, t) -> (x0, eps)`` replacing ``temporal.predict`` (ConFiner-Long's windows).
    callback : callable, optional
        ``callback(i, n, x0_hat)`` after each step.

    Raises
    ------
    ConFinerError
        Unknown mode or renoise, steps < 1.
    """
    if mode not in MODES:
        raise ConFinerError(f"unknown ConFiner mode {mode!r}; known: {', '.join(MODES)}")
    if renoise not in ("predicted", "fresh"):
        raise ConFinerError(f"renoise must be 'predicted' or 'fresh', got {renoise!r}")
    if steps < 1:
        raise ConFinerError(f"refinement needs >= 1 step, got {steps}")
    tcall = temporal_call or temporal.predict
    n = (naive_steps or 3 * steps) if mode == "naive_alternation" else steps
    ts = timesteps(n, int(t_e))
    S_s, S_t = spatial.schedule, temporal.schedule

    def fresh(like, eps):
        return eps if renoise == "predicted" else torch.randn(like.shape, generator=generator)

    for i, t in enumerate(ts):
        t_prev = ts[i + 1] if i + 1 < len(ts) else 0
        if mode == "spatial_only":
            x0, eps = spatial.predict(x, t)
            x = S_s.ddim_step(x0, eps, t_prev)
        elif mode == "temporal_only":
            x0, eps = tcall(x, t)
            x = S_t.ddim_step(x0, eps, t_prev)
        elif mode == "coordinated":
            x0_s, eps_s = spatial.predict(x, t)                     # Eq. 8
            x_tt = S_t.add_noise(x0_s, fresh(x, eps_s), t)          # Eq. 9: onto the temporal schedule
            x0_t, eps_t = tcall(x_tt, t)                            # Eq. 10
            x = S_s.add_noise(x0_t, fresh(x, eps_t), t)             # Eq. 11: back onto the spatial schedule
            x0, eps = spatial.predict(x, t)
            x = S_s.ddim_step(x0, eps, t_prev)
        else:  # naive alternation, Eq. 7: no hinge, each expert steps on its own schedule
            if i % 2 == 0:
                x0, eps = spatial.predict(x, t)
                x = S_s.ddim_step(x0, eps, t_prev)
            else:
                x0, eps = tcall(x, t)
                x = S_t.ddim_step(x0, eps, t_prev)
        if callback is not None:
            callback(i + 1, len(ts), x0)
    return x


def confiner(noise: torch.Tensor, control: Expert, spatial: Expert, temporal: Expert, control_steps: int = 4,
             refine_steps: int = 5, t_e: int = 100, mode: str = "coordinated", seed: int = 0, renoise: str = "fresh",
             callback=None) -> Generation:
    """ConFiner on a batch: control stage, structure noising to ``t_e`` (Eq. 6), refinement in ``mode``.

    Parameters
    ----------
    noise : torch.Tensor
        (B, F, H, W) standard Gaussian, the control stage's ``x_1000``.
    control_steps, refine_steps : int
        The paper's budgets: 4 + 5 (9 steps) or 8 + 10 (18 steps).
    t_e : int
        Structure noise level in 1..1000 (paper default 100).
    seed : int
        Seeds the structure noise ``eps`` of Eq. 6 (and fresh re-noising).
    callback : callable, optional
        ``callback(stage, i, n, x0_hat)`` with stage ``"control"`` or ``"refine"``.

    Returns
    -------
    Generation
        ``stages`` holds ``control`` (V0) and ``structure`` (V'_Te).
    """
    if mode not in MODES:
        raise ConFinerError(f"unknown ConFiner mode {mode!r}; known: {', '.join(MODES)}")
    experts = (control, spatial, temporal)
    before = _calls(experts)
    t0 = time.perf_counter()
    cb = (lambda stage: (lambda i, n, x0: callback(stage, i, n, x0))) if callback else (lambda stage: None)
    v0 = sample_expert(control, noise, control_steps, callback=cb("control")).video
    g = torch.Generator().manual_seed(int(seed))
    eps = torch.randn(noise.shape, generator=g)
    on = temporal if mode == "temporal_only" else spatial
    x = noise_structure(v0, t_e, on, eps)
    out = refine(x, t_e, refine_steps, spatial, temporal, mode, renoise, g, callback=cb("refine"))
    after = _calls(experts)
    by = {k: after[k] - before[k] for k in after}
    return Generation(out, sum(by.values()), by, time.perf_counter() - t0, {"control": v0, "structure": x})


# ------------------------------------------------------------------------------------------- ConFiner-Long


def shuffled_noise(base: torch.Tensor, n_segments: int, generator: torch.Generator) -> torch.Tensor:
    """Consistency initialisation: each segment's initial noise is a frame-wise shuffle of one base noise.

    ``base`` (F, H, W) standard Gaussian -> (n_segments, F, H, W): segment ``k`` is ``base[perm_k]`` for a
    random permutation ``perm_k`` of the F frames (ConFiner-Long, Sec. 3.4 (1)). Each frame of each
    segment is therefore exactly one of the base frames: marginally standard Gaussian.
    """
    f = base.shape[0]
    return torch.stack([base[torch.randperm(f, generator=generator)] for _ in range(n_segments)])


def _windows(n_frames: int, length: int, staggered: bool) -> list[tuple[int, int, int, int]]:
    """(window start, window stop, kept start, kept stop) of the temporal expert's windows over a long video."""
    if not staggered:
        return [(s, s + length, s, s + length) for s in range(0, n_frames, length)]
    h = length // 2
    out = [(0, length, 0, h)]
    out += [(s, s + length, s, s + length) for s in range(h, n_frames - length + 1, length)]  # Eq. 13: S_p[L/2:] ++ S_n[:L/2]
    out.append((n_frames - length, n_frames, n_frames - h, n_frames))
    return out


def confiner_long(n_frames: int, control: Expert, spatial: Expert, temporal: Expert, frames: int = 8, size: int = 32,
                  control_steps: int = 4, refine_steps: int = 5, t_e: int = 100, seed: int = 0,
                  consistency_init: bool = True, coherence_guidance: bool = True, staggered: bool = True,
                  gamma: float = 0.1, batch: int = 1, renoise: str = "fresh") -> Generation:
    """ConFiner-Long: a video of ``n_frames`` (a multiple of ``frames``, >= 2 segments) from segments of ``frames``.

    Strategies (each switchable, ConFiner Sec. 3.4):

    ``consistency_init``
        segment noises are frame-wise shuffles of one base noise (:func:`shuffled_noise`); off:
        independent noise per segment.
    ``coherence_guidance`` (Eq. 12)
        during segment ``k``'s control stage, its predicted noise is pulled toward segment ``k-1``'s
        at the same timestep: ``eps <- eps - gamma * d/d eps ||eps - eps_prev||^2 = eps - 2 gamma (eps - eps_prev)``
        (the segments are generated one after another).
    ``staggered`` (Eq. 13)
        the temporal expert refines windows that straddle the control segments' seams,
        ``S_p[F/2:F] ++ S_n[0:F/2]`` (and the two half segments at the ends from the first and last
        window); off: windows equal the control segments. Refinement is coordinated (three calls per
        step, re-noising as ``renoise``); the spatial expert runs frame-wise over the whole video.

    Returns
    -------
    Generation
        ``video`` (batch, n_frames, size, size); ``nfe`` counts evaluations of a ``frames``-frame window
        (the unit of the single-segment modes), i.e. ``nfe`` of one segment times the number of
        windows; ``stages["control"]`` the concatenated control-stage segments.
    """
    if n_frames % frames or n_frames // frames < 2:
        raise ConFinerError(f"n_frames must be a multiple of the segment length {frames} with >= 2 segments, got {n_frames}")
    if frames % 2:
        raise ConFinerError(f"staggered refinement needs an even segment length, got {frames}")
    n_seg = n_frames // frames
    t_start = time.perf_counter()
    g = torch.Generator().manual_seed(int(seed))
    if consistency_init:
        base = torch.randn((batch, frames, size, size), generator=g)
        noises = torch.stack([shuffled_noise(base[b], n_seg, g) for b in range(batch)], 1)  # (n_seg, B, F, H, W)
    else:
        noises = torch.randn((n_seg, batch, frames, size, size), generator=g)
    nfe = 0
    ts = timesteps(control_steps, T)
    segs, prev_eps = [], None
    for k in range(n_seg):
        x, eps_hist = noises[k], []
        for i, t in enumerate(ts):
            x0, eps = control.predict(x, t)
            nfe += 1
            if coherence_guidance and prev_eps is not None:
                eps = eps - gamma * 2.0 * (eps - prev_eps[i])                 # Eq. 12
            eps_hist.append(eps)
            x = control.schedule.ddim_step(x0, eps, ts[i + 1] if i + 1 < len(ts) else 0)
        prev_eps = eps_hist
        segs.append(x)
    v0 = torch.cat(segs, 1)                                                   # (B, N, H, W)
    eps = torch.randn(v0.shape, generator=g)
    x = noise_structure(v0, t_e, spatial, eps)
    wins = _windows(n_frames, frames, staggered)

    def temporal_windows(x_t, t):
        parts = torch.stack([x_t[:, a:b] for a, b, _, _ in wins], 1)         # (B, W, F, H, W)
        x0w, epsw = temporal.predict(parts.flatten(0, 1), t)
        x0w, epsw = x0w.view(parts.shape), epsw.view(parts.shape)
        x0, ep = torch.empty_like(x_t), torch.empty_like(x_t)
        for j, (a, b, ka, kb) in enumerate(wins):
            x0[:, ka:kb], ep[:, ka:kb] = x0w[:, j, ka - a:kb - a], epsw[:, j, ka - a:kb - a]
        return x0, ep

    n_sp0, n_t0 = spatial.nfe, temporal.nfe
    out = refine(x, t_e, refine_steps, spatial, temporal, "coordinated", renoise, g, temporal_call=temporal_windows)
    nfe += (spatial.nfe - n_sp0) * n_seg + (temporal.nfe - n_t0) * len(wins)
    return Generation(out, nfe, {"segments": n_seg, "windows": len(wins)}, time.perf_counter() - t_start, {"control": v0})
