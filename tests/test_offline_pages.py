"""Pages stay on the machine: tests/browser.py's NetworkWatch (on a stand-in page, no browser) and the project's
Voila template (jupyter-data/voila/templates/research-lab), whose page links nothing off the machine.

The browser tests (tests/test_browser_voila.py, tests/test_browser_lab.py) use NetworkWatch on the real pages.
"""

from __future__ import annotations

import re
import urllib.request

import pytest

from tests.browser import (
    VOILA_DATA_DIR,
    VOILA_TEMPLATE,
    NetworkWatch,
    is_loopback,
    voila_known_warnings,
    voila_notebook,
    voila_server,
)


class _Page:
    """What NetworkWatch needs of a Playwright page: ``on(event, handler)`` (and a screenshot that fails)."""

    def __init__(self):
        self.handlers = {}

    def on(self, event, handler):
        self.handlers[event] = handler

    def emit(self, event, **fields):
        self.handlers[event](type("Event", (), fields)())

    def screenshot(self, **_):
        raise RuntimeError("no browser here")


def test_is_loopback():
    assert all(map(is_loopback, ["http://127.0.0.1:8866/voila/static/voila.js", "ws://localhost:1/api/kernels/x/channels",
                                 "http://[::1]:8888/lab", "data:;base64,=", "blob:http://127.0.0.1:1/abc", "about:blank"]))
    assert not any(map(is_loopback, ["https://cdn.jsdelivr.net/npm/@fortawesome/fontawesome-free@^5/css/all.min.css",
                                     "http://127.0.0.2/x", "http://localhost.example.com/", "wss://example.org/"]))


def test_network_watch_fails_on_a_request_off_the_machine_and_on_console_errors():
    page = _Page()
    net = NetworkWatch(page, "stand-in")
    page.emit("request", method="GET", url="http://127.0.0.1:8866/voila/static/voila.js", resource_type="script")
    net.check()  # loopback only: passes
    page.emit("request", method="GET", url="https://cdn.jsdelivr.net/npm/x/all.min.css", resource_type="stylesheet")
    page.emit("console", type="error", text="Failed to load resource: net::ERR_NAME_NOT_RESOLVED", location={"url": "https://cdn.jsdelivr.net/npm/x/all.min.css"})
    page.emit("websocket", url="wss://example.org/socket")
    with pytest.raises(pytest.fail.Exception) as failed:
        net.check()
    message = str(failed.value)
    assert "request off the machine: GET https://cdn.jsdelivr.net/npm/x/all.min.css (stylesheet)" in message
    assert "request off the machine: websocket wss://example.org/socket" in message
    assert "console error: Failed to load resource: net::ERR_NAME_NOT_RESOLVED (at https://cdn.jsdelivr.net" in message
    assert net.requests == ["GET http://127.0.0.1:8866/voila/static/voila.js", "GET https://cdn.jsdelivr.net/npm/x/all.min.css"]


def test_network_watch_allows_only_the_version_warnings_voila_explains():
    known = sorted(voila_known_warnings())
    assert len(known) == 13, "the installed Voila / jupyterlab_widgets differ from the ones the known warnings were read from: re-check them"
    unknown = "Unsatisfied version 6.0.12 of shared singleton module @jupyter-widgets/base (required ^7.0.0)"
    for voila in (True, False):
        page = _Page()
        net = NetworkWatch(page, "stand-in", voila=voila, allow=(r"^expected: ",))
        for text in known:
            page.emit("console", type="warning", text=text)
        page.emit("console", type="warning", text="only a warning")  # not a shared-module one: never fails
        page.emit("console", type="error", text="expected: this test's own error", location={})
        problems = net.problems()
        assert len(problems) == (0 if voila else 13), problems  # a JupyterLab page has none of Voila's excuses
        page.emit("console", type="warning", text=unknown)
        assert net.problems()[-1] == f"shared-module version warning: {unknown}"


@pytest.mark.slow
def test_the_voila_template_links_nothing_off_the_machine(tmp_path):
    """The page voila_server (as `make voila`) serves: Voila's lab page less its two Font Awesome links to
    cdn.jsdelivr.net and nbconvert's mermaid loader from cdnjs; its own stylesheets come from 127.0.0.1."""
    assert (VOILA_DATA_DIR / "voila" / "templates" / VOILA_TEMPLATE / "index.html.j2").is_file()
    notebook = voila_notebook("print('hello from the template test')", tmp_path / "hello.ipynb")
    with voila_server(notebook, tmp_path / "voila.log") as port:
        html = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=120).read().decode()
    assert "hello from the template test" in html
    links = re.findall(r"<link\b[^>]*>", html)
    assert [link for link in links if re.search(r'href="(https?:)?//', link)] == [], links
    assert "cdn.jsdelivr.net" not in html and "cdnjs.cloudflare.com" not in html
    assert any(f'href="/voila/templates/{VOILA_TEMPLATE}/static/index.css' in link for link in links), links
