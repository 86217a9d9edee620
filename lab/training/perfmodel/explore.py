"""What the performance-model explorer shows: a predicted step by operator, its pipeline timeline, and
the measured step beside it where the benchmark ran that configuration.

:class:`Explorer` loads the committed benchmark files (the sampler's samples, the gloo collective curves,
the validation runs and the chosen regressors of ``benchmarks/results/perfmodel*.json``), refits the
chosen regressors, applies the report's in-situ calibration, and answers ``predict(config, hardware)``:
``"local"`` is this machine with the learned model; any hardware file name (:func:`.hardware.available_hardware`) is a what-if with the
roofline on that file's numbers. :data:`CONTROLS`, :data:`TIERS` and :data:`SCHEDULES` are the values the
explorer offers (its sliders' ranges and dropdowns' choices, and its dashboard's URL parameters);
:func:`initial_controls` checks a starting point against them. The figures are plain plotly dicts (:func:`breakdown_figure`,
:func:`gantt_figure`), drawn by :class:`widgets.PerfModelExplorer`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from lab.training.perfmodel.comm import CommModel
from lab.training.perfmodel.compose import StepPrediction
from lab.training.errors import ExplorerError
from lab.training.perfmodel.config import PerfConfig
from lab.training.perfmodel.hardware import available_hardware, load_hardware
from lab.training.perfmodel.predict import Calibration, LearnedPredictor, placement_of
from lab.training.perfmodel.regress import fit_primitives
from lab.training.perfmodel.roofline import Roofline

__all__ = ["CONTROLS", "DEFAULT_CONFIG", "Explorer", "ExplorerResult", "RESULTS_DIR", "SCHEDULES", "TIERS",
           "breakdown", "breakdown_figure", "gantt_figure", "hardware_choices", "initial_controls"]

RESULTS_DIR = Path(__file__).resolve().parents[3] / "benchmarks" / "results"

#: The configuration fields the explorer lets one change: ``field -> (label, values)``; a ``range`` is a
#: slider's (inclusive of ``start``, exclusive of ``stop``), a tuple a dropdown's choices.
CONTROLS: dict[str, tuple[str, range | tuple[int, ...]]] = {
    "n_layer": ("layers", range(1, 49)),
    "d_model": ("hidden size", (64, 128, 192, 256, 512, 1024, 2048, 4096, 8192)),
    "n_head": ("heads", range(1, 65)),
    "seq_len": ("sequence", (32, 64, 128, 256, 512, 1024, 2048, 4096)),
    "micro_batch": ("micro-batch", range(1, 17)),
    "n_micro_batches": ("micro-batches", range(1, 33)),
    "dp": ("DP", (1, 2, 4, 8, 16, 32)),
    "tp": ("TP", (1, 2, 4, 8)),
    "pp": ("PP", (1, 2, 4, 8)),
}
#: Network tiers of the learned model on this machine: loopback, or one rank per host across the shaped slow tier.
TIERS = ("loopback", "slow")
#: Pipeline schedules: non-interleaved 1F1B (what the benchmark's runs use) and all-forward-all-backward.
SCHEDULES = ("1f1b", "afab")
#: The explorer's starting point: the benchmark's PP = 2 run of d 128 (measured, so its step is drawn beside).
DEFAULT_CONFIG = PerfConfig(n_layer=2, d_model=128, n_head=4, seq_len=64, vocab_size=512, micro_batch=2,
                            n_micro_batches=4, pp=2)

#: Colours per operator group (stable across redraws).
_COLOURS = {"embedding": "#8c564b", "layernorm": "#bcbd22", "linear": "#1f77b4", "attention": "#ff7f0e",
            "gelu": "#2ca02c", "residual": "#7f7f7f", "cross_entropy": "#9467bd", "optimizer_step": "#e377c2",
            "tp_allreduce": "#d62728", "pp_p2p": "#17becf", "dp_allreduce": "#aec7e8", "dp_allgather": "#c5b0d5",
            "idle (bubble, waits)": "#eeeeee", "measured": "#333333"}


def _uid(text: str) -> str:
    """A plotly trace uid that is also a valid CSS class (plotly puts it in selectors)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def _group(name: str) -> str:
    if name.startswith("tp_allreduce"):
        return "tp_allreduce"
    if name.startswith("layernorm"):
        return "layernorm"
    if name.endswith("_linear"):
        return "linear"
    if name in ("embedding", "position_embedding"):
        return "embedding"
    if name.startswith("residual"):
        return "residual"
    return name


