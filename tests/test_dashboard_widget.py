"""QueueDashboard in Python: it shows what QueueReplay says, and updates its figures in place."""

from __future__ import annotations

import numpy as np
import pytest

from lab.hpc import QueueReplay, load_trace, parse_swf
from lab.hpc.queue import WAIT_BIN_EDGES
from widgets import QueueDashboard

HOUR, DAY = 3600.0, 86400.0

# Two jobs on a 4-processor machine; times relative to UnixStartTime 0.
SMALL = """; MaxProcs: 4
1 0     7200 3600 2 -1 -1 2 3600 -1 1 1 1 -1 -1 -1 -1 -1
2 3600  0    7200 1 -1 -1 1 7200 -1 1 1 1 -1 -1 -1 -1 -1
"""


@pytest.fixture(scope="module")
def real():
    return {name: QueueReplay(load_trace(name)) for name in ("theta_2022", "hpc2n")}


def data(dash):
    return dash.chart.figure["data"]


def empty_notes(dash):
    return {a["name"].removeprefix("empty:"): a["text"] for a in dash.chart.figure["layout"]["annotations"] if a.get("name", "").startswith("empty:")}


def test_small_site_numbers_follow_the_replay():
    replay = QueueReplay(parse_swf(SMALL), name="tiny")
    dash = QueueDashboard([replay], step_hours=1, start_day=0, points=10)
    view = dash.views["tiny"]
    # t = 0: job 1 pending (waits until 2 h), nothing running.
    assert "pending <b>1</b>" in view.stats.value and "running <b>0</b>" in view.stats.value
    assert [(r.id, r.group) for r in dash.jobs.shown()] == [("tiny/1", "pending")]
    assert empty_notes(dash) == {"tiny": "no job started in the 7 d before this time"}  # says why, not an empty -1..1 plot
    assert dash.chart.figure["layout"]["yaxis3"]["range"] == [0, 1]
    dash.slider.value = 1  # t = 1 h: job 2 started at 1 h (no wait), job 1 still pending
    assert "pending <b>1</b>" in view.stats.value and "running <b>1</b>" in view.stats.value
    assert "busy 1/4 (25%)" in view.stats.value
    assert [(r.id, r.group) for r in dash.jobs.shown()] == [("tiny/1", "pending"), ("tiny/2", "running")]
    dash.slider.value = 2  # t = 2 h: both running, 3 of 4 processors busy, queue empty
    assert "pending <b>0</b>" in view.stats.value and "busy 3/4 (75%)" in view.stats.value
    assert {r.group for r in dash.jobs.shown()} == {"running"}
    # the window is [t - 7 d, t): job 1, starting exactly at t = 2 h, is not in it yet
    assert data(dash)[6]["y"] == [1] + [0] * 11 and empty_notes(dash) == {}
    assert dash.chart.figure["layout"]["yaxis3"]["autorange"] is True
    dash.slider.value = 3
    hist = data(dash)[6]["y"]
    assert hist[0] == 1 and hist[4] == 1 and sum(hist) == 2  # waits 0 s (<1m) and exactly 2 h (bin [2h, 4h))
    dash.slider.value = dash.slider.max  # both jobs ended: nothing in the table, and it says why
    assert dash.jobs.table["rows"] == [] and dash.jobs.table["empty"] == "no job pending or running: every trace has ended by this time"


def test_slider_moves_every_site(real):
    dash = QueueDashboard(real, start_day=30)
    chart, n_traces = dash.chart, len(data(dash))
    table = dash.jobs.table
    dash.slider.value += 24
    assert dash.chart is chart and len(data(dash)) == n_traces  # same widget, same traces
    assert [s["x0"] for s in dash.chart.figure["layout"]["shapes"]] == pytest.approx([31.0] * 4)  # markers moved one day
    assert table != dash.jobs.table
    rows = dash.jobs.data.rows
    for column, view in enumerate(dash.views.values()):
        first = 7 * column  # each site owns 7 traces: pending, running, busy, capacity, 2 markers, histogram
        t = view.replay.first_submit + dash.elapsed_s
        snap = view.replay.snapshot(t)
        assert data(dash)[first + 4]["y"] == [snap.pending]
        assert data(dash)[first + 5]["y"] == [snap.busy_processors]
        np.testing.assert_array_equal(data(dash)[first + 6]["y"], view.replay.wait_histogram(t - 7 * DAY, t, WAIT_BIN_EDGES))
        top = view.replay.pending_jobs(t, limit=25)
        site_pending = [r.id for r in rows if r.id.startswith(f"{view.name}/") and r.group == "pending"]
        assert site_pending == [f"{view.name}/{int(j)}" for j in top.job_id]  # the longest-waiting, in that order
    # clicking "waited so far" sorts by the durations, longest first on the second click
    dash.jobs.sort = {"key": "waited", "descending": True}
    waited = dash.jobs.data.column_index("waited")
    keys = [r.cells[waited].sort for r in dash.jobs.shown()]
    assert keys == sorted(keys, reverse=True) and len(keys) == len(rows)
    dash.jobs.group_filter = "running"
    assert {r.group for r in dash.jobs.shown()} == {"running"}
    dash.slider.value += 6
    assert dash.jobs.sort == {"key": "waited", "descending": True} and dash.jobs.group_filter == "running"  # kept across moves


