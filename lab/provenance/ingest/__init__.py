"""Ingest real agent traces into a :class:`~lab.provenance.graph.ProvenanceGraph`.

:func:`ingest_taubench`
    tau-bench trajectories (OpenAI chat messages with tool calls).
:func:`ingest_spans`
    OpenInference / OpenTelemetry GenAI span exports: OTLP JSON, OTLP protobuf, or a flat (Phoenix-style) span list.

Both validate their input (:class:`~lab.provenance.errors.IngestError` with the file and the JSON path of the bad
field), write a whole file in one transaction (all or nothing) and return an :class:`IngestReport`. Ingesting again
is a no-op that says so: a run the graph holds already, with the same content under the same ids, is skipped and
counted in ``IngestReport.present`` (``already_present`` when nothing at all was written). A run the graph holds in
part, each stored item with the same content (a trace re-exported after it grew), gets exactly its missing writes
and is counted in ``IngestReport.extended``; a run with nothing to write is counted in ``IngestReport.empty``.
Other content under stored ids raises :class:`~lab.provenance.errors.ContentConflictError` naming the run, the
first differing id and field, and nothing of the file is written.
"""

from lab.provenance.ingest.openinference import ingest_spans
from lab.provenance.ingest.taubench import IngestReport, ingest_taubench

__all__ = ["IngestReport", "ingest_spans", "ingest_taubench"]
