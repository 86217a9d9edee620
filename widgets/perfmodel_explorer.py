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
from lab.training.perfmodel.explore import Explorer, breakdown_figure, gantt_figure
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
        The initial configuration (default: the benchmark's PP=2 run of d 128).
    """

    def __init__(self, explorer: Explorer | None = None, config: PerfConfig | None = None):
        self.explorer = explorer or Explorer()
        c = config or PerfConfig(n_layer=2, d_model=128, n_head=4, seq_len=64, vocab_size=512, micro_batch=2,
                                 n_micro_batches=4, pp=2)
        self.vocab_size = c.vocab_size
        sl = lambda d, v, lo, hi, step=1: W.IntSlider(value=v, min=lo, max=hi, step=step, description=d,  # noqa: E731
                                                      style=_STYLE, continuous_update=False)
        self.n_layer = sl("layers", c.n_layer, 1, 48)
        self.d_model = W.Dropdown(options=[64, 128, 192, 256, 512, 1024, 2048, 4096, 8192], value=c.d_model,
                                  description="hidden size", style=_STYLE)
        self.n_head = sl("heads", c.n_head, 1, 64)
        self.seq_len = W.Dropdown(options=[32, 64, 128, 256, 512, 1024, 2048, 4096], value=c.seq_len,
                                  description="sequence", style=_STYLE)
        self.micro_batch = sl("micro-batch", c.micro_batch, 1, 16)
        self.n_micro_batches = sl("micro-batches", c.n_micro_batches, 1, 32)
        self.dp = W.Dropdown(options=[1, 2, 4, 8, 16, 32], value=c.dp, description="DP", style=_STYLE)
        self.tp = W.Dropdown(options=[1, 2, 4, 8], value=c.tp, description="TP", style=_STYLE)
        self.pp = W.Dropdown(options=[1, 2, 4, 8], value=c.pp, description="PP", style=_STYLE)
        self.hardware = W.Dropdown(options=[("this machine (learned)", "local")] +
                                   [(f"{h} (roofline)", h) for h in available_hardware()],
                                   value="local", description="hardware", style=_STYLE)
        self.tier = W.Dropdown(options=[("loopback (one tier)", "loopback"), ("shaped slow tier", "slow")],
                               value="loopback", description="network", style=_STYLE)
        self.schedule = W.Dropdown(options=[("1F1B", "1f1b"), ("all-F-all-B", "afab")], value="1f1b",
                                   description="schedule", style=_STYLE)
        self.status = W.HTML()
        self.status.add_class("lab-perfmodel-status")
        self.bars, self.gantt = LiveChart(), LiveChart()
        self.bars.add_class("lab-perfmodel-bars")
        self.gantt.add_class("lab-perfmodel-gantt")
        controls = [self.n_layer, self.d_model, self.n_head, self.seq_len, self.micro_batch, self.n_micro_batches,
                    self.dp, self.tp, self.pp, self.hardware, self.tier, self.schedule]
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
        res = self.explorer.predict(cfg, self.hardware.value, self.tier.value)
        if self.schedule.value != "1f1b":
            from lab.training.perfmodel.compose import compose
            from lab.training.perfmodel.operators import decompose

            pred = res.prediction
            fn = (self.explorer.learned.time_fn(cfg) if res.model == "learned" else None)
            if fn is not None:
                pred = compose(cfg, decompose(cfg), fn, schedule=self.schedule.value, method="simulate")
                res = type(res)(res.config, res.hardware, res.model, pred, res.measured_s)
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
