"""Train a flow prior: rectified flow / OT-CFM with a small diffusers ``UNet2DModel``.

``python -m lab.generative.train_prior --dataset mnist --steps 1000 --out runs/mnist``

Per step (Liu et al. 2023, rectified flow; Lipman et al. 2023, Eq. 20-23, linear path):
``x1`` a batch of clean images on [-1, 1], ``x0 ~ N(0, I)``, ``t ~ U(0, 1)``,
``x_t = (1 - t) x0 + t x1`` and the loss ``mean ||v(x_t, t) - (x1 - x0)||^2``, where ``v`` is the
UNet called through :class:`lab.generative.learned.UNetVelocity` (the one place that turns ``t`` into
the UNet's timestep ``t * 1000``). AdamW, a linear warm-up then cosine decay to 10% of the peak
learning rate, gradient-norm clipping at 1, an EMA of the weights (decay
``min(ema, (1 + n) / (10 + n))`` at update ``n``), bf16 autocast where the device supports it.
Patch data sets get random dihedral augmentation (flips and transposes); MNIST none.

Resumable: every ``--ckpt-every`` steps the model, EMA, optimizer, step, random generator state and
loss history go to ``OUT/checkpoints/step_NNNNNNN.pt`` (the last two kept, written atomically);
a new run with the same ``--out`` resumes from the latest one and continues bit-exactly (the same
loss sequence as an uninterrupted run on the same device and thread count). All randomness of a
step (batch indices, augmentation, ``x0``, ``t``) comes from one seeded CPU generator, so a seed
gives the same batches on every device.

Held-out loss (``--eval-every N``): every N steps the EMA's flow-matching loss on the **val** split
(:func:`heldout_loss`: a stratified grid of times ``t_i = (i + 1/2) / n`` over the ``n`` val images with
fixed noise, so successive points differ by the weights alone, not by sampling noise); the EMA with the
lowest held-out loss is the one shipped, and training stops early once ``--patience`` evaluations in a
row have not improved on it (curve, best step and stop in the sidecar: ``val_loss_curve``,
``heldout_loss``, ``early_stopped``). The learning-rate schedule still spans ``--steps``.

At the end: ``OUT/<name>.safetensors`` (EMA weights) and ``OUT/<name>.json`` (command, data set,
split, steps, batch size, learning rate, seed, final train / val losses, wall time, and the
evaluation: one-step denoising PSNR on held-out test images and statistics of 50-step Euler samples),
plus ``OUT/samples.png``. Device: CUDA when present, else CPU (``--device`` overrides).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from lab.generative import datasets
from lab.generative.learned import TIME_SCALE, UNetVelocity, build_unet, unet_config

__all__ = ["PriorTrainConfig", "train", "heldout_loss", "evaluate", "main"]


@dataclass
class PriorTrainConfig:
    """Everything that defines a run (stored in every checkpoint and in the sidecar)."""

    dataset: str
    steps: int
    out: str
    name: str | None = None
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    ema: float = 0.999
    seed: int = 0
    ckpt_every: int = 100
    keep_ckpts: int = 2
    device: str = "auto"
    precision: str = "auto"  # auto | bf16 | fp32
    subset: int | None = None  # train on the first N training images only (tests)
    augment: bool | None = None  # default: on for patch sets, off for mnist
    block_out_channels: tuple[int, ...] = (32, 64, 64)
    layers_per_block: int = 1
    val_images: int = 512
    eval_every: int = 0  # held-out loss every this many steps (0: off); the best EMA is shipped
    patience: int = 4  # stop after this many held-out evaluations without a new best
    eval: bool = True
    threads: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.dataset not in datasets.DATASETS:
            raise SystemExit(f"--dataset must be one of {', '.join(datasets.DATASETS)}, got {self.dataset!r}")
        if self.steps < 1 or self.batch_size < 1 or self.ckpt_every < 1:
            raise SystemExit("--steps, --batch-size and --ckpt-every must be >= 1")
        if self.eval_every < 0 or self.patience < 1:
            raise SystemExit(f"--eval-every must be >= 0 and --patience >= 1, got {self.eval_every} and {self.patience}")
        self.name = self.name or self.dataset
        self.block_out_channels = tuple(int(c) for c in self.block_out_channels)
        if self.augment is None:
            self.augment = self.dataset != "mnist"


# ------------------------------------------------------------------------------------------ helpers


def pick_device(spec: str = "auto") -> torch.device:
    """``auto``: CUDA when available, then Apple MPS, else CPU."""
    if spec != "auto":
        return torch.device(spec)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast_dtype(device: torch.device, precision: str) -> torch.dtype | None:
    """bf16 autocast where it pays (CUDA with bf16, CPUs with AVX512-BF16/AMX), else None (fp32)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
        return torch.bfloat16 if probe is not None and probe() else None
    return None


