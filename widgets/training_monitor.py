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
also one opened later); :meth:`stop` ends that. As on TensorBoard's scalars page, the x axis is the
step or the wall time since each run started (``x``), the y axes linear or logarithmic (``y_scale``),
and curves are smoothed (``smoothing``, TensorBoard's debiased moving average, the raw values drawn
faintly behind); the table's run names carry the runs' chart colours. Logarithmic panels get ticks
no two closer than a label's height (:func:`log_ticks`: plotly's own label every digit of a decade).
What is shown (the runs selected, by the x axis shown, every point's value and smoothed value) exports
as CSV: the "export CSV" button saves it in the browser (also while the kernel is busy), and
:meth:`TrainingMonitor.to_csv` writes the same table (:func:`lab.training.monitor.series_frame`).
"""

from __future__ import annotations

import html
import math
import threading
from collections.abc import Sequence
from pathlib import Path

import ipywidgets as W
import pandas as pd
import traitlets

from lab.training.monitor import RunMonitor, ema_smooth, series_frame, write_csv
from widgets._refresh import BackgroundRefresh
from widgets.download import DownloadButton
from widgets.live_chart import LiveChart

__all__ = ["TrainingMonitor"]

#: (panel, metrics column, what it is, unit for the hover text, dash, mode) for each trace of a run;
#: panels 1..4 are top left, top right, bottom left, bottom right.
_TRACES = (
    (1, "loss", "train loss", "nats/token", "solid", "lines"),
    (1, "val_loss", "validation loss", "nats/token", "dash", "lines+markers"),
    (2, "compute_s", "compute", "s", "solid", "lines"),
    (2, "comm_s", "exposed communication", "s", "dot", "lines"),
    (3, "bytes_sent", "bytes sent", "bytes", "solid", "lines"),
    (4, "grad_rel_err", "codec error", "", "solid", "lines"),
)
_COLUMNS = tuple(t[1] for t in _TRACES)
_SMOOTHED = {"loss", "compute_s", "comm_s", "bytes_sent", "grad_rel_err"}  # validation loss is sparse: drawn as is
#: (subplot title, its line-style key, y-axis title with its unit, default y-axis type) per panel.
_PANELS = {
    1: ("loss", "train solid, validation dashed", "loss (nats/token)", "linear"),
    2: ("step time", "compute solid, communication dotted", "time per step (s)", "linear"),
    3: ("bytes sent per rank per step", "", "bytes per step", "log"),
    4: ("codec relative gradient error", "", "relative L2 error", "linear"),
}
X_TITLES = {"step": "step", "time": "wall time since the run started (s)"}
# (x domain, y domain) per panel: the gap between the rows holds the top row's x title and the bottom row's titles
_DOMAINS = {1: ([0.0, 0.44], [0.64, 1.0]), 2: ([0.56, 1.0], [0.64, 1.0]), 3: ([0.0, 0.44], [0.0, 0.36]), 4: ([0.56, 1.0], [0.0, 0.36])}
_PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52")
_STATE_COLOUR = {"running": "#2ca02c", "started": "#2ca02c", "finished": "#1f77b4", "stopped": "#7f7f7f", "failed": "#d62728", "dead": "#d62728",
                 "replaced": "#ff7f0e"}
WAITING = "waiting for the first step"
HEIGHT = 580
_MARGIN = {"l": 70, "r": 20, "t": 64, "b": 40}
# log-axis tick candidates, densest first: mantissas per decade (1..9, then 1-2-3-5, 1-2-5, 1-3, 1)
_MANTISSAS = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 5), (1, 2, 5), (1, 3), (1,))
MIN_TICK_GAP_PX = 18.0  # a 12 px tick label and some air


def _tick_text(v: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def log_ticks(lo: float, hi: float, pixels: float, min_gap_px: float = MIN_TICK_GAP_PX) -> list[float] | None:
    """Tick values for a logarithmic axis showing ``lo..hi`` (positive, the data's range) on ``pixels``
    pixels, no two closer than ``min_gap_px``: the densest of 1..9, 1-2-3-5, 1-2-5, 1-3 or 1 per decade
    that fits with at least two ticks, every n-th power of ten over many decades, or, within less than a
    decade, evenly spaced round numbers (1, 2 or 5 times a power of ten apart). None when ``lo..hi`` is
    empty, not positive or flat (plotly's own ticks then)."""
    if not (0 < lo < hi and math.isfinite(hi)) or hi / lo < 1.0001 or pixels <= 0:
        return None
    pad = 0.05 * (math.log10(hi) - math.log10(lo))  # plotly's autorange pads the data a little
    a, b = math.log10(lo) - pad, math.log10(hi) + pad
    per_decade = pixels / (b - a)

    def fits(ticks: list[float]) -> bool:
        logs = [math.log10(v) for v in ticks]
        return len(ticks) >= 2 and min(q - p for p, q in zip(logs, logs[1:])) * per_decade >= min_gap_px

    decades = range(math.floor(a), math.ceil(b) + 1)
    for mantissas in _MANTISSAS:
        ticks = [m * 10.0**k for k in decades for m in mantissas if a <= math.log10(m * 10.0**k) <= b]
        if fits(ticks):
            return ticks
    if b - a >= 2:  # many decades: every n-th power of ten
        n = math.ceil(min_gap_px / per_decade)
        ticks = [10.0**k for k in decades if k % n == 0 and a <= k <= b]
        return ticks if len(ticks) >= 2 else None
    # less than a decade and no two of its "nice" log ticks in view: round numbers, evenly spaced
    span = 10**b - 10**a
    for exponent in range(math.floor(math.log10(span)) - 2, math.floor(math.log10(span)) + 1):
        for m in (1, 2, 5):
            step = m * 10.0**exponent
            ticks = [round(k * step, 12) for k in range(math.ceil(10**a / step), math.floor(10**b / step) + 1)]
            if 2 <= len(ticks) <= 6 and fits(ticks):
                return ticks
    return None


def _state(state: str) -> str:
    return f"<span style='color:{_STATE_COLOUR.get(state, '#000')};font-weight:bold'>{html.escape(state)}</span>"


def _axis(k: int) -> str:
    return "" if k == 1 else str(k)


def _y_type(panel: int, y_scale: str) -> str:
    return _PANELS[panel][3] if y_scale == "auto" else y_scale


def _panel_pixels(panel: int, height: int = HEIGHT) -> float:
    lo, hi = _DOMAINS[panel][1]
    return (height - _MARGIN["t"] - _MARGIN["b"]) * (hi - lo)


def _layout(height: int, width: int | None, x: str, y_scale: str, empty: bool, blank: frozenset[int] = frozenset(),
            x_max: float | None = None, y_ticks: dict[int, list[float]] | None = None) -> dict:
    """The four panels' layout; ``empty``: nothing drawn yet (the waiting note); ``blank``: panels with
    no point among the runs shown; ``x_max``: the largest step drawn (whole-number ticks below 10);
    ``y_ticks``: the tick values of each logarithmic panel (:func:`log_ticks`)."""
    x_ticks = {"tick0": 0, "dtick": 1} if x == "step" and x_max is not None and x_max < 10 else {}
    layout: dict = {
        "height": height, "margin": dict(_MARGIN), "hovermode": "closest", "uirevision": "keep",
        "legend": {"orientation": "h", "y": -0.12, "title": {"text": "runs "}}, "annotations": [],
    }
    if width is not None:
        layout["width"] = width
    for k, (title, key, y_title, y_default) in _PANELS.items():
        xd, yd = _DOMAINS[k]
        shown = not (empty or k in blank)  # no empty default axes (-1..6) where nothing is drawn
        y_type = _y_type(k, y_scale)
        layout[f"xaxis{_axis(k)}"] = {"domain": xd, "anchor": f"y{_axis(k)}", "title": {"text": X_TITLES[x]}, "automargin": True,
                                      "visible": shown, **x_ticks}
        layout[f"yaxis{_axis(k)}"] = {"domain": yd, "anchor": f"x{_axis(k)}", "type": y_type, "title": {"text": y_title},
                                      "automargin": True, "visible": shown, "exponentformat": "SI"}
        ticks = (y_ticks or {}).get(k)
        if y_type == "log" and ticks:  # plotly's own log ticks label every digit of a decade: they overlap in a short panel
            layout[f"yaxis{_axis(k)}"].update(tickmode="array", tickvals=ticks, ticktext=[_tick_text(v) for v in ticks])
        # the title over its panel, the line-style key on a second, smaller line: both fit a panel's width
        text = f"<b>{html.escape(title)}</b>" + (f"<br><span style='font-size:11px'>{html.escape(key)}</span>" if key else "")
        layout["annotations"].append({"text": text, "xref": "paper", "yref": "paper", "x": sum(xd) / 2, "y": yd[1], "yshift": 8,
                                      "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 13}, "name": f"title{k}"})
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
    x, y_scale, smoothing
        The initial values of the traits below.

    Attributes
    ----------
    selected : list of str (traitlet, two-way)
        The runs drawn; the run picker edits it, and setting it from Python updates the picker.
    x : {"step", "time"} (traitlet, two-way with ``x_picker``)
        The x axis: the step, or wall seconds since each run's first start.
    y_scale : {"auto", "linear", "log"} (traitlet, two-way with ``scale_picker``)
        ``auto``: bytes logarithmic, the other panels linear.
    smoothing : float in [0, 0.99] (traitlet, two-way with ``smoothing_slider``)
        TensorBoard's smoothing weight (:func:`lab.training.monitor.ema_smooth`); 0 draws the values only.
    chart : widgets.live_chart.LiveChart
        ``chart.figure`` is the drawn figure (JSON); :meth:`trace` reads one curve of it.
    status : ipywidgets.HTML
        One line: waiting for the first step, or how far the runs are.
    table : ipywidgets.HTML
        One row per run, with each rank's state.
    export_button : widgets.download.DownloadButton
        Saves :meth:`shown_frame` as ``training-runs-<x>.csv`` in the browser; its text follows every redraw.
    monitor : lab.training.monitor.RunMonitor
    """

    selected = traitlets.List(traitlets.Unicode())
    x = traitlets.Enum(("step", "time"), "step")
    y_scale = traitlets.Enum(("auto", "linear", "log"), "auto")
    smoothing = traitlets.Float(0.6, min=0.0, max=0.99)

    _refresh_thread_name = "lab-training-monitor"

    def __init__(self, events_path: str | Path, runs: Sequence[str] | None = None, *, heartbeat_timeout_s: float = 30.0,
                 width: int | None = None, max_points: int = 1000, x: str = "step", y_scale: str = "auto", smoothing: float = 0.6):
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
        wide = {"description_width": "initial"}
        self.x_picker = W.ToggleButtons(options=[("step", "step"), ("wall time", "time")], description="x axis", style=wide)
        self.scale_picker = W.ToggleButtons(options=[("auto", "auto"), ("linear", "linear"), ("log", "log")], description="y axes",
                                            tooltips=["bytes logarithmic, the rest linear", "every panel linear", "every panel logarithmic"],
                                            style=wide)
        self.smoothing_slider = W.FloatSlider(min=0.0, max=0.99, step=0.01, description="smoothing", readout_format=".2f",
                                              continuous_update=False, style=wide)
        for control in (self.x_picker, self.scale_picker):
            control.style.button_width = "auto"
        self.status = W.HTML(f"<div>{WAITING}</div>")
        self.status.add_class("lab-training-status")
        self.table = W.HTML()
        self.table.add_class("lab-training-runs")
        self.export_button = DownloadButton(label="export CSV", filename="training-runs-step.csv", mime="text/csv",
                                            hint="the runs shown, by the x axis shown: every point's value and its smoothed value")
        self.export_button.add_class("lab-training-export")
        self._init_refresh()
        controls = W.VBox([self.x_picker, self.scale_picker, self.smoothing_slider, self.export_button])
        super().__init__([self.status, W.HBox([self.picker, controls]), self.chart, self.table], x=x, y_scale=y_scale, smoothing=smoothing)
        for trait, control in (("x", self.x_picker), ("y_scale", self.scale_picker), ("smoothing", self.smoothing_slider)):
            traitlets.link((self, trait), (control, "value"))
        self.picker.observe(lambda ch: setattr(self, "selected", list(ch["new"])), "value")
        self.observe(self._on_selected, "selected")
        self.observe(self._on_view, ["y_scale", "smoothing"])
        self.observe(self._on_x, "x")
        self.refresh()

    # ------------------------------------------------------------------ reading
    @property
    def figure(self) -> dict:
        """The drawn figure, as plotly JSON (``{"data": [...], "layout": {...}}``)."""
        return self.chart.figure

    def trace(self, run_id: str, column: str, *, smoothed: bool = False) -> tuple[list[float], list[float]]:
        """The drawn ``(x, y)`` of ``run_id``'s ``column`` curve: the logged values, or with ``smoothed``
        the smoothed curve drawn over them (``([], [])`` when not drawn)."""
        k = self._trace_index.get((run_id, f"{column}:smoothed" if smoothed else column))
        if k is None:
            return [], []
        d = self.chart.figure["data"][k]
        return list(d["x"]), list(d["y"])

    def shown_frame(self) -> pd.DataFrame:
        """What the chart shows, as a table: the selected runs (in picker order), each drawn metric's points
        by the x axis shown, with their values and, where drawn smoothed, their smoothed values
        (:func:`lab.training.monitor.series_frame`; the export button saves exactly this as CSV)."""
        with self._lock:
            chosen = set(self.selected)
            shown = {r: s for r, s in self._series.items() if r in chosen}
            return series_frame(shown, x=self.x, smoothing=self.smoothing, smoothed=_SMOOTHED)

    def to_csv(self, path: str | Path) -> Path:
        """Write :meth:`shown_frame` to ``path`` as CSV (what the export button downloads; written atomically
        by :func:`lab.training.monitor.write_csv`, which names a missing folder). Returns the path."""
        return write_csv(self.shown_frame(), path)

    def colour(self, run_id: str) -> str:
        """The run's colour, the same in the chart and the table."""
        return self._colours[run_id]

    # ------------------------------------------------------------------ updates
    def _on_selected(self, change) -> None:
        if tuple(self.picker.value) != tuple(change["new"]):
            self.picker.value = tuple(r for r in change["new"] if r in self.picker.options)
        with self._lock:
            self._draw()

    def _on_view(self, _change) -> None:
        with self._lock:
            self._draw()

    def _on_x(self, _change) -> None:
        with self._lock:
            for run_id in self._series:
                self._series[run_id] = self._read(run_id)
            self._draw()

    def _read(self, run_id: str) -> dict[str, tuple[list[float], list[float]]]:
        return self.monitor.series(run_id, _COLUMNS, x=self.x, max_points=self._max_points)

    def _draw(self) -> None:
        """Set the chart's figure from the series read so far (the selected runs, in picker order)."""
        data, index, panel_of = [], {}, []
        chosen, w = set(self.selected), float(self.smoothing)
        x_label = "step %{x}" if self.x == "step" else "%{x:.1f} s"
        for run_id, series in self._series.items():
            colour, shown = self._colours[run_id], run_id in chosen
            for panel, column, what, unit, dash, mode in _TRACES:
                xs, ys = series.get(column, ([], []))
                smooth = w > 0 and column in _SMOOTHED
                common = {"type": "scatter", "x": xs, "legendgroup": run_id, "visible": shown,
                          "xaxis": f"x{_axis(panel)}", "yaxis": f"y{_axis(panel)}"}
                hover = f"{html.escape(run_id)} {what}<br>{x_label}: %{{y:.4g}} {unit}<extra></extra>"
                index[(run_id, column)] = len(data)
                panel_of.append(panel)
                data.append({**common, "mode": mode, "y": ys, "uid": f"{run_id}:{column}", "name": run_id if column == "loss" else f"{run_id} {what}",
                             "showlegend": column == "loss" and not smooth, "opacity": 0.3 if smooth else 1.0,
                             "hoverinfo": "skip" if smooth else None, "hovertemplate": None if smooth else hover,
                             "line": {"color": colour, "dash": dash, "width": 1 if smooth else 2}})
                if smooth:
                    index[(run_id, f"{column}:smoothed")] = len(data)
                    panel_of.append(panel)
                    data.append({**common, "mode": "lines", "y": ema_smooth(ys, w), "uid": f"{run_id}:{column}:smoothed",
                                 "name": run_id if column == "loss" else f"{run_id} {what} (smoothed)", "showlegend": column == "loss",
                                 "hovertemplate": f"{html.escape(run_id)} {what}, smoothed {w:.2f}<br>{x_label}: %{{y:.4g}} {unit}<extra></extra>",
                                 "line": {"color": colour, "dash": dash, "width": 2}})
        for d in data:  # plotly refuses explicit nulls for some keys
            for key in ("hoverinfo", "hovertemplate"):
                if d.get(key) is None:
                    d.pop(key, None)
        self._trace_index = index
        drawn = [(p, d) for p, d in zip(panel_of, data) if d["visible"]]
        empty = not any(d["x"] for _, d in drawn)
        blank = frozenset(k for k in _PANELS if not any(d["x"] for p, d in drawn if p == k))
        x_max = max((max(d["x"]) for _, d in drawn if d["x"]), default=None)
        y_ticks, y_ranges = {}, {}
        for k in _PANELS:
            if _y_type(k, self.y_scale) == "log":
                ys = [v for p, d in drawn if p == k for v in d["y"] if v is not None and math.isfinite(v) and v > 0]
                if not ys:
                    continue
                lo, hi = min(ys), max(ys)
                if hi / lo < 1.0001:  # a constant (bytes of one codec): half a decade either side, not plotly's 2 decades
                    lo, hi = lo / 10**0.5, hi * 10**0.5
                    y_ranges[k] = [math.log10(lo), math.log10(hi)]
                y_ticks[k] = log_ticks(lo, hi, _panel_pixels(k))
        layout = _layout(HEIGHT, self._width, self.x, self.y_scale, empty, blank, x_max, y_ticks)
        for k, r in y_ranges.items():
            layout[f"yaxis{_axis(k)}"]["range"] = r
        self.chart.figure = {"data": data, "layout": layout}
        frame = series_frame({r: s for r, s in self._series.items() if r in chosen}, x=self.x, smoothing=w, smoothed=_SMOOTHED)
        self.export_button.text = frame.to_csv(index=False) if len(frame) else ""
        self.export_button.filename = f"training-runs-{self.x}.csv"  # after the text: a view that has the new name has its text
        self.export_button.label = f"export CSV ({len(frame):,} rows)"

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
                self._series[run_id] = self._read(run_id)
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

    def _run_cell(self, run_id: str) -> str:
        colour = self._colours.get(run_id, "#000")
        return (f"<span class='lab-run-swatch' style='display:inline-block;width:0.8em;height:0.8em;background:{colour};"
                f"margin-right:0.3em'></span><b style='color:{colour}'>{html.escape(run_id)}</b>")

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
                + (f" (pid {s.pid}, swapped in for pid {', '.join(map(str, s.replaced_pids))})"
                   if isinstance(s.replaced_pids, list) and s.replaced_pids else "")
                for rank, s in st.iterrows()
            )
            swaps = self.monitor.swaps(r.run_id)
            ranks += "".join(
                f"<div class='lab-training-swap'>hot swap: rank {w.rank} {html.escape(str(w.kind))} "
                f"({html.escape(str(w.detail))[:60]}), worker {w.new_worker} (pid {w.new_pid}) took it from worker "
                f"{w.old_worker} (pid {w.old_pid}), resumed at step {w.generation} from {html.escape(str(w.restore))}</div>"
                for w in swaps.itertuples())
            fmt = lambda v: "" if v is None or pd.isna(v) else f"{v:.4f}"  # noqa: E731
            rows.append(
                f"<tr><td>{self._run_cell(r.run_id)}</td><td>{_state(r.state)}</td><td>{html.escape(str(r.optimizer))} / {html.escape(str(r.comm))}</td>"
                f"<td>{r.last_step} / {r.steps}</td><td>{fmt(r.loss)}</td><td>{fmt(r.val_loss)}</td><td>{ranks}</td></tr>"
            )
        head = "<tr><th>run</th><th>state</th><th>optimizer / comm</th><th>step</th><th>loss</th><th>val loss</th><th>ranks</th></tr>"
        return f"<table class='lab-training-table'>{head}{''.join(rows)}</table>"


def _empty_figure(width: int | None) -> dict:
    return {"data": [], "layout": _layout(HEIGHT, width, "step", "auto", True)}
