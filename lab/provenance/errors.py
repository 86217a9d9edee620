"""Errors of the provenance facet (``lab.provenance``), under :class:`lab.LabError`."""

from __future__ import annotations

from lab import LabError

__all__ = ["ProvenanceError", "UnknownNodeError", "DuplicateNodeError", "ContentConflictError", "GraphIntegrityError", "IngestError"]


class ProvenanceError(LabError):
    """Base class of every error ``lab.provenance`` raises on purpose."""


class UnknownNodeError(ProvenanceError, KeyError):
    """No node with that id."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateNodeError(ProvenanceError, ValueError):
    """A node id that exists already (nodes are never silently overwritten: use ``update_node``)."""


class ContentConflictError(DuplicateNodeError):
    """Writing content under ids the graph holds already with other content.

    ``id``: the first such node id (or edge, ``"src -relation-> dst"``); ``field``: its first differing field
    (``attributes.score`` for a key of an object field); ``stored`` and ``given``: that field's values; ``run`` and
    ``file``: the run and the trace being ingested, when known. Nothing of the batch was written.
    """

    def __init__(
        self, reason: str, *, id: str, field: str | None = None, stored: object = None, given: object = None, run: str | None = None, file: str | None = None
    ):
        self.id, self.field, self.stored, self.given, self.run, self.file, self.reason = id, field, stored, given, run, file, reason
        super().__init__(f"{file}: {reason}" if file else reason)


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
