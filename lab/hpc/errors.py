"""Errors of the HPC facet (``lab.hpc``): one hierarchy under :class:`lab.LabError`."""

from __future__ import annotations

from pathlib import Path

from lab import LabError

__all__ = ["HPCError", "SWFError", "ReplayError"]


class HPCError(LabError):
    """Base class of every error ``lab.hpc`` raises on purpose."""


class SWFError(HPCError, ValueError):
    """A Standard Workload Format file is malformed.

    Attributes
    ----------
    path : pathlib.Path or None
        The file (None for in-memory text).
    line : int or None
        1-based line number in the file (None when the problem is the whole file).
    field : str or None
        The SWF field's name (``"run_time"``, ...), when one field is at fault.
    reason : str
        What is wrong, without the location.
    """

    def __init__(self, reason: str, *, path: Path | str | None = None, line: int | None = None, field: str | None = None):
        self.path = Path(path) if path is not None else None
        self.line, self.field, self.reason = line, field, reason
        where = str(self.path) if self.path is not None else "<swf text>"
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {reason}")


class ReplayError(HPCError, ValueError):
    """A queue replay was asked something the trace cannot answer (e.g. no wait times at all)."""
