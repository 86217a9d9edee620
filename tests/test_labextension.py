"""The research-lab JupyterLab extension's packaging: the committed build matches its TypeScript sources, and a
plain ``pip install`` of the built wheel into a fresh venv installs the front end and enables the server part."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.browser import ROOT, jupyter_env

LABEXT = ROOT / "widgets" / "labextension"


def _build_module(here: Path):
    spec = importlib.util.spec_from_file_location("labext_build", here / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_build_is_current_with_its_sources():
    build = _build_module(LABEXT)
    assert build.stale() == [], "run `make labextension` and commit widgets/labextension/{prebuilt,build-hash.json}"
    built = json.loads((LABEXT / "prebuilt" / "package.json").read_text())
    source = json.loads((LABEXT / "package.json").read_text())
    assert built["name"] == source["name"] == "research-lab" and built["version"] == source["version"]
    assert built["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    assert (LABEXT / "prebuilt" / built["jupyterlab"]["_build"]["load"]).is_file()


def test_a_stale_build_is_detected(tmp_path):
    """An edited TypeScript source, or a built file edited by hand, makes the check fail."""
    copy = tmp_path / "labextension"
    shutil.copytree(LABEXT, copy, ignore=shutil.ignore_patterns("node_modules", "lib", ".yarn"))
    build = _build_module(copy)
    assert build.stale() == []
    index = copy / "src" / "index.ts"
    index.write_text(index.read_text().replace("const REFRESH_MS = 2000;", "const REFRESH_MS = 5000;"))
    assert [p for p in build.stale() if "sources" in p]
    assert subprocess.run([sys.executable, str(copy / "build.py"), "--check"], capture_output=True).returncode == 1
    shutil.copy2(LABEXT / "src" / "index.ts", index)
    assert build.stale() == []
    entry = next((copy / "prebuilt" / "static").glob("remoteEntry.*.js"))
    entry.write_text(entry.read_text() + "\n// edited")
    assert [p for p in build.stale() if "prebuilt/" in p]


@pytest.mark.slow
def test_wheel_installs_the_lab_and_server_extensions_in_a_fresh_venv(tmp_path):
    """``pip wheel`` (no build isolation: nothing downloaded), then a plain ``pip install --no-deps`` of it into a
    fresh venv that sees this venv's packages (a .pth file; torch is not downloaded again); the fresh venv's
    ``jupyter labextension list`` and ``jupyter server extension list`` show research-lab."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next(dist.glob("research_lab-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "outer_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    assert (venv / "share/jupyter/labextensions/research-lab/install.json").is_file()
    # Voila (whose own JupyterLab packages are older) is told to leave the extension out of its pages
    voila_cfg = json.loads((venv / "etc/jupyter/voila.json").read_text())
    assert voila_cfg["VoilaConfiguration"]["extension_denylist"] == ["research-lab"]
    env = jupyter_env(tmp_path / "jupyter")
    env.pop("JUPYTER_PATH", None), env.pop("JUPYTER_CONFIG_PATH", None)
    env["PYTHONPATH"] = ""
    cwd = tmp_path  # not the checkout: the wheel's research_lab_ext is imported, not the source tree's
    labext = subprocess.run([str(py), "-m", "jupyterlab.labextensions", "list"], capture_output=True, text=True, env=env, cwd=cwd)
    out = labext.stdout + labext.stderr
    line = next((l for l in out.splitlines() if "research-lab" in l), "")
    assert str(venv / "share/jupyter/labextensions") in out, out
    assert "v0.1.0" in line and "enabled" in line and "OK" in line and "(python, research-lab)" in line, out
    server = subprocess.run([str(py), "-m", "jupyter_server.extension.serverextension", "list"], capture_output=True,
                            text=True, env=env, cwd=cwd)
    out = server.stdout + server.stderr
    assert "research_lab_ext enabled" in " ".join(out.split()).replace("\x1b[32m", "").replace("\x1b[0m", ""), out
    assert "research_lab_ext 0.1.0 OK" in " ".join(out.replace("\x1b[32m", "").replace("\x1b[0m", "").split()), out
    where = subprocess.run([str(py), "-c", "import research_lab_ext; print(research_lab_ext.__file__)"], capture_output=True,
                           text=True, env=env, cwd=cwd).stdout
    assert where.startswith(str(venv)), where
