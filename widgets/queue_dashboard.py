"""Site-queue dashboard: several HPC sites' queues replayed side by side.

A view over :class:`lab.hpc.queue.QueueReplay` objects. One time control
(slider plus play button) moves every site to the same *elapsed* time since
its trace's first job (the traces come from different years, so calendar time
would not overlap). Per site it shows the pending and running job counts and
the busy processors over the whole trace with a marker at the chosen time, the
wait-time histogram of the jobs that started in the preceding window, the
queue's numbers at that time, and the longest-waiting pending jobs.

Every figure is a plotly ``FigureWidget`` built once; moving the time changes
a few of its properties in place (``batch_update``), never rebuilds it.
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

from lab.hpc.queue import WAIT_BIN_EDGES, WAIT_BIN_LABELS, QueueReplay

__all__ = ["QueueDashboard"]

_HOUR, _DAY = 3600.0, 86400.0
_PENDING, _RUNNING, _BUSY, _CAPACITY, _PENDING_NOW, _BUSY_NOW, _WAITS = range(7)  # trace order in each figure


def _hours(seconds: float) -> str:
    return f"{seconds / _HOUR:,.1f} h"


class _SiteView:
    """The widgets of one site's column; all numbers come from its QueueReplay."""

    def __init__(self, replay: QueueReplay, *, points: int, window_s: float, top: int, width: int):
        self.replay, self.window_s, self.top = replay, window_s, top
        timeline = replay.timeline(points)
        days = (timeline["time"].to_numpy() - replay.first_submit) / _DAY
        fig = make_subplots(
            rows=3,
            cols=1,
            vertical_spacing=0.11,
            subplot_titles=("jobs pending / running", "busy processors", f"wait of jobs started in the last {window_s / _DAY:g} days"),
        )
        fig.add_scatter(x=days, y=timeline["pending"], name="pending", line=dict(color="#d62728"), row=1, col=1)
        fig.add_scatter(x=days, y=timeline["running"], name="running", line=dict(color="#2ca02c"), row=1, col=1)
        fig.add_scatter(x=days, y=timeline["busy_processors"], name="busy", line=dict(color="#1f77b4"), row=2, col=1)
        cap = replay.capacity if replay.capacity is not None else float("nan")
        fig.add_scatter(x=[days[0], days[-1]], y=[cap, cap], name="capacity", line=dict(color="#7f7f7f", dash="dash"), row=2, col=1)
        fig.add_scatter(x=[0], y=[0], mode="markers", marker=dict(size=10, color="#d62728"), showlegend=False, name="pending now", row=1, col=1)
        fig.add_scatter(x=[0], y=[0], mode="markers", marker=dict(size=10, color="#1f77b4"), showlegend=False, name="busy now", row=2, col=1)
        fig.add_bar(x=list(WAIT_BIN_LABELS), y=[0] * len(WAIT_BIN_LABELS), name="jobs started", marker_color="#9467bd", showlegend=False, row=3, col=1)
        for row in (1, 2):
            fig.add_vline(x=0, line=dict(color="black", width=1, dash="dot"), row=row, col=1)
        fig.update_xaxes(title_text="days since the trace's first job", row=2, col=1)
        fig.update_xaxes(title_text="wait", row=3, col=1)
        fig.update_layout(
            height=640,
            width=width,
            margin=dict(l=50, r=10, t=40, b=40),
            legend=dict(orientation="h", y=1.08, x=0),
            uirevision="keep",
        )
        self.figure = go.FigureWidget(fig)
        first = pd.Timestamp(replay.first_submit, unit="s", tz="UTC")
        last = pd.Timestamp(replay.last_end, unit="s", tz="UTC")
        self.title = W.HTML(
            f"<h3 style='margin:4px 0'>{html.escape(replay.name)}</h3>"
            f"<div>{len(replay):,} jobs, capacity {replay.capacity or 'unknown'} processors, "
            f"{first:%Y-%m-%d} to {last:%Y-%m-%d}</div>"
        )
        self.stats = W.HTML()
        self.stats.add_class("lab-site-stats")
        self.table = W.HTML()
        self.table.add_class("lab-pending-table")
        self.widget = W.VBox([self.title, self.stats, self.figure, self.table], layout=W.Layout(width=f"{width + 10}px"))

    def show(self, elapsed_s: float) -> None:
        r = self.replay
        t = r.first_submit + elapsed_s
        snap = r.snapshot(t)
        counts = r.wait_histogram(t - self.window_s, t, WAIT_BIN_EDGES)
        day = elapsed_s / _DAY
        after_end = t > r.last_end
        with self.figure.batch_update():
            self.figure.data[_PENDING_NOW].update(x=[day], y=[snap.pending])
            self.figure.data[_BUSY_NOW].update(x=[day], y=[snap.busy_processors])
            self.figure.data[_WAITS].y = counts
            for shape in self.figure.layout.shapes:
                shape.x0 = shape.x1 = day
        util = "n/a" if math.isnan(snap.utilization) else f"{snap.utilization:.0%}"
        note = " <b>(after the trace's last job)</b>" if after_end else ""
        self.stats.value = (
            f"<div><b>{snap.datetime:%Y-%m-%d %H:%M} UTC</b>{note}<br>"
            f"pending <b>{snap.pending}</b> jobs ({snap.pending_processors:,} processors asked) &middot; "
            f"running <b>{snap.running}</b> &middot; busy {snap.busy_processors:,}/{r.capacity or '?'} ({util})</div>"
        )
        pending = r.pending_jobs(t, limit=self.top)
        self.table.value = self._table_html(pending, r.snapshot(t).pending)

    def _table_html(self, pending: pd.DataFrame, total: int) -> str:
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
        return caption + shown.to_html(index=False, border=0, classes="lab-table")


