"""Image-quality metrics on the [0, 1] scale (the project's convention: models work on [-1, 1]).

``psnr`` follows the usual definition with data range 1 after mapping ``[-1, 1] -> [0, 1]``
(``(x + 1) / 2``) and clipping the estimate to [0, 1], as PnP-Flow's evaluation code does.
"""

from __future__ import annotations

import torch

from lab.generative.errors import GenerativeError

__all__ = ["to_unit", "psnr", "mse"]


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
