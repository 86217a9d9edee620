"""Flow-matching priors: a velocity field ``v(x_t, t)`` on the linear bridge.

Convention (the project's, and the papers'): flow time ``t`` runs from 0 (source noise
``x0 ~ N(0, I)``) to 1 (clean image ``x1``); ``x_t = (1 - t) x0 + t x1``; the velocity target is
``x1 - x0`` and the optimal velocity is ``v*(x, t) = E[x1 - x0 | x_t = x]`` (rectified flow / OT-CFM;
Lipman et al. 2023, Liu et al. 2023). Its clean estimate ("denoiser") is
``E[x1 | x_t = x] = x + (1 - t) v*(x, t)`` (PnP-Flow's ``D_t``, Martin et al. ICLR 2025, Eq. 8).

Every prior counts its network evaluations in ``nfe``: one call of :meth:`FlowPrior.velocity`
or :meth:`FlowPrior.clean_estimate` (on a whole batch) is one evaluation, so restoration methods can
be compared at equal NFE (``lab.generative.restore`` checks the count).

- :class:`GaussianPrior`: ``x1 ~ N(mu, Sigma)`` fitted to data; velocity and denoiser linear in closed
  form; :meth:`GaussianPrior.posterior_mean` is the Bayes posterior mean of a linear-Gaussian
  inverse problem: the ceiling of any method's expected PSNR.
- :class:`EmpiricalPrior`: ``x1`` uniform over a finite set of images; closed-form optimal velocity
  through softmax posterior weights over the set.
- :class:`LearnedPrior`: any velocity ``nn.Module`` (e.g. diffusers' ``UNet2DModel``).

Exact priors compute in float64 (float32 on MPS) and return the input's dtype; they are
differentiable (OT-ODE and D-Flow backpropagate through them).
"""

from __future__ import annotations


import torch
from torch import nn

from lab.generative._tensor import as_time, bcast, check_batch, compute_dtype, randn
from lab.generative.errors import PriorError

__all__ = ["FlowPrior", "GaussianPrior", "EmpiricalPrior", "LearnedPrior"]


def _shape(shape, who) -> tuple[int, int, int]:
    try:
        s = tuple(int(v) for v in shape)
    except TypeError:
        raise PriorError(f"{who}: shape must be (C, H, W), got {shape!r}") from None
    if len(s) != 3 or min(s) < 1:
        raise PriorError(f"{who}: shape must be (C, H, W) with positive sizes, got {shape!r}")
    return s  # type: ignore[return-value]


