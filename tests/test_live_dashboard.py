"""Live mode: the event log folded into per-site series, decisions and events, and the widget that shows them."""

from __future__ import annotations

from lab.events import EventLog
from lab.hpc.live import LiveSites, SiteState
from widgets import LiveSitesDashboard, QueueDashboard


def _decision(t, chosen):
    return {
        "policy": "earliest_completion",
        "chosen": chosen,
        "time": t,
        "spec": {},
        "candidates": [
            {"site": "alpha", "eligible": True, "estimated_start": t + 40, "pending": 3},
            {"site": "beta", "eligible": False, "estimated_start": None, "pending": None},
        ],
    }


def fill(log):
    log.append("alpha", "site.queue", "alpha", {"pending": 0, "running": 1, "idle_cpus": 1, "total_cpus": 2, "time": 100.0}, at=100.0)
    log.append("beta", "site.queue", "beta", {"pending": 2, "running": 1, "idle_cpus": 0, "total_cpus": 1, "time": 100.5}, at=100.5)
    log.append("agent", "placement.decision", "alpha/7", _decision(101.0, "alpha"), at=101.0)
    log.append("alpha", "job.submitted", "alpha/7", {"site": "alpha", "job_id": "7"}, at=101.0)
    log.append("alpha", "site.queue", "alpha", {"pending": 0, "running": 2, "idle_cpus": 0, "total_cpus": 2, "time": 102.0}, at=102.0)
    log.append("beta", "site.unavailable", "beta", {"error": "down"}, at=103.0)
    log.append("alpha", "job.completed", "alpha/7", {"exit_code": 0}, at=104.0)


def test_live_sites_fold(tmp_path):
    log = EventLog(tmp_path / "lab.db")
    live = LiveSites(log)
    fill(log)
    assert len(live.update()) == 7 and live.update() == []
    alpha, beta = live.sites["alpha"], live.sites["beta"]
    assert (alpha.time, alpha.pending, alpha.running, alpha.busy_cpus) == ([100.0, 102.0], [0, 0], [1, 2], [1, 2])
    assert beta.busy_cpus == [1] and not beta.available and beta.error == "down"
    assert [d["chosen"] for d in live.decisions] == ["alpha"] and live.decisions[0]["job"] == "alpha/7"
    assert [e.kind for e in live.events] == ["job.submitted", "site.unavailable", "job.completed"]


def traces(dash, site):
    """A site's (pending, running, busy, total) traces in the chart's figure (4 per site, in site order)."""
    k = dash.site_names.index(site)
    return dash.chart.figure["data"][4 * k: 4 * k + 4]


def notes(dash):
    return {a["name"].removeprefix("note:"): a["text"] for a in dash.chart.figure["layout"]["annotations"] if a.get("name", "").startswith("note:")}


