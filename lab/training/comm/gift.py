"""GIFT: geometry-informed low-precision gradient communication (the transform, its statistics, layer selection).

Source: Wang, Fan, Zheng, Zhang, "GIFT: Geometry-Informed Low-precision Gradient Communication for LLM
Pretraining", arXiv 2607.07494 (SC26), as summarised in ``../shared/notes/papers-gift.md`` (the paper's
equation numbers below follow that note) and the official artifact ``GIFT-pretraining``
(``GIFT/megatron/core/optimizer/fisher_manager.py``). Small-scale findings that changed the design are in
``../shared/notes/comm-check.md``.

The idea
--------
A linear layer's weight gradient ``G`` (shape ``(out, in)``) is quantized for the data-parallel collective
in coordinates set by the input-side K-FAC factor ``A = E[x x^T]`` of the layer's inputs ``x``
(``(in, in)``, paper Eq. 4/6, input-side form Eq. 18-20), instead of the raw (Euclidean) coordinates:

    U = G A^{-1/2}             (whiten; quantize U with error feedback in these coordinates)
    G_hat = mean_r(Q(U_r)) A^{1/2}   (map back after the collective; the optimizer sees Euclidean grads)

This module uses the SYMMETRIC square root ``A^{-1/2}`` / ``A^{1/2}``. The paper writes the transform with
a Cholesky factor (``W L_A^{-T}``, Eq. 18) and the artifact uses a triangular solve, but the check in
``comm-check.md`` found both Cholesky forms (``G L`` and ``G L^{-T}``) 20x worse or no better than plain
FP8 on a real char-GPT (A's condition number 1e5-1e6); only the symmetric form helped.

Low-rank + scalar residual (the exact formula)
----------------------------------------------
``A`` is damped, ``A_d = A + damping * mean(diag A) * I`` (damping default 1e-3, the artifact's value),
and eigendecomposed, ``A_d = V diag(l) V^T`` with ``l_1 >= ... >= l_d > 0``. Keeping the top ``r``
eigenpairs ``(U = V[:, :r], lam = l[:r])`` and replacing the rest by their mean ``c = mean(l_{r+1..d})``
(an isotropic residual on the orthogonal complement of ``U``):

    A_d     ~= U diag(lam) U^T + c (I - U U^T)
    A_d^p   ~= U diag(lam^p - c^p) U^T + c^p I        (any real p; here p = -1/2 and +1/2)

Both powers share one eigenbasis, so the approximate ``A^{-1/2}`` and ``A^{1/2}`` are exact inverses of
each other for every ``r`` (communicating in fp32 through GIFT gives back the gradient up to rounding),
the approximation is exact for ``r >= d``, and applying it costs ``O(out * in * r)``:
``G A^p = c^p G + ((G U) * (lam^p - c^p)) U^T``. ``residual="diag"`` is the artifact's variant instead:
``A_hat = U diag(lam) U^T + diag(max(diag(A_d - U diag(lam) U^T), floor))``, then exact powers of
``A_hat`` by a full eigendecomposition (dense ``(in, in)`` transforms).

The paper keeps ``r = 32`` (Table II, "not a model-independent constant"), tracks ``A`` by EMA 0.95 and
refreshes every 50 steps (artifact). This module's :class:`CovarianceTracker` collects ``x x^T`` by
forward hooks; the hook state (:class:`lab.training.comm.hooks.GiftHookState`) all-reduces it across
data-parallel ranks (artifact behaviour, not in the paper text), applies the EMA and builds a
:class:`Whitening` per layer.

When whitening helps (measured, see the tests)
----------------------------------------------
FP8 is a floating-point format: with a per-tensor scale every normal value keeps ~2^-(m+1) relative
precision, so Euclidean FP8's error is fixed by the format (e4m3 ~2.7%, e5m2 ~5.3%). Whitening lowers the
error in ORIGINAL coordinates only when the whitened gradient ``U = G A^{-1/2}`` still concentrates its
energy on the large-eigenvalue directions of ``A``: the rounding error is spread isotropically in ``U``
and ``A^{1/2}`` shrinks the part of it that lands on small-eigenvalue directions. For ``G = Z A^{1/2}``
with i.i.d. Gaussian ``Z`` (rows of ``G`` distributed exactly like ``A``) the whitened ``U = Z`` is
isotropic and the gain is 1.0x whatever the condition number; for a gradient whose row space is the
span of fewer inputs than ``in`` (``G = delta^T X``, ``n < in``, whitened with the same inputs'
covariance) or whose rows are more concentrated than ``A`` (``G = Z A^{(1+a)/2}``) it is 1.6-2.8x.

Embeddings (an extension beyond the paper)
------------------------------------------
An ``nn.Embedding`` is a linear layer on one-hot inputs: its input-side factor is diagonal (token
frequencies), and a diagonal scaling cannot change a per-element float format's relative error. Early in
training the embeddings carry a large share of the gradient (on the benchmark's 4-layer char-GPT, 15-20% of
the FP8 error at step 50), so they take the other Kronecker factor: the covariance ``S = E[dy dy^T]``
(``(d, d)``) of the gradient ``dy`` of the embedding's output, and ``U = G S^{-1/2}``, mapped back with
``S^{1/2}`` (the same right-hand orientation as a linear layer's ``G A^{-1/2}``, with ``d`` columns).
:class:`CovarianceTracker` collects ``dy^T dy`` in the backward (``output_gradients``). For the GPT both
embeddings are summed into the residual stream, so both use the stream's gradient (the position
embedding's own output gradient is a batch sum, a poorer estimate: in a one-off probe at steps 50 and
100, 1.30x / 1.60x for the position embedding against 1.79x / 1.83x with the stream's).

The output side (the paper's full form, which it dropped)
--------------------------------------------------------
The paper derives two-sided coordinates ``B^{-1/2} G A^{-1/2}`` from both K-FAC factors (Eq. 14-17; ``B``
its ``G``, the covariance of the layer's output gradients ``dy``, ``(out, out)``) and keeps only the input
side because its Table I measured no gain from the output side on a 600M model. On the benchmark's
4-layer char-GPT the output side does matter: in a one-off probe (seed 0, damping 1.0, rank 32, factors
refreshed every 10 steps with EMA 0.5) the Linear layers' FP8 error fell 1.6x / 2.4x / 2.4x below
Euclidean with ``A`` alone at steps 1 / 100 / 200 and 4.2x / 2.8x / 2.5x with both factors (per layer up
to 11x; the head, whose output side is the 85-token vocabulary, gains nothing). :class:`KroneckerWhitening`
applies both factors; the hook collects ``dy^T dy`` in the backward (:class:`CovarianceTracker`
``output_gradients``) and refreshes ``B`` just before the layer's bucket is encoded, when the step's own
backward is complete.

Biases (an extension beyond the paper)
--------------------------------------
A bias is the weight of a constant input 1: K-FAC's homogeneous coordinate whitens ``[G | b]``
(``(out, in + 1)``) with the covariance of ``[x; 1]``, ``[[E x x^T, E x], [E x^T, 1]]``
(:class:`CovarianceTracker` ``homogeneous``). At initialisation the residual projections' biases carry
about half the gradient (their outputs feed the residual stream directly), and sent Euclidean they capped
the whole-model gain at 1.29x at step 1 on the benchmark's char-GPT; whitened with their weights, 1.61x.
LayerNorm parameters stay Euclidean (about 1% of the FP8 error).

Layer selection (paper Fig. 3)
------------------------------
:class:`LayerSelector` scores each candidate layer over a window of steps and picks the top ``k``
(or those above a threshold): ``"saturation"`` (the paper: mean fraction of Euclidean FP8 codes at the
format's upper bound plus the fraction of non-zero values flushed to zero, the lower bound), ``"error"``
(mean Euclidean relative error) or ``"gain"`` (Euclidean error / GIFT error, both measured locally).
The hook state re-selects every ``M`` steps from all-reduced window sums, so every rank decides the same.

Errors: :class:`~lab.training.errors.GiftError` (a ``ValueError``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from torch import Tensor, nn

from lab.training.comm.codecs import Codec, FP8Codec, NVFP4Codec
from lab.training.errors import GiftError

__all__ = [
    "RESIDUALS",
    "SELECT_BY",
    "EMA_PER",
    "CovarianceEMA",
    "CovarianceTracker",
    "GiftConfig",
    "KroneckerWhitening",
    "LayerSelector",
    "RefreshSchedule",
    "Whitening",
    "BudgetCandidate",
    "budget_selection",
    "factor_floats",
    "side_bytes_per_refresh",
    "euclidean_roundtrip",
    "gift_roundtrip",
    "relative_error",
    "saturation_rates",
]

#: Residual models of the discarded eigenvalues (see the module docstring).
RESIDUALS = ("scalar", "diag")
#: Eigensolvers of :meth:`Whitening.from_covariance`: the full ``eigh``, or subspace iteration for the top ``r``.
EIGENSOLVERS = ("eigh", "subspace")
#: Layer-selection scores of :class:`LayerSelector`.
SELECT_BY = ("saturation", "error", "gain")


# -- the transform ---------------------------------------------------------------------------------


class Whitening:
    """Approximate powers ``A_d^p`` of a damped input covariance, low-rank + scalar residual.

    ``A_d^p ~= U diag(lam^p - c^p) U^T + c^p I`` with ``U`` of shape ``(d, k)`` (orthonormal columns,
    eigenvalues descending), ``lam`` of shape ``(k,)`` and ``c`` the mean discarded eigenvalue
    (``k == d``: exact, ``c`` unused). Built by :meth:`from_covariance`; everything is derived from the
    float32 factors, so ranks holding the same factors (e.g. after :meth:`from_flat` of a broadcast)
    apply bit-identical transforms on identical kernels.

    Parameters
    ----------
    basis : Tensor
        ``(d, k)`` float32, ``0 <= k <= d``.
    eigenvalues : Tensor
        ``(k,)`` float32, positive.
    residual : float
        ``c > 0``, the eigenvalue given to the orthogonal complement of ``basis`` (ignored when ``k == d``).

    Raises
    ------
    GiftError
        Shapes that do not match, non-positive or non-finite eigenvalues / residual.
    """

    __slots__ = ("basis", "eigenvalues", "residual", "dim", "_dense")

    def __init__(self, basis: Tensor, eigenvalues: Tensor, residual: float):
        if basis.dim() != 2 or eigenvalues.dim() != 1 or basis.shape[1] != eigenvalues.shape[0] or basis.shape[1] > basis.shape[0]:
            raise GiftError(f"Whitening: basis (d, k) and eigenvalues (k,) with k <= d expected, got "
                            f"{tuple(basis.shape)} and {tuple(eigenvalues.shape)}")
        residual = float(residual)
        if not (math.isfinite(residual) and residual > 0):
            raise GiftError(f"Whitening: residual eigenvalue must be finite and > 0, got {residual}")
        if eigenvalues.numel() and not bool(torch.isfinite(eigenvalues).all() and (eigenvalues > 0).all()):
            raise GiftError("Whitening: eigenvalues must be finite and > 0")
        self.basis = basis.detach().to(torch.float32).contiguous()
        self.eigenvalues = eigenvalues.detach().to(torch.float32).contiguous()
        self.residual = float(torch.tensor(residual, dtype=torch.float32))
        self.dim = int(basis.shape[0])
        self._dense: dict[float, Tensor] = {}

    # construction -----------------------------------------------------------------------------

    @classmethod
    def identity(cls, dim: int, device: torch.device | str | None = None) -> Whitening:
        """The identity transform (``k = 0``, ``c = 1``): GIFT degenerates to Euclidean quantization."""
        return cls(torch.zeros(dim, 0, device=device), torch.zeros(0, device=device), 1.0)

    @classmethod
    def from_covariance(cls, cov: Tensor, rank: int = 32, damping: float = 1e-3, residual: str = "scalar", *,
                        eigensolver: str = "eigh", init: Tensor | None = None, iters: int = 4,
                        oversample: int = 8) -> Whitening:
        """Damp, eigendecompose (float64) and truncate an input covariance.

        Parameters
        ----------
        cov : Tensor
            ``(d, d)`` symmetric positive semi-definite (symmetrised here), any float dtype.
        rank : int
            ``r >= 1``: eigenpairs kept (paper: 32). ``r >= d`` gives the exact powers.
        damping : float
            ``>= 0``; ``A_d = A + damping * mean(diag A) * I`` (artifact: 1e-3). Eigenvalues are floored
            at ``max(damping * mean(diag A), 1e-12 * l_max)``.
        residual : {"scalar", "diag"}
            ``"scalar"``: discarded eigenvalues replaced by their mean ``c`` (module docstring).
            ``"diag"``: the artifact's low-rank + diagonal ``A_hat``, then its exact powers.
        eigensolver : {"eigh", "subspace"}
            ``"eigh"``: every eigenpair of ``A_d`` (``O(d^3)``). ``"subspace"``: only the top ``r``, by
            randomized subspace iteration (Halko, Martinsson, Tropp, SIAM Review 53(2), 2011, Alg. 4.4:
            ``Q = qr(A_d Omega)``, then ``iters`` times ``Q = qr(A_d Q)``, then Rayleigh-Ritz on
            ``Q^T A_d Q``) with ``r + oversample`` columns, ``O(d^2 (r + p) iters)``; the residual
            ``c = (tr A_d - sum_i lam_i) / (d - r)`` is the mean of the discarded eigenvalues, as with
            ``eigh``. It falls back to ``eigh`` for ``residual="diag"`` or when ``r + oversample >= d / 2``
            (no saving). Deterministic: ``Omega`` comes from a generator seeded with 0, so every rank
            building from the same covariance gets the same factors.
        init : Tensor, optional
            ``(d, j)``: a warm start for ``"subspace"`` (e.g. the previous refresh's :attr:`basis`), which
            takes the first ``min(j, r + oversample)`` columns of ``Omega``; ignored by ``"eigh"``.
        iters : int
            ``>= 0``: power iterations of ``"subspace"``.
        oversample : int
            ``>= 0``: extra columns of ``"subspace"``.

        Returns
        -------
        Whitening
            The identity when ``A`` is all zeros (no inputs seen).

        Raises
        ------
        GiftError
            ``cov`` not square 2-D or not finite; bad ``rank``, ``damping``, ``residual``, ``eigensolver``,
            ``iters``, ``oversample`` or an ``init`` of another dimension.
        """
        return cls.from_covariance_ranks(cov, (rank,), damping, residual, eigensolver=eigensolver, init=init,
                                         iters=iters, oversample=oversample)[rank]

    @classmethod
    def from_covariance_ranks(cls, cov: Tensor, ranks: Iterable[int], damping: float = 1e-3,
                              residual: str = "scalar", *, eigensolver: str = "eigh", init: Tensor | None = None,
                              iters: int = 4, oversample: int = 8) -> dict[int, Whitening]:
        """:meth:`from_covariance` for several ranks from one eigendecomposition (same results bit for bit;
        with ``"subspace"`` one subspace of ``max(ranks) + oversample`` columns serves every rank).

        Raises
        ------
        GiftError
            As :meth:`from_covariance`.
        """
        ranks = tuple(ranks)
        if not isinstance(cov, Tensor) or cov.dim() != 2 or cov.shape[0] != cov.shape[1] or cov.shape[0] == 0:
            raise GiftError(f"covariance must be a square (d, d) tensor with d >= 1, got {getattr(cov, 'shape', type(cov))}")
        for r in ranks:
            _check_rank(r)
        if not (isinstance(damping, (int, float)) and math.isfinite(damping) and damping >= 0):
            raise GiftError(f"damping must be a finite float >= 0, got {damping!r}")
        if residual not in RESIDUALS:
            raise GiftError(f"residual must be one of {RESIDUALS}, got {residual!r}")
        if eigensolver not in EIGENSOLVERS:
            raise GiftError(f"eigensolver must be one of {EIGENSOLVERS}, got {eigensolver!r}")
        for what, v in (("iters", iters), ("oversample", oversample)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise GiftError(f"{what} must be an int >= 0, got {v!r}")
        if init is not None and (not isinstance(init, Tensor) or init.dim() != 2 or init.shape[0] != cov.shape[0]):
            raise GiftError(f"init must be a ({cov.shape[0]}, j) basis, got {getattr(init, 'shape', type(init))}")
        a = cov.detach().to(torch.float64)
        if not bool(torch.isfinite(a).all()):
            raise GiftError("covariance has non-finite entries")
        d = a.shape[0]
        a = 0.5 * (a + a.T)
        mean_diag = float(a.diagonal().mean())
        if mean_diag <= 0.0:
            return {r: cls.identity(d, device=cov.device) for r in ranks}
        delta = damping * mean_diag
        a = a + delta * torch.eye(d, dtype=torch.float64, device=a.device)
        m = max(ranks) + oversample
        if eigensolver == "subspace" and residual == "scalar" and 2 * m < d:
            return cls._top_eigenpairs(a, ranks, m, delta, init, iters)
        lam0, vec0 = torch.linalg.eigh(a)
        lam0, vec0 = lam0.flip(0), vec0.flip(1)
        floor = max(delta, 1e-12 * float(lam0[0].clamp_min(0)), 1e-300)
        lam0 = lam0.clamp_min(floor)
        out = {}
        for rank in ranks:
            lam, vec = lam0, vec0
            k = min(rank, d)
            if residual == "diag" and k < d:
                low = (vec[:, :k] * lam[:k]) @ vec[:, :k].T
                diag = (a.diagonal() - low.diagonal()).clamp_min(floor)
                lam, vec = torch.linalg.eigh(low + torch.diag(diag))
                lam, vec = lam.flip(0).clamp_min(floor), vec.flip(1)
                k = d
            c = float(lam[k:].mean()) if k < d else 1.0
            out[rank] = cls(vec[:, :k], lam[:k], c)
        return out

    @classmethod
    def _top_eigenpairs(cls, a: Tensor, ranks: tuple[int, ...], m: int, delta: float, init: Tensor | None,
                        iters: int) -> dict[int, Whitening]:
        """Randomized subspace iteration on the damped float64 ``a`` (``(d, d)``, ``m < d / 2`` columns)."""
        d = a.shape[0]
        gen = torch.Generator(device="cpu").manual_seed(0)
        omega = torch.randn(d, m, dtype=torch.float64, generator=gen).to(a.device)
        if init is not None and init.shape[1]:
            j = min(init.shape[1], m)
            omega[:, :j] = init[:, :j].to(torch.float64)
        q = torch.linalg.qr(a @ omega).Q
        for _ in range(iters):
            q = torch.linalg.qr(a @ q).Q
        lam_q, vec_q = torch.linalg.eigh(q.T @ a @ q)  # Rayleigh-Ritz
        lam0, vec0 = lam_q.flip(0), q @ vec_q.flip(1)
        floor = max(delta, 1e-12 * float(lam0[0].clamp_min(0)), 1e-300)
        lam0 = lam0.clamp_min(floor)
        trace = float(a.diagonal().sum())
        out = {}
        for rank in ranks:
            k = min(rank, m)
            c = max((trace - float(lam0[:k].sum())) / (d - k), floor)
            out[rank] = cls(vec0[:, :k], lam0[:k], c)
        return out

    @classmethod
    def from_flat(cls, flat: Tensor, dim: int, k: int) -> Whitening:
        """Inverse of :meth:`to_flat` (``dim * k + k + 1`` float32 values)."""
        if flat.numel() != dim * k + k + 1:
            raise GiftError(f"flat whitening of dim {dim}, rank {k} needs {dim * k + k + 1} values, got {flat.numel()}")
        flat = flat.to(torch.float32)
        return cls(flat[: dim * k].view(dim, k), flat[dim * k : dim * k + k], float(flat[-1]))

    def to_flat(self) -> Tensor:
        """The factors as one float32 vector ``[basis (row-major), eigenvalues, c]`` of ``d k + k + 1`` values."""
        c = torch.tensor([self.residual], dtype=torch.float32, device=self.basis.device)
        return torch.cat([self.basis.reshape(-1), self.eigenvalues, c])

    @property
    def rank(self) -> int:
        """``k``, the number of eigenpairs kept (``d`` when exact)."""
        return int(self.basis.shape[1])

    @property
    def flat_numel(self) -> int:
        """Length of :meth:`to_flat` (``d k + k + 1``)."""
        return self.dim * self.rank + self.rank + 1

    @property
    def condition_number(self) -> float:
        """Largest over smallest eigenvalue of the approximation (``lam_1 / min(lam_k, c)``)."""
        if self.rank == 0:
            return 1.0
        lo = float(self.eigenvalues[-1]) if self.rank == self.dim else min(float(self.eigenvalues[-1]), self.residual)
        return float(self.eigenvalues[0]) / lo

    # application -------------------------------------------------------------------------------

    def matrix(self, p: float) -> Tensor:
        """The dense ``(d, d)`` float64 matrix ``U diag(lam^p - c^p) U^T + c^p I`` (``U diag(lam^p) U^T`` if exact)."""
        u = self.basis.to(torch.float64)
        lam = self.eigenvalues.to(torch.float64)
        if self.rank == self.dim:
            return (u * lam.pow(p)) @ u.T
        cp = float(torch.tensor(self.residual, dtype=torch.float64).pow(p))
        out = (u * (lam.pow(p) - cp)) @ u.T
        out.diagonal().add_(cp)
        return out

    def apply(self, g: Tensor, p: float) -> Tensor:
        """``g @ A_d^p`` for ``g`` of shape ``(..., d)``; float32 result.

        Uses the dense ``(d, d)`` matrix (cached per ``p``) when ``k > d / 2``, else the low-rank form
        ``c^p g + ((g U) * (lam^p - c^p)) U^T`` (``O(numel * k)``).

        Raises
        ------
        GiftError
            ``g``'s last dimension is not ``d``.
        """
        if g.dim() == 0 or g.shape[-1] != self.dim:
            raise GiftError(f"whitening of dim {self.dim} applied to a tensor of shape {tuple(g.shape)}")
        g = g.to(torch.float32)
        if 2 * self.rank > self.dim:
            m = self._dense.get(p)
            if m is None or m.device != g.device:
                m = self.matrix(p).to(device=g.device, dtype=torch.float32)
                self._dense[p] = m
            return g @ m
        cp = float(torch.tensor(self.residual, dtype=torch.float64).pow(p))
        if self.rank == 0:
            return g * cp
        u = self.basis.to(g.device)
        coef = (self.eigenvalues.to(device=g.device, dtype=torch.float64).pow(p) - cp).to(torch.float32)
        return ((g @ u) * coef) @ u.T + cp * g

    def whiten(self, g: Tensor) -> Tensor:
        """``g A^{-1/2}`` (the communication coordinates)."""
        return self.apply(g, -0.5)

    def unwhiten(self, u: Tensor) -> Tensor:
        """``u A^{1/2}`` (back to Euclidean coordinates; exact inverse of :meth:`whiten` up to rounding)."""
        return self.apply(u, 0.5)


class KroneckerWhitening:
    """Both Kronecker factors: ``U = B^{-1/2} G A^{-1/2}``, mapped back with ``B^{1/2} U A^{1/2}``.

    The paper's full two-sided communication coordinates (Eq. 14-17, ``L_G^{-1} W_g L_A^{-T}``; here with
    symmetric roots, see the module docstring), where ``A`` (``(in, in)``, :attr:`input`) is the input
    covariance and ``B = E[dy dy^T]`` (``(out, out)``, :attr:`output`) the covariance of the gradient of
    the layer's output. The paper dropped the output side (its Table I: no gain at 600M); on the
    benchmark's char-GPT it cuts the per-layer FP8 error a further 1.2-3x (module docstring).

    Parameters
    ----------
    input : Whitening
        Right-hand factor, ``dim = in`` (``in + 1`` for a layer whitened with its bias).
    output : Whitening
        Left-hand factor, ``dim = out``.
    """

    __slots__ = ("input", "output")

    def __init__(self, input: Whitening, output: Whitening):
        if not isinstance(input, Whitening) or not isinstance(output, Whitening):
            raise GiftError("KroneckerWhitening needs two Whitening factors")
        self.input, self.output = input, output

    @property
    def dim(self) -> int:
        """The input side's ``d`` (columns of the whitened matrix)."""
        return self.input.dim

    @property
    def rank(self) -> int:
        return self.input.rank

    @property
    def condition_number(self) -> float:
        """``cond(A) cond(B)``, the condition number of ``A (x) B``."""
        return self.input.condition_number * self.output.condition_number

    def _left(self, g: Tensor, p: float) -> Tensor:
        if g.dim() != 2 or g.shape[0] != self.output.dim:
            raise GiftError(f"output-side whitening of dim {self.output.dim} applied to rows of a {tuple(g.shape)} tensor")
        return self.output.apply(g.T, p).T.contiguous()

    def whiten(self, g: Tensor) -> Tensor:
        """``B^{-1/2} g A^{-1/2}`` for ``g`` of shape ``(out, in)``; float32.

        Raises
        ------
        GiftError
            ``g`` is not ``(out, in)`` for these factors.
        """
        return self._left(self.input.whiten(g), -0.5)

    def unwhiten(self, u: Tensor) -> Tensor:
        """``B^{1/2} u A^{1/2}`` (exact inverse of :meth:`whiten` up to rounding)."""
        return self._left(self.input.unwhiten(u), 0.5)

    def rebase_output(self, r: Tensor, old: Whitening | None) -> Tensor:
        """``B_new^{-1/2} B_old^{1/2} r`` (``old`` None: the identity): a residual in whitened
        coordinates re-expressed after the output factor changed, keeping ``B^{1/2} r`` fixed."""
        back = r if old is None else old.apply(r.T, 0.5).T
        return self._left(back, -0.5)


