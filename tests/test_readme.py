"""The README's Python snippets run as written, in order, in one namespace, in a fresh folder.

This is what a new user does first, so it runs in the fresh-clone stage of CI as well (``.ci/run``).
The training snippet starts three background ``torchrun`` jobs of 300 steps: the test waits until
every run has logged its first step, then stops them (finishing them would take minutes).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[tuple[str, str]]:
    """(the section heading above it, the code) of every ```python block in the README, in order."""
    text = README.read_text()
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S):
        heading = re.findall(r"^#+ (.+)$", text[: m.start()], re.M)[-1]
        out.append((heading, m.group(1)))
    return out


def _stop(procs) -> None:
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=60)
        except Exception:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_readme_has_the_snippets_this_test_knows():
    assert [h for h, _ in snippets()] == [
        "Using the lab from Python",
        "Using the lab from Python",
        "Provenance of agent runs",
        "Rollback repair of an agent's memory (`lab.provenance.repair`)",
        "Distributed training and gradient communication",
        "Performance model of distributed training",
        "Image restoration with flow priors",
        "Video generation with a chain of experts (ConFiner)",
    ]


@pytest.mark.slow
def test_every_readme_snippet_runs_in_a_fresh_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ns: dict = {}
    (queues, dashboard, provenance, rollback, training, perfmodel, restoration, video) = [code for _, code in snippets()]

    exec(compile(queues, "README.md (queues)", "exec"), ns)
    assert len(ns["trace"]) == 23_911 and ns["replay"].snapshot(ns["t"]).pending >= 0

    exec(compile(dashboard, "README.md (dashboard)", "exec"), ns)

    exec(compile(provenance, "README.md (provenance)", "exec"), ns)
    nodes = len(ns["graph"].nodes())
    assert ns["hits"] and nodes > 0
    ns["graph"].close()
    # the same snippet again in the same folder: the ingest finds the same runs and writes nothing
    assert ns["report"].runs == 200 and not ns["report"].already_present
    exec(compile(provenance, "README.md (provenance, again)", "exec"), ns)
    assert ns["report"].already_present and ns["report"].present == 200 and ns["report"].runs == 0
    assert len(ns["graph"].nodes()) == nodes

    exec(compile(rollback, "README.md (rollback repair)", "exec"), ns)
    from lab.provenance.repair.evaluate import run_oracle

    assert ns["result"].replayed and ns["result"].answer == run_oracle(ns["case"]).trace.answer
    ns["graph"].close()

    exec(compile(training, "README.md (training)", "exec"), ns)
    procs = ns["procs"]
    try:
        from lab.training.monitor import RunMonitor

        monitor = RunMonitor(tmp_path / "runs" / "events.sqlite")
        deadline = time.monotonic() + 300
        while True:
            runs = monitor.runs()
            started = set(runs.loc[runs["last_step"] >= 1, "run_id"]) if len(runs) else set()
            if started == set(procs):
                break
            failed = {name: p.returncode for name, p in procs.items() if p.poll() not in (None, 0)}
            assert not failed, (failed, (tmp_path / "runs" / next(iter(failed)) / "launch.log").read_text()[-3000:])
            assert time.monotonic() < deadline, f"runs with a logged step after 300 s: {sorted(started)} of {sorted(procs)}"
            time.sleep(1)
    finally:
        _stop(procs)

    exec(compile(perfmodel, "README.md (performance model)", "exec"), ns)
    assert ns["llemma"].world_size == 16

    exec(compile(restoration, "README.md (restoration)", "exec"), ns)
    assert tuple(ns["out"].x.shape) == (8, 1, 28, 28) and ns["out"].nfe == 20

    exec(compile(video, "README.md (video)", "exec"), ns)
    assert tuple(ns["g"].video.shape) == (4, 8, 32, 32) and ns["g"].nfe == 19
