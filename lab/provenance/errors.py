"""Errors of the provenance facet (``lab.provenance``), under :class:`lab.LabError`."""

from __future__ import annotations

from lab import LabError

__all__ = ["ProvenanceError", "UnknownNodeError", "DuplicateNodeError", "GraphIntegrityError", "IngestError"]


class ProvenanceError(LabError):
    """Base class of every error ``lab.provenance`` raises on purpose."""


class UnknownNodeError(ProvenanceError, KeyError):
    """No node with that id."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateNodeError(ProvenanceError, ValueError):
    """A node id that exists already (nodes are never silently overwritten: use ``update_node``)."""


class GraphIntegrityError(ProvenanceError, ValueError):
    """An edge whose endpoints are missing, or a relation between node types it does not allow."""


class IngestError(ProvenanceError, ValueError):
    """A trace is malformed; ``path`` locates the bad field (e.g. ``[12].traj[3].tool_calls[0].function.arguments``)."""

    def __init__(self, reason: str, *, file: str | None = None, path: str | None = None):
        self.file, self.path, self.reason = file, path, reason
        where = file or "<trace>"
        if path:
            where += f" at {path}"
        super().__init__(f"{where}: {reason}")
