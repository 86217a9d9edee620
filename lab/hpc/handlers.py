"""Ready-made continuation handlers (``"lab.hpc.handlers:<name>"`` in :func:`lab.hpc.skills.submit_task`)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["collect_output"]


def collect_output(event, continuation, *, stdout: str, max_bytes: int = 4096) -> dict:
    """Retrieve a finished job's results when its event arrives: state, exit code, the end of its
    output file (``stdout``, at most ``max_bytes`` bytes) and the job's times (epoch seconds)."""
    path = Path(stdout)
    text = None
    if path.is_file():
        data = path.read_bytes()
        text = data[-max_bytes:].decode("utf-8", errors="replace")
    p = event.payload
    return {
        "job": event.key,
        "event": event.kind,
        "exit_code": p.get("exit_code"),
        "start_time": p.get("start_time"),
        "end_time": p.get("end_time"),
        "stdout": text,
    }
