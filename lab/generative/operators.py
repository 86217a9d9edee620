"""Linear degradation operators ``y = H x + sigma_y * n`` for image restoration.

Every operator acts on a batch of images ``x`` of shape ``(B, C, H, W)`` (float, on any device,
images on the [-1, 1] scale) and returns a measurement of shape ``(B, *measurement_shape)``.
Each one gives, in closed form:

- ``H(x)`` and its adjoint ``H_adjoint(y)`` (``<H x, y> = <x, H^T y>`` exactly, up to rounding);
- ``solve_HHt_plus(v, gamma) = (H H^T + gamma I)^{-1} v`` for ``gamma >= 0`` (for ``gamma = 0`` the
  pseudo-inverse ``(H H^T)^+ v``, zero on the null space of ``H H^T``), so methods such as
  ReBridge-Flow's clean-side anchoring (arXiv 2609.00811, Eq. 7), Flower's proximal step and OT-ODE's
  PiGDM guidance need no conjugate gradients;
- ``measure(x, generator)``: ``H x`` plus Gaussian noise of standard deviation ``sigma_y`` (on the
  [-1, 1] scale), added only where something is observed.

The tasks and default noise levels follow ReBridge-Flow's protocol (arXiv 2609.00811, Sec. 4,
"Tasks"): denoising sigma_y = 0.2; Gaussian deblurring sigma_y = 0.05 (blur sigma 1.0, circular
FFT convolution as in PnP-Flow's ``gaussian_deblurring_FFT``); super-resolution by block averaging,
random inpainting (70% of pixels removed) and a centred box inpainting with sigma_y = 0.01.

Masks (random and box inpainting) keep the measurement in image shape: ``H = diag(m)`` with a 0/1
mask ``m`` shared by all channels, the removed pixels of ``y`` are 0, and ``H H^T = diag(m)``.

Buffers (mask, transfer function) live on the CPU and are copied, once per device and dtype, to
the device of the tensor they are applied to: nothing assumes CPU.

>>> op = get_operator("sr2", (1, 8, 8))
>>> op.measurement_shape
(1, 4, 4)
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from lab.generative._tensor import bcast, check_batch, randn
from lab.generative.errors import OperatorError

__all__ = [
    "LinearOperator",
    "Denoising",
    "GaussianDeblur",
    "SuperResolution",
    "RandomInpainting",
    "BoxInpainting",
    "get_operator",
    "OPERATORS",
]


def _image_shape(shape, who: str) -> tuple[int, int, int]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise OperatorError(f"{who}: shape must be (C, H, W), got {shape!r}") from None
    if len(shape) == 4:  # (B, C, H, W): the batch size is free
        shape = shape[1:]
    if len(shape) != 3 or min(shape) < 1:
        raise OperatorError(f"{who}: shape must be (C, H, W) with positive sizes, got {shape!r}")
    return shape  # type: ignore[return-value]


def _sigma(sigma_y, who: str) -> float:
    s = float(sigma_y)
    if not math.isfinite(s) or s < 0:
        raise OperatorError(f"{who}: sigma_y must be a finite number >= 0 (noise std on the [-1, 1] scale), got {sigma_y!r}")
    return s


class LinearOperator:
    """Base class: a known linear degradation ``H`` from images ``(B, *shape)`` to measurements
    ``(B, *measurement_shape)`` with additive Gaussian noise ``sigma_y``.

    Parameters
    ----------
    shape : (C, H, W)
        Image shape (a leading batch size is accepted and ignored).
    sigma_y : float
        Noise standard deviation on the [-1, 1] image scale (``>= 0``).

    Subclasses implement ``_H``, ``_Ht`` and ``_solve``; the public methods check shapes and raise
    :class:`~lab.generative.errors.OperatorError` naming the operator and the expected shape.
    Source: the forward model ``y = H x + eps, eps ~ N(0, sigma_y^2 I)`` of ReBridge-Flow
    (arXiv 2609.00811, Eq. 1).
    """

    #: registry name (``get_operator``)
    name: str = "operator"
    #: the task's default noise level
    default_sigma_y: float = 0.0

    def __init__(self, shape, sigma_y: float | None = None):
        self.shape = _image_shape(shape, type(self).__name__)
        self.sigma_y = _sigma(self.default_sigma_y if sigma_y is None else sigma_y, type(self).__name__)
        self._cache: dict = {}
        self._matrix: torch.Tensor | None = None

    # ----------------------------------------------------------------- sizes
    @property
    def measurement_shape(self) -> tuple[int, ...]:
        """Shape of one measurement (without batch)."""
        return self.shape

    @property
    def n(self) -> int:
        """Number of image entries ``C*H*W``."""
        return int(math.prod(self.shape))

    @property
    def m(self) -> int:
        """Number of measurement entries (including the structural zeros of a mask)."""
        return int(math.prod(self.measurement_shape))

    @property
    def observed_count(self) -> int:
        """Number of measurement entries that carry information (``m`` except for masks)."""
        return self.m

    @property
    def lipschitz(self) -> float:
        """``||H||_2^2``, the largest eigenvalue of ``H^T H`` (the Lipschitz constant of the gradient of
        ``||H x - y||^2 / 2``): 1 for denoising, masks and a normalised blur, ``1/factor^2`` for block averaging."""
        return 1.0

    # ----------------------------------------------------------------- buffers
    def _buffer(self, key: str, make: Callable[[], torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """CPU buffer ``make()`` (built once) returned on ``like``'s device, in ``like``'s precision
        (a complex buffer becomes complex64/complex128 to match); cached per device and dtype."""
        k = (key, like.device, like.dtype)
        if k not in self._cache:
            if (key, "cpu") not in self._cache:
                self._cache[(key, "cpu")] = make()
            base = self._cache[(key, "cpu")]
            if base.is_complex():
                dt = torch.complex128 if like.dtype == torch.float64 else torch.complex64
            else:
                dt = like.dtype
            self._cache[k] = base.to(device=like.device, dtype=dt)
        return self._cache[k]

    # ----------------------------------------------------------------- public API
    def _check_x(self, x, what="x", fn="H"):
        check_batch(x, self.shape, f"{type(self).__name__}.{fn}", what, OperatorError)

    def _check_y(self, y, what="y", fn="H_adjoint"):
        check_batch(y, self.measurement_shape, f"{type(self).__name__}.{fn}", what, OperatorError)

    def H(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the degradation: ``(B, *shape) -> (B, *measurement_shape)``."""
        self._check_x(x)
        return self._H(x)

    def H_adjoint(self, y: torch.Tensor) -> torch.Tensor:
        """Apply the adjoint ``H^T``: ``(B, *measurement_shape) -> (B, *shape)``."""
        self._check_y(y)
        return self._Ht(y)

    def solve_HHt_plus(self, v: torch.Tensor, gamma) -> torch.Tensor:
        """``(H H^T + gamma I)^{-1} v`` in closed form.

        Parameters
        ----------
        v : tensor (B, *measurement_shape)
        gamma : float, 0-d tensor or tensor (B,)
            ``>= 0``. For ``gamma = 0`` the pseudo-inverse ``(H H^T)^+ v`` is returned.
        """
        self._check_y(v, "v", "solve_HHt_plus")
        g = self._gamma(gamma, v)
        return self._solve(v, g)

    def measure(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A noisy measurement ``H x + sigma_y * n`` with ``n ~ N(0, I)`` drawn from ``generator``
        (a CPU generator gives the same noise on every device); noise only where observed."""
        y = self.H(x)
        if self.sigma_y > 0:
            y = y + self.sigma_y * self._noise_mask(randn(y.shape, generator, y))
        return y

    def pinv(self, y: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """A (Tikhonov-regularised) pseudo-inverse ``H^T (H H^T + eps I)^{-1} y``: exact up to ``eps``
        for denoising, masks and block averaging; a regularised inverse for blur."""
        self._check_y(y, "y", "pinv")
        return self._Ht(self._solve(y, self._gamma(eps, y)))

    def as_matrix(self, dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
        """The dense matrix of ``H``, shape ``(m, n)`` (rows: flattened measurement, columns: flattened
        image), built by applying ``H`` to the identity; cached (small images only: ``n**2`` entries)."""
        if self._matrix is None or self._matrix.dtype != dtype:
            eye = torch.eye(self.n, dtype=dtype).reshape(self.n, *self.shape)
            cols = [self._H(eye[i : i + 1024]).reshape(-1, self.m) for i in range(0, self.n, 1024)]
            self._matrix = torch.cat(cols).T.contiguous()
        return self._matrix if device is None else self._matrix.to(device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, sigma_y={self.sigma_y}{self._extra_repr()})"

    # ----------------------------------------------------------------- helpers for subclasses
    def _extra_repr(self) -> str:
        return ""

    def _noise_mask(self, noise: torch.Tensor) -> torch.Tensor:
        return noise

    def _gamma(self, gamma, like: torch.Tensor) -> torch.Tensor:
        if torch.is_tensor(gamma):
            g = gamma.detach().to(device=like.device, dtype=like.dtype)
            if g.dim() == 0:
                g = g.expand(like.shape[0])
            if g.shape != (like.shape[0],):
                raise OperatorError(
                    f"{type(self).__name__}.solve_HHt_plus: gamma must be a float or a tensor of shape ({like.shape[0]},), "
                    f"got {tuple(g.shape)}"
                )
        else:
            g = torch.full((like.shape[0],), float(gamma), device=like.device, dtype=like.dtype)
        if bool((g < 0).any()) or not bool(torch.isfinite(g).all()):
            raise OperatorError(f"{type(self).__name__}.solve_HHt_plus: gamma must be finite and >= 0, got {g.tolist()}")
        return bcast(g, like.dim())

    def _H(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def _Ht(self, y):  # pragma: no cover - abstract
        raise NotImplementedError

    def _solve(self, v, g):  # pragma: no cover - abstract
        raise NotImplementedError


class Denoising(LinearOperator):
    """Gaussian denoising: ``H = I``, default ``sigma_y = 0.2`` on [-1, 1].

    Source: ReBridge-Flow (arXiv 2609.00811), Sec. 4 "Tasks" (natural images, sigma_y = 0.2);
    PnP-Flow (Martin et al., ICLR 2025) uses the same setting.
    """

    name = "denoise"
    default_sigma_y = 0.2

    def _H(self, x):
        return x.clone()

    def _Ht(self, y):
        return y.clone()

    def _solve(self, v, g):
        return v / (1.0 + g)


class GaussianDeblur(LinearOperator):
    """Gaussian deblurring with a circular (periodic) convolution computed by FFT.

    ``H x = k * x`` (the same normalised Gaussian kernel on every channel), ``H^T`` convolves with
    the flipped kernel, ``H H^T + gamma I`` is diagonal in Fourier space:
    ``(H H^T + gamma I)^{-1} v = F^{-1}[ F v / (|K|^2 + gamma) ]``.

    Parameters
    ----------
    shape : (C, H, W)
    sigma_blur : float
        Kernel standard deviation in pixels (default 1.0: PnP-Flow's CelebA 128 px setting).
    kernel_size : int or None
        Odd kernel side; None takes ``2*ceil(4*sigma_blur) + 1`` capped at the largest odd size that
        fits the image (PnP-Flow uses 61 on 128 px, which carries the same mass to 1e-4).
        A kernel larger than the image is refused.
    sigma_y : float
        Default 0.05 (ReBridge-Flow, Sec. 4; PnP-Flow).

    Source: PnP-Flow's ``gaussian_deblurring_FFT`` degradation (github annegnx/PnP-Flow), used by
    ReBridge-Flow (arXiv 2609.00811, Sec. 4).
    """

    name = "deblur"
    default_sigma_y = 0.05

    def __init__(self, shape, sigma_blur: float = 1.0, kernel_size: int | None = None, sigma_y: float | None = None):
        super().__init__(shape, sigma_y)
        _, h, w = self.shape
        sb = float(sigma_blur)
        if not math.isfinite(sb) or sb <= 0:
            raise OperatorError(f"GaussianDeblur: sigma_blur must be > 0 (pixels), got {sigma_blur!r}")
        largest_odd = min(h, w) if min(h, w) % 2 == 1 else min(h, w) - 1
        if kernel_size is None:
            kernel_size = min(2 * math.ceil(4 * sb) + 1, largest_odd)
        kernel_size = int(kernel_size)
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise OperatorError(f"GaussianDeblur: kernel_size must be a positive odd integer, got {kernel_size}")
        if kernel_size > min(h, w):
            raise OperatorError(
                f"GaussianDeblur: kernel_size {kernel_size} exceeds the image ({h}x{w}); use kernel_size <= {largest_odd}"
            )
        self.sigma_blur, self.kernel_size = sb, kernel_size

    @property
    def kernel(self) -> torch.Tensor:
        """The normalised Gaussian kernel, shape ``(kernel_size, kernel_size)``, float64, sums to 1."""
        r = torch.arange(self.kernel_size, dtype=torch.float64) - self.kernel_size // 2
        g = torch.exp(-(r**2) / (2 * self.sigma_blur**2))
        k = g[:, None] * g[None, :]
        return k / k.sum()

    def _transfer(self) -> torch.Tensor:
        _, h, w = self.shape
        k = self.kernel
        full = torch.zeros(h, w, dtype=torch.float64)
        full[: self.kernel_size, : self.kernel_size] = k
        full = torch.roll(full, shifts=(-(self.kernel_size // 2), -(self.kernel_size // 2)), dims=(0, 1))
        return torch.fft.rfft2(full)  # (h, w//2+1) complex128

    def _K(self, like):
        return self._buffer("K", self._transfer, like)

    def _filter(self, x, fn):
        _, h, w = self.shape
        X = torch.fft.rfft2(x, s=(h, w))
        return torch.fft.irfft2(fn(X), s=(h, w)).to(x.dtype)

    def _H(self, x):
        K = self._K(x)
        return self._filter(x, lambda X: X * K)

    def _Ht(self, y):
        K = self._K(y)
        return self._filter(y, lambda X: X * K.conj())

    def _solve(self, v, g):
        K2 = self._K(v).abs() ** 2
        denom = K2 + g  # g: (B,1,1,1) broadcasts over (B,C,h,w//2+1)
        tiny = 1e-12 * float(K2.max())
        safe = torch.where(denom > tiny, denom, torch.ones_like(denom))
        return self._filter(v, lambda X: torch.where(denom > tiny, X / safe, torch.zeros_like(X)))

    @property
    def lipschitz(self) -> float:
        return float((self._transfer().abs() ** 2).max())

    def _extra_repr(self):
        return f", sigma_blur={self.sigma_blur}, kernel_size={self.kernel_size}"


class SuperResolution(LinearOperator):
    """Super-resolution by block averaging: ``H`` averages each ``factor x factor`` block.

    ``H^T y`` spreads each low-resolution value over its block divided by ``factor**2``, so
    ``H H^T = I / factor**2`` and ``(H H^T + gamma I)^{-1} v = v / (1/factor**2 + gamma)``.

    Parameters
    ----------
    shape : (C, H, W)
        H and W must be divisible by ``factor``.
    factor : int
        2 or 4 in the papers (any integer >= 2 is accepted).
    sigma_y : float
        Default 0.01 (ReBridge-Flow, Sec. 4: "0.01 for all other tasks"; PnP-Flow used 0.05).

    Source: PnP-Flow's ``superresolution`` degradation (block-average downsampling), used by
    ReBridge-Flow (arXiv 2609.00811, Sec. 4: 2x for CelebA/COCO, 4x for AFHQ-Cat).
    """

    name = "sr"
    default_sigma_y = 0.01

    def __init__(self, shape, factor: int = 2, sigma_y: float | None = None):
        super().__init__(shape, sigma_y)
        f = int(factor)
        if f < 2 or f != factor:
            raise OperatorError(f"SuperResolution: factor must be an integer >= 2, got {factor!r}")
        _, h, w = self.shape
        if h % f or w % f:
            raise OperatorError(f"SuperResolution: image {h}x{w} is not divisible by factor {f}")
        self.factor = f
        self.name = f"sr{f}"

    @property
    def measurement_shape(self):
        c, h, w = self.shape
        return (c, h // self.factor, w // self.factor)

    def _H(self, x):
        return F.avg_pool2d(x, self.factor)

    def _Ht(self, y):
        f = self.factor
        return y.repeat_interleave(f, dim=-2).repeat_interleave(f, dim=-1) / (f * f)

    def _solve(self, v, g):
        return v / (1.0 / self.factor**2 + g)

    @property
    def lipschitz(self) -> float:
        return 1.0 / self.factor**2

    def _extra_repr(self):
        return f", factor={self.factor}"


class _MaskOperator(LinearOperator):
    """``H = diag(m)`` for a 0/1 mask ``m`` of shape (H, W) shared across channels."""

    def _make_mask(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def mask(self) -> torch.Tensor:
        """The 0/1 mask, shape ``(1, H, W)`` float32 on the CPU (1 = observed)."""
        if ("mask", "cpu") not in self._cache:
            self._cache[("mask", "cpu")] = self._make_mask()
        return self._cache[("mask", "cpu")]

    @property
    def observed_count(self) -> int:
        return int(self.mask.sum().item()) * self.shape[0]

    @property
    def lipschitz(self) -> float:
        return 1.0 if self.observed_count else 0.0

    def _M(self, like):
        return self._buffer("mask", lambda: self.mask, like)

    def _noise_mask(self, noise):
        return noise * self._M(noise)

    def _H(self, x):
        return x * self._M(x)

    def _Ht(self, y):
        return y * self._M(y)

    def _solve(self, v, g):
        M = self._M(v)
        denom = M + g
        safe = torch.where(denom > 0, denom, torch.ones_like(denom))
        return torch.where(denom > 0, v / safe, torch.zeros_like(v))


class RandomInpainting(_MaskOperator):
    """Random inpainting: a fixed random fraction ``p`` of pixels (all channels) is removed.

    Parameters
    ----------
    shape : (C, H, W)
    p : float
        Fraction removed, in [0, 1); default 0.7 (ReBridge-Flow and PnP-Flow, natural images).
    seed : int
        Seed of the mask (a CPU generator): the same seed gives the same mask everywhere.
    sigma_y : float
        Default 0.01 (ReBridge-Flow, Sec. 4).

    Source: ReBridge-Flow (arXiv 2609.00811), Sec. 4 "Tasks"; PnP-Flow's ``random_inpainting``.
    """

    name = "inpaint_random"
    default_sigma_y = 0.01

    def __init__(self, shape, p: float = 0.7, seed: int = 0, sigma_y: float | None = None):
        super().__init__(shape, sigma_y)
        p = float(p)
        if not 0.0 <= p < 1.0:
            raise OperatorError(f"RandomInpainting: p (fraction removed) must be in [0, 1), got {p}")
        self.p, self.seed = p, int(seed)

    def _make_mask(self):
        _, h, w = self.shape
        g = torch.Generator(device="cpu").manual_seed(self.seed)
        return (torch.rand((1, h, w), generator=g) >= self.p).to(torch.float32)

    def _extra_repr(self):
        return f", p={self.p}, seed={self.seed}"


class BoxInpainting(_MaskOperator):
    """Box inpainting: a rectangle of pixels (all channels) is removed.

    Parameters
    ----------
    shape : (C, H, W)
    size : int, (int, int) or None
        Box height and width in pixels; None scales ReBridge-Flow's 40x40-on-128 px box:
        ``max(1, round(0.3125 * min(H, W)))``.
    top_left : (int, int) or None
        Box corner; None centres it.
    sigma_y : float
        Default 0.01 (ReBridge-Flow, Sec. 4).

    Source: ReBridge-Flow (arXiv 2609.00811), Sec. 4 "Tasks" (40x40 on 128 px, 80x80 on 256 px).
    """

    name = "inpaint_box"
    default_sigma_y = 0.01

    def __init__(self, shape, size=None, top_left=None, sigma_y: float | None = None):
        super().__init__(shape, sigma_y)
        _, h, w = self.shape
        if size is None:
            size = max(1, round(0.3125 * min(h, w)))
        bh, bw = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        if bh < 1 or bw < 1 or bh > h or bw > w:
            raise OperatorError(f"BoxInpainting: box {bh}x{bw} does not fit the image {h}x{w}")
        if top_left is None:
            top_left = ((h - bh) // 2, (w - bw) // 2)
        r0, c0 = (int(v) for v in top_left)
        if r0 < 0 or c0 < 0 or r0 + bh > h or c0 + bw > w:
            raise OperatorError(f"BoxInpainting: box {bh}x{bw} at {(r0, c0)} leaves the image {h}x{w}")
        self.box = (r0, c0, bh, bw)

    def _make_mask(self):
        _, h, w = self.shape
        r0, c0, bh, bw = self.box
        m = torch.ones((1, h, w), dtype=torch.float32)
        m[:, r0 : r0 + bh, c0 : c0 + bw] = 0
        return m

    def _extra_repr(self):
        return f", box={self.box}"


#: registry name -> factory(shape, **kw)
OPERATORS: dict[str, Callable[..., LinearOperator]] = {
    "denoise": Denoising,
    "deblur": GaussianDeblur,
    "sr2": lambda shape, **kw: SuperResolution(shape, factor=2, **kw),
    "sr4": lambda shape, **kw: SuperResolution(shape, factor=4, **kw),
    "inpaint_random": RandomInpainting,
    "inpaint_box": BoxInpainting,
}


def get_operator(name: str, shape, **kw) -> LinearOperator:
    """Build an operator by task name.

    Parameters
    ----------
    name : {"denoise", "deblur", "sr2", "sr4", "inpaint_random", "inpaint_box"}
    shape : (C, H, W) or (B, C, H, W)
    **kw
        Passed to the operator (``sigma_y``, ``sigma_blur``, ``kernel_size``, ``p``, ``seed``,
        ``size``, ``top_left``).

    Raises
    ------
    OperatorError
        Unknown name (the message lists the known ones) or bad keyword.
    """
    if name not in OPERATORS:
        raise OperatorError(f"unknown operator {name!r}; known: {', '.join(OPERATORS)}")
    try:
        return OPERATORS[name](shape, **kw)
    except TypeError as exc:
        raise OperatorError(f"operator {name!r}: {exc}") from None
