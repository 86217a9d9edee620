"""Read and write the Standard Workload Format (SWF) of the Parallel Workloads Archive.

SWF (version 2.2, https://www.cs.huji.ac.il/labs/parallel/workload/swf.html) is
one job per line, 18 whitespace-separated numeric fields, ``-1`` meaning
unknown, and header comment lines starting with ``;`` (``; MaxProcs: 240``).
:func:`read_swf` turns a file (plain or ``.gz``) into an :class:`SWFTrace`: a
typed :class:`pandas.DataFrame` with one nullable column per field, in which
unknown values are ``<NA>`` (never 0), and an :class:`SWFHeader`.

Units are the format's: times in seconds (``submit_time`` relative to the
header's ``UnixStartTime``), memory in kilobytes per processor as the
specification says (some producers, MetaCentrum's among them, write bytes:
the numbers are kept as written).

One variant is understood as what it is: Alea's extended SWF (the MetaCentrum
2013 log), whose lines carry three more tokens after the 18 fields: the braced
list of node ids the job ran on, the queue name and the requested-property
string. They become the columns ``node_ids`` (tuple of int), ``queue_name`` and
``properties``. Any other extra token is refused.

Comments and checks
-------------------
Every line that starts with ``;`` is a comment (the specification's rule). Those
before the first job are the header, and only they set header fields
(``; MaxProcs: 240``); a ``;`` line after the first job (a file concatenated from
two logs, a note added by hand) is kept in :attr:`SWFTrace.comments` with its line
number and never changes the header (an :class:`~lab.hpc.errors.SWFWarning` says
so when it looks like a header field). A job number that repeats is an error naming
the id and both lines (with ``invalid="unknown"`` the later job is dropped and
listed in ``trace.problems``). A job with more processors than the header's machine
(``MaxProcs``, else ``MaxNodes``) is read, with an :class:`~lab.hpc.errors.SWFWarning`
naming its line and the limit.
"""

from __future__ import annotations

import gzip
import io
import re
import warnings
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from lab.hpc.errors import ArgumentError, SWFError, SWFWarning

__all__ = ["FIELDS", "SWFHeader", "SWFComment", "SWFTrace", "read_swf", "parse_swf", "write_swf", "load_trace"]

#: The 18 SWF fields, in file order, named as in the specification.
FIELDS: tuple[str, ...] = (
    "job_id",  # 1  job number
    "submit_time",  # 2  seconds since UnixStartTime
    "wait_time",  # 3  seconds between submission and start
    "run_time",  # 4  wall-clock seconds the job ran
    "allocated_processors",  # 5  processors (Theta: nodes) the job used
    "average_cpu_time",  # 6  CPU seconds per processor (may be fractional)
    "used_memory",  # 7  kilobytes per processor
    "requested_processors",  # 8
    "requested_time",  # 9  seconds (the walltime limit asked for)
    "requested_memory",  # 10 kilobytes per processor
    "status",  # 11 1 completed, 0 failed, 5 cancelled, ...
    "user_id",  # 12
    "group_id",  # 13
    "executable_id",  # 14
    "queue_id",  # 15
    "partition_id",  # 16
    "preceding_job_id",  # 17
    "think_time",  # 18 seconds after the preceding job ended
)
_FLOAT_FIELDS = frozenset({"average_cpu_time"})
_EXTENSION_COLUMNS = ("node_ids", "queue_name", "properties")

# Header keys with a typed counterpart in SWFHeader.
_HEADER_KEYS = {
    "Version": "version",
    "Computer": "computer",
    "Installation": "installation",
    "MaxJobs": "max_jobs",
    "MaxRecords": "max_records",
    "Preemption": "preemption",
    "UnixStartTime": "unix_start_time",
    "TimeZone": "time_zone",
    "TimeZoneString": "time_zone_string",
    "StartTime": "start_time",
    "EndTime": "end_time",
    "MaxNodes": "max_nodes",
    "MaxProcs": "max_procs",
    "MaxQueues": "max_queues",
    "MaxPartitions": "max_partitions",
}
_INT_HEADER_FIELDS = {"max_jobs", "max_records", "unix_start_time", "time_zone", "max_nodes", "max_procs", "max_queues", "max_partitions"}
# "; Key: value" with at most one blank after ';'; deeper-indented lines continue the previous key
# (e.g. a multi-line Note, even if its text contains a colon, as in a URL).
_HEADER_RE = re.compile(r"^;[ \t]?([A-Za-z][A-Za-z0-9]*)\s*:\s*(.*?)\s*$")
_HEADER_INT_LIMIT = 2**53  # header integers become epoch seconds and capacities in float64 arithmetic


