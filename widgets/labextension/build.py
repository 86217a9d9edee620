"""Build the research-lab JupyterLab extension from its TypeScript sources, or check the committed build.

``python widgets/labextension/build.py``          build when the sources changed since the committed build
``python widgets/labextension/build.py --force``  build anyway
``python widgets/labextension/build.py --check``  exit 1 (saying what differs) when the committed build is stale

The build is the extension template's own: ``jlpm install`` (jlpm is the yarn that ships with
jupyter-builder; packages from the npm registry, pinned by yarn.lock) then ``jlpm build:prod``
(``tsc`` and ``jupyter-builder build .``), writing the prebuilt extension to ``prebuilt/``, which the
wheel installs as ``share/jupyter/labextensions/research-lab``. ``install.json`` is copied beside it.
``build-hash.json`` records the sha256 of the sources (everything :data:`SOURCES` names) and of the
built files; ``--check`` (and tests/test_labextension.py) recompute both, so a source edited without
a rebuild, or a built file edited by hand, fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREBUILT = HERE / "prebuilt"
HASH_FILE = HERE / "build-hash.json"
SOURCES = ["package.json", "yarn.lock", "tsconfig.json", ".yarnrc.yml", "install.json", "src", "style"]


def _files(base: Path, names: list[str]) -> list[Path]:
    out = []
    for name in names:
        p = base / name
        out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    return out


def digest(base: Path, files: list[Path]) -> str:
    """sha256 over the files' paths (relative to ``base``) and contents, in sorted order."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.relative_to(base).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def current() -> dict[str, str]:
    """The sources' and the prebuilt files' digests as they are on disk now."""
    built = _files(PREBUILT, ["."]) if PREBUILT.is_dir() else []
    return {"sources": digest(HERE, _files(HERE, SOURCES)), "prebuilt": digest(PREBUILT, built) if built else ""}


def stale() -> list[str]:
    """What differs from the recorded build: [] when the committed build is current."""
    if not HASH_FILE.is_file():
        return [f"{HASH_FILE.name} is missing: run `make labextension`"]
    recorded, now = json.loads(HASH_FILE.read_text()), current()
    problems = []
    if recorded.get("sources") != now["sources"]:
        problems.append("the TypeScript sources (or package.json / yarn.lock / style) changed since the build: run `make labextension`")
    if recorded.get("prebuilt") != now["prebuilt"]:
        problems.append("prebuilt/ differs from what the build wrote (edited or missing files): run `make labextension`")
    return problems


def _jlpm() -> list[str]:
    exe = shutil.which("jlpm", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if exe is None:
        raise SystemExit("jlpm not found: it comes with jupyter-builder (pip install jupyter-builder, a jupyterlab dependency)")
    return [exe]


def build() -> None:
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    subprocess.run([*_jlpm(), "install", "--immutable"], cwd=HERE, env=env, check=True)
    subprocess.run([*_jlpm(), "build:prod"], cwd=HERE, env=env, check=True)
    shutil.copy2(HERE / "install.json", PREBUILT / "install.json")
    HASH_FILE.write_text(json.dumps(current(), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the committed build is current")
    ap.add_argument("--force", action="store_true", help="build even when the sources did not change")
    args = ap.parse_args(argv)
    problems = stale()
    if args.check:
        for p in problems:
            print(f"labextension: {p}", file=sys.stderr)
        return 1 if problems else 0
    if problems or args.force:
        print("labextension: building from widgets/labextension/src (" + ("; ".join(problems) or "forced") + ")")
        build()
        print(f"labextension: built {PREBUILT.relative_to(HERE.parents[1])} ({len(list(PREBUILT.rglob('*.js')))} JS files)")
    else:
        print("labextension: prebuilt/ is current with its sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
