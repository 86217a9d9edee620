"""Site-queue dashboard: several HPC sites' queues replayed side by side.

A view over :class:`lab.hpc.queue.QueueReplay` objects. One time control (slider plus play button)
moves every site to the same *elapsed* time since its trace's first job (the traces come from
different years, so calendar time would not overlap). Per site (one column each) it shows the pending
and running job counts and the busy processors over the whole trace with a marker at the chosen time,
the wait-time histogram of the jobs that started in the preceding window, and the queue's numbers at
that time; below, one table of the jobs pending and running at that time on every site
(:func:`lab.hpc.views.jobs_from_replay`), sorted by a click on a header, filtered by state or text.

The plots are one :class:`~widgets.live_chart.LiveChart` (one column of subplots per site), whose whole
figure is set again when the time moves (a view that missed an update still draws the latest). It
takes the width of its output area; a panel with nothing to show says why (no job started in the
window; the trace has ended).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence

import ipywidgets as W
import numpy as np
import pandas as pd
import plotly.io as pio
from plotly.subplots import make_subplots

from lab.hpc.queue import WAIT_BIN_EDGES, WAIT_BIN_LABELS, QueueReplay, QueueSnapshot
from lab.hpc.views import job_table, jobs_from_replay
from widgets.live_chart import LiveChart
from widgets.sortable_table import SortableTable

__all__ = ["QueueDashboard"]

_HOUR, _DAY = 3600.0, 86400.0
# Trace order within each site's block of traces, and shapes (time markers) per site.
_PENDING, _RUNNING, _BUSY, _CAPACITY, _PENDING_NOW, _BUSY_NOW, _WAITS = range(7)
_TRACES_PER_SITE, _SHAPES_PER_SITE = 7, 2
_COLUMN = W.Layout(flex="1 1 0", min_width="0", padding="0 8px")


def _axis(letter: str, index: int) -> str:
    return f"{letter}{index if index > 1 else ''}"


class _SiteView:
    """One site's column: its text widgets, and which traces and shapes of the shared figure are its own."""

    def __init__(self, name: str, replay: QueueReplay, column: int, n_sites: int, *, window_s: float, top: int):
        self.name, self.replay, self.column, self.window_s, self.top = name, replay, column, window_s, top
        self.first_trace = column * _TRACES_PER_SITE
        self.first_shape = column * _SHAPES_PER_SITE
        self.hist_axis = 2 * n_sites + column + 1  # row 3 of this column: the histogram's axes
        first = pd.Timestamp(replay.first_submit, unit="s", tz="UTC")
        last = pd.Timestamp(replay.last_end, unit="s", tz="UTC")
        self.title = W.HTML(
            f"<h3 style='margin:4px 0'>{html.escape(name)}</h3>"
            f"<div>{len(replay):,} jobs, capacity {f'{replay.capacity:,}' if replay.capacity else 'unknown'} processors, "
            f"{first:%Y-%m-%d} to {last:%Y-%m-%d}</div>"
        )
        self.stats = W.HTML()
        self.stats.add_class("lab-site-stats")
        self.header = W.VBox([self.title, self.stats], layout=_COLUMN)

    def state(self, elapsed_s: float) -> tuple[float, QueueSnapshot, np.ndarray]:
        """(day, snapshot, wait-histogram counts) at ``elapsed_s`` seconds after the site's first job."""
        t = self.replay.first_submit + elapsed_s
        return elapsed_s / _DAY, self.replay.snapshot(t), self.replay.wait_histogram(t - self.window_s, t, WAIT_BIN_EDGES)

    def empty_note(self, elapsed_s: float, counts: np.ndarray) -> str | None:
        """Why the histogram is empty at ``elapsed_s`` (None when it is not)."""
        if counts.sum() > 0:
            return None
        r, t = self.replay, self.replay.first_submit + elapsed_s
        window = f"{self.window_s / _DAY:g} d"
        if t - self.window_s >= r.last_end:
            return f"no job started in the {window} before this time:<br>the trace ended on day {r.span / _DAY:.1f}"
        if t - self.window_s >= float(r.start.max()):
            return f"no job started in the {window} before this time:<br>the trace's last start was day {(float(r.start.max()) - r.first_submit) / _DAY:.1f}"
        return f"no job started in the {window} before this time"

    def add_traces(self, fig, points: int) -> None:
        r, col = self.replay, self.column + 1
        timeline = r.timeline(points)
        days = np.round((timeline["time"].to_numpy() - r.first_submit) / _DAY, 4)
        legend = self.column == 0
        site = f"<extra>{html.escape(self.name)}</extra>"  # hover text: what a point is, with its unit, and the site
        fig.add_scatter(x=days, y=timeline["pending"], name="pending", line=dict(color="#d62728"), showlegend=legend, legendgroup="p",
                        hovertemplate="day %{x:.1f}: %{y:,d} jobs pending" + site, row=1, col=col)
        fig.add_scatter(x=days, y=timeline["running"], name="running", line=dict(color="#2ca02c"), showlegend=legend, legendgroup="r",
                        hovertemplate="day %{x:.1f}: %{y:,d} jobs running" + site, row=1, col=col)
        fig.add_scatter(x=days, y=timeline["busy_processors"], name="busy", line=dict(color="#1f77b4"), showlegend=legend, legendgroup="b",
                        hovertemplate="day %{x:.1f}: %{y:,d} processors busy" + site, row=2, col=col)
        cap = r.capacity if r.capacity is not None else None
        fig.add_scatter(x=[days[0], days[-1]], y=[cap, cap], mode="lines", name="capacity", line=dict(color="#7f7f7f", dash="dash"), showlegend=legend,
                        legendgroup="c", hovertemplate="capacity: %{y:,d} processors" + site, row=2, col=col)
        fig.add_scatter(x=[0.0], y=[0], mode="markers", marker=dict(size=10, color="#d62728"), showlegend=False, name="pending now",
                        hovertemplate="chosen time, day %{x:.2f}: %{y:,d} jobs pending" + site, row=1, col=col)
        fig.add_scatter(x=[0.0], y=[0], mode="markers", marker=dict(size=10, color="#1f77b4"), showlegend=False, name="busy now",
                        hovertemplate="chosen time, day %{x:.2f}: %{y:,d} processors busy" + site, row=2, col=col)
        fig.add_bar(x=list(WAIT_BIN_LABELS), y=[0] * len(WAIT_BIN_LABELS), name="jobs started", marker_color="#9467bd", showlegend=False,
                    hovertemplate="%{y:,d} jobs started after waiting %{x}" + site, row=3, col=col)
        for row in (1, 2):
            fig.add_vline(x=0.0, line=dict(color="black", width=1, dash="dot"), row=row, col=col)
        # Rows 1 and 2 share one time axis per site (zoom one, the other follows), in days since the site's first job.
        fig.update_xaxes(ticksuffix=" d", row=1, col=col)
        fig.update_xaxes(ticksuffix=" d", matches=_axis("x", col), row=2, col=col)
        fig.update_xaxes(tickangle=-45, row=3, col=col)
        if col == 1:  # counts: integer ticks, axes titled with their unit
            fig.update_yaxes(title_text="jobs", row=1, col=col)
            fig.update_yaxes(title_text="processors", row=2, col=col)
            fig.update_yaxes(title_text="jobs started", row=3, col=col)
        for row in (1, 2, 3):
            fig.update_yaxes(tickformat=",d", rangemode="tozero", row=row, col=col)
        for row, peak in ((1, max(timeline["pending"].max(), timeline["running"].max())), (2, max(timeline["busy_processors"].max(), r.capacity or 0))):
            if peak <= 5:  # small counts: one tick per integer
                fig.update_yaxes(dtick=1, row=row, col=col)

    def place(self, data: list, layout: dict, elapsed_s: float) -> QueueSnapshot:
        """Write this site's state at ``elapsed_s`` into copies of its traces, shapes and axes in ``data``/``layout``."""
        day, snap, counts = self.state(elapsed_s)
        first = self.first_trace
        data[first + _PENDING_NOW] = {**data[first + _PENDING_NOW], "x": [day], "y": [snap.pending]}
        data[first + _BUSY_NOW] = {**data[first + _BUSY_NOW], "x": [day], "y": [snap.busy_processors]}
        data[first + _WAITS] = {**data[first + _WAITS], "y": counts.tolist()}
        shapes = layout["shapes"]
        for k in range(self.first_shape, self.first_shape + _SHAPES_PER_SITE):
            shapes[k] = {**shapes[k], "x0": day, "x1": day}
        yaxis = _axis("yaxis", self.hist_axis)
        note = self.empty_note(elapsed_s, counts)
        layout[yaxis] = {**layout[yaxis], **({"range": [0, 1], "autorange": False, "showticklabels": False} if note else {"autorange": True})}
        layout[yaxis].pop("dtick", None)
        if not note and counts.max() <= 5:  # small counts: one tick per integer (",d" would print 0, 1, 1, 2, 2)
            layout[yaxis]["dtick"] = 1
        if note:
            layout["annotations"].append({
                "text": note, "showarrow": False, "font": {"color": "#555", "size": 12}, "name": f"empty:{self.name}",
                "xref": f"{_axis('x', self.hist_axis)} domain", "yref": f"{_axis('y', self.hist_axis)} domain", "x": 0.5, "y": 0.55,
            })
        self.show_text(elapsed_s, snap)
        return snap

    def show_text(self, elapsed_s: float, snap: QueueSnapshot) -> None:
        r = self.replay
        t = r.first_submit + elapsed_s
        util = "n/a" if math.isnan(snap.utilization) else f"{snap.utilization:.0%}"
        note = " <b>(after the trace's last job)</b>" if t >= r.last_end else ""
        self.stats.value = (
            f"<div><b>{snap.datetime:%Y-%m-%d %H:%M} UTC</b>{note}<br>"
            f"pending <b>{snap.pending}</b> jobs ({snap.pending_processors:,} processors asked) &middot; "
            f"running <b>{snap.running}</b> &middot; busy {snap.busy_processors:,}/{f'{r.capacity:,}' if r.capacity else '?'} ({util})</div>"
        )


