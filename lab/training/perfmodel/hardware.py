"""Hardware description files: what a GPU node can do, each number with its unit and provenance.

A file (TOML, in ``lab/training/perfmodel/hardware/`` for the shipped ones) gives the node's GPUs per
node, peak FLOP/s per precision, memory bandwidth and capacity, and the intra-node (GPU-GPU) and
inter-node link bandwidth and latency. Every number is a table ``{value, unit, source, ref}``:
``source`` is ``"spec"`` (a vendor or site specification, ``ref`` names it), ``"measured"`` (``ref``
says how and where) or ``"estimate"`` (neither: e.g. a latency no datasheet states; ``ref`` says what it
is based on). Shipped files: ``perlmutter_a100`` (NERSC Perlmutter GPU node, 4x A100-SXM4-40GB) and
``vista_gh200`` (TACC Vista GH200 node, 1 GPU per node), as in Zhang et al., arXiv 2509.22832, Sec. IV.

Units: FLOP/s, B/s (per direction, per GPU), B, s. Bandwidths are per GPU and direction: for the
inter-node link, a node's injection bandwidth divided among its GPUs.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lab.training.errors import HardwareFileError

__all__ = ["Hardware", "Link", "load_hardware", "available_hardware", "HARDWARE_DIR"]

HARDWARE_DIR = Path(__file__).with_name("hardware")

Source = Literal["spec", "measured", "estimate"]


class _Quantity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float
    source: Source
    ref: str = Field(min_length=1)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class FlopRate(_Quantity):
    value: float = Field(gt=0)
    unit: Literal["FLOP/s"]


class ByteRate(_Quantity):
    value: float = Field(gt=0)
    unit: Literal["B/s"]


class Bytes(_Quantity):
    value: float = Field(gt=0)
    unit: Literal["B"]


class Seconds(_Quantity):
    value: float = Field(ge=0)
    unit: Literal["s"]


class PeakFlops(BaseModel):
    """Dense peak FLOP/s per precision: ``fp32`` is the vector (CUDA-core) rate, ``tf32`` / ``bf16`` /
    ``fp16`` the tensor-core rates without sparsity."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fp32: FlopRate
    tf32: FlopRate
    bf16: FlopRate
    fp16: FlopRate


class Link(BaseModel):
    """A link tier: ``bandwidth`` (B/s per GPU and direction, alpha-beta's 1/beta) and ``latency`` (s, alpha)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bandwidth: ByteRate
    latency: Seconds


class Links(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    intra_node: Link | None = None
    inter_node: Link


class Hardware(BaseModel):
    """One node type.

    Attributes
    ----------
    name, system : str
    gpus_per_node : int
    peak_flops : PeakFlops
    memory_bandwidth : ByteRate
        Device (HBM) bandwidth, B/s.
    memory_capacity : Bytes
    links : Links
        ``intra_node`` (required when ``gpus_per_node > 1``) and ``inter_node``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    system: str = Field(min_length=1)
    gpus_per_node: int = Field(ge=1)
    peak_flops: PeakFlops
    memory_bandwidth: ByteRate
    memory_capacity: Bytes
    links: Links

    @field_validator("links")
    @classmethod
    def _intra_needed(cls, links: Links, info) -> Links:
        if info.data.get("gpus_per_node", 1) > 1 and links.intra_node is None:
            raise ValueError("links.intra_node is required when gpus_per_node > 1")
        return links

    def peak(self, precision: str, matmul: bool) -> float:
        """FLOP/s of a matmul in ``precision`` (tensor cores; ``fp32`` = CUDA cores) or of a vector op (fp32)."""
        return getattr(self.peak_flops, precision if matmul else "fp32").value

    def link(self, group_size: int, group_stride: int) -> Link:
        """The tier a group of ``group_size`` ranks ``group_stride`` apart uses (ranks packed node by node):
        intra-node when ``group_size * group_stride <= gpus_per_node``, else inter-node."""
        if group_size * group_stride <= self.gpus_per_node and self.links.intra_node is not None:
            return self.links.intra_node
        return self.links.inter_node


def available_hardware() -> list[str]:
    """Names of the shipped hardware files (``load_hardware(name)``)."""
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.toml"))


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Read and validate a hardware file.

    Parameters
    ----------
    name_or_path : str or Path
        A shipped name (``"perlmutter_a100"``, see :func:`available_hardware`) or a TOML file's path.

    Returns
    -------
    Hardware

    Raises
    ------
    HardwareFileError
        The file is missing or not valid TOML (``field`` None, TOML's line and column in the message), or
        a field is missing, negative (zero for rates), not finite, of the wrong unit or unknown:
        ``field`` is its dotted path, e.g. ``"links.inter_node.bandwidth.value"``.
    """
    p = Path(name_or_path)
    if p.suffix != ".toml" and not p.exists():
        p = HARDWARE_DIR / f"{name_or_path}.toml"
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HardwareFileError(str(p), None, f"no such hardware file (shipped: {', '.join(available_hardware())})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HardwareFileError(str(p), None, f"cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise HardwareFileError(str(p), None, f"not valid TOML: {exc}") from exc
    try:
        return Hardware.model_validate(raw)
    except ValidationError as exc:
        errs = exc.errors()
        loc = ".".join(str(x) for x in errs[0]["loc"])
        detail = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {'missing' if e['type'] == 'missing' else e['msg']}"
                           for e in errs)
        raise HardwareFileError(str(p), loc, detail) from None
