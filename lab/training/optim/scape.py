"""SCAPE: AdamS with extreme sparse gradient communication, masks from the first moment.

Source: M. Zheng, J. Chen, H. Xie, Z. Zhang, "SCAPE: Accurate and Efficient LLM Training with
Extreme Sparse Communication", arXiv 2607.01678, §4 (method: optimizer-aware first-moment masks,
one-step-delayed refreshed synchronization, sharding-aligned mask ownership, reconstruction from
one synchronized sparse buffer). The full text is not available to us; what is fixed by the
abstract and what is our inference is listed in ``../shared/notes/papers-scape.md`` §2 and §5, and
the traps found in a small check are in ``../shared/notes/comm-check.md``. The base optimizer is
AdamS (:mod:`lab.training.optim.adams`).

How it runs (one :class:`SCAPE` per rank; every rank holds a full, non-DDP model replica and calls a
plain ``loss.backward()``; SCAPE performs the only gradient collective)::

    step t (sparse):  wait for the mask sync launched at the end of step t-1 (it overlapped the
                      forward/backward of step t)                          -> mask M_t (k coords)
                      values = (g_local [+ residual])[M_t]                 (k values, packed densely)
                      all_reduce(values) / world_size                      the ONE gradient collective
                      AdamS on the k coordinates of M_t only; the other n-k coordinates are frozen
                      (parameter, m and weight decay untouched)
                      M_{t+1} = top-k |m_t| over the segments this rank owns (+ exploration)
                      async all_gather of the owned masks                  overlaps step t+1's compute
    steps 1..dense_steps: dense all_reduce of the n gradient values, dense AdamS (no mask exists yet).

Why these choices:

* Masks from ``m`` (the AdamS first moment), not raw gradients: ``m`` is temporally stable, so a mask
  one step old is still good (paper §4).
* AdamS needs only ``m_{t-1}`` (local, replicated) and ``g_t**2`` for its denominator, so the averaged
  sparse gradient values rebuild both the momentum and the second-moment term: no second collective
  (papers-scape.md §1). Plain Adam would need ``mean(g**2)``, which differs from ``mean(g)**2``.
* Unmasked coordinates are frozen. Treating them as zero gradient (``unmasked="zero_grad"``, kept to
  reproduce the trap) leaves ``v = beta2 m**2`` so each keeps moving by about
  ``lr * sqrt(beta1**2 / beta2) * sign(m) ~ 0.92 lr sign(m)`` every step (comm-check.md).
* Because every rank applies the same update from the same all-reduced values, parameters and ``m``
  stay bit-identical across ranks, so after the mask sync every rank holds the same mask and no
  indices travel with the values.

Mask ownership and sync (``mask_sync``):

* ``"all_gather"`` (default, SCAPE's partitioned mask generation): the flat parameter vector (the
  parameters in ``param_groups`` order, flattened and concatenated) is divided into one contiguous
  range per rank, like a ZeRO optimizer shard. With ``scope="tensor"`` the ranges follow tensor
  boundaries (a tensor belongs to the rank holding its midpoint, as torch's ZeroRedundancyOptimizer
  keeps whole tensors) and the top-k is taken per tensor; with ``scope="shard"`` the ranges are equal
  slices of the flat vector and the top-k is taken per slice. Each rank scores and selects only in its
  range and contributes its selection to one ``all_gather_into_tensor`` (equal-size buffers, padded),
  encoded as int32 global indices or as a bitmask of its range, whichever is smaller
  (``mask_encoding="auto"``): indices cost ``4 K_r`` bytes, a bitmask ``ceil(len_r / 8)``.
* ``"local"``: every rank computes the whole mask itself from its replicated ``m``; no mask bytes
  travel, at ``world_size`` times the selection work. Needs bit-identical ``m`` (true here).

Lock-in at 99% (comm-check.md: with a pure top-|m| mask only 2-32% of coordinates are ever selected):

* ``error_feedback=True``: each rank keeps ``residual`` (its local unsent gradient mass); it adds it to
  the next gradient, sends ``(g + r)[M]`` and keeps ``r <- (g + r)`` with ``r[M] = 0``. Under freezing,
  ``m`` of an unselected coordinate never changes, so error feedback alone does not change *which*
  coordinates are selected; combine it with ``explore`` or with ``mask_score="m_ef"``, which ranks
  by ``|beta1 m + (1 - beta1) r_owner|`` (the owner's residual; needs ``mask_sync="all_gather"``).
* ``explore=f``: in every segment ``round(f * k_seg)`` of the k slots are drawn uniformly at random
  from the coordinates not in the top-k part, from a ``torch.Generator`` seeded by
  ``(seed, step, segment)``, so every rank draws the same coordinates. ``explore=1.0`` is a uniformly
  random mask (no first-moment ranking at all).

What the benchmark found (``benchmarks/results/comm.json``, 2-layer char-GPT, 400 steps, every variant's
rate tuned on validation): at 90% the random mask beats top-|m| (validation loss 2.355 vs 2.420 at
``betas=(0.9, 0.95)``; dense AdamS 2.150), at 99% top-|m| with ``explore=0.2`` wins (2.575;
``error_feedback`` + ``mask_score="m_ef"`` 2.585, plain top-|m| 2.598, random 2.634). A smaller ``beta1``
helps the random and exploring masks most: a coordinate updated once every ``1 / (1 - sparsity)`` steps
averages ``1 / (1 - beta1)`` of its own updates in ``m``, a horizon that many times longer than dense
AdamS's. At ``beta1 = 0.5`` the random mask reaches 2.199 at 90% and the exploring mask 2.539 at 99%,
against dense AdamS 2.124 at its own best ``beta1`` (0.7): +3.6% and +19.6%. Over 1,200 steps at 90% the two masks end close (top-|m| 1.960,
random 1.983, dense 1.760). The gap is not the information lost in the unsent values: all-reducing the
dense gradient as well and keeping every coordinate's ``m`` exact (a diagnostic, no savings) while
updating only the top-10% by ``|m|`` ends at 2.53 at best (rates 1e-3, 2e-3, 8e-3), worse than the
frozen, stale ``m`` (whose mask keeps rotating). What costs is updating a tenth of the coordinates per
step. Momentum correction (each rate tuned on its own grid, near dense AdamS's) does not help: at 99%
with DGC's top-|accumulator| mask 2.552 (without momentum factor masking 2.555; 1.75% of dense bytes with
the int32 indices), against 2.539 for the exploring mask; at 90% with the random mask 2.459, against
2.199: over 400 steps, catching up on the missed updates in one lump is worse than moving by the fresh
first moment at a raised rate. Over 3,000 steps (3 seeds, ``long_run``) it is the reverse at 99%: with
momentum correction SCAPE-99 ends +2.7% [1.9, 3.5] above dense AdamS, the exploring mask +28.8%. The
``unmasked="freeze_dense_m"`` ablation (exact dense ``m``, only masked coordinates move) reaches 2.545 at
99% (no better than the frozen ``m``: the 1% update rate is the limit) and 2.069 at 90% (better than dense
AdamS's 2.124: there the unsent values are the cost).

Momentum correction (``momentum_correction=True``; Deep Gradient Compression, Lin et al., ICLR 2018,
arXiv 1712.01887, §3.2 "Momentum correction" and §3.3 "momentum factor masking", transposed from SGD's
velocity to AdamS's first moment; the transposition is ours, the paper has no normalized optimizer):
a frozen coordinate loses every update it was due while unselected. DGC keeps, on each rank ``k``, a local
velocity ``u_k`` of the local gradients and an accumulator ``v_k`` of those velocities, sends ``v_k[M]``
and applies the sum directly, so a coordinate sent after ``tau`` steps moves by the ``tau`` steps of
momentum it missed. Here, every step, on every rank::

    u_k <- beta1 u_k + (1 - beta1) g_k                      (the local first moment, dense)
    v_k <- v_k + u_k / c                                    (c: bias correction, below)
    values = v_k[M];  v_k[M] <- 0;  u_k[M] <- 0 with ``momentum_masking`` (DGC's momentum factor masking)
    V = all_reduce(values) / world_size,  tau = t - (step the coordinate was last updated),  m_bar = V / tau
    p[M] <- p[M] (1 - lr wd)^tau - lr V / (max(sqrt(beta2 m[M]^2 + (1 - beta2) m_bar^2), |m_bar|) + eps)
    m[M] <- m_bar

The normalizer is AdamS's with the (never communicated) global gradient ``g_t`` replaced by the mean
momentum ``m_bar`` of the gap, floored at ``|m_bar|`` so that one catch-up moves a coordinate by at most
``tau lr``, about what ``tau`` dense AdamS steps of unit-normalized momentum move it (without the floor, a
coordinate whose last ``m`` was small takes a lump of up to ``tau lr / sqrt(1 - beta2)``, 4.5x that);
``m`` (replicated, the mask score) holds each coordinate's ``m_bar`` of its last update. ``mask_score="accum"`` ranks instead by
DGC's own criterion, the owner's ``|v_k|`` (needs ``mask_sync="all_gather"``: accumulators differ
across ranks). With masking, ``u_k`` restarts at zero after each send, and ``c = 1 - beta1**age`` (``age``:
steps since the restart; ``1 - beta1**t`` without masking; 1 when the group has ``bias_correction=False``)
makes ``u_k / c`` an unbiased mean of the gap's gradients. The dense steps are plain AdamS. Bytes are
SCAPE's (the ``k`` values are accumulated momenta instead of gradients); memory: two more dense buffers per
rank and one int32 per coordinate. Not with ``error_feedback`` (the accumulator already keeps the unsent
mass) or ``unmasked="zero_grad"``.

:meth:`SCAPE.mask_coverage` reports the fraction of coordinates selected at least once in a sparse
step.

Byte accounting (all in bytes, per rank, per step; ``e`` is the parameters' element size, 4 for fp32):

* values: ``e * k`` per sparse step (``e * n`` per dense step): the all_reduce input buffer;
* mask: the padded ``all_gather`` input buffer of this rank, ``4 * max_r K_r`` (indices) or
  ``max_r ceil(len_r / 8)`` (bitmask), once per refresh (``mask_refresh_interval`` steps), 0 for
  ``"local"``;
* :attr:`SCAPE.bytes_sent_per_step` = values + mask / ``mask_refresh_interval`` in a steady sparse
  step; :attr:`SCAPE.dense_bytes_per_step` = ``e * n`` for the dense all_reduce it replaces.
  These are payloads, independent of the collective's algorithm and of world size (so they are
  reported even at world size 1, where nothing is sent); :class:`ScapeStepStats` also gives a ring-
  algorithm estimate of the bytes a rank puts on the network (``2 (W-1)/W`` payload for all_reduce,
  ``(W-1)`` payload for all_gather; 0 at W = 1).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, model_validator

from lab.training.errors import ScapeError  # ScapeError is defined there, re-exported here
from lab.training.optim.warmup import dgc_warmup_sparsity
from lab.training.optim.adams import OptimizerConfigError, adams_update_, validate_adams_hyperparameters

__all__ = ["SCAPE", "ScapeConfig", "ScapeError", "ScapeStepStats"]

_KEY = "scape"  # the optimizer-wide entry in ``self.state`` (a non-tensor key survives state_dict)
_INDEX_BYTES = 4  # int32 global indices on the wire
_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def _check_scape_options(o: dict[str, Any]) -> None:
    """Raise :class:`OptimizerConfigError` naming the first bad SCAPE option of ``o`` (a full option dict)."""

    def bad(param: str, req: str) -> None:
        raise OptimizerConfigError("SCAPE", param, o[param], req)

    def real(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    def integer(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not real(o["sparsity"]) or not 0.0 <= o["sparsity"] < 1.0:
        bad("sparsity", "a number in [0, 1)")
    if o["scope"] not in ("tensor", "shard"):
        bad("scope", "'tensor' or 'shard'")
    if o["mask_sync"] not in ("all_gather", "local"):
        bad("mask_sync", "'all_gather' or 'local'")
    if o["mask_encoding"] not in ("auto", "indices", "bitmask"):
        bad("mask_encoding", "'auto', 'indices' or 'bitmask'")
    if not integer(o["mask_refresh_interval"]) or o["mask_refresh_interval"] < 1:
        bad("mask_refresh_interval", "an int >= 1")
    if not integer(o["dense_steps"]) or o["dense_steps"] < 1:
        bad("dense_steps", "an int >= 1 (no first moment exists before step 1)")
    if o["unmasked"] not in ("freeze", "zero_grad", "freeze_dense_m"):
        bad("unmasked", "'freeze', 'zero_grad' or 'freeze_dense_m'")
    if o["unmasked"] == "freeze_dense_m" and o["error_feedback"]:
        bad("unmasked", "'freeze' with error_feedback=True (freeze_dense_m sends every value: nothing is left unsent)")
    if not isinstance(o["error_feedback"], bool):
        bad("error_feedback", "a bool")
    if not real(o["explore"]) or not 0.0 <= o["explore"] <= 1.0:
        bad("explore", "a number in [0, 1]")
    if o["mask_score"] not in ("m", "m_ef", "accum"):
        bad("mask_score", "'m', 'm_ef' or 'accum'")
    if o["mask_score"] == "accum" and not o["momentum_correction"]:
        bad("mask_score", "'m' unless momentum_correction=True ('accum' ranks by the momentum accumulator)")
    if o["mask_score"] == "accum" and o["mask_sync"] == "local":
        bad("mask_score", "'m' with mask_sync='local' (accumulators differ across ranks, so would masks)")
    if o["mask_score"] == "m_ef" and not o["error_feedback"]:
        bad("mask_score", "'m' unless error_feedback=True ('m_ef' ranks by the residual)")
    if o["mask_score"] == "m_ef" and o["mask_sync"] == "local":
        bad("mask_score", "'m' with mask_sync='local' (residuals differ across ranks, so would masks)")
    if not integer(o["seed"]):
        bad("seed", "an int")
    if not integer(o["sparsity_warmup"]) or o["sparsity_warmup"] < 0:
        bad("sparsity_warmup", "an int >= 0 (steps of DGC's exponential sparsity warm-up)")
    if not real(o["sparsity_warmup_factor"]) or not 0.0 < o["sparsity_warmup_factor"] < 1.0:
        bad("sparsity_warmup_factor", "a number in (0, 1)")
    if not isinstance(o["momentum_correction"], bool):
        bad("momentum_correction", "a bool")
    if not isinstance(o["momentum_masking"], bool):
        bad("momentum_masking", "a bool")
    if o["momentum_correction"] and o["error_feedback"]:
        bad("momentum_correction", "False with error_feedback=True (the momentum accumulator keeps the unsent mass)")
    if o["momentum_correction"] and o["unmasked"] != "freeze":
        bad("momentum_correction", "False unless unmasked='freeze' (the accumulator assumes frozen coordinates, updated from it alone)")


class ScapeConfig(BaseModel):
    """The validated, frozen SCAPE options (what :class:`SCAPE` takes besides the AdamS
    hyper-parameters and the accounting ones); each field is documented in :class:`SCAPE`.

    Built with :meth:`build`, a bad option raises
    :class:`~lab.training.errors.OptimizerConfigError` whose ``param`` names it (``"sparsity"``, ...);
    ``ScapeConfig(**kw)`` runs the same checks (pydantic's ``ValidationError`` wrapping that error).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    sparsity: float = 0.9
    scope: Literal["tensor", "shard"] = "tensor"
    mask_sync: Literal["all_gather", "local"] = "all_gather"
    mask_encoding: Literal["auto", "indices", "bitmask"] = "auto"
    mask_refresh_interval: int = 1
    dense_steps: int = 1
    unmasked: Literal["freeze", "zero_grad", "freeze_dense_m"] = "freeze"
    error_feedback: bool = False
    explore: float = 0.0
    mask_score: Literal["m", "m_ef", "accum"] = "m"
    seed: int = 0
    sparsity_warmup: int = 0
    sparsity_warmup_factor: float = 0.25
    momentum_correction: bool = False
    momentum_masking: bool = True

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ScapeError(f"SCAPE: unknown option(s) {unknown}; known: {', '.join(cls.model_fields)}")
            defaults = {n: f.default for n, f in cls.model_fields.items()}
            _check_scape_options({**defaults, **data})
        return data

    @classmethod
    def build(cls, **kw: Any) -> ScapeConfig:
        """``ScapeConfig(**kw)`` raising the :class:`OptimizerConfigError` (``param``: the field) or, for an
        unknown option, the :class:`ScapeError` itself rather than pydantic's wrapper."""
        try:
            return cls(**kw)
        except Exception as exc:  # pydantic wraps a validator's ValueError
            inner = getattr(exc, "errors", None)
            if inner is not None:
                ctx = (exc.errors()[0].get("ctx") or {}).get("error")
                if isinstance(ctx, (OptimizerConfigError, ScapeError)):
                    raise ctx from None
            raise


@dataclass(frozen=True)
class ScapeStepStats:
    """What one :meth:`SCAPE.step` did (sizes in bytes, times in seconds).

    Attributes
    ----------
    step : int
        1-based step number.
    dense : bool
        A dense warm-up step (all n values all-reduced).
    k : int
        Number of gradient values in the all_reduce (``n`` on dense steps).
    numel : int
        ``n``, the number of parameter coordinates.
    value_bytes : int
        Payload of the gradient all_reduce (``element_size * k``).
    mask_bytes : int
        Payload this rank contributed to the mask sync launched at the end of this step (0 when none
        was launched or ``mask_sync="local"``).
    mask_encoding : str or None
        ``"indices"``, ``"bitmask"``, ``"local"``, or None when no mask was computed this step.
    dense_bytes : int
        Payload of a dense fp all_reduce of all n values (the baseline).
    wire_bytes_estimate : float
        Ring-algorithm estimate of bytes this rank sends: ``2 (W-1)/W value_bytes + (W-1) mask_bytes``.
    comm_s : float
        Time in the gradient all_reduce (0 at world size 1).
    mask_wait_s : float
        Time blocked waiting for the previous step's mask sync (what the overlap did not hide).
    mask_compute_s : float
        Time to score, select, encode and launch the next mask.
    step_s : float
        Whole :meth:`SCAPE.step` (excluding the closure).
    mask_changed : float or None
        Fraction of this step's mask not in the previous step's mask (None without a previous mask).
    coverage : float
        :meth:`SCAPE.mask_coverage` after the step.
    """

    step: int
    dense: bool
    k: int
    numel: int
    value_bytes: int
    mask_bytes: int
    mask_encoding: str | None
    dense_bytes: int
    wire_bytes_estimate: float
    comm_s: float
    mask_wait_s: float
    mask_compute_s: float
    step_s: float
    mask_changed: float | None
    coverage: float

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for event logs and JSON)."""
        return asdict(self)


@dataclass(frozen=True)
class _Segment:
    lo: int  # global flat range [lo, hi)
    hi: int
    k_top: int
    k_explore: int
    owner: int
    pieces: tuple[tuple[int, int, int], ...]  # (param index, local start, local end)

    @property
    def k(self) -> int:
        return self.k_top + self.k_explore


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """1-D bool tensor of length L -> uint8 tensor of ceil(L/8) bytes, bit j of byte i = bits[8i+j]."""
    nbytes = (bits.numel() + 7) // 8
    padded = torch.zeros(nbytes * 8, dtype=torch.uint8)
    padded[: bits.numel()] = bits.to(torch.uint8)
    return (padded.view(nbytes, 8) * _BIT_WEIGHTS).sum(dim=1, dtype=torch.uint8)


def _unpack_bits(packed: torch.Tensor, length: int) -> torch.Tensor:
    """Inverse of :func:`_pack_bits`: uint8 bytes -> bool tensor of ``length``."""
    return ((packed.unsqueeze(1) & _BIT_WEIGHTS) != 0).view(-1)[:length]


class SCAPE(torch.optim.Optimizer):
    """Sparse-communication AdamS (SCAPE, arXiv 2607.01678 §4) for data parallelism without DDP.

    Every rank wraps the parameters of its own full model replica (identical at the start: same seed
    or a broadcast), calls ``loss.backward()`` on its own batch and then :meth:`step`, which does the
    only gradient collective. Without an initialized ``torch.distributed`` process group (or with
    world size 1) no collective runs and the same update is applied locally. See the module docstring
    for the algorithm, the mask sync and the byte accounting.

    Parameters
    ----------
    params : iterable of torch.Tensor or of dict
        Parameters or groups; groups may override ``lr``, ``betas``, ``eps``, ``weight_decay`` and
        ``bias_correction``. All parameters: floating point, one dtype, one device, contiguous.
        Their order in ``param_groups`` defines the flat vector and must be the same on every rank.
    lr, betas, eps, weight_decay, bias_correction
        AdamS hyper-parameters (:class:`~lab.training.optim.adams.AdamS`).
    sparsity : float, default 0.9
        Fraction of coordinates NOT communicated per sparse step, in ``[0, 1)``. Each segment selects
        ``k_seg = max(1, round((1 - sparsity) * len))`` coordinates; ``k = sum k_seg``.
    scope : {"tensor", "shard"}, default "tensor"
        Top-k per parameter tensor, or per rank's equal slice of the flat vector.
    mask_sync : {"all_gather", "local"}, default "all_gather"
        Partitioned mask generation plus an async all_gather, or every rank computes the whole mask.
    mask_encoding : {"auto", "indices", "bitmask"}, default "auto"
        Wire format of the mask all_gather (ignored for ``"local"``).
    mask_refresh_interval : int, default 1
        Recompute (and sync) the mask every this many steps; in between the mask is reused.
    dense_steps : int, default 1
        Dense warm-up steps (>= 1: before step 1 there is no ``m`` to build a mask from).
    unmasked : {"freeze", "zero_grad", "freeze_dense_m"}, default "freeze"
        Frozen unmasked coordinates (SCAPE), the zero-gradient treatment (a known trap, kept for
        comparison: unmasked parameters keep drifting and weight decay applies to all), or
        ``"freeze_dense_m"``, an ablation with no savings: the whole gradient is all-reduced and ``m``
        follows dense AdamS's exactly on every coordinate, but only the masked coordinates' parameters
        move. It isolates what updating ``k`` of ``n`` coordinates per step costs from what the unsent
        values cost.
    error_feedback : bool, default False
        Keep the local unsent gradient mass and add it to the next gradient.
    explore : float, default 0.0
        Fraction of each segment's k slots drawn at random from the non-top-k coordinates, in ``[0, 1]``.
    mask_score : {"m", "m_ef", "accum"}, default "m"
        Rank by ``|m|``, by ``|beta1 m + (1 - beta1) r|`` (needs ``error_feedback`` and
        ``mask_sync="all_gather"``), or by the owner's momentum accumulator ``|v_k|`` (needs
        ``momentum_correction`` and ``mask_sync="all_gather"``).
    seed : int, default 0
        Seeds the exploration draws (identical on every rank).
    sparsity_warmup : int, default 0
        Deep Gradient Compression's warm-up (Lin et al., ICLR 2018, Sec. 3.3): over the first this many
        steps the sparsity rises exponentially to ``sparsity``
        (:func:`~lab.training.optim.warmup.dgc_warmup_sparsity`: 75%, 93.75%, 98.4375%, 99% for 0.99),
        so a step ``t`` sends ``k(t)`` values of :meth:`sparsity_at` ``(t)``; the mask is recomputed
        whenever the next step's sparsity differs from the current one. 0: off.
    sparsity_warmup_factor : float, default 0.25
        Density kept per warm-up stage, in ``(0, 1)``.
    momentum_correction : bool, default False
        DGC's momentum correction on AdamS's first moment (module docstring): each rank accumulates its
        local first moment and sends the accumulated values, so a coordinate catches up on the steps it
        was frozen for. Its learning rate sits near dense AdamS's, not SCAPE's raised one.
    momentum_masking : bool, default True
        With ``momentum_correction``: DGC's momentum factor masking, the local first moment of a sent
        coordinate restarts at zero (otherwise it keeps pushing the already-applied momentum).
    process_group : ProcessGroup, optional
        Group of the data-parallel ranks; default: the default group when initialized, else none.
    history : int, default 10000
        How many :class:`ScapeStepStats` :attr:`history` keeps.
    config : ScapeConfig, optional
        The options from ``sparsity`` to ``seed`` as one validated, frozen :class:`ScapeConfig`
        (then leave those keywords at their defaults; :class:`ScapeError` otherwise).

    Attributes
    ----------
    numel : int
        ``n``.
    k : int
        Values per sparse step.
    world_size, rank : int
    last_stats : ScapeStepStats or None
    history : collections.deque of ScapeStepStats
    last_values : torch.Tensor or None
        The averaged all-reduced buffer of the last step, shape ``(k,)`` (or ``(n,)`` dense), the
        parameters' dtype, in flat-vector order of the mask.

    Raises
    ------
    OptimizerConfigError
        (a :class:`ValueError`) naming the bad hyper-parameter.
    ScapeError
        For unsupported parameters (non-floating, mixed dtype or device, non-contiguous), sparse or
        wrongly typed gradients, :meth:`add_param_group` after construction, or an incompatible
        :meth:`load_state_dict`.

    Notes
    -----
    The last step launches a mask sync that nobody waits for: call :meth:`synchronize` before
    ``dist.destroy_process_group()``. :meth:`state_dict` synchronizes first.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        bias_correction: bool = True,
        *,
        sparsity: float = 0.9,
        scope: Literal["tensor", "shard"] = "tensor",
        mask_sync: Literal["all_gather", "local"] = "all_gather",
        mask_encoding: Literal["auto", "indices", "bitmask"] = "auto",
        mask_refresh_interval: int = 1,
        dense_steps: int = 1,
        unmasked: Literal["freeze", "zero_grad", "freeze_dense_m"] = "freeze",
        error_feedback: bool = False,
        explore: float = 0.0,
        mask_score: Literal["m", "m_ef", "accum"] = "m",
        seed: int = 0,
        sparsity_warmup: int = 0,
        sparsity_warmup_factor: float = 0.25,
        momentum_correction: bool = False,
        momentum_masking: bool = True,
        process_group: Any = None,
        history: int = 10000,
        config: ScapeConfig | None = None,
    ):
        name = type(self).__name__
        validate_adams_hyperparameters(name, lr, betas, eps, weight_decay)
        options = dict(sparsity=sparsity, scope=scope, mask_sync=mask_sync, mask_encoding=mask_encoding,
                       mask_refresh_interval=mask_refresh_interval, dense_steps=dense_steps, unmasked=unmasked,
                       error_feedback=error_feedback, explore=explore, mask_score=mask_score, seed=seed,
                       sparsity_warmup=sparsity_warmup, sparsity_warmup_factor=sparsity_warmup_factor,
                       momentum_correction=momentum_correction, momentum_masking=momentum_masking)
        if config is not None:
            if not isinstance(config, ScapeConfig):
                raise ScapeError(f"{name}: config must be a ScapeConfig, got {type(config).__name__}")
            changed = sorted(k for k, v in options.items() if v != ScapeConfig.model_fields[k].default)
            if changed:
                raise ScapeError(f"{name}: pass either config= or the SCAPE options, not both (got {changed})")
        #: the validated, frozen SCAPE options (:class:`ScapeConfig`)
        self.config = cfg = config if config is not None else ScapeConfig.build(**options)
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise OptimizerConfigError("SCAPE", "history", history, "an int >= 1")
        self.sparsity, self.scope, self.mask_sync = float(cfg.sparsity), cfg.scope, cfg.mask_sync
        self.mask_encoding_option, self.mask_refresh_interval = cfg.mask_encoding, int(cfg.mask_refresh_interval)
        self.dense_steps, self.unmasked, self.error_feedback = int(cfg.dense_steps), cfg.unmasked, bool(cfg.error_feedback)
        self.explore, self.mask_score, self.seed = float(cfg.explore), cfg.mask_score, int(cfg.seed)
        self.sparsity_warmup, self.sparsity_warmup_factor = int(cfg.sparsity_warmup), float(cfg.sparsity_warmup_factor)
        self.momentum_correction, self.momentum_masking = bool(cfg.momentum_correction), bool(cfg.momentum_masking)

        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self._pg = process_group
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0

        self._frozen_groups = False
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, bias_correction=bool(bias_correction))
        super().__init__(params, defaults)
        self._frozen_groups = True

        self._params: list[torch.Tensor] = [p for g in self.param_groups for p in g["params"]]
        self._group_of: list[dict[str, Any]] = [g for g in self.param_groups for _ in g["params"]]
        self._check_params()
        sizes = [p.numel() for p in self._params]
        self._offsets = [0]
        for s in sizes:
            self._offsets.append(self._offsets[-1] + s)
        self.numel = self._offsets[-1]
        if self.numel >= 2**31:
            raise ScapeError(f"{name}: {self.numel} coordinates do not fit int32 mask indices")
        self._offsets_t = torch.tensor(self._offsets, dtype=torch.long)
        self._element_size = self._params[0].element_size()
        self._layouts: dict[float, tuple[list[_Segment], list[int]]] = {}  # sparsity -> (segments, k per owner)
        self._segments = self._build_segments()
        self.k = sum(s.k for s in self._segments)
        self._own_lo, self._own_hi = [], []
        for r in range(self.world_size):
            mine = [s for s in self._segments if s.owner == r]
            lo = mine[0].lo if mine else (self._range_start(r))
            self._own_lo.append(lo)
            self._own_hi.append(mine[-1].hi if mine else lo)
        self._own_k = [sum(s.k for s in self._segments if s.owner == r) for r in range(self.world_size)]
        self._encoding = self._choose_encoding()

        for p in self._params:
            st = self.state[p]
            st["exp_avg"] = torch.zeros_like(p)
            if self.error_feedback:
                st["residual"] = torch.zeros_like(p)
            if self.momentum_correction:
                st["local_exp_avg"] = torch.zeros_like(p)  # u_k: this rank's first moment of its own gradients
                st["momentum_accum"] = torch.zeros_like(p)  # v_k: accumulated u_k since the coordinate was last sent
        self.state[_KEY] = {
            "step": 0,
            "mask": None,  # global sorted int64 indices used at the last step (None: dense / none yet)
            "next_mask": None,  # the mask the next step uses
            "ever_selected": torch.zeros(self.numel, dtype=torch.bool),
            "config": self._config(),
        }
        if self.momentum_correction:  # the step each coordinate was last updated (replicated: masks are)
            self.state[_KEY]["last_update"] = torch.zeros(self.numel, dtype=torch.int32)
        self._pending: tuple[Any, torch.Tensor, torch.Tensor] | None = None  # (work, input, output)
        self._pending_own_k: list[int] = self._own_k  # k per owner of the mask in flight
        self._ever_count: int | None = None
        self._in_mask: torch.Tensor | None = None
        self.last_stats: ScapeStepStats | None = None
        self.last_values: torch.Tensor | None = None
        self.history: deque[ScapeStepStats] = deque(maxlen=int(history))

    # ------------------------------------------------------------------ validation and layout
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group at construction (torch semantics, validated); refused afterwards.

        Raises
        ------
        ScapeError
            After construction: the flat layout, segments and mask are fixed.
        """
        if getattr(self, "_frozen_groups", False):
            raise ScapeError("SCAPE: parameter groups cannot be added after construction (the flat layout is fixed)")
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        validate_adams_hyperparameters(type(self).__name__, g["lr"], g["betas"], g["eps"], g["weight_decay"])
        if not isinstance(g["bias_correction"], bool):
            raise OptimizerConfigError(type(self).__name__, "bias_correction", g["bias_correction"], "a bool")

    def _check_params(self) -> None:
        if not self._params:
            raise ScapeError("SCAPE: got no parameters")
        p0 = self._params[0]
        for i, p in enumerate(self._params):
            if not p.is_floating_point():
                raise ScapeError(f"SCAPE: parameter {i} is {p.dtype}; parameters must be floating point")
            if p.dtype != p0.dtype or p.device != p0.device:
                raise ScapeError(
                    f"SCAPE: parameter {i} is {p.dtype} on {p.device}, parameter 0 {p0.dtype} on {p0.device}; "
                    "one dtype and device for all (one packed values buffer)"
                )
            if not p.is_contiguous():
                raise ScapeError(f"SCAPE: parameter {i} (shape {tuple(p.shape)}) is not contiguous")

    def sparsity_at(self, step: int) -> float:
        """Sparsity of 1-based step ``step``: ``sparsity``, or its DGC warm-up value (``sparsity_warmup``)."""
        if not self.sparsity_warmup:
            return self.sparsity
        return dgc_warmup_sparsity(step, self.sparsity, self.sparsity_warmup, self.sparsity_warmup_factor)

    def _layout(self, sparsity: float) -> tuple[list[_Segment], list[int]]:
        """Segments and per-owner k at ``sparsity`` (the steady state's are :attr:`_segments`, :attr:`_own_k`)."""
        if sparsity == self.sparsity:
            return self._segments, self._own_k
        if sparsity not in self._layouts:
            segs = self._build_segments(sparsity)
            self._layouts[sparsity] = (segs, [sum(s.k for s in segs if s.owner == r) for r in range(self.world_size)])
        return self._layouts[sparsity]

    def _k_of(self, length: int, sparsity: float | None = None) -> tuple[int, int]:
        sparsity = self.sparsity if sparsity is None else sparsity
        k = max(1, min(length, round((1.0 - sparsity) * length)))
        k_exp = 0 if k >= length else min(round(self.explore * k), k)
        return k - k_exp, k_exp

    def _pieces(self, lo: int, hi: int) -> tuple[tuple[int, int, int], ...]:
        out = []
        for i in range(len(self._params)):
            a, b = self._offsets[i], self._offsets[i + 1]
            s, e = max(a, lo), min(b, hi)
            if s < e:
                out.append((i, s - a, e - a))
        return tuple(out)

    def _range_start(self, r: int) -> int:
        return r * self.numel // self.world_size

    def _build_segments(self, sparsity: float | None = None) -> list[_Segment]:
        W, n = self.world_size, self.numel
        segs = []
        if self.scope == "tensor":
            for i in range(len(self._params)):
                a, b = self._offsets[i], self._offsets[i + 1]
                if a == b:
                    continue
                owner = min(W - 1, (W * (a + b)) // (2 * n))  # the rank holding the tensor's midpoint
                kt, ke = self._k_of(b - a, sparsity)
                segs.append(_Segment(a, b, kt, ke, owner, self._pieces(a, b)))
        else:
            for r in range(W):
                a, b = self._range_start(r), self._range_start(r + 1)
                if a == b:
                    continue
                kt, ke = self._k_of(b - a, sparsity)
                segs.append(_Segment(a, b, kt, ke, r, self._pieces(a, b)))
        return segs

    def _choose_encoding(self) -> str:
        if self.mask_sync == "local":
            return "local"
        idx_bytes = _INDEX_BYTES * max(self._own_k)
        bit_bytes = max((hi - lo + 7) // 8 for lo, hi in zip(self._own_lo, self._own_hi))
        if self.mask_encoding_option == "indices":
            return "indices"
        if self.mask_encoding_option == "bitmask":
            return "bitmask"
        return "indices" if idx_bytes < bit_bytes else "bitmask"

    def _config(self) -> dict[str, Any]:
        out = dict(
            numel=self.numel, k=self.k, sparsity=self.sparsity, scope=self.scope, explore=self.explore,
            world_size=self.world_size, dense_steps=self.dense_steps,
        )
        if self.sparsity_warmup:  # only then: checkpoints written before the option existed still load
            out.update(sparsity_warmup=self.sparsity_warmup, sparsity_warmup_factor=self.sparsity_warmup_factor)
        if self.momentum_correction:
            out.update(momentum_correction=True, momentum_masking=self.momentum_masking)
        return out

    # ------------------------------------------------------------------ byte accounting
    @property
    def mask_encoding(self) -> str:
        """The mask wire format in use: ``"indices"``, ``"bitmask"`` or ``"local"`` (nothing travels)."""
        return self._encoding

    @property
    def mask_bytes_per_refresh(self) -> int:
        """Payload (bytes) this rank contributes to one mask all_gather (padded; 0 for ``"local"``)."""
        if self._encoding == "indices":
            return _INDEX_BYTES * max(self._own_k)
        if self._encoding == "bitmask":
            return max((hi - lo + 7) // 8 for lo, hi in zip(self._own_lo, self._own_hi))
        return 0

    @property
    def value_bytes_per_step(self) -> int:
        """Payload of the sparse gradient all_reduce: ``element_size * k`` bytes."""
        return self._element_size * self.k

    @property
    def dense_bytes_per_step(self) -> int:
        """Payload of the dense all_reduce SCAPE replaces: ``element_size * n`` bytes."""
        return self._element_size * self.numel

    @property
    def bytes_sent_per_step(self) -> float:
        """Steady-state payload per sparse step: values + mask / ``mask_refresh_interval`` (bytes)."""
        total = self.value_bytes_per_step + self.mask_bytes_per_refresh / self.mask_refresh_interval
        return int(total) if float(total).is_integer() else total

    def bytes_per_step(self) -> dict[str, Any]:
        """The breakdown behind :attr:`bytes_sent_per_step`, with the dense baseline and their ratio."""
        return {
            "values": self.value_bytes_per_step,
            "mask_per_refresh": self.mask_bytes_per_refresh,
            "mask_refresh_interval": self.mask_refresh_interval,
            "mask_encoding": self._encoding,
            "total": self.bytes_sent_per_step,
            "dense": self.dense_bytes_per_step,
            "ratio_to_dense": self.bytes_sent_per_step / self.dense_bytes_per_step,
        }

    # ------------------------------------------------------------------ inspection
    def mask_coverage(self) -> float:
        """Fraction of the n coordinates selected in at least one sparse step so far (dense steps do not count)."""
        return self._coverage_count() / self.numel

    def _coverage_count(self) -> int:
        if self._ever_count is None:  # after construction or load_state_dict
            self._ever_count = int(self.state[_KEY]["ever_selected"].sum())
        return self._ever_count

    def _membership(self, mask: torch.Tensor) -> torch.Tensor:
        """A zeroed bool buffer of n with ``mask`` set (callers clear what they set)."""
        if self._in_mask is None:
            self._in_mask = torch.zeros(self.numel, dtype=torch.bool)
        self._in_mask[mask] = True
        return self._in_mask

    def _bool_mask(self, p: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor | None:
        if g is None:
            return None
        i = next((j for j, q in enumerate(self._params) if q is p), None)
        if i is None:
            raise ScapeError("SCAPE.mask: the tensor is not one of this optimizer's parameters")
        a, b = self._offsets[i], self._offsets[i + 1]
        sel = g[(g >= a) & (g < b)] - a
        out = torch.zeros(b - a, dtype=torch.bool)
        out[sel] = True
        return out.view_as(p)

    def mask(self, p: torch.Tensor, which: Literal["current", "next"] = "current") -> torch.Tensor | None:
        """Bool tensor shaped like ``p``: the coordinates updated at the last step (``"current"``) or
        to be updated at the next one (``"next"``, waits for a pending sync); None when that step is
        or was dense."""
        if which == "next":
            self.synchronize()
            return self._bool_mask(p, self.state[_KEY]["next_mask"])
        return self._bool_mask(p, self.state[_KEY]["mask"])

    def residual(self, p: torch.Tensor) -> torch.Tensor | None:
        """The error-feedback residual of ``p`` (unsent local gradient mass), or None without error feedback."""
        return self.state[p].get("residual")

    # ------------------------------------------------------------------ mask selection and sync
    def _score(self, seg: _Segment) -> torch.Tensor:
        parts = []
        for i, a, b in seg.pieces:
            p = self._params[i]
            m = self.state[p]["exp_avg"].view(-1)[a:b]
            if self.mask_score == "accum":
                parts.append(self.state[p]["momentum_accum"].view(-1)[a:b].abs())
            elif self.mask_score == "m_ef":
                beta1 = self._group_of[i]["betas"][0]
                r = self.state[p]["residual"].view(-1)[a:b]
                parts.append((m * beta1).add_(r, alpha=1.0 - beta1).abs_())
            else:
                parts.append(m.abs())
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _select(self, seg_id: int, seg: _Segment, step: int) -> torch.Tensor:
        """Global sorted int64 indices this segment sends at the next step."""
        length = seg.hi - seg.lo
        if seg.k >= length:
            return torch.arange(seg.lo, seg.hi, dtype=torch.long)
        score = self._score(seg).float()
        top = torch.topk(score, seg.k_top, sorted=False).indices if seg.k_top else torch.empty(0, dtype=torch.long)
        if seg.k_explore:
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step * 7_919 + seg_id) % (2**63 - 1))
            draw = torch.rand(length, generator=gen)
            draw[top] = -1.0  # never re-draw a top-k coordinate
            top = torch.cat([top, torch.topk(draw, seg.k_explore, sorted=False).indices])
        return torch.sort(top).values + seg.lo

    def _launch_mask(self, step: int) -> int:
        """Compute the next mask (own segments, or all for ``"local"``) and start its sync; returns payload bytes.

        The mask is step ``step + 1``'s, at :meth:`sparsity_at` ``(step + 1)``."""
        sc = self.state[_KEY]
        segments, own_k = self._layout(self.sparsity_at(step + 1))
        if self._encoding == "local":
            sel = [self._select(j, s, step) for j, s in enumerate(segments)]
            sc["next_mask"] = torch.cat(sel)
            return 0
        sel = [self._select(j, s, step) for j, s in enumerate(segments) if s.owner == self.rank]
        own = torch.cat(sel) if sel else torch.empty(0, dtype=torch.long)
        self._pending_own_k = own_k
        if self._encoding == "indices":
            inp = torch.full((max(own_k),), -1, dtype=torch.int32)
            inp[: own.numel()] = own.to(torch.int32)
        else:
            lo, hi = self._own_lo[self.rank], self._own_hi[self.rank]
            bits = torch.zeros(hi - lo, dtype=torch.bool)
            bits[own - lo] = True
            inp = torch.zeros(self.mask_bytes_per_refresh, dtype=torch.uint8)
            packed = _pack_bits(bits)
            inp[: packed.numel()] = packed
        if self.world_size == 1:
            self._pending = (None, inp, inp)
        else:
            out = torch.empty(self.world_size * inp.numel(), dtype=inp.dtype)
            work = dist.all_gather_into_tensor(out, inp, group=self._pg, async_op=True)
            self._pending = (work, inp, out)
        return inp.numel() * inp.element_size()

    def synchronize(self) -> None:
        """Wait for the in-flight mask sync (if any) and decode it into the next mask."""
        if self._pending is None:
            return
        work, _inp, out = self._pending
        if work is not None:
            work.wait()
        self._pending = None
        chunk = out.numel() // self.world_size
        parts = []
        for r in range(self.world_size):
            c = out[r * chunk : (r + 1) * chunk]
            if self._encoding == "indices":
                parts.append(c[: self._pending_own_k[r]].to(torch.long))
            else:
                lo, hi = self._own_lo[r], self._own_hi[r]
                parts.append(torch.nonzero(_unpack_bits(c, hi - lo)).squeeze(1) + lo)
        self.state[_KEY]["next_mask"] = torch.cat(parts)

    # ------------------------------------------------------------------ the step
    def _flat_grad(self, p: torch.Tensor) -> torch.Tensor:
        g = p.grad
        if g is None:
            return torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
        if g.is_sparse:
            raise ScapeError("SCAPE does not support sparse gradients")
        if g.dtype != p.dtype:
            raise ScapeError(f"SCAPE: gradient dtype {g.dtype} differs from parameter dtype {p.dtype}")
        return g.reshape(-1)

    def _accumulate_momentum(self, flat: list[torch.Tensor], t: int) -> list[torch.Tensor]:
        """Momentum correction, every sparse step: ``u_k <- beta1 u_k + (1 - beta1) g_k``, ``v_k += u_k / c``;
        returns the accumulators (flat views, modified in place by the caller when values are sent)."""
        last = self.state[_KEY]["last_update"]
        out = []
        for i, (g, p) in enumerate(zip(flat, self._params)):
            group = self._group_of[i]
            beta1 = group["betas"][0]
            st = self.state[p]
            u, v = st["local_exp_avg"].view(-1), st["momentum_accum"].view(-1)
            u.lerp_(g, 1.0 - beta1)
            if not group["bias_correction"] or beta1 == 0.0:
                v.add_(u)
            elif self.momentum_masking:  # u restarted when the coordinate was last sent: its age is t - last
                age = (t - last[self._offsets[i] : self._offsets[i + 1]]).to(u.dtype)
                v.add_(u / (1.0 - torch.pow(beta1, age)))
            else:
                v.add_(u, alpha=1.0 / (1.0 - beta1**t))
            out.append(v)
        return out

    def _corrected_update(self, i: int, pv: torch.Tensor, m: torch.Tensor, li: torch.Tensor, V: torch.Tensor,
                          t: int, hp: dict[str, float]) -> None:
        """The momentum-corrected AdamS update of parameter ``i``'s masked coordinates ``li`` from ``V``, the
        rank-averaged accumulated momenta (module docstring)."""
        last = self.state[_KEY]["last_update"]
        glob = li + self._offsets[i]
        tau = (t - last[glob]).to(V.dtype)
        m_bar = V / tau
        mk = m[li]
        denom = (mk * hp["beta2"]).mul_(mk).add_((m_bar * (1.0 - hp["beta2"])).mul_(m_bar)).sqrt_()
        denom = torch.maximum(denom, m_bar.abs()).add_(hp["eps"])  # |lump| <= tau lr
        pk = pv[li]
        if hp["weight_decay"] != 0.0:
            pk.mul_(torch.pow(1.0 - hp["lr"] * hp["weight_decay"], tau))
        pk.addcdiv_(V, denom, value=-hp["lr"])
        pv.index_copy_(0, li, pk)
        m.index_copy_(0, li, m_bar)
        last[glob] = t

    @torch.no_grad()
    def step(self, closure=None):
        """One SCAPE step: the gradient collective, the AdamS update, the next mask's async sync.

        Call after ``loss.backward()`` on the local replica (gradients NOT all-reduced by anyone else).
        Parameters without a gradient count as zero gradient (on every rank alike).

        Returns
        -------
        The closure's loss, or None. Statistics of the step are in :attr:`last_stats`.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t_start = time.perf_counter()
        sc = self.state[_KEY]
        t = sc["step"] + 1
        dense = t <= self.dense_steps
        flat = [self._flat_grad(p) for p in self._params]
        if self.error_feedback:
            flat = [g + self.state[p]["residual"].view(-1) for g, p in zip(flat, self._params)]

        wait_s, changed, local_idx = 0.0, None, None
        if dense:
            values = torch.cat(flat)
            if self.error_feedback:
                for p in self._params:
                    self.state[p]["residual"].zero_()
            sc["mask"] = None
        else:
            t0 = time.perf_counter()
            self.synchronize()
            wait_s = time.perf_counter() - t0
            G = sc["next_mask"]
            if sc["mask"] is G:
                changed = 0.0
            elif sc["mask"] is not None:  # O(k) with a persistent membership buffer (torch.isin is O(k log k) and slow)
                in_prev = self._membership(sc["mask"])
                changed = 1.0 - int(in_prev[G].sum()) / max(1, G.numel())
                in_prev[sc["mask"]] = False
            sc["mask"] = G
            cuts = torch.searchsorted(G, self._offsets_t).tolist()
            local_idx = [G[cuts[i] : cuts[i + 1]] - self._offsets[i] for i in range(len(self._params))]
            if self.unmasked == "freeze_dense_m":  # the ablation: every gradient value travels
                values = torch.cat(flat)
            else:
                values = torch.empty(G.numel(), dtype=self._params[0].dtype, device=self._params[0].device)
                if self.momentum_correction:
                    flat = self._accumulate_momentum(flat, t)
                for i, (e, li) in enumerate(zip(flat, local_idx)):
                    values[cuts[i] : cuts[i + 1]] = e[li]
                    if self.momentum_correction:
                        e[li] = 0  # e is the accumulator v_k: what was sent leaves it
                        if self.momentum_masking:
                            self.state[self._params[i]]["local_exp_avg"].view(-1)[li] = 0
                    if self.error_feedback:
                        r = self.state[self._params[i]]["residual"].view(-1)
                        r.copy_(e)
                        r[li] = 0

        t0 = time.perf_counter()
        if self.world_size > 1:
            dist.all_reduce(values, group=self._pg)
            values.div_(self.world_size)
        comm_s = time.perf_counter() - t0

        for i, p in enumerate(self._params):
            group = self._group_of[i]
            beta1, beta2 = group["betas"]
            hp = dict(
                lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                bias_correction1=(1.0 - beta1**t) if group["bias_correction"] else 1.0,
            )
            m = self.state[p]["exp_avg"].view(-1)
            pv = p.view(-1)
            if dense:
                adams_update_(pv, m, values[self._offsets[i] : self._offsets[i + 1]], **hp)
                if self.momentum_correction and not self.momentum_masking:
                    self.state[p]["local_exp_avg"].copy_(self.state[p]["exp_avg"])  # mean_k u_k = m, exactly
                continue
            li, a = local_idx[i], cuts[i]
            gk = values[a : a + li.numel()]
            if self.momentum_correction:
                if li.numel():
                    self._corrected_update(i, pv, m, li, gk, t, hp)
            elif self.unmasked == "freeze_dense_m":
                g_full = values[self._offsets[i] : self._offsets[i + 1]]
                p_new = pv.clone()
                adams_update_(p_new, m, g_full, **hp)  # m: every coordinate, exactly dense AdamS's
                pv.index_copy_(0, li, p_new[li])  # the parameter: the masked coordinates only
            elif self.unmasked == "zero_grad":
                g_full = torch.zeros_like(pv)
                g_full[li] = gk
                adams_update_(pv, m, g_full, **hp)
            elif li.numel():
                pk, mk = pv[li], m[li]
                adams_update_(pk, mk, gk, **hp)
                pv.index_copy_(0, li, pk)
                m.index_copy_(0, li, mk)
        if dense and self.momentum_correction:
            sc["last_update"].fill_(t)
        if not dense:
            ever = sc["ever_selected"]
            self._ever_count = self._coverage_count() + int((~ever[sc["mask"]]).sum())
            ever[sc["mask"]] = True
        sc["step"] = t
        self.last_values = values

        mask_bytes, encoding, t0 = 0, None, time.perf_counter()
        stage_change = self.sparsity_warmup and self.sparsity_at(t + 1) != self.sparsity_at(max(t, self.dense_steps + 1))
        if t >= self.dense_steps and ((t - self.dense_steps) % self.mask_refresh_interval == 0 or stage_change):
            mask_bytes, encoding = self._launch_mask(t), self._encoding
        mask_compute_s = time.perf_counter() - t0

        W = self.world_size
        value_bytes = values.numel() * self._element_size
        stats = ScapeStepStats(
            step=t, dense=dense, k=values.numel(), numel=self.numel, value_bytes=value_bytes,
            mask_bytes=mask_bytes, mask_encoding=encoding, dense_bytes=self.dense_bytes_per_step,
            wire_bytes_estimate=2.0 * (W - 1) / W * value_bytes + (W - 1) * mask_bytes,
            comm_s=comm_s, mask_wait_s=wait_s, mask_compute_s=mask_compute_s,
            step_s=time.perf_counter() - t_start, mask_changed=changed, coverage=self.mask_coverage(),
        )
        self.last_stats = stats
        self.history.append(stats)
        return loss

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state dict, after :meth:`synchronize`; includes the mask, step and coverage."""
        self.synchronize()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` from a SCAPE with the same layout (n, k, sparsity, scope, world size).

        Raises
        ------
        ScapeError
            When the checkpoint's SCAPE entry is missing or its layout differs.
        """
        self.synchronize()
        entry = state_dict.get("state", {}).get(_KEY)
        if entry is None:
            raise ScapeError("SCAPE.load_state_dict: the state dict has no 'scape' entry (not a SCAPE checkpoint?)")
        if entry.get("config") != self._config():
            raise ScapeError(f"SCAPE.load_state_dict: layout {entry.get('config')} differs from this optimizer's {self._config()}")
        super().load_state_dict(state_dict)
        # torch's load_state_dict replaces the param_group dicts: re-point the per-parameter view,
        # else steps after a resume read the stale groups (e.g. the lr a schedule sets on param_groups)
        self._group_of = [g for g in self.param_groups for _ in g["params"]]
        sc = self.state[_KEY]
        self.state[_KEY] = {
            k: (v.clone() if isinstance(v, torch.Tensor) else (dict(v) if isinstance(v, dict) else v)) for k, v in sc.items()
        }
        sc = self.state[_KEY]
        self._ever_count = None
        if sc["mask"] is not None and sc["next_mask"] is not None and torch.equal(sc["mask"], sc["next_mask"]):
            sc["next_mask"] = sc["mask"]
