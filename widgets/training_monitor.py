"""Training monitor: follow one or several training runs live, overlaid, with every rank's status.

A thin view over :class:`lab.training.monitor.RunMonitor`, which reads the event log the runs
write (``train.step``, ``train.eval``, ``train.status`` events) and gives each run's series
(:meth:`~lab.training.monitor.RunMonitor.series`). One :class:`~widgets.live_chart.LiveChart` with
four panels (training and validation loss; step time split into compute and exposed communication;
bytes each rank sent per step; the codec's relative gradient error) holds one colour per run; a table
gives each run's state and each rank's (running, finished, failed with its error, or dead when its
heartbeat stopped). Everything shown comes from the log, so the view survives a run that dies and a
kernel restart: a new monitor on the same file shows it all again.

The monitor can be shown before any run has started: it then says it is waiting for the first step,
and draws each run's curves from its first logged step on. :meth:`TrainingMonitor.refresh` reads
what is new; :meth:`start` does it every ``interval_s`` seconds from a background thread of the
kernel (the chart is one synced state, drawn whole, so updates from that thread reach every view,
also one opened later); :meth:`stop` ends that.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Sequence
from pathlib import Path

import ipywidgets as W
import pandas as pd
import traitlets

from lab.training.monitor import RunMonitor
from widgets._refresh import BackgroundRefresh
from widgets.live_chart import LiveChart

__all__ = ["TrainingMonitor"]

#: (panel, metrics column, trace name suffix, dash, mode) for each trace of a run; panels 1..4 are
#: top left, top right, bottom left, bottom right.
_TRACES = (
    (1, "loss", "train loss", "solid", "lines"),
    (1, "val_loss", "val loss", "dash", "lines+markers"),
    (2, "compute_s", "compute s", "solid", "lines"),
    (2, "comm_s", "comm s", "dot", "lines"),
    (3, "bytes_sent", "bytes/step", "solid", "lines"),
    (4, "grad_rel_err", "grad error", "solid", "lines"),
)
_COLUMNS = tuple(c for _, c, _, _, _ in _TRACES)
#: (subplot title, y-axis title with its unit, y-axis type) per panel.
_PANELS = {
    1: ("loss: train solid, validation dashed", "loss (nats/token)", "linear"),
    2: ("step time: compute solid, exposed communication dotted", "time per step (s)", "linear"),
    3: ("bytes sent per rank per step", "bytes per step", "log"),
    4: ("codec relative gradient error", "relative L2 error", "linear"),
}
# (x domain, y domain) per panel: the gap between the rows holds the top row's x title and the bottom row's titles
_DOMAINS = {1: ([0.0, 0.44], [0.62, 1.0]), 2: ([0.56, 1.0], [0.62, 1.0]), 3: ([0.0, 0.44], [0.0, 0.38]), 4: ([0.56, 1.0], [0.0, 0.38])}
_PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52")
_STATE_COLOUR = {"running": "#2ca02c", "started": "#2ca02c", "finished": "#1f77b4", "stopped": "#7f7f7f", "failed": "#d62728", "dead": "#d62728"}
WAITING = "waiting for the first step"


def _state(state: str) -> str:
    return f"<span style='color:{_STATE_COLOUR.get(state, '#000')};font-weight:bold'>{html.escape(state)}</span>"


def _axis(k: int) -> str:
    return "" if k == 1 else str(k)


def _layout(height: int, width: int | None, x_title: str, empty: bool, blank: frozenset[int] = frozenset(),
            x_max: float | None = None) -> dict:
    """The four panels' layout; ``empty``: nothing drawn yet (the waiting note); ``blank``: panels with
    no point among the runs shown; ``x_max``: the largest step drawn (whole-number ticks below 10)."""
    x_ticks = {"tick0": 0, "dtick": 1} if x_max is not None and x_max < 10 else {}
    layout: dict = {
        "height": height, "margin": {"l": 70, "r": 20, "t": 40, "b": 40},
        "legend": {"orientation": "h", "y": -0.12}, "hovermode": "closest", "uirevision": "keep",
        "annotations": [],
    }
    if width is not None:
        layout["width"] = width
    for k, (title, y_title, y_type) in _PANELS.items():
        xd, yd = _DOMAINS[k]
        shown = not (empty or k in blank)  # no empty default axes (-1..6) where nothing is drawn
        layout[f"xaxis{_axis(k)}"] = {"domain": xd, "anchor": f"y{_axis(k)}", "title": {"text": x_title}, "automargin": True,
                                      "visible": shown, **x_ticks}
        layout[f"yaxis{_axis(k)}"] = {"domain": yd, "anchor": f"x{_axis(k)}", "type": y_type, "title": {"text": y_title},
                                      "automargin": True, "visible": shown}
        layout["annotations"].append({"text": f"<b>{html.escape(title)}</b>", "xref": "paper", "yref": "paper", "x": sum(xd) / 2,
                                      "y": yd[1], "yshift": 6, "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 13}})
        if k in blank and not empty:  # the other panels have points, this one none: say so
            layout["annotations"].append({"text": "no values logged for the runs shown", "xref": "paper", "yref": "paper",
                                          "x": sum(xd) / 2, "y": sum(yd) / 2, "showarrow": False, "font": {"color": "#666"}})
    if empty:
        layout["annotations"].append({"text": WAITING, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False,
                                      "font": {"size": 18, "color": "#666"}, "bgcolor": "rgba(255,255,255,0.85)", "name": "waiting"})
    return layout


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
    width : int, optional
        Chart width in pixels; default the width of the output area.
    max_points : int
        At most this many points per curve (a long run is thinned, newest step kept).

    Attributes
    ----------
    selected : list of str (traitlet, two-way)
        The runs drawn; the run picker edits it, and setting it from Python updates the picker.
    chart : widgets.live_chart.LiveChart
        ``chart.figure`` is the drawn figure (JSON); :meth:`trace` reads one curve of it.
    status : ipywidgets.HTML
        One line: waiting for the first step, or how far the runs are.
    table : ipywidgets.HTML
        One row per run, with each rank's state.
    monitor : lab.training.monitor.RunMonitor
    """

    selected = traitlets.List(traitlets.Unicode())

    _refresh_thread_name = "lab-training-monitor"

    def __init__(self, events_path: str | Path, runs: Sequence[str] | None = None, *, heartbeat_timeout_s: float = 30.0,
                 width: int | None = None, max_points: int = 1000):
        self.monitor = RunMonitor(events_path, heartbeat_timeout_s=heartbeat_timeout_s)
        self._fixed = list(runs) if runs is not None else None
        self._width, self._max_points = width, int(max_points)
        self._series: dict[str, dict[str, tuple[list[float], list[float]]]] = {}  # run -> column -> (x, y)
        self._colours: dict[str, str] = {}
        self._trace_index: dict[tuple[str, str], int] = {}  # (run, column) -> index in chart.figure["data"]
        self._cursor = 0
        self._lock = threading.RLock()
        self.chart = LiveChart(_empty_figure(width))
        self.chart.add_class("lab-training-chart")
        self.picker = W.SelectMultiple(options=[], rows=4, description="runs")
        self.status = W.HTML(f"<div>{WAITING}</div>")
        self.status.add_class("lab-training-status")
        self.table = W.HTML()
        self.table.add_class("lab-training-runs")
        self._init_refresh()
        super().__init__([self.status, self.picker, self.chart, self.table])
        self.picker.observe(lambda ch: setattr(self, "selected", list(ch["new"])), "value")
        self.observe(self._on_selected, "selected")
        self.refresh()

    # ------------------------------------------------------------------ reading
    @property
    def figure(self) -> dict:
        """The drawn figure, as plotly JSON (``{"data": [...], "layout": {...}}``)."""
        return self.chart.figure

    def trace(self, run_id: str, column: str) -> tuple[list[float], list[float]]:
        """The drawn ``(x, y)`` of ``run_id``'s ``column`` curve (``([], [])`` when not drawn)."""
        k = self._trace_index.get((run_id, column))
        if k is None:
            return [], []
        d = self.chart.figure["data"][k]
        return list(d["x"]), list(d["y"])

    # ------------------------------------------------------------------ updates
    def _on_selected(self, change) -> None:
        if tuple(self.picker.value) != tuple(change["new"]):
            self.picker.value = tuple(r for r in change["new"] if r in self.picker.options)
        with self._lock:
            self._draw()

    def _draw(self) -> None:
        """Set the chart's figure from the series read so far (the selected runs, in picker order)."""
        data, index = [], {}
        chosen = set(self.selected)
        for run_id, series in self._series.items():
            for panel, column, name, dash, mode in _TRACES:
                x, y = series.get(column, ([], []))
                index[(run_id, column)] = len(data)
                data.append({
                    "type": "scatter", "mode": mode, "x": x, "y": y, "name": f"{run_id}: {name}", "uid": f"{run_id}:{column}",
                    "legendgroup": run_id, "showlegend": column == "loss", "visible": run_id in chosen,
                    "line": {"color": self._colours[run_id], "dash": dash}, "xaxis": f"x{_axis(panel)}", "yaxis": f"y{_axis(panel)}",
                    "hovertemplate": f"{html.escape(run_id)}, {name}<br>step %{{x}}: %{{y:.4g}}<extra></extra>",
                })
        self._trace_index = index
        shown = [(p, d) for (p, *_), d in zip([t for _ in self._series for t in _TRACES], data) if d["visible"]]
        empty = not any(d["x"] for _, d in shown)
        blank = frozenset(k for k in _PANELS if not any(d["x"] for p, d in shown if p == k))
        x_max = max((max(d["x"]) for _, d in shown if d["x"]), default=None)
        self.chart.figure = {"data": data, "layout": _layout(560, self._width, "step", empty, blank, x_max)}

    def refresh(self) -> int:
        """Read new events and redraw what changed; returns how many events arrived.

        Runs are redrawn from :meth:`RunMonitor.series` (the newest event per step wins, so a resumed
        run's rewritten steps replace the crashed attempt's); the status line and the table are rebuilt
        every time, since a rank's heartbeat can age into ``dead`` without any new event."""
        with self._lock:
            update = self.monitor.follow(self._cursor)
            self._cursor = update.cursor
            found = self.monitor.run_ids() if self._fixed is None else self._fixed
            new_runs = [r for r in found if r not in self._series]
            touched = (update.runs | set(new_runs)) & set(found)
            for run_id in new_runs:
                self._colours[run_id] = _PALETTE[len(self._colours) % len(_PALETTE)]
            for run_id in [r for r in found if r in touched]:
                self._series[run_id] = self.monitor.series(run_id, _COLUMNS, max_points=self._max_points)
            if new_runs:
                keep = list(self.selected)  # changing the options clears the picker's value
                self.picker.options = list(self._series)
                self.selected = [*keep, *new_runs]  # redraws through _on_selected
            elif touched:
                self._draw()
            runs = self.monitor.runs()
            if self._fixed is not None:
                runs = runs[runs["run_id"].isin(self._fixed)]
            self.status.value = self._status_html(runs)
            self.table.value = self._table_html(runs)
            return len(update.events)

    def _status_html(self, runs: pd.DataFrame) -> str:
        if runs.empty or not (runs["last_step"] > 0).any():
            where = "no run in the log yet" if runs.empty else f"{len(runs)} run(s) started"
            return f"<div><b>{WAITING}</b> ({where}: {html.escape(str(self.monitor.events_path))})</div>"
        active = int((runs["state"] == "running").sum())
        return f"<div>{len(runs)} run(s), {active} running; newest step {int(runs['last_step'].max())}</div>"

    def _table_html(self, runs: pd.DataFrame) -> str:
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


def _empty_figure(width: int | None) -> dict:
    return {"data": [], "layout": _layout(560, width, "step", True)}
