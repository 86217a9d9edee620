"""lab.training.resilience: ping-pong snapshots, and hot swap in real multi-process gloo runs (CI-sized)."""

from __future__ import annotations

import time

import pytest
import torch

from lab.events import EventLog
from lab.training.monitor import KIND_STATUS, KIND_SWAP, RunMonitor
from lab.training.resilience import FaultPlan, NoSpareError, PingPong, ResilienceConfig, SnapshotError, run_resilient


# ---------------------------------------------------------------------------------------------- snapshots
def _layout():
    return {"params": torch.zeros(1000), "meta": torch.zeros(2, dtype=torch.int64)}


def test_torn_write_leaves_previous_generation_committed():
    pp = PingPong(_layout())
    pp.write(3, {"params": torch.full((1000,), 3.0), "meta": torch.tensor([3, 3])})
    pp.write(4, {"params": torch.full((1000,), 4.0), "meta": torch.tensor([4, 4])})

    class Killed(Exception):
        pass

    def die(name):  # the writer dies after copying the parameters, before the rest
        if name == "params":
            raise Killed

    with pytest.raises(Killed):
        pp.write(5, {"params": torch.full((1000,), 5.0), "meta": torch.tensor([5, 5])}, between=die)
    # generation 5 half-written into generation 3's buffer: neither 3 nor 5 is readable, 4 is intact
    assert pp.committed() == [4]
    assert torch.equal(pp.get(4).tensors["params"], torch.full((1000,), 4.0))
    for g in (3, 5):
        with pytest.raises(SnapshotError, match=f"generation {g} is not committed"):
            pp.get(g)


def test_replica_written_every_k_generations_keeps_the_newest_through_a_torn_write():
    # generations 0, 4, 8 all have even parity: the replica must alternate its buffers by age, not parity
    pp = PingPong(_layout())
    for g in (0, 4):
        buf = pp.begin(g, pp.index_for(g))
        buf.tensors["params"].fill_(float(g))
        pp.commit(buf, g)
    assert pp.committed() == [0, 4]
    torn = pp.begin(8, pp.index_for(8))  # the sender dies mid-transfer: 8 is never committed
    torn.tensors["params"].fill_(-1.0)
    assert pp.committed() == [4]
    assert torch.equal(pp.get(4).tensors["params"], torch.full((1000,), 4.0))
    assert pp.index_for(4) == pp.index_of(pp.get(4))  # the same generation again: its own buffer


def test_replica_interval_schedule_and_dropout_fallback(tmp_path):
    cfg = ResilienceConfig(run_dir=tmp_path, replica_interval=4)
    assert [g for g in range(10) if cfg.replicated(g, start=0)] == [0, 4, 8]
    assert [g for g in range(5, 10) if cfg.replicated(g, start=5)] == [5, 8]  # an epoch's first generation too
    drop = ResilienceConfig(run_dir=tmp_path, replica_interval=4, model={"block_size": 32, "n_layer": 2, "n_head": 2,
                                                                         "d_model": 32, "dropout": 0.1})
    assert drop.effective_replica_interval == 1  # a replay could not know the lost rank's RNG state
    with pytest.raises(ValueError, match="replica_interval"):
        ResilienceConfig(run_dir=tmp_path, replica_interval=0)


def test_corrupted_buffer_is_refused_by_checksum():
    pp = PingPong(_layout())
    pp.write(7, {"params": torch.arange(1000.0), "meta": torch.tensor([7, 7])})
    pp.buffers[1].tensors["params"][10] += 1.0  # silent corruption after the commit
    assert not pp.buffers[1].verify()
    with pytest.raises(SnapshotError, match="generation 7 fails its CRC-32"):
        pp.get(7)
    buf = pp.begin(9)
    buf.tensors["params"].fill_(9.0)
    with pytest.raises(SnapshotError, match="generation 9: received bytes"):
        pp.commit(buf, 9, crc=12345)  # a transfer whose bytes do not match the sender's checksum
    assert pp.committed() == []


def test_layout_mismatch_is_refused():
    pp = PingPong(_layout())
    with pytest.raises(SnapshotError, match="'params'"):
        pp.write(1, {"params": torch.zeros(999), "meta": torch.zeros(2, dtype=torch.int64)})
    assert pp.committed() == []


