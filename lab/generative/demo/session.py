"""One demo run: :class:`RestorationSession` (measure, restore with every step recorded, score),
its :class:`DemoResult` and :class:`Trajectory`, and :class:`BackgroundRun`. Part of :mod:`lab.generative.demo`."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from lab.generative.errors import GenerativeError, MethodError
from lab.generative.metrics import psnr
from lab.generative.operators import get_operator
from lab.generative.priors import FlowPrior
from lab.generative.demo.catalogue import DemoPrior, load_prior, method_label, parse_method
from lab.generative.demo.imaging import ImageError, image_png, to_prior_image


class RunCancelled(GenerativeError):
    """A demo run was cancelled between two prior evaluations (a newer run replaced it)."""


# --------------------------------------------------------------------------------------------- runs
class _WatchedPrior(FlowPrior):
    """Delegates to a prior; counts its own NFE, reports progress, honours cancellation and
    (optionally) records every query's state and endpoints (batch element 0)."""

    def __init__(self, inner: FlowPrior, total: int, progress, cancel, record: bool):
        super().__init__(inner.shape, inner.tuning_key)
        self.inner, self.total, self.progress, self.cancel = inner, int(total), progress, cancel
        self.queries: list[tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]] | None = [] if record else None

    def _before(self):
        if self.cancel is not None and self.cancel.is_set():
            raise RunCancelled("cancelled")

    def _after(self, x, t, v=None, b_hat=None):
        self.nfe += 1
        if self.queries is not None:
            tt = float(t.flatten()[0]) if torch.is_tensor(t) else float(t)
            x0 = x[0].detach().to("cpu", torch.float64)
            if v is not None:
                v0 = v[0].detach().to("cpu", torch.float64)
                b0 = x0 + (1 - tt) * v0
            else:
                b0 = b_hat[0].detach().to("cpu", torch.float64)
                v0 = (b0 - x0) / (1 - tt) if tt < 1 else torch.full_like(x0, float("nan"))
            self.queries.append((tt, x0, x0 - tt * v0, b0))
        if self.progress is not None:
            self.progress(self.nfe, self.total)

    def velocity(self, x, t):
        self._before()
        v = self.inner.velocity(x, t)
        self._after(x, t, v=v)
        return v

    def clean_estimate(self, x, t):
        self._before()
        b = self.inner.clean_estimate(x, t)
        self._after(x, t, b_hat=b)
        return b

    def denoiser(self, x, t):
        return self.clean_estimate(x, t)

    def posterior_mean(self, y, operator):
        return self.inner.posterior_mean(y, operator)


@dataclass
class Trajectory:
    """Per-step arrays of one run, for scrubbing (batch element 0; images on [-1, 1]).

    Attributes
    ----------
    source : ``"method"`` (the method's own record) or ``"prior queries"`` (what the prior was asked)
    t : array (K,)
        Flow time of each step.
    images : dict name -> array (K, C, H, W) float32
        ``x`` (the state), ``a_hat``, ``b_hat`` and, for ReBridge-type methods, ``b_bar`` and ``a_bar``.
    terms : dict name -> array (K,)
        The defect terms at the step's endpoints (ReBridge-Flow: ``measurement_defect``,
        ``clean_prior_deviation``, ``source_prior_deviation``, ``bridge_residual``, ``defect``;
        re-coupled ADMM: ``measurement_defect``, ``clean_prior_deviation``, ``multiplier``, ``defect``).
    mismatch : dict name -> array (K,)
        RMS of ``H b - y`` over observed entries ([-1, 1] scale): ``mismatch_hat`` (``b = b_hat``)
        and, for ReBridge-type methods, ``mismatch_bar`` (``b = b_bar``).
    other : dict name -> array (K,)
        Further scalars of the record (``gamma``, ``residual_clean_side``, ``residual_recoupled``, ...).
    sigma_y : float
        The measurement noise (the level the mismatch should reach).
    """

    source: str
    t: np.ndarray
    images: dict
    terms: dict
    mismatch: dict
    other: dict
    sigma_y: float

    @property
    def steps(self) -> int:
        return int(len(self.t))

    def at(self, k: int) -> dict:
        """Everything at step ``k``: ``{"k", "t", images..., terms..., mismatch..., other...}``."""
        k = int(k)
        if not 0 <= k < self.steps:
            raise IndexError(f"step {k} outside 0..{self.steps - 1}")
        out = {"k": k, "t": float(self.t[k])}
        out.update({n: a[k] for n, a in self.images.items()})
        for d in (self.terms, self.mismatch, self.other):
            out.update({n: float(a[k]) for n, a in d.items()})
        return out