def breakdown(pred: StepPrediction, config: PerfConfig) -> dict[int, dict[str, float]]:
    """Per stage, seconds of one step by operator group; each stage's groups sum to ``pred.total_s``.

    A ``micro_batch`` operator counts ``n_micro_batches`` times (forward + backward), the sync and
    update once; what is left of the step on that stage is ``"idle (bubble, waits)"``.
    """
    out: dict[int, dict[str, float]] = {s: {} for s in range(config.pp)}
    m = config.n_micro_batches
    for (stage, name, direction), t in pred.plan.by_operator.items():
        phase_once = name in ("dp_allreduce", "dp_allgather", "optimizer_step")
        g = _group(name)
        out[stage][g] = out[stage].get(g, 0.0) + t * (1 if phase_once else m)
    for s, parts in out.items():
        if "dp_allreduce" in parts and pred.overlap_grad_sync and s == 0:
            parts["dp_allreduce"] = pred.grad_sync_exposed_s
        busy = sum(parts.values())
        parts["idle (bubble, waits)"] = max(pred.total_s - busy, 0.0)
    return out


def breakdown_figure(pred: StepPrediction, config: PerfConfig, measured_s: float | None = None,
                     title: str = "") -> dict:
    """Stacked bars (ms): one per pipeline stage, one trace per operator group; a measured bar beside."""
    parts = breakdown(pred, config)
    groups = [g for g in _COLOURS if any(g in p for p in parts.values())]
    xs = [f"stage {s}" for s in parts]
    data = [{"type": "bar", "name": g, "x": xs, "y": [parts[s].get(g, 0.0) * 1e3 for s in parts],
             "marker": {"color": _COLOURS[g]}, "uid": _uid(f"op-{g}")} for g in groups]
    if measured_s is not None:
        data.append({"type": "bar", "name": "measured step", "x": ["measured"], "y": [measured_s * 1e3],
                     "marker": {"color": _COLOURS["measured"]}, "uid": "measured"})
    return {"data": data, "layout": {"barmode": "stack", "title": {"text": title or f"predicted step {pred.total_s * 1e3:.2f} ms"},
                                     "yaxis": {"title": {"text": "ms per step"}}, "height": 360,
                                     "margin": {"l": 60, "r": 10, "t": 40, "b": 40}}}


def gantt_figure(pred: StepPrediction, config: PerfConfig) -> dict:
    """The simulated schedule as horizontal bars (ms): stages by row, F / B per micro-batch, then the
    exposed gradient sync and the update (needs ``method="simulate"``)."""
    slots = pred.slots or []
    data = []
    for kind, colour, label in (("F", "#1f77b4", "forward"), ("B", "#ff7f0e", "backward")):
        sl = [s for s in slots if s.kind == kind]
        data.append({"type": "bar", "orientation": "h", "name": label, "uid": f"gantt-{kind}",
                     "y": [f"stage {s.stage}" for s in sl], "x": [(s.end - s.start) * 1e3 for s in sl],
                     "base": [s.start * 1e3 for s in sl], "text": [str(s.micro_batch) for s in sl],
                     "textposition": "inside", "marker": {"color": colour, "line": {"color": "white", "width": 1}}})
    if slots:
        end = max(s.end for s in slots)
        tail = [("grad sync", pred.grad_sync_exposed_s, "#aec7e8"), ("update", pred.update_s, "#e377c2")]
        t0 = end
        for label, dur, colour in tail:
            if dur > 0:
                data.append({"type": "bar", "orientation": "h", "name": label, "uid": _uid(f"gantt-{label}"),
                             "y": [f"stage {s}" for s in range(config.pp)], "x": [dur * 1e3] * config.pp,
                             "base": [t0 * 1e3] * config.pp, "marker": {"color": colour}})
                t0 += dur
    return {"data": data, "layout": {"barmode": "overlay", "title": {"text": "pipeline schedule (critical path)"},
                                     "xaxis": {"title": {"text": "ms"}},
                                     "yaxis": {"autorange": "reversed"}, "height": 120 + 60 * config.pp,
                                     "margin": {"l": 70, "r": 10, "t": 40, "b": 40}}}


def hardware_choices() -> tuple[str, ...]:
    """``"local"`` (this machine, learned) and every hardware file's name (roofline)."""
    return ("local", *available_hardware())


