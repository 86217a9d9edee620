"""Tornado handlers of the research-lab server extension (all under ``base_url``, all authenticated).

``GET  research-lab/dashboards``       the dashboard templates: ``[{id, label, caption, file, icon}]``
``POST research-lab/dashboards/<id>``  body ``{"dir": "folder"}`` (relative to the server root, default
                                       the root): saves a fresh copy of that template there through the
                                       server's contents manager (``01_queues.ipynb``, then
                                       ``01_queues-1.ipynb``, ...) and answers ``{"path": ...}``
``GET  research-lab/live``             :func:`lab.overview.snapshot` as JSON (read in a worker thread)

Errors answer JSON ``{"message": ...}`` with 400 (bad body, bad folder), 404 (unknown dashboard id).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import tornado
from jupyter_core.utils import ensure_async
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from traitlets import Int, List, Unicode
from traitlets.config import Configurable

from lab import overview

NAMESPACE = "research-lab"

# Launcher cards: template stem -> (id, label, caption, icon). A template not named here still gets a
# card (its id and label from its file name), so a new dashboard notebook (e.g. the video demo) shows up.
CATALOG = {
    "01_queues": ("site-queues", "Site queues", "Three HPC sites' queues replayed from their real logs", "queue"),
    "02_live_sites": ("federated-sites", "Federated sites", "Four live Slurm sites: queues, jobs and a placement", "sites"),
    "03_provenance_explorer": ("provenance-explorer", "Provenance explorer", "An agent run's provenance graph, trust and gate", "graph"),
    "05_training_monitor": ("training-monitor", "Training monitor", "Data-parallel GPT runs followed live", "chart"),
    "06b_perf_model": ("perf-model", "Performance model", "Predict a DP / TP / PP training step, operator by operator", "queue"),
    "07_restoration_demo": ("image-restoration", "Image restoration", "Restore an image with a flow prior", "image"),
    "08_video_demo": ("video-demo", "Video demo", "Video generation and restoration demo", "video"),
}


class ResearchLab(Configurable):
    """Settings of the research-lab server extension (``c.ResearchLab.*`` in a Jupyter config)."""

    dashboards_dir = Unicode(
        "", config=True,
        help="Folder of the dashboard notebook templates; default $LAB_DASHBOARDS_DIR, else the checkout's "
             "notebooks/dashboards, else <prefix>/share/research-lab/dashboards (installed by the wheel).",
    )
    live_roots = List(
        Unicode(), config=True,
        help="Folders searched for live testbeds and event logs, added to lab.overview.default_roots() "
             "($LAB_LIVE_ROOTS, else the default testbed folder and the temp folder) and the server root.",
    )
    max_depth = Int(3, config=True, help="How many folders below a root lab.overview.discover looks.")

    root_dir = Unicode("")

    def dashboards_path(self) -> Path:
        if self.dashboards_dir:
            return Path(self.dashboards_dir)
        env = os.environ.get("LAB_DASHBOARDS_DIR")
        if env:
            return Path(env)
        checkout = Path(__file__).resolve().parents[1] / "notebooks" / "dashboards"
        if checkout.is_dir():
            return checkout
        return Path(sys.prefix) / "share" / "research-lab" / "dashboards"

    def roots(self) -> list[Path]:
        return overview.default_roots([*self.live_roots, *([self.root_dir] if self.root_dir else [])])

    def dashboards(self) -> list[dict]:
        """The templates, in file order: ``id``, ``label``, ``caption``, ``file`` (name), ``icon``."""
        out = []
        for path in sorted(self.dashboards_path().glob("*.ipynb")):
            stem = path.stem
            ident, label, caption, icon = CATALOG.get(
                stem, (stem.split("_", 1)[-1].replace("_", "-"), stem.split("_", 1)[-1].replace("_", " ").capitalize(), "", "chart"))
            out.append({"id": ident, "label": label, "caption": caption, "file": path.name, "icon": icon})
        return out


class _Base(APIHandler):
    @property
    def lab(self) -> ResearchLab:
        return self.settings["research_lab"]

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish(json.dumps({"message": message}))


class DashboardsHandler(_Base):
    @tornado.web.authenticated
    def get(self):
        self.finish(json.dumps(self.lab.dashboards()))


class OpenDashboardHandler(_Base):
    @tornado.web.authenticated
    async def post(self, ident: str):
        entry = next((d for d in self.lab.dashboards() if d["id"] == ident), None)
        if entry is None:
            return self.fail(404, f"no dashboard {ident!r}; known: {[d['id'] for d in self.lab.dashboards()]}")
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as exc:
            return self.fail(400, f"request body is not JSON: {exc}")
        folder = body.get("dir", "") if isinstance(body, dict) else None
        if not isinstance(folder, str):
            return self.fail(400, f"'dir' must be a folder path (a string), got {folder!r}")
        folder = folder.strip("/")
        cm = self.contents_manager
        if folder and not await ensure_async(cm.dir_exists(folder)):
            return self.fail(400, f"no folder {folder!r} under the server root")
        template = self.lab.dashboards_path() / entry["file"]
        content = json.loads(template.read_text(encoding="utf-8"))
        stem, n = Path(entry["file"]).stem, 0
        while True:
            name = f"{stem}.ipynb" if n == 0 else f"{stem}-{n}.ipynb"
            path = f"{folder}/{name}" if folder else name
            if not await ensure_async(cm.file_exists(path)):
                break
            n += 1
        await ensure_async(cm.save({"type": "notebook", "format": "json", "content": content}, path))
        self.set_status(201)
        self.finish(json.dumps({"path": path, "id": ident}))


class LiveHandler(_Base):
    @tornado.web.authenticated
    async def get(self):
        lab = self.lab
        ov = await asyncio.to_thread(overview.snapshot, lab.roots(), max_depth=lab.max_depth)
        self.finish(json.dumps(ov.to_json(), default=str))


def setup_handlers(server_app) -> ResearchLab:
    """Add the handlers under the server's base_url; returns the extension's settings."""
    web_app = server_app.web_app
    lab = ResearchLab(config=server_app.config, root_dir=str(server_app.root_dir))
    web_app.settings["research_lab"] = lab
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base, NAMESPACE, "dashboards"), DashboardsHandler),
        (url_path_join(base, NAMESPACE, "dashboards", r"([\w.-]+)"), OpenDashboardHandler),
        (url_path_join(base, NAMESPACE, "live"), LiveHandler),
    ])
    return lab