_TERM_KEYS = ("measurement_defect", "clean_prior_deviation", "source_prior_deviation", "bridge_residual", "multiplier", "defect")
_IMAGE_KEYS = ("x", "a", "a_hat", "b_hat", "b_bar", "a_bar")


def _trajectory_from_record(steps: list, sigma_y: float) -> Trajectory:
    def first(v):
        return float(v.flatten()[0]) if torch.is_tensor(v) else float(v)

    t = np.array([s.t for s in steps], dtype=np.float64)
    images = {}
    for name in _IMAGE_KEYS:
        if getattr(steps[0], name, None) is not None:
            images[name] = np.stack([getattr(s, name)[0].double().numpy() for s in steps]).astype(np.float32)
    terms = {n: np.array([first(s.terms[n]) for s in steps]) for n in _TERM_KEYS if n in steps[0].terms}
    mismatch = {n: np.array([first(getattr(s, n)) for s in steps]) for n in ("mismatch_hat", "mismatch_bar")}
    other = {}
    for n in ("gamma", "rho", "residual_clean_side", "residual_recoupled", "multiplier_norm"):
        if hasattr(steps[0], n):
            other[n] = np.array([first(getattr(s, n)) for s in steps])
    return Trajectory("method", t, images, terms, mismatch, other, float(sigma_y))


def _trajectory_from_queries(queries: list, y: torch.Tensor, operator) -> Trajectory | None:
    if not queries:
        return None
    t = np.array([q[0] for q in queries], dtype=np.float64)
    xs = torch.stack([q[1] for q in queries])
    a_hat = torch.stack([q[2] for q in queries])
    b_hat = torch.stack([q[3] for q in queries])
    n_obs = max(1, operator.observed_count)
    r = operator.H(b_hat.to(y.dtype)) - y[:1].to("cpu").expand(len(queries), *y.shape[1:])
    mism = ((r.double() ** 2).flatten(1).sum(1) / n_obs).sqrt().numpy()
    images = {"x": xs.float().numpy(), "a_hat": a_hat.float().numpy(), "b_hat": b_hat.float().numpy()}
    return Trajectory("prior queries", t, images, {}, {"mismatch_hat": mism}, {}, float(operator.sigma_y))


@dataclass
class DemoResult:
    """What :meth:`RestorationSession.run` returns. Images are float32 arrays (C, H, W) on [-1, 1];
    ``measurement`` is ``y`` in the operator's measurement shape, ``degraded`` its image-shaped view
    (``degraded_kind``), ``observed`` the mask of observed pixels (inpainting) or None.

    ``metrics`` maps ``"degraded"``, ``"restored"`` and (exact priors) ``"bayes"`` to
    ``{"psnr": dB, "ssim": ...}`` against the ground truth, on [0, 1] (clipped).
    """

    prior: str
    task: str
    method: str
    method_key: str
    nfe: int
    seed: int
    hyper: dict
    hyper_source: str
    truth: np.ndarray
    measurement: np.ndarray
    degraded: np.ndarray
    degraded_kind: str
    restored: np.ndarray
    bayes: np.ndarray | None
    observed: np.ndarray | None
    metrics: dict
    seconds: float
    trajectory: Trajectory | None
    sigma_y: float
    image_info: dict = field(default_factory=dict)

    def summary(self) -> str:
        """One line: method, task, NFE and the PSNR/SSIM of each output."""
        parts = [f"{k} {v['psnr']:.2f} dB / {v['ssim']:.3f}" for k, v in self.metrics.items()]
        return f"{method_label(self.method_key)} on {self.task} at {self.nfe} NFE: " + ", ".join(parts)

    def png(self, name: str = "restored", scale: int = 1) -> bytes:
        """PNG bytes of one output (``"restored"``, ``"degraded"``, ``"truth"`` or ``"bayes"``) at its own
        resolution (the prior's ``H x W``; ``scale`` > 1 upscales by nearest neighbour), grayscale 8 bit
        (``round(255 (x + 1) / 2)`` of the value clipped to [-1, 1]); what the demo's download offers.
        Raises :class:`GenerativeError` for an unknown name or an output this run does not have."""
        arr = {"restored": self.restored, "degraded": self.degraded, "truth": self.truth, "bayes": self.bayes}.get(name, _UNKNOWN)
        if arr is _UNKNOWN:
            raise GenerativeError(f"unknown output {name!r}; outputs: restored, degraded, truth, bayes")
        if arr is None:
            raise GenerativeError(f"{name}: this run has none ({empty_reasons(self)['bayes']})")
        return image_png(arr, scale=int(scale))

    def download_name(self, name: str = "restored") -> str:
        """A file name for :meth:`png`: output, prior, task, method, NFE, seed and image, e.g.
        ``restored_gaussian-digits_inpaint_box_rebridge_50nfe_seed0_test1.png``."""
        info = self.image_info
        image = f"test{info['test_index']}" if "test_index" in info else "upload"
        method = self.method_key.replace(":", "-")
        return f"{name}_{self.prior}_{self.task}_{method}_{self.nfe}nfe_seed{self.seed}_{image}.png"