class QueueDashboard(W.VBox):
    """Several sites' queues, replayed side by side under one time control.

    Parameters
    ----------
    sites : mapping of name to QueueReplay, or sequence of QueueReplay
        One column per site (a mapping's keys rename the replays).
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
    width : int, default 430
        Pixel width of each site's figure.

    Attributes
    ----------
    slider : ipywidgets.IntSlider
        Elapsed hours since each trace's first job; set ``slider.value`` to move every site.
    play : ipywidgets.Play
    views : dict of str to the per-site widgets (``figure``, ``stats``, ``table``).
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
        width: int = 430,
    ):
        if isinstance(sites, Mapping):
            replays = []
            for name, replay in sites.items():
                replay.name = name
                replays.append(replay)
        else:
            replays = list(sites)
        if not replays:
            raise ValueError("QueueDashboard needs at least one site")
        self.views = {r.name: _SiteView(r, points=points, window_s=window_s, top=top, width=width) for r in replays}
        max_hours = int(math.ceil(max(r.span for r in replays) / _HOUR))
        start = min(int(start_day * 24), max_hours)
        self.slider = W.IntSlider(
            value=start - start % step_hours,
            min=0,
            max=max_hours,
            step=step_hours,
            description="hours",
            continuous_update=False,
            layout=W.Layout(width="70%"),
        )
        self.play = W.Play(value=self.slider.value, min=0, max=max_hours, step=step_hours, interval=400, description="play")
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.clock = W.HTML()
        self.slider.observe(self._on_time, names="value")
        controls = W.HBox([self.play, self.slider, self.clock])
        columns = W.HBox([v.widget for v in self.views.values()], layout=W.Layout(overflow="auto"))
        super().__init__([controls, columns])
        self._show(self.slider.value)

    @property
    def elapsed_s(self) -> float:
        """Chosen time, seconds since each trace's first job."""
        return self.slider.value * _HOUR

    def _on_time(self, change) -> None:
        self._show(change["new"])

    def _show(self, hours: int) -> None:
        self.clock.value = f"day <b>{hours / 24:.2f}</b> of each trace"
        for view in self.views.values():
            view.show(hours * _HOUR)
