"""The gradient noise scale, and how much a gradient codec adds to the noise that minibatch sampling already puts
in every step.

Source: McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (arXiv 1812.06162):
the *simple noise scale* ``B_simple = tr(Sigma) / |G|^2`` (Sec. 2.2, Eq. 2.8), with ``G`` the true gradient and
``Sigma`` the per-example gradient covariance; a minibatch gradient of ``B`` examples has
``E|g_B - G|^2 = tr(Sigma) / B``. Here ``K`` gradients of batches of ``B`` examples taken at the same weights
give the unbiased estimates (their App. A.1 in the form of a sample variance)

    tr(Sigma) / B  ~  1/(K-1) sum_i |g_i - g_bar|^2                 (sampling_var)
    |G|^2          ~  |g_bar|^2 - sampling_var / K                   (grad_sq)

A codec ``Q`` with relative error ``e^2 = E|Q(g_B) - g_B|^2 / E|g_B|^2`` adds (for an error independent of the
sampling noise, as rounding is) the variance ``codec_var = e^2 E|g_B|^2``. Its ratio to the sampling variance is

    rho(B) = codec_var / sampling_var = e^2 (1 + B / B_simple)                              (1)

(the ratio does not depend on the number of data-parallel ranks: both variances of the ranks' mean shrink by
``1 / W``). The noisier gradient is as noisy as a clean one of ``B / (1 + rho)`` examples, and the codec's noise
equals the sampling noise (``rho = 1``) at

    B* = B_simple (1 / e^2 - 1)                                                             (2)

(Eq. 2 extrapolates the ``e^2`` measured at ``B``; for block-scaled formats ``e`` barely depends on the batch).

What the added variance costs in steps follows from the same paper's model of one SGD step (Sec. 2.1, Eqs.
2.4-2.7, with its simplification of Eq. 2.8, a Hessian proportional to the identity): at the best learning
rate a step lowers the loss by ``|G|^2 / (2 h (1 + B_simple / B))``. The codec's variance enters the
denominator beside the sampling variance, ``1 + (tr(Sigma)/B + e^2 (|G|^2 + tr(Sigma)/B)) / |G|^2
= (1 + e^2)(1 + B_simple / B)``, so the best step's progress shrinks by

    steps_factor = 1 + e^2                                                                  (3)

at every batch size: a codec whose error is proportional to the gradient and averages out (unbiased rounding
noise) costs at most a share ``e^2`` of the steps, however large ``rho`` grows. A format hurts only where
``e`` nears 1 or its error does not average out (a bias, carried from step to step, which neither ``rho`` nor
Eq. 3 sees), or where the model's assumptions fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lab.training.errors import DataConfigError

__all__ = ["CodecNoise", "NoiseScale", "codec_noise", "noise_scale"]


@dataclass(frozen=True)
class NoiseScale:
    """Estimates from ``n_batches`` minibatch gradients of ``batch_size`` examples at one point of training.

    Attributes
    ----------
    batch_size : int
        ``B``, examples per gradient (sequences, for a language model).
    n_batches : int
        ``K``.
    sampling_var : float
        ``tr(Sigma) / B``: the expected squared distance of one minibatch gradient to the true gradient.
    grad_sq : float
        ``|G|^2``, unbiased (may come out <= 0 when the noise swamps the signal; then ``b_simple`` is inf).
    trace_sigma : float
        ``tr(Sigma)`` per example (``sampling_var * B``).
    b_simple : float
        ``tr(Sigma) / |G|^2`` in examples (McCandlish et al. 2018, Eq. 2.8); ``inf`` where ``grad_sq <= 0``.
    minibatch_sq : float
        ``mean_i |g_i|^2``, the squared norm of one minibatch gradient.
    """

    batch_size: int
    n_batches: int
    sampling_var: float
    grad_sq: float
    trace_sigma: float
    b_simple: float
    minibatch_sq: float


@dataclass(frozen=True)
class CodecNoise:
    """What one codec adds to ``K`` minibatch gradients (see the module docstring, Eqs. 1-2).

    Attributes
    ----------
    rel_error : float
        ``e = sqrt(sum_i |Q(g_i) - g_i|^2 / sum_i |g_i|^2)``.
    codec_var : float
        ``mean_i |Q(g_i) - g_i|^2``.
    ratio_to_sampling : float
        ``rho = codec_var / sampling_var`` measured at ``B`` (with these estimators exactly Eq. 1's
        ``e^2 (1 + B / B_simple)``, since ``mean_i |g_i|^2 = grad_sq + sampling_var``).
    effective_batch_fraction : float
        ``1 / (1 + rho)``: the clean batch, as a share of ``B``, that is as noisy as the coded one.
    batch_where_equal : float
        ``B*`` of Eq. 2, in examples (``inf`` where ``b_simple`` is).
    steps_factor : float
        ``1 + e^2`` of Eq. 3: the steps the codec's noise costs, as a factor, in the noise-scale model.
    """

    rel_error: float
    codec_var: float
    ratio_to_sampling: float
    effective_batch_fraction: float
    batch_where_equal: float
    steps_factor: float


def _flat(g: Tensor | dict[str, Tensor]) -> Tensor:
    if isinstance(g, dict):
        return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in g.values()])
    return g.detach().reshape(-1).to(torch.float64)


def noise_scale(grads: Sequence[Tensor | dict[str, Tensor]], batch_size: int) -> NoiseScale:
    """The noise scale from ``K = len(grads)`` minibatch gradients at the same weights.

    Parameters
    ----------
    grads : sequence of Tensor or dict of name -> Tensor
        Each the mean gradient over ``batch_size`` examples drawn independently (float of any shape; a dict is
        one model's per-parameter gradients, flattened in its order). All the same size.
    batch_size : int
        ``B`` >= 1.

    Raises
    ------
    DataConfigError
        Fewer than 2 gradients, ``batch_size < 1``, gradients of different sizes, or a non-finite value.
    """
    if int(batch_size) < 1:
        raise DataConfigError(f"batch_size must be >= 1, got {batch_size}")
    if len(grads) < 2:
        raise DataConfigError(f"the noise scale needs >= 2 minibatch gradients, got {len(grads)}")
    flat = [_flat(g) for g in grads]
    sizes = {f.numel() for f in flat}
    if len(sizes) != 1:
        raise DataConfigError(f"minibatch gradients of different sizes: {sorted(sizes)}")
    g = torch.stack(flat)
    if not bool(torch.isfinite(g).all()):
        bad = int((~torch.isfinite(g)).any(dim=1).nonzero()[0])
        raise DataConfigError(f"minibatch gradient {bad} has a non-finite value")
    k, b = g.shape[0], int(batch_size)
    mean = g.mean(dim=0)
    sampling_var = float(((g - mean) ** 2).sum() / (k - 1))
    grad_sq = float((mean**2).sum()) - sampling_var / k
    trace_sigma = sampling_var * b
    return NoiseScale(batch_size=b, n_batches=k, sampling_var=sampling_var, grad_sq=grad_sq, trace_sigma=trace_sigma,
                      b_simple=trace_sigma / grad_sq if grad_sq > 0 else float("inf"),
                      minibatch_sq=float((g**2).sum(dim=1).mean()))


def codec_noise(grads: Sequence[Tensor | dict[str, Tensor]], roundtrip: Callable, scale: NoiseScale) -> CodecNoise:
    """What the codec ``roundtrip`` adds to the minibatch gradients ``grads`` whose :func:`noise_scale` is ``scale``.

    Parameters
    ----------
    grads : as :func:`noise_scale` (the same list)
    roundtrip : callable
        ``Q``: takes one element of ``grads`` and returns its decoded copy (the same type and shapes); a dict is
        coded tensor by tensor, as a DDP hook sends parameter by parameter.
    scale : NoiseScale

    Raises
    ------
    DataConfigError
        ``grads`` is not the list ``scale`` came from (its length differs), or ``Q`` changed a size.
    """
    if len(grads) != scale.n_batches:
        raise DataConfigError(f"{len(grads)} gradients, but the noise scale came from {scale.n_batches}")
    err = total = 0.0
    for i, g in enumerate(grads):
        a, q = _flat(g), _flat(roundtrip(g))
        if q.numel() != a.numel():
            raise DataConfigError(f"the codec changed gradient {i}'s size from {a.numel()} to {q.numel()}")
        err += float(((q - a) ** 2).sum())
        total += float((a**2).sum())
    codec_var = err / len(grads)
    e2 = err / total if total > 0 else 0.0
    rho = codec_var / scale.sampling_var if scale.sampling_var > 0 else float("inf")
    return CodecNoise(rel_error=e2**0.5, codec_var=codec_var, ratio_to_sampling=rho,
                      effective_batch_fraction=1 / (1 + rho),
                      batch_where_equal=scale.b_simple * (1 / e2 - 1) if e2 > 0 else float("inf"), steps_factor=1 + e2)