class QueueDashboard(W.VBox):
    """Several sites' queues, replayed side by side under one time control.

    Parameters
    ----------
    sites : mapping of name to QueueReplay, or sequence of QueueReplay
        One column per site, titled by the mapping's key or the replay's ``name``
        (the replays themselves are not changed).
    points : int, default 720
        Samples of each site's timeline drawn in the overview plots.
    window_s : float, default 7 days
        Width, in seconds, of the window before the chosen time whose started jobs
        make up the wait-time histogram.
    top : int, default 25
        Per site, how many pending jobs (the longest-waiting) and running jobs (the earliest
        started) the jobs table lists.
    step_hours : int, default 6
        Slider and play-button step, hours.
    start_day : float, default 30
        Initial elapsed time, days (clipped to the longest trace).
    width : int, optional
        Pixel width of each site's column; default: the sites share the output area's width.

    Attributes
    ----------
    slider : ipywidgets.IntSlider
        Elapsed hours since each trace's first job; set ``slider.value`` to move every site.
    play : ipywidgets.Play
    chart : widgets.live_chart.LiveChart
        Rows: pending/running jobs, busy processors, wait histogram; one column per site
        (``chart.figure`` is the plotly figure as JSON; site ``k`` owns traces ``7k .. 7k+6``).
    jobs : widgets.sortable_table.SortableTable
        The jobs pending and running at the chosen time, every site (:func:`lab.hpc.views.jobs_from_replay`).
    views : dict
        Per site name, its ``stats`` HTML widget and its ``replay``.

    Raises
    ------
    ValueError
        No site given, two sites with one name, or a non-positive ``points``, ``top``,
        ``step_hours`` or ``window_s``.
    TypeError
        A site is not a :class:`~lab.hpc.queue.QueueReplay`.
    """

    def __init__(
        self,
        sites: Mapping[str, QueueReplay] | Sequence[QueueReplay],
        *,
        points: int = 720,
        window_s: float = 7 * _DAY,
        top: int = 25,
        step_hours: int = 6,
        start_day: float = 30.0,
        width: int | None = None,
    ):
        named = list(sites.items()) if isinstance(sites, Mapping) else [(getattr(r, "name", repr(r)), r) for r in sites]
        if not named:
            raise ValueError("QueueDashboard needs at least one site")
        for name, replay in named:
            if not isinstance(replay, QueueReplay):
                raise TypeError(f"site {name!r}: expected a lab.hpc.QueueReplay, got {type(replay).__name__}")
        names = [name for name, _ in named]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"site names must be unique, but {repeated} repeat: pass a mapping {{name: replay}} to name them")
        for what, value, least in (("points", points, 2), ("top", top, 1), ("step_hours", step_hours, 1)):
            if int(value) != value or value < least:
                raise ValueError(f"{what} must be an integer >= {least}, not {value!r}")
        if not window_s > 0:
            raise ValueError(f"window_s must be positive seconds, not {window_s!r}")
        if width is not None and (int(width) != width or width < 100):
            raise ValueError(f"width must be an integer number of pixels >= 100 (or None to fit the output area), not {width!r}")
        replays = [replay for _, replay in named]
        max_hours = int(math.ceil(max(r.span for r in replays) / _HOUR))
        start = min(int(start_day * 24), max_hours)
        start -= start % step_hours

        n = len(replays)
        self.top = int(top)
        self.views = {name: _SiteView(name, r, k, n, window_s=window_s, top=top) for k, (name, r) in enumerate(named)}
        titles = ["jobs pending / running"] * n + ["busy processors"] * n + [f"jobs started in the last {window_s / _DAY:g} d, by wait"] * n
        fig = make_subplots(rows=3, cols=n, vertical_spacing=0.1, horizontal_spacing=0.24 / max(n, 2), subplot_titles=titles)
        for view in self.views.values():
            view.add_traces(fig, points)
        fig.update_layout(
            height=640,
            margin=dict(l=64, r=10, t=70, b=40),
            legend=dict(orientation="h", yanchor="bottom", y=1.05, x=0),
            uirevision="keep",
            hovermode="closest",
        )
        if width is not None:
            fig.update_layout(width=int(width) * n)
        self._base = json.loads(pio.to_json(fig, validate=False))  # plain JSON: lists, not numpy arrays
        self._base["layout"].pop("template", None)  # plotly.js's own defaults are the same look, and far smaller
        self.chart = LiveChart()
        self.chart.layout.width = "100%"
        self.jobs = SortableTable(max_height=360)
        self.jobs.add_class("lab-queue-jobs")

        # The slider counts hours (its step is step_hours); its readout is the clock beside it, in days.
        self.slider = W.IntSlider(
            value=start, min=0, max=max_hours, step=step_hours, description="time", readout=False, continuous_update=False,
            layout=W.Layout(flex="1 1 auto", min_width="120px"),
        )
        self.play = W.Play(value=start, min=0, max=max_hours, step=step_hours, interval=400, description="play")
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.clock = W.HTML(layout=W.Layout(flex="0 0 auto"))
        self.slider.observe(self._on_time, names="value")
        views = list(self.views.values())
        row = W.Layout(width="100%")
        header_row = W.HBox([v.header for v in views], layout=row) if width is None else W.HBox(
            [v.header for v in views], layout=W.Layout(width=f"{int(width) * n}px", max_width="100%"))
        if width is not None:
            self.chart.layout.width = f"{int(width) * n}px"
            self.chart.layout.max_width = "100%"
        super().__init__(
            [W.HBox([self.play, self.slider, self.clock], layout=row), header_row, self.chart, self.jobs],
            layout=W.Layout(width="100%", max_width="100%"),
        )
        self.add_class("lab-queue-dashboard")
        self._move(start)

    @staticmethod
    def live(db, sites, **kwargs):
        """The live mode: a :class:`~widgets.live_dashboard.LiveSitesDashboard` following the event log
        ``db`` of a running federation (its ``sites`` by name) instead of replaying traces."""
        from widgets.live_dashboard import LiveSitesDashboard

        return LiveSitesDashboard(db, sites, **kwargs)

    @property
    def elapsed_s(self) -> float:
        """Chosen time, seconds since each trace's first job."""
        return self.slider.value * _HOUR

    def _on_time(self, change) -> None:
        self._move(change["new"])

    def _move(self, hours: int) -> None:
        elapsed = hours * _HOUR
        data = list(self._base["data"])
        layout = {**self._base["layout"], "shapes": list(self._base["layout"]["shapes"]),
                  "annotations": list(self._base["layout"].get("annotations", []))}
        rows, pending, running, shown_pending, shown_running = [], 0, 0, 0, 0
        for view in self.views.values():
            snap = view.place(data, layout, elapsed)
            site_rows = jobs_from_replay(view.replay, view.replay.first_submit + elapsed, limit=self.top, site=view.name)
            rows += site_rows
            pending, running = pending + snap.pending, running + snap.running
            shown_pending += sum(r.state.value == "pending" for r in site_rows)
            shown_running += sum(r.state.value == "running" for r in site_rows)
        self.chart.figure = {"data": data, "layout": layout}
        ended = all(view.replay.first_submit + elapsed >= view.replay.last_end for view in self.views.values())
        empty = ("no job pending or running: every trace has ended by this time" if ended
                 else "no job pending or running on any site at this time")
        caption = (f"jobs at day {hours / 24:.2f}: {shown_pending:,} of {pending:,} pending (the {self.top} longest-waiting per site), "
                   f"{shown_running:,} of {running:,} running (the {self.top} earliest-started per site); "
                   "start: the one the trace recorded. Click a header to sort.")
        self.jobs.show(job_table(rows, dated=True, reasons=False, empty=empty, caption=caption))
        self.clock.value = f"day <b>{hours / 24:.2f}</b> of each trace"
