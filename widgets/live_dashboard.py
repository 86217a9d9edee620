"""Live sites dashboard: a federation's queues, jobs, the agent's placement decisions and job events as they arrive.

A thin view over :class:`lab.hpc.live.LiveSites`, which folds the event log written by the
continuation service and the skills. One :class:`~widgets.live_chart.LiveChart` (a column per site:
pending and running jobs, busy CPUs against the site's size) is drawn whole from the folded series;
sortable tables (:class:`~widgets.sortable_table.SortableTable`) list every site's pending and running
jobs (waited so far, Slurm's estimated start, walltime asked, CPUs: :meth:`lab.hpc.live.LiveSites.jobs`),
the latest decisions, what each site showed the newest one (:func:`lab.hpc.views.candidate_table`) and
the latest events. A site whose samples stopped is shown stale with its age, in its panel, its status
and its job rows; the status line says whether the view itself is still refreshing.

:meth:`LiveSitesDashboard.refresh` reads new events; :meth:`start` does it every ``interval_s`` seconds
from a background thread of the kernel, :meth:`stop` ends that. Everything takes the width of its
output area.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ipywidgets as W
import pandas as pd

from lab.hpc.live import LiveSites
from lab.hpc.views import candidate_table, decision_table, event_table, job_table
from widgets._refresh import BackgroundRefresh
from widgets.live_chart import LiveChart
from widgets.sortable_table import SortableTable

__all__ = ["LiveSitesDashboard"]

_PENDING, _RUNNING, _BUSY, _TOTAL, _TRACES_PER_SITE = 0, 1, 2, 3, 4
_COLOURS = {"pending": "#d62728", "running": "#2ca02c", "busy": "#1f77b4", "total": "#7f7f7f"}


def _clock(t: float) -> str:
    return pd.Timestamp(t, unit="s", tz="UTC").strftime("%H:%M:%S")


def _plotly_time(t: float) -> str:
    # plotly.js reads "YYYY-MM-DD HH:MM:SS.ffffff" (no zone); the axis says UTC
    return pd.Timestamp(t, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%S.%f")


def _axis(letter: str, index: int) -> str:
    return f"{letter}{index if index > 1 else ''}"


class LiveSitesDashboard(BackgroundRefresh, W.VBox):
    """Live queues and jobs of a federation's sites, placement decisions and job events.

    Parameters
    ----------
    db : path
        The federation's database (events written by ``python -m lab.hpc.continuation serve``).
    sites : sequence of str
        Site names, one column each.
    width : int, optional
        Pixel width of each site's column; default: the sites share the output area's width.
    clock : callable, default time.time
        Now, in epoch seconds: a site whose newest sample is older than its stale threshold is shown as
        stale (:meth:`lab.hpc.live.LiveSites.state`), e.g. once the sites or the service have stopped.

    Attributes
    ----------
    chart : widgets.live_chart.LiveChart
        ``chart.figure``: rows pending/running jobs and busy CPUs; site ``k`` owns traces ``4k .. 4k+3``
        (pending, running, busy CPUs, total CPUs).
    jobs, decisions, candidates, events : widgets.sortable_table.SortableTable
    status : ipywidgets.HTML
        Whether the view refreshes, and each site's numbers or why there are none.
    live : lab.hpc.live.LiveSites
    """

    _refresh_thread_name = "lab-live-dashboard"

    def __init__(self, db: str | Path, sites: Sequence[str], *, width: int | None = None, clock: Callable[[], float] = time.time):
        self.live = LiveSites(db)
        self.clock = clock
        self.site_names = list(sites)
        if not self.site_names:
            raise ValueError("LiveSitesDashboard needs at least one site")
        repeated = sorted({n for n in self.site_names if self.site_names.count(n) > 1})
        if repeated:
            raise ValueError(f"site names must be unique, but {repeated} repeat")
        if width is not None and (int(width) != width or width < 100):
            raise ValueError(f"width must be an integer number of pixels >= 100 (or None to fit the output area), not {width!r}")
        self._width = None if width is None else int(width) * len(self.site_names)
        self.chart = LiveChart()
        self.chart.layout.width = "100%" if self._width is None else f"{self._width}px"
        self.chart.layout.max_width = "100%"
        self.status = W.HTML()  # its own margins: a width of 100% would reach 4 px past the output area
        self.status.add_class("lab-live-status")
        self.jobs = SortableTable(max_height=300)
        self.decisions = SortableTable(max_height=220)
        self.candidates = SortableTable(max_height=220)
        self.events = SortableTable(max_height=300)
        for table, name in ((self.jobs, "jobs"), (self.decisions, "decisions"), (self.candidates, "candidates"), (self.events, "events")):
            table.add_class(f"lab-live-{name}")
        self._refreshed_at: float | None = None
        self._refreshing_every: float | None = None
        self._stopped_at: float | None = None
        self._init_refresh()
        side = W.VBox([self.decisions, self.candidates], layout=W.Layout(flex="2 1 420px", min_width="0", padding="0 12px 0 0"))
        events = W.VBox([self.events], layout=W.Layout(flex="1 1 260px", min_width="0"))
        super().__init__(
            [self.status, self.chart, self.jobs, W.HBox([side, events], layout=W.Layout(width="100%", flex_flow="row wrap"))],
            layout=W.Layout(width="100%", max_width="100%"),
        )
        self.add_class("lab-live-dashboard")
        self.refresh()

    # ---- refresh: background thread, and its stopped/started state in the status line
    def start(self, interval_s: float = 1.0) -> None:
        """Refresh every ``interval_s`` seconds from a background thread until :meth:`stop`."""
        self._refreshing_every, self._stopped_at = float(interval_s), None
        super().start(interval_s)
        self._show_status()

    def stop(self) -> None:
        """End the background refresh; the view keeps what it shows and says since when it has stopped."""
        super().stop()
        if self._refreshing_every is not None:
            self._refreshing_every, self._stopped_at = None, self.clock()
        self._show_status()

    def refresh(self) -> int:
        """Fold new events into the view and redraw it; returns how many events arrived."""
        new = self.live.update()
        now = self.clock()
        self._refreshed_at = now
        self.chart.figure = self._figure(now)
        rows, stale = self.live.jobs(now, self.site_names)
        self.jobs.show(job_table(rows, stale=stale, empty=self._jobs_empty(stale),
                                 caption="jobs on every site: pending (longest-waiting first) and running. Click a header to sort."))
        self.decisions.show(decision_table(self.live.decisions))
        self.candidates.show(candidate_table(self.live.decisions[-1] if self.live.decisions else None))
        self.events.show(event_table(self.live.events))
        self._show_status()
        return len(new)

    def _jobs_empty(self, stale: dict[str, str]) -> str:
        heard = [n for n in self.site_names if n in self.live.sites and self.live.sites[n].time]
        if not heard:
            return "no queue sample yet: is the continuation service running (python -m lab.hpc.continuation serve)?"
        return "no job pending or running on any site" + (" (as of the last samples of stale sites)" if stale else "")

    # ---- what each site says now
    def _site_status(self, name: str, now: float) -> str:
        s, st = self.live.sites.get(name), self.live.state(name, now)
        label = f"<b>{html.escape(name)}</b>: "
        if st.state == "no sample":
            return label + "no sample yet"
        if st.state == "unavailable":
            why = f" ({html.escape(s.error)})" if s is not None and s.error else ""
            return label + f"<span class='lab-unavailable' style='color:#d62728'>unavailable{why}</span>"
        numbers = f"{s.pending[-1]} pending, {s.running[-1]} running, {s.busy_cpus[-1]}/{s.total_cpus} CPUs busy"
        if st.state == "stale":
            return label + (f"<span class='lab-stale' style='color:#7f7f7f'>stopped or not polled: no sample for {st.age_s:,.0f} s "
                            f"(last: {numbers} at {_clock(s.time[-1])})</span>")
        return label + numbers

    def _show_status(self) -> None:
        now = self.clock()
        if self._refreshing_every is not None:
            view = f"<span class='lab-refresh-on'>following the event log every {self._refreshing_every:g} s</span>"
        elif self._stopped_at is not None:
            view = (f"<span class='lab-refresh-stopped' style='color:#b45f06'><b>stopped</b> at {_clock(self._stopped_at)} UTC: "
                    "this view no longer refreshes (call start() to follow again)</span>")
        else:
            view = "<span class='lab-refresh-off'>not refreshing by itself (call start(), or refresh())</span>"
        if self._refreshed_at is not None:
            view += f" &middot; last read {_clock(self._refreshed_at)} UTC"
        sites = "<br>".join(self._site_status(name, now) for name in self.site_names)
        self.status.value = f"<div style='white-space:normal'>{view}</div><div>{sites}</div>"

    # ---- the chart, drawn whole
    def _figure(self, now: float) -> dict:
        n = len(self.site_names)
        gap = 0.24 / max(n, 2)
        width = (1 - gap * (n - 1)) / n
        data, layout = [], {
            "height": 440, "margin": {"l": 56, "r": 10, "t": 64, "b": 36}, "hovermode": "closest", "uirevision": "keep",
            "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.1, "x": 0}, "annotations": [], "showlegend": True,
        }
        if self._width is not None:
            layout["width"] = self._width
        for k, name in enumerate(self.site_names):
            x0 = k * (width + gap)
            top, bottom = k + 1, n + k + 1  # axis numbers: row 1 and row 2 of column k
            for index, domain_y, title in ((top, [0.56, 1.0], "jobs"), (bottom, [0.0, 0.42], "busy CPUs")):
                layout[_axis("xaxis", index)] = {"domain": [x0, x0 + width], "anchor": _axis("y", index), "type": "date",
                                                 "tickformat": "%H:%M:%S", "hoverformat": "%H:%M:%S",  # one line: the title fits under it
                                                 "matches": "x" if index != 1 else None, "showticklabels": index == bottom,
                                                 "title": {"text": "time (UTC)"} if index == bottom else None}
                layout[_axis("yaxis", index)] = {"domain": domain_y, "anchor": _axis("x", index), "rangemode": "tozero", "tickformat": ",d",
                                                 "title": {"text": title} if k == 0 else None}
                layout[_axis("xaxis", index)] = {key: v for key, v in layout[_axis("xaxis", index)].items() if v is not None}
                layout[_axis("yaxis", index)] = {key: v for key, v in layout[_axis("yaxis", index)].items() if v is not None}
            layout["annotations"].append({"text": f"<b>{html.escape(name)}</b>", "showarrow": False, "xref": "paper", "yref": "paper",
                                          "x": x0 + width / 2, "y": 1.0, "yanchor": "bottom", "font": {"size": 14}})
            s = self.live.sites.get(name)
            samples = len(s.time) if s else 0
            # a queue is written only when it changes (or every heartbeat_s): while the site is live, its last
            # sample still holds, so each step line runs on to now (one sample is a line too, not a lone marker)
            held = samples > 0 and now > s.time[-1] and self.live.state(name, now).state == "live"
            times = ([_plotly_time(t) for t in s.time] + ([_plotly_time(now)] if held else [])) if s else []
            site = f"<extra>{html.escape(name)}</extra>"
            legend = k == 0
            for key, ys, index, label, unit in (("pending", s.pending if s else [], top, "pending", "jobs pending"),
                                                ("running", s.running if s else [], top, "running", "jobs running"),
                                                ("busy", s.busy_cpus if s else [], bottom, "busy CPUs", "CPUs busy")):
                ys = list(ys) + ([ys[-1]] if held else [])
                data.append({"type": "scatter", "mode": "lines+markers" if samples < 3 else "lines", "line": {"shape": "hv", "color": _COLOURS[key]},
                             "marker": {"size": [6] * samples + [0] * (len(ys) - samples)},  # no marker where no sample is
                             "x": times, "y": ys, "name": label, "legendgroup": key, "showlegend": legend,
                             "xaxis": _axis("x", index), "yaxis": _axis("y", index),
                             "hovertemplate": f"%{{x|%H:%M:%S}} UTC: %{{y:,d}} {unit}" + site})
            total = s.total_cpus if s and s.total_cpus is not None else None
            for index, values in ((top, [*(s.pending if s else []), *(s.running if s else [])]), (bottom, [*(s.busy_cpus if s else []), total or 0])):
                if values and max(values) <= 5:  # small counts: one tick per integer (",d" would print 0, 1, 1, 2, 2)
                    layout[_axis("yaxis", index)]["dtick"] = 1
            data.append({"type": "scatter", "mode": "lines", "line": {"dash": "dash", "color": _COLOURS["total"]},
                         "x": [times[0], times[-1]] if times and total is not None else [], "y": [total, total] if times and total is not None else [],
                         "name": "site's CPUs", "legendgroup": "total", "showlegend": legend, "xaxis": _axis("x", bottom), "yaxis": _axis("y", bottom),
                         "hovertemplate": "%{y:,d} CPUs at the site" + site})
            note = self._panel_note(name, now)
            if note is not None:
                text, colour = note
                layout["annotations"].append({"text": text, "showarrow": False, "xref": f"{_axis('x', top)} domain",
                                              "yref": f"{_axis('y', top)} domain", "x": 0.5, "y": 0.5, "font": {"color": colour, "size": 12},
                                              "bgcolor": "rgba(255,255,255,0.8)", "name": f"note:{name}"})
                if not times:
                    for index in (top, bottom):
                        layout[_axis("yaxis", index)].update(range=[0, 1], showticklabels=False)
                        layout[_axis("xaxis", index)].update(showticklabels=False)
        return {"data": data, "layout": layout}

    def _panel_note(self, name: str, now: float) -> tuple[str, str] | None:
        """What a site's panel says over its lines (None when its numbers are current)."""
        st = self.live.state(name, now)
        if st.state == "live":
            return None
        if st.state == "no sample":
            return "no sample yet:<br>waiting for the continuation service", "#555"
        if st.state == "unavailable":
            return "unavailable:<br>the site does not answer", "#d62728"
        return f"stale: no sample for {st.age_s:,.0f} s<br>(site or service stopped)", "#7f7f7f"
