"""Video metrics of the ConFiner benchmark, on features of a small encoder trained here.

Feature encoder (:class:`FrameEncoder`): a 3-layer convolutional autoencoder's encoder trained on the
**training** frames only (:func:`train_encoder`: MSE reconstruction, AdamW, seeded), giving 32-d
features of a ``(1, H, W)`` frame. It stands in for the Inception / DINO / CLIP features of FID and
VBench, none of which run offline here.

- :func:`frechet_distance` (Heusel et al. 2017): ``||mu_a - mu_b||^2 + tr(C_a + C_b - 2 (C_a C_b)^{1/2})``
  between generated and held-out real frame features (lower is better).
- :func:`subject_consistency` (VBench, Huang et al. 2024, Sec. "Subject Consistency"): per video
  ``1/(F-1) sum_{t>=2} 1/2 (cos(d_1, d_t) + cos(d_{t-1}, d_t))`` on the features ``d_t``.
- :func:`motion_smoothness` (VBench's definition with a **linear** frame interpolator instead of AMT):
  the odd frames are dropped, reconstructed as the mean of their two neighbours, and the score is
  ``(255 - MAE_255) / 255`` with the MAE on the 0..255 scale (1 = perfectly smooth).
- :func:`nearest_psnr_ssim`: PSNR / SSIM (scikit-image, data range 2 on [-1, 1]) of each generated
  frame to its nearest (L2) real held-out frame.
- :func:`motion_distance`: the 1-D Wasserstein distance between the distributions of frame-to-frame feature
  jumps ``||d_{t+1} - d_t||`` of generated and of real held-out videos (0 = the real amount of motion). VBench
  pairs its consistency and smoothness scores with a "dynamic degree" for the same reason: a still video maxes
  both, and only a motion-aware score tells it from a real one (a still video scores the real mean jump here).
- :func:`denoising_psnr`: how well one expert recovers real clips from a given noise-to-signal ratio
  ``sigma_t / alpha_t`` (each expert at its own timestep for that ratio): PSNR of its clean-sample estimate
  ``x0_hat``, the quantity ConFiner hands from expert to expert (Eqs. 8-11).
- :func:`seam_flicker`: mean feature jump across segment boundaries over the mean jump between
  consecutive frames inside segments (1 = seams invisible); :func:`seam_jump`: the seam jump alone.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

__all__ = ["FrameEncoder", "train_encoder", "load_encoder", "save_encoder", "features", "frechet_distance", "subject_consistency",
           "motion_smoothness", "frame_jumps", "motion_distance", "nearest_psnr_ssim", "seam_jump", "seam_flicker", "denoising_psnr", "mean_ci"]


class FrameEncoder(nn.Module):
    """``(N, 1, H, W)`` on [-1, 1] -> ``(N, dim)`` features (and a decoder used only in training)."""

    def __init__(self, size: int = 16, dim: int = 32):
        super().__init__()
        self.size, self.dim = size, dim
        s = size // 4
        self.enc = nn.Sequential(nn.Conv2d(1, 16, 3, 2, 1), nn.SiLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.SiLU(),
                                 nn.Flatten(), nn.Linear(32 * s * s, dim))
        self.dec = nn.Sequential(nn.Linear(dim, 32 * s * s), nn.SiLU(), nn.Unflatten(1, (32, s, s)),
                                 nn.ConvTranspose2d(32, 16, 4, 2, 1), nn.SiLU(), nn.ConvTranspose2d(16, 1, 4, 2, 1))

    def forward(self, x):
        return self.enc(x)


def train_encoder(frames: torch.Tensor, steps: int = 1500, seed: int = 0, batch: int = 64) -> FrameEncoder:
    """Train :class:`FrameEncoder` as an autoencoder on ``frames`` (N, 1, H, W) (training split only)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    m = FrameEncoder(frames.shape[-1])
    opt = torch.optim.AdamW(m.parameters(), 2e-3, weight_decay=1e-4)
    for _ in range(steps):
        x = frames[torch.randint(0, frames.shape[0], (batch,), generator=g)]
        flip = torch.rand(batch, generator=g) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        loss = (m.dec(m.enc(x)) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval().requires_grad_(False)


def save_encoder(enc: FrameEncoder, directory, steps: int, seed: int) -> None:
    """Write ``encoder.safetensors`` and ``encoder.json`` (recipe, size, weights sha256) into ``directory``."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    from lab.generative.video.experts import sha256_file

    d = Path(directory)
    save_file({k: v.contiguous() for k, v in enc.state_dict().items()}, str(d / "encoder.safetensors"))
    meta = {"name": "encoder", "size": enc.size, "dim": enc.dim, "steps": steps, "seed": seed,
            "recipe": "lab.generative.video.metrics.train_encoder(datasets.frames('train', size), steps, seed): "
                      "autoencoder, MSE, AdamW lr 2e-3, batch 64, horizontal flips; training frames only",
            "weights_sha256": sha256_file(d / "encoder.safetensors")}
    (d / "encoder.json").write_text(json.dumps(meta, indent=1))


def load_encoder(directory=None) -> FrameEncoder:
    """The shipped feature encoder (registry ``video_experts``; sha256 checked against its sidecar).

    Raises
    ------
    lab.generative.video.experts.WeightsChecksumError
        The weights differ from the sidecar's digest.
    """
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from lab import data as lab_data
    from lab.generative.video.experts import WeightsChecksumError, sha256_file

    if directory is None:
        found = {p.name: p for p in lab_data.files("video_experts")}
        st, side = found["encoder.safetensors"], found["encoder.json"]
    else:
        st, side = Path(directory) / "encoder.safetensors", Path(directory) / "encoder.json"
    meta = json.loads(side.read_text())
    actual = sha256_file(st)
    if actual != meta["weights_sha256"]:
        raise WeightsChecksumError(st, meta["weights_sha256"], actual)
    enc = FrameEncoder(meta["size"], meta["dim"])
    enc.load_state_dict(load_file(str(st)))
    return enc.eval().requires_grad_(False)


@torch.no_grad()
def features(enc: FrameEncoder, videos: torch.Tensor) -> torch.Tensor:
    """Features of every frame: videos (B, F, H, W) -> (B, F, dim)."""
    b, f, h, w = videos.shape
    return enc(videos.reshape(b * f, 1, h, w).clamp(-1, 1)).view(b, f, -1)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to feature rows ``a`` (n, d) and ``b`` (m, d)."""
    from scipy import linalg

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mu_a, mu_b = a.mean(0), b.mean(0)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(ca @ cb)
    covmean = covmean.real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(ca + cb - 2 * covmean))


