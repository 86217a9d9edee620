"""Crash safety of the MemTX commit: a real child process is SIGKILLed at a random point inside commit, 100
times on each backend; every time the store is at exactly the old state (staged, clock unchanged) or the new
one (everything committed, the rival superseded), never in between."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from lab.provenance.txn import MemTXStore, State
from tests.memtx_support import backend_where, rec  # noqa: F401  (fixtures; pg_server comes from conftest)

KILLS = 100
POINTS = ["commit:begin", "commit:ticked", "commit:validated:0", "commit:validated:1", "commit:validated:2",
          "commit:committed:0", "commit:committed:1", "commit:committed:2", "commit:end"]


def _child(where: str, i: int, to_parent: int, from_parent: int) -> None:
    def hook(point: str) -> None:
        os.write(to_parent, (point + "\n").encode())
        os.read(from_parent, 1)  # wait for the parent's go (or its SIGKILL)

    try:
        s = MemTXStore(where)
        tx = s.begin("child")
        tx.stage(rec(f"a{i}", ent=f"e{i}", val="new", auth=0.9))
        tx.stage(rec(f"b{i}", ent=f"f{i}", val="new"))
        tx.stage(rec(f"s{i}", ent=f"g{i}", typ="summary", parents=[f"a{i}"]))
        s.hook = hook
        os.write(to_parent, b"ready\n")
        os.read(from_parent, 1)
        tx.commit()
        os.write(to_parent, b"done\n")
    finally:
        os._exit(0)


def _lines(fd: int, buf: list[str]) -> str:
    while "\n" not in buf[0]:
        chunk = os.read(fd, 4096).decode()
        if not chunk:
            return ""
        buf[0] += chunk
    line, buf[0] = buf[0].split("\n", 1)
    return line


@pytest.mark.slow
def test_sigkill_mid_commit_leaves_old_or_new_state(backend_where):
    rng = random.Random(19)
    store = MemTXStore(backend_where)
    outcomes = {"old": 0, "new": 0}
    for i in range(KILLS):
        tx = store.begin("setup")
        tx.stage(rec(f"rival{i}", ent=f"e{i}", val="old", auth=0.5))
        assert tx.commit().committed
        to_parent_r, to_parent_w = os.pipe()
        from_parent_r, from_parent_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(to_parent_r)
            os.close(from_parent_w)
            _child(backend_where, i, to_parent_w, from_parent_r)
        os.close(to_parent_w)
        os.close(from_parent_r)
        buf = [""]
        assert _lines(to_parent_r, buf) == "ready"
        clock0 = store.now()
        audit0 = len(store.audit())
        kill_at = rng.randrange(len(POINTS) + 1)  # len(POINTS): let it finish, then kill
        os.write(from_parent_w, b"g")
        for k, point in enumerate(POINTS):
            assert _lines(to_parent_r, buf) == point
            if k == kill_at:
                time.sleep(rng.random() * 0.002)  # die at the hook, or a little later inside the next statements
                os.kill(pid, signal.SIGKILL)
                break
            os.write(from_parent_w, b"g")
        else:
            assert _lines(to_parent_r, buf) == "done"
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(to_parent_r)
        os.close(from_parent_w)
        ids = [f"a{i}", f"b{i}", f"s{i}", f"rival{i}"]
        deadline = time.time() + 10
        while True:  # PostgreSQL notices the dead client at once; SQLite recovers from the WAL on open
            states = {r: store.state(r) for r in ids}
            clock = store.now()
            if states[f"a{i}"] != State.TENTATIVE or clock == clock0 or time.time() > deadline:
                break
        old = {f"a{i}": State.TENTATIVE, f"b{i}": State.TENTATIVE, f"s{i}": State.TENTATIVE, f"rival{i}": State.COMMITTED}
        new = {f"a{i}": State.COMMITTED, f"b{i}": State.COMMITTED, f"s{i}": State.COMMITTED, f"rival{i}": State.SUPERSEDED}
        if states == old:
            assert clock == clock0 and len(store.audit()) == audit0, f"kill {i} at {kill_at}: old states but clock/audit moved"
            outcomes["old"] += 1
        else:
            assert states == new, f"kill {i} at {POINTS[kill_at] if kill_at < len(POINTS) else 'after commit'}: half-committed {states}"
            assert clock == clock0 + 1
            # the versions and the heads agree
            for r in ids:
                assert store.history(r)[-1][1] == states[r]
            outcomes["new"] += 1
    assert outcomes["old"] > 50 and outcomes["new"] >= 1, outcomes
    store.close()