def _check_rank(rank: object) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise GiftError(f"rank must be an int >= 1, got {rank!r}")
    return rank


# -- measuring -------------------------------------------------------------------------------------


def relative_error(approx: Tensor, ref: Tensor) -> float:
    """``||approx - ref||_2 / ||ref||_2`` (paper Eq. 21, RelL2) in float64; 0 if both are zero, inf if only ``ref`` is."""
    err = float(torch.linalg.vector_norm((approx.to(torch.float64) - ref.to(torch.float64)).reshape(-1)))
    den = float(torch.linalg.vector_norm(ref.to(torch.float64).reshape(-1)))
    if den == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / den


def euclidean_roundtrip(codec: Codec, g: Tensor) -> Tensor:
    """``decode(encode(g))`` reshaped like ``g`` (float32): the Euclidean one-step round trip."""
    return codec.decode(codec.encode(g), g.numel()).view(g.shape)


def gift_roundtrip(codec: Codec, g: Tensor, whitening: Whitening) -> Tensor:
    """``decode(encode(g A^{-1/2})) A^{1/2}`` (float32, shape of ``g``): GIFT's one-step round trip without error feedback."""
    u = whitening.whiten(g)
    return whitening.unwhiten(codec.decode(codec.encode(u), u.numel()).view(u.shape))


