"""Low-precision gradient codecs: a tensor to the ``uint8`` bytes that travel over a collective, and back.

gloo rejects float8 tensors, so every codec's wire format is one flat ``torch.uint8`` tensor that
holds the scales and the codes together; ``all_gather`` / ``all_gather_into_tensor`` move it as is.
Each codec states its exact size: ``codec.nbytes(numel)`` is the ``numel()`` of ``codec.encode(x)``
for any ``x`` with ``numel`` elements.

Formats
-------
``Float32Codec`` (``"fp32"``)
    The identity baseline: the IEEE float32 bytes, 4 bytes per element.
``BF16Codec`` (``"bf16"``)
    bfloat16 bytes (round to nearest even), 2 bytes per element, no scale.
``FP8Codec(fmt, block_size)`` (``"fp8_e4m3"``, ``"fp8_e5m2"``, ``"fp8_e4m3_b128"``, ...)
    OCP 8-bit floating point (OCP "OFP8 Formats for Deep Learning" spec v1.0, 2023): E4M3 (max 448,
    no infinities; ``torch.float8_e4m3fn``) and E5M2 (max 57344; ``torch.float8_e5m2``). One FP32
    scale per tensor (``block_size=None``) or per block of ``block_size`` consecutive elements of the
    flattened tensor (the last block may be shorter). ``scale = amax / fmt_max`` (amax of the tensor or
    block; a zero amax gives scale 1 so zeros stay zeros); codes are ``cast(clamp(x / scale, -max, max))``
    with round-to-nearest-even, so no infinity is ever produced; decode is ``fp32(code) * scale``.
``NVFP4Codec`` (``"nvfp4"``)
    NVIDIA's NVFP4 (NVIDIA's NVFP4 description, the Transformer Engine / cuBLAS block-scaling docs,
    and arXiv 2509.25149): blocks of 16 consecutive elements, each element an E2M1 code (sign bit,
    magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; round to nearest, ties to the even code, saturating at 6),
    one E4M3 scale per block and one FP32 scale per tensor (two-level scaling):
    ``global = amax / (6 * 448)`` (1 when amax is 0), ``block = e4m3(clamp(block_amax / 6 / global, max=448))``,
    ``code = e2m1(clamp(x / (fp32(block) * global), -6, 6))``, decode ``value(code) * fp32(block) * global``.
    A block whose E4M3 scale underflows to 0 (block amax below about 2.2e-6 of the tensor amax) decodes
    to zeros. Because the block scale is rounded, a block's largest values can saturate at 6.

Byte layout (native byte order, little-endian on every supported machine; sizes for ``n`` elements)
---------------------------------------------------------------------------------------------------
======================  ======================================================================  =====================
codec                   layout                                                                  bytes
======================  ======================================================================  =====================
fp32                    ``n`` float32 values                                                    ``4 n``
fp8 per tensor          float32 scale, then ``n`` FP8 codes                                     ``4 + n``
fp8 per block ``B``     ``ceil(n/B)`` float32 scales, then ``n`` FP8 codes                      ``4 ceil(n/B) + n``
nvfp4                   float32 global scale, ``ceil(n/16)`` E4M3 block scales, then            ``4 + 9 ceil(n/16)``
                        ``8 ceil(n/16)`` bytes of packed E2M1 codes (two per byte: element
                        ``2i`` in the low nibble, ``2i+1`` in the high nibble; the last block
                        padded with zero codes)
======================  ======================================================================  =====================

Non-finite values
-----------------
Every codec takes ``nonfinite="raise"`` (default) or ``"propagate"``. With ``"raise"``, ``encode``
raises :class:`~lab.training.errors.NonFiniteError` (a :class:`~lab.training.errors.CodecError`)
naming the tensor (``encode(x, name="fc2.weight")``) and counting its NaN and inf values; the check
costs one device-to-host sync per call. With ``"propagate"`` there is no check and no sync: a NaN or
inf poisons its scale group, which is stored as NaN, so decoding gives NaN for every element of the
tensor (per-tensor FP8, NVFP4) or of that block (per-block FP8), and ``fp32`` carries the values as
they are. That keeps an overflow detectable after the collective (e.g. by a loss scaler).

Tensors of any shape, dtype float16 / bfloat16 / float32 / float64, on any device are accepted; the
payload is on the input's device and decoding gives a flat tensor of ``numel`` elements on the
payload's device. Everything is vectorized torch (no host copies), computed in float32. Scales are
float32 too, so a tensor (or block) whose amax is itself a float32 subnormal (below 1.2e-38) loses
relative precision, and one below about 6e-43 decodes to zeros.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lab.training.errors import CodecError, NonFiniteError

__all__ = ["CODECS", "Codec", "Float32Codec", "FP8Codec", "NVFP4Codec", "get_codec"]

#: FP8 formats: torch dtype and largest finite magnitude (OCP OFP8 v1.0).
_FP8_FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
#: E2M1 magnitudes by 3-bit code (sign is bit 3).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MAX = 6.0
_E4M3_MAX = 448.0
_INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NONFINITE = ("raise", "propagate")

#: Names :func:`get_codec` knows for certain (any ``fp8_<fmt>_b<N>`` block size works too).
CODECS = ("fp32", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_b32", "fp8_e5m2_b32", "fp8_e4m3_b128", "fp8_e5m2_b128", "nvfp4")


@dataclass(frozen=True)
class Codec(ABC):
    """An encode/decode pair whose payload is one flat ``torch.uint8`` tensor of known size.

    Parameters
    ----------
    nonfinite : {"raise", "propagate"}, keyword only
        What ``encode`` does with NaN / inf input (see the module docstring).
    """

    nonfinite: str = field(default="raise", kw_only=True)

    def __post_init__(self) -> None:
        if self.nonfinite not in _NONFINITE:
            raise CodecError(f"nonfinite must be one of {_NONFINITE}, got {self.nonfinite!r}")

    @property
    @abstractmethod
    def name(self) -> str:
        """The registry name, e.g. ``"fp8_e4m3_b128"`` (``get_codec(codec.name, nonfinite=codec.nonfinite) == codec``)."""

    @abstractmethod
    def nbytes(self, numel: int) -> int:
        """Exact size in bytes (= ``numel()`` of the uint8 payload) of ``numel`` encoded elements."""

    def encoded_nbytes(self, numel: int) -> int:
        """Same as :meth:`nbytes`."""
        return self.nbytes(numel)

    def encode(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Encode ``x`` into its wire bytes.

        Parameters
        ----------
        x : Tensor
            Any shape (flattened in row-major order), dtype float16, bfloat16, float32 or float64.
        name : str, optional
            The tensor's name (e.g. a parameter name), used in error messages.

        Returns
        -------
        Tensor
            1-D ``torch.uint8`` of ``self.nbytes(x.numel())`` elements on ``x.device``; never aliases ``x``.

        Raises
        ------
        CodecError
            ``x`` is not a floating tensor of a supported dtype.
        NonFiniteError
            ``x`` holds NaN or inf and the codec was built with ``nonfinite="raise"``.
        """
        if not isinstance(x, Tensor):
            raise CodecError(f"{self.name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _INPUT_DTYPES:
            raise CodecError(f"{self.name}: cannot encode {x.dtype} tensor {name!r}; expected one of {_INPUT_DTYPES}")
        flat = x.detach().reshape(-1).to(torch.float32)
        return self._encode(flat, name)

    def decode(self, payload: Tensor, numel: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Decode the wire bytes of ``numel`` elements.

        Parameters
        ----------
        payload : Tensor
            1-D ``torch.uint8`` of exactly ``self.nbytes(numel)`` elements, as ``encode`` produced
            (a slice of a larger gathered buffer is fine).
        numel : int
            Number of encoded elements (reshape the result to the original shape yourself).
        dtype : torch.dtype
            Floating dtype of the result (computed in float32, then cast).

        Returns
        -------
        Tensor
            1-D tensor of ``numel`` elements of ``dtype`` on ``payload.device``.

        Raises
        ------
        CodecError
            ``payload`` is not 1-D uint8, its size differs from ``nbytes(numel)``, or ``dtype`` is not floating.
        """
        expected = self.nbytes(numel)
        if not isinstance(payload, Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
            got = f"{payload.dtype} tensor of shape {tuple(payload.shape)}" if isinstance(payload, Tensor) else type(payload).__name__
            raise CodecError(f"{self.name}: payload must be a 1-D torch.uint8 tensor, got {got}")
        if payload.numel() != expected:
            raise CodecError(f"{self.name}: payload has {payload.numel()} bytes, {numel} elements need {expected}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise CodecError(f"{self.name}: dtype must be a floating torch.dtype, got {dtype!r}")
        if numel == 0:
            return torch.empty(0, dtype=dtype, device=payload.device)
        out = self._decode(payload.contiguous(), numel)
        return out if out.dtype == dtype else out.to(dtype)

    # -- helpers for subclasses -------------------------------------------------------------

    @abstractmethod
    def _encode(self, flat: Tensor, name: str | None) -> Tensor: ...

    @abstractmethod
    def _decode(self, payload: Tensor, numel: int) -> Tensor: ...

    def _check_finite(self, amax: Tensor, flat: Tensor, name: str | None) -> None:
        """Raise NonFiniteError if ``amax`` (NaN-propagating max |x|, any shape) is not all finite."""
        if self.nonfinite == "raise" and not bool(torch.isfinite(amax).all()):
            raise NonFiniteError(self.name, name, int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum()))


def _check_numel(numel: int) -> int:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise CodecError(f"numel must be a non-negative int, got {numel!r}")
    return numel


def _abs_max(mn: Tensor, mx: Tensor) -> Tensor:
    """max |x| from aminmax's min and max (NaN propagates)."""
    return torch.maximum(mn.neg(), mx)


def _scale_from_amax(amax: Tensor, fmt_max: float) -> Tensor:
    """``amax / fmt_max``; 1 where that is 0 (all-zero group); NaN where amax is not finite."""
    scale = amax / fmt_max
    scale = torch.where(scale > 0, scale, 1.0)
    return torch.where(torch.isfinite(amax), scale, math.nan)


def _as_float32(raw: Tensor) -> Tensor:
    """View uint8 bytes as float32 (copies first when the slice is not 4-byte aligned)."""
    if raw.storage_offset() % 4:
        raw = raw.clone()
    return raw.view(torch.float32)


@dataclass(frozen=True)
class Float32Codec(Codec):
    """Identity baseline: the float32 bytes, ``4 * numel`` bytes on the wire."""

    @property
    def name(self) -> str:
        return "fp32"

    def nbytes(self, numel: int) -> int:
        return 4 * _check_numel(numel)

    def _encode(self, flat: Tensor, name: str | None) -> Tensor:
        out = torch.empty(4 * flat.numel(), dtype=torch.uint8, device=flat.device)
        if flat.numel() and self.nonfinite == "raise":
            mn, mx = torch.aminmax(flat)
            self._check_finite(_abs_max(mn, mx), flat, name)
        out.view(torch.float32).copy_(flat)
        return out

    def _decode(self, payload: Tensor, numel: int) -> Tensor:
        return _as_float32(payload).clone()


@dataclass(frozen=True)
class FP8Codec(Codec):
    """OCP FP8 (E4M3 or E5M2) with an FP32 scale per tensor or per block.

    Parameters
    ----------
    fmt : {"e4m3", "e5m2"}
        E4M3 (``torch.float8_e4m3fn``, max 448, 3 mantissa bits) or E5M2 (``torch.float8_e5m2``,
        max 57344, 2 mantissa bits).
    block_size : int or None
        None: one scale for the whole tensor (``4 + n`` bytes). An int ``B >= 1``: one scale per
        ``B`` consecutive elements of the flattened tensor, the last block possibly shorter
        (``4 * ceil(n / B) + n`` bytes).
    nonfinite : {"raise", "propagate"}, keyword only
        See the module docstring.

    Raises
    ------
    CodecError
        Unknown ``fmt`` or a ``block_size`` that is not a positive int.
    """

    fmt: str = "e4m3"
    block_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fmt not in _FP8_FORMATS:
            raise CodecError(f"fmt must be one of {tuple(_FP8_FORMATS)}, got {self.fmt!r}")
        bs = self.block_size
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
            raise CodecError(f"block_size must be None or a positive int, got {bs!r}")

    @property
    def name(self) -> str:
        return f"fp8_{self.fmt}" + (f"_b{self.block_size}" if self.block_size is not None else "")

    @property
    def dtype(self) -> torch.dtype:
        """The torch float8 dtype of the codes."""
        return _FP8_FORMATS[self.fmt][0]

    @property
    def fmt_max(self) -> float:
        """Largest finite magnitude of the format (448 or 57344)."""
        return _FP8_FORMATS[self.fmt][1]

    def num_scales(self, numel: int) -> int:
        """How many FP32 scales ``numel`` elements carry (1 per tensor, or ``ceil(numel / block_size)``)."""
        _check_numel(numel)
        return 1 if self.block_size is None else -(-numel // self.block_size)

    def nbytes(self, numel: int) -> int:
        return 4 * self.num_scales(numel) + numel

    def _encode(self, flat: Tensor, name: str | None) -> Tensor:
        n, fmax = flat.numel(), self.fmt_max
        ns = self.num_scales(n)
        out = torch.empty(4 * ns + n, dtype=torch.uint8, device=flat.device)
        if n == 0:
            if ns:
                out.view(torch.float32).fill_(1.0)
            return out
        if self.block_size is None:
            mn, mx = torch.aminmax(flat)
            amax = _abs_max(mn, mx)
            self._check_finite(amax, flat, name)
            scale = _scale_from_amax(amax, fmax)
            scaled = torch.div(flat, scale).clamp_(-fmax, fmax)
        else:
            rows, owned = _blocks(flat, ns, self.block_size)
            mn, mx = torch.aminmax(rows, dim=1)
            amax = _abs_max(mn, mx)
            self._check_finite(amax, flat, name)
            scale = _scale_from_amax(amax, fmax)
            rows = rows.div_(scale.unsqueeze(1)) if owned else torch.div(rows, scale.unsqueeze(1))
            scaled = rows.clamp_(-fmax, fmax).view(-1)[:n]
        out[: 4 * ns].view(torch.float32).copy_(scale.reshape(-1))
        out[4 * ns :].view(self.dtype).copy_(scaled)
        return out

    def _decode(self, payload: Tensor, numel: int) -> Tensor:
        ns = self.num_scales(numel)
        scale = _as_float32(payload[: 4 * ns])
        out = torch.empty(numel, dtype=torch.float32, device=payload.device)
        out.copy_(payload[4 * ns :].view(self.dtype))
        if self.block_size is None:
            return out.mul_(scale)
        full = numel // self.block_size
        if full:
            out[: full * self.block_size].view(full, self.block_size).mul_(scale[:full].unsqueeze(1))
        if full < ns:
            out[full * self.block_size :].mul_(scale[full])
        return out


_PAIR_LUTS: dict[torch.device, Tensor] = {}


def _e2m1_pair_lut(device: torch.device) -> Tensor:
    """(256, 2) float32: the two E2M1 values (low nibble, high nibble) of every packed byte."""
    lut = _PAIR_LUTS.get(device)
    if lut is None:
        signed = [(-1.0 if c & 8 else 1.0) * E2M1_VALUES[c & 7] for c in range(16)]
        lut = torch.tensor([[signed[b & 15], signed[b >> 4]] for b in range(256)], dtype=torch.float32, device=device)
        _PAIR_LUTS[device] = lut
    return lut


def _e2m1_codes_(y: Tensor) -> Tensor:
    """4-bit E2M1 codes (uint8, sign in bit 3) of float32 ``y`` already clamped to [-6, 6]; overwrites ``y``.

    Round to nearest, ties to the even code, done by the FPU: for a magnitude whose E2M1 exponent is
    ``e`` (0 below 2, 1 in [2, 4), 2 in [4, 6]) the grid step is ``2**(e-1)``, and adding
    ``C = 2**(22+e)`` (whose float32 ulp is that step) rounds the magnitude onto the grid with
    IEEE round-half-even. The sum keeps ``C``'s exponent field ``149 + e``, and its mantissa field is
    the step count ``k``; the code is ``k + 2e``. Step counts and codes have the same parity, so ties
    go to the even code.
    """
    sign = torch.signbit(y)
    bits = y.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # y now holds |y|
    tmp = (bits >> 23).sub_(127).clamp_(0, 2).add_(149).bitwise_left_shift_(23)  # bits of C
    y.add_(tmp.view(torch.float32))
    torch.bitwise_right_shift(bits, 23, out=tmp)
    tmp.sub_(149).bitwise_left_shift_(1)  # 2e
    code = bits.bitwise_and_(0x7FFFFF).add_(tmp).to(torch.uint8)
    code.bitwise_and_(7)  # a no-op except for NaN input (whose block decodes to NaN anyway)
    return code.bitwise_or_(sign.to(torch.uint8).bitwise_left_shift_(3))


def _blocks(flat: Tensor, num_blocks: int, block_size: int) -> tuple[Tensor, bool]:
    """``flat`` as (num_blocks, block_size) rows, zero-padded; True when the rows are a fresh buffer."""
    n = flat.numel()
    if n == num_blocks * block_size:
        return flat.view(num_blocks, block_size), False
    buf = torch.empty(num_blocks * block_size, dtype=torch.float32, device=flat.device)
    buf[:n].copy_(flat)
    buf[n:].zero_()
    return buf.view(num_blocks, block_size), True


@dataclass(frozen=True)
class NVFP4Codec(Codec):
    """NVIDIA NVFP4: E2M1 values in blocks of 16, an E4M3 scale per block, an FP32 scale per tensor.

    ``4 + 9 * ceil(n / 16)`` bytes for ``n`` elements (4.5 bits per element plus 4 bytes), see the
    module docstring for the scaling rule and the byte layout.

    Parameters
    ----------
    nonfinite : {"raise", "propagate"}, keyword only
        See the module docstring (with ``"propagate"``, a non-finite value makes the whole tensor NaN).
    """

    block_size = 16  # class constant, not a field: NVFP4 fixes it

    @property
    def name(self) -> str:
        return "nvfp4"

    def num_blocks(self, numel: int) -> int:
        """``ceil(numel / 16)``."""
        return -(-_check_numel(numel) // self.block_size)

    def nbytes(self, numel: int) -> int:
        return 4 + 9 * self.num_blocks(numel)

    def _encode(self, flat: Tensor, name: str | None) -> Tensor:
        n, nb = flat.numel(), self.num_blocks(flat.numel())
        out = torch.empty(4 + 9 * nb, dtype=torch.uint8, device=flat.device)
        if n == 0:
            out.view(torch.float32).fill_(1.0)
            return out
        rows, owned = _blocks(flat, nb, self.block_size)
        mn, mx = torch.aminmax(rows, dim=1)
        block_amax = _abs_max(mn, mx)
        amax = block_amax.max()
        self._check_finite(amax, flat, name)
        global_scale = _scale_from_amax(amax, _E2M1_MAX * _E4M3_MAX)
        block_scale = (block_amax / _E2M1_MAX).div_(global_scale).clamp_(max=_E4M3_MAX).to(torch.float8_e4m3fn)
        effective = block_scale.to(torch.float32).mul_(global_scale)
        # dead blocks (scale 0: all zeros, or underflowed) and NaN scales get zero codes
        divisor = torch.where(effective > 0, effective, math.inf).unsqueeze(1)
        rows = rows.div_(divisor) if owned else torch.div(rows, divisor)
        codes = _e2m1_codes_(rows.clamp_(-_E2M1_MAX, _E2M1_MAX).view(-1)).view(nb * 8, 2)
        out[:4].view(torch.float32).copy_(global_scale.reshape(1))
        out[4 : 4 + nb].copy_(block_scale.view(torch.uint8))
        torch.bitwise_or(codes[:, 0], codes[:, 1].bitwise_left_shift(4), out=out[4 + nb :])
        return out

    def _decode(self, payload: Tensor, numel: int) -> Tensor:
        nb = self.num_blocks(numel)
        global_scale = _as_float32(payload[:4])
        effective = payload[4 : 4 + nb].view(torch.float8_e4m3fn).to(torch.float32).mul_(global_scale)
        values = torch.index_select(_e2m1_pair_lut(payload.device), 0, payload[4 + nb :].to(torch.int32))
        values = values.view(nb, self.block_size).mul_(effective.unsqueeze(1))
        return values.view(-1)[:numel]


@dataclass(frozen=True)
class BF16Codec(Codec):
    """bfloat16 (8 exponent, 7 mantissa bits; round to nearest even by ``Tensor.to``): ``2 * numel`` bytes,
    no scale (bfloat16 has float32's range). Relative error per element at most ``2^-8``; the same
    bytes as two FP8 payloads, far lower error: the honest comparison for GIFT-FP8's side bytes."""

    @property
    def name(self) -> str:
        return "bf16"

    def nbytes(self, numel: int) -> int:
        return 2 * _check_numel(numel)

    def _encode(self, flat: Tensor, name: str | None) -> Tensor:
        if flat.numel() and self.nonfinite == "raise":
            mn, mx = torch.aminmax(flat)
            self._check_finite(_abs_max(mn, mx), flat, name)
        return flat.to(torch.bfloat16).view(torch.uint8).clone()

    def _decode(self, payload: Tensor, numel: int) -> Tensor:
        raw = payload.clone() if payload.storage_offset() % 2 else payload
        return raw.view(torch.bfloat16).to(torch.float32)


_FP8_NAME = re.compile(r"fp8_(e4m3|e5m2)(?:_b([1-9][0-9]*))?")


def get_codec(name: str, *, nonfinite: str = "raise") -> Codec:
    """The codec called ``name``.

    Parameters
    ----------
    name : str
        ``"fp32"``, ``"nvfp4"``, ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (per-tensor scale) or
        ``"fp8_<fmt>_b<N>"`` (one scale per ``N`` elements, e.g. ``"fp8_e4m3_b128"``). See :data:`CODECS`.
    nonfinite : {"raise", "propagate"}
        Passed to the codec.

    Raises
    ------
    CodecError
        Unknown name.
    """
    if name == "fp32":
        return Float32Codec(nonfinite=nonfinite)
    if name == "nvfp4":
        return NVFP4Codec(nonfinite=nonfinite)
    if name == "bf16":
        return BF16Codec(nonfinite=nonfinite)
    match = _FP8_NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise CodecError(f"unknown codec {name!r}; known: {', '.join(CODECS)} (or fp8_<e4m3|e5m2>_b<block size>)")
    block = int(match.group(2)) if match.group(2) else None
    return FP8Codec(match.group(1), block, nonfinite=nonfinite)
