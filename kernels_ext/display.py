"""HTML display formatters for ``lab`` objects (registered by ``%load_ext kernels_ext``)."""

from __future__ import annotations

import html

import pandas as pd

from lab.hpc.queue import QueueReplay
from lab.hpc.swf import SWFTrace

__all__ = ["trace_html", "replay_html", "register_formatters", "unregister_formatters"]

_FORMATTERS = {SWFTrace: "trace_html", QueueReplay: "replay_html"}


def _row(key: str, value) -> str:
    return f"<tr><th style='text-align:left'>{html.escape(key)}</th><td style='text-align:left'>{html.escape(str(value))}</td></tr>"


def trace_html(trace: SWFTrace, rows: int = 5) -> str:
    """An SWF trace as HTML: header facts, the date span and its first ``rows`` jobs."""
    h = trace.header
    submit = pd.Series(trace.submit_epoch()).dropna()
    span = ""
    if len(submit):
        first, last = (pd.Timestamp(submit.min(), unit="s", tz="UTC"), pd.Timestamp(submit.max(), unit="s", tz="UTC"))
        span = f"{first:%Y-%m-%d} to {last:%Y-%m-%d}"
    facts = [
        ("file", trace.path or "<text>"),
        ("jobs", f"{len(trace):,}"),
        ("computer", h.computer or "unknown"),
        ("MaxNodes / MaxProcs", f"{h.max_nodes} / {h.max_procs}"),
        ("submissions", span),
    ]
    if trace.extension:
        facts.append(("extension", trace.extension))
    if trace.problems:
        facts.append(("values kept as unknown", f"{len(trace.problems)} (first: {trace.problems[0]})"))
    table = "".join(_row(k, v) for k, v in facts)
    jobs = trace.jobs.head(rows).to_html(index=False, border=0, na_rep="?")
    return f"<div><b>SWFTrace</b><table>{table}</table>{jobs}</div>"


def replay_html(replay: QueueReplay) -> str:
    """A queue replay as HTML: jobs replayed, excluded, capacity and median wait."""
    waits = replay.wait
    facts = [
        ("site", replay.name),
        ("jobs replayed", f"{len(replay):,}"),
        ("excluded (unknown times or size)", f"{replay.excluded:,}"),
        ("capacity (processors)", replay.capacity if replay.capacity is not None else "unknown"),
        ("median wait", f"{pd.Series(waits).median() / 3600:.2f} h"),
        ("span", f"{replay.span / 86400:.1f} days"),
    ]
    return "<div><b>QueueReplay</b><table>" + "".join(_row(k, v) for k, v in facts) + "</table></div>"


def register_formatters(ipython) -> None:
    formatter = ipython.display_formatter.formatters["text/html"]
    for cls, fn in _FORMATTERS.items():
        formatter.for_type(cls, globals()[fn])


def unregister_formatters(ipython) -> None:
    formatter = ipython.display_formatter.formatters["text/html"]
    for cls in _FORMATTERS:
        formatter.type_printers.pop(cls, None)