_UNKNOWN = object()

#: why a baseline has no anchored endpoint b_bar in the demo's trajectory (it records the prior's queries only)
_NO_ANCHOR = {
    "flower": "Flower refines b_hat against y inside each step (b1*, its Algorithm 1) and keeps no record of it",
    "pnp_flow": "PnP-Flow takes a gradient step on the data term, then queries the prior: it forms no anchored endpoint",
    "ot_ode": "OT-ODE adds a guidance term to the velocity: it forms no anchored endpoint",
    "d_flow": "D-Flow optimises the source noise through the whole ODE: it forms no anchored endpoint per step",
}
#: the demo's outputs that can be empty: the Bayes panel, the four step images and the two charts
EMPTY_OUTPUTS = ("bayes", "x", "a_hat", "b_hat", "b_bar", "terms", "mismatch")


def empty_reasons(result: "DemoResult") -> dict[str, str]:
    """Why an output of ``result`` has nothing to draw: ``{output: reason}`` for the outputs of
    :data:`EMPTY_OUTPUTS` that are empty (the others are absent from the dict).

    ``bayes``: the prior has no exact posterior mean (a learned prior). The step images ``x``,
    ``a_hat``, ``b_hat``, ``b_bar`` and the charts ``terms`` (defect terms) and ``mismatch``: the
    Bayes method takes no steps; ``b_bar`` and ``terms`` exist only for ReBridge-type methods (their
    own record); the baselines' trajectory is the prior's queries."""
    out: dict[str, str] = {}
    if result.bayes is None:
        out["bayes"] = (f"no Bayes ceiling: {result.prior} is a learned prior, whose posterior mean E[x | y] "
                        "has no closed form")
    traj = result.trajectory
    label = method_label(result.method_key)
    if traj is None:
        why = f"{label}: computed in closed form ({result.nfe} NFE), no flow steps to show"
        return {**out, **{k: why for k in ("x", "a_hat", "b_hat", "b_bar", "terms", "mismatch")}}
    for name in ("x", "a_hat", "b_hat", "b_bar"):
        if name not in traj.images:
            out[name] = f"no {name}: " + _NO_ANCHOR.get(result.method, f"{label} keeps no {name}")
    if not traj.terms:
        out["terms"] = (f"no defect terms: the Posterior Bridge Defect (Eq. 6) is ReBridge-Flow's; {label} minimises "
                        "none. Its queries' measurement mismatch is on the right")
    if not traj.mismatch:
        out["mismatch"] = f"no measurement mismatch recorded for {label}"
    return out


def progress_text(done: int, total: int, elapsed: float) -> str:
    """The demo's progress line, from tqdm's meter: ``"37/100 NFE · 0.8 s · 46.2 NFE/s · 1.4 s left"``.
    ``total`` 0 is a closed-form run (the Bayes mean); ``elapsed`` in seconds."""
    from tqdm import tqdm

    if total <= 0:
        return f"closed form (0 NFE) · {elapsed:.2f} s"
    if done <= 0 or elapsed <= 0:
        return f"0/{total} NFE · starting"
    fmt = "{n_fmt}/{total_fmt} NFE · {elapsed_s:.1f} s · {rate_fmt}" + (" · {remaining_s:.1f} s left" if done < total else "")
    return tqdm.format_meter(done, total, elapsed, unit=" NFE", bar_format=fmt)


def gallery(prior: DemoPrior, n: int = 12, size: int = 48) -> list[dict]:
    """The prior's first ``n`` held-out test images as example thumbnails: ``[{"index": int, "label": str,
    "png": bytes}]`` (``size`` pixels, nearest-neighbour upscaled). The images come from the prior's data
    set as :func:`load_prior` read it (scikit-learn's digits, or :mod:`lab.generative.datasets` through
    :mod:`lab.data`); nothing is fetched."""
    k = min(int(n), prior.test_images.shape[0])
    return [{"index": i, "label": prior.test_names[i], "png": image_png(prior.test_images[i], size=size)} for i in range(k)]


