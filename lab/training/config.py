"""Typed settings of a training run's gradient communication and optimizer (the ``comm`` and ``optimizer``
fields of :class:`lab.training.run.TrainConfig`): pydantic discriminated unions, frozen and validated,
instead of a name plus a free ``dict`` of keywords.

``CommSpec`` is one of :class:`Fp32Comm`, :class:`CodecComm` (``"bf16"``, ``"fp8"``, ``"fp8_ef"``,
``"nvfp4"``) or :class:`GiftComm` (``"gift_fp8"``, ``"gift_nvfp4"``, with a
:class:`~lab.training.comm.gift.GiftConfig`), told apart by ``hook`` (a name of
:data:`lab.training.comm.hooks.HOOKS`); ``OptimizerSpec`` is one of :class:`AdamWOptimizer`,
:class:`AdamSOptimizer` or :class:`ScapeOptimizer` (with a :class:`~lab.training.optim.scape.ScapeConfig`),
told apart by ``name``. Each spec's :meth:`~_Spec.kwargs` is the flat keyword dict earlier configs held
(``comm_kwargs`` / ``optimizer_kwargs``): only the settings given, so a config written before these types
existed reads back with the same checkpoint fingerprint.

>>> CodecComm(hook="fp8", fmt="e5m2").kwargs()
{'fmt': 'e5m2'}
>>> comm_from_name("gift_fp8", {"damping": 1.0, "measure_error": True}).gift.damping
1.0

Bad input raises pydantic's :class:`~pydantic.ValidationError` (a ``ValueError``) whose location names the
field (``comm.fp8.block_size``, ``optimizer.scape.scape.sparsity``); unknown keys are refused
(``extra="forbid"``).
"""

from __future__ import annotations

import math
import warnings
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lab.training.comm.gift import GiftConfig
from lab.training.optim.scape import ScapeConfig

__all__ = ["AdamSOptimizer", "AdamWOptimizer", "CodecComm", "CommSpec", "Fp32Comm", "GiftComm", "OptimizerSpec",
           "ScapeOptimizer", "comm_from_name", "optimizer_from_name"]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tag: ClassVar[str] = "hook"  # the discriminator field
    nested: ClassVar[str | None] = None  # the field holding a nested config flattened into kwargs()

    @model_validator(mode="before")
    @classmethod
    def _flat_nested(cls, data: Any) -> Any:
        """Settings of the nested config given flat (``damping=...``, ``sparsity=...``) are moved into it."""
        if cls.nested is None:
            return data
        return _nest(data, cls.nested, cls.model_fields[cls.nested].annotation.model_fields)

    def kwargs(self) -> dict[str, Any]:
        """The settings given (not defaults), flat: the earlier ``comm_kwargs`` / ``optimizer_kwargs`` form
        (a nested GIFT / SCAPE config's given fields are merged in at the top level)."""
        tag, nested = self.tag, self.nested
        out = {k: getattr(self, k) for k in self.model_fields_set if k not in (tag, nested)}
        if nested is not None:
            inner = getattr(self, nested)
            out.update({k: getattr(inner, k) for k in inner.model_fields_set})
        return out


def _nest(data: Any, nested: str, fields: dict) -> Any:
    """Before-validation: move the keys that are fields of the nested config into ``data[nested]``."""
    if not isinstance(data, dict) or nested in data and not any(k in fields for k in data):
        return data
    data = dict(data)
    inner = dict(data.pop(nested, None) or {})
    if "rank" in data and "rank" not in fields:  # GIFT's deprecated alias of n_eigenpairs (earlier comm_kwargs)
        warnings.warn("comm setting rank=... is deprecated: the eigenpairs kept are n_eigenpairs=...", DeprecationWarning,
                      stacklevel=4)
        inner.setdefault("n_eigenpairs", data.pop("rank"))
    for k in [k for k in data if k in fields]:
        inner[k] = data.pop(k)
    data[nested] = inner
    return data


# -- gradient communication ---------------------------------------------------------------------------


class Fp32Comm(_Spec):
    """The fp32 all-reduce (:func:`lab.training.comm.hooks.fp32_hook`), bit-identical to DDP's default."""

    hook: Literal["fp32"] = "fp32"


class CodecComm(_Spec):
    """A Euclidean low-precision hook (:class:`lab.training.comm.hooks.CodecHookState`).

    Attributes
    ----------
    hook : {"bf16", "fp8", "fp8_ef", "nvfp4"}
    fmt : {"e4m3", "e5m2"}, optional
        FP8 element format (``"fp8"`` / ``"fp8_ef"`` only; hook default ``"e4m3"``).
    block_size : int, optional
        Per-block FP8 scales of this many elements (``"fp8"`` / ``"fp8_ef"`` only).
    error_feedback : bool
        Wrap the hook in :func:`~lab.training.comm.hooks.error_feedback_wrapper` (``"nvfp4"``, ``"bf16"``;
        ``"fp8_ef"`` always has it).
    measure_error : bool
        Wrap it in :func:`~lab.training.comm.hooks.measure_error_wrapper` (relative errors in the records).
    nonfinite : {"raise", "propagate"}
        What the codec does with NaN / inf gradients.
    """

    hook: Literal["bf16", "fp8", "fp8_ef", "nvfp4"]
    fmt: Literal["e4m3", "e5m2"] | None = None
    block_size: int | None = Field(default=None, ge=1)
    error_feedback: bool = False
    measure_error: bool = False
    nonfinite: Literal["raise", "propagate"] = "raise"

    @model_validator(mode="after")
    def _fits_the_hook(self) -> CodecComm:
        fp8 = self.hook in ("fp8", "fp8_ef")
        if not fp8 and (self.fmt is not None or self.block_size is not None):
            raise ValueError(f"fmt / block_size are settings of the fp8 hooks, not of {self.hook!r}")
        if fp8 and "error_feedback" in self.model_fields_set:
            raise ValueError(f"error_feedback is not a setting of {self.hook!r} (use hook 'fp8_ef')")
        return self


