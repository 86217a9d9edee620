"""Hot-swap fault tolerance for data-parallel training (PHOENIX, arXiv 2607.01646, re-implemented on
torch.distributed/gloo): per-step ping-pong in-memory snapshots, peer replication of the
non-reconstructible optimizer shard off the critical path, failure classification, communicator
reconstruction with an idle spare in the failed rank's logical place, rollback to the last committed
generation, disk-checkpoint fallback for corrupt or missing replicas.

Modules: :mod:`.snapshot` (ping-pong buffers), :mod:`.config`, :mod:`.worker` (a rank or spare),
:mod:`.coordinator` (spawn, detect, classify, swap, resume).
"""

from lab.training.resilience.config import FaultPlan, ResilienceConfig
from lab.training.resilience.coordinator import (FailureRecord, NoSpareError, RecoveryError, ResilientRun, RunOutcome,
                                                 run_resilient)
from lab.training.resilience.snapshot import HostBuffer, PingPong, SnapshotError, checksum

__all__ = ["FailureRecord", "FaultPlan", "HostBuffer", "NoSpareError", "PingPong", "RecoveryError", "ResilienceConfig",
           "ResilientRun", "RunOutcome", "SnapshotError", "checksum", "run_resilient"]
