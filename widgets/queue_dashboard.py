"""Site-queue dashboard: several HPC sites' queues replayed side by side.

A view over :class:`lab.hpc.queue.QueueReplay` objects. One time control
(slider plus play button) moves every site to the same *elapsed* time since
its trace's first job (the traces come from different years, so calendar time
would not overlap). Per site (one column each) it shows the pending and
running job counts and the busy processors over the whole trace with a marker
at the chosen time, the wait-time histogram of the jobs that started in the
preceding window, the queue's numbers at that time, and the longest-waiting
pending jobs.

All plots live in one plotly ``FigureWidget`` (one column of subplots per
site), built once in its initial state; moving the time changes a few of its
properties in place in one ``batch_update``, never rebuilds it. (One widget
rather than one per site: with plotly 7's anywidget front end, in-place
updates to several FigureWidgets on one page were intermittently lost.)
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import ipywidgets as W
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.hpc.queue import WAIT_BIN_EDGES, WAIT_BIN_LABELS, QueueReplay, QueueSnapshot

__all__ = ["QueueDashboard"]

_HOUR, _DAY = 3600.0, 86400.0
# Trace order within each site's block of traces, and shapes (time markers) per site.
_PENDING, _RUNNING, _BUSY, _CAPACITY, _PENDING_NOW, _BUSY_NOW, _WAITS = range(7)
_TRACES_PER_SITE, _SHAPES_PER_SITE = 7, 2


def _hours(seconds: float) -> str:
    return f"{seconds / _HOUR:,.1f} h"


class _SiteView:
    """One site's column: its text widgets, and which traces and shapes of the shared figure are its own."""

    def __init__(self, name: str, replay: QueueReplay, column: int, *, window_s: float, top: int, width: int):
        self.name, self.replay, self.column, self.window_s, self.top = name, replay, column, window_s, top
        self.first_trace = column * _TRACES_PER_SITE
        self.first_shape = column * _SHAPES_PER_SITE
        first = pd.Timestamp(replay.first_submit, unit="s", tz="UTC")
        last = pd.Timestamp(replay.last_end, unit="s", tz="UTC")
        self.title = W.HTML(
            f"<h3 style='margin:4px 0'>{html.escape(name)}</h3>"
            f"<div>{len(replay):,} jobs, capacity {replay.capacity or 'unknown'} processors, "
            f"{first:%Y-%m-%d} to {last:%Y-%m-%d}</div>"
        )
        self.stats = W.HTML()
        self.stats.add_class("lab-site-stats")
        self.table = W.HTML()
        self.table.add_class("lab-pending-table")
        box = W.Layout(width=f"{width}px", padding="0 8px")
        self.header = W.VBox([self.title, self.stats], layout=box)
        self.footer = W.VBox([self.table], layout=box)

    def state(self, elapsed_s: float) -> tuple[float, QueueSnapshot, np.ndarray]:
        """(day, snapshot, wait-histogram counts) at ``elapsed_s`` seconds after the site's first job."""
        t = self.replay.first_submit + elapsed_s
        return elapsed_s / _DAY, self.replay.snapshot(t), self.replay.wait_histogram(t - self.window_s, t, WAIT_BIN_EDGES)

    def add_traces(self, fig: go.Figure, elapsed_s: float, points: int) -> None:
        r, col = self.replay, self.column + 1
        day, snap, counts = self.state(elapsed_s)
        timeline = r.timeline(points)
        days = (timeline["time"].to_numpy() - r.first_submit) / _DAY
        legend = self.column == 0
        site = f"<extra>{self.name}</extra>"  # hover text: what a point is, with its unit, and the site it belongs to
        fig.add_scatter(x=days, y=timeline["pending"], name="pending", line=dict(color="#d62728"), showlegend=legend, legendgroup="p",
                        hovertemplate="day %{x:.1f}: %{y:,d} jobs pending" + site, row=1, col=col)
        fig.add_scatter(x=days, y=timeline["running"], name="running", line=dict(color="#2ca02c"), showlegend=legend, legendgroup="r",
                        hovertemplate="day %{x:.1f}: %{y:,d} jobs running" + site, row=1, col=col)
        fig.add_scatter(x=days, y=timeline["busy_processors"], name="busy", line=dict(color="#1f77b4"), showlegend=legend, legendgroup="b",
                        hovertemplate="day %{x:.1f}: %{y:,d} processors busy" + site, row=2, col=col)
        cap = r.capacity if r.capacity is not None else float("nan")
        fig.add_scatter(x=[days[0], days[-1]], y=[cap, cap], mode="lines", name="capacity", line=dict(color="#7f7f7f", dash="dash"), showlegend=legend,
                        legendgroup="c", hovertemplate="capacity: %{y:,d} processors" + site, row=2, col=col)
        fig.add_scatter(x=[day], y=[snap.pending], mode="markers", marker=dict(size=10, color="#d62728"), showlegend=False, name="pending now",
                        hovertemplate="chosen time, day %{x:.2f}: %{y:,d} jobs pending" + site, row=1, col=col)
        fig.add_scatter(x=[day], y=[snap.busy_processors], mode="markers", marker=dict(size=10, color="#1f77b4"), showlegend=False, name="busy now",
                        hovertemplate="chosen time, day %{x:.2f}: %{y:,d} processors busy" + site, row=2, col=col)
        fig.add_bar(x=list(WAIT_BIN_LABELS), y=counts, name="jobs started", marker_color="#9467bd", showlegend=False,
                    hovertemplate="%{y:,d} jobs started after waiting %{x}" + site, row=3, col=col)
        for row in (1, 2):
            fig.add_vline(x=day, line=dict(color="black", width=1, dash="dot"), row=row, col=col)
        # Rows 1 and 2 share one time axis per site (zoom one, the other follows), in days since the site's first job.
        fig.update_xaxes(ticksuffix=" d", row=1, col=col)
        fig.update_xaxes(ticksuffix=" d", matches=f"x{col if col > 1 else ''}", row=2, col=col)
        fig.update_xaxes(title_text="wait before start", title_standoff=4, row=3, col=col)
        if col == 1:  # counts: integer ticks, axes titled with their unit
            fig.update_yaxes(title_text="jobs", row=1, col=col)
            fig.update_yaxes(title_text="processors", row=2, col=col)
            fig.update_yaxes(title_text="jobs started", row=3, col=col)
        for row in (1, 2, 3):
            fig.update_yaxes(tickformat=",d", rangemode="tozero", row=row, col=col)
        self.show_text(elapsed_s, snap)

    def move(self, fig: go.FigureWidget, elapsed_s: float) -> None:
        """Move the site to ``elapsed_s``; call inside the figure's ``batch_update``."""
        day, snap, counts = self.state(elapsed_s)
        fig.data[self.first_trace + _PENDING_NOW].update(x=[day], y=[snap.pending])
        fig.data[self.first_trace + _BUSY_NOW].update(x=[day], y=[snap.busy_processors])
        fig.data[self.first_trace + _WAITS].y = counts
        for shape in fig.layout.shapes[self.first_shape : self.first_shape + _SHAPES_PER_SITE]:
            shape.x0 = shape.x1 = day
        self.show_text(elapsed_s, snap)

    def show_text(self, elapsed_s: float, snap: QueueSnapshot) -> None:
        r = self.replay
        t = r.first_submit + elapsed_s
        util = "n/a" if math.isnan(snap.utilization) else f"{snap.utilization:.0%}"
        note = " <b>(after the trace's last job)</b>" if t > r.last_end else ""
        self.stats.value = (
            f"<div><b>{snap.datetime:%Y-%m-%d %H:%M} UTC</b>{note}<br>"
            f"pending <b>{snap.pending}</b> jobs ({snap.pending_processors:,} processors asked) &middot; "
            f"running <b>{snap.running}</b> &middot; busy {snap.busy_processors:,}/{r.capacity or '?'} ({util})</div>"
        )
        self.table.value = self._table_html(r.pending_jobs(t, limit=self.top), snap.pending)

    @staticmethod
    def _table_html(pending: pd.DataFrame, total: int) -> str:
        if pending.empty:
            return "<div class='lab-empty'>no job pending at this time</div>"
        shown = pd.DataFrame(
            {
                "job": pending["job_id"],
                "submitted (UTC)": pending["submitted"].dt.strftime("%m-%d %H:%M"),
                "waited so far": [_hours(s) for s in pending["waited_s"]],
                "procs": pending["processors"],
                "walltime asked": [_hours(s) if not np.isnan(s) else "?" for s in pending["requested_time_s"]],
                "total wait": [_hours(s) for s in pending["wait_s"]],
            }
        )
        caption = f"<div><b>longest-waiting pending jobs</b> ({len(pending)} of {total})</div>"
        nowrap = "<style>.lab-table th, .lab-table td {white-space: nowrap; padding: 0 6px}</style>"  # numbers never wrap
        return nowrap + caption + shown.to_html(index=False, border=0, classes="lab-table")


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
    top : int, default 10
        Rows of the pending-jobs table.
    step_hours : int, default 6
        Slider and play-button step, hours.
    start_day : float, default 30
        Initial elapsed time, days (clipped to the longest trace).
    width : int, default 380
        Pixel width of each site's column.

    Attributes
    ----------
    slider : ipywidgets.IntSlider
        Elapsed hours since each trace's first job; set ``slider.value`` to move every site.
    play : ipywidgets.Play
    figure : plotly.graph_objects.FigureWidget
        Rows: pending/running jobs, busy processors, wait histogram; one column per site.
    views : dict
        Per site name, its ``stats`` and ``table`` HTML widgets and its ``replay``.

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
        top: int = 10,
        step_hours: int = 6,
        start_day: float = 30.0,
        width: int = 380,
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
        replays = [replay for _, replay in named]
        max_hours = int(math.ceil(max(r.span for r in replays) / _HOUR))
        start = min(int(start_day * 24), max_hours)
        start -= start % step_hours

        self.views = {name: _SiteView(name, r, k, window_s=window_s, top=top, width=width) for k, (name, r) in enumerate(named)}
        n = len(replays)
        titles = ["jobs pending / running"] * n + ["busy processors"] * n + [f"wait of jobs started in the last {window_s / _DAY:g} d"] * n
        fig = make_subplots(rows=3, cols=n, vertical_spacing=0.1, horizontal_spacing=0.06, subplot_titles=titles)
        # The figure is built in its initial state: changes made before a FigureWidget is displayed never reach the page.
        for view in self.views.values():
            view.add_traces(fig, start * _HOUR, points)
        fig.update_layout(
            height=640,
            width=width * n,
            margin=dict(l=64, r=10, t=70, b=40),
            legend=dict(orientation="h", yanchor="bottom", y=1.05, x=0),
            uirevision="keep",
        )
        self.figure = go.FigureWidget(fig)

        # The slider counts hours (its step is step_hours); its readout is the clock beside it, in days.
        self.slider = W.IntSlider(
            value=start, min=0, max=max_hours, step=step_hours, description="time", readout=False, continuous_update=False,
            layout=W.Layout(width="60%"),
        )
        self.play = W.Play(value=start, min=0, max=max_hours, step=step_hours, interval=400, description="play")
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.clock = W.HTML()
        self._show_clock(start)
        self.slider.observe(self._on_time, names="value")
        views = list(self.views.values())
        super().__init__(
            [
                W.HBox([self.play, self.slider, self.clock]),
                W.HBox([v.header for v in views]),
                self.figure,
                W.HBox([v.footer for v in views]),
            ],
            layout=W.Layout(overflow="auto"),
        )

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
        hours = change["new"]
        self._show_clock(hours)
        with self.figure.batch_update():
            for view in self.views.values():
                view.move(self.figure, hours * _HOUR)

    def _show_clock(self, hours: int) -> None:
        self.clock.value = f"day <b>{hours / 24:.2f}</b> of each trace"
