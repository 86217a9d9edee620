"""Helpers for the browser tests: start a `make` server target on a free port, launch Debian's Chromium,
and wait for the page while watching it for notebook errors (:class:`PageWatch`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("LAB_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]


def chromium() -> str:
    """Path of Debian's Chromium; fails the test (never skips) with how to install it."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.fail(
            "Chromium is not installed, so the browser test cannot run. Install Debian's package: "
            "`sudo apt-get install -y --no-install-recommends chromium` (make test does this itself when run as root)."
        )
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_env(folder: Path, **extra: str) -> dict[str, str]:
    """This process's environment with every folder a Jupyter server, JupyterLab or Voila writes to
    (config, data, runtime, lab settings and workspaces, temp files) moved under ``folder``, so a test
    run leaves nothing in the repository, ``~/.jupyter`` or ``~/.local/share/jupyter``."""
    dirs = {
        "JUPYTER_CONFIG_DIR": "config",
        "JUPYTER_DATA_DIR": "data",
        "JUPYTER_RUNTIME_DIR": "runtime",
        "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces",
        "TMPDIR": "tmp",
    }
    env = dict(os.environ)
    for var, sub in dirs.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(folder / sub)
    env.update(extra)
    return env


@contextlib.contextmanager
def serve(
    cmd: list[str],
    port: int,
    log_path: Path,
    *,
    cwd: Path = ROOT,
    name: str = "server",
    timeout_s: float = 120,
    env: dict[str, str] | None = None,
):
    """Run ``cmd`` (which listens on ``port``) in its own process group until the port accepts
    connections; yield the port; stop the group afterwards (SIGTERM, then SIGKILL after 30 s).
    The server's environment is ``env``, by default :func:`jupyter_env` of a ``jupyter`` folder beside
    ``log_path``. If the server exits or never listens, the test fails with the tail of its log."""
    if env is None:
        env = jupyter_env(log_path.parent / "jupyter")
    with log_path.open("w+") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail(f"`{name}` exited with {proc.returncode}:\n{log.read()[-3000:]}")
                try:  # up once it accepts connections (pages render later)
                    with socket.create_connection(("127.0.0.1", port), timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        log.seek(0)
                        pytest.fail(f"`{name}` did not listen on port {port} within {timeout_s} s:\n{log.read()[-3000:]}")
                    time.sleep(0.5)
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def voila_notebook(code: str, path: Path) -> Path:
    """Write a one-cell notebook (``code``, python3 kernel) to ``path`` for :func:`voila_server`."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@contextlib.contextmanager
def voila_server(notebook: Path, log_path: Path, timeout_s: float = 120):
    """``voila NOTEBOOK`` from its folder on a free port until it accepts connections; yields the port.
    Tracebacks are shown, so that :class:`PageWatch` can fail with the notebook's own error. It renders with
    the project's Voila template, as `make voila` does (:data:`VOILA_TEMPLATE`, :func:`voila_env`, below)."""
    import sys

    voila = Path(sys.executable).with_name("voila")
    port = free_port()
    cmd = [str(voila), "--no-browser", "--Voila.ip=127.0.0.1", f"--port={port}", "--show_tracebacks=True",
           f"--template={VOILA_TEMPLATE}", notebook.name]
    env = voila_env(jupyter_env(log_path.parent / "jupyter"))
    with serve(cmd, port, log_path, cwd=notebook.parent, name="voila", timeout_s=timeout_s, env=env) as p:
        yield p


@contextlib.contextmanager
def make_server(
    target: str, port_var: str, log_path: Path, timeout_s: float = 120, env: dict[str, str] | None = None, **make_vars: str
):
    """``make -s TARGET PORT_VAR=<free port> ...`` through :func:`serve` (``env`` as there); yields the port."""
    port = free_port()
    args = [f"{port_var}={port}", *(f"{k}={v}" for k, v in make_vars.items())]
    with serve(["make", "-s", target, *args], port, log_path, name=f"make {target}", timeout_s=timeout_s, env=env) as p:
        yield p


# --- waiting on a page while watching it for notebook errors -------------------------------------
#
# JupyterLab 4.6 and Voila 0.5 (lab template) render an error output exactly like a stream to stderr
# (a warning): `.jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']` around a <pre>.
# JupyterLab's OutputModel turns an `error` output into {application/vnd.jupyter.error, .../stderr} and
# no renderer claims the first; nbconvert's lab template (which Voila renders with) writes the same div
# for `error` as for `stream_stderr`. So the page is read for outputs whose text is a traceback, and in
# JupyterLab the kernel's own iopub `error` messages are read from its websocket as well.

STDERR_OUTPUTS = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
# A traceback, an exception line ("DataNotFoundError: ..." / "SyntaxError: ..."), or Voila's message for an
# error whose traceback it hides. Warnings ("/path.py:3: UserWarning: ...") match none of these.
TRACEBACK_RE = r"Traceback \(most recent call last\)|^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: |:?$)|^There was an error when executing cell"
ERROR_OUTPUTS_JS = (
    f"() => Array.from(document.querySelectorAll({STDERR_OUTPUTS!r})).map(el => el.innerText)"
    f".filter(t => /{TRACEBACK_RE}/m.test(t))"
)
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def kernel_message(payload: str | bytes) -> dict | None:
    """A kernel websocket frame as ``{"channel", "msg_type", "content"}``: jupyter-server 2's binary
    ``v1.kernel.websocket.jupyter.org`` framing (count, offsets, then channel, header, parent header,
    metadata, content, buffers) or the legacy JSON text framing. None for anything else."""
    try:
        if isinstance(payload, bytes):
            n = int.from_bytes(payload[:8], "little")
            offsets = [int.from_bytes(payload[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(n)]
            parts = [payload[offsets[i] : offsets[i + 1]] for i in range(n - 1)]
            channel, header, content = parts[0].decode(), json.loads(parts[1]), json.loads(parts[4])
        else:
            msg = json.loads(payload)
            channel, header, content = msg.get("channel"), msg["header"], msg["content"]
        return {"channel": channel, "msg_type": header["msg_type"], "content": content}
    except (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        return None


class PageWatch:
    """Watches a Playwright page that shows a notebook (JupyterLab or Voila) while a test waits on it.

    Make one right after ``browser.new_page()`` (it listens to the page's kernel websockets from then on),
    then wait with :meth:`wait_for` instead of ``page.wait_for_selector`` / ``wait_for_function`` /
    ``expect``: it fails the test at once, with the notebook's error text, when an error output appears
    on the page or the kernel reports an error, and on a timeout it says what it waited for. Either way
    it saves a screenshot ``<name>-failure.png`` under :data:`ARTIFACTS` first.
    """

    def __init__(self, page, name: str):
        self.page = page
        self.name = name
        self.kernel_errors: list[str] = []
        self.page_errors: list[str] = []  # uncaught JavaScript exceptions; tests assert on them at the end
        page.on("websocket", self._on_websocket)
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))

    def _on_websocket(self, ws) -> None:
        if "/api/kernels/" in ws.url and "/channels" in ws.url:
            ws.on("framereceived", self._on_frame)

    def _on_frame(self, payload) -> None:
        msg = kernel_message(payload)
        if msg and msg["channel"] == "iopub" and msg["msg_type"] == "error":
            c = msg["content"]
            traceback = ANSI_RE.sub("", "\n".join(c.get("traceback") or []))
            self.kernel_errors.append(f"{c.get('ename')}: {c.get('evalue')}\n{traceback}".strip())

    def errors(self) -> list[str]:
        """The kernel's error messages so far, then the page's error outputs (each a traceback's text)."""
        try:
            outputs = self.page.evaluate(ERROR_OUTPUTS_JS)
        except Exception:  # the page is navigating: nothing to read yet
            outputs = []
        return [*self.kernel_errors, *outputs]

    def screenshot(self, show_error: bool = False) -> Path | str:
        """``<name>-failure.png`` under :data:`ARTIFACTS`; with ``show_error``, once Voila's spinner
        (which covers the outputs for a second or two) is gone and the last error output is in view."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.name}-failure.png"
        try:
            if show_error:
                with contextlib.suppress(Exception):
                    self.page.wait_for_function(
                        "() => { const el = document.getElementById('loading'); return !el || el.style.display === 'none'; }",
                        timeout=5_000,
                    )
                with contextlib.suppress(Exception):
                    self.page.locator(STDERR_OUTPUTS).last.scroll_into_view_if_needed(timeout=2_000)
            self.page.screenshot(path=str(path), full_page=True)
        except Exception as exc:  # noqa: BLE001 - a failure must still say why
            return f"(none: {exc})"
        return path

    def fail(self, message: str, show_error: bool = False) -> None:
        pytest.fail(f"{message}\nscreenshot: {self.screenshot(show_error)}", pytrace=False)

    def check(self, what: str = "the page") -> None:
        """Fail now if the notebook has raised so far."""
        errors = self.errors()
        if errors:
            text = "\n---\n".join(e[-3000:] for e in errors)
            self.fail(f"the notebook raised while waiting for {what}:\n{text}", show_error=True)

    def wait_for(self, condition, *, what: str | None = None, timeout_s: float = 60, arg=None, poll_s: float = 0.25,
                 state: str | None = None):
        """Wait until ``condition`` holds, checking for notebook errors between polls.

        ``condition``: a JavaScript function (source text, called with ``arg``) that returns a truthy value
        when done, or a Playwright locator or CSS selector (done when its first match is visible). Returns
        the function's value (or True). A function that throws counts as "not yet" (an element it reads may
        not exist yet); the last such exception is in the timeout message, and so is what ``state`` (a
        JavaScript function, called with ``arg``) returns then: what the page showed when the wait gave up.
        """
        what = what or (condition if isinstance(condition, str) else str(condition))
        if isinstance(condition, str) and not re.match(r"\s*(\(|async\b|function\b|\w+\s*=>)", condition):
            condition = self.page.locator(condition)
        deadline = time.monotonic() + timeout_s
        last_exc = None
        while True:
            self.check(what)
            try:
                if isinstance(condition, str):
                    value = self.page.evaluate(condition, arg)
                else:
                    value = condition.first.is_visible()
                if value:
                    return value
            except Exception as exc:  # noqa: BLE001 - Playwright's Error, a JS exception, a navigation
                last_exc = exc
            if time.monotonic() > deadline:
                self.check(what)
                note = f" (last attempt raised: {str(last_exc).strip()[:500]})" if last_exc else ""
                if state is not None:
                    try:
                        note += f"\nthe page then showed: {json.dumps(self.page.evaluate(state, arg))[:3000]}"
                    except Exception as exc:  # noqa: BLE001 - the page may be gone
                        note += f"\n(its state could not be read: {str(exc).strip()[:300]})"
                self.fail(f"timed out after {timeout_s:g} s waiting for {what}{note}")
            self.page.wait_for_timeout(poll_s * 1000)  # lets Playwright deliver websocket events


# --- nothing leaves the machine: every request a page makes, and its console -----------------------
#
# A dashboard runs on an HPC login or compute node, offline: every request must go to the lab's own server
# on 127.0.0.1. Voila 0.5's lab template links Font Awesome 5 from cdn.jsdelivr.net; the project's template
# (jupyter-data/voila/templates/research-lab, found through JUPYTER_PATH) leaves those links out (Voila's
# bundle and @jupyter-widgets/controls already inline Font Awesome 5.15.4 and its fonts).

from urllib.parse import urlsplit  # noqa: E402 - this section's own import

VOILA_TEMPLATE = "research-lab"
VOILA_DATA_DIR = ROOT / "jupyter-data"  # holds voila/templates/research-lab
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
LOCAL_SCHEMES = frozenset({"data", "blob", "about", "javascript"})  # never leave the browser


def voila_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`VOILA_DATA_DIR` first on ``JUPYTER_PATH``, where Voila finds :data:`VOILA_TEMPLATE`
    (what `make voila` sets too)."""
    rest = env.get("JUPYTER_PATH")
    return {**env, "JUPYTER_PATH": os.pathsep.join([str(VOILA_DATA_DIR), *([rest] if rest else [])])}


def is_loopback(url: str) -> bool:
    """Whether a request to ``url`` stays on this machine: a data:/blob:/about: URL, or a host in :data:`LOOPBACK_HOSTS`."""
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or (parts.hostname or "") in LOOPBACK_HOSTS


# Webpack module federation's warnings when an extension's bundle was built against other versions of a shared
# package than the page provides ("Unsatisfied version 4.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton
# module @jupyterlab/rendermime (required ^4.6.2)").
SHARED_MODULE_WARNING_RE = re.compile(r"^(Unsatisfied version|No satisfying version)")

# Voila 0.5.13's page (the latest Voila) provides JupyterLab 4.2.5's packages (its core bundle, voila.js, is built
# against them), while the widget extensions it loads were built against newer ones: jupyterlab_widgets 3.0.17's
# @jupyter-widgets/jupyterlab-manager (which ipywidgets 8.1.9 requires, ~=3.0.17) against JupyterLab 4.6.2, and
# Voila's own @voila-dashboards/widgets-manager8 0.5.13 against 4.5.10. jupyter-builder writes the building
# JupyterLab's version as the required one (package.json asks ^4.0.0), so every shared @jupyterlab package they
# use warns; the 4.2.5 singletons are used and the widgets work. No released Voila is built on JupyterLab >= 4.5,
# and Voila's extensions cannot be left out (Voila skips jupyterlab-manager's main plugin but needs its base,
# controls and output plugins: without the extension no widget renders), so these 13 cannot be removed here;
# they are allowed for exactly these versions and any other shared-module warning fails (see NetworkWatch).
VOILA_KNOWN_SHARED_MODULE_WARNINGS = {
    ("0.5.13", "3.0.17"): frozenset(
        [
            *(f"Unsatisfied version 4.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module @jupyterlab/{m} (required ^4.6.2)"
              for m in ("console", "logconsole", "mainmenu", "notebook", "rendermime", "settingregistry", "translation")),
            "Unsatisfied version 7.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module @jupyterlab/services (required ^7.6.2)",
            "No satisfying version (^4.6.2) of shared module @jupyterlab/outputarea found in shared scope default.\n"
            "Available versions: 4.2.5 from _JUPYTERLAB.CORE_OUTPUT",
            *(f"Unsatisfied version 4.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module @jupyterlab/{m} (required ^4.5.10)"
              for m in ("rendermime", "statedb")),
            "Unsatisfied version 7.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module @jupyterlab/services (required ^7.5.10)",
            "Unsatisfied version 6.2.5 from _JUPYTERLAB.CORE_OUTPUT of shared singleton module @jupyterlab/coreutils (required ^6.5.10)",
        ]
    ),
}


def voila_known_warnings() -> frozenset[str]:
    """The shared-module warnings Voila's own build explains for the installed Voila and jupyterlab_widgets
    (:data:`VOILA_KNOWN_SHARED_MODULE_WARNINGS`); none for other versions, whose warnings must be looked at anew."""
    from importlib.metadata import version

    return VOILA_KNOWN_SHARED_MODULE_WARNINGS.get((version("voila"), version("jupyterlab_widgets")), frozenset())


class NetworkWatch:
    """Records every request, websocket and console message of a Playwright page, and fails the test
    (:meth:`check`) on any request or websocket whose host is not 127.0.0.1 / localhost / ::1, on any console
    error or uncaught page error, and on any shared-module version warning that is not ``known``.

    Make one right after ``browser.new_page()``, before ``page.goto``, beside :class:`PageWatch`; call
    :meth:`check` at the end of the test, once the page has done what the test waits for::

        watch = PageWatch(page, "voila_my_widget")
        net = NetworkWatch(page, "voila_my_widget", voila=True)   # voila=False for a JupyterLab page
        page.goto(url)
        ...
        net.check()

    ``voila=True`` allows the warnings Voila's build explains (:func:`voila_known_warnings`); ``allow`` takes
    regular expressions of console errors a test expects (say why beside it). On a failure it saves
    ``<name>-network-failure.png`` under :data:`ARTIFACTS`.
    """

    def __init__(self, page, name: str, *, voila: bool = False, allow: tuple[str, ...] = ()):
        self.page, self.name = page, name
        self.known = voila_known_warnings() if voila else frozenset()
        self.allow = [re.compile(a) for a in allow]
        self.requests: list[str] = []  # "METHOD url", in order
        self.offsite: list[str] = []  # requests and websockets whose host is not loopback
        self.failed: list[str] = []  # requests that failed (an aborted one is not an error by itself: reported only)
        self.console_errors: list[str] = []
        self.warnings: list[str] = []
        self.page_errors: list[str] = []
        page.on("request", self._on_request)
        page.on("requestfailed", lambda r: self.failed.append(f"{r.method} {r.url}: {r.failure}"))
        page.on("websocket", self._on_websocket)
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))

    def _on_request(self, request) -> None:
        self.requests.append(f"{request.method} {request.url}")
        if not is_loopback(request.url):
            self.offsite.append(f"{request.method} {request.url} ({request.resource_type})")

    def _on_websocket(self, ws) -> None:
        if not is_loopback(ws.url):
            self.offsite.append(f"websocket {ws.url}")

    def _on_console(self, msg) -> None:
        if msg.type == "error":
            where = msg.location.get("url", "") if isinstance(msg.location, dict) else ""
            self.console_errors.append(f"{msg.text}" + (f" (at {where})" if where else ""))
        elif msg.type == "warning":
            self.warnings.append(msg.text)

    def version_warnings(self) -> list[str]:
        """The shared-module version warnings so far (known or not)."""
        return [w for w in self.warnings if SHARED_MODULE_WARNING_RE.match(w)]

    def problems(self) -> list[str]:
        """What :meth:`check` fails on, one line each."""
        out = [f"request off the machine: {r}" for r in self.offsite]
        out += [f"console error: {e}" for e in self.console_errors if not any(a.search(e) for a in self.allow)]
        out += [f"page error: {e}" for e in self.page_errors]
        out += [f"shared-module version warning: {w}" for w in self.version_warnings() if w not in self.known]
        return out

    def check(self) -> None:
        problems = self.problems()
        if not problems:
            return
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / f"{self.name}-network-failure.png"
        try:
            self.page.screenshot(path=str(shot), full_page=True)
        except Exception as exc:  # noqa: BLE001 - the failure must still say why
            shot = f"(none: {exc})"
        failed = "".join(f"\n  {f}" for f in self.failed)
        pytest.fail(
            f"{self.name}: the page left the machine or logged errors ({len(self.requests)} requests):\n  "
            + "\n  ".join(problems) + (f"\nfailed requests:{failed}" if failed else "") + f"\nscreenshot: {shot}",
            pytrace=False,
        )


# --- JupyterLab: waiting for the kernel, running a notebook ---------------------------------------

# The status bar's "Python 3 (ipykernel) | Idle": the toolbar reads idle before the kernel is ready.
KERNEL_IDLE_JS = (
    "() => Array.from(document.querySelectorAll('.jp-StatusBar-Widget'))"
    ".some(e => e.innerText.includes('Python 3') && e.innerText.includes('Idle'))"
)


def run_all_cells(page) -> None:
    """JupyterLab's Run > Run All Cells (wait for :data:`KERNEL_IDLE_JS` first: before it, nothing runs)."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