def subject_consistency(feats: torch.Tensor) -> torch.Tensor:
    """VBench subject consistency per video: feats (B, F, d) -> (B,) in [-1, 1]."""
    d = torch.nn.functional.normalize(feats, dim=-1)
    first = (d[:, 1:] * d[:, :1]).sum(-1)
    prev = (d[:, 1:] * d[:, :-1]).sum(-1)
    return (0.5 * (first + prev)).mean(1)


def motion_smoothness(videos: torch.Tensor) -> torch.Tensor:
    """Per video (B,): ``(255 - MAE)/255`` of odd frames against the linear interpolation of their neighbours."""
    v = (videos.clamp(-1, 1) + 1) * 127.5
    mid = 0.5 * (v[:, :-2:2] + v[:, 2::2])
    mae = (mid - v[:, 1:-1:2]).abs().mean((1, 2, 3))
    return (255 - mae) / 255


def frame_jumps(feats: torch.Tensor) -> torch.Tensor:
    """Feature jumps between consecutive frames: feats (B, F, d) -> (B, F - 1), ``||d_{t+1} - d_t||_2``."""
    return (feats[:, 1:] - feats[:, :-1]).norm(dim=-1)


def motion_distance(feats: torch.Tensor, real_feats: torch.Tensor) -> float:
    """1-D Wasserstein distance (``scipy.stats.wasserstein_distance``, feature units) between the frame-to-frame
    jumps (:func:`frame_jumps`) of ``feats`` (B, F, d) and of real videos ``real_feats`` (B', F', d).

    0 when the generated videos move as much, in distribution, as the real ones; a still video (every jump 0)
    scores the real videos' mean jump, a flickering one more.
    """
    from scipy.stats import wasserstein_distance

    return float(wasserstein_distance(frame_jumps(feats).flatten().numpy(), frame_jumps(real_feats).flatten().numpy()))


