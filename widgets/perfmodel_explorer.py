"""Performance-model explorer: a what-if view of one distributed GPT training step.

A thin view over :class:`lab.training.perfmodel.explore.Explorer`. Controls: layers, hidden size, heads,
sequence length, micro-batch, micro-batches per step, DP / TP / PP degrees, the hardware (``local``: this
machine with the learned model; a hardware file: the roofline on its numbers), the tier (loopback or the
shaped slow tier) and the pipeline schedule. Outputs: a stacked bar of the predicted step by operator and
collective per pipeline stage (the measured step beside it when the benchmark ran that configuration),
the simulated pipeline schedule as a Gantt chart, and a status line (predicted, measured, error; a bad
configuration is named there, nothing is drawn from it).
"""

from __future__ import annotations

import html

import ipywidgets as W
from pydantic import ValidationError

from lab.training.perfmodel import PerfConfig, available_hardware
from lab.training.perfmodel.explore import CONTROLS, DEFAULT_CONFIG, Explorer, breakdown_figure, gantt_figure, initial_controls
from widgets.live_chart import LiveChart

__all__ = ["PerfModelExplorer"]


def _fmt(seconds: float) -> str:
    """``1.23 ms`` or ``45.6 us`` (what-if steps on a GPU are far shorter than the ones measured here)."""
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"

_STYLE = {"description_width": "120px"}


class PerfModelExplorer(W.VBox):
    """Sliders and dropdowns for a configuration; its predicted step, schedule and measured step.

    Parameters
    ----------
    explorer : Explorer, optional
        Default: built from the committed benchmark files.
    config : PerfConfig, optional
        The initial configuration (default: the benchmark's PP=2 run of d 128,
        :data:`lab.training.perfmodel.explore.DEFAULT_CONFIG`).
    hardware : str
        ``"local"`` (this machine, learned) or a hardware file's name (roofline).
    tier : {"loopback", "slow"}
        The network tier of the learned model.
    schedule : {"1f1b", "afab"}
        The pipeline schedule.
    n_layer, d_model, n_head, seq_len, micro_batch, n_micro_batches, dp, tp, pp : int, optional
        Initial values of those controls in place of ``config``'s (each one a value its control offers,
        :data:`~lab.training.perfmodel.explore.CONTROLS`; together they may be inconsistent: the status says why).

    Raises
    ------
    lab.training.errors.ExplorerError
        A value a control does not offer.
    """

    def __init__(self, explorer: Explorer | None = None, config: PerfConfig | None = None, *,
                 hardware: str = "local", tier: str = "loopback", schedule: str = "1f1b",
                 n_layer: int | None = None, d_model: int | None = None, n_head: int | None = None,
                 seq_len: int | None = None, micro_batch: int | None = None, n_micro_batches: int | None = None,
                 dp: int | None = None, tp: int | None = None, pp: int | None = None):
        start = initial_controls(config, hardware=hardware, tier=tier, schedule=schedule, n_layer=n_layer,
                                 d_model=d_model, n_head=n_head, seq_len=seq_len, micro_batch=micro_batch,
                                 n_micro_batches=n_micro_batches, dp=dp, tp=tp, pp=pp)
        self.explorer = explorer or Explorer()
        self.vocab_size = (config or DEFAULT_CONFIG).vocab_size
        for name, (label, values) in CONTROLS.items():
            if isinstance(values, range):
                w = W.IntSlider(value=start[name], min=values.start, max=values.stop - 1, step=values.step,
                                description=label, style=_STYLE, continuous_update=False)
            else:
                w = W.Dropdown(options=list(values), value=start[name], description=label, style=_STYLE)
            setattr(self, name, w)
        self.hardware = W.Dropdown(options=[("this machine (learned)", "local")] +
                                   [(f"{h} (roofline)", h) for h in available_hardware()],
                                   value=start["hardware"], description="hardware", style=_STYLE)
        self.tier = W.Dropdown(options=[("loopback (one tier)", "loopback"), ("shaped slow tier", "slow")],
                               value=start["tier"], description="network", style=_STYLE)
        self.schedule = W.Dropdown(options=[("1F1B", "1f1b"), ("all-F-all-B", "afab")], value=start["schedule"],
                                   description="schedule", style=_STYLE)
        self.status = W.HTML()
        self.status.add_class("lab-perfmodel-status")
        self.bars, self.gantt = LiveChart(), LiveChart()
        self.bars.add_class("lab-perfmodel-bars")
        self.gantt.add_class("lab-perfmodel-gantt")
        controls = [getattr(self, name) for name in CONTROLS] + [self.hardware, self.tier, self.schedule]
        for w in controls:
            w.observe(lambda _change: self.refresh(), names="value")
        left = W.VBox(controls[:6])
        right = W.VBox(controls[6:])
        super().__init__([W.HBox([left, right]), self.status, self.bars, self.gantt])
        self.add_class("lab-perfmodel-explorer")
        self.result = None
        self.refresh()

    def config(self) -> PerfConfig:
        """The controls' configuration (pydantic ``ValidationError`` for an inconsistent one)."""
        return PerfConfig(n_layer=self.n_layer.value, d_model=self.d_model.value, n_head=self.n_head.value,
                          seq_len=self.seq_len.value, vocab_size=self.vocab_size, micro_batch=self.micro_batch.value,
                          n_micro_batches=self.n_micro_batches.value, dp=self.dp.value, tp=self.tp.value,
                          pp=self.pp.value)

    def refresh(self) -> None:
        """Predict the controls' configuration and redraw."""
        try:
            cfg = self.config()
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]) or "configuration"
            self.status.value = f"<b>not a valid configuration</b> ({html.escape(where)}): {html.escape(err['msg'])}"
            return
        res = self.explorer.predict(cfg, self.hardware.value, self.tier.value, self.schedule.value)
        self.result = res
        p = res.prediction
        text = (f"predicted step <b>{_fmt(p.total_s)}</b> ({res.model}, {html.escape(res.hardware)}); "
                f"stage forward max {_fmt(p.max_fwd_s)}, backward max {_fmt(p.max_bwd_s)}")
        if res.measured_s is not None:
            err = (p.total_s - res.measured_s) / res.measured_s * 100
            text += f"; <b>measured {_fmt(res.measured_s)}</b> (error {err:+.1f} %)"
        else:
            text += "; not measured here"
        self.status.value = text
        self.bars.figure = breakdown_figure(p, cfg, res.measured_s)
        self.gantt.figure = gantt_figure(p, cfg)
