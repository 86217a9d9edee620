"""Continuation handlers used by the tests (importable by name, as a restarted kernel needs)."""

from __future__ import annotations

from pathlib import Path


def record(event, continuation, *, path: str, tag: str = ""):
    """Append one line per call to ``path`` (so the test can count calls) and return what it saw."""
    with Path(path).open("a") as fh:
        fh.write(f"{continuation.id} {event.kind} {event.key} {tag}\n")
    return {"kind": event.kind, "key": event.key, "exit_code": event.payload.get("exit_code"), "tag": tag}


def explode(event, continuation):
    raise RuntimeError("handler failed on purpose")
