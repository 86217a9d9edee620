"""Learned flow priors: a small diffusers ``UNet2DModel`` as the velocity ``v(x_t, t)``.

The network is the one :mod:`lab.generative.train_prior` trains and ships in
``lab/generative/weights/<name>.safetensors`` (its EMA weights) beside ``<name>.json`` (the command,
data, split, steps and losses that made it). Both files are registered in the data registry as
``learned_prior_<name>`` (a package resource of ``lab``), so :func:`load_learned_prior` verifies
their sha256 before it reads them.

Time convention, converted at this one place (:class:`UNetVelocity`): the project's flow time ``t``
runs from 0 (noise) to 1 (clean); the UNet's sinusoidal timestep input is ``t * TIME_SCALE``
(``TIME_SCALE = 1000``). Training (:mod:`lab.generative.train_prior`) and inference both call the
network through :class:`UNetVelocity`. (diffusers' own flow-matching scheduler runs sigma from 1 =
noise to 0 = data: to drive this net with it, query it at ``t = 1 - sigma`` and step with ``-v``.)

Examples
--------
>>> from lab.generative.learned import load_learned_prior
>>> prior = load_learned_prior("mnist")            # doctest: +SKIP
>>> x = prior.sample(16, nfe=50)                   # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from lab import data as lab_data
from lab.generative.errors import PriorError
from lab.generative.priors import LearnedPrior

__all__ = [
    "TIME_SCALE",
    "LEARNED_PRIORS",
    "UNetVelocity",
    "unet_config",
    "build_unet",
    "load_learned_prior",
    "weights_files",
]

#: The UNet's timestep input is ``t * TIME_SCALE`` (t in [0, 1], 0 = noise, 1 = clean).
TIME_SCALE = 1000.0
#: Shipped priors: name -> data set it was trained on (``lab.generative.datasets``).
LEARNED_PRIORS = {"mnist": "mnist", "natural32": "natural32", "medical32": "medical32"}
WEIGHTS_DIR = Path(__file__).with_name("weights")


def unet_config(sample_size: int, channels: int = 1, block_out_channels=(32, 64, 64), layers_per_block: int = 1,
                norm_num_groups: int = 8) -> dict:
    """The ``UNet2DModel`` configuration of the lab's priors: no attention blocks (``DownBlock2D`` /
    ``UpBlock2D`` only; attention is the slow part on a CPU), about 1.06 M parameters at the defaults."""
    n = len(block_out_channels)
    return {
        "sample_size": int(sample_size),
        "in_channels": int(channels),
        "out_channels": int(channels),
        "block_out_channels": [int(c) for c in block_out_channels],
        "layers_per_block": int(layers_per_block),
        "down_block_types": ["DownBlock2D"] * n,
        "up_block_types": ["UpBlock2D"] * n,
        "norm_num_groups": int(norm_num_groups),
    }


def build_unet(config: dict) -> nn.Module:
    """A fresh ``diffusers.UNet2DModel`` from :func:`unet_config`'s dictionary."""
    from diffusers import UNet2DModel

    cfg = dict(config)
    for key in ("block_out_channels", "down_block_types", "up_block_types"):
        cfg[key] = tuple(cfg[key])
    return UNet2DModel(**cfg)


class UNetVelocity(nn.Module):
    """``v(x, t) = unet(x, t * TIME_SCALE).sample``: the one place where flow time becomes the UNet's timestep.

    Parameters
    ----------
    unet : diffusers.UNet2DModel
        Trained with t = 0 noise, t = 1 clean (as :mod:`lab.generative.train_prior` does).
    """

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x`` (B, C, H, W), ``t`` (B,) in [0, 1] -> velocity (B, C, H, W)."""
        t = torch.as_tensor(t, device=x.device, dtype=x.dtype)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        return self.unet(x, t * TIME_SCALE).sample


def weights_files(name: str) -> tuple[Path, Path]:
    """The verified ``(<name>.safetensors, <name>.json)`` of shipped prior ``name`` (through the data
    registry: :class:`lab.data.ChecksumError` if either file differs from the registry's digest)."""
    if name not in LEARNED_PRIORS:
        raise PriorError(f"no learned prior named {name!r}; shipped: {', '.join(LEARNED_PRIORS)}")
    found = {p.name: p for p in lab_data.files(f"learned_prior_{name}")}
    try:
        return found[f"{name}.safetensors"], found[f"{name}.json"]
    except KeyError:  # pragma: no cover - the registry entry lists exactly these two
        raise PriorError(f"learned prior {name!r}: the registry entry lacks {name}.safetensors / {name}.json") from None


def load_learned_prior(name: str, device=None, dtype: torch.dtype = torch.float32) -> LearnedPrior:
    """Load a shipped learned prior (``"mnist"``, ``"natural32"``, ``"medical32"``) as a
    :class:`~lab.generative.priors.LearnedPrior` (EMA weights, eval mode, gradients off for the weights).

    Parameters
    ----------
    name : str
    device : torch device or str, optional
        Default: CUDA when available, else CPU.
    dtype : torch dtype
        The weights' dtype (inputs must match it).

    Returns
    -------
    LearnedPrior
        ``velocity(x, t)`` with ``x`` (B, *shape) on ``device`` counts one NFE per call; its ``meta``
        attribute holds the JSON sidecar (command, data set, split, steps, losses); ``tuning_key`` is
        ``"learned-<name>"`` (the kind :mod:`lab.generative.tuning` tunes on the data set's val split).
    """
    from safetensors.torch import load_file

    st, side = weights_files(name)
    meta = json.loads(side.read_text())
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    unet = build_unet(meta["unet_config"])
    state = load_file(str(st), device="cpu")
    unet.load_state_dict(state, strict=True)
    # channels-last weights: the convolutions then run in NHWC (about 1.2x faster on one CPU core here,
    # outputs within float32 rounding of the default layout); callers keep passing ordinary (B, C, H, W) tensors.
    # torch's Module.to, not diffusers' override: the override warns "modules that should be kept in float32: []"
    # on every dtype cast even when that list is empty (as for this UNet), and adds only quantization checks.
    torch.nn.Module.to(unet, device=device, dtype=dtype, memory_format=torch.channels_last).eval().requires_grad_(False)
    if float(meta.get("time_scale", TIME_SCALE)) != TIME_SCALE:
        raise PriorError(f"learned prior {name!r} was trained with time_scale {meta.get('time_scale')}, this code uses {TIME_SCALE}")
    prior = LearnedPrior(UNetVelocity(unet), tuple(meta["shape"]), time_scale=1.0)
    prior.meta = meta
    prior.name = name
    prior.tuning_key = f"learned-{name}"  # restore(..., hyper="tuned") reads tuned.json's entry of this kind
    return prior
