"""The GIFT hook state: :class:`GiftHookState` (covariance tracking, factors, layer selection, error feedback in
whitened coordinates) and :data:`gift_hook`. See :mod:`lab.training.comm.hooks` and :mod:`lab.training.comm.gift`."""

from __future__ import annotations

import re
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lab.training.comm.codecs import Codec
from lab.training.comm.gift import (
    CovarianceEMA,
    CovarianceTracker,
    GiftConfig,
    KroneckerWhitening,
    LayerSelector,
    RefreshSchedule,
    Whitening,
    saturation_rates,
)
from lab.training.errors import GiftError, HookError
from lab.training.comm.hooks.base import ErrorFeedback, StepRecord, Transform, _cpu, _norm_sq, _rel, _unwrap
from lab.training.comm.hooks.codec import CodecHookState, codec_hook

__all__ = ["GiftHookState", "gift_hook"]

#: GIFT uses the same hook function; the state decides which parameters are whitened.
gift_hook = codec_hook


# -- GIFT ------------------------------------------------------------------------------------------


class GiftHookState(CodecHookState):
    """State of the GIFT hook: covariance tracking, whitening factors, layer selection, error feedback.

    Per step (hook body, identical order on every rank):

    1. At the start of a refresh step ``t`` (``t < refresh_warmup``, ``t % refresh_every == 0``, and every
       selection step, so newly selected layers start from fresh factors): the input covariance sums the forward hooks
       collected (every training forward since the last refresh with ``collect="every"``, the default;
       only this step's forward with ``collect="refresh"``, the artifact's behaviour) are packed (upper
       triangles + row counts, float32) and all-reduced (SUM); ``A_new = sum S / sum n``;
       ``A <- b A + (1 - b) A_new`` (``A = A_new`` the first time) with ``b = ema ** steps_since_last_refresh``
       (``ema_per="step"``, the default) or ``b = ema`` (``ema_per="refresh"``, the artifact); factors
       :meth:`Whitening.from_covariance` (damping, rank, residual); with ``broadcast_factors`` rank 0's
       float32 factors are broadcast so every rank maps back with the same bits; error-feedback residuals
       are rebased, ``R <- R A_old^{1/2} A_new^{-1/2}`` (``rebase_error_feedback``; the artifact does not).
       Output-gradient factors (the embeddings' factor; a Linear layer's left-hand factor ``B`` with
       ``output_side``) are refreshed the same way just before each bucket is encoded, for the layers
       whose weight is in that bucket: their gradients are complete then, so the step's own backward is
       in (``R <- B_new^{-1/2} B_old^{1/2} R`` for the left-hand side).
    2. At a selection step (:meth:`LayerSelector.due`): the window statistics are all-reduced (float64)
       and the same layers are selected on every rank. A layer leaving GIFT folds its residual, mapped
       back, into the Euclidean residual (with ``euclidean_error_feedback``) or drops it; a layer entering
       starts from the Euclidean residual (whitened) or zero.
    3. Per parameter: a selected layer's weight gradient ``G`` (``(out, in)``) with factors sends
       ``Q(B^{-1/2} G A^{-1/2} + R)`` (``Q(G A^{-1/2} + R)`` without ``output_side`` or before ``B``'s first
       refresh) and keeps ``R`` (EF in whitened coordinates, ``error_feedback``), with its
       bias as ``[G | b]`` (``bias``); a selected embedding likewise with its output-gradient factor
       (``embeddings``); everything else (LayerNorm parameters, layers not selected or without factors
       yet) is Euclidean.
    4. Statistics for candidate layers (while a selection window is open, or with ``measure_error``):
       Euclidean upper/lower-bound hit rates (of the weight) and one-step errors, and GIFT's one-step
       error when factors exist (of ``[G | b]`` for a layer whitened with its bias); kept in
       :attr:`layer_history` when ``measure_error``.

    Parameters
    ----------
    model : nn.Module
        The model (or its DDP wrapper); its ``nn.Linear`` layers (and, with ``embeddings``, its
        ``nn.Embedding`` layers) are the candidates.
    codec : str or Codec
        ``"fp8_e4m3"`` (default), ``"fp8_e5m2"`` (the artifact's format), ``"nvfp4"``, per-block FP8, ...
    config : GiftConfig, optional
        Every setting below (from ``n_eigenpairs`` to ``statistics``) as one validated, frozen
        :class:`~lab.training.comm.gift.GiftConfig`; or pass them as keywords (``**settings``), which
        are validated by :meth:`GiftConfig.build` (a :class:`GiftError` naming the field), not both.
    n_eigenpairs : int, optional
        Eigenpairs kept per factor (default and paper: 32; the low-rank part of :meth:`Whitening.from_covariance`).
    rank : int, optional
        Deprecated alias of ``n_eigenpairs`` (a config key of earlier runs' ``comm_kwargs``; not the
        process rank, which is :attr:`rank`): warns ``DeprecationWarning``.
    damping : float
        Relative damping ``A + damping * mean(diag A) I`` (artifact: 1e-3; comm-check: 1e-2 helped the median layer).
    ema : float
        EMA factor of ``A``, in [0, 1) (artifact: 0.95 per refresh).
    ema_per : {"step", "refresh"}
        Apply ``ema`` once per step elapsed (default: ``ema ** 50`` per 50-step refresh, a ~20-step time
        constant) or once per refresh (the artifact: with 50-step refreshes a ~1000-step time constant, so
        in runs of a few hundred steps ``A`` stays near its value at initialisation and GIFT measured
        0.6-1.1x of Euclidean FP8's error per layer on a char-GPT, i.e. mostly worse).
    refresh_every : int
        Refresh period in steps (artifact: 50).
    refresh_warmup : int
        Refresh at every one of the first ``refresh_warmup`` steps (default 0: the artifact's fixed period).
        Early in training the model moves fastest and a factor a few steps old can do worse than none: in
        ``benchmarks.comm``'s bytes curve (rows ``varied="refresh_warmup_all_layers"``: every layer, 16
        eigenpairs, period 25 from step 1) GIFT's whole-model gain over Euclidean FP8 is 2.55x at step 1,
        then 0.89x and 0.90x at steps 10 and 20 (below 1: worse); with the 20-step warm-up its worst
        capture is 1.12x. The benchmark uses 20 (its learning-rate warm-up).
    residual : {"scalar", "diag"}
        See :class:`~lab.training.comm.gift.Whitening`.
    layers : Iterable[str], optional
        A fixed initial selection (the paper's set S chosen before training); default: automatic.
    include, exclude : str, optional
        Regular expressions (``re.search``) on layer names that restrict the candidates.
    select_by : {"saturation", "error", "gain"}
        Selection score (paper: ``"saturation"``), see :class:`~lab.training.comm.gift.LayerSelector`.
    select_k : int or float
        Layers selected (int) or fraction of the candidates (default 0.25; the paper kept 13 of 64).
    select_threshold : float, optional
        Select every layer with score ``>= threshold`` instead of top-k.
    select_warmup : int
        Steps of Euclidean warm-up before the first automatic selection (paper: 100, profiled offline).
    reselect_every : int or None
        Re-select every this many steps (None: never).
    track : {"all", "selected"}
        Collect ``A`` for every candidate (per-layer picture, ``"gain"`` selection, instant switch-over)
        or only for selected layers (cheaper; a newly selected layer waits for the next refresh).
    embeddings : bool
        Also whiten ``nn.Embedding`` weight gradients (an extension; the paper whitens linear layers).
        An embedding is a linear layer on one-hot inputs, so its input-side factor is diagonal (token
        frequencies) and cannot change a per-element float format's relative error; its factor is the
        other Kronecker factor instead, the covariance ``S`` of the gradient of its output (``d x d``),
        and it sends ``Q(G S^{-1/2} + R)``, mapped back with ``S^{1/2}``. The module whose output gradient
        is used comes from ``model.embedding_layers()`` when the model has it (:class:`~lab.training.model.GPT`:
        the residual stream's gradient for both the token and the position embedding), else each
        embedding's own output. That gradient exists only in the backward; the factor is refreshed
        before the embedding's bucket is encoded, with the step's own backward in. Embeddings sharing a
        source share one ``dy^T dy`` per backward, but each is all-reduced and broadcast as its own
        factor (``d (d + 1) / 2`` floats more per refresh for the GPT's second embedding).
    bias : bool
        Whiten a Linear layer's bias together with its weight (an extension; the paper sends biases
        Euclidean): K-FAC's homogeneous coordinate appends a constant 1 to the inputs, so the factor is
        the ``(in + 1, in + 1)`` covariance of ``[x; 1]`` and ``[G | b] A^{-1/2}`` is quantized as the
        weight's and the bias's payloads (each with its own scale; the same bytes as Euclidean), mapped
        back jointly. Needs the weight and bias in one DDP bucket (adjacent parameters always are unless
        a bucket boundary falls between them); a layer split across buckets is sent Euclidean, with a
        warning. Early in training the residual projections' biases carry about half the gradient.
    output_side : bool
        Also whiten on the left with the output-gradient covariance ``B = E[dy dy^T]`` (``(out, out)``) of
        each Linear layer (one module per weight): the paper's full two-sided form (Eq. 14-17), which it
        dropped after its Table I found no gain at 600M. On the benchmark's char-GPT it lowers the
        per-layer error a further 1.2-3x (see :mod:`lab.training.comm.gift`). Costs ``out (out + 1) / 2 + 1``
        floats per layer and refresh in the all-reduce and ``out k + k + 1`` in the factor broadcast.
    output_side_max : int
        Linear layers with more outputs than this keep the input side only (a vocabulary-sized LM head
        would need a ``(vocab, vocab)`` covariance and its eigendecomposition at every refresh).
    collect : {"every", "refresh"}
        Which forwards (and their backwards) feed the factors (see step 1). ``"every"`` costs an
        ``(in, in)`` GEMM per layer and forward (and, with ``output_side``, an ``(out, out)`` one per
        backward) but no extra bytes.
    error_feedback : bool
        Error feedback in whitened coordinates for GIFT layers (paper: yes).
    euclidean_error_feedback : bool
        Error feedback on the Euclidean path too (paper: no).
    rebase_error_feedback : bool
        Rebase whitened residuals when the factors change.
    broadcast_factors : bool
        Broadcast rank 0's factors after each refresh (extra bytes: ``4 (d k + k + 1)`` per layer, ``d``
        the factor's size: ``in + 1`` for a layer whitened with its bias).
    statistics : {"all_reduce", "rank0"}
        Where a refresh's covariances come from: the sums of every rank, all-reduced (default, the
        artifact; ``4 (d (d + 1) / 2 + 1)`` bytes per factor and refresh), or rank 0's own sums (an
        extension: no all-reduce, rank 0 builds the factors and broadcasts them after a header of
        ``4`` bytes per factor with their ranks; the other ranks' sums are dropped). A covariance
        estimated on one rank's share of the batch is noisier; the side bytes drop to the broadcast.
    eigensolver : {"eigh", "subspace"}
        How a refresh builds a factor's top eigenpairs (:meth:`Whitening.from_covariance`): the full
        ``eigh`` (default), or randomized subspace iteration warm-started from the factor's previous
        basis (``subspace_iters`` power iterations; an extension that cuts the refresh's ``O(d^3)``).
    subspace_iters : int
        Power iterations of ``eigensolver="subspace"`` (default 4).
    nonfinite, process_group, measure_error, history
        See :class:`CodecHookState`.

    Attributes
    ----------
    whitening : dict[str, Whitening]
        Current right-hand factors per tracked layer (``A``; an embedding's ``S``).
    out_whitening : dict[str, Whitening]
        Current left-hand factors ``B`` (``output_side``); :meth:`transform` combines both.
    selector : LayerSelector
        Window sums and :attr:`LayerSelector.history` (selections with scores).
    layer_history : deque of dict
        With ``measure_error``: per step and candidate layer ``step``, ``layer``, ``selected``,
        ``euclid_rel_error``, ``gift_rel_error``, ``sent_rel_error``, ``upper_hit``, ``lower_hit``,
        ``condition_number``.

    Raises
    ------
    GiftError
        No candidate ``nn.Linear`` (or ``nn.Embedding``) layer, unknown names in ``layers``, bad
        parameters, an ``embedding_layers()`` entry that is not an ``nn.Embedding``, or
        ``select_by="gain"`` with ``track="selected"``.
    """

    def __init__(self, model: nn.Module, codec: str | Codec = "fp8_e4m3", config: GiftConfig | None = None, *,
                 nonfinite: str = "raise", process_group=None, measure_error: bool = False, history: int | None = None,
                 **settings: Any):
        if not isinstance(model, nn.Module):
            raise GiftError(f"GIFT needs the model (an nn.Module) to find its nn.Linear layers, got {type(model).__name__}")
        if "rank" in settings:  # deprecated alias (earlier runs' comm_kwargs); the process rank is self.rank
            rank = settings.pop("rank")
            if "n_eigenpairs" in settings and settings["n_eigenpairs"] != rank:
                raise GiftError(f"n_eigenpairs={settings['n_eigenpairs']!r} and its deprecated alias rank={rank!r} disagree")
            warnings.warn("GiftHookState(rank=...) is deprecated: the eigenpairs kept are n_eigenpairs=... "
                          "(rank is the process rank)", DeprecationWarning, stacklevel=2)
            settings["n_eigenpairs"] = rank
        if config is not None and settings:
            raise GiftError(f"pass either config= or GIFT settings as keywords, not both (got {sorted(settings)})")
        if config is not None and not isinstance(config, GiftConfig):
            raise GiftError(f"config must be a GiftConfig, got {type(config).__name__}")
        cfg = config if config is not None else GiftConfig.build(**settings)
        #: the validated, frozen settings (:class:`~lab.training.comm.gift.GiftConfig`)
        self.config = cfg
        super().__init__(codec, nonfinite=nonfinite, process_group=process_group, model=model, history=history)
        # GIFT's own measurement and Euclidean-path error feedback (not the wrappers of .wrappers: the layer
        # statistics feed the selection, and residuals move between the two paths when it changes)
        self.measure_error = bool(measure_error)
        #: Euclidean-path residuals (``euclidean_error_feedback``), keyed by parameter name
        self.error_feedback = ErrorFeedback() if cfg.euclidean_error_feedback else None
        layers, include, exclude, embeddings, bias = cfg.layers, cfg.include, cfg.exclude, cfg.embeddings, cfg.bias
        output_side, output_side_max = cfg.output_side, cfg.output_side_max
        #: when factors are rebuilt, and the covariance EMAs (input / right-hand side, output / left-hand side)
        self.schedule = RefreshSchedule(cfg.refresh_every, cfg.refresh_warmup)
        self._ema_in, self._ema_out = CovarianceEMA(cfg.ema, cfg.ema_per), CovarianceEMA(cfg.ema, cfg.ema_per)
        #: eigenpairs kept per factor (``n_eigenpairs``); :attr:`rank` is this process's rank
        self.n_eigenpairs, self.damping, self.ema, self.refresh_every = cfg.n_eigenpairs, float(cfg.damping), float(cfg.ema), cfg.refresh_every
        self.refresh_warmup = cfg.refresh_warmup
        self.residual, self.track, self.collect, self.ema_per = cfg.residual, cfg.track, cfg.collect, cfg.ema_per
        self.rebase_error_feedback, self.broadcast_factors = cfg.rebase_error_feedback, cfg.broadcast_factors
        self.statistics = cfg.statistics
        self.eigensolver, self.subspace_iters = cfg.eigensolver, cfg.subspace_iters
        self.gift_error_feedback = ErrorFeedback() if cfg.error_feedback else None

        # candidates: named nn.Linear layers (a weight shared by several modules is one layer), then
        # the embeddings (factor: the covariance of a module's output gradient, see embeddings)
        root = _unwrap(model)
        inc, exc = (re.compile(include) if include else None), (re.compile(exclude) if exclude else None)

        def wanted(name: str) -> bool:
            return not ((inc and not inc.search(name)) or (exc and exc.search(name)))

        by_weight: dict[int, tuple[str, list[nn.Linear]]] = {}
        for name, mod in root.named_modules():
            if isinstance(mod, nn.Linear) and wanted(name):
                by_weight.setdefault(id(mod.weight), (name, []))[1].append(mod)
        emb: dict[str, tuple[nn.Embedding, nn.Module]] = {}
        if embeddings:
            found = (root.embedding_layers() if hasattr(root, "embedding_layers")
                     else {n: (m, m) for n, m in root.named_modules() if isinstance(m, nn.Embedding)})
            for name, (mod, source) in found.items():
                if not isinstance(mod, nn.Embedding):
                    raise GiftError(f"embedding {name!r} is a {type(mod).__name__}, not an nn.Embedding")
                if wanted(name) and id(mod.weight) not in by_weight:
                    emb[name] = (mod, source)
        if not by_weight and not emb:
            raise GiftError(f"no candidate nn.Linear or nn.Embedding layer in {type(root).__name__} "
                            f"(include={include!r}, exclude={exclude!r})")
        weights = {**{pid: name for pid, (name, _) in by_weight.items()}, **{id(m.weight): n for n, (m, _) in emb.items()}}
        self.layers: tuple[str, ...] = tuple(weights.values())
        self.embeddings: tuple[str, ...] = tuple(emb)
        self._weight_layer = weights
        self._layer_weight_name = {name: self._names.get(pid, name + ".weight") for pid, name in weights.items()}
        # a Linear's bias is whitened with its weight (K-FAC's homogeneous coordinate) when the weight
        # belongs to one module that has a bias
        self._layer_param = {name: mods[0].weight for name, mods in by_weight.values()}
        self._layer_bias = ({name: mods[0].bias for name, mods in by_weight.values()
                             if len(mods) == 1 and mods[0].bias is not None
                             and mods[0].bias.requires_grad and mods[0].weight.requires_grad}  # frozen: never in a bucket
                            if bias else {})
        self._layer_bias_name = {n: self._names.get(id(b), n + ".bias") for n, b in self._layer_bias.items()}
        self._split_warned: set[str] = set()
        # input side (forward hooks, refreshed at the step's start); output-gradient factors (backward
        # hooks, refreshed per bucket): the embeddings' only factor, and a Linear's left-hand factor
        self.tracker = CovarianceTracker({name: mods for name, mods in by_weight.values()}, self._collecting,
                                         homogeneous=self._layer_bias)
        self.output_side = tuple(name for name, mods in by_weight.values()
                                 if output_side and len(mods) == 1 and mods[0].weight.requires_grad
                                 and mods[0].out_features <= output_side_max)
        self.out_tracker = CovarianceTracker(
            {}, self._collecting,
            {**{n: (source, m.embedding_dim) for n, (m, source) in emb.items()},
             **{name: (mods[0], mods[0].out_features) for name, mods in by_weight.values() if name in self.output_side}})
        self.selector = LayerSelector(self.layers, select_by=cfg.select_by, k=cfg.select_k, threshold=cfg.select_threshold,
                                      warmup=cfg.select_warmup if layers is None else None, every=cfg.reselect_every,
                                      initial=None if layers is None else list(layers))
        self.whitening: dict[str, Whitening] = {}
        self.out_whitening: dict[str, Whitening] = {}
        self.refreshes = 0  # steps at which some factor was refreshed
        self._counted_refresh = -1
        self.layer_history: deque[dict] = deque(maxlen=None if history is None else history * len(self.layers))

    # the covariance EMAs' dicts under their old names (state_dict keys, tests)
    _cov = property(lambda self: self._ema_in.cov)
    _out_cov = property(lambda self: self._ema_out.cov)
    _last_refresh = property(lambda self: self._ema_in.last)
    _out_last_refresh = property(lambda self: self._ema_out.last)

    @property
    def selected(self) -> tuple[str, ...]:
        """Layers currently sent through GIFT (candidate order)."""
        return self.selector.selected

    def close(self) -> None:
        """Remove the forward hooks from the model."""
        self.tracker.close()
        self.out_tracker.close()

    def transform(self, layer: str) -> Transform | None:
        """The transform GIFT applies to ``layer``'s gradient now: both factors when the output side has
        one, the input (right-hand) factor alone before that, None before any refresh."""
        wh = self.whitening.get(layer)
        wo = self.out_whitening.get(layer)
        return None if wh is None else (wh if wo is None else KroneckerWhitening(wh, wo))

    def state_dict(self) -> dict:
        """Adds the covariance EMAs, factors (float32 flat), whitened residuals, the selection and its
        window, and the covariance sums collected since the last refresh."""
        d = super().state_dict()
        d.update({
            "error_feedback": _cpu(self.error_feedback.residuals) if self.error_feedback is not None else None,
            "cov": _cpu(self._cov),
            "whitening": {n: (w.to_flat().cpu(), w.dim, w.rank) for n, w in self.whitening.items()},
            "last_refresh": dict(self._last_refresh),
            "refreshes": self.refreshes,
            "gift_error_feedback": _cpu(self.gift_error_feedback.residuals) if self.gift_error_feedback is not None else None,
            "selected": self.selector.selected,
            "selector_window": self.selector.window.clone(),
            "selector_history": list(self.selector.history),
            "tracker": (_cpu(self.tracker._sums), dict(self.tracker._counts)),
            "out_cov": _cpu(self._out_cov),
            "out_whitening": {n: (w.to_flat().cpu(), w.dim, w.rank) for n, w in self.out_whitening.items()},
            "out_last_refresh": dict(self._out_last_refresh),
            "out_tracker": (_cpu(self.out_tracker._sums), dict(self.out_tracker._counts)),
        })
        return d

    _STATE_KEYS = ("step", "cov", "whitening", "last_refresh", "refreshes", "gift_error_feedback", "selected",
                   "selector_window", "selector_history", "tracker", "out_cov", "out_whitening", "out_last_refresh",
                   "out_tracker")

    def _check_state(self, state: Mapping) -> None:
        """Refuse a state whose layers or factor sizes differ from this hook's (before anything is loaded)."""
        missing = [k for k in self._STATE_KEYS if k not in state]
        if missing:
            raise HookError(f"GIFT hook state_dict lacks {missing}")
        unknown = [n for n in list(state["cov"]) + list(state["selected"]) if n not in self.layers]
        if unknown:
            raise GiftError(f"hook state_dict names layers {unknown} this model does not have")
        hint = "(saved with other bias= / embeddings= / output_side= / include= settings?)"
        dims = {**self.out_tracker.dims, **self.tracker.dims}  # right-hand factors: embeddings' from the output side
        out_dims = {n: self.out_tracker.dims[n] for n in self.output_side}
        for n, c in state["out_cov"].items():
            if n not in out_dims or tuple(c.shape) != (out_dims[n], out_dims[n]):
                raise HookError(f"hook state_dict: layer {n!r} has a {tuple(c.shape)} output-side covariance, this "
                                f"hook's is {(out_dims[n],) * 2 if n in out_dims else 'absent'} {hint}")
        for n, (_f, dim, _k) in state["out_whitening"].items():
            if out_dims.get(n) != dim:
                raise HookError(f"hook state_dict: layer {n!r} has an output-side factor of dim {dim}, this hook's is "
                                f"{out_dims.get(n)} {hint}")
        for n, c in state["cov"].items():
            if tuple(c.shape) != (dims[n], dims[n]):
                raise HookError(f"hook state_dict: layer {n!r} has a {tuple(c.shape)} covariance, this hook's factor "
                                f"is ({dims[n]}, {dims[n]}) {hint}")
        for n, (_f, dim, _k) in state["whitening"].items():
            if n not in dims or dim != dims[n]:
                raise HookError(f"hook state_dict: layer {n!r} has a factor of dim {dim}, this hook's is {dims.get(n)} {hint}")
        for n, r in (state["gift_error_feedback"] or {}).items():
            if n not in dims or r.dim() != 2 or r.shape[1] != dims[n]:
                raise HookError(f"hook state_dict: layer {n!r} has a residual of shape {tuple(r.shape)}, this hook's "
                                f"factor is {dims.get(n)} wide {hint}")
        rows = state["selector_window"].shape[0]
        if rows != len(self.layers):
            raise HookError(f"hook state_dict: a selection window of {rows} layers, this hook has {len(self.layers)} {hint}")

    def load_state_dict(self, state: Mapping) -> None:
        """Load a :meth:`state_dict`; checked against this hook's layers and factor sizes first.

        Raises
        ------
        GiftError
            The state names layers this model does not have.
        HookError
            A key is missing, or a covariance, factor, residual or selection window has another size
            (e.g. a state saved with ``bias=False`` loaded with ``bias=True``); nothing is loaded then.
        """
        try:
            self._check_state(state)
        except KeyError as exc:
            raise HookError(f"GIFT hook state_dict lacks {exc}") from None
        super().load_state_dict(state)
        try:
            if self.error_feedback is not None:
                self.error_feedback.residuals = dict(state.get("error_feedback") or {})
            self._ema_in.cov = dict(state["cov"])
            self.whitening = {n: Whitening.from_flat(f, dim, k) for n, (f, dim, k) in state["whitening"].items()}
            self._ema_in.last = dict(state["last_refresh"])
            self.refreshes = int(state["refreshes"])
            self._counted_refresh = self.step - 1
            if self.gift_error_feedback is not None:
                self.gift_error_feedback.residuals = dict(state["gift_error_feedback"] or {})
            self.selector.selected = tuple(n for n in self.layers if n in set(state["selected"]))
            self.selector.window = state["selector_window"].clone()
            self.selector.history = list(state["selector_history"])
            for tracker, key in ((self.tracker, "tracker"), (self.out_tracker, "out_tracker")):
                sums, counts = state[key]
                tracker._sums, tracker._counts = dict(sums), {n: int(counts.get(n, 0)) for n in tracker.dims}
            self._ema_out.cov = dict(state["out_cov"])
            self.out_whitening = {n: Whitening.from_flat(f, dim, k) for n, (f, dim, k) in state["out_whitening"].items()}
            self._ema_out.last = dict(state["out_last_refresh"])
        except KeyError as exc:
            raise HookError(f"GIFT hook state_dict lacks {exc}") from None

    # forward-side --------------------------------------------------------------------------------

    def _tracked(self) -> tuple[str, ...]:
        return self.layers if self.track == "all" else self.selected

    def _collecting(self, name: str) -> bool:
        if self.collect == "refresh" and not self._is_refresh_step(self.step):
            return False
        if self.statistics == "rank0" and self.world_size > 1 and self.rank != 0:
            return False  # only rank 0's sums are used
        return self.track == "all" or name in self.selected

    # step start: side collectives ----------------------------------------------------------------

    def _is_refresh_step(self, step: int) -> bool:
        return self.schedule.due(step, self.selector.due(step))

    def _on_step_start(self, rec: StepRecord) -> None:
        if self._is_refresh_step(self.step):
            self._refresh(rec)
        if self.selector.due(self.step):
            self._select(rec)

    def _refresh(self, rec: StepRecord) -> None:
        """Input-side factors of the tracked Linear layers (step start: the step's forward is complete)."""
        self._refresh_factors(self.tracker, [n for n in self._tracked() if n in self.tracker.dims], rec)

    def _before_bucket(self, layout: list, rec: StepRecord) -> None:
        """Output-gradient factors of the layers in this bucket, on refresh steps: their gradients are
        complete, so the step's own backward is in (the embeddings' factor, a Linear's left-hand one)."""
        if not self._is_refresh_step(self.step):
            return
        tracked = set(self._tracked())
        in_bucket = [self._weight_layer[id(p)] for p, *_ in layout if id(p) in self._weight_layer]
        self._refresh_factors(self.out_tracker, [n for n in in_bucket if n in tracked and n in self.out_tracker.dims], rec)

    def _refresh_factors(self, tracker: CovarianceTracker, names: list[str], rec: StepRecord) -> None:
        """All-reduce ``tracker``'s sums for ``names``, update the EMAs and factors, rebase EF residuals.

        A name that is a Linear layer of ``self.out_tracker`` updates the left-hand factor
        (:attr:`out_whitening`); every other name (a Linear's input side, an embedding) the right-hand
        one (:attr:`whitening`).
        """
        stale = [n for n in tracker.dims if n not in self._tracked() and tracker.count(n)]
        if stale:  # collected while selected, deselected since (track="selected"): drop, never mix in later
            tracker.take(stale)
        if not names:
            return
        w = self.world_size
        vec = tracker.take(names, device=self.device)
        local = w > 1 and self.statistics == "rank0"
        if local and self.rank != 0:
            self._receive_factors(tracker, names, rec)
            return
        if w > 1 and not local:
            dist.all_reduce(vec, group=self.process_group)
            rec.extra_bytes += 4 * vec.numel()
        sums = tracker.unpack(vec, names)
        left = tracker is self.out_tracker
        fresh: dict[str, Whitening] = {}
        try:
            for name in names:
                s, n = sums[name]
                if n <= 0:
                    continue
                is_left = left and name in self.output_side
                cov = (self._ema_out if is_left else self._ema_in).update(name, s.to(torch.float64) / n, self.step)
                prev = (self.out_whitening if is_left else self.whitening).get(name)
                fresh[name] = Whitening.from_covariance(
                    cov, self.n_eigenpairs, self.damping, self.residual, eigensolver=self.eigensolver,
                    init=prev.basis if prev is not None else None, iters=self.subspace_iters)
        except Exception:
            if local:  # the other ranks wait for rank 0's header: tell them it failed, then raise here
                failed = torch.full((len(names),), -2.0, dtype=torch.float32, device=self.device)
                dist.broadcast(failed, src=self._root(), group=self.process_group)
            raise
        if local:  # tell the other ranks which factors follow, and their ranks
            header = torch.tensor([float(fresh[n].rank) if n in fresh else -1.0 for n in names],
                                  dtype=torch.float32, device=self.device)
            dist.broadcast(header, src=self._root(), group=self.process_group)
            rec.extra_bytes += 4 * header.numel()
        if w > 1 and self.broadcast_factors and fresh:
            order = [n for n in names if n in fresh]
            flat = torch.cat([fresh[n].to_flat() for n in order])
            dist.broadcast(flat, src=self._root(), group=self.process_group)
            rec.extra_bytes += 4 * flat.numel()
            fresh = _unflatten_factors(flat, {n: (fresh[n].dim, fresh[n].rank) for n in order})
        self._install_factors(tracker, fresh)

    def _root(self) -> int:
        return dist.get_global_rank(self.process_group or dist.group.WORLD, 0)

    def _receive_factors(self, tracker: CovarianceTracker, names: list[str], rec: StepRecord) -> None:
        """``statistics="rank0"`` on another rank: rank 0's header (ranks, -1: no factor), then its factors."""
        header = torch.empty(len(names), dtype=torch.float32, device=self.device)
        dist.broadcast(header, src=self._root(), group=self.process_group)
        rec.extra_bytes += 4 * header.numel()
        if bool((header == -2).any()):
            raise GiftError(f"step {self.step}: rank 0 failed to build the GIFT factors of {names} (its error has the cause)")
        ks = {n: int(k) for n, k in zip(names, header.tolist()) if k >= 0}
        if not ks:
            return
        shapes = {n: (tracker.dims[n], k) for n, k in ks.items()}
        flat = torch.empty(sum(d * k + k + 1 for d, k in shapes.values()), dtype=torch.float32, device=self.device)
        dist.broadcast(flat, src=self._root(), group=self.process_group)
        rec.extra_bytes += 4 * flat.numel()
        left = tracker is self.out_tracker
        for n in ks:
            (self._ema_out if left and n in self.output_side else self._ema_in).mark(n, self.step)
        self._install_factors(tracker, _unflatten_factors(flat, shapes))

    def _install_factors(self, tracker: CovarianceTracker, fresh: dict[str, Whitening]) -> None:
        """Make ``fresh`` the current factors, rebasing the whitened error-feedback residuals."""
        left = tracker is self.out_tracker
        ef = self.gift_error_feedback
        for name, new in fresh.items():
            is_left = left and name in self.output_side
            store = self.out_whitening if is_left else self.whitening
            old = store.get(name)
            if ef is not None and name in ef:  # keep the residual's value in original coordinates
                r = ef.pop(name)
                if not self.rebase_error_feedback:
                    ef.add(name, r)
                elif is_left:  # R <- B_new^{-1/2} B_old^{1/2} R
                    ef.add(name, KroneckerWhitening(self.whitening[name], new).rebase_output(r, old))
                elif old is not None:  # R <- R A_old^{1/2} A_new^{-1/2}
                    ef.add(name, new.whiten(old.unwhiten(r)))
            store[name] = new
        if fresh and self._counted_refresh != self.step:
            self._counted_refresh = self.step
            self.refreshes += 1

    def _select(self, rec: StepRecord) -> None:
        window = self.selector.window_vector()
        if self.world_size > 1:
            window = window.to(self.device)
            dist.all_reduce(window, group=self.process_group)
            rec.extra_bytes += 8 * window.numel()
            window = window.cpu()
        before = set(self.selected)
        after = set(self.selector.select(self.step, window))
        gift_ef, plain_ef = self.gift_error_feedback, self.error_feedback
        for name in before - after:  # leaving GIFT: keep the residual mass on the Euclidean path if it has EF
            r = gift_ef.pop(name) if gift_ef is not None else None
            if r is not None and plain_ef is not None and name in self.whitening:
                back = self.transform(name).unwhiten(r)
                if name in self._layer_bias:
                    plain_ef.add(self._layer_bias_name[name], back[:, -1].contiguous())
                    back = back[:, :-1]
                plain_ef.add(self._layer_weight_name[name], back.reshape(-1))
        for name in after - before:  # entering GIFT: start from the Euclidean residual, whitened
            if plain_ef is None or gift_ef is None or name not in self.whitening:
                continue
            w = self.transform(name)
            rw = plain_ef.pop(self._layer_weight_name[name])
            if name in self._layer_bias:
                rb = plain_ef.pop(self._layer_bias_name[name])
                if rw is None and rb is None:
                    continue
                weight = self._layer_param[name]
                rw = rw.view(weight.shape) if rw is not None else weight.new_zeros(weight.shape, dtype=torch.float32)
                rb = rb.view(-1, 1) if rb is not None else rw.new_zeros(rw.shape[0], 1)
                gift_ef.add(name, w.whiten(torch.cat([rw, rb], dim=1)))
            elif rw is not None:
                gift_ef.add(name, w.whiten(rw.view(-1, w.dim)))

    # per-bucket and per-parameter encode -------------------------------------------------------------

    def _encode_joint(self, buf: Tensor, layout: list,
                      rec: StepRecord) -> dict[int, tuple[Tensor, Transform | None, tuple[int, int] | None]]:
        """A Linear's weight and bias encoded together when both are in this bucket (see ``bias``)."""
        where = {id(p): (off, n, shape) for p, off, n, shape in layout}
        joint: dict[int, tuple[Tensor, Transform | None, tuple[int, int] | None]] = {}
        for layer, b in self._layer_bias.items():
            w = self._layer_param[layer]
            if id(w) in where and id(b) in where:
                (wo, wn, ws), (bo, bn, _) = where[id(w)], where[id(b)]
                pw, pb, wh = self._encode_layer(layer, buf[wo : wo + wn].view(ws), buf[bo : bo + bn], rec)
                joint[id(w)] = (pw, wh, (bo, bn) if wh is not None else None)
                joint[id(b)] = (pb, None, None)
            elif (id(w) in where or id(b) in where) and layer not in self._split_warned:
                self._split_warned.add(layer)
                warnings.warn(f"GIFT: {layer}'s weight and bias are in different DDP buckets; the layer is sent "
                              "Euclidean (raise bucket_cap_mb, or bias=False to whiten the weight alone)", stacklevel=2)
        return joint

    def _encode_layer(self, layer: str, g: Tensor, gb: Tensor | None,
                      rec: StepRecord) -> tuple[Tensor, Tensor | None, Transform | None]:
        """Weight ``g`` ``(out, in)`` and bias ``gb`` ``(out,)`` (or None) of one candidate layer: (weight
        payload, bias payload or None, the whitening to undo after the average or None). GIFT whitens
        ``X = [g | gb]`` (or ``g``) and sends it as the weight's and the bias's payloads."""
        w_name, b_name = self._layer_weight_name[layer], self._layer_bias_name.get(layer)
        wh = self.transform(layer)
        use_gift = layer in self.selected and wh is not None
        collecting = self.selector.collecting(self.step)
        stats = collecting or self.measure_error
        codec, ef_plain = self.codec, self.error_feedback
        g32 = g.to(torch.float32)
        b32 = gb.reshape(-1).to(torch.float32) if gb is not None else None
        if not (use_gift or stats):
            pb = self._quantize_plain(b_name, b32, ef_plain, False)[0] if b32 is not None else None
            return self._quantize_plain(w_name, g32.reshape(-1), ef_plain, False)[0], pb, None
        d = g32.shape[1]
        x_full = torch.cat([g32, b32.view(-1, 1)], dim=1) if b32 is not None else g32

        def encode(x: Tensor) -> tuple[Tensor, Tensor | None]:  # per tensor: the weight's columns, the bias's
            if b32 is None:
                return codec.encode(x, name=w_name), None
            return codec.encode(x[:, :d].contiguous(), name=w_name), codec.encode(x[:, d].contiguous(), name=b_name)

        def decode(pw: Tensor, pb: Tensor | None) -> Tensor:
            dw = codec.decode(pw, x_full.shape[0] * d).view(-1, d)
            return dw if pb is None else torch.cat([dw, codec.decode(pb, x_full.shape[0]).view(-1, 1)], dim=1)

        gift_one = sent = None
        if use_gift:
            u = wh.whiten(x_full)
            ef = self.gift_error_feedback
            x = ef.compensate(layer, u) if ef is not None else u
            pw, pb = encode(x)
            if ef is not None or stats:
                dec = decode(pw, pb)
                if ef is not None:
                    ef.update(layer, x, dec)
                if stats:
                    sent = wh.unwhiten(dec)
                    gift_one = sent if ef is None else wh.unwhiten(decode(*encode(u)))
        else:
            pw, sw = self._quantize_plain(w_name, g32.reshape(-1), ef_plain, True)
            sent = sw.view(g32.shape)
            pb = None
            if b32 is not None:
                pb, sb = self._quantize_plain(b_name, b32, ef_plain, True)
                sent = torch.cat([sent, sb.view(-1, 1)], dim=1)
        if not stats:
            return pw, pb, wh

        # statistics of the layer (on [G | b] with a bias): Euclidean, per tensor as that path sends them, and GIFT
        if not use_gift and ef_plain is None:
            pe, eu = pw, sent
        else:
            pe, pe_b = encode(x_full)
            eu = decode(pe, pe_b)
        upper, lower = saturation_rates(codec, pe, g32)
        if gift_one is None and wh is not None and (self.measure_error or self.selector.select_by == "gain"):
            gift_one = wh.unwhiten(decode(*encode(wh.whiten(x_full))))
        ref = _norm_sq(x_full)
        eu_err = _rel(_norm_sq(eu - x_full), ref)
        gift_err = _rel(_norm_sq(gift_one - x_full), ref) if gift_one is not None else None
        if collecting and ref > 0:
            self.selector.observe(layer, upper=upper, lower=lower, euclid_err=eu_err, gift_err=gift_err)
        if self.measure_error:
            one, path = (gift_one if use_gift else eu), ("gift" if use_gift else "euclid")
            self._record(rec, w_name, g32, one[:, :d], sent[:, :d], eu[:, :d], path)
            if b32 is not None:
                self._record(rec, b_name, b32, one[:, d], sent[:, d], eu[:, d], path)
            self.layer_history.append({
                "step": self.step, "layer": layer, "selected": bool(use_gift),
                "euclid_rel_error": eu_err, "gift_rel_error": gift_err,
                "sent_rel_error": _rel(_norm_sq(sent - x_full), ref),
                "upper_hit": upper, "lower_hit": lower,
                "condition_number": wh.condition_number if wh is not None else None,
            })
        return pw, pb, (wh if use_gift else None)

    def _encode_param(self, name: str, p: Tensor, g: Tensor, rec: StepRecord) -> tuple[Tensor, Transform | None]:
        layer = self._weight_layer.get(id(p))
        if layer is None or g.dim() != 2 or layer in self._layer_bias:  # the last: bias in another bucket
            g32 = g.reshape(-1).to(torch.float32)  # Euclidean path (LayerNorm, a split layer)
            ef = self.error_feedback
            payload, sent = self._quantize_plain(name, g32, ef, self.measure_error)
            if self.measure_error:
                one = sent if ef is None else self.codec.decode(self.codec.encode(g32, name=name), g32.numel())
                self._record(rec, name, g32, one, sent, one, "euclid")
            return payload, None
        payload, _, whitening = self._encode_layer(layer, g, None, rec)
        return payload, whitening

    # widget data -----------------------------------------------------------------------------------

    def layer_table(self) -> list[dict]:
        """The latest per-layer picture: one dict per candidate (latest measured record, selection, score).

        Keys: ``layer``, ``selected``, ``score`` (latest selection's, None before), plus the latest
        :attr:`layer_history` fields for that layer (None when not measured), and ``gain``
        (``euclid_rel_error / gift_rel_error``).
        """
        latest: dict[str, dict] = {}
        for r in self.layer_history:
            latest[r["layer"]] = r
        scores = self.selector.history[-1]["scores"] if self.selector.history else {}
        out = []
        for name in self.layers:
            r = latest.get(name, {})
            eu, gi = r.get("euclid_rel_error"), r.get("gift_rel_error")
            out.append({
                "layer": name, "selected": name in self.selected, "score": scores.get(name),
                "step": r.get("step"), "euclid_rel_error": eu, "gift_rel_error": gi,
                "gain": (eu / gi) if (eu is not None and gi) else None,
                "upper_hit": r.get("upper_hit"), "lower_hit": r.get("lower_hit"),
                "condition_number": self.transform(name).condition_number if name in self.whitening else None,
            })
        return out


def _unflatten_factors(flat: Tensor, shapes: Mapping[str, tuple[int, int]]) -> dict[str, Whitening]:
    """Split a broadcast ``[to_flat() of each factor]`` vector back into factors; ``shapes``: name -> (dim, rank), in order."""
    out, pos = {}, 0
    for n, (d, k) in shapes.items():
        m = d * k + k + 1
        out[n] = Whitening.from_flat(flat[pos : pos + m], d, k)
        pos += m
    return out
