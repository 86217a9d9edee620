"""Noise schedules of the video experts, all in one ``x_t = alpha_t x0 + sigma_t eps`` form.

Timesteps are integers ``t`` in ``0..T`` (``T = 1000``, as in DDPM / diffusers), ``t = 0`` clean.
Each schedule is given by its ``alpha_t`` and ``sigma_t`` tables (float64, length ``T + 1``):

``ddpm_linear``  (Ho et al. 2020, Sec. 4)
    ``beta`` linear from 1e-4 to 0.02 over t = 1..T, ``abar_t = prod (1 - beta)``,
    ``alpha_t = sqrt(abar_t)``, ``sigma_t = sqrt(1 - abar_t)`` (variance preserving).
``cosine``  (Nichol & Dhariwal 2021, Eq. 17)
    ``abar_t = f(t) / f(0)``, ``f(t) = cos^2(((t/T) + s) / (1 + s) * pi / 2)``, ``s = 0.008``,
    betas clipped at 0.999; variance preserving.
``flow_sigma``  (rectified flow / flow matching; Liu et al. 2023, Lipman et al. 2023)
    ``sigma_t = t / T``, ``alpha_t = 1 - sigma_t`` (not variance preserving); the network predicts
    the velocity ``v = eps - x0``.

Because every schedule is written as ``(alpha_t, sigma_t)``, one deterministic DDIM update
(Song et al. 2021, Eq. 12 with eta = 0) serves all three: ``x_{t'} = alpha_{t'} x0_hat + sigma_{t'} eps_hat``
(for ``flow_sigma`` this is exactly the Euler step of the flow ODE). The clean-sample estimate
``x0_hat`` is what moves a sample from one schedule to another (ConFiner's hinge, Eqs. 8-11):
:meth:`Schedule.add_noise` of one schedule and :meth:`Schedule.x0_from_eps` of another.
"""

from __future__ import annotations

import math

import torch

__all__ = ["T", "Schedule", "get_schedule", "SCHEDULES", "timesteps"]

#: Number of diffusion timesteps of every schedule (t = 0 clean, t = T pure noise up to alpha_T).
T = 1000