def test_the_chart_fits_its_output_area(real):
    dash = QueueDashboard(real)
    layout = dash.chart.figure["layout"]
    assert "width" not in layout and dash.chart.layout.width == "100%" and dash.layout.width == "100%"
    assert QueueDashboard(real, width=300).chart.figure["layout"]["width"] == 600
    with pytest.raises(ValueError, match="width must be an integer number of pixels >= 100"):
        QueueDashboard(real, width=20)


def test_time_axis_is_elapsed_and_covers_the_longest_trace(real):
    dash = QueueDashboard(real)
    assert dash.slider.max == int(np.ceil(max(r.span for r in real.values()) / HOUR))
    assert dash.slider.value == 30 * 24
    hpc2n = dash.views["hpc2n"]
    dash.slider.value = dash.slider.max - dash.slider.max % 6  # far past HPC2N's 61-day trace
    assert "after the trace's last job" in hpc2n.stats.value
    assert empty_notes(dash)["hpc2n"] == "no job started in the 7 d before this time:<br>the trace ended on day 61.2"


def test_needs_a_site():
    with pytest.raises(ValueError, match="at least one site"):
        QueueDashboard([])


def test_sites_are_named_without_changing_the_replays(real):
    replay = real["hpc2n"]
    dash = QueueDashboard({"Seth": replay, "Seth again": replay})  # one replay may be shown twice
    assert list(dash.views) == ["Seth", "Seth again"] and replay.name == "hpc2n"
    dash.slider.value += 6
    assert dash.views["Seth"].stats.value == dash.views["Seth again"].stats.value


@pytest.mark.parametrize(
    "sites, kwargs, error, message",
    [
        ("dupes", {}, ValueError, r"site names must be unique, but \['hpc2n'\] repeat"),
        ("trace", {}, TypeError, r"site 'x': expected a lab.hpc.QueueReplay, got SWFTrace"),
        ("ok", {"step_hours": 0}, ValueError, r"step_hours must be an integer >= 1, not 0"),
        ("ok", {"points": 1}, ValueError, r"points must be an integer >= 2, not 1"),
        ("ok", {"top": 0}, ValueError, r"top must be an integer >= 1, not 0"),
        ("ok", {"window_s": 0}, ValueError, r"window_s must be positive seconds, not 0"),
    ],
)
def test_bad_arguments_are_refused(real, sites, kwargs, error, message):
    arg = {
        "dupes": [real["hpc2n"], real["hpc2n"]],
        "trace": {"x": real["hpc2n"].trace},
        "ok": [real["hpc2n"]],
    }[sites]
    with pytest.raises(error, match=message):
        QueueDashboard(arg, **kwargs)


def test_small_counts_get_one_tick_per_integer(real):
    replay = QueueReplay(parse_swf(SMALL), name="tiny")
    dash = QueueDashboard([replay], step_hours=1, start_day=0, points=10)
    layout = dash.chart.figure["layout"]
    assert layout["yaxis"]["dtick"] == 1 and layout["yaxis2"]["dtick"] == 1  # at most 2 jobs, 4 processors
    dash.slider.value = 3
    assert dash.chart.figure["layout"]["yaxis3"]["dtick"] == 1  # 2 jobs started
    big = QueueDashboard(real)
    assert "dtick" not in big.chart.figure["layout"]["yaxis"]  # Theta's hundreds: plotly's own ticks