def initial_controls(config: PerfConfig | None = None, *, hardware: str = "local", tier: str = "loopback",
                     schedule: str = "1f1b", **fields: int | None) -> dict[str, int | str]:
    """The explorer's starting values: ``config``'s (default :data:`DEFAULT_CONFIG`) control fields, with
    ``fields`` given (not None) in their place, plus ``hardware``, ``tier`` and ``schedule``.

    The fields are checked one by one against :data:`CONTROLS`, not together: an inconsistent combination
    (``n_head`` not divisible by ``tp``) is a configuration the explorer shows, saying why it is refused.

    Raises
    ------
    ExplorerError
        A field that is not a control, or a value its control does not offer (the message names both).
    """
    c = config or DEFAULT_CONFIG
    unknown = sorted(set(fields) - set(CONTROLS))
    if unknown:
        raise ExplorerError(f"the explorer has no control {unknown[0]!r}; its controls: {', '.join(CONTROLS)}")
    out: dict[str, int | str] = {}
    for name, (_label, values) in CONTROLS.items():
        value = fields.get(name)
        value = getattr(c, name) if value is None else value
        if value not in values:
            takes = (f"an integer from {values.start} to {values.stop - 1}" if isinstance(values, range)
                     else "one of " + ", ".join(map(str, values)))
            raise ExplorerError(f"{name}={value!r}: the explorer's control takes {takes}")
        out[name] = value
    for name, value, choices in (("hardware", hardware, hardware_choices()), ("tier", tier, TIERS),
                                 ("schedule", schedule, SCHEDULES)):
        if value not in choices:
            raise ExplorerError(f"{name}={value!r}: the explorer's control takes one of {', '.join(choices)}")
        out[name] = value
    return out


@dataclass(frozen=True)
class ExplorerResult:
    """One answer: the prediction, which model made it, and the measured step where one exists."""

    config: PerfConfig
    hardware: str
    model: str
    prediction: StepPrediction
    measured_s: float | None


class Explorer:
    """Predict any configuration on this machine (learned) or on a hardware file (roofline).

    Parameters
    ----------
    results_dir : Path
        Holds ``perfmodel_samples_cpu.json``, ``perfmodel_comm.json``, ``perfmodel_runs.json`` and
        ``perfmodel.json`` (the benchmark's outputs).

    Raises
    ------
    FileNotFoundError
        A benchmark file is missing (the message says which and how to make it).
    """

    def __init__(self, results_dir: str | Path = RESULTS_DIR):
        d = Path(results_dir)
        files = {k: d / f for k, f in (("samples", "perfmodel_samples_cpu.json"), ("comm", "perfmodel_comm.json"),
                                        ("runs", "perfmodel_runs.json"), ("report", "perfmodel.json"))}
        for k, f in files.items():
            if not f.exists():
                raise FileNotFoundError(f"{f} is missing: run `python -m benchmarks.perfmodel --out {d / 'perfmodel.json'}`")
        report = json.loads(files["report"].read_text())
        samples = json.loads(files["samples"].read_text())
        self.primitives = fit_primitives(samples, chosen=report["regressors"])
        self.comm = CommModel(json.loads(files["comm"].read_text())["rows"])
        # the benchmark's in-situ calibration (seed 0's), when its report has one; it was fitted on 1- and
        # 2-rank loopback runs (and the slow tier's waits on 2-rank runs across it); larger worlds take the
        # 2-rank corrections
        self.calibration = Calibration.from_json(report["calibration"]) if "calibration" in report else None
        self.learned = LearnedPredictor(self.primitives, self.comm, self.calibration)
        self.runs = json.loads(files["runs"].read_text())["runs"]
        self.report = report

    def measured(self, config: PerfConfig, tier: str = "loopback") -> float | None:
        """The benchmark's measured step (median, s) of exactly this configuration and tier, else None."""
        want = config.model_dump(mode="json")
        for r in self.runs:
            if r["config"] == want and r["tier"] == tier:
                return r["measured"]["overall"]
        return None

    def predict(self, config: PerfConfig, hardware: str = "local", tier: str = "loopback",
                schedule: str = "1f1b") -> ExplorerResult:
        """``hardware="local"``: the learned model on ``tier`` (``"loopback"`` or ``"slow"``, one rank per
        shaped host); else the roofline on that hardware file (:func:`.hardware.load_hardware` errors).
        Both simulate ``schedule`` (:data:`SCHEDULES`); the measured step comes along only where the
        benchmark's run used that schedule (1F1B; with one stage the two are the same)."""
        if schedule not in SCHEDULES:
            raise ExplorerError(f"schedule={schedule!r}: one of {', '.join(SCHEDULES)}")
        if hardware == "local":
            if tier not in TIERS:
                raise ExplorerError(f"tier={tier!r}: one of {', '.join(TIERS)}")
            placement = placement_of(tier)
            pred = self.learned.predict(config, placement, schedule=schedule)
            measured = self.measured(config, tier) if schedule == "1f1b" or config.pp == 1 else None
            return ExplorerResult(config, hardware, "learned", pred, measured)
        hw = load_hardware(hardware)
        pred = Roofline.predict(config, hw, method="simulate", schedule=schedule)
        return ExplorerResult(config, hardware, "roofline", pred, None)