def saturation_rates(codec: Codec, payload: Tensor, x: Tensor) -> tuple[float, float]:
    """Fractions of the ``n`` encoded values at the format's upper and lower bound (paper Fig. 3).

    Upper: the code's magnitude is the format maximum (FP8: 448 / 57344 times the scale; NVFP4: 6 times
    the block scale), i.e. the value was at or rounded/clamped to the top of its scale group. Lower: a
    non-zero input value encoded as zero (flushed below the smallest subnormal of its scale group).

    Parameters
    ----------
    codec : Codec
        :class:`FP8Codec` or :class:`NVFP4Codec` (other codecs report ``(0.0, 0.0)``).
    payload : Tensor
        ``codec.encode(x)``, 1-D uint8.
    x : Tensor
        The encoded tensor (any shape, ``n`` elements).
    """
    n = x.numel()
    if n == 0:
        return 0.0, 0.0
    nonzero = x.reshape(-1) != 0
    if isinstance(codec, FP8Codec):
        ns = codec.num_scales(n)
        codes = payload[4 * ns :].view(codec.dtype).to(torch.float32)
        upper = int((codes.abs() == codec.fmt_max).sum())
        lower = int(((codes == 0) & nonzero).sum())
    elif isinstance(codec, NVFP4Codec):
        nb = codec.num_blocks(n)
        packed = payload[4 + nb :]
        mags = torch.stack([packed & 7, (packed >> 4) & 7], dim=1).reshape(-1)[:n]
        upper = int((mags == 7).sum())
        lower = int(((mags == 0) & nonzero).sum())
    else:
        return 0.0, 0.0
    return upper / n, lower / n