class FlowPrior:
    """Base class of flow priors on images of shape ``(C, H, W)``.

    Subclasses implement ``_velocity(x, t)`` (and may override ``_clean_estimate``), where ``x`` is
    ``(B, C, H, W)`` and ``t`` a ``(B,)`` tensor on ``x``'s device. Public methods check shapes and
    times (raising :class:`~lab.generative.errors.PriorError`) and count evaluations in ``nfe``.

    Source: flow matching with the linear (OT) path, Lipman et al., ICLR 2023, Eq. 20-23; the
    clean-estimate identity is PnP-Flow's denoiser (Martin et al., ICLR 2025, Sec. 3).

    Attributes
    ----------
    shape : (C, H, W)
    nfe : int
        Evaluations so far (one per batched call).
    tuning_key : str or None
        The prior kind whose validation-tuned hyper-parameters ``lab/generative/restore/tuned.json``
        holds (``"gaussian-digits"``, ``"learned-mnist"``, ...); ``restore(..., hyper="tuned")``
        reads it. None (the default) for a prior nobody tuned for; set by
        :func:`lab.generative.tuning.make_prior` and :func:`lab.generative.learned.load_learned_prior`.
    """

    #: see the class docstring
    tuning_key: str | None = None

    def __init__(self, shape, tuning_key: str | None = None):
        self.shape = _shape(shape, type(self).__name__)
        #: number of network evaluations so far (one per batched call)
        self.nfe = 0
        if tuning_key is not None and (not isinstance(tuning_key, str) or not tuning_key):
            raise PriorError(f"{type(self).__name__}: tuning_key must be a non-empty str or None, got {tuning_key!r}")
        self.tuning_key = tuning_key

    # ------------------------------------------------------------------ public
    def velocity(self, x: torch.Tensor, t) -> torch.Tensor:
        """``v(x, t)``: ``x`` (B, C, H, W), ``t`` float or (B,) in [0, 1]; returns (B, C, H, W). One NFE."""
        tt = self._prepare(x, t, "velocity")
        self.nfe += 1
        return self._velocity(x, tt)

    def clean_estimate(self, x: torch.Tensor, t) -> torch.Tensor:
        """``x1_hat = x + (1 - t) v(x, t)`` (= ``E[x1 | x_t = x]`` for an exact prior). One NFE."""
        tt = self._prepare(x, t, "clean_estimate")
        self.nfe += 1
        return self._clean_estimate(x, tt)

    def denoiser(self, x: torch.Tensor, t) -> torch.Tensor:
        """Alias of :meth:`clean_estimate` (PnP-Flow's ``D_t``). One NFE."""
        return self.clean_estimate(x, t)

    def reset_nfe(self) -> None:
        """Set the evaluation counter back to 0."""
        self.nfe = 0

    @torch.no_grad()
    def sample(self, n: int, nfe: int, generator: torch.Generator | None = None, device=None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Unconditional samples by Euler integration of ``dx/dt = v`` on a uniform grid of ``nfe`` steps
        from ``x0 ~ N(0, I)``; returns (n, C, H, W). Uses exactly ``nfe`` evaluations."""
        if int(nfe) < 1:
            raise PriorError(f"{type(self).__name__}.sample: nfe must be >= 1, got {nfe}")
        like = torch.empty(0, device=device, dtype=dtype)
        x = randn((int(n), *self.shape), generator, like)
        from lab.generative.restore.base import timesteps  # lazy: lab.generative.restore imports this module

        for _, t, _, _ in timesteps(int(nfe)):
            x = x + self.velocity(x, t) / int(nfe)
        return x

    # ------------------------------------------------------------------ subclass hooks
    def _prepare(self, x, t, fn) -> torch.Tensor:
        check_batch(x, self.shape, f"{type(self).__name__}.{fn}", "x", PriorError)
        return as_time(t, x.shape[0], x, f"{type(self).__name__}.{fn}", PriorError)

    def _velocity(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _clean_estimate(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x + bcast(1 - t, x.dim()) * self._velocity(x, t)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, nfe={self.nfe})"


class GaussianPrior(FlowPrior):
    """Exact flow prior for ``x1 ~ N(mu, Sigma)`` (images flattened to ``d = C*H*W``).

    With ``x_t = (1-t) x0 + t x1`` and ``A_t = t^2 Sigma + (1-t)^2 I``:

    - ``E[x1 | x_t] = mu + t Sigma A_t^{-1} (x_t - t mu)``;
    - ``v*(x_t, t) = E[x1 - x0 | x_t] = mu + (t Sigma - (1-t) I) A_t^{-1} (x_t - t mu)``,

    evaluated in the eigenbasis of ``Sigma`` (finite at t = 0 and t = 1). Use
    :meth:`fit` to estimate ``mu`` and ``Sigma`` from images.

    Parameters
    ----------
    mean : tensor (C, H, W)
    cov : tensor (d, d)
        Symmetric positive definite (a ridge is not added here: :meth:`fit` adds it).

    Memory is ``O(d^2)``: meant for small images (d up to a few thousand).
    Source: the linear-Gaussian check of ``../shared/notes/rebridge-reproduction.md`` ("Two exact
    priors"); the conditional-Gaussian formulas are standard (e.g. Bishop, PRML, Sec. 2.3.1).
    """

    def __init__(self, mean: torch.Tensor, cov: torch.Tensor):
        if not torch.is_tensor(mean) or mean.dim() != 3:
            raise PriorError(f"GaussianPrior: mean must be a tensor of shape (C, H, W), got {getattr(mean, 'shape', type(mean))}")
        super().__init__(mean.shape)
        d = mean.numel()
        if not torch.is_tensor(cov) or tuple(cov.shape) != (d, d):
            raise PriorError(f"GaussianPrior: cov must be a tensor of shape ({d}, {d}), got {getattr(cov, 'shape', type(cov))}")
        cov = cov.detach().to("cpu", torch.float64)
        if not torch.allclose(cov, cov.T, atol=1e-10 * max(1.0, float(cov.abs().max()))):
            raise PriorError("GaussianPrior: cov must be symmetric")
        lam, U = torch.linalg.eigh(0.5 * (cov + cov.T))
        if float(lam.min()) <= 0:
            raise PriorError(f"GaussianPrior: cov must be positive definite (smallest eigenvalue {float(lam.min()):.3g}); fit with a ridge")
        self.mean = mean.detach().to("cpu", torch.float64)
        self.cov = cov
        self.eigenvalues, self.eigenvectors = lam, U
        self._dev: dict = {}

    @classmethod
    def fit(cls, images: torch.Tensor, ridge: float = 1e-4) -> "GaussianPrior":
        """Fit ``mu`` (sample mean) and ``Sigma`` (unbiased sample covariance + ``ridge * I``).

        Parameters
        ----------
        images : tensor (N, C, H, W), N >= 2, on the [-1, 1] scale
        ridge : float > 0
            Added to the covariance diagonal (keeps it invertible when N <= d or pixels are constant).
        """
        if not torch.is_tensor(images) or images.dim() != 4 or images.shape[0] < 2:
            raise PriorError(f"GaussianPrior.fit: images must be a tensor (N, C, H, W) with N >= 2, got {getattr(images, 'shape', type(images))}")
        if not float(ridge) > 0:
            raise PriorError(f"GaussianPrior.fit: ridge must be > 0, got {ridge}")
        X = images.detach().to("cpu", torch.float64).flatten(1)
        mu = X.mean(0)
        Xc = X - mu
        cov = Xc.T @ Xc / (X.shape[0] - 1) + float(ridge) * torch.eye(X.shape[1], dtype=torch.float64)
        return cls(mu.reshape(images.shape[1:]), cov)

    @property
    def d(self) -> int:
        """Dimension ``C*H*W``."""
        return self.mean.numel()

    def _on(self, device):
        dt = compute_dtype(device)
        key = (device, dt)
        if key not in self._dev:
            self._dev[key] = (self.mean.flatten().to(device, dt), self.eigenvalues.to(device, dt),
                              self.eigenvectors.to(device, dt))
        return self._dev[key]

    def _eig_apply(self, x, t, scale_fn):
        """``mu + U diag(scale_fn(t, lam)) U^T (x - t mu)`` for each batch row."""
        mu, lam, U = self._on(x.device)
        dt = mu.dtype
        xf = x.flatten(1).to(dt)
        tt = t.to(dt)[:, None]
        z = (xf - tt * mu) @ U
        out = mu + (z * scale_fn(tt, lam)) @ U.T
        return out.reshape(x.shape).to(x.dtype)

    def _velocity(self, x, t):
        return self._eig_apply(x, t, lambda tt, lam: (tt * lam - (1 - tt)) / (tt**2 * lam + (1 - tt) ** 2))

    def _clean_estimate(self, x, t):
        return self._eig_apply(x, t, lambda tt, lam: tt * lam / (tt**2 * lam + (1 - tt) ** 2))

    def sample_clean(self, n: int, generator: torch.Generator | None = None, device=None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``n`` exact draws ``x1 ~ N(mu, Sigma)``, shape (n, C, H, W) (no NFE)."""
        like = torch.empty(0, device=device, dtype=dtype)
        z = randn((int(n), self.d), generator, like).to(torch.float64 if like.device.type != "mps" else torch.float32)
        mu, lam, U = self._on(z.device)
        x = mu + (z.to(mu.dtype) * lam.sqrt()) @ U.T
        return x.reshape(int(n), *self.shape).to(dtype)

    def _posterior_parts(self, operator):
        if tuple(operator.shape) != self.shape:
            raise PriorError(f"GaussianPrior: operator acts on images {tuple(operator.shape)}, the prior on {self.shape}")
        A = operator.as_matrix(torch.float64)  # (m, d)
        S = self.cov
        s2 = operator.sigma_y**2
        K = A @ S @ A.T + s2 * torch.eye(A.shape[0], dtype=torch.float64)
        Kinv = torch.linalg.pinv(K, hermitian=True) if s2 == 0 else torch.linalg.inv(K)
        return A, S, Kinv

    def posterior_mean(self, y: torch.Tensor, operator) -> torch.Tensor:
        """The Bayes posterior mean ``E[x1 | y]`` for ``y = H x1 + sigma_y n``:
        ``mu + Sigma H^T (H Sigma H^T + sigma_y^2 I)^{-1} (y - H mu)`` (pseudo-inverse when
        ``sigma_y = 0``). The MMSE estimator: no method can have a lower expected squared error
        (the Bayes ceiling). No NFE is counted.

        Parameters
        ----------
        y : tensor (B, *operator.measurement_shape)
        operator : lab.generative.operators.LinearOperator on images of this prior's shape
        """
        check_batch(y, operator.measurement_shape, "GaussianPrior.posterior_mean", "y", PriorError)
        A, S, Kinv = self._posterior_parts(operator)
        yf = y.detach().to("cpu", torch.float64).flatten(1)
        mu = self.mean.flatten()
        x = mu + (yf - mu @ A.T) @ Kinv.T @ A @ S  # S, Kinv symmetric
        return x.reshape(y.shape[0], *self.shape).to(device=y.device, dtype=y.dtype)

    def posterior_covariance(self, operator) -> torch.Tensor:
        """``Cov[x1 | y] = Sigma - Sigma H^T (H Sigma H^T + sigma_y^2 I)^{-1} H Sigma``, shape (d, d),
        float64 on the CPU; its trace / d is the Bayes mean squared error per entry (on [-1, 1])."""
        A, S, Kinv = self._posterior_parts(operator)
        return S - S @ A.T @ Kinv @ A @ S

    def __repr__(self) -> str:
        return f"GaussianPrior(shape={self.shape}, nfe={self.nfe})"


class EmpiricalPrior(FlowPrior):
    """Exact flow prior for ``x1`` uniform over a finite set of images ``{x^(i)}``.

    Given ``x_t = x``, the posterior over the set is a softmax:
    ``w_i(x, t) ∝ exp(-||x - t x^(i)||^2 / (2 (1-t)^2))``, so
    ``E[x1 | x_t = x] = sum_i w_i x^(i)`` and ``v*(x, t) = (E[x1 | x_t = x] - x) / (1 - t)``.
    ``1 - t`` is floored at ``eps`` (default 1e-6), so at ``t = 1`` the denoiser returns the nearest image.

    Parameters
    ----------
    images : tensor (N, C, H, W) on the [-1, 1] scale
    eps : float
        Floor of ``1 - t``.

    Source: the closed-form optimal velocity of a finite training set (e.g. the "MMSE" denoiser of
    deepinv, Karras et al. 2022's ideal denoiser); the empirical-prior check of
    ``../shared/notes/rebridge-reproduction.md``.
    """

    def __init__(self, images: torch.Tensor, eps: float = 1e-6):
        if not torch.is_tensor(images) or images.dim() != 4 or images.shape[0] < 1:
            raise PriorError(f"EmpiricalPrior: images must be a tensor (N, C, H, W) with N >= 1, got {getattr(images, 'shape', type(images))}")
        super().__init__(images.shape[1:])
        self.images = images.detach().to("cpu", torch.float64)
        self.eps = float(eps)
        self._dev: dict = {}

    def _on(self, device):
        dt = compute_dtype(device)
        key = (device, dt)
        if key not in self._dev:
            X = self.images.flatten(1).to(device, dt)
            self._dev[key] = (X, (X**2).sum(1))
        return self._dev[key]

    def _weights(self, x, t):
        X, sq = self._on(x.device)
        xf = x.flatten(1).to(X.dtype)
        tt = t.to(X.dtype)[:, None]
        s = (1 - tt).clamp_min(self.eps)
        logits = (tt * (xf @ X.T) - 0.5 * tt**2 * sq[None, :]) / s**2  # -||x - t x_i||^2/(2 s^2) + const(x)
        return torch.softmax(logits, dim=1), X

    def posterior_weights(self, x: torch.Tensor, t) -> torch.Tensor:
        """The softmax weights ``w_i(x, t)``, shape (B, N) (for analysis; not counted as an NFE)."""
        tt = self._prepare(x, t, "posterior_weights")
        return self._weights(x, tt)[0].to(x.dtype)

    def _clean_estimate(self, x, t):
        w, X = self._weights(x, t)
        return (w @ X).reshape(x.shape).to(x.dtype)

    def _velocity(self, x, t):
        s = bcast((1 - t).clamp_min(self.eps), x.dim())
        return (self._clean_estimate(x, t) - x) / s

    def posterior_mean(self, y: torch.Tensor, operator) -> torch.Tensor:
        """Exact ``E[x1 | y]`` for ``y = H x1 + sigma_y n``: weights ``∝ exp(-||y - H x^(i)||^2 / (2 sigma_y^2))``
        over the set (for ``sigma_y = 0``, uniform over the images that match ``y`` best). No NFE."""
        check_batch(y, operator.measurement_shape, "EmpiricalPrior.posterior_mean", "y", PriorError)
        if tuple(operator.shape) != self.shape:
            raise PriorError(f"EmpiricalPrior: operator acts on images {tuple(operator.shape)}, the prior on {self.shape}")
        X = self.images.to(y.device, compute_dtype(y.device))
        HX = operator.H(X).flatten(1)
        yf = y.detach().to(X.dtype).flatten(1)
        d2 = torch.cdist(yf, HX) ** 2
        s2 = operator.sigma_y**2
        if s2 > 0:
            w = torch.softmax(-d2 / (2 * s2), dim=1)
        else:
            w = (d2 <= d2.min(1, keepdim=True).values * (1 + 1e-9) + 1e-12).to(X.dtype)
            w = w / w.sum(1, keepdim=True)
        return (w @ X.flatten(1)).reshape(y.shape[0], *self.shape).to(y.dtype)

    def __repr__(self) -> str:
        return f"EmpiricalPrior(n_images={self.images.shape[0]}, shape={self.shape}, nfe={self.nfe})"


class LearnedPrior(FlowPrior):
    """A learned velocity network ``v_theta(x, t)`` wrapped as a :class:`FlowPrior`.

    Parameters
    ----------
    net : nn.Module
        Called as ``net(x, t * time_scale)`` with ``x`` (B, C, H, W) and a (B,) time tensor; may return
        a tensor or an object with a ``.sample`` tensor (diffusers ``UNet2DModel`` returns
        ``UNet2DOutput``; pass ``time_scale=1000`` for its sinusoidal embedding).
    shape : (C, H, W)
    time_scale : float
        Multiplies ``t`` before the call (the network's time convention must already be 0 = noise,
        1 = clean: convert diffusers' sigma-schedulers at one place, outside).

    The network runs in the input's dtype on the input's device; no ``torch.no_grad`` is imposed,
    so gradient-based methods (OT-ODE, D-Flow) can backpropagate. The lab's trained UNet priors load
    with :meth:`from_registry` (``lab.generative.learned``; trained by ``lab.generative.train_prior``).
    Source: flow matching, Lipman et al., ICLR 2023.
    """

    def __init__(self, net: nn.Module, shape, time_scale: float = 1.0):
        super().__init__(shape)
        if not callable(net):
            raise PriorError(f"LearnedPrior: net must be a callable nn.Module, got {type(net).__name__}")
        self.net, self.time_scale = net, float(time_scale)

    @classmethod
    def from_registry(cls, name: str, device=None, dtype: torch.dtype = torch.float32) -> "LearnedPrior":
        """A shipped prior (``"mnist"``, ``"natural32"``, ``"medical32"``), its weights verified through
        the data registry: see :func:`lab.generative.learned.load_learned_prior`."""
        from lab.generative.learned import load_learned_prior

        return load_learned_prior(name, device=device, dtype=dtype)

    def _velocity(self, x, t):
        out = self.net(x, t * self.time_scale)
        out = getattr(out, "sample", out)
        if not torch.is_tensor(out) or out.shape != x.shape:
            raise PriorError(f"LearnedPrior: the network returned {getattr(out, 'shape', type(out))}, expected {tuple(x.shape)}")
        return out

    def __repr__(self) -> str:
        return f"LearnedPrior({type(self.net).__name__}, shape={self.shape}, time_scale={self.time_scale}, nfe={self.nfe})"