class Schedule:
    """A noise schedule ``x_t = alpha_t x0 + sigma_t eps`` on integer ``t`` in ``0..T``.

    Parameters
    ----------
    name : str
        One of :data:`SCHEDULES`.
    alpha, sigma : torch.Tensor
        float64 ``(T + 1,)``, ``alpha[0] = 1``, ``sigma[0] = 0``.
    prediction : {"epsilon", "velocity"}
        What the expert trained on this schedule outputs (velocity ``v = eps - x0`` for flows).
    """

    def __init__(self, name: str, alpha: torch.Tensor, sigma: torch.Tensor, prediction: str):
        self.name, self.alpha, self.sigma, self.prediction = name, alpha.double(), sigma.double(), prediction

    def __repr__(self) -> str:
        return f"Schedule({self.name!r}, prediction={self.prediction!r})"

    def coef(self, t, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(alpha_t, sigma_t)`` for int ``t`` (scalar or ``(B,)``), shaped to broadcast over ``like`` (B, ...)."""
        t = torch.as_tensor(t, dtype=torch.long)
        if int(t.min()) < 0 or int(t.max()) > T:
            raise ValueError(f"timestep must lie in 0..{T}, got {t.tolist()}")
        a, s = self.alpha[t], self.sigma[t]
        if a.dim() == 1:
            shape = (-1,) + (1,) * (like.dim() - 1)
            a, s = a.view(shape), s.view(shape)
        return a.to(like.dtype), s.to(like.dtype)

    def add_noise(self, x0: torch.Tensor, eps: torch.Tensor, t) -> torch.Tensor:
        """``x_t = alpha_t x0 + sigma_t eps`` (Eq. 6 / 9 / 11 of ConFiner)."""
        a, s = self.coef(t, x0)
        return a * x0 + s * eps

    def x0_from_eps(self, x_t: torch.Tensor, eps: torch.Tensor, t) -> torch.Tensor:
        """``x0 = (x_t - sigma_t eps) / alpha_t``."""
        a, s = self.coef(t, x_t)
        return (x_t - s * eps) / a

    def eps_from_x0(self, x_t: torch.Tensor, x0: torch.Tensor, t) -> torch.Tensor:
        """``eps = (x_t - alpha_t x0) / sigma_t`` (t >= 1)."""
        a, s = self.coef(t, x_t)
        return (x_t - a * x0) / s

    def from_output(self, x_t: torch.Tensor, out: torch.Tensor, t) -> tuple[torch.Tensor, torch.Tensor]:
        """The network output (epsilon or velocity) -> ``(x0_hat, eps_hat)``."""
        a, s = self.coef(t, x_t)
        if self.prediction == "epsilon":
            eps = out
            return (x_t - s * eps) / a, eps
        # velocity v = eps - x0 with alpha = 1 - sigma: x_t = x0 + sigma v
        x0 = x_t - s * out
        return x0, x0 + out

    def target(self, x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """The training target of an expert on this schedule (eps, or ``v = eps - x0``)."""
        return eps if self.prediction == "epsilon" else eps - x0

    def ddim_step(self, x0_hat: torch.Tensor, eps_hat: torch.Tensor, t_prev) -> torch.Tensor:
        """Deterministic DDIM (eta = 0) to ``t_prev``: ``alpha_{t'} x0_hat + sigma_{t'} eps_hat``."""
        return self.add_noise(x0_hat, eps_hat, t_prev)

    def timestep_at(self, noise_to_signal: float) -> int:
        """The timestep ``t`` in ``1..T`` whose ``sigma_t / alpha_t`` is nearest ``noise_to_signal`` (> 0): where
        two schedules put the *same* corruption (e.g. ``flow_sigma``: ``t = T r / (1 + r)``, so r = 1 is t = 500).

        Raises ``ValueError`` for a ratio that is not a positive finite number."""
        r = float(noise_to_signal)
        if not (r > 0 and math.isfinite(r)):
            raise ValueError(f"noise_to_signal must be a positive finite number, got {noise_to_signal!r}")
        ratio = self.sigma[1:] / self.alpha[1:].clamp_min(1e-300)
        return int(torch.argmin((ratio - r).abs())) + 1


def _ddpm_linear() -> Schedule:
    betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    abar = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - betas, 0)])
    return Schedule("ddpm_linear", abar.sqrt(), (1 - abar).sqrt(), "epsilon")


def _cosine(s: float = 0.008) -> Schedule:
    f = lambda t: math.cos(((t / T) + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
    betas = torch.tensor([min(1 - f(i) / f(i - 1), 0.999) for i in range(1, T + 1)], dtype=torch.float64)
    abar = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(1 - betas, 0)])
    return Schedule("cosine", abar.sqrt(), (1 - abar).sqrt(), "epsilon")


def _flow_sigma() -> Schedule:
    sigma = torch.arange(T + 1, dtype=torch.float64) / T
    return Schedule("flow_sigma", 1 - sigma, sigma, "velocity")


SCHEDULES = {"ddpm_linear": _ddpm_linear, "cosine": _cosine, "flow_sigma": _flow_sigma}


def get_schedule(name: str) -> Schedule:
    """The schedule called ``name`` (:data:`SCHEDULES`); ``KeyError`` naming the known ones otherwise."""
    try:
        return SCHEDULES[name]()
    except KeyError:
        raise KeyError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}") from None


def timesteps(n: int, t_start: int = T) -> list[int]:
    """``n`` uniformly spaced DDIM timesteps from ``t_start`` down (excluding 0), e.g. ``timesteps(4) = [1000, 750, 500, 250]``."""
    if n < 1 or not 1 <= t_start <= T:
        raise ValueError(f"need n >= 1 and 1 <= t_start <= {T}, got n={n}, t_start={t_start}")
    return [int(round(t_start * (n - i) / n)) for i in range(n)]