def test_dashboard_draws_the_log_and_says_what_is_missing(tmp_path):
    log = EventLog(tmp_path / "lab.db")
    now = [103.0]
    dash = QueueDashboard.live(tmp_path / "lab.db", ["alpha", "beta"], clock=lambda: now[0])
    assert isinstance(dash, LiveSitesDashboard)
    # nothing yet: every panel and table says why it is empty
    assert notes(dash) == {"alpha": "no sample yet:<br>waiting for the continuation service", "beta": "no sample yet:<br>waiting for the continuation service"}
    assert "continuation service" in dash.jobs.table["empty"] and dash.candidates.table["empty"] == "no placement yet"
    assert dash.decisions.table["rows"] == [] and "no placement yet" in dash.decisions.table["empty"]
    assert "not refreshing by itself" in dash.status.value
    chart = dash.chart
    fill(log)
    assert dash.refresh() == 7 and dash.chart is chart
    pending, running, busy, total = traces(dash, "alpha")
    # alpha is live: its last sample (t = 102) still holds, so each step line runs on to now (t = 103), with no marker there
    assert (running["y"], busy["y"], total["y"]) == ([1, 2, 2], [1, 2, 2], [2, 2])
    assert running["x"] == ["1970-01-01 00:01:40.000000", "1970-01-01 00:01:42.000000", "1970-01-01 00:01:43.000000"]  # UTC
    assert total["x"] == [running["x"][0], running["x"][-1]] and running["marker"]["size"] == [6, 6, 0]
    assert traces(dash, "beta")[0]["y"] == [2]  # unavailable: its one sample is not carried on
    assert notes(dash) == {"beta": "unavailable:<br>the site does not answer"}  # alpha is live: no note over its lines
    # what each site showed: a table, one row per site, the chosen one marked
    seen = dash.candidates.table
    assert seen["caption"] == "what each site showed for alpha/7 (earliest_completion)"
    assert [r["cells"][0] for r in seen["rows"]] == ["\u25b6 alpha", "beta"] and [r["group"] for r in seen["rows"]] == ["chosen", "not eligible"]
    assert [r["cells"][5] for r in seen["rows"]] == ["+40 s", ""] and [r["cells"][1] for r in seen["rows"]] == ["yes", "no: not eligible"]
    assert [r["cells"][1] for r in dash.decisions.table["rows"]] == ["alpha/7"]
    assert [r["cells"][1] for r in dash.events.table["rows"]] == ["job.completed", "site.unavailable", "job.submitted"]
    assert "<b>alpha</b>: 0 pending, 2 running, 2/2 CPUs busy" in dash.status.value and "unavailable (down)" in dash.status.value
    assert dash.refresh() == 0
    now[0] = 160.0  # no sample for 58 s (the sites stopped): the last numbers are shown as stale, not as current
    assert dash.refresh() == 0
    assert "<b>alpha</b>: <span class='lab-stale'" in dash.status.value and "no sample for 58 s" in dash.status.value
    assert "last: 0 pending, 2 running, 2/2 CPUs busy at 00:01:42" in dash.status.value
    assert notes(dash)["alpha"] == "stale: no sample for 58 s<br>(site or service stopped)"
    assert traces(dash, "alpha")[1]["y"] == [1, 2]  # stale: the lines end at the last sample


def test_job_rows_follow_the_samples_and_turn_stale(tmp_path):
    log = EventLog(tmp_path / "lab.db")
    now = [130.0]
    dash = LiveSitesDashboard(tmp_path / "lab.db", ["alpha"], clock=lambda: now[0])
    jobs = [{"job_id": "4", "state": "running", "submit_time": 90.0, "start_time": 95.0, "cpus": 2, "time_limit_s": 600},
            {"job_id": "5", "state": "pending", "submit_time": 100.0, "start_time": 695.0, "cpus": 1, "time_limit_s": 60, "reason": "Resources"}]
    for t in (110.0, 120.0):
        log.append("alpha", "site.queue", "alpha", {"pending": 1, "running": 1, "idle_cpus": 0, "total_cpus": 2, "time": t, "jobs": jobs}, at=t)
    dash.refresh()
    rows = dash.jobs.table["rows"]
    columns = [c["key"] for c in dash.jobs.table["columns"]]
    cell = lambda row, key: row["cells"][columns.index(key)]  # noqa: E731
    assert [r["id"] for r in rows] == ["alpha/5", "alpha/4"] and [r["group"] for r in rows] == ["pending", "running"]
    assert cell(rows[0], "waited") == "30 s" and rows[0]["sort"][columns.index("waited")] == 30.0  # counted to now
    assert cell(rows[0], "start") == "in 9.4 min (00:11:35)" and cell(rows[0], "walltime") == "0:01:00"
    assert cell(rows[0], "reason") == "Resources" and cell(rows[1], "procs") == "2" and cell(rows[1], "waited") == "5 s"
    assert not any(r["muted"] for r in rows)
    dash.jobs.sort = {"key": "job", "descending": False}
    dash.jobs.group_filter = "pending"
    now[0] = 200.0  # 80 s without a sample (poll every 10 s): stale
    dash.refresh()
    rows = dash.jobs.table["rows"]
    assert all(r["muted"] for r in rows) and cell(rows[0], "site") == "alpha (stale: no sample for 80 s)"
    assert cell(rows[0], "waited") == "\u2265 20 s"  # as of the last sample, and at least that
    assert dash.jobs.sort == {"key": "job", "descending": False} and [r.id for r in dash.jobs.shown()] == ["alpha/5"]  # kept


