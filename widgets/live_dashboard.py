"""Live sites dashboard: a federation's queues, the agent's placement decisions and job events as they arrive.

A thin view over :class:`lab.hpc.live.LiveSites`, which folds the event log written
by the continuation service and the skills. One plotly ``FigureWidget`` (a column
per site: pending and running jobs, busy CPUs against the site's size) is
extended in place; two HTML tables show the latest decisions (with what each site
looked like to the policy) and the latest events. :meth:`LiveSitesDashboard.refresh`
reads new events; :meth:`start` does it every ``interval_s`` seconds from a
background thread of the kernel, :meth:`stop` ends that.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.hpc.live import LiveSites
from widgets._refresh import BackgroundRefresh

__all__ = ["LiveSitesDashboard"]

_PENDING, _RUNNING, _BUSY, _TRACES_PER_SITE = 0, 1, 2, 3


def _clock(t: float) -> str:
    return pd.Timestamp(t, unit="s", tz="UTC").strftime("%H:%M:%S")


class LiveSitesDashboard(BackgroundRefresh, W.VBox):
    """Live queues of a federation's sites, placement decisions and job events.

    Parameters
    ----------
    db : path
        The federation's database (events written by ``python -m lab.hpc.continuation serve``).
    sites : sequence of str
        Site names, one column each.
    width : int
        Pixel width of each site's column.
    clock : callable, default time.time
        Now, in epoch seconds: a site whose newest sample is older than its stale threshold is shown as
        stale (:meth:`lab.hpc.live.LiveSites.state`), e.g. once the sites or the service have stopped.

    Attributes
    ----------
    figure : plotly.graph_objects.FigureWidget
    decisions, events : ipywidgets.HTML
    live : lab.hpc.live.LiveSites
    """

    _refresh_thread_name = "lab-live-dashboard"

    def __init__(self, db: str | Path, sites: Sequence[str], *, width: int = 300, clock: Callable[[], float] = time.time):
        self.live = LiveSites(db)
        self.clock = clock
        self.site_names = list(sites)
        if not self.site_names:
            raise ValueError("LiveSitesDashboard needs at least one site")
        n = len(self.site_names)
        fig = make_subplots(rows=2, cols=n, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=[*self.site_names, *["busy CPUs"] * n])
        for k, _ in enumerate(self.site_names):
            legend = k == 0
            fig.add_scatter(x=[], y=[], mode="lines", line_shape="hv", name="pending", line=dict(color="#d62728"), showlegend=legend, row=1, col=k + 1)
            fig.add_scatter(x=[], y=[], mode="lines", line_shape="hv", name="running", line=dict(color="#2ca02c"), showlegend=legend, row=1, col=k + 1)
            fig.add_scatter(x=[], y=[], mode="lines", line_shape="hv", name="busy CPUs", line=dict(color="#1f77b4"), showlegend=legend, row=2, col=k + 1)
        fig.update_layout(height=420, width=width * n, margin=dict(l=40, r=10, t=60, b=30), legend=dict(orientation="h", yanchor="bottom", y=1.08, x=0))
        self.figure = go.FigureWidget(fig)
        self.status = W.HTML()
        self.decisions = W.HTML()
        self.decisions.add_class("lab-live-decisions")
        self.events = W.HTML()
        self.events.add_class("lab-live-events")
        self._init_refresh()
        super().__init__([self.status, self.figure, W.HBox([self.decisions, self.events])])
        self.refresh()

    def refresh(self) -> int:
        """Fold new events into the view, updating it in place; returns how many arrived."""
        new = self.live.update()
        status = " &middot; ".join(self._site_status(name) for name in self.site_names)
        if not new and self.decisions.value:
            self.status.value = status  # ages grow without new events: a stopped site turns stale
            return 0
        with self.figure.batch_update():
            for k, name in enumerate(self.site_names):
                s = self.live.sites.get(name)
                if s is None:
                    continue
                x = [pd.Timestamp(t, unit="s", tz="UTC") for t in s.time]
                base = k * _TRACES_PER_SITE
                self.figure.data[base + _PENDING].update(x=x, y=s.pending)
                self.figure.data[base + _RUNNING].update(x=x, y=s.running)
                self.figure.data[base + _BUSY].update(x=x, y=s.busy_cpus)
        self.status.value = status
        self.decisions.value = self._decisions_html()
        self.events.value = self._events_html()
        return len(new)

    def _site_status(self, name: str) -> str:
        s, st = self.live.sites.get(name), self.live.state(name, self.clock())
        label = f"<b>{html.escape(name)}</b>: "
        if st.state == "no sample":
            return label + "no sample yet"
        if st.state == "unavailable":
            return label + "<span style='color:#d62728'>unavailable</span>"
        numbers = f"{s.pending[-1]} pending, {s.running[-1]} running, {s.busy_cpus[-1]}/{s.total_cpus} CPUs busy"
        if st.state == "stale":
            return label + (f"<span class='lab-stale' style='color:#7f7f7f'>stopped or not polled: no sample for {st.age_s:,.0f} s "
                            f"(last: {numbers} at {_clock(s.time[-1])})</span>")
        return label + numbers

    def _decisions_html(self, last: int = 8) -> str:
        decisions = self.live.decisions[-last:][::-1]
        if not decisions:
            return "<div><b>placement decisions</b></div><div>no placement yet</div>"
        rows = [{"time": _clock(d["time"]), "job": d["job"], "policy": d["policy"], "chosen": d["chosen"]} for d in decisions]
        newest = decisions[0]
        return ("<div><b>placement decisions</b></div>" + pd.DataFrame(rows).to_html(index=False, border=0)
                + f"<div><b>what each site showed</b> for {html.escape(newest['job'])} ({html.escape(newest['policy'])})</div>"
                + self._candidates_table(newest).to_html(index=False, border=0, na_rep="", escape=False))

    @staticmethod
    def _candidates_table(d: dict) -> pd.DataFrame:
        """One row per site of a decision: what the policy saw (seconds are relative to the decision)."""
        t0 = d["time"]

        def rel(t):
            return None if t is None else f"+{max(0.0, t - t0):,.0f}"

        rows = []
        for c in d["candidates"]:
            rows.append({
                "site": ("&#9654; " if c["site"] == d["chosen"] else "") + html.escape(c["site"]),
                "eligible": "yes" if c["eligible"] else f"no: {html.escape(c.get('reason') or 'not eligible')}",
                "pending": c.get("pending"), "running": c.get("running"),
                "idle / total CPUs": None if c.get("idle_cpus") is None else f"{c['idle_cpus']} / {c.get('total_cpus')}",
                "start in (s)": rel(c.get("estimated_start")),
                "transfer (s)": None if not c["eligible"] else f"{c.get('transfer_s', 0.0):,.0f}",
                "done in (s)": rel(c.get("predicted_completion")),
            })
        return pd.DataFrame(rows)

    def _events_html(self, last: int = 12) -> str:
        rows = [{"time": _clock(e.time), "event": e.kind, "about": e.key} for e in list(self.live.events)[-last:][::-1]]
        table = pd.DataFrame(rows).to_html(index=False, border=0) if rows else "<div>no event yet</div>"
        return "<div><b>events</b></div>" + table
