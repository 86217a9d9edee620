"""HTML display formatters for ``lab`` objects (registered by ``%load_ext kernels_ext``)."""

from __future__ import annotations

import html

import pandas as pd

from lab.hpc.queue import QueueReplay
from lab.hpc.swf import SWFTrace

__all__ = ["trace_html", "replay_html", "register_formatters", "unregister_formatters"]



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


# ---- one-line plain summaries (a terminal's IPython shows these) and rich HTML for the other lab objects

def _table(title: str, facts: list[tuple[str, object]]) -> str:
    return f"<div><b>{html.escape(title)}</b><table>" + "".join(_row(k, v) for k, v in facts) + "</table></div>"


def trace_text(trace: SWFTrace, p=None, cycle=False) -> None:
    p.text(f"SWFTrace {trace.header.computer or trace.path or '<text>'}: {len(trace):,} jobs, "
           f"MaxProcs {trace.header.max_procs}")


def replay_text(replay: QueueReplay, p=None, cycle=False) -> None:
    p.text(f"QueueReplay {replay.name}: {len(replay):,} jobs over {replay.span / 86400:.1f} days, "
           f"median wait {pd.Series(replay.wait).median() / 3600:.2f} h")


def site_text(site, p=None, cycle=False) -> None:
    p.text(f"TestbedSite {site.name}: {site.cpus} CPUs, {site.memory_mb} MB, slurmctld pid {site.pids.get('slurmctld')}, "
           f"conf {site.conf}")


def site_html(site) -> str:
    return _table(f"TestbedSite {site.name}", [("Slurm conf", site.conf), ("node", site.node), ("CPUs", site.cpus),
                                                ("memory", f"{site.memory_mb} MB"), ("ports", site.ports), ("pids", site.pids)])


def graph_text(graph, p=None, cycle=False) -> None:
    p.text(f"ProvenanceGraph {graph.path}: {len(graph):,} nodes, {len(graph.runs()):,} runs")


def graph_html(graph) -> str:
    runs = graph.runs()
    shown = ", ".join(runs[:5]) + (" ..." if len(runs) > 5 else "")
    return _table("ProvenanceGraph", [("file", graph.path), ("nodes", f"{len(graph):,}"), ("runs", f"{len(runs):,}"),
                                      ("first runs", shown)])


def monitor_text(mon, p=None, cycle=False) -> None:
    runs = mon.runs()
    states = ", ".join(f"{r.run_id} {r.state} step {r.last_step}" for r in runs.itertuples()) or "no run yet"
    p.text(f"RunMonitor {mon.events_path}: {states}")


def monitor_html(mon) -> str:
    runs = mon.runs()[["run_id", "state", "last_step", "steps", "loss", "val_loss", "world_size", "optimizer", "comm"]]
    return f"<div><b>RunMonitor</b> {html.escape(str(mon.events_path))}{runs.to_html(index=False, border=0, na_rep='')}</div>"


def result_text(result, p=None, cycle=False) -> None:
    p.text(f"DemoResult {result.summary()}")


def result_html(result) -> str:
    import base64

    img = base64.b64encode(result.png("restored", scale=3)).decode()
    return (f"<div><b>DemoResult</b> {html.escape(result.summary())}<br>"
            f"<img alt='restored' src='data:image/png;base64,{img}'></div>")


def _types() -> list[tuple[type, str | None, object]]:
    """(class, HTML formatter, plain formatter): imported lazily, so a facet that fails to import does not
    take the others' display with it."""
    out = [(SWFTrace, trace_html, trace_text), (QueueReplay, replay_html, replay_text)]
    from lab.hpc.testbed import TestbedSite
    from lab.provenance import ProvenanceGraph
    from lab.training.monitor import RunMonitor

    out += [(TestbedSite, site_html, site_text), (ProvenanceGraph, graph_html, graph_text), (RunMonitor, monitor_html, monitor_text)]
    try:
        from lab.generative.demo import DemoResult
    except ImportError:  # torch-less install: no restoration results to show
        return out
    return out + [(DemoResult, result_html, result_text)]


def register_formatters(ipython) -> None:
    """HTML (a notebook) and one-line plain text (a terminal) for the lab objects a user meets."""
    html_fmt = ipython.display_formatter.formatters["text/html"]
    text_fmt = ipython.display_formatter.formatters["text/plain"]
    for cls, to_html, to_text in _types():
        html_fmt.for_type(cls, to_html)
        text_fmt.for_type(cls, to_text)


def unregister_formatters(ipython) -> None:
    for mime in ("text/html", "text/plain"):
        formatter = ipython.display_formatter.formatters[mime]
        for cls, _, _ in _types():
            formatter.type_printers.pop(cls, None)
