"""One way for the tests to run a function on several gloo ranks (``torch.multiprocessing.spawn``, one process a
rank, a TCP rendezvous on a free 127.0.0.1 port) and to tear the group down without a crash at exit.

The teardown is ordered. A run of 1,572 tests once aborted rank 0 with ``terminate called without an active
exception`` (SIGABRT) after its body had returned. The body's DDP reducer and comm-hook state form reference
cycles that hold the process group, so the group's C++ threads could outlive ``destroy_process_group`` and die
in the interpreter's finalization. So the body runs in its own frame; its garbage is collected while the
interpreter is whole; a barrier keeps any rank from tearing down while another still talks; then the group is
destroyed and collected.
"""

from __future__ import annotations

import datetime
import gc
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.browser import free_port

Body = Callable[[int, int, str], None]
"""``body(rank, world, outdir)``: a module-level function (it is pickled to each spawned process)."""


def _entry(rank: int, world: int, init: str, outdir: str, body: Body, timeout_s: float, barrier: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    ok = False
    try:
        body(rank, world, outdir)
        ok = True
    finally:
        gc.collect()
        if ok and barrier:
            dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def run_ranks(body: Body, world: int, outdir: str | Path, *, timeout_s: float = 60.0, barrier: bool = True) -> None:
    """Run ``body`` on ``world`` gloo ranks and wait for all; raises ``ProcessRaisedException`` or
    ``ProcessExitedException`` (torch.multiprocessing) when a rank fails. ``barrier=False`` for a body that
    ends the group in an error (a barrier there would wait ``timeout_s`` for a rank that has left)."""
    mp.spawn(_entry, args=(world, f"tcp://127.0.0.1:{free_port()}", str(outdir), body, timeout_s, barrier),
             nprocs=world, join=True)
