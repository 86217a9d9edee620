"""Train one video expert: ``python -m lab.generative.video.train --expert spatial --steps 1500 --out runs/spatial``.

Recipe (every expert): a diffusers ``UNet2DModel`` without attention (:func:`lab.generative.learned.unet_config`),
data from :mod:`lab.generative.video.datasets` (train split only), ``t ~ U{1..1000}``, ``eps ~ N(0, I)``,
``x_t = alpha_t x0 + sigma_t eps`` on the expert's own schedule (:data:`lab.generative.video.experts.EXPERTS`),
loss ``mean ||net(x_t, t) - target||^2`` (target ``eps``, or ``v = eps - x0`` on ``flow_sigma``);
AdamW (lr 2e-3, weight decay 1e-4), linear warm-up 100 steps then cosine to 10 %, grad-norm clip 1,
EMA of the weights (decay ``min(0.999, (1+n)/(10+n))``; the EMA is shipped), fp32.
Augmentation: horizontal flips; clips also reversed in time (p = 0.5).
All randomness from one seeded CPU generator. Resumable: ``OUT/ckpt.pt`` every 100 steps (atomic);
rerunning the same command continues from it.
Held-out loss (``--eval-every N``): every N steps the EMA's loss on the **val** split (:func:`heldout_loss`:
a fixed grid of 20 timesteps t = 25, 75, ..., 975 with fixed noise, so the curve is not sampling noise);
the EMA with the lowest held-out loss is the one shipped, and training stops early after ``--patience``
evaluations without improvement (the curve is recorded in the sidecar as ``val_loss_curve``).

Output: ``OUT/<expert>.safetensors`` and ``OUT/<expert>.json`` (recipe, command, data split, losses,
wall time, ``weights_sha256``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from lab.generative.learned import build_unet, unet_config
from lab.generative.video import datasets
from lab.generative.video.experts import EXPERTS, sha256_file
from lab.generative.video.schedules import T, get_schedule

__all__ = ["CONFIGS", "train", "heldout_loss", "main"]

#: UNet widths per expert (kept tiny: a 2-core shared CPU).
CONFIGS = {"control": (32, 64), "spatial": (16, 32), "temporal": (32, 64)}


def _data(expert: str, frames: int, size: int) -> torch.Tensor:
    kind = EXPERTS[expert][0]
    return datasets.frames("train", size) if kind == "frame" else datasets.clips("train", frames, size)


def _heldout_data(expert: str, frames: int, size: int) -> torch.Tensor:
    kind = EXPERTS[expert][0]
    return datasets.frames("val", size) if kind == "frame" else datasets.clips("val", frames, size, stride=1)


@torch.no_grad()
def heldout_loss(net, expert: str, x: torch.Tensor, seed: int = 123) -> float:
    """Mean training loss of ``net`` on held-out data ``x`` over the fixed timestep grid ``t = 25, 75, ..., 975``
    (one fixed noise draw per timestep from ``seed``): a low-variance held-out curve for early stopping."""
    sched = get_schedule(EXPERTS[expert][1])
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(25, T, 50):
        eps = torch.randn(x.shape, generator=g)
        tt = torch.full((x.shape[0],), t, dtype=torch.long)
        out.append(float((net(sched.add_noise(x, eps, t), tt).sample - sched.target(x, eps)).pow(2).mean()))
    return sum(out) / len(out)


def train(expert: str, steps: int, out: str, frames: int = 8, size: int = 32, batch: int = 32, lr: float = 2e-3,
          seed: int = 0, threads: int | None = None, command: str = "", widths: tuple | None = None,
          eval_every: int = 0, patience: int = 4) -> dict:
    """Train (or resume) expert ``expert`` for at most ``steps`` updates; returns the sidecar dictionary.

    ``widths`` overrides :data:`CONFIGS` (UNet block widths); ``eval_every > 0`` tracks the held-out loss
    (:func:`heldout_loss` on the val split), ships the best EMA and stops after ``patience`` evaluations
    without improvement.
    """
    if expert not in EXPERTS:
        raise SystemExit(f"--expert must be one of {', '.join(EXPERTS)}, got {expert!r}")
    if eval_every < 0 or patience < 1:
        raise SystemExit(f"--eval-every must be >= 0 and --patience >= 1, got {eval_every}, {patience}")
    if threads:
        torch.set_num_threads(threads)
    outd = Path(out)
    outd.mkdir(parents=True, exist_ok=True)
    kind, sched_name, full_steps = EXPERTS[expert]
    sched = get_schedule(sched_name)
    x = _data(expert, frames, size)
    ch = 1 if kind == "frame" else frames
    cfg = unet_config(size, ch, tuple(widths or CONFIGS[expert]), 1, 8)
    xv = _heldout_data(expert, frames, size)
    net = build_unet(cfg)
    ema = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(seed)
    step, losses, wall, curve, best, stopped = 0, [], 0.0, [], None, False
    ck = outd / "ckpt.pt"
    if ck.exists():
        s = torch.load(ck, weights_only=False)
        net.load_state_dict(s["net"]), ema.load_state_dict(s["ema"]), opt.load_state_dict(s["opt"])
        gen.set_state(s["gen"])
        step, losses, wall = s["step"], s["losses"], s["wall"]
        curve, best, stopped = s.get("curve", []), s.get("best"), s.get("stopped", False)
    t0 = time.time()
    while step < steps and not stopped:
        w = min(1.0, (step + 1) / 100)
        cos = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))
        for g in opt.param_groups:
            g["lr"] = lr * w * cos
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        x0 = x[idx].clone()
        flip = torch.rand(batch, generator=gen) < 0.5
        x0[flip] = x0[flip].flip(-1)
        if kind == "clip":
            rev = torch.rand(batch, generator=gen) < 0.5
            x0[rev] = x0[rev].flip(1)
        t = torch.randint(1, T + 1, (batch,), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        xt = sched.add_noise(x0, eps, t)
        loss = (net(xt, t).sample - sched.target(x0, eps)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        d = min(0.999, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), net.parameters()):
                pe.lerp_(p, 1 - d)
        losses.append(float(loss.detach()))
        step += 1
        if eval_every and (step % eval_every == 0 or step == steps):
            hv = heldout_loss(ema, expert, xv)
            curve.append([step, round(hv, 5)])
            if best is None or hv < best["val_loss"]:
                best = {"step": step, "val_loss": hv, "ema": copy.deepcopy(ema.state_dict())}
            stopped = len(curve) - 1 - [c[0] for c in curve].index(best["step"]) >= patience
            print(f"{expert} step {step} held-out loss {hv:.5f} (best {best['val_loss']:.5f} at {best['step']})", flush=True)
        if step % 100 == 0 or step == steps or stopped:
            tmp = ck.with_suffix(".tmp")
            torch.save({"net": net.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                        "step": step, "losses": losses, "wall": wall + time.time() - t0, "curve": curve, "best": best,
                        "stopped": stopped}, tmp)
            os.replace(tmp, ck)
            print(f"{expert} step {step}/{steps} loss(last100) {sum(losses[-100:]) / len(losses[-100:]):.4f}", flush=True)
    wall += time.time() - t0
    if best is not None:
        ema.load_state_dict(best["ema"])
    from safetensors.torch import save_file

    st = outd / f"{expert}.safetensors"
    save_file({k: v.contiguous() for k, v in ema.state_dict().items()}, str(st))
    # validation loss of the EMA on the val split, fixed noise (one random t per sample: the first recipe's number)
    gv = torch.Generator().manual_seed(123)
    tv = torch.randint(1, T + 1, (xv.shape[0],), generator=gv)
    ev = torch.randn(xv.shape, generator=gv)
    with torch.no_grad():
        val = float((ema(sched.add_noise(xv, ev, tv), tv).sample - sched.target(xv, ev)).pow(2).mean())
    meta = {
        "name": expert, "kind": kind, "schedule": sched_name, "prediction": sched.prediction, "full_steps": full_steps,
        "frames": frames, "size": size, "command": command, "steps": steps, "batch_size": batch, "lr": lr, "seed": seed,
        "recipe": __doc__.split("Output:")[0].strip(),
        "data": {"sources": {s: datasets.SOURCES[s][0] for s in datasets.DOMAINS["natural"]}, "split": "train (6 of every 10 interleaved blocks of each video: datasets.split_ranges)",
                 "n_train": int(x.shape[0]), "preprocess": f"luma, centred square crop, antialiased resize to {size}x{size}, [-1, 1]"},
        "unet_config": cfg, "n_params": sum(p.numel() for p in ema.parameters()),
        "final_train_loss_last100": sum(losses[-100:]) / len(losses[-100:]), "val_loss_ema": val,
        "steps_run": step, "early_stopped": bool(stopped),
        "heldout_loss": None if best is None else {"what": "heldout_loss(): val split, t = 25, 75, ..., 975, fixed noise",
                                                   "best_step": best["step"], "best": round(best["val_loss"], 5),
                                                   "eval_every": eval_every, "patience": patience},
        "val_loss_curve": curve, "shipped": "EMA at the best held-out step" if best is not None else "final EMA",
        "loss_curve_every_100": [round(sum(losses[i:i + 100]) / len(losses[i:i + 100]), 5) for i in range(0, len(losses), 100)],
        "wall_s": round(wall, 1), "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "weights_sha256": sha256_file(st),
    }
    (outd / f"{expert}.json").write_text(json.dumps(meta, indent=1))
    return meta


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--expert", required=True, choices=sorted(EXPERTS))
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--widths", type=int, nargs="+", help="UNet block widths (default: CONFIGS)")
    p.add_argument("--eval-every", type=int, default=0, help="held-out loss every N steps (0: off)")
    p.add_argument("--patience", type=int, default=4)
    a = p.parse_args(argv)
    cmd = "python -m lab.generative.video.train " + " ".join(shlex.quote(s) for s in (argv if argv is not None else sys.argv[1:]))
    m = train(a.expert, a.steps, a.out, a.frames, a.size, a.batch_size, a.lr, a.seed, a.threads, cmd, a.widths, a.eval_every, a.patience)
    print(json.dumps({k: m[k] for k in ("name", "n_params", "final_train_loss_last100", "val_loss_ema", "wall_s")}))


if __name__ == "__main__":
    main()