class GiftComm(_Spec):
    """The GIFT hook (:class:`lab.training.comm.hooks.GiftHookState`, arXiv 2607.07494).

    Attributes
    ----------
    hook : {"gift_fp8", "gift_nvfp4"}
    fmt, block_size
        As :class:`CodecComm` (``"gift_fp8"`` only).
    measure_error : bool
        GIFT's own per-layer measurement (``GiftHookState(measure_error=True)``).
    nonfinite : {"raise", "propagate"}
    gift : GiftConfig
        The GIFT settings; given flat (``damping=...``), they are moved here.
    """

    hook: Literal["gift_fp8", "gift_nvfp4"]
    fmt: Literal["e4m3", "e5m2"] | None = None
    block_size: int | None = Field(default=None, ge=1)
    measure_error: bool = False
    nonfinite: Literal["raise", "propagate"] = "raise"
    gift: GiftConfig = Field(default_factory=GiftConfig)

    nested: ClassVar[str | None] = "gift"

    @model_validator(mode="after")
    def _fits_the_hook(self) -> GiftComm:
        if self.hook == "gift_nvfp4" and (self.fmt is not None or self.block_size is not None):
            raise ValueError("fmt / block_size are settings of gift_fp8, not of gift_nvfp4")
        return self

    def hook_kwargs(self) -> dict[str, Any]:
        """Keywords of :func:`~lab.training.comm.hooks.get_hook` (the GIFT settings as ``config=``)."""
        out = {k: getattr(self, k) for k in self.model_fields_set if k not in ("hook", "gift")}
        return {**out, "config": self.gift}


CommSpec = Annotated[Fp32Comm | CodecComm | GiftComm, Field(discriminator="hook")]


def comm_from_name(hook: str, kwargs: dict[str, Any] | None = None) -> Fp32Comm | CodecComm | GiftComm:
    """The typed spec of hook ``hook`` with the flat keywords ``kwargs`` (the earlier ``comm`` / ``comm_kwargs``).

    Raises
    ------
    pydantic.ValidationError
        Unknown hook (tag ``hook``) or a bad / unknown setting (its location names the field).
    """
    from pydantic import TypeAdapter

    return TypeAdapter(CommSpec).validate_python({**(kwargs or {}), "hook": hook})


# -- optimizer ----------------------------------------------------------------------------------------


def _betas(v: Any) -> Any:
    if isinstance(v, (tuple, list)) and len(v) == 2:
        for i, b in enumerate(v):
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
                raise ValueError(f"betas[{i}] must be a number in [0, 1), got {b!r}")
    return v


class _AdamLike(_Spec):
    tag: ClassVar[str] = "name"

    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, ge=0)

    @field_validator("betas", mode="before")
    @classmethod
    def _check_betas(cls, v: Any) -> Any:
        return _betas(v)

    @field_validator("eps")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v!r}")
        return v


class AdamWOptimizer(_AdamLike):
    """:class:`torch.optim.AdamW` (``betas`` default ``(0.9, 0.999)`` as torch's)."""

    name: Literal["adamw"] = "adamw"
    betas: tuple[float, float] = (0.9, 0.999)
    amsgrad: bool = False


class AdamSOptimizer(_AdamLike):
    """:class:`lab.training.optim.AdamS` (arXiv 2505.16363)."""

    name: Literal["adams"] = "adams"
    bias_correction: bool = True


class ScapeOptimizer(_AdamLike):
    """:class:`lab.training.optim.SCAPE` (arXiv 2607.01678): AdamS hyper-parameters plus a
    :class:`~lab.training.optim.scape.ScapeConfig` (``scape``; given flat, e.g. ``sparsity=0.9``, the
    options are moved there). ``history``: step statistics kept."""

    name: Literal["scape"] = "scape"
    bias_correction: bool = True
    history: int = Field(default=10000, ge=1)
    scape: ScapeConfig = Field(default_factory=ScapeConfig)

    nested: ClassVar[str | None] = "scape"

    def optimizer_kwargs(self, seed: int) -> dict[str, Any]:
        """Keywords of :class:`~lab.training.optim.SCAPE` besides params and lr: the given AdamS ones and
        ``config=`` (its ``seed`` the run's ``seed`` unless one was given)."""
        out = {k: getattr(self, k) for k in self.model_fields_set if k not in ("name", "scape")}
        cfg = self.scape if "seed" in self.scape.model_fields_set else self.scape.model_copy(update={"seed": seed})
        return {**out, "config": cfg}


OptimizerSpec = Annotated[AdamWOptimizer | AdamSOptimizer | ScapeOptimizer, Field(discriminator="name")]


def optimizer_from_name(name: str, kwargs: dict[str, Any] | None = None) -> AdamWOptimizer | AdamSOptimizer | ScapeOptimizer:
    """The typed spec of optimizer ``name`` with the flat keywords ``kwargs`` (the earlier
    ``optimizer`` / ``optimizer_kwargs``). Raises :class:`pydantic.ValidationError` naming the field."""
    from pydantic import TypeAdapter

    return TypeAdapter(OptimizerSpec).validate_python({**(kwargs or {}), "name": name})