def nearest_psnr_ssim(videos: torch.Tensor, real_frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per video (B,) mean PSNR (dB) and SSIM of each frame to its nearest real frame (L2), on [-1, 1]."""
    from skimage.metrics import structural_similarity

    b, f, h, w = videos.shape
    gen = videos.reshape(b * f, h * w).clamp(-1, 1).double()
    real = real_frames.reshape(-1, h * w).double()
    nn_idx = torch.cdist(gen, real).argmin(1)
    mse = (gen - real[nn_idx]).pow(2).mean(1)
    psnr = 10 * torch.log10(4.0 / mse.clamp_min(1e-12))
    ssim = torch.tensor([structural_similarity(gen[i].view(h, w).numpy(), real[nn_idx[i]].view(h, w).numpy(), data_range=2.0)
                         for i in range(b * f)], dtype=torch.float64)
    return psnr.view(b, f).mean(1), ssim.view(b, f).mean(1)


def seam_jump(feats: torch.Tensor, segment: int) -> torch.Tensor:
    """Per video (B,): the mean feature jump ``||d_{t+1} - d_t||`` across segment seams (feature units). feats (B, N, d).

    Unlike :func:`seam_flicker`, a ratio that a video jittering everywhere also lowers, this cannot be improved by
    making the frames inside segments jump more."""
    jump = frame_jumps(feats)
    seam = (torch.arange(jump.shape[1]) + 1) % segment == 0
    return jump[:, seam].mean(1)


def seam_flicker(feats: torch.Tensor, segment: int) -> torch.Tensor:
    """Per video (B,): mean ``||d_{t+1} - d_t||`` across segment seams over that inside segments. feats (B, N, d)."""
    jump = frame_jumps(feats)                                              # jump t -> t+1, t = 0..N-2
    idx = torch.arange(jump.shape[1])
    seam = (idx + 1) % segment == 0
    return jump[:, seam].mean(1) / jump[:, ~seam].mean(1)


def mean_ci(x) -> dict:
    """``{"mean", "ci95": [lo, hi], "n"}`` of per-video values (t interval)."""
    from scipy import stats

    x = np.asarray(x, np.float64)
    m = float(x.mean())
    if len(x) < 2 or float(x.std()) == 0.0:
        return {"mean": m, "ci95": [m, m], "n": int(len(x))}
    h = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return {"mean": m, "ci95": [m - h, m + h], "n": int(len(x))}


@torch.no_grad()
def denoising_psnr(expert, clips: torch.Tensor, noise_to_signal: float, eps: torch.Tensor) -> tuple[int, torch.Tensor]:
    """PSNR (dB, data range 2) of ``expert``'s clean-sample estimate from real ``clips`` corrupted to one
    noise-to-signal ratio.

    ``clips`` (N, F, H, W) float32 on [-1, 1] and ``eps`` (same shape, standard Gaussian, shared between experts so
    that they see the same corruption) give ``x_t = alpha_t clips + sigma_t eps`` at ``t =
    expert.schedule.timestep_at(noise_to_signal)``; ``x0_hat = expert.predict(x_t, t)[0]`` clamped to [-1, 1].
    Returns ``(t, psnr)`` with ``psnr`` (N,) float64, one value per clip.

    Raises ``ValueError`` when ``clips`` and ``eps`` differ in shape or the ratio is not positive.

    Source: ConFiner (arXiv 2408.13423) passes ``x0_hat`` between experts (Eqs. 8-11) and refines the control
    video with the spatial expert because its frames are better (Table 5, spatial-only row); this measures that
    premise on the experts at hand."""
    if clips.shape != eps.shape:
        raise ValueError(f"clips {tuple(clips.shape)} and eps {tuple(eps.shape)} must have the same shape")
    t = expert.schedule.timestep_at(noise_to_signal)
    x0_hat, _ = expert.predict(expert.schedule.add_noise(clips, eps, t), t)
    mse = (x0_hat.clamp(-1, 1) - clips).double().pow(2).flatten(1).mean(1)
    return t, 10 * torch.log10(4.0 / mse.clamp_min(1e-20))