class SWFHeader(BaseModel):
    """The ``;`` header of an SWF file, typed where the specification defines the key.

    ``lines`` keeps every header line verbatim, so that writing the trace back
    reproduces the header exactly. Counts are integers, times in seconds.
    """

    version: str | None = None
    computer: str | None = None
    installation: str | None = None
    max_jobs: int | None = None
    max_records: int | None = None
    preemption: str | None = None
    unix_start_time: int = Field(0, description="epoch seconds that submit_time counts from")
    time_zone: int | None = Field(None, description="seconds; legacy SWF field")
    time_zone_string: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    max_nodes: int | None = None
    max_procs: int | None = None
    max_queues: int | None = None
    max_partitions: int | None = None
    queues: list[str] = Field(default_factory=list)
    partitions: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    lines: list[str] = Field(default_factory=list, description="the header lines verbatim, without newlines")


@dataclass(frozen=True)
class SWFComment:
    """A ``;`` line after the first job: kept, never read as a header field.

    Attributes
    ----------
    line : int
        1-based line number in the file.
    text : str
        The line verbatim (without its newline).
    before_job : int
        Position in ``trace.jobs`` of the job line that follows it (``len(jobs)`` at the end),
        so :func:`write_swf` puts it back where it was.
    """

    line: int
    text: str
    before_job: int


@dataclass(frozen=True)
class SWFTrace:
    """A parsed SWF trace.

    Attributes
    ----------
    jobs : pandas.DataFrame
        One row per job, columns :data:`FIELDS` (dtype ``Int64``; ``average_cpu_time``
        ``Float64``), ``<NA>`` where the file says -1. Alea-extended files add
        ``node_ids`` (object: tuple of int), ``queue_name`` and ``properties`` (string).
    header : SWFHeader
    path : pathlib.Path or None
        Where it was read from.
    problems : tuple of SWFError
        What ``invalid="unknown"`` let through, in file order: values set to unknown, and later
        jobs dropped because their job number repeats an earlier one (empty otherwise).
    extension : {"alea"} or None
        The SWF variant the lines follow.
    comments : tuple of SWFComment
        The ``;`` lines after the first job, in file order (the header's are in ``header.lines``).
    """

    jobs: pd.DataFrame
    header: SWFHeader
    path: Path | None = None
    problems: tuple[SWFError, ...] = field(default=())
    extension: Literal["alea"] | None = None
    comments: tuple[SWFComment, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def name(self) -> str:
        return self.path.name.removesuffix(".gz") if self.path is not None else "<swf>"

    def submit_epoch(self) -> np.ndarray:
        """Absolute submission times, seconds since the Unix epoch (UTC), shape ``(n_jobs,)``, float64.

        ``UnixStartTime + submit_time``; NaN where the submit time is unknown.
        """
        return self.header.unix_start_time + self.jobs["submit_time"].to_numpy(dtype="float64", na_value=np.nan)

    def __repr__(self) -> str:
        h = self.header
        return (
            f"SWFTrace({self.name!r}, jobs={len(self)}, max_nodes={h.max_nodes}, max_procs={h.max_procs}"
            + (f", extension={self.extension!r}" if self.extension else "")
            + (f", problems={len(self.problems)}" if self.problems else "")
            + ")"
        )


def _open_text(path: Path):
    # utf-8-sig: a byte-order mark some editors write is not part of the first header line
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="strict")
    return path.open("r", encoding="utf-8-sig", errors="strict")


