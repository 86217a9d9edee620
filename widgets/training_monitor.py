"""Training monitor: follow one or several training runs live, overlaid, with every rank's status.

A thin view over :class:`lab.training.monitor.RunMonitor`, which reads the event log the runs
write (``train.step``, ``train.eval``, ``train.status`` events). One plotly ``FigureWidget`` with
four panels (training and validation loss; step time split into compute and exposed
communication; bytes each rank sent per step; the codec's relative gradient error) holds one
colour per run; a table gives each run's state and each rank's (running, finished, failed with
its error, or dead when its heartbeat stopped). Everything shown comes from the log, so the view
survives a run that dies and a kernel restart: a new monitor on the same file shows it all again.

:meth:`TrainingMonitor.refresh` reads what is new; :meth:`start` does it every ``interval_s``
seconds from a background thread of the kernel; :meth:`stop` ends that.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Sequence
from pathlib import Path

import ipywidgets as W
import pandas as pd
import plotly.colors
import plotly.graph_objects as go
import traitlets
from plotly.subplots import make_subplots

from lab.training.monitor import RunMonitor
from widgets._refresh import BackgroundRefresh

__all__ = ["TrainingMonitor"]

#: (panel row, panel col, metrics column, trace name suffix, dash) for each trace of a run.
_TRACES = (
    (1, 1, "loss", "train loss", "solid"),
    (1, 1, "val_loss", "val loss", "dash"),
    (1, 2, "compute_s", "compute s", "solid"),
    (1, 2, "comm_s", "comm s", "dot"),
    (2, 1, "bytes_sent", "bytes/step", "solid"),
    (2, 2, "grad_rel_err", "grad error", "solid"),
)
_PALETTE = plotly.colors.qualitative.Plotly
_STATE_COLOUR = {"running": "#2ca02c", "started": "#2ca02c", "finished": "#1f77b4", "stopped": "#7f7f7f", "failed": "#d62728", "dead": "#d62728"}


def _state(state: str) -> str:
    return f"<span style='color:{_STATE_COLOUR.get(state, '#000')};font-weight:bold'>{html.escape(state)}</span>"


class TrainingMonitor(BackgroundRefresh, W.VBox):
    """Live, overlaid view of training runs that write to one event log.

    Parameters
    ----------
    events_path : path
        The runs' shared event log (``<run_dir>/../events.sqlite`` for runs launched by
        :func:`lab.training.run.launch`); it may not exist yet.
    runs : sequence of str, optional
        Run ids to show; default every run in the log, including runs that start later.
    heartbeat_timeout_s : float
        A rank silent for longer than this (seconds) without a final status is shown ``dead``.
    width : int
        Figure width in pixels.

    Attributes
    ----------
    selected : list of str (traitlet, two-way)
        The runs drawn; the run picker edits it, and setting it from Python updates the picker.
    figure : plotly.graph_objects.FigureWidget
    table : ipywidgets.HTML
        One row per run, with each rank's state.
    monitor : lab.training.monitor.RunMonitor
    """

    selected = traitlets.List(traitlets.Unicode())

    _refresh_thread_name = "lab-training-monitor"

    def __init__(self, events_path: str | Path, runs: Sequence[str] | None = None, *, heartbeat_timeout_s: float = 30.0, width: int = 900):
        self.monitor = RunMonitor(events_path, heartbeat_timeout_s=heartbeat_timeout_s)
        self._fixed = list(runs) if runs is not None else None
        fig = make_subplots(
            rows=2, cols=2, horizontal_spacing=0.1, vertical_spacing=0.16,
            subplot_titles=("loss (nats/token): train solid, validation dashed", "step time (s): compute solid, exposed communication dotted",
                            "bytes sent per rank per step", "codec relative gradient error"),
        )
        fig.update_xaxes(title_text="step", row=2)
        fig.update_yaxes(type="log", row=2, col=1)
        fig.update_layout(height=560, width=width, margin=dict(l=50, r=10, t=40, b=40), legend=dict(orientation="h", y=-0.12))
        self.figure = go.FigureWidget(fig)
        self._trace_index: dict[tuple[str, str], int] = {}  # (run, column) -> trace
        self.picker = W.SelectMultiple(options=[], rows=4, description="runs")
        self.table = W.HTML()
        self.table.add_class("lab-training-runs")
        self._cursor = 0
        self._lock = threading.Lock()
        self._init_refresh()
        super().__init__([self.picker, self.figure, self.table])
        self.picker.observe(lambda ch: setattr(self, "selected", list(ch["new"])), "value")
        self.observe(self._on_selected, "selected")
        self.refresh()

    # ------------------------------------------------------------------ updates
    def _add_run(self, run_id: str) -> None:
        colour = _PALETTE[len({r for r, _ in self._trace_index}) % len(_PALETTE)]
        for row, col, column, name, dash in _TRACES:
            self.figure.add_scatter(
                x=[], y=[], mode="lines+markers" if column == "val_loss" else "lines", name=f"{run_id}: {name}",
                legendgroup=run_id, showlegend=column == "loss", line=dict(color=colour, dash=dash), row=row, col=col,
            )
            self._trace_index[(run_id, column)] = len(self.figure.data) - 1

    def _on_selected(self, change) -> None:
        chosen = set(change["new"])
        if tuple(self.picker.value) != tuple(change["new"]):
            self.picker.value = tuple(r for r in change["new"] if r in self.picker.options)
        with self.figure.batch_update():
            for (run_id, _), k in self._trace_index.items():
                self.figure.data[k].visible = run_id in chosen

    def refresh(self) -> int:
        """Read new events and redraw what changed, in place; returns how many events arrived.

        Runs are redrawn from :meth:`RunMonitor.metrics` (the newest event per step wins, so a
        resumed run's rewritten steps replace the crashed attempt's); the table is rebuilt every
        time, since a rank's heartbeat can age into ``dead`` without any new event."""
        with self._lock:
            update = self.monitor.follow(self._cursor)
            self._cursor = update.cursor
            known = list(dict.fromkeys(r for r, _ in self._trace_index))
            found = self.monitor.run_ids() if self._fixed is None else self._fixed
            new_runs = [r for r in found if r not in known]
            touched = (update.runs | set(new_runs)) & set(found)
            with self.figure.batch_update():
                for run_id in new_runs:
                    self._add_run(run_id)
                for run_id in sorted(touched):
                    m = self.monitor.metrics(run_id)
                    for _, _, column, _, _ in _TRACES:
                        s = m[column].dropna()
                        self.figure.data[self._trace_index[(run_id, column)]].update(x=s.index.tolist(), y=s.tolist())
            if new_runs:
                keep = list(self.selected)  # changing the options clears the picker's value
                self.picker.options = known + new_runs
                self.selected = [*keep, *new_runs]
            self.table.value = self._table_html()
            return len(update.events)

    def _table_html(self) -> str:
        runs = self.monitor.runs()
        if self._fixed is not None:
            runs = runs[runs["run_id"].isin(self._fixed)]
        if runs.empty:
            return "<div>no run in the log yet</div>"
        rows = []
        for r in runs.itertuples():
            st = self.monitor.status(r.run_id)
            ranks = ", ".join(
                f"r{rank} {_state(s.state)} @{int(s.step) if pd.notna(s.step) else 0}"
                + (f" ({html.escape(str(s.error))[:80]})" if isinstance(s.error, str) else "")
                + (f" (silent {s.age_s:.0f} s)" if s.state == "dead" else "")
                for rank, s in st.iterrows()
            )
            fmt = lambda v: "" if v is None or pd.isna(v) else f"{v:.4f}"  # noqa: E731
            rows.append(
                f"<tr><td>{html.escape(r.run_id)}</td><td>{_state(r.state)}</td><td>{html.escape(str(r.optimizer))} / {html.escape(str(r.comm))}</td>"
                f"<td>{r.last_step} / {r.steps}</td><td>{fmt(r.loss)}</td><td>{fmt(r.val_loss)}</td><td>{ranks}</td></tr>"
            )
        head = "<tr><th>run</th><th>state</th><th>optimizer / comm</th><th>step</th><th>loss</th><th>val loss</th><th>ranks</th></tr>"
        return f"<table class='lab-training-table'>{head}{''.join(rows)}</table>"

