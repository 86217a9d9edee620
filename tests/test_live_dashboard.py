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


def test_dashboard_refreshes_in_place(tmp_path):
    log = EventLog(tmp_path / "lab.db")
    now = [103.0]
    dash = QueueDashboard.live(tmp_path / "lab.db", ["alpha", "beta"], clock=lambda: now[0])
    assert isinstance(dash, LiveSitesDashboard) and "no placement yet" in dash.decisions.value
    figure = dash.figure
    fill(log)
    assert dash.refresh() == 7 and dash.figure is figure
    assert list(dash.figure.data[1].y) == [1, 2]  # alpha running
    assert list(dash.figure.data[3].y) == [2]  # beta pending
    assert "alpha/7" in dash.decisions.value and "not eligible" in dash.decisions.value
    # what each site showed: a table, one row per site, the chosen one marked
    assert "<b>what each site showed</b> for alpha/7 (earliest_completion)" in dash.decisions.value
    seen = dash._candidates_table(dash.live.decisions[-1])
    assert list(seen["site"]) == ["&#9654; alpha", "beta"] and list(seen["pending"].fillna(-1)) == [3, -1]
    assert list(seen["start in (s)"].fillna("")) == ["+40", ""] and list(seen["eligible"]) == ["yes", "no: not eligible"]
    assert "<td>&#9654; alpha</td>" in dash.decisions.value and "<th>done in (s)</th>" in dash.decisions.value
    assert "job.completed" in dash.events.value and "unavailable" in dash.status.value
    assert "<b>alpha</b>: 0 pending, 2 running, 2/2 CPUs busy" in dash.status.value
    assert dash.refresh() == 0
    now[0] = 160.0  # no sample for 58 s (the sites stopped): the last numbers are shown as stale, not as current
    assert dash.refresh() == 0
    assert "<b>alpha</b>: <span class='lab-stale'" in dash.status.value and "no sample for 58 s" in dash.status.value
    assert "last: 0 pending, 2 running, 2/2 CPUs busy at 00:01:42" in dash.status.value


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