# -- input covariance ------------------------------------------------------------------------------


def _triu_pack(m: Tensor) -> Tensor:
    d = m.shape[0]
    iu = torch.triu_indices(d, d, device=m.device)
    return m[iu[0], iu[1]]


def _triu_unpack(v: Tensor, d: int) -> Tensor:
    iu = torch.triu_indices(d, d, device=v.device)
    m = torch.zeros(d, d, dtype=v.dtype, device=v.device)
    m[iu[0], iu[1]] = v
    return m + m.T - torch.diag(m.diagonal())


class CovarianceTracker:
    """Sums ``x^T x`` and row counts of the inputs of named ``nn.Linear`` layers (forward hooks), and of
    the output gradients of named modules (the embeddings' factor, collected in backward).

    Only forwards of modules in training mode with autograd enabled count (evaluation passes under
    ``torch.no_grad()`` do not), and only when ``active(name)`` is true at the forward. An input (or
    output gradient) of shape ``(..., d)`` adds ``n = prod(...)`` rows. Sums are float32 on the
    module's device. An output gradient arrives during the backward, after the forward that asked for
    it: a :meth:`take` between a step's forward and its backward (where a DDP communication hook
    refreshes) holds that step's inputs but the output gradients of the steps before only.

    Parameters
    ----------
    layers : Mapping[str, Sequence[nn.Linear]]
        Layer name -> the ``nn.Linear`` modules whose inputs feed that layer's factor (several when a
        weight is shared); all must have the same ``in_features``.
    active : Callable[[str], bool]
        Asked at every forward whether this layer collects now.
    output_gradients : Mapping[str, tuple[nn.Module, int]], optional
        Factor name -> (module, d): the rows of the gradient of ``module``'s output, shape ``(..., d)``,
        feed the factor (for an ``nn.Embedding``, whose input-side factor is diagonal). Names sharing a
        module share one ``g^T g`` per backward.
    homogeneous : Iterable[str]
        Input-side layers whose inputs get a trailing constant 1 (K-FAC's homogeneous coordinate, for a
        weight whitened together with its bias): their factor is ``(in + 1, in + 1)``,
        ``[[E x x^T, E x], [E x^T, 1]]``, and :attr:`dims` says ``in + 1``.

    Raises
    ------
    GiftError
        Modules of one layer with different ``in_features``; a name in both mappings; a homogeneous
        name that is not an input-side layer.
    """

    def __init__(self, layers: Mapping[str, Sequence[nn.Linear]], active: Callable[[str], bool],
                 output_gradients: Mapping[str, tuple[nn.Module, int]] | None = None, homogeneous: Iterable[str] = ()):
        self.active = active
        self.dims: dict[str, int] = {}
        self.homogeneous = frozenset(homogeneous)
        self._sums: dict[str, Tensor] = {}
        self._counts: dict[str, int] = {}
        self._handles = []
        unknown = sorted(self.homogeneous - set(layers))
        if unknown:
            raise GiftError(f"homogeneous names {unknown} are not input-side layers")
        for name, mods in layers.items():
            dims = {m.in_features for m in mods}
            if len(dims) != 1:
                raise GiftError(f"layer {name!r}: modules sharing a weight have different in_features {sorted(dims)}")
            self.dims[name] = dims.pop() + (1 if name in self.homogeneous else 0)
            self._counts[name] = 0
            for m in mods:
                self._handles.append(m.register_forward_hook(self._make_hook(name)))
        by_module: dict[int, tuple[nn.Module, list[str]]] = {}
        for name, (mod, d) in (output_gradients or {}).items():
            if name in self.dims:
                raise GiftError(f"factor {name!r} named twice (an input-side layer and an output-gradient factor)")
            self.dims[name] = int(d)
            self._counts[name] = 0
            by_module.setdefault(id(mod), (mod, []))[1].append(name)
        for mod, names in by_module.values():
            self._handles.append(mod.register_forward_hook(self._make_grad_hook(tuple(names))))

    def _add(self, name: str, x: Tensor) -> None:
        d = self.dims[name]
        s = self._sums.get(name)
        if s is None or s.device != x.device:
            s = self._sums[name] = torch.zeros(d, d, dtype=torch.float32, device=x.device)
        s.addmm_(x.T, x)
        self._counts[name] += x.shape[0]

    def _make_hook(self, name: str):
        aug = name in self.homogeneous
        d = self.dims[name] - aug

        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            if not (module.training and torch.is_grad_enabled()) or not inputs or not self.active(name):
                return
            x = inputs[0].detach().reshape(-1, d).to(torch.float32)
            if aug:  # K-FAC's homogeneous coordinate: the bias is the weight of a constant input 1
                x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
            self._add(name, x)

        return hook

    def _make_grad_hook(self, names: tuple[str, ...]):
        d = self.dims[names[0]]

        def hook(module: nn.Module, inputs: tuple, output: object) -> None:
            if not (module.training and torch.is_grad_enabled()) or not isinstance(output, Tensor) or not output.requires_grad:
                return
            active = [n for n in names if self.active(n)]
            if not active:
                return

            def on_grad(g: Tensor) -> None:
                x = g.detach().reshape(-1, d).to(torch.float32)
                s = x.T @ x
                for n in active:
                    t = self._sums.get(n)
                    self._sums[n] = s.clone() if t is None or t.device != s.device else t.add_(s)
                    self._counts[n] += x.shape[0]

            output.register_hook(on_grad)

        return hook

    def count(self, name: str) -> int:
        """Rows collected for ``name`` since the last :meth:`take`."""
        return self._counts[name]

    def packed_numel(self, names: Iterable[str]) -> int:
        """Length of :meth:`take`'s vector: ``sum d (d + 1) / 2`` plus one count per layer."""
        names = list(names)
        return sum(self.dims[n] * (self.dims[n] + 1) // 2 for n in names) + len(names)

    def take(self, names: Sequence[str], device: torch.device | str = "cpu") -> Tensor:
        """Pack and reset: float32 ``[triu(S_1), ..., triu(S_L), n_1, ..., n_L]`` (upper triangles, row-major).

        Row counts travel as float32, exact up to 2**24 rows per layer between refreshes.
        """
        parts, counts = [], []
        for n in names:
            d = self.dims[n]
            s = self._sums.pop(n, None)
            parts.append(_triu_pack(s).to(device) if s is not None else torch.zeros(d * (d + 1) // 2, device=device))
            counts.append(float(self._counts[n]))
            self._counts[n] = 0
        return torch.cat(parts + [torch.tensor(counts, dtype=torch.float32, device=device)])

    def unpack(self, vec: Tensor, names: Sequence[str]) -> dict[str, tuple[Tensor, float]]:
        """Inverse of :meth:`take` (after an all-reduce): name -> (symmetric ``(d, d)`` sum, row count)."""
        out, pos = {}, 0
        counts = vec[-len(names):] if names else vec[:0]
        for i, n in enumerate(names):
            d = self.dims[n]
            m = d * (d + 1) // 2
            out[n] = (_triu_unpack(vec[pos : pos + m], d), float(counts[i]))
            pos += m
        if pos + len(names) != vec.numel():
            raise GiftError(f"covariance vector of {vec.numel()} values does not match layers {list(names)}")
        return out

    def close(self) -> None:
        """Remove the forward hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


# -- layer selection -------------------------------------------------------------------------------


class LayerSelector:
    """Scores candidate layers over a window of steps and selects the ones GIFT whitens.

    Window sums per layer (:attr:`FIELDS`): upper-bound hits, lower-bound hits, Euclidean relative
    error, number of Euclidean observations, GIFT relative error, number of GIFT observations. Scores:

    - ``"saturation"`` (paper Fig. 3): mean upper-hit rate + mean lower-hit rate of Euclidean FP8;
    - ``"error"``: mean Euclidean relative error;
    - ``"gain"``: mean Euclidean error / mean GIFT error (0 for layers without a GIFT observation).

    Layers with no observation in the window are never selected, and with ``"gain"`` neither are layers
    whose gain is ``<= 1`` (GIFT no better than Euclidean there), so top-``k`` may select fewer than ``k``. Selection takes the ``k`` best
    (``k`` an int, or a fraction of the candidates rounded up) or, with ``threshold``, every layer whose
    score is ``>= threshold``; ties go to the earlier candidate. Callers that need identical decisions on
    every rank pass the all-reduced :meth:`window_vector` to :meth:`select`.

    Parameters
    ----------
    names : Sequence[str]
        Candidate layer names, in a fixed order (the same on every rank).
    select_by : {"saturation", "error", "gain"}
    k : int or float
        Top-``k`` count (int >= 1) or fraction in (0, 1].
    threshold : float, optional
        Select by threshold instead of top-``k``.
    warmup : int or None
        First selection at this step (the window before it is the warm-up); None when an initial
        selection is given (``initial``).
    every : int or None
        Re-select every ``every`` steps after the first selection (step 0 when ``initial`` is given).
    initial : Sequence[str], optional
        Selection in force from step 0 (the paper's fixed set S).

    Raises
    ------
    GiftError
        Bad parameters or an ``initial`` name that is not a candidate.
    """

    FIELDS = ("upper", "lower", "euclid_err", "n_euclid", "gift_err", "n_gift")

    def __init__(self, names: Sequence[str], *, select_by: str = "saturation", k: int | float = 0.25,
                 threshold: float | None = None, warmup: int | None = 20, every: int | None = 100,
                 initial: Sequence[str] | None = None):
        self.names = tuple(names)
        if len(set(self.names)) != len(self.names):
            raise GiftError("candidate layer names must be unique")
        if select_by not in SELECT_BY:
            raise GiftError(f"select_by must be one of {SELECT_BY}, got {select_by!r}")
        if isinstance(k, bool) or not (isinstance(k, int) and k >= 1 or isinstance(k, float) and 0 < k <= 1):
            raise GiftError(f"select_k must be an int >= 1 or a fraction in (0, 1], got {k!r}")
        if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
            raise GiftError(f"select_threshold must be a finite number or None, got {threshold!r}")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise GiftError(f"reselect_every must be an int >= 1 or None, got {every!r}")
        if initial is None:
            if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
                raise GiftError(f"select_warmup must be an int >= 1 when no layers are given, got {warmup!r}")
            self.start, self.selected = warmup, ()
        else:
            unknown = [n for n in initial if n not in self.names]
            if unknown:
                raise GiftError(f"layers {unknown} are not candidate nn.Linear layers; candidates: {list(self.names)}")
            self.start, self.selected = None, tuple(n for n in self.names if n in set(initial))
        self.select_by, self.k, self.threshold, self.every = select_by, k, threshold, every
        self.window = torch.zeros(len(self.names), len(self.FIELDS), dtype=torch.float64)
        self._index = {n: i for i, n in enumerate(self.names)}
        #: One dict per selection: ``step``, ``selected`` (tuple), ``scores`` (name -> float), ``window`` (name -> dict of means).
        self.history: list[dict] = []

    @property
    def top_k(self) -> int:
        """The number of layers a top-``k`` selection takes."""
        return min(len(self.names), self.k if isinstance(self.k, int) else max(1, math.ceil(self.k * len(self.names))))

    def due(self, step: int) -> bool:
        """Whether a selection happens at the start of ``step``."""
        if self.start is not None and step == self.start:
            return True
        base = 0 if self.start is None else self.start
        return self.every is not None and step > base and (step - base) % self.every == 0

    def collecting(self, step: int) -> bool:
        """Whether observations at ``step`` can still feed a future selection."""
        return self.every is not None or (self.start is not None and step < self.start)

    def observe(self, name: str, *, upper: float | None = None, lower: float | None = None,
                euclid_err: float | None = None, gift_err: float | None = None) -> None:
        """Add one step's statistics of layer ``name`` to the window (None: not observed)."""
        row = self.window[self._index[name]]
        if euclid_err is not None and math.isfinite(euclid_err):
            row[0] += upper or 0.0
            row[1] += lower or 0.0
            row[2] += euclid_err
            row[3] += 1
        if gift_err is not None and math.isfinite(gift_err):
            row[4] += gift_err
            row[5] += 1

    def window_vector(self) -> Tensor:
        """The window sums as one float64 vector (``len(names) * 6``), e.g. to all-reduce."""
        return self.window.reshape(-1).clone()

    def scores(self, window: Tensor | None = None) -> Tensor:
        """Per-layer float64 scores of a window (default: this rank's); -inf where unobserved."""
        w = (self.window if window is None else window.reshape(len(self.names), len(self.FIELDS))).to(torch.float64)
        ne, ng = w[:, 3], w[:, 5]
        safe_ne = ne.clamp_min(1)
        if self.select_by == "saturation":
            s = (w[:, 0] + w[:, 1]) / safe_ne
        elif self.select_by == "error":
            s = w[:, 2] / safe_ne
        else:
            ge = w[:, 4] / ng.clamp_min(1)
            s = torch.where((ng > 0) & (ge > 0), (w[:, 2] / safe_ne) / ge.clamp_min(1e-300), torch.zeros_like(ge))
        return torch.where(ne > 0, s, torch.full_like(s, -math.inf))

    def select(self, step: int, window: Tensor | None = None) -> tuple[str, ...]:
        """Select from ``window`` (default: this rank's sums), record it in :attr:`history`, reset the window."""
        w = (self.window if window is None else window.reshape(len(self.names), len(self.FIELDS))).to(torch.float64)
        s = self.scores(w)
        valid = torch.isfinite(s) & ((s > 1.0) if self.select_by == "gain" else torch.ones_like(s, dtype=torch.bool))
        if self.threshold is not None:
            chosen = {i for i in range(len(self.names)) if bool(valid[i]) and float(s[i]) >= self.threshold}
        else:
            order = torch.argsort(-s, stable=True).tolist()  # -inf (unobserved) sorts last
            chosen = set([i for i in order if bool(valid[i])][: self.top_k])
        self.selected = tuple(n for i, n in enumerate(self.names) if i in chosen)
        means = {}
        for i, n in enumerate(self.names):
            ne, ng = float(w[i, 3]), float(w[i, 5])
            means[n] = {
                "upper": float(w[i, 0]) / ne if ne else None,
                "lower": float(w[i, 1]) / ne if ne else None,
                "euclid_err": float(w[i, 2]) / ne if ne else None,
                "gift_err": float(w[i, 4]) / ng if ng else None,
            }
        self.history.append({
            "step": step,
            "selected": self.selected,
            "scores": {n: (float(s[i]) if math.isfinite(float(s[i])) else None) for i, n in enumerate(self.names)},
            "window": means,
        })
        self.window.zero_()
        return self.selected


# -- refresh schedule and covariance EMA (shared by the hook and benchmarks.comm) --------------------


#: How :class:`CovarianceEMA` decays an old covariance: once per step elapsed, or once per refresh.
EMA_PER = ("step", "refresh")


class RefreshSchedule:
    """When GIFT rebuilds its factors from the covariances collected since the last refresh.

    Step ``t`` (0-based: the hook's :attr:`~lab.training.comm.hooks.CommHookState.step`, the number of
    steps completed before it) is a refresh step when ``t < warmup`` (every step of the warm-up, when the
    model moves fastest), when ``t % every == 0`` (the artifact's fixed period, 50), or when a layer
    selection happens at ``t`` (``selecting``: newly selected layers then start from fresh factors).
    :class:`~lab.training.comm.hooks.GiftHookState` and ``benchmarks.comm`` both decide with this class.

    Parameters
    ----------
    every : int
        Refresh period in steps, ``>= 1`` (artifact ``update_freq``: 50).
    warmup : int
        Refresh at each of the first ``warmup`` steps, ``>= 0`` (0: the fixed period only).

    Raises
    ------
    GiftError
        ``every`` not an int ``>= 1`` or ``warmup`` not an int ``>= 0`` (the message names the hook's
        keyword, ``refresh_every`` / ``refresh_warmup``).
    """

    def __init__(self, every: int, warmup: int = 0):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise GiftError(f"refresh_every must be an int >= 1, got {every!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise GiftError(f"refresh_warmup must be an int >= 0, got {warmup!r}")
        self.every, self.warmup = every, warmup

    def due(self, step: int, selecting: bool = False) -> bool:
        """Whether 0-based ``step`` refreshes; ``selecting``: a layer selection happens at that step."""
        return step < self.warmup or step % self.every == 0 or bool(selecting)

    def count(self, steps: int, selecting: Callable[[int], bool] | None = None) -> int:
        """Refresh steps among steps ``0 .. steps - 1``; ``selecting(t)``: whether ``t`` selects (e.g.
        :meth:`LayerSelector.due`)."""
        return sum(1 for t in range(steps) if self.due(t, selecting is not None and selecting(t)))

    def __repr__(self) -> str:
        return f"RefreshSchedule(every={self.every}, warmup={self.warmup})"


class CovarianceEMA:
    """Exponential moving averages of per-layer covariances, updated at refresh steps.

    ``update(name, a_new, step)`` sets ``C <- a_new`` the first time and ``C <- b C + (1 - b) a_new``
    after, with ``b = ema ** (step - last_refresh)`` (``per="step"``: the same time constant whatever the
    refresh period; ``ema ** 50`` for a 50-step period) or ``b = ema`` (``per="refresh"``: the artifact,
    ``A <- 0.95 A_old + 0.05 A_mean`` at each refresh). Computed in float64.

    Parameters
    ----------
    ema : float
        EMA factor in ``[0, 1)`` (artifact: 0.95); 0 keeps only the latest covariance.
    per : {"step", "refresh"}
        What one application of ``ema`` stands for.

    Attributes
    ----------
    cov : dict[str, Tensor]
        Current averages, float64 ``(d, d)``, by layer name.
    last : dict[str, int]
        Step of each layer's last refresh (also set by :meth:`mark` on ranks that receive factors
        instead of averaging covariances).

    Raises
    ------
    GiftError
        ``ema`` outside ``[0, 1)`` or an unknown ``per``.
    """

    def __init__(self, ema: float, per: str = "step"):
        if isinstance(ema, bool) or not (isinstance(ema, (int, float)) and 0 <= ema < 1):
            raise GiftError(f"ema must be in [0, 1), got {ema!r}")
        if per not in EMA_PER:
            raise GiftError(f"ema_per must be one of {EMA_PER}, got {per!r}")
        self.ema, self.per = float(ema), per
        self.cov: dict[str, Tensor] = {}
        self.last: dict[str, int] = {}

    def weight(self, name: str, step: int) -> float:
        """The weight ``b`` the old average of ``name`` gets at a refresh at ``step``."""
        if self.per == "refresh":
            return self.ema
        return self.ema ** (step - self.last.get(name, step))

    def update(self, name: str, a_new: Tensor, step: int) -> Tensor:
        """Fold one refresh's covariance ``a_new`` (``(d, d)``, any float dtype) of ``name`` in at ``step``;
        returns the new float64 average."""
        a_new = a_new.to(torch.float64)
        old = self.cov.get(name)
        b = self.weight(name, step)
        self.cov[name] = a_new if old is None else b * old + (1.0 - b) * a_new
        self.last[name] = step
        return self.cov[name]

    def mark(self, name: str, step: int) -> None:
        """Record a refresh of ``name`` at ``step`` without a covariance (its factors came from elsewhere)."""
        self.last[name] = step


# -- side bytes and the byte-budgeted layer selection ------------------------------------------------


def factor_floats(dim: int, n_eigenpairs: int) -> int:
    """float32 values of one factor as the hook broadcasts it (:meth:`Whitening.to_flat`): ``d k + k + 1``
    with ``k = min(n_eigenpairs, d)`` (``d`` the factor's size: ``in + 1`` for a Linear whitened with its
    bias, ``out`` for its output side, ``d_model`` for an embedding).

    Raises
    ------
    GiftError
        ``dim`` or ``n_eigenpairs`` not an int ``>= 1``.
    """
    for name, v in (("dim", dim), ("n_eigenpairs", n_eigenpairs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise GiftError(f"{name} must be an int >= 1, got {v!r}")
    k = min(n_eigenpairs, dim)
    return dim * k + k + 1


def side_bytes_per_refresh(factor_dims: Iterable[int], n_eigenpairs: int, statistics: str = "rank0",
                           broadcast_factors: bool = True) -> int:
    """Bytes one rank adds to the side collectives at a refresh step, exactly as
    :class:`~lab.training.comm.hooks.GiftHookState` accounts them (``StepRecord.extra_bytes``).

    Per factor of size ``d``: ``statistics="all_reduce"`` all-reduces the upper triangle and the row count,
    ``4 (d (d + 1) / 2 + 1)``, then (``broadcast_factors``) broadcasts rank 0's factors,
    ``4 (d k + k + 1)``; ``statistics="rank0"`` sends a 4-byte header (the factor's rank) and the factors.
    A layer selection step adds ``8 * 6`` bytes per candidate (the window all-reduce), not counted here.

    Parameters
    ----------
    factor_dims : Iterable[int]
        The size of every factor refreshed at that step (a selected Linear has two with ``output_side``).
    n_eigenpairs : int
        Eigenpairs kept per factor.
    statistics : {"rank0", "all_reduce"}
    broadcast_factors : bool

    Raises
    ------
    GiftError
        Bad sizes or an unknown ``statistics``.
    """
    if statistics not in ("rank0", "all_reduce"):
        raise GiftError(f"statistics must be 'rank0' or 'all_reduce', got {statistics!r}")
    total = 0
    for d in factor_dims:
        flat = factor_floats(d, n_eigenpairs)
        if statistics == "rank0":
            total += 4 * (1 + flat)
        else:
            total += 4 * (d * (d + 1) // 2 + 1) + (4 * flat if broadcast_factors else 0)
    return total


class BudgetCandidate(BaseModel):
    """One candidate layer for :func:`budget_selection`, as measured on a profiling run.

    Attributes
    ----------
    name : str
    error_sq : float
        Mean squared Euclidean codec error of the layer's gradient (absolute, ``||Q(G) - G||^2``): its share
        of the whole model's error.
    gain : float
        Mean Euclidean relative error over mean GIFT relative error (``> 1``: GIFT is better).
    bytes_per_step : float
        Side bytes the layer's factors add per step over the run (bytes per refresh times refreshes per step).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    error_sq: float
    gain: float
    bytes_per_step: float


def budget_selection(candidates: Sequence[BudgetCandidate], budget_bytes_per_step: float,
                     min_gain: float = 2.0) -> tuple[str, ...]:
    """The layers GIFT whitens under a side-byte budget (a fixed set chosen before training, like the
    paper's set S, Fig. 3, but scored by what whitening buys instead of by saturation).

    Whitening layer ``l`` lowers the model's squared codec error by ``error_sq (1 - 1 / gain^2)`` and costs
    ``bytes_per_step``. Layers with ``gain < min_gain`` are never taken (the selected layers' error must
    stay ``min_gain`` x below Euclidean); the others are taken greedily by reduction per byte, each one
    that still fits the budget (a layer that does not fit is skipped, later cheaper ones may still fit).

    Parameters
    ----------
    candidates : Sequence[BudgetCandidate]
        In the model's order (the result keeps it).
    budget_bytes_per_step : float
        ``>= 0``; side bytes per step the selection may add.
    min_gain : float
        ``>= 1``.

    Returns
    -------
    tuple of str
        Selected names, in candidate order (may be empty).

    Raises
    ------
    GiftError
        A negative or non-finite budget, ``min_gain < 1``, or duplicate names.
    """
    if not (isinstance(budget_bytes_per_step, (int, float)) and math.isfinite(budget_bytes_per_step)
            and budget_bytes_per_step >= 0):
        raise GiftError(f"budget_bytes_per_step must be a finite number >= 0, got {budget_bytes_per_step!r}")
    if not (isinstance(min_gain, (int, float)) and math.isfinite(min_gain) and min_gain >= 1):
        raise GiftError(f"min_gain must be a finite number >= 1, got {min_gain!r}")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise GiftError(f"budget_selection: duplicate candidate names in {names}")

    def value(c: BudgetCandidate) -> float:
        reduction = c.error_sq * (1.0 - 1.0 / (c.gain * c.gain))
        return reduction / c.bytes_per_step if c.bytes_per_step > 0 else math.inf

    order = sorted((c for c in candidates if c.gain >= min_gain and c.error_sq > 0), key=value, reverse=True)
    chosen, spent = set(), 0.0
    for c in order:
        if spent + c.bytes_per_step <= budget_bytes_per_step:
            chosen.add(c.name)
            spent += c.bytes_per_step
    return tuple(n for n in names if n in chosen)


# -- the hook's configuration ----------------------------------------------------------------------


def _int_at_least(name: str, low: int, value: object, *, none: bool = False) -> object:
    if none and value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"must be an int >= {low}{' or None' if none else ''}, got {value!r}")
    return value


def _choice(allowed: tuple[str, ...], value: object) -> object:
    if value not in allowed:
        raise ValueError(f"must be {' or '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


class GiftConfig(BaseModel):
    """The validated, frozen settings of :class:`~lab.training.comm.hooks.GiftHookState` (every keyword
    but the model, the codec and the accounting ones); the meaning of each field is documented there.

    ``GiftConfig(**kw)`` raises pydantic's ``ValidationError``; :meth:`build` raises
    :class:`~lab.training.errors.GiftError` whose message starts with the offending field's name and
    whose ``field`` attribute is that name (None for a rule between fields).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_eigenpairs: int = 32
    damping: float = 1e-3
    ema: float = 0.95
    ema_per: str = "step"
    refresh_every: int = 50
    refresh_warmup: int = 0
    residual: str = "scalar"
    layers: tuple[str, ...] | None = None
    include: str | None = None
    exclude: str | None = None
    select_by: str = "saturation"
    select_k: int | float = 0.25
    select_threshold: float | None = None
    select_warmup: int = 20
    reselect_every: int | None = 100
    track: str = "all"
    embeddings: bool = True
    bias: bool = True
    output_side: bool = True
    output_side_max: int = 2048
    collect: str = "every"
    error_feedback: bool = True
    euclidean_error_feedback: bool = False
    rebase_error_feedback: bool = True
    broadcast_factors: bool = True
    statistics: str = "all_reduce"
    eigensolver: str = "eigh"
    subspace_iters: int = 4

    @field_validator("n_eigenpairs", "refresh_every", "output_side_max", mode="before")
    @classmethod
    def _positive_int(cls, v: object) -> object:
        return _int_at_least("", 1, v)

    @field_validator("refresh_warmup", "subspace_iters", mode="before")
    @classmethod
    def _non_negative_int(cls, v: object) -> object:
        return _int_at_least("", 0, v)

    @field_validator("reselect_every", mode="before")
    @classmethod
    def _positive_int_or_none(cls, v: object) -> object:
        return _int_at_least("", 1, v, none=True)

    @field_validator("select_warmup", mode="before")
    @classmethod
    def _int(cls, v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be an int, got {v!r}")
        return v

    @field_validator("damping", mode="before")
    @classmethod
    def _damping(cls, v: object) -> object:
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"must be a finite float >= 0, got {v!r}")
        return v

    @field_validator("ema", mode="before")
    @classmethod
    def _ema(cls, v: object) -> object:
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0 <= v < 1):
            raise ValueError(f"must be in [0, 1), got {v!r}")
        return v

    @field_validator("select_k", mode="before")
    @classmethod
    def _select_k(cls, v: object) -> object:
        if isinstance(v, bool) or not (isinstance(v, int) and v >= 1 or isinstance(v, float) and 0 < v <= 1):
            raise ValueError(f"must be an int >= 1 or a fraction in (0, 1], got {v!r}")
        return v

    @field_validator("select_threshold", mode="before")
    @classmethod
    def _threshold(cls, v: object) -> object:
        if v is not None and (isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v))):
            raise ValueError(f"must be a finite number or None, got {v!r}")
        return v

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _regex(cls, v: object) -> object:
        if v is None:
            return v
        if not isinstance(v, str):
            raise ValueError(f"must be a regular expression (str) or None, got {v!r}")
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"is not a valid regular expression ({exc}): {v!r}") from None
        return v

    @field_validator("layers", mode="before")
    @classmethod
    def _layers(cls, v: object) -> object:
        if v is None:
            return v
        if isinstance(v, str) or not isinstance(v, Iterable):
            raise ValueError(f"must be an iterable of layer names or None, got {v!r}")
        v = tuple(v)
        if not all(isinstance(n, str) for n in v):
            raise ValueError(f"must hold layer names (str), got {v!r}")
        return v

    @field_validator("embeddings", "bias", "output_side", "error_feedback", "euclidean_error_feedback",
                     "rebase_error_feedback", "broadcast_factors", mode="before")
    @classmethod
    def _bool(cls, v: object) -> object:
        if not isinstance(v, bool):
            raise ValueError(f"must be True or False, got {v!r}")
        return v

    _ema_per = field_validator("ema_per", mode="before")(lambda v: _choice(EMA_PER, v))
    _residual = field_validator("residual", mode="before")(lambda v: _choice(RESIDUALS, v))
    _select_by = field_validator("select_by", mode="before")(lambda v: _choice(SELECT_BY, v))
    _track = field_validator("track", mode="before")(lambda v: _choice(("all", "selected"), v))
    _collect = field_validator("collect", mode="before")(lambda v: _choice(("refresh", "every"), v))
    _statistics = field_validator("statistics", mode="before")(lambda v: _choice(("all_reduce", "rank0"), v))
    _eigensolver = field_validator("eigensolver", mode="before")(lambda v: _choice(EIGENSOLVERS, v))

    @model_validator(mode="after")
    def _consistent(self) -> GiftConfig:
        if self.statistics == "rank0" and not self.broadcast_factors:
            raise ValueError("statistics='rank0' builds the factors on rank 0 only: it needs broadcast_factors=True")
        if self.select_by == "gain" and self.track != "all":
            raise ValueError("select_by='gain' measures GIFT on every candidate: it needs track='all'")
        if self.layers is None and self.select_warmup < 1:
            raise ValueError("select_warmup must be an int >= 1 when no layers are given, "
                             f"got {self.select_warmup!r}")
        return self

    @classmethod
    def build(cls, **kw: object) -> GiftConfig:
        """``GiftConfig(**kw)``, its first validation error raised as :class:`GiftError` naming the field.

        Raises
        ------
        GiftError
            ``field`` set to the bad (or unknown) field's name, None for a rule between fields.
        """
        try:
            return cls(**kw)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else None
            msg = first["msg"].removeprefix("Value error, ")
            if first["type"] == "extra_forbidden":
                msg = f"is not a GIFT setting; known: {', '.join(cls.model_fields)}"
            err = GiftError(f"{name} {msg}" if name else msg)
            err.field = name
            raise err from None
