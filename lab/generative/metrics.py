"""Image-quality metrics on the [0, 1] scale (the project's convention: models work on [-1, 1]).

``psnr`` follows the usual definition with data range 1 after mapping ``[-1, 1] -> [0, 1]``
(``(x + 1) / 2``) and clipping the estimate to [0, 1], as PnP-Flow's evaluation code does.
``ssim`` is scikit-image's ``structural_similarity`` (Wang et al., IEEE TIP 2004; uniform 7x7
window, ``data_range=1``) on the same [0, 1] images, per image, channels averaged.
"""

from __future__ import annotations

import torch

from lab.generative.errors import GenerativeError

__all__ = ["to_unit", "psnr", "mse", "ssim"]


def to_unit(x: torch.Tensor, clip: bool = True) -> torch.Tensor:
    """Map images from [-1, 1] to [0, 1] (clipped when ``clip``)."""
    u = (x + 1) / 2
    return u.clamp(0, 1) if clip else u


def mse(x: torch.Tensor, ref: torch.Tensor, clip: bool = True) -> torch.Tensor:
    """Per-image mean squared error on [0, 1]; ``x``, ``ref`` (B, C, H, W) on [-1, 1]; returns (B,) float64."""
    if x.shape != ref.shape:
        raise GenerativeError(f"mse: shapes differ: {tuple(x.shape)} vs {tuple(ref.shape)}")
    d = to_unit(x.detach().double(), clip) - to_unit(ref.detach().double(), clip)
    return (d**2).flatten(1).mean(1)


def psnr(x: torch.Tensor, ref: torch.Tensor, clip: bool = True) -> torch.Tensor:
    """Per-image PSNR in dB on [0, 1] (data range 1); ``x``, ``ref`` (B, C, H, W) on [-1, 1]; returns (B,) float64."""
    return -10 * torch.log10(mse(x, ref, clip).clamp_min(1e-20))


def ssim(x: torch.Tensor, ref: torch.Tensor, clip: bool = True, win_size: int | None = None) -> torch.Tensor:
    """Per-image SSIM on [0, 1] (data range 1); ``x``, ``ref`` (B, C, H, W) on [-1, 1]; returns (B,) float64.

    scikit-image's :func:`skimage.metrics.structural_similarity` with its defaults (uniform window of
    side ``win_size``, default 7, shrunk to the largest odd side that fits images smaller than 7 px;
    ``K1 = 0.01``, ``K2 = 0.03``), ``data_range=1``, the channel axis averaged for ``C > 1``. Runs on
    the CPU in float64 (tensors on other devices are copied).
    """
    if x.shape != ref.shape:
        raise GenerativeError(f"ssim: shapes differ: {tuple(x.shape)} vs {tuple(ref.shape)}")
    if x.dim() != 4:
        raise GenerativeError(f"ssim: expected (B, C, H, W) images, got shape {tuple(x.shape)}")
    try:
        from skimage.metrics import structural_similarity
    except ImportError as exc:  # pragma: no cover - scikit-image ships with the lab's environment
        raise GenerativeError("lab.generative.metrics.ssim needs scikit-image: pip install scikit-image") from exc
    h, w = x.shape[-2:]
    if win_size is None:
        win_size = 7
    win_size = min(int(win_size), h, w)
    win_size -= 1 - win_size % 2  # odd
    if win_size < 3:
        raise GenerativeError(f"ssim: images of {h}x{w} px are too small for an SSIM window (needs >= 3 px)")
    a = to_unit(x.detach().double(), clip).cpu().numpy()
    b = to_unit(ref.detach().double(), clip).cpu().numpy()
    out = [structural_similarity(a[i].transpose(1, 2, 0), b[i].transpose(1, 2, 0), data_range=1.0,
                                 win_size=win_size, channel_axis=2) for i in range(a.shape[0])]
    return torch.tensor(out, dtype=torch.float64)