def lr_at(step: int, cfg: PriorTrainConfig) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up, then cosine to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def dihedral(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random flips / transpose per image (the 8 symmetries of the square), drawn from ``g`` (CPU)."""
    m = torch.rand(3, x.shape[0], generator=g).lt(0.5).to(x.device)[:, :, None, None, None]
    x = torch.where(m[0], x.flip(-1), x)
    x = torch.where(m[1], x.flip(-2), x)
    if x.shape[-1] == x.shape[-2]:
        x = torch.where(m[2], x.transpose(-1, -2), x)
    return x


def flow_batch(x1: torch.Tensor, g: torch.Generator):
    """``(x_t, t, target)`` of the linear path: ``x0 ~ N(0, I)``, ``t ~ U(0, 1)`` from the CPU generator ``g``."""
    x0 = torch.randn(x1.shape, generator=g).to(x1.device, x1.dtype)
    t = torch.rand(x1.shape[0], generator=g).to(x1.device, x1.dtype)
    tb = t[:, None, None, None]
    return (1 - tb) * x0 + tb * x1, t, x1 - x0


@torch.no_grad()
def fixed_loss(model: nn.Module, images: torch.Tensor, seed: int, device: torch.device, batch: int = 256) -> float:
    """The flow-matching loss of ``model`` on ``images`` with noise and times fixed by ``seed`` (fp32)."""
    g = torch.Generator().manual_seed(seed)
    total, n = 0.0, 0
    for i in range(0, len(images), batch):
        x1 = images[i: i + batch].to(device)
        xt, t, target = flow_batch(x1, g)
        total += float(((model(xt, t).float() - target) ** 2).mean()) * len(x1)
        n += len(x1)
    return total / max(n, 1)


def _flow_mse(model: nn.Module, x1: torch.Tensor, x0: torch.Tensor, t: torch.Tensor) -> float:
    """``mean ||v(x_t, t) - (x1 - x0)||^2`` at ``x_t = (1 - t) x0 + t x1`` for given noise ``x0`` and times ``t``."""
    tb = t[:, None, None, None]
    return float(((model((1 - tb) * x0 + tb * x1, t).float() - (x1 - x0)) ** 2).mean())


@torch.no_grad()
def heldout_loss(model: nn.Module, images: torch.Tensor, device: torch.device, seed: int = 321, batch: int = 256) -> float:
    """The flow-matching loss of ``model`` on held-out ``images`` at stratified times, a Python float (fp32 math).

    ``images``: shape ``(n, C, H, W)``, float, on [-1, 1]; ``model``: a velocity net called as ``model(x_t, t)``
    with ``t`` of shape ``(B,)`` on [0, 1] (:class:`~lab.generative.learned.UNetVelocity`). The loss is the
    training objective, ``mean ||v(x_t, t) - (x1 - x0)||^2`` with ``x_t = (1 - t) x0 + t x1`` (rectified flow,
    Liu et al. 2023; the linear path of Lipman et al. 2023, Eq. 20-23), at ``t_i = (i + 1/2) / n`` for image ``i``
    and ``x0 ~ N(0, I)`` drawn once from ``seed``. Every call sees the same ``(x0, t)`` pairs, so two calls
    differ only by the weights (the curve that early stopping reads); the grid covers ``t`` evenly, where one
    random ``t`` per image would not. Raises nothing of its own (torch's errors for a wrong shape or device)."""
    n = len(images)
    g = torch.Generator().manual_seed(seed)
    x0_all = torch.randn(images.shape, generator=g)
    t_all = (torch.arange(n, dtype=torch.float32) + 0.5) / max(n, 1)
    total = 0.0
    for i in range(0, n, batch):
        x1 = images[i: i + batch].to(device, torch.float32)
        total += _flow_mse(model, x1, x0_all[i: i + batch].to(device), t_all[i: i + batch].to(device)) * len(x1)
    return total / max(n, 1)


def _ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm.detach(), 1 - decay)
        for be, bm in zip(ema.buffers(), model.buffers()):
            be.copy_(bm)


def _ckpt_dir(cfg: PriorTrainConfig) -> Path:
    return Path(cfg.out) / "checkpoints"


def latest_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest ``step_*.pt`` under ``out/checkpoints`` (None when there is none)."""
    found = sorted((Path(out) / "checkpoints").glob("step_*.pt"))
    return found[-1] if found else None


def _command() -> str | None:
    """This process's command line when it runs as ``python -m lab.generative.train_prior`` (else None)."""
    if Path(sys.argv[0]).stem not in ("train_prior", "__main__"):
        return None
    return "python -m lab.generative.train_prior " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _save_checkpoint(cfg, step, model, ema, opt, gen, losses, wall, runs, tracking):
    d = _ckpt_dir(cfg)
    d.mkdir(parents=True, exist_ok=True)
    state = {
        "config": asdict(cfg),
        "step": step,
        "model": model.state_dict(),
        "ema": ema.state_dict(),
        "optimizer": opt.state_dict(),
        "generator": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "losses": list(losses),
        "wall_s": wall,
        "runs": runs,
        "tracking": tracking,
    }
    tmp = d / f".step_{step:07d}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, d / f"step_{step:07d}.pt")
    for old in sorted(d.glob("step_*.pt"))[: -cfg.keep_ckpts]:
        old.unlink()


_RESUME_KEYS = ("dataset", "batch_size", "lr", "warmup", "min_lr_ratio", "weight_decay", "grad_clip", "ema", "seed",
                "subset", "augment", "block_out_channels", "layers_per_block")


# ------------------------------------------------------------------------------------------ training


def train(cfg: PriorTrainConfig, progress: bool = True, stop_after: int | None = None) -> dict:
    """Run (or resume) training; returns a summary dict (also written as the JSON sidecar when finished).

    ``stop_after``: stop once this many steps are done in total (a checkpoint is written there),
    without writing the final weights: how the tests interrupt a run.
    """
    from tqdm.auto import tqdm

    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = pick_device(cfg.device)
    amp = autocast_dtype(device, cfg.precision)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)

    train_x = datasets.load(cfg.dataset, "train")
    if cfg.subset:
        train_x = train_x[: cfg.subset]
    val_x = datasets.load(cfg.dataset, "val")[: cfg.val_images]
    shape = tuple(train_x.shape[1:])
    train_dev = train_x.to(device)

    torch.manual_seed(cfg.seed)
    ucfg = unet_config(shape[-1], shape[0], cfg.block_out_channels, cfg.layers_per_block)
    model = UNetVelocity(build_unet(ucfg)).to(device)
    ema = UNetVelocity(build_unet(ucfg)).to(device)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    step, losses, wall_before, runs = 0, [], 0.0, []
    tracking: dict = {"curve": [], "best": None, "stopped": False}  # held-out curve, best EMA, early stop

    ck = latest_checkpoint(out)
    if ck is not None:
        state = torch.load(ck, map_location="cpu", weights_only=True)  # generator states must stay on the CPU
        old = state["config"]
        for key in _RESUME_KEYS:
            a, b = old.get(key), asdict(cfg).get(key)
            if (list(a) if isinstance(a, (list, tuple)) else a) != (list(b) if isinstance(b, (list, tuple)) else b):
                raise SystemExit(f"{ck}: was made with {key}={a!r}, this run has {key}={b!r}; use another --out")
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step, losses, wall_before = int(state["step"]), list(state["losses"]), float(state["wall_s"])
        runs = list(state.get("runs", [{"command": None, "from_step": 0, "steps": old.get("steps")}]))
        tracking = state.get("tracking") or tracking
        print(f"resuming {cfg.dataset} from {ck} (step {step})", file=sys.stderr)

    last = min(cfg.steps, stop_after) if stop_after is not None else cfg.steps
    runs.append({"command": _command(), "from_step": step, "steps": cfg.steps, "device": str(device),
                 "threads": torch.get_num_threads()})
    t_start = time.time()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.name}", unit="step", disable=not progress,
               mininterval=1.0 if sys.stderr.isatty() else 30.0, dynamic_ncols=True)
    model.train()
    while step < last and not tracking["stopped"]:
        idx = torch.randint(len(train_dev), (cfg.batch_size,), generator=gen).to(device)
        x1 = train_dev[idx]
        if cfg.augment:
            x1 = dihedral(x1, gen)
        xt, t, target = flow_batch(x1, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            pred = model(xt, t)
        loss = ((pred.float() - target) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        _ema_update(ema, model, min(cfg.ema, (1 + step) / (10 + step)))
        losses.append(float(loss.detach()))
        bar.update(1)
        if step % 10 == 0 or step == last:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.4f}", lr=f"{lr_at(step - 1, cfg):.2e}")
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            _track(tracking, step, heldout_loss(ema, val_x, device), ema, cfg.patience)
            c = tracking["curve"][-1]
            bar.write(f"{cfg.name} step {step}: held-out loss {c[1]:.5f} (best {tracking['best']['val_loss']:.5f} "
                      f"at step {tracking['best']['step']})")
        if step % cfg.ckpt_every == 0 or step == last or tracking["stopped"]:
            _save_checkpoint(cfg, step, model, ema, opt, gen, losses, wall_before + time.time() - t_start, runs, tracking)
    bar.close()
    wall = wall_before + time.time() - t_start
    summary = {"step": step, "losses": losses, "wall_s": wall, "val_loss_curve": tracking["curve"]}
    if step < cfg.steps and not tracking["stopped"]:
        return summary

    if tracking["best"] is not None:
        ema.load_state_dict(tracking["best"]["ema"])
    ema.eval()
    summary.update(_finish(cfg, ema, shape, ucfg, train_x, val_x, losses, wall, device, amp, runs, tracking, step))
    return summary


def _track(tracking: dict, step: int, value: float, ema: nn.Module, patience: int) -> None:
    """Record one held-out point; keep a copy of the EMA when it is the best so far; set ``stopped`` once the
    last ``patience`` points brought no new best."""
    tracking["curve"].append([step, round(value, 6)])
    best = tracking["best"]
    if best is None or value < best["val_loss"]:
        tracking["best"] = {"step": step, "val_loss": value,
                            "ema": {k: v.detach().clone() for k, v in ema.state_dict().items()}}
    steps = [c[0] for c in tracking["curve"]]
    tracking["stopped"] = len(steps) - 1 - steps.index(tracking["best"]["step"]) >= patience


def _finish(cfg, ema, shape, ucfg, train_x, val_x, losses, wall, device, amp, runs, tracking, step) -> dict:
    from safetensors.torch import save_file

    import diffusers

    out = Path(cfg.out)
    tail = losses[-100:]
    sidecar = {
        "name": cfg.name,
        "dataset": cfg.dataset,
        "shape": list(shape),
        "command": _command(),
        "invocations": runs,
        "split": datasets.split_description(cfg.dataset),
        "n_train_images": int(len(train_x)),
        "steps": cfg.steps,
        "steps_run": step,
        "early_stopped": bool(tracking["stopped"]),
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "lr_schedule": f"linear warm-up {cfg.warmup} steps, cosine to {cfg.min_lr_ratio} x lr",
        "optimizer": f"AdamW(weight_decay={cfg.weight_decay}), grad-norm clip {cfg.grad_clip}",
        "ema": f"decay min({cfg.ema}, (1+n)/(10+n)); the shipped weights are the EMA",
        "augment": "random flips and transposes" if cfg.augment else None,
        "seed": cfg.seed,
        "precision": "bf16 autocast" if amp is not None else "fp32",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "loss": "mean ||v(x_t, t) - (x1 - x0)||^2, x_t = (1-t) x0 + t x1, x0 ~ N(0, I), t ~ U(0, 1); t=0 noise, t=1 clean",
        "time_scale": TIME_SCALE,
        "unet_config": ucfg,
        "n_params": sum(p.numel() for p in ema.parameters()),
        "final_train_loss_last100": sum(tail) / len(tail),
        "train_loss_ema_fixed": fixed_loss(ema, train_x[: cfg.val_images], 12345, device),
        "val_loss_ema": fixed_loss(ema, val_x, 12345, device),
        "wall_s": round(wall, 1),  # training steps only, summed over invocations (evaluation excluded)
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "diffusers": diffusers.__version__},
        "loss_curve_every_50": [round(sum(losses[i: i + 50]) / len(losses[i: i + 50]), 5) for i in range(0, len(losses), 50)],
        "val_loss_curve": tracking["curve"],
        "heldout_loss": None if tracking["best"] is None else {
            "what": f"heldout_loss(): the first {len(val_x)} val images, t_i = (i + 1/2) / n, fixed noise",
            "best_step": tracking["best"]["step"], "best": round(tracking["best"]["val_loss"], 6),
            "eval_every": cfg.eval_every, "patience": cfg.patience},
        "shipped": "EMA at the best held-out step" if tracking["best"] is not None else "final EMA",
    }
    if cfg.eval:
        sidecar["eval"] = evaluate(ema, cfg.dataset, device, out / "samples.png")
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in ema.unet.state_dict().items()}
    st = out / f"{cfg.name}.safetensors"
    save_file(state, str(st), metadata={"unet_config": json.dumps(ucfg), "time_scale": str(TIME_SCALE),
                                        "dataset": cfg.dataset, "steps": str(cfg.steps), "steps_run": str(step)})
    (out / f"{cfg.name}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    return sidecar


@torch.no_grad()
def evaluate(velocity: nn.Module, dataset: str, device, png: Path | None = None, n_test: int = 256,
             sigmas=(0.1, 0.2, 0.4), n_samples: int = 64, nfe: int = 50, seed: int = 0) -> dict:
    """Sanity figures of a trained velocity net (fp32, no autocast).

    - one-step denoising of ``n_test`` held-out test images: ``y = x + sigma n`` is the flow state
      ``x_t = t y`` at ``t = 1 / (1 + sigma)``, and the clean estimate ``x_t + (1 - t) v(x_t, t)``;
      PSNR on [0, 1] of the estimate against that of ``y`` (both clipped);
    - ``n_samples`` samples by ``nfe`` Euler steps from N(0, I): pixel mean / std against the test
      images', and the mean distance of each sample to its nearest training image against the same
      for test images (a sample much closer than test images would be a memorised copy).
    """
    from lab.generative.metrics import psnr

    velocity = velocity.eval()
    test = datasets.load(dataset, "test")[:n_test].to(device)
    g = torch.Generator().manual_seed(seed)
    res: dict = {"n_test": int(len(test)), "denoise_one_step": {}}
    for s in sigmas:
        y = test + s * torch.randn(test.shape, generator=g).to(device)
        t = 1.0 / (1.0 + s)
        xt = t * y
        est = xt + (1 - t) * velocity(xt, torch.full((len(y),), t, device=device))
        res["denoise_one_step"][str(s)] = {"psnr_noisy": float(psnr(y, test).mean()), "psnr_estimate": float(psnr(est, test).mean())}
    x = torch.randn((n_samples, *test.shape[1:]), generator=g).to(device)
    for k in range(nfe):
        x = x + velocity(x, torch.full((n_samples,), k / nfe, device=device)) / nfe
    train = datasets.load(dataset, "train")[:20000].to(device).flatten(1)

    def nn_dist(z):
        return float(torch.cdist(z.flatten(1), train).min(1).values.mean())

    xs = x.clamp(-1, 1)
    res["samples"] = {
        "nfe": nfe, "n": n_samples,
        "mean": float(xs.mean()), "std": float(xs.std()), "test_mean": float(test.mean()), "test_std": float(test.std()),
        "nn_dist_to_train": nn_dist(xs), "test_nn_dist_to_train": nn_dist(test[:n_samples]),
    }
    if png is not None:
        _grid_png(xs.cpu(), png)
    return res


def _grid_png(x: torch.Tensor, path: Path, ncol: int = 8) -> None:
    import numpy as np
    from PIL import Image

    n, _, h, w = x.shape
    rows = math.ceil(n / ncol)
    canvas = np.zeros((rows * (h + 2), ncol * (w + 2)), dtype=np.uint8)
    u = ((x[:, 0].numpy() + 1) * 127.5).clip(0, 255).astype(np.uint8)
    for i in range(n):
        r, c = divmod(i, ncol)
        canvas[r * (h + 2): r * (h + 2) + h, c * (w + 2): c * (w + 2) + w] = u[i]
    Image.fromarray(canvas).resize((canvas.shape[1] * 3, canvas.shape[0] * 3), Image.NEAREST).save(path)


# ------------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m lab.generative.train_prior", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, choices=datasets.DATASETS)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True, help="run folder (checkpoints, final weights); an existing run there is resumed")
    p.add_argument("--name", help="weights file name (default: the data set's)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    p.add_argument("--subset", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--eval-every", type=int, default=0,
                   help="held-out loss every N steps (0: off); the best EMA is shipped, training stops after --patience")
    p.add_argument("--patience", type=int, default=4, help="held-out evaluations without a new best before stopping")
    p.add_argument("--val-images", type=int, default=512, help="val images for the held-out loss")
    a = p.parse_args(argv)
    cfg = PriorTrainConfig(dataset=a.dataset, steps=a.steps, out=a.out, name=a.name, batch_size=a.batch_size, lr=a.lr,
                      warmup=a.warmup, ema=a.ema, seed=a.seed, ckpt_every=a.ckpt_every, device=a.device,
                      precision=a.precision, subset=a.subset, threads=a.threads, eval=not a.no_eval,
                      eval_every=a.eval_every, patience=a.patience, val_images=a.val_images)
    summary = train(cfg)
    if "val_loss_ema" in summary:
        print(json.dumps({k: summary[k] for k in ("name", "steps", "final_train_loss_last100", "val_loss_ema", "wall_s")}
                         | {"eval": summary.get("eval")}, indent=1))
    return summary


if __name__ == "__main__":
    main()