def test_stopping_the_refresh_says_so(tmp_path):
    EventLog(tmp_path / "lab.db")
    dash = LiveSitesDashboard(tmp_path / "lab.db", ["alpha"], clock=lambda: 3600.0)
    dash.start(interval_s=0.2)
    try:
        assert "following the event log every 0.2 s" in dash.status.value
    finally:
        dash.stop()
    assert "<b>stopped</b> at 01:00:00 UTC: this view no longer refreshes" in dash.status.value


def test_bad_arguments(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="at least one site"):
        LiveSitesDashboard(tmp_path / "lab.db", [])
    with pytest.raises(ValueError, match=r"site names must be unique, but \['a'\] repeat"):
        LiveSitesDashboard(tmp_path / "lab.db", ["a", "a"])


def test_site_state_follows_the_samples_age(tmp_path):
    log = EventLog(tmp_path / "lab.db")
    live = LiveSites(log)
    assert live.state("alpha", 0.0).state == "no sample"
    for t in (100.0, 105.0, 110.0):
        log.append("alpha", "site.queue", "alpha", {"pending": 0, "running": 0, "idle_cpus": 2, "total_cpus": 2, "time": t}, at=t)
    live.update()
    assert live.state("alpha", 115.0) == SiteState("live", 5.0, 15.0)  # three poll intervals of 5 s
    assert live.state("alpha", 126.0).state == "stale"
    assert live.state("alpha", 126.0, stale_after_s=60).state == "live"
    log.append("alpha", "site.unavailable", "alpha", {"error": "down"}, at=111.0)
    live.update()
    assert live.state("alpha", 112.0).state == "unavailable"


def test_small_counts_get_one_tick_per_integer(tmp_path):
    """2 CPUs on a ",d" axis: plotly's automatic 0.5 steps would label the ticks 0, 1, 1, 2, 2."""
    log = EventLog(tmp_path / "lab.db")
    fill(log)
    dash = LiveSitesDashboard(tmp_path / "lab.db", ["alpha", "beta"], clock=lambda: 103.0)
    layout = dash.chart.figure["layout"]
    assert [layout[a].get("dtick") for a in ("yaxis", "yaxis2", "yaxis3", "yaxis4")] == [1, 1, 1, 1]


def test_an_unchanged_queue_is_not_stale_before_its_heartbeat(tmp_path):
    """The service writes a site's queue on each change and, unchanged, every heartbeat_s (30 s): samples 1 s apart
    then 14 s of silence is a quiet site, not a stopped one (it was shown stale after 10 s)."""
    log = EventLog(tmp_path / "lab.db")
    for t in (100.0, 101.0, 102.0, 103.0):
        log.append("alpha", "site.queue", "alpha", {"pending": int(t) % 2, "running": 1, "idle_cpus": 0, "total_cpus": 1, "time": t,
                                                    "every_s": 1.0, "heartbeat_s": 30.0}, at=t)
    live = LiveSites(log)
    live.update()
    assert live.state("alpha", 117.0) == SiteState("live", 14.0, 33.0)
    assert live.state("alpha", 137.0).state == "stale"


def test_the_service_says_its_heartbeat(tmp_path):
    from lab.hpc.continuation import ContinuationService
    from lab.hpc.schedulers.local import LocalScheduler

    with LocalScheduler("alpha", cpus=1, workdir=tmp_path / "w") as sched:
        service = ContinuationService(tmp_path / "lab.db", {"alpha": sched}, queue_every_s=2.0, heartbeat_s=20.0)
        try:
            service.poll_queues()
        finally:
            service.close()
    live = LiveSites(tmp_path / "lab.db")
    live.update()
    s = live.sites["alpha"]
    assert (s.every_s, s.heartbeat_s) == (2.0, 20.0) and live.state("alpha", s.time[-1] + 25).state == "live"
