"""widgets.TrainingMonitor over runs written by other processes: overlay, resume, a dead rank, a restart."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from lab.training.monitor import RunRecorder
from widgets import TrainingMonitor

WRITER = textwrap.dedent(
    """
    import sys, time
    from lab.training.monitor import RunRecorder
    path, run, world, steps, die_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    recs = [RunRecorder(path, run, r) for r in range(world)]
    recs[0].run_started(config={"optimizer": "adams", "comm": run, "steps": steps}, world_size=world, n_params=1000)
    for r in recs:
        r.status("started", 0)
    for s in range(1, steps + 1):
        recs[0].step(s, loss=4.0 / s, lr=1e-3, step_s=0.2, compute_s=0.15, comm_s=0.05, bytes_sent=4000 if run == "fp32" else 1004, grad_rel_err=None if run == "fp32" else 0.03)
        if s % 5 == 0:
            recs[0].eval(s, 4.5 / s)
        for r in recs:
            r.status("heartbeat", s)
        if s == die_at:
            recs[0].status("failed", s, error="RuntimeError: Connection reset by peer")
            sys.exit(0)  # rank 1 goes silent: its last word is a heartbeat
    for r in recs:
        r.status("finished", steps, param_sha256="abc")
    """
)


def write_run(path, run, *, world=2, steps=10, die_at=-1):
    subprocess.run([sys.executable, "-c", WRITER, str(path), run, str(world), str(steps), str(die_at)], check=True, timeout=120)


def trace(mon: TrainingMonitor, run: str, column: str, smoothed: bool = False):
    return mon.trace(run, column, smoothed=smoothed)


def waiting(mon: TrainingMonitor) -> bool:
    return any(a.get("name") == "waiting" for a in mon.figure["layout"]["annotations"])


def visible(mon: TrainingMonitor, run: str) -> bool:
    return mon.figure["data"][mon._trace_index[(run, "loss")]]["visible"]


def test_overlays_runs_from_other_processes_and_follows_new_ones(tmp_path):
    path = tmp_path / "events.sqlite"
    mon = TrainingMonitor(path, heartbeat_timeout_s=60)
    assert "no run" in mon.table.value
    assert "waiting for the first step" in mon.status.value and waiting(mon)
    write_run(path, "fp32")
    assert mon.refresh() > 0
    assert not waiting(mon) and "newest step 10" in mon.status.value
    x, y = trace(mon, "fp32", "loss")
    assert x == list(range(1, 11)) and y == pytest.approx([4.0 / s for s in range(1, 11)])
    assert trace(mon, "fp32", "val_loss") == ([5, 10], pytest.approx([0.9, 0.45]))
    assert trace(mon, "fp32", "bytes_sent")[1] == [4000.0] * 10
    assert trace(mon, "fp32", "grad_rel_err") == ([], [])  # fp32 reports no codec error
    assert [a["text"] for a in mon.figure["layout"]["annotations"]].count("no values logged for the runs shown") == 1
    write_run(path, "fp8", steps=6)  # a second run appears while the monitor is open
    mon.refresh()
    assert mon.selected == ["fp32", "fp8"] and mon.picker.options == ("fp32", "fp8")
    assert trace(mon, "fp8", "grad_rel_err")[1] == pytest.approx([0.03] * 6)
    assert "finished" in mon.table.value and "6 / 6" in mon.table.value
    mon.selected = ["fp8"]  # the two-way trait hides the other run
    assert mon.picker.value == ("fp8",)
    assert not visible(mon, "fp32") and visible(mon, "fp8")


def test_dead_rank_failed_run_and_a_kernel_restart(tmp_path):
    path = tmp_path / "events.sqlite"
    write_run(path, "fp8", steps=20, die_at=7)
    mon = TrainingMonitor(path, heartbeat_timeout_s=0.5)
    time.sleep(0.6)
    mon.refresh()
    table = mon.table.value
    assert "failed" in table and "Connection reset by peer" in table and "r1 " in table and "dead" in table
    assert trace(mon, "fp8", "loss")[0] == list(range(1, 8))
    # the run is resumed (from a checkpoint at step 5): the rewritten steps replace the old ones
    rec = RunRecorder(path, "fp8", 0)
    for s in range(6, 9):
        rec.step(s, loss=1.0, lr=1e-3, step_s=0.2, compute_s=0.15, comm_s=0.05, bytes_sent=1004, grad_rel_err=0.03)
    mon.refresh()
    x, y = trace(mon, "fp8", "loss")
    assert x == list(range(1, 9)) and y[5:] == [1.0, 1.0, 1.0]
    # "kernel restart": a new monitor on the same file shows the same thing
    again = TrainingMonitor(path, heartbeat_timeout_s=0.5)
    assert trace(again, "fp8", "loss") == (x, y)


def test_waiting_until_a_started_run_logs_its_first_step(tmp_path):
    path = tmp_path / "events.sqlite"
    rec = RunRecorder(path, "fp8", 0)
    rec.run_started(config={"optimizer": "adams", "comm": "fp8", "steps": 5}, world_size=1, n_params=10)
    rec.status("started", 0)
    mon = TrainingMonitor(path)
    assert "waiting for the first step" in mon.status.value and "1 run(s) started" in mon.status.value and waiting(mon)
    assert trace(mon, "fp8", "loss") == ([], [])
    rec.step(1, loss=3.0, lr=1e-3, step_s=0.2, compute_s=0.15, comm_s=0.05, bytes_sent=1004, grad_rel_err=0.03)
    mon.refresh()
    assert trace(mon, "fp8", "loss") == ([1.0], [3.0]) and not waiting(mon)
    # four titled panels, every axis titled with its unit
    layout = mon.figure["layout"]
    titles = [a["text"] for a in layout["annotations"]]
    assert len(titles) == 4 and any("loss" in t for t in titles)
    assert [layout[f"yaxis{k}"]["title"]["text"] for k in ("", "2", "3", "4")] == [
        "loss (nats/token)", "time per step (s)", "bytes per step", "relative L2 error"]


def test_series_by_step_or_time_thinned_to_max_points(tmp_path):
    from lab.training.monitor import RunMonitor

    path = tmp_path / "events.sqlite"
    write_run(path, "fp32", steps=10)
    mon = RunMonitor(path)
    s = mon.series("fp32", ["loss", "val_loss"])
    assert s["loss"][0] == [float(k) for k in range(1, 11)] and s["val_loss"] == ([5.0, 10.0], pytest.approx([0.9, 0.45]))
    t, _ = mon.series("fp32", ["loss"], x="time")["loss"]
    assert t == sorted(t) and 0 <= t[0] < 60
    x, y = mon.series("fp32", ["loss"], max_points=4)["loss"]
    assert len(x) <= 4 and x[-1] == 10.0 and y[-1] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="x must be"):
        mon.series("fp32", ["loss"], x="wall")
    with pytest.raises(ValueError, match="unknown metric"):
        mon.series("fp32", ["nope"])


def test_the_chart_module_stays_small_and_plotly_comes_from_one_library_model():
    """anywidget gives a model's ESM 2 s to load; past that, the model drops every later update
    (why plotly's 5 MB FigureWidget stayed empty under load). The chart's own module stays tiny."""

    from widgets.live_chart import ESM, LiveChart, plotly_library

    assert ESM.stat().st_size < 20_000
    a, b = LiveChart(), LiveChart()
    assert a._library is b._library is plotly_library()
    assert "export default module.exports" in a._library.source and len(a._library.source) > 1_000_000


def test_x_by_step_or_time_log_toggle_smoothing_and_shared_colours(tmp_path):
    from lab.training.monitor import ema_smooth

    path = tmp_path / "events.sqlite"
    write_run(path, "fp32")
    write_run(path, "fp8", steps=6)
    mon = TrainingMonitor(path, heartbeat_timeout_s=60)
    raw = trace(mon, "fp32", "loss")
    smooth = trace(mon, "fp32", "loss", smoothed=True)  # smoothing 0.6 by default, as TensorBoard
    assert smooth[0] == raw[0] and smooth[1] == pytest.approx(ema_smooth(raw[1], 0.6)) and smooth[1] != raw[1]
    assert trace(mon, "fp32", "val_loss", smoothed=True) == ([], [])  # sparse validation points are drawn as they are
    mon.smoothing_slider.value = 0.0  # the slider sets the trait and redraws
    assert mon.smoothing == 0.0 and trace(mon, "fp32", "loss", smoothed=True) == ([], []) and trace(mon, "fp32", "loss") == raw
    layout = mon.figure["layout"]
    assert (layout["yaxis"]["type"], layout["yaxis3"]["type"]) == ("linear", "log")
    mon.y_scale = "log"
    assert mon.scale_picker.value == "log" and mon.figure["layout"]["yaxis"]["type"] == "log"
    mon.scale_picker.value = "linear"
    assert mon.figure["layout"]["yaxis3"]["type"] == "linear"
    mon.x = "time"
    assert mon.x_picker.value == "time"
    xs, ys = trace(mon, "fp32", "loss")
    assert ys == raw[1] and xs == sorted(xs) and xs[0] >= 0 and xs != raw[0]
    assert mon.figure["layout"]["xaxis"]["title"]["text"] == "wall time since the run started (s)"
    # one colour per run, in the chart and the table
    for run in ("fp32", "fp8"):
        c = mon.colour(run)
        assert mon.figure["data"][mon._trace_index[(run, "loss")]]["line"]["color"] == c
        assert f"color:{c}'>{run}</b>" in mon.table.value
    assert mon.colour("fp32") != mon.colour("fp8")


def test_ema_smooth_is_tensorboards_debiased_average_within_the_values_range():
    from lab.training.monitor import ema_smooth

    assert ema_smooth([1.0, 2.0], 0.0) == [1.0, 2.0]
    assert ema_smooth([1.0, 2.0, 3.0], 0.6) == pytest.approx([1.0, (0.24 + 0.8) / 0.64, ((0.24 + 0.8) * 0.6 + 1.2) / (1 - 0.216)])
    assert set(ema_smooth([0.03] * 50, 0.6)) == {0.03}  # a constant stays constant, to the last digit
    out = ema_smooth([1.0, float("nan"), 3.0], 0.5)
    assert out[0] == 1.0 and out[1] != out[1] and out[2] == pytest.approx((0.5 * 0.5 + 1.5) / 0.75)
    with pytest.raises(ValueError, match="weight"):
        ema_smooth([1.0], 1.0)


def test_export_is_the_shown_points_by_the_shown_x_with_raw_and_smoothed_values(tmp_path):
    import pandas as pd

    path = tmp_path / "events.sqlite"
    write_run(path, "fp32")
    write_run(path, "fp8", steps=6)
    mon = TrainingMonitor(path, heartbeat_timeout_s=60)
    out = mon.to_csv(tmp_path / "shown.csv")
    table = pd.read_csv(out)
    assert list(table.columns) == ["run_id", "metric", "unit", "step", "value", "smoothed", "smoothing"]
    assert out.read_text() == mon.export_button.text  # the browser's download is the same file
    assert mon.export_button.label == f"export CSV ({len(table):,} rows)" and mon.export_button.filename == "training-runs-step.csv"
    drawn = 0
    for (run, metric), rows in table.groupby(["run_id", "metric"], sort=False):
        x, y = trace(mon, run, metric)
        assert rows["step"].tolist() == x and rows["value"].tolist() == y, (run, metric)
        sx, sy = trace(mon, run, metric, smoothed=True)
        if metric == "val_loss":  # drawn as logged: no smoothed column
            assert sx == [] and rows["smoothed"].isna().all()
        else:
            assert rows["smoothed"].tolist() == sy, (run, metric)
        drawn += 1
    # every drawn curve with points is in the table, and nothing else: fp32 has no codec error
    curves = {(r, c) for (r, c) in mon._trace_index if not c.endswith(":smoothed") and trace(mon, r, c)[0]}
    assert drawn == len(curves) and set(map(tuple, table[["run_id", "metric"]].drop_duplicates().to_numpy())) == curves
    assert set(table["unit"][table["metric"] == "bytes_sent"]) == {"bytes"} and set(table["smoothing"]) == {0.6}
    # what is shown changes what is exported: one run, by wall time, no smoothing
    mon.selected, mon.x, mon.smoothing = ["fp8"], "time", 0.0
    table = pd.read_csv(mon.to_csv(tmp_path / "shown.csv"))
    assert set(table["run_id"]) == {"fp8"} and "wall_time_s" in table.columns and "step" not in table.columns
    assert table[table["metric"] == "loss"]["wall_time_s"].tolist() == trace(mon, "fp8", "loss")[0]
    assert table["smoothed"].isna().all() and mon.export_button.filename == "training-runs-time.csv"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        mon.to_csv(tmp_path / "nowhere" / "shown.csv")


def test_series_frame_refuses_bad_input_naming_it():
    from lab.training.monitor import series_frame

    ok = {"fp8": {"loss": ([1, 2], [3.0, 2.0])}}
    assert series_frame(ok)["step"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="'fp8' has unknown metric 'los'"):
        series_frame({"fp8": {"los": ([1], [3.0])}})
    with pytest.raises(ValueError, match="'fp8' metric 'loss' has 2 x values but 1 y values"):
        series_frame({"fp8": {"loss": ([1, 2], [3.0])}})
    with pytest.raises(ValueError, match="x must be"):
        series_frame(ok, x="wall")
    with pytest.raises(ValueError, match="smoothing"):
        series_frame(ok, smoothing=1.0)
    empty = series_frame({})
    assert empty.empty and list(empty.columns) == ["run_id", "metric", "unit", "step", "value", "smoothed", "smoothing"]


def test_log_axes_get_ticks_no_closer_than_a_label(tmp_path):
    """Plotly labels every digit of a decade on a log axis (1, 2, ..., 9, 10, 20, ...): in a 170 px panel
    the upper ones overlap. The monitor gives each log panel ticks at least MIN_TICK_GAP_PX apart."""
    import math

    from widgets.training_monitor import MIN_TICK_GAP_PX, _panel_pixels, log_ticks

    def min_gap(ticks, lo, hi, pixels):
        pad = 0.05 * (math.log10(hi) - math.log10(lo))
        per_decade = pixels / (math.log10(hi) - math.log10(lo) + 2 * pad)
        logs = [math.log10(v) for v in ticks]
        return min(b - a for a, b in zip(logs, logs[1:])) * per_decade

    px = _panel_pixels(1)
    for lo, hi in [(46_000, 460_000), (1.4, 4.5), (0.01, 0.3), (3.2, 4.5), (1e2, 1e9), (1004, 4000)]:
        ticks = log_ticks(lo, hi, px)
        assert ticks and len(ticks) >= 2 and min_gap(ticks, lo, hi, px) >= MIN_TICK_GAP_PX, (lo, hi, ticks)
        assert all(lo * 0.8 <= v <= hi * 1.25 for v in ticks), (lo, hi, ticks)
    assert log_ticks(46_000, 460_000, px) == [5e4, 1e5, 2e5, 3e5, 5e5]  # not 50k, 60k, 70k, 80k, 90k, 100k, 200k, ...
    assert log_ticks(2.0, 2.0, px) is None and log_ticks(0.0, 1.0, px) is None  # flat or not positive: plotly's own

    path = tmp_path / "events.sqlite"
    write_run(path, "fp8", steps=40)  # loss 4/s: 0.1 .. 4, more than a decade
    mon = TrainingMonitor(path, heartbeat_timeout_s=60, y_scale="log", smoothing=0.0)
    loss_axis = mon.figure["layout"]["yaxis"]
    assert loss_axis["type"] == "log" and loss_axis["tickmode"] == "array"
    ys = trace(mon, "fp8", "loss")[1] + trace(mon, "fp8", "val_loss")[1]
    assert min_gap(loss_axis["tickvals"], min(ys), max(ys), px) >= MIN_TICK_GAP_PX
    assert loss_axis["ticktext"] == [f"{v:g}" for v in loss_axis["tickvals"]]
    bytes_axis = mon.figure["layout"]["yaxis3"]  # constant bytes: half a decade either side, ticks on it
    assert bytes_axis["type"] == "log" and bytes_axis["range"] == pytest.approx([math.log10(1004) - 0.5, math.log10(1004) + 0.5])
    assert len(bytes_axis["tickvals"]) >= 2 and min_gap(bytes_axis["tickvals"], 1004 / 10**0.5, 1004 * 10**0.5, px) >= MIN_TICK_GAP_PX
    mon.y_scale = "linear"
    assert "tickvals" not in mon.figure["layout"]["yaxis"] and "range" not in mon.figure["layout"]["yaxis3"]


def test_download_button_keeps_clear_of_ipywidgets_tooltip():
    """ipywidgets' DOMWidgetView.updateTooltip reads a ``description`` trait whenever ``tooltip`` is set: a
    DownloadButton with its own ``tooltip`` failed to render ("Cannot read properties of undefined (reading
    'length')"). Its hover text is ``hint``; the text it saves is state, so a click needs no kernel."""
    from widgets.download import DownloadButton

    b = DownloadButton(text="a,b\n1,2\n", filename="x.csv", label="export", hint="what it saves")
    assert "tooltip" not in DownloadButton.class_own_traits() and b.tooltip is None
    state = b.get_state()
    assert (state["text"], state["filename"], state["mime"], state["hint"]) == ("a,b\n1,2\n", "x.csv", "text/csv", "what it saves")
    assert "change:hint" in b._esm.read_text() if hasattr(b._esm, "read_text") else "change:hint" in b._esm