def _ssim(x: torch.Tensor, ref: torch.Tensor) -> float:
    try:
        from lab.generative.metrics import ssim
    except ImportError:  # pragma: no cover - metrics.ssim ships with the lab; scikit-image directly otherwise
        from skimage.metrics import structural_similarity

        a = ((x[0].double().clamp(-1, 1) + 1) / 2).cpu().numpy().transpose(1, 2, 0)
        b = ((ref[0].double().clamp(-1, 1) + 1) / 2).cpu().numpy().transpose(1, 2, 0)
        return float(structural_similarity(a, b, data_range=1.0, win_size=min(7, a.shape[0] - 1 + a.shape[0] % 2), channel_axis=2))
    return float(ssim(x, ref)[0])


def _scores(x: torch.Tensor, ref: torch.Tensor) -> dict:
    return {"psnr": float(psnr(x, ref)[0]), "ssim": _ssim(x, ref)}


def _np(x: torch.Tensor) -> np.ndarray:
    return x[0].detach().to("cpu", torch.float32).numpy()


class RestorationSession:
    """One image restored by one method, with everything the demo shows.

    Parameters
    ----------
    prior : str or DemoPrior
        A name of :data:`PRIOR_CHOICES` (:func:`load_prior`) or a loaded :class:`DemoPrior`.
    image : int, array, tensor, PIL image or bytes
        An index into the prior's test images, or an image converted by :func:`to_prior_image`.
    task : str
        An operator name (:data:`TASK_CHOICES`); ``operator_kw`` goes to :func:`get_operator`.
    method : str
        A key of :data:`METHOD_CHOICES` (``"rebridge"``, ``"rebridge:projected"``, ``"recoupled_admm"``, ...).
    nfe : int
        Prior evaluations for the method.
    hyper : None, "paper", "tuned" or dict
        ``"paper"``/None: the method's paper values; ``"tuned"``: ``tuned.json`` for the prior's
        tuning kind; a dict overrides the paper values (e.g. ``{"kappa": 50}``).
    seed : int
        Seeds the measurement noise and the method's draws.
    invert : bool or "auto"
        For a converted image (see :func:`to_prior_image`).
    """

    def __init__(self, prior: str | DemoPrior = "gaussian-digits", image=0, task: str = "denoise", method: str = "rebridge",
                 nfe: int = 50, hyper: str | dict | None = None, seed: int = 0, invert: bool | str = "auto",
                 operator_kw: dict | None = None):
        self.prior = load_prior(prior) if isinstance(prior, str) else prior
        self.task, self.method_key, self.nfe, self.seed = task, method, int(nfe), int(seed)
        self.method, self._fixed = parse_method(method)
        self.operator = get_operator(task, self.prior.shape, **(operator_kw or {}))
        self.hyper_arg = hyper
        if isinstance(image, (int, np.integer)) and not isinstance(image, bool):
            n = self.prior.test_images.shape[0]
            if not 0 <= int(image) < n:
                raise ImageError(f"test image index {image} outside 0..{n - 1}")
            self.truth = self.prior.test_images[int(image)][None].to(self.prior.device, self.prior.dtype)
            self.image_info = {"test_index": int(image), "name": self.prior.test_names[int(image)]}
        else:
            x, info = to_prior_image(image, self.prior.shape, invert, self.prior.background)
            self.truth = x[None].to(self.prior.device, self.prior.dtype)
            self.image_info = info

    @property
    def budget(self) -> int:
        """Prior evaluations the run will report to ``progress``: ``nfe``, or 0 for a closed-form method."""
        from lab.generative.restore import METHODS

        return self.nfe if METHODS[self.method].uses_nfe else 0

    def _hyper(self) -> tuple[dict, str]:
        """The run's values and their source, from :func:`lab.generative.restore.resolve_hyper` (as
        :func:`~lab.generative.restore.restore` resolves them), plus the method key's fixed values."""
        from lab.generative.restore import METHODS, resolve_hyper

        h = self.hyper_arg
        if not (h is None or h in ("paper", "tuned") or isinstance(h, dict)):
            raise MethodError(f"hyper must be None, 'paper', 'tuned' or a dict, got {h!r}")
        values, source = resolve_hyper(self.method, h, self.operator, self.prior.prior, self.nfe)
        values = {**values, **self._fixed}
        names = {f.name for f in dataclasses.fields(METHODS[self.method].Config)}
        if "record" in names:
            values["record"] = "full"
        return values, source

    def run(self, progress: Callable[[int, int], None] | None = None, cancel: threading.Event | None = None) -> DemoResult:
        """Measure, restore (with the full per-step record), compute the Bayes ceiling and the scores.

        ``progress(done, total)`` is called after each prior evaluation; setting ``cancel`` stops
        the run at the next evaluation with :class:`RunCancelled`.
        """
        from lab.generative.restore import METHODS, restore

        op, x = self.operator, self.truth
        y = op.measure(x, torch.Generator().manual_seed(self.seed))
        values, source = self._hyper()
        uses_nfe = METHODS[self.method].uses_nfe
        own_record = "record" in values
        watched = _WatchedPrior(self.prior.prior, self.nfe if uses_nfe else 0, progress, cancel, record=not own_record)
        if progress is not None:
            progress(0, watched.total)
        if self.method == "bayes" and not self.prior.exact:
            raise MethodError(f"bayes: the prior {self.prior.name!r} has no exact posterior mean (learned priors have none)")
        t0 = time.perf_counter()
        out = restore(self.method, y, op, watched, nfe=self.nfe, seed=self.seed, **values)
        seconds = time.perf_counter() - t0
        if cancel is not None and cancel.is_set():
            raise RunCancelled("cancelled")
        same_shape = tuple(op.measurement_shape) == tuple(op.shape)
        degraded = y if same_shape else op.pinv(y, eps=1e-10)
        bayes = self.prior.prior.posterior_mean(y, op) if self.prior.exact else None
        metrics = {"degraded": _scores(degraded, x), "restored": _scores(out.x, x)}
        if bayes is not None:
            metrics["bayes"] = _scores(bayes, x)
        observed = None
        if hasattr(op, "mask"):
            observed = op.mask.detach().cpu().numpy()[0].astype(bool)
        if own_record and out.trajectory:
            traj = _trajectory_from_record(out.trajectory, op.sigma_y)
        else:
            traj = _trajectory_from_queries(watched.queries or [], y.detach().cpu(), op)
        hyper = {k: v for k, v in out.hyper.items() if k != "record"}
        if progress is not None and watched.total == 0:
            progress(0, 0)
        return DemoResult(
            prior=self.prior.name, task=self.task, method=self.method, method_key=self.method_key, nfe=out.nfe,
            seed=self.seed, hyper=hyper, hyper_source=source, truth=_np(x), measurement=_np(y), degraded=_np(degraded),
            degraded_kind="y" if same_shape else "pseudo-inverse H^+ y", restored=_np(out.x),
            bayes=None if bayes is None else _np(bayes), observed=observed, metrics=metrics, seconds=seconds,
            trajectory=traj, sigma_y=float(op.sigma_y), image_info=dict(self.image_info),
        )


