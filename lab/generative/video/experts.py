"""The three video experts of :mod:`lab.generative.video`: diffusers ``UNet2DModel`` s, each on its own schedule.

============  ===========================================  =============  ============  ============
expert        network input                                schedule       predicts      full steps
============  ===========================================  =============  ============  ============
``control``   a clip, frames stacked as channels (F, H, W)  ``flow_sigma`` velocity      8 (few-step)
``spatial``   one frame (1, H, W): an image prior          ``ddpm_linear`` epsilon      100 DDIM
``temporal``  a clip, frames stacked as channels (F, H, W)  ``cosine``     epsilon       100 DDIM
============  ===========================================  =============  ============  ============

The spatial expert sees frames one at a time (it has never seen motion: sharp frames, no temporal
coherence); the temporal expert mixes all frames in its first convolution (it learns the motion,
and with a smaller per-frame budget blurrier frames); the control expert is a clip model trained
like the temporal one but on the flow-matching path, sampled with a few Euler (= DDIM) steps.
Generation is **unconditional** (no text encoder runs offline; the two sources are mixed).

Network evaluations: :class:`Expert` counts one NFE per call on a batch of videos (the spatial
expert's call runs every frame of every video of the batch in one batched forward pass, as a T2I
model applied frame-wise does in the paper), so an NFE is one expert call per denoising step.

Weights: ``lab/generative/weights/video/<name>.safetensors`` (EMA) beside ``<name>.json`` (recipe,
schedule, data, losses, and the safetensors file's sha256), registered in :mod:`lab.data` as
``video_experts``. :func:`load_expert` verifies both checksums before reading.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from lab import data as lab_data
from lab.generative.errors import PriorError
from lab.generative.learned import build_unet
from lab.generative.video.schedules import Schedule, get_schedule

__all__ = ["EXPERTS", "Expert", "WeightsChecksumError", "load_expert", "expert_files", "WEIGHTS_DIR", "sha256_file"]

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights" / "video"
#: name -> (kind, schedule name, full step count)
EXPERTS = {"control": ("clip", "flow_sigma", 8), "spatial": ("frame", "ddpm_linear", 100), "temporal": ("clip", "cosine", 100)}


class WeightsChecksumError(PriorError):
    """A weights file whose sha256 differs from the one its sidecar records (path and both digests in the message)."""

    def __init__(self, path: Path, expected: str, actual: str):
        self.path, self.expected, self.actual = Path(path), expected, actual
        super().__init__(f"{path}: sha256 {actual} does not match the sidecar's {expected}; refusing to load these weights")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Expert(nn.Module):
    """A denoiser on its own schedule, called on videos ``(B, F, H, W)``.

    Parameters
    ----------
    net : callable
        ``net(x, t)`` -> tensor like ``x``; ``x`` is ``(B*F, 1, H, W)`` for ``kind="frame"`` and
        ``(B, F, H, W)`` for ``kind="clip"``, ``t`` int ``(n,)`` in 0..1000.
    schedule : Schedule
    kind : {"frame", "clip"}
    name : str
    full_steps : int
        The expert's own step count when it samples alone.
    clip_x0 : bool
        Clip ``x0_hat`` to [-1, 1] and recompute ``eps_hat`` from it (diffusers' ``clip_sample``).

    Attributes
    ----------
    nfe : int
        Calls so far (reset with :meth:`reset_nfe`).
    """

    def __init__(self, net, schedule: Schedule, kind: str, name: str = "expert", full_steps: int = 100, clip_x0: bool = True):
        super().__init__()
        if kind not in ("frame", "clip"):
            raise ValueError(f"expert kind must be 'frame' or 'clip', got {kind!r}")
        self.net, self.schedule, self.kind, self.name, self.full_steps, self.clip_x0 = net, schedule, kind, name, full_steps, clip_x0
        self.nfe = 0
        self.meta: dict = {}

    def reset_nfe(self) -> None:
        self.nfe = 0

    @torch.no_grad()
    def predict(self, x_t: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x0_hat, eps_hat)`` of videos ``x_t`` ``(B, F, H, W)`` at int timestep ``t`` (one NFE)."""
        if x_t.dim() != 4:
            raise ValueError(f"expert {self.name!r}: videos must be (B, F, H, W), got shape {tuple(x_t.shape)}")
        b, f, h, w = x_t.shape
        self.nfe += 1
        inp = x_t.reshape(b * f, 1, h, w) if self.kind == "frame" else x_t
        tt = torch.full((inp.shape[0],), int(t), dtype=torch.long)
        out = self.net(inp, tt).reshape(b, f, h, w)
        x0, eps = self.schedule.from_output(x_t, out, t)
        if self.clip_x0 and t > 0:
            x0 = x0.clamp(-1, 1)
            eps = self.schedule.eps_from_x0(x_t, x0, t)
        return x0, eps


class _UNetCall(nn.Module):
    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, x, t):
        return self.unet(x, t).sample


def expert_files(name: str, directory: Path | None = None) -> tuple[Path, Path]:
    """``(<name>.safetensors, <name>.json)``: through the registry entry ``video_experts`` (verified,
    :class:`lab.data.ChecksumError` on a mismatch) when ``directory`` is None, else from ``directory``."""
    if name not in EXPERTS:
        raise PriorError(f"no video expert named {name!r}; shipped: {', '.join(EXPERTS)}")
    if directory is None:
        found = {p.name: p for p in lab_data.files("video_experts")}
        return found[f"{name}.safetensors"], found[f"{name}.json"]
    d = Path(directory)
    return d / f"{name}.safetensors", d / f"{name}.json"


def load_expert(name: str, directory: Path | str | None = None) -> Expert:
    """Load a trained video expert (EMA weights, eval mode, float32, CPU).

    Parameters
    ----------
    name : {"control", "spatial", "temporal"}
    directory : path, optional
        Read ``<name>.safetensors`` / ``<name>.json`` from here instead of the shipped copies.

    Raises
    ------
    WeightsChecksumError
        The safetensors file's sha256 differs from the sidecar's ``weights_sha256``.
    lab.data.ChecksumError
        (Shipped copies) a file differs from the registry's manifest digest.
    PriorError
        Unknown name, or a sidecar whose schedule / kind disagree with :data:`EXPERTS`.
    """
    from safetensors.torch import load_file

    st, side = expert_files(name, None if directory is None else Path(directory))
    meta = json.loads(side.read_text())
    actual = sha256_file(st)
    if actual != meta.get("weights_sha256"):
        raise WeightsChecksumError(st, str(meta.get("weights_sha256")), actual)
    kind, sched, steps = EXPERTS[name]
    if (meta.get("kind"), meta.get("schedule")) != (kind, sched):
        raise PriorError(f"{side}: kind/schedule {meta.get('kind')}/{meta.get('schedule')} differ from {kind}/{sched}")
    unet = build_unet(meta["unet_config"])
    unet.load_state_dict(load_file(str(st), device="cpu"), strict=True)
    torch.nn.Module.to(unet, memory_format=torch.channels_last).eval().requires_grad_(False)
    e = Expert(_UNetCall(unet), get_schedule(sched), kind, name=name, full_steps=steps)
    e.meta = meta
    return e
