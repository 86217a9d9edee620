"""Verify (or fetch) every registered data set and say where each resolved.

The one implementation behind ``python -m lab.data`` (``make data``) and the
kernel extension's ``%lab_data``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lab import data

__all__ = ["Row", "check", "format_rows"]


@dataclass(frozen=True)
class Row:
    """One data set's state.

    Attributes
    ----------
    name : str
        Registry key.
    source : str or None
        :attr:`lab.data.Resolved.source` when it resolved (``"LAB_DATA_DIR"``, ``"bundled"``,
        ``"cache"``, ``"downloaded"``, ``"package"``); ``"url"`` for a file data set with no local
        copy when downloads were not allowed (fine: :func:`lab.data.fetch` downloads it on first
        use); None when it did not resolve.
    path : pathlib.Path or None
        The verified file or folder, when it resolved.
    problem : str or None
        Why it did not resolve: the registry's error message (missing everywhere, corrupted,
        package not installed).
    """

    name: str
    source: str | None = None
    path: Path | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def check(names: Iterable[str] | None = None, *, download: bool = False, progress: bool = False) -> list[Row]:
    """Resolve each data set (all registered ones by default), verifying its sha256.

    Parameters
    ----------
    names : iterable of str, optional
        Registry names; default :func:`lab.data.names`.
    download : bool, default False
        Fetch what no local place holds from its URL (into the cache); otherwise such a set is
        reported as not local.
    progress : bool, default False
        Show a tqdm bar over the data sets (and pooch's bar for each download).

    Returns
    -------
    list of Row
        In the order given. Errors are reported per row, never raised, except
        :class:`lab.data.UnknownDatasetError` for a name not in the registry, raised before any work.
    """
    chosen = list(data.names() if names is None else names)
    for name in chosen:
        data.info(name)  # unknown names fail before anything is hashed or downloaded
    rows = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(chosen), desc="data sets", unit="set")
    try:
        for name in chosen:
            if bar is not None:
                bar.set_postfix_str(name)
            try:
                found = data.resolve(name, download=download, progressbar=progress)
                rows.append(Row(name, found.source, found.path))
            except data.DataNotFoundError as exc:
                if not download and data.info(name).kind != "package":
                    rows.append(Row(name, "url"))  # not local yet: fetch() downloads it on first use
                else:
                    rows.append(Row(name, problem=str(exc)))
            except data.ChecksumError as exc:
                rows.append(Row(name, problem=f"CORRUPTED: {exc}"))
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return rows


def format_rows(rows: list[Row]) -> str:
    """The rows as an aligned text table: name, source, path (or the problem)."""
    width = max((len(r.name) for r in rows), default=4)
    lines = [f"{'name':{width}s}  {'source':12s}  path"]
    for r in rows:
        where = r.problem if not r.ok else (f"{data.info(r.name).url} (downloaded on first use)" if r.path is None else r.path)
        lines.append(f"{r.name:{width}s}  {(r.source or 'MISSING'):12s}  {where}")
    return "\n".join(lines)
