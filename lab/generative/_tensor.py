"""Small tensor helpers shared by operators, priors and methods (private)."""

from __future__ import annotations

import torch

__all__ = ["check_batch", "randn", "as_time", "bcast", "compute_dtype", "make_generator"]


def check_batch(x, shape: tuple[int, ...], who: str, what: str, error: type[Exception]) -> None:
    """Raise ``error`` unless ``x`` is a floating tensor of shape ``(B, *shape)`` with B >= 1."""
    want = "(B, " + ", ".join(str(s) for s in shape) + ")"
    if not torch.is_tensor(x):
        raise error(f"{who}: expected {what} as a torch tensor of shape {want}, got {type(x).__name__}")
    if x.dim() != len(shape) + 1 or tuple(x.shape[1:]) != tuple(shape) or x.shape[0] < 1:
        raise error(f"{who}: expected {what} of shape {want}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise error(f"{who}: expected a floating-point {what}, got dtype {x.dtype}")


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (random seed when None); noise is drawn on CPU and moved,
    so a seed gives the same numbers on every device."""
    g = torch.Generator(device="cpu")
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def randn(shape, generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """Standard normal noise of ``shape`` on ``like``'s device and dtype, drawn from ``generator``
    (on the generator's own device, then moved)."""
    gen_device = generator.device if generator is not None else torch.device("cpu")
    z = torch.randn(tuple(shape), generator=generator, device=gen_device, dtype=torch.float32)
    return z.to(device=like.device, dtype=like.dtype)


def as_time(t, batch: int, like: torch.Tensor, who: str, error: type[Exception]) -> torch.Tensor:
    """Flow time as a ``(B,)`` tensor on ``like``'s device/dtype; ``t`` is a float, a 0-d tensor or a (B,) tensor in [0, 1]."""
    if torch.is_tensor(t):
        tt = t.detach().to(device=like.device, dtype=like.dtype)
        if tt.dim() == 0:
            tt = tt.expand(batch)
        elif tt.shape != (batch,):
            raise error(f"{who}: expected t as a float or a tensor of shape ({batch},), got {tuple(tt.shape)}")
    else:
        tt = torch.full((batch,), float(t), device=like.device, dtype=like.dtype)
    if bool(((tt < 0) | (tt > 1)).any()) or bool(torch.isnan(tt).any()):
        raise error(f"{who}: flow time t must lie in [0, 1] (0 = noise, 1 = clean), got {tt.tolist()}")
    return tt


def bcast(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """Reshape a ``(B,)`` tensor to ``(B, 1, ..., 1)`` with ``ndim`` dimensions."""
    return v.reshape(v.shape[0], *([1] * (ndim - 1)))


def compute_dtype(device: torch.device) -> torch.dtype:
    """float64 wherever supported (exact priors compute in double), else float32 (e.g. MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64
