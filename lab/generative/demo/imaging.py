"""Images in and out of the demo: uploads to the prior's shape (:func:`to_prior_image`), PNG
rendering (:func:`image_png`, :func:`grid_png`). PIL only; nothing imports Jupyter. Part of :mod:`lab.generative.demo`."""

from __future__ import annotations

import io
import math

import numpy as np
import torch
import torch.nn.functional as F

from lab.generative.errors import GenerativeError
from lab.generative.demo.catalogue import _border_mean


class ImageError(GenerativeError, ValueError):
    """An image that cannot be read or converted to the prior's shape."""


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