class BackgroundRun:
    """Run ``fn(progress, cancel)`` in a daemon thread.

    Parameters
    ----------
    fn : callable(progress, cancel) -> result
    progress : callable(done, total), optional
        Passed through to ``fn``.
    on_done, on_error : callables, optional
        Called in the worker thread with the result, or with the exception (not for a cancelled run).
    after : BackgroundRun, optional
        A previous run: it is cancelled and waited for before ``fn`` starts (one run at a time).
    start : bool
        Start the thread now (default); else call :meth:`start`.
    """

    def __init__(self, fn: Callable, *, progress=None, on_done=None, on_error=None, after: "BackgroundRun | None" = None,
                 name: str = "lab-restoration-demo", start: bool = True):
        self.cancel_event = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.cancelled = False
        self._fn, self._progress, self._on_done, self._on_error, self._after = fn, progress, on_done, on_error, after
        if after is not None:
            after.cancel()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        if start:
            self.thread.start()

    def start(self) -> "BackgroundRun":
        """Start the thread (when constructed with ``start=False``)."""
        self.thread.start()
        return self

    def _main(self):
        if self._after is not None:
            self._after.wait()
            self._after = None
        try:
            if self.cancel_event.is_set():
                raise RunCancelled("cancelled before it started")
            self.result = self._fn(self._progress, self.cancel_event)
        except RunCancelled:
            self.cancelled = True
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            self.error = exc
            if self._on_error is not None:
                self._on_error(exc)
            return
        if self._on_done is not None:
            self._on_done(self.result)

    def cancel(self) -> None:
        """Ask the run to stop at its next prior evaluation."""
        self.cancel_event.set()

    def wait(self, timeout: float | None = None):
        """Wait for the thread; return the result (None when cancelled or failed)."""
        if self.thread.ident is None:
            raise GenerativeError("BackgroundRun.wait: the run was never started")
        self.thread.join(timeout)
        return self.result

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()
