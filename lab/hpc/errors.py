"""Errors of the HPC facet (``lab.hpc``): one hierarchy under :class:`lab.LabError`."""

from __future__ import annotations

from pathlib import Path

from lab import LabError

__all__ = [
    "HPCError",
    "SWFError",
    "SWFWarning",
    "ReplayError",
    "SiteError",
    "PolicyViolation",
    "SchedulerError",
    "SiteUnavailable",
    "TransferError",
    "SkillArgumentError",
    "ArgumentError",
    "UnknownSchedulerError",
    "PlacementError",
    "ContinuationError",
    "TestbedError",
]


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


class SWFWarning(UserWarning):
    """An SWF file reads, but something in it deserves the reader's attention (e.g. a job that asks for
    more processors than the header's machine has). Issued with :func:`warnings.warn`.

    Attributes
    ----------
    path : pathlib.Path or None
        The file (None for in-memory text).
    lines : tuple of int
        1-based line numbers of every job line concerned (the message names the first).
    field : str or None
        The SWF field (or header key) concerned.
    """

    def __init__(self, message: str, *, path: Path | str | None = None, lines: tuple[int, ...] = (), field: str | None = None):
        self.path = Path(path) if path is not None else None
        self.lines, self.field = tuple(lines), field
        super().__init__(message)


class ReplayError(HPCError, ValueError):
    """A queue replay was asked something the trace cannot answer (e.g. no wait times at all)."""


class SiteError(HPCError, ValueError):
    """A site description is invalid; names the file and the field."""

    def __init__(self, reason: str, *, path: Path | str | None = None, field: str | None = None):
        self.path = Path(path) if path is not None else None
        self.field, self.reason = field, reason
        where = str(self.path) if self.path is not None else "<site>"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {reason}")


class PolicyViolation(HPCError, ValueError):
    """A request breaks a site's limits (nodes, walltime, partition, account); refused before submission.

    Attributes: ``site``, ``limit`` (which limit, e.g. ``"max_nodes"``), ``requested`` and ``allowed``.
    """

    def __init__(self, site: str, limit: str, requested, allowed, detail: str = ""):
        self.site, self.limit, self.requested, self.allowed = site, limit, requested, allowed
        allowed_text = f"one of {allowed!r}" if isinstance(allowed, (list, tuple)) else f"at most {allowed!r}"
        super().__init__(f"site {site!r} refuses {limit}={requested!r}: allowed {allowed_text}" + (f" ({detail})" if detail else ""))


class SchedulerError(HPCError, RuntimeError):
    """A scheduler command failed (e.g. sbatch exited non-zero); carries the command and its stderr."""

    def __init__(self, site: str, command: list[str] | str, returncode: int | None, stderr: str):
        self.site, self.command, self.returncode, self.stderr = site, command, returncode, stderr
        cmd = command if isinstance(command, str) else " ".join(command)
        super().__init__(f"site {site!r}: `{cmd}` failed (exit {returncode}): {stderr.strip()[:500]}")


class SiteUnavailable(SchedulerError):
    """The site's scheduler does not answer (controller down, timeout)."""


class TransferError(HPCError, RuntimeError):
    """A data transfer failed or its checksum did not match."""


def clip_text(text: str, limit: int = 200) -> str:
    """``text`` cut to at most ``limit`` characters (the cut marked with how much was left out), so an
    error never echoes a huge input back."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... [{len(text) - limit + 40} more characters]"


class ArgumentError(HPCError, ValueError):
    """An argument of a ``lab.hpc`` function or constructor is refused (a negative timeout, an unknown
    choice, a non-finite time, ...). Nothing was started or changed.

    Attributes
    ----------
    where : str
        The function or class that refused it (``"QueueReplay"``, ``"LocalTransfer.wait"``, ...).
    field : str
        The argument's name (``"capacity"``, ``"timeout_s"``, ...).
    value : object
        The refused value (the message shows at most a couple of hundred characters of it).
    reason : str
        What the argument must be.
    """

    def __init__(self, where: str, field: str, value, reason: str):
        self.where, self.field, self.value, self.reason = where, field, value, reason
        super().__init__(f"{where}: {field}={clip_text(repr(value))}: {reason}")


class UnknownSchedulerError(SiteError):
    """A site names a scheduler no adapter is registered for (see
    :func:`lab.hpc.schedulers.base.register_scheduler`).

    Attributes: ``name`` (the unknown name), ``registered`` (the names that are registered, sorted),
    plus :class:`SiteError`'s ``path`` and ``field`` (``"scheduler"``).
    """

    def __init__(self, name: str, registered, *, path: Path | str | None = None):
        self.name, self.registered = name, sorted(registered)
        super().__init__(f"no scheduler adapter named {clip_text(repr(name))}; registered: {self.registered}", path=path, field="scheduler")


class PlacementError(HPCError):
    """No site can take the job (all refuse it or are unavailable); the message lists why, per site.
    (Defined here; :mod:`lab.hpc.placement` re-exports it.)"""


class ContinuationError(HPCError):
    """A continuation cannot be registered or its handler cannot be found.
    (Defined here; :mod:`lab.hpc.continuation` re-exports it.)"""


class TestbedError(HPCError, RuntimeError):
    """The Slurm testbed could not be started, inspected or stopped; the message says why.
    (Defined here; :mod:`lab.hpc.testbed` re-exports it.)"""

    __test__ = False  # not a pytest test class


class SkillArgumentError(HPCError, ValueError):
    """A skill's argument is refused (an unknown site, a path outside its endpoint, a job this
    federation did not submit there, ...). Nothing was submitted, moved or read.

    Attributes
    ----------
    skill : str
        The skill (``"retrieve_results"``, ...).
    field : str
        The argument at fault, as a dotted path (``"source_endpoint"``, ``"request.account"``).
    reason : str
        What is wrong (long inputs are cut: the message never echoes more than a few hundred characters).
    """

    def __init__(self, skill: str, field: str, reason: str):
        self.skill, self.field, self.reason = skill, field, clip_text(reason, 600)
        super().__init__(f"{skill}: field {field!r}: {self.reason}")