def test_monitor_tells_a_replaced_rank_from_a_dead_one(tmp_path):
    log = EventLog(tmp_path / "events.sqlite")
    for run in ("swapped", "crashed"):
        for rank, pid in ((0, 100), (1, 101)):
            log.append(f"rank{rank}", KIND_STATUS, run, {"rank": rank, "state": "heartbeat", "step": 3, "pid": pid, "host": "h"})
    log.append("coordinator", KIND_SWAP, "swapped", {"rank": 1, "old_worker": 1, "old_pid": 101, "new_worker": 2, "new_pid": 102,
                                                     "generation": 3, "restore": "memory"})
    log.close()
    later = time.time() + 100  # every heartbeat is stale by then
    with RunMonitor(tmp_path / "events.sqlite", heartbeat_timeout_s=30) as mon:
        assert mon.status("swapped", now=later)["state"].tolist() == ["dead", "replaced"]
        assert mon.status("crashed", now=later)["state"].tolist() == ["dead", "dead"]
        assert mon.status("swapped", now=later).loc[1, "replaced_pids"] == [101]
        assert mon.swaps("crashed").empty


# ---------------------------------------------------------------------------------------------- real runs
STEPS = 8


def _cfg(tmp_path, name, **kw):
    base = dict(run_dir=tmp_path / name, workers=2, spares=1, steps=STEPS, timeout_s=4.0, grace_s=3.0)
    base.update(kw)
    return ResilienceConfig(**base)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (2 workers, 1 idle spare)."""
    return run_resilient(_cfg(tmp_path_factory.mktemp("ref"), "ref"), timeout=120)


def test_sigkilled_rank_is_replaced_bit_identically(tmp_path, reference):
    events = tmp_path / "events.sqlite"
    out = run_resilient(_cfg(tmp_path, "kill", events_path=events, faults=[FaultPlan(step=4, rank=1, phase="collective")]),
                        timeout=120)
    assert reference.failures == []
    [f] = out.failures
    assert (f.kind, f.rank, f.worker, f.replacement, f.restore) == ("killed", 1, 1, 2, "memory")
    assert "SIGKILL" in f.detail
    assert out.members == {0: 0, 1: 2}
    assert f.generation >= 2 and f.steps_lost <= 1
    assert out.step == STEPS
    assert out.param_sha256 == reference.param_sha256
    # the resumed epoch's losses (steps generation+1 .. STEPS) are the uninterrupted run's
    assert min(out.losses) == f.generation + 1 and max(out.losses) == STEPS
    assert all(out.losses[s] == reference.losses[s] for s in out.losses)
    assert f.recovery_s < 10
    # the monitor: which process took which rank, the resumed curve without a gap, every rank finished
    with RunMonitor(events) as mon:
        swaps = mon.swaps("kill")
        assert swaps[["rank", "old_worker", "old_pid", "new_worker", "new_pid", "kind"]].values.tolist() == [
            [1, 1, f.pid, 2, f.replacement_pid, "killed"]]
        st = mon.status("kill")
        assert st.loc[1, "replaced_pids"] == [f.pid] and st.loc[1, "pid"] == f.replacement_pid
        assert set(st["state"]) == {"finished"} and mon.run_state("kill") == "finished"
        m = mon.metrics("kill")
        assert m.index.tolist() == list(range(1, STEPS + 1))
        assert m["loss"].tolist() == [reference.losses[s] for s in range(1, STEPS + 1)]
    from widgets.training_monitor import TrainingMonitor

    view = TrainingMonitor(events, heartbeat_timeout_s=60)
    view.refresh()
    assert f"worker 2 (pid {f.replacement_pid}) took it from worker 1 (pid {f.pid})" in view.table.value
    assert f"swapped in for pid {f.pid}" in view.table.value and f"{STEPS} / {STEPS}" in view.table.value


@pytest.mark.parametrize("write", ["copy", "optimizer"])
def test_kill_mid_snapshot_never_resumes_a_torn_generation(tmp_path, reference, write):
    # copy: rank 1 dies inside its snapshot thread, between the parameter-shard and the moments copy of
    # generation 5: its generation 5 is torn and never replicated (its peer holds 4). The survivors
    # committed 5, so rank 1's shard of 5 is replayed from replica 4 plus the gradient its peer kept.
    # optimizer: the update itself writes generation 5 into its buffer, and rank 1 dies between the shard
    # and the moments: step 5 never completed anywhere (the survivors wait in its all-gather), so the run
    # resumes from generation 4. Either way 0 completed steps lost, bit-identical, nothing read from the
    # torn buffer
    out = run_resilient(_cfg(tmp_path, "torn", snapshot_write=write, faults=[FaultPlan(step=5, rank=1, phase="snapshot_copy")]),
                        timeout=120)
    [f] = out.failures
    assert f.kind == "killed" and f.restore == "memory"
    assert (f.generation, f.replayed, f.steps_lost) == ((5, True, 0) if write == "copy" else (4, False, 0))
    assert out.param_sha256 == reference.param_sha256


def test_optimizer_written_generations_train_the_same_bits_as_copied_ones(tmp_path, reference):
    # the reference writes generations from the optimizer (auto on the CPU); the update in place plus a copy
    # and protection off must give the same parameters and losses
    for write, protect in (("copy", "on"), ("optimizer", "off"), ("copy", "alternate"), ("optimizer", "alternate")):
        out = run_resilient(_cfg(tmp_path, f"{write}-{protect}", snapshot_write=write, protect=protect, block_steps=3), timeout=120)
        assert out.param_sha256 == reference.param_sha256, (write, protect)
        assert out.losses == reference.losses


@pytest.mark.parametrize("interval", [1, 4])
def test_kill_before_replication_loses_no_completed_step(tmp_path, reference, interval):
    # rank 0 dies in its snapshot thread after committing generation 6, before any transfer of it: its peer
    # holds replica 5 (every generation replicated) or 4 (every 4th), and the spare replays the optimizer
    # steps from there with the gradient shards the peer kept: 0 lost, bit-identical
    out = run_resilient(_cfg(tmp_path, "send", replica_interval=interval,
                             faults=[FaultPlan(step=6, rank=0, phase="snapshot_send")]), timeout=120)
    [f] = out.failures
    assert (f.rank, f.generation, f.replayed, f.replayed_from, f.steps_lost) == (0, 6, True, 5 if interval == 1 else 4, 0)
    assert out.param_sha256 == reference.param_sha256
    assert all(out.losses[s] == reference.losses[s] for s in out.losses)


def test_replay_of_several_steps_from_an_older_replica(tmp_path, reference):
    # every 4th generation replicated: rank 1 dies right after step 7, its peer's newest replica is 4 and the
    # survivor committed 7; the spare replays steps 5, 6, 7 on replica 4 (0 lost), and the resumed epoch
    # replicates its first generation so the spare's own peer holds it at once
    out = run_resilient(_cfg(tmp_path, "multi", replica_interval=4,
                             faults=[FaultPlan(step=7, rank=1, phase="step")]), timeout=120)
    [f] = out.failures
    assert (f.generation, f.replayed, f.replayed_from, f.steps_lost) == (7, True, 4, 0)
    assert out.param_sha256 == reference.param_sha256
    assert all(out.losses[s] == reference.losses[s] for s in out.losses)
    # the resumed epoch's snapshot threads (per worker: survivor 0, spare 2) handled two generations each:
    # 7 again (sent to the peer, though not a multiple of 4) and 8
    assert out.snapshot_generations == {0: 2, 2: 2}


def test_corrupted_replica_is_refused_and_disk_checkpoint_used(tmp_path, reference):
    faults = [FaultPlan(step=6, rank=0, kind="corrupt_replica"), FaultPlan(step=6, rank=1)]
    out = run_resilient(_cfg(tmp_path, "corrupt", disk_interval=4, faults=faults), timeout=120)
    [f] = out.failures
    assert f.replica_problems, "the corrupted replica was not reported"
    assert all("replica of rank 1 generation" in p and "held by rank 0" in p and "CRC-32" in p for p in f.replica_problems)
    assert (f.restore, f.generation) == ("disk", 4)
    assert out.param_sha256 == reference.param_sha256


def test_two_failures_with_one_spare_name_the_missing_spare(tmp_path):
    faults = [FaultPlan(step=2, rank=1), FaultPlan(step=4, rank=0)]
    t0 = time.monotonic()
    with pytest.raises(NoSpareError) as info:
        run_resilient(_cfg(tmp_path, "two", faults=faults), timeout=120)
    msg = str(info.value)
    assert "rank 0 (worker 0" in msg and "no spare is left" in msg and "1 spare(s)" in msg
    assert "worker 2 took rank 1" in msg
    assert time.monotonic() - t0 < 60


# ---------------------------------------------------------------------------------------------- flat generations, copier
def test_generation_is_one_flat_buffer_filled_from_parts():
    pp = PingPong({"state": torch.zeros(6), "meta": torch.zeros(2, dtype=torch.int64)})
    shard, moments = torch.arange(2.0), torch.arange(10.0, 14.0)
    buf = pp.write(1, {"state": [shard, moments], "meta": torch.tensor([1, 1])})
    assert buf.tensors["state"].tolist() == [0.0, 1.0, 10.0, 11.0, 12.0, 13.0] and pp.committed() == [1]
    with pytest.raises(SnapshotError, match="'state': parts hold 5 elements, the layout 6"):
        pp.write(2, {"state": [shard, moments[:3]], "meta": torch.tensor([2, 2])})
    with pytest.raises(SnapshotError, match="'state' part 1: needs contiguous torch.float32"):
        pp.write(2, {"state": [shard, torch.zeros(4, dtype=torch.float64)], "meta": torch.tensor([2, 2])})
    assert pp.committed() == [1]


def test_trusted_replica_commit_is_still_refused_when_read():
    pp = PingPong({"state": torch.zeros(4)})
    src = PingPong({"state": torch.zeros(4)})
    good = src.write(3, {"state": torch.arange(4.0)})
    dst = pp.begin(3)
    dst.tensors["state"].copy_(good.tensors["state"])
    dst.tensors["state"][0] = 99.0  # damaged in transit
    pp.commit(dst, 3, good.crc, trust=True)  # the receive path records the sender's CRC without a pass
    assert pp.committed() == [3]
    with pytest.raises(SnapshotError, match="generation 3 fails its CRC-32"):
        pp.get(3)


def test_a_generation_is_one_message_with_its_header():
    layout = {"state": torch.zeros(7), "meta": torch.zeros(2, dtype=torch.int64), "rng": torch.zeros(5, dtype=torch.uint8)}
    sender, receiver = PingPong(layout), PingPong(layout)
    buf = sender.write(6, {"state": torch.arange(7.0), "meta": torch.tensor([6, 6]), "rng": torch.arange(5, dtype=torch.uint8)})
    # every tensor is a view into the wire, 64-byte aligned after the 16-byte header
    base = buf.wire.data_ptr()
    assert [t.data_ptr() - base for t in buf.tensors.values()] == [16, 16 + 64, 16 + 128]
    assert buf.wire.numel() == 16 + 3 * 64 and buf.crc == buf.compute_crc()
    buf.set_header(6, buf.crc)
    dst = receiver.begin(6)
    dst.wire.copy_(buf.wire)  # the transfer
    assert dst.header() == (6, buf.crc)
    receiver.commit(dst, 6, dst.header()[1])  # checked against the sender's CRC
    assert torch.equal(receiver.get(6).tensors["state"], torch.arange(7.0))
    dst.wire[16 + 40] = 1  # a padding byte is checksummed too: a damaged message is refused when read
    with pytest.raises(SnapshotError, match="generation 6 fails its CRC-32"):
        receiver.get(6)
    bad = receiver.begin(7)
    bad.wire.copy_(buf.wire)
    bad.payload[0] ^= 0xFF
    with pytest.raises(SnapshotError, match="received bytes have CRC-32"):
        receiver.commit(bad, 7, buf.crc)
    assert receiver.committed() == [6]


def _replicate_body(rank: int, world: int, outdir: str) -> None:
    """Two ranks, the snapshot thread on the default group: generations 1..3, each one message to the peer."""
    import torch.distributed as dist

    from lab.training.resilience.worker import Snapshotter

    layout = {"state": torch.zeros(1000), "meta": torch.zeros(2, dtype=torch.int64)}
    local, replica = PingPong(layout), PingPong(layout)
    snap = Snapshotter(local, replica, rank, world, dist.group.WORLD)
    try:
        for g in (1, 2, 3):
            snap.submit(g, {"state": torch.full((1000,), 10.0 * rank + g), "meta": torch.tensor([g, g])})
            snap.wait_copied()
            snap.drain(30)
            assert replica.committed() == ([g - 1, g] if g > 1 else [1])
    finally:
        snap.stop()
    peer = (rank - 1) % world
    assert replica.committed() == [2, 3] and snap.generations == 3
    assert torch.equal(replica.get(3).tensors["state"], torch.full((1000,), 10.0 * peer + 3))  # CRC verified
    torch.save({"ok": True}, f"{outdir}/rank{rank}.pt")


def test_snapshotter_replicates_each_generation_to_the_peer(tmp_path):
    from tests.gloo_support import run_ranks

    run_ranks(_replicate_body, 2, tmp_path)
    assert all((tmp_path / f"rank{r}.pt").is_file() for r in range(2))


def _snapshot_then_overwrite(device, use_stream):
    """What a worker does: submit generation 1 of the live state, run on, wait for the copy only right
    before the 'optimizer step' overwrites the state in place; the committed generation must hold the
    values from before the overwrite."""
    from lab.training.resilience.snapshot import DeviceCopier
    from lab.training.resilience.worker import Snapshotter

    copier = DeviceCopier(device, use_stream=use_stream)
    n = 1 << 20
    shard, moments = torch.randn(n, device=device), torch.randn(2 * n, device=device)
    layout = {"state": torch.zeros(3 * n), "meta": torch.zeros(2, dtype=torch.int64)}
    local, replica = PingPong(layout, pin_memory=copier.pin_memory), PingPong(layout, pin_memory=copier.pin_memory)
    expected = torch.cat([shard, moments]).cpu()
    snap = Snapshotter(local, replica, 0, 1, None, copier=copier)
    try:
        snap.submit(1, {"state": [shard, moments], "meta": torch.tensor([1, 1])})
        _ = (shard @ shard) + moments.sum()  # the next step's forward: reads only
        snap.wait_copied()
        shard.mul_(-1.0).add_(1.0)  # the optimizer step, in place
        moments.zero_()
        snap.drain(30)
    finally:
        snap.stop()
    buf = local.get(1)  # committed, checksum verified
    assert torch.equal(buf.tensors["state"], expected)
    assert buf.tensors["state"].is_pinned() == copier.pin_memory
    assert snap.generations == 1 and snap.cpu_s["copy"] >= 0


def test_snapshot_copy_is_ordered_before_the_next_optimizer_step_cpu():
    _snapshot_then_overwrite("cpu", use_stream=True)  # on the CPU the stream calls are no-ops


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("use_stream", [True, False])
def test_snapshot_copy_is_ordered_before_the_next_optimizer_step_cuda(use_stream):
    _snapshot_then_overwrite("cuda", use_stream=use_stream)


def test_no_replay_when_the_step_consumed_random_numbers(tmp_path):
    # with dropout every step draws from the RNG, so a replayed shard could not know the lost rank's RNG
    # state after the step: the run resumes one generation earlier instead (1 step recomputed), still exact
    model = {"block_size": 32, "n_layer": 2, "n_head": 2, "d_model": 32, "dropout": 0.1}
    ref = run_resilient(_cfg(tmp_path, "dref", steps=6, model=model), timeout=120)
    out = run_resilient(_cfg(tmp_path, "drop", steps=6, model=model, faults=[FaultPlan(step=4, rank=1, phase="snapshot_send")]),
                        timeout=120)
    [f] = out.failures
    assert (f.generation, f.replayed) == (3, False)
    # step 4's optimizer step ran everywhere; whether it counts as completed (rank 0 logged its loss)
    # depends on whether the kill came before or after that loss all-reduce
    assert f.steps_lost in (0, 1)
    assert out.param_sha256 == ref.param_sha256