def _first_undecodable_line(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return 1


def read_swf(path: str | Path, *, invalid: Literal["raise", "unknown"] = "raise") -> SWFTrace:
    """Read an SWF file (``.gz`` too) into an :class:`SWFTrace`.

    Parameters
    ----------
    path : str or pathlib.Path
        The file. For a registered data set use :func:`load_trace`.
    invalid : {"raise", "unknown"}
        What to do with a value the format forbids (non-numeric, non-finite,
        not an integer literal where an integer is required, negative other than -1):
        raise :class:`~lab.hpc.errors.SWFError` (default), or keep the job,
        mark that value unknown and record the error in ``trace.problems``.
        A job number that repeats is such a value too: raised (naming the id and both lines),
        or the later job dropped and recorded in ``trace.problems``.
        Structural faults (wrong number of fields, bad header, no jobs, not text) always raise.

    Raises
    ------
    SWFError
        With the file, 1-based line number and field name, e.g.
        ``theta.swf, line 12, field 'run_time': negative value -5; SWF allows -1 (unknown) only``
        or ``line 9, field 'job_id': job id 4 repeats line 6``;
        also for a file that is not UTF-8 text or a ``.gz`` that is not (complete) gzip.
    FileNotFoundError
        The file does not exist.

    Warns
    -----
    SWFWarning
        A job uses or asks for more processors than the header's ``MaxProcs`` (else
        ``MaxNodes``): one warning per file naming the first such line, the job and the limit
        (``warning.lines`` lists them all); a ``;`` line after the first job that looks like a
        header field (kept as a comment, not read).
    """
    path = Path(path)
    try:
        with _open_text(path) as fh:
            return _parse(fh, path=path, invalid=invalid)
    except UnicodeDecodeError as exc:
        raise SWFError(f"not UTF-8 text ({exc.reason})", path=path, line=_first_undecodable_line(path)) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise SWFError(f"not a readable gzip file ({type(exc).__name__}: {exc})", path=path) from None


def parse_swf(text: str, *, invalid: Literal["raise", "unknown"] = "raise") -> SWFTrace:
    """Parse SWF from a string; same rules and errors as :func:`read_swf` (line numbers count from 1)."""
    return _parse(io.StringIO(text.removeprefix("\ufeff"), newline=None), path=None, invalid=invalid)


def load_trace(name: str, *, invalid: Literal["raise", "unknown"] = "raise") -> SWFTrace:
    """Read a registered trace (``"theta_2022"``, ``"hpc2n"``, ...) through :mod:`lab.data`.

    Raises
    ------
    SWFError
        The data set is registered but is not an SWF trace.
    lab.data.DataError
        As :func:`lab.data.fetch`.
    """
    from lab import data

    info = data.info(name)
    if info.format != "swf":
        raise SWFError(f"data set {name!r} is {info.format}, not an SWF trace", path=info.path)
    return read_swf(data.fetch(name), invalid=invalid)


def _parse_header(lines: list[tuple[int, str]], path: Path | None) -> SWFHeader:
    values: dict[str, object] = {}
    queues: list[str] = []
    partitions: list[str] = []
    notes: list[str] = []
    last_key: str | None = None
    for lineno, raw in lines:
        m = _HEADER_RE.match(raw)
        if m is None:
            text = raw.lstrip(";").strip()
            if text and last_key == "Note":  # continuation of a multi-line note
                notes[-1] = f"{notes[-1]} {text}"
            elif text and last_key in ("Queue", "Partition"):
                (queues if last_key == "Queue" else partitions)[-1] += f" {text}"
            continue
        key, value = m.group(1), m.group(2)
        last_key = key
        if key == "Note":
            notes.append(value)
        elif key == "Queue":
            queues.append(value)
        elif key == "Partition":
            partitions.append(value)
        elif key in _HEADER_KEYS:
            attr = _HEADER_KEYS[key]
            if attr in _INT_HEADER_FIELDS:
                if not re.fullmatch(r"[+-]?[0-9]+", value):
                    raise SWFError(f"header value {value!r} is not an integer", path=path, line=lineno, field=key)
                if abs(int(value)) >= _HEADER_INT_LIMIT:
                    raise SWFError(f"header value {value} is out of range (|value| < 2**53)", path=path, line=lineno, field=key)
                values[attr] = int(value)
            else:
                values[attr] = value
    return SWFHeader(**values, queues=queues, partitions=partitions, notes=notes, lines=[raw for _, raw in lines])


def _parse(fh: Iterable[str], *, path: Path | None, invalid: str) -> SWFTrace:
    if invalid not in ("raise", "unknown"):
        raise ArgumentError("read_swf", "invalid", invalid, "must be 'raise' or 'unknown'")
    header_lines: list[tuple[int, str]] = []
    rows: list[list[str]] = []
    linenos: list[int] = []
    extras: list[list[str]] = []
    node_ids: list[tuple[int, ...]] = []
    extension: str | None = None
    header: SWFHeader | None = None
    comments: list[SWFComment] = []

    def fault(err: SWFError) -> SWFError:
        # Report the first bad line in file order: a bad value on an earlier job line comes first.
        if invalid == "raise" and rows:
            _convert(rows, np.asarray(linenos), path=path, invalid="raise", problems=[])
        return err

    for lineno, raw in enumerate(fh, start=1):
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(";"):
            if rows:  # a comment, not header: header fields come from the header block only
                comments.append(SWFComment(line=lineno, text=line, before_job=len(rows)))
            else:
                header_lines.append((lineno, line))
            continue
        if header is None:  # header faults come before any job line's
            header = _parse_header(header_lines, path)
        tokens = stripped.split()
        n = len(tokens)
        if n < 18:
            raise fault(SWFError(f"line has {n} fields, SWF needs 18", path=path, line=lineno, field=FIELDS[n]))
        if n > 18:
            if not tokens[18].startswith("{"):
                raise fault(
                    SWFError(f"line has {n} fields, SWF has 18 (unexpected {tokens[18]!r})", path=path, line=lineno, field=None)
                )
            if n != 21 or not tokens[18].endswith("}"):
                raise fault(
                    SWFError(
                        f"line has {n} fields; Alea's extended SWF has 21 (18 + {{node ids}} queue properties)",
                        path=path,
                        line=lineno,
                        field="node_ids",
                    )
                )
            if extension is None and rows:
                raise fault(SWFError("extended line in a plain SWF file (earlier lines had 18 fields)", path=path, line=lineno))
            extension = "alea"
            extras.append(tokens[18:])
        elif extension is not None:
            raise fault(SWFError("plain 18-field line in an extended SWF file", path=path, line=lineno, field="node_ids"))
        rows.append(tokens[:18])
        linenos.append(lineno)
        if extension is not None:
            braced = tokens[18]
            inner = braced[1:-1]
            try:
                node_ids.append(tuple(int(x) for x in inner.split(",")) if inner else ())
            except ValueError:
                raise fault(SWFError(f"node list {braced!r} is not comma-separated integers", path=path, line=lineno, field="node_ids")) from None

    if not rows:
        reason = "empty file: no header and no jobs" if not header_lines else "no jobs: the file has only header lines"
        raise SWFError(reason, path=path)
    problems: list[SWFError] = []
    lines = np.asarray(linenos)
    columns = _convert(rows, lines, path=path, invalid=invalid, problems=problems)
    jobs = pd.DataFrame(columns)
    if extension == "alea":
        jobs["node_ids"] = pd.Series(node_ids, dtype=object)
        jobs["queue_name"] = pd.array([e[1] for e in extras], dtype="string")
        jobs["properties"] = pd.array([e[2] for e in extras], dtype="string")
    keep = _repeated_ids(jobs["job_id"], lines, path=path, invalid=invalid, problems=problems)
    if not keep.all():
        jobs = jobs[keep].reset_index(drop=True)
        lines = lines[keep]
        kept_before = np.concatenate([[0], np.cumsum(keep)])  # jobs kept before each original position
        comments = [SWFComment(c.line, c.text, int(kept_before[c.before_job])) for c in comments]
        problems.sort(key=lambda e: e.line or 0)
    _warn_comment_headers(comments, path)
    _warn_oversized(jobs, lines, header, path)
    return SWFTrace(jobs=jobs, header=header, path=path, problems=tuple(problems), extension=extension, comments=tuple(comments))


def _where(path: Path | None) -> str:
    return str(path) if path is not None else "<swf text>"


def _repeated_ids(ids: pd.Series, lines: np.ndarray, *, path: Path | None, invalid: str, problems: list) -> np.ndarray:
    """Which jobs to keep (bool, shape ``(n_jobs,)``): all, unless a job number repeats an earlier one.

    ``invalid="raise"``: the first repeat in file order raises :class:`SWFError` naming the id and
    both lines; ``"unknown"``: every repeat is dropped and recorded in ``problems``.
    """
    known = ~ids.isna().to_numpy()
    values = ids.to_numpy(dtype=np.int64, na_value=-1)
    repeat = np.zeros(len(ids), dtype=bool)
    repeat[known] = pd.Series(values[known]).duplicated(keep="first").to_numpy()
    if not repeat.any():
        return np.ones(len(ids), dtype=bool)
    first_line = {}
    for i in np.flatnonzero(known & ~repeat):
        first_line.setdefault(int(values[i]), int(lines[i]))
    for i in np.flatnonzero(repeat):
        job, line, earlier = int(values[i]), int(lines[i]), first_line[int(values[i])]
        if invalid == "raise":
            raise SWFError(f"job id {job} repeats line {earlier} (job ids must be unique)", path=path, line=line, field="job_id")
        problems.append(SWFError(f"job id {job} repeats line {earlier}; this later job was dropped", path=path, line=line, field="job_id"))
    return ~repeat


def _warn_comment_headers(comments: list[SWFComment], path: Path | None) -> None:
    """One :class:`SWFWarning` if ``;`` lines after the first job look like header fields (not read)."""
    looks = [c for c in comments if (m := _HEADER_RE.match(c.text.strip())) and (m.group(1) in _HEADER_KEYS or m.group(1) in ("Queue", "Partition"))]
    if looks:
        first = looks[0]
        more = f" ({len(looks)} such lines)" if len(looks) > 1 else ""
        warnings.warn(
            SWFWarning(
                f"{_where(path)}, line {first.line}: {first.text.strip()[:80]!r} comes after the first job, so it is kept as a comment; "
                f"header fields are read from the header block only{more}",
                path=path, lines=tuple(c.line for c in looks), field=_HEADER_RE.match(first.text.strip()).group(1),
            ),
            stacklevel=4,
        )


def _warn_oversized(jobs: pd.DataFrame, lines: np.ndarray, header: SWFHeader, path: Path | None) -> None:
    """One :class:`SWFWarning` if a job uses or asks for more processors than the header's machine.

    The machine is ``MaxProcs``, else ``MaxNodes`` (as :class:`~lab.hpc.queue.QueueReplay`'s capacity).
    """
    key, limit = next(((k, v) for k, v in (("MaxProcs", header.max_procs), ("MaxNodes", header.max_nodes)) if v is not None and v > 0), (None, None))
    if limit is None or not len(jobs):
        return
    over = {}
    for name in ("allocated_processors", "requested_processors"):
        over[name] = (jobs[name] > limit).fillna(False).to_numpy(dtype=bool)
    any_over = over["allocated_processors"] | over["requested_processors"]
    if not any_over.any():
        return
    i = int(np.flatnonzero(any_over)[0])
    name = "allocated_processors" if over["allocated_processors"][i] else "requested_processors"
    count = int(any_over.sum())
    job = jobs["job_id"].iloc[i]
    more = f"; {count} jobs in all" if count > 1 else ""
    warnings.warn(
        SWFWarning(
            f"{_where(path)}, line {int(lines[i])}: job {'unknown' if pd.isna(job) else int(job)} has {name} = {int(jobs[name].iloc[i])}, "
            f"more than the header's {key}: {limit}{more} (a replay of this trace goes over capacity)",
            path=path, lines=tuple(int(x) for x in lines[any_over]), field=name,
        ),
        stacklevel=4,
    )


def _convert(rows: list[list[str]], linenos: np.ndarray, *, path, invalid: str, problems: list) -> dict[str, pd.api.extensions.ExtensionArray]:
    """Turn the (n, 18) token matrix into typed nullable columns, finding the first bad value in file order.

    Integer fields accept only integer literals (``12``, ``-1``; not ``1.0`` or ``1e3``) and are
    exact in int64; ``average_cpu_time`` is float64.
    """
    try:
        values = np.asarray(rows, dtype=np.float64)  # fast path: every token numeric
    except ValueError:
        values = np.empty((len(rows), 18))
        for j in range(18):
            values[:, j] = pd.to_numeric(pd.Series([r[j] for r in rows]), errors="coerce").to_numpy(dtype=np.float64)
    tokens = np.asarray(rows, dtype=str)
    literal = np.strings.isdecimal(np.strings.lstrip(tokens, "-"))  # integer literal (a bad '--5' fails as a number)
    faults: list[tuple[int, int, str]] = []  # (row, column, reason)
    exact: dict[tuple[int, int], int] = {}  # integers beyond float64's exact range, parsed from their tokens
    for j, name in enumerate(FIELDS):
        col = values[:, j]
        finite = np.isfinite(col) & (np.strings.find(tokens[:, j], "_") < 0)  # float() would accept 1_000
        for i in np.flatnonzero(~finite):
            faults.append((int(i), j, f"{rows[i][j]!r} is not a finite number"))
        if name not in _FLOAT_FIELDS:
            for i in np.flatnonzero(finite & ~literal[:, j]):
                faults.append((int(i), j, f"{rows[i][j]!r} is not an integer"))
            for i in np.flatnonzero(finite & literal[:, j] & (np.abs(col) >= 2.0**53)):
                value = int(rows[i][j])
                if value < 0:  # reported by the negative check below
                    continue
                if value >= 2**63:
                    faults.append((int(i), j, f"{rows[i][j]!r} is too large for a 64-bit integer"))
                else:
                    exact[int(i), j] = value
                    values[i, j] = 0  # placeholder, so the int64 cast below never overflows
        for i in np.flatnonzero(finite & (col < 0) & (col != -1)):
            faults.append((int(i), j, f"negative value {rows[i][j]}; SWF allows -1 (unknown) only"))
    if faults:
        faults.sort()
        if invalid == "raise":
            i, j, reason = faults[0]
            raise SWFError(reason, path=path, line=int(linenos[i]), field=FIELDS[j])
        for i, j, reason in faults:
            problems.append(SWFError(reason + "; kept as unknown", path=path, line=int(linenos[i]), field=FIELDS[j]))
            values[i, j] = -1
            exact.pop((i, j), None)
    out = {}
    for j, name in enumerate(FIELDS):
        col = values[:, j]
        unknown = col == -1
        if name in _FLOAT_FIELDS:
            out[name] = pd.arrays.FloatingArray(np.where(unknown, 0.0, col), mask=unknown)
        else:
            ints = np.where(unknown, 0, col).astype(np.int64)
            for (i, jj), value in exact.items():
                if jj == j:
                    ints[i] = value
            out[name] = pd.arrays.IntegerArray(ints, mask=unknown)
    return out


def _format_column(series: pd.Series) -> list[str]:
    if isinstance(series.dtype, pd.Float64Dtype):
        return ["-1" if v is pd.NA else repr(float(v)) for v in series]
    return [str(v) for v in series.fillna(-1).to_numpy(dtype=np.int64)]


def write_swf(trace: SWFTrace, path: str | Path) -> Path:
    """Write a trace as SWF (gzip-compressed when ``path`` ends in ``.gz``).

    Unknown values are written as -1; the comments after the first job go back between the
    jobs they were read between; the header's verbatim ``lines`` come
    first (when a trace has them they are the header: to write edited typed header
    fields, pass a header with ``lines=[]`` and it is rendered from the fields); Alea-extended traces keep their three extra tokens. Reading the
    file back with :func:`read_swf` gives an equal ``jobs`` table, header and comment texts.
    The file is written to a temporary name and renamed into place, so an
    existing file is never left half-written.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    cols = [_format_column(trace.jobs[name]) for name in FIELDS]
    if trace.extension == "alea":
        cols.append(["{" + ",".join(map(str, ids)) + "}" for ids in trace.jobs["node_ids"]])
        cols.append([str(v) for v in trace.jobs["queue_name"]])
        cols.append([str(v) for v in trace.jobs["properties"]])
    header = trace.header.lines or _synthesize_header(trace.header)
    job_lines = [" ".join(parts) for parts in zip(*cols)]
    for comment in reversed(sorted(trace.comments, key=lambda c: c.before_job)):  # back where they were, in file order
        job_lines.insert(min(comment.before_job, len(job_lines)), comment.text)
    body = "\n".join([*header, *job_lines]) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".gz":
        with gzip.open(tmp, "wt", encoding="utf-8") as fh:
            fh.write(body)
    else:
        tmp.write_text(body, encoding="utf-8")
    tmp.replace(path)
    return path


def _synthesize_header(header: SWFHeader) -> list[str]:
    inverse = {v: k for k, v in _HEADER_KEYS.items()}
    # exclude_defaults: a default header (a headerless file read back) is written as no header at all
    fields = header.model_dump(exclude={"lines", "queues", "partitions", "notes"}, exclude_defaults=True)
    lines = [f"; {inverse[attr]}: {value}" for attr, value in fields.items() if value is not None]
    lines += [f"; Queue: {q}" for q in header.queues] + [f"; Partition: {p}" for p in header.partitions]
    return lines + [f"; Note: {n}" for n in header.notes]
