"""Line magics of the lab's kernel extension (``%load_ext kernels_ext``).

Each parses its line with IPython's :mod:`IPython.core.magic_arguments` (so ``%lab_x -h`` prints its
help) and refuses a bad argument with a :class:`~IPython.core.error.UsageError` naming it and what
would be accepted. The magics only gather ``lab`` objects and hand them to their widget:

``%lab_data [NAME]``                      the data registry (or one verified path)
``%lab_sites``                            the testbed sites found now (:func:`lab.overview.snapshot`), a table
``%lab_queue SITE|TRACE``                 the queue dashboard: a registered SWF trace replayed, or a live site
                                          followed through the continuation service's event log that samples it
``%lab_trace PATH``                       a tau-bench trajectories file or an OpenInference/OTLP span export
                                          ingested into a fresh provenance graph, in the provenance explorer
``%lab_runs [DIR]``                       the training monitor over an event log (a file, or the one in DIR;
                                          default: the log of the newest run found by lab.overview)
``%lab_restore IMAGE --method M --task T`` the restoration demo on test image IMAGE (an index)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from lab import data
from lab.data.report import check, format_rows


def _traces() -> list[str]:
    """Registered data sets that are SWF traces (what %lab_queue replays)."""
    return [name for name in data.names() if data.info(name).format == "swf"]


class _Help(Exception):
    pass


def _parse(magic, line: str):
    """``parse_argstring`` with ``-h``/``--help``: prints the magic's usage and help (its docstring as
    magic_arguments writes it) and answers None; a bad argument raises UsageError."""
    if {"-h", "--help"} & set(line.split()):
        print(magic.__doc__)
        raise _Help
    return parse_argstring(magic, line)


def _helpful(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(self, line: str = ""):
        try:
            return fn(self, line)
        except _Help:
            return None

    return wrapper


@magics_class
class LabMagics(Magics):
    @line_magic
    def lab_data(self, line: str):
        """``%lab_data`` lists the registered data sets, verified, and where each resolves
        (``LAB_DATA_DIR``, ``bundled`` with the project, ``cache``, ``package``), as
        ``python -m lab.data`` prints it; ``%lab_data NAME`` returns the verified local path of
        one (fetching it if needed)."""
        name = line.strip()
        if name:
            return data.fetch(name)
        print(format_rows(check()))

    @magic_arguments()
    @argument("--root", action="append", default=None, metavar="DIR",
              help="where to look for testbeds (repeatable); default lab.overview.default_roots()")
    @line_magic
    @_helpful
    def lab_sites(self, line: str):
        """The testbed sites running now: name, state, pending and running jobs, CPUs, testbed folder
        (a pandas DataFrame: a table in a notebook, plain text in a terminal)."""
        import pandas as pd

        from lab import overview

        args = _parse(self.lab_sites, line)
        for r in args.root or []:
            if not Path(r).expanduser().is_dir():
                raise UsageError(f"%lab_sites: --root {r!r} is not a folder")
        ov = overview.snapshot([Path(r) for r in args.root] if args.root else None)
        cols = ["name", "state", "pending", "running", "idle_cpus", "total_cpus", "testbed", "error"]
        return pd.DataFrame([vars(s) for s in ov.sites], columns=cols)

    @magic_arguments()
    @argument("name", metavar="SITE|TRACE", help="a registered SWF trace (e.g. hpc2n) or a live testbed site's name")
    @argument("--day", type=float, default=30.0, help="the trace's day the dashboard opens at (default 30)")
    @line_magic
    @_helpful
    def lab_queue(self, line: str):
        """The queue dashboard of one trace (replayed) or one live site (followed through the
        event log of the continuation service that samples it)."""
        from lab import overview

        args = _parse(self.lab_queue, line)
        traces = _traces()
        if args.name in traces:
            from lab.hpc import QueueReplay, load_trace
            from widgets import QueueDashboard

            return QueueDashboard({args.name: QueueReplay(load_trace(args.name), name=args.name)}, start_day=args.day)
        ov = overview.snapshot()
        logs = [s.log for s in ov.services if args.name in s.sites]
        if logs:
            from widgets import QueueDashboard

            dash = QueueDashboard.live(logs[0], [args.name])
            dash.start(interval_s=1.0)
            return dash
        sites = sorted({s.name for s in ov.sites} | {n for s in ov.services for n in s.sites})
        raise UsageError(f"%lab_queue: {args.name!r} is neither a trace ({', '.join(traces)}) nor a site sampled by a "
                         f"running continuation service (sites found: {', '.join(sites) or 'none'})")

    @magic_arguments()
    @argument("path", metavar="PATH", help="tau-bench trajectories (JSON list) or an OpenInference / OTLP span export")
    @argument("--run", default=None, help="the run to show first (default: the first one ingested)")
    @line_magic
    @_helpful
    def lab_trace(self, line: str):
        """Ingest PATH into a fresh provenance graph (in a temporary folder) and open the explorer on it."""
        from lab.provenance import ProvenanceGraph
        from lab.provenance.ingest import ingest_taubench
        from lab.provenance.ingest.openinference import ingest_spans
        from widgets import ProvenanceExplorer

        args = _parse(self.lab_trace, line)
        path = Path(args.path.strip("'\"")).expanduser()
        if not path.is_file():
            raise UsageError(f"%lab_trace: no file {str(path)!r}")
        try:
            head = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
            head = None  # OTLP protobuf, or not a trace: ingest_spans says which
        graph = ProvenanceGraph(Path(tempfile.mkdtemp(prefix="lab_trace-")) / "provenance.db")
        if isinstance(head, list) and head and isinstance(head[0], dict) and "traj" in head[0]:
            ingest_taubench(graph, path)
        else:
            ingest_spans(graph, path)
        runs = graph.runs()
        if args.run is not None and args.run not in runs:
            raise UsageError(f"%lab_trace: no run {args.run!r} in {path} (runs: {', '.join(runs[:10])}{' ...' if len(runs) > 10 else ''})")
        return ProvenanceExplorer(graph, run=args.run or (runs[0] if runs else None))

    @magic_arguments()
    @argument("dir", nargs="?", default=None, metavar="DIR",
              help="an event log file, or a folder holding events.sqlite; default: the newest run's log found")
    @line_magic
    @_helpful
    def lab_runs(self, line: str):
        """The training monitor over the runs of one event log, followed live."""
        from lab import overview
        from widgets import TrainingMonitor

        args = _parse(self.lab_runs, line)
        if args.dir is None:
            runs = overview.snapshot().runs
            if not runs:
                raise UsageError("%lab_runs: no training run found (give DIR, the run's folder or its event log)")
            log = Path(runs[-1].log)
        else:
            p = Path(args.dir).expanduser()
            log = p if p.is_file() else p / "events.sqlite"
            if not log.is_file():
                found = overview.discover([p], max_depth=2).logs if p.is_dir() else []
                if not found:
                    raise UsageError(f"%lab_runs: {str(p)!r} is not an event log nor a folder holding one")
                log = found[0]
        monitor = TrainingMonitor(log)
        monitor.start(interval_s=1.0)
        return monitor

    @magic_arguments()
    @argument("image", metavar="IMAGE", help="the test image's index (0, 1, ...)")
    @argument("--method", "-m", default="rebridge", help="a method key (default rebridge)")
    @argument("--task", "-t", default="denoise", help="a degradation (default denoise)")
    @argument("--prior", default="gaussian-digits", help="the flow prior (default gaussian-digits)")
    @argument("--nfe", type=int, default=50, help="function evaluations (default 50)")
    @line_magic
    @_helpful
    def lab_restore(self, line: str):
        """The restoration demo on one test image with one method and degradation."""
        from lab.generative import demo

        args = _parse(self.lab_restore, line)
        methods = [k for _, k in demo.METHOD_CHOICES]
        tasks = [k for _, k in demo.TASK_CHOICES]
        priors = list(demo.available_priors())
        if not args.image.isdigit():
            raise UsageError(f"%lab_restore: IMAGE must be a test image's index (0, 1, ...), got {args.image!r}")
        if args.method not in methods:
            raise UsageError(f"%lab_restore: unknown --method {args.method!r}; choose from {', '.join(methods)}")
        if args.task not in tasks:
            raise UsageError(f"%lab_restore: unknown --task {args.task!r}; choose from {', '.join(tasks)}")
        if args.prior not in priors:
            raise UsageError(f"%lab_restore: unknown --prior {args.prior!r}; choose from {', '.join(priors)}")
        if args.nfe < 1:
            raise UsageError(f"%lab_restore: --nfe must be >= 1, got {args.nfe}")
        from widgets import RestorationDemo

        return RestorationDemo(prior=args.prior, image=int(args.image), task=args.task, method=args.method, nfe=args.nfe)
