"""lab.training.model, .run and .monitor: the GPT, real 2-process torchrun runs, resume, the event log, TensorBoard.

The two module fixtures launch real ``torchrun --nproc-per-node 2`` runs of the tiny GPT on gloo (about
10 s each on 2 cores): an uninterrupted reference, and the same config with rank 1 SIGKILLed at step 6,
then relaunched to resume from its step-4 checkpoint.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from lab.training.comm.hooks import fp32_hook
from lab.training.errors import CheckpointError, RunConfigError, TrainingError
from lab.training.model import GPT, GPTConfig, ModelConfigError
from lab.training.monitor import RunMonitor, RunRecorder
from lab.training.run import FaultSpec, TrainConfig, _resolve_hook, launch, lr_at, train

STEPS = 10


def tiny_config(run_dir: Path, **kw) -> TrainConfig:
    base = dict(model=GPTConfig.tiny(), steps=STEPS, batch_size=8, lr=3e-3, warmup_steps=2, eval_interval=5,
                eval_batches=2, checkpoint_interval=4, heartbeat_s=0.5)
    return TrainConfig(run_dir=run_dir, **{**base, **kw})


def _wait(proc, timeout_s: float = 120.0) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except Exception:
        proc.kill()
        raise


# ---------------------------------------------------------------------------------------------- model


def test_model_sizes_names_and_causality():
    torch.manual_seed(0)
    tiny, default = GPT(GPTConfig.tiny(85)), GPT(GPTConfig.default(85))
    assert tiny.num_parameters() == 31_936 and default.num_parameters() == 3_235_840
    names = list(default.linear_layers())
    assert names[:4] == ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.0.mlp.proj"]
    assert names[-1] == "head" and len(names) == 4 * 4 + 1
    assert default.head.weight.data_ptr() != default.tok_emb.weight.data_ptr()  # untied
    idx = torch.randint(0, 85, (2, 32))
    logits, loss = tiny(idx, idx)
    assert logits.shape == (2, 32, 85) and logits.dtype == torch.float32 and loss.ndim == 0
    assert abs(loss.item() - math.log(85)) < 0.1  # initialisation predicts near uniform
    changed = idx.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 85
    assert torch.equal(tiny(changed)[0][:, :20], logits[:, :20])  # no position sees the future
    assert not torch.equal(tiny(changed)[0][:, 20:], logits[:, 20:])
    out = tiny.generate(idx[:, :5], 40, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 45) and torch.equal(out[:, :5], idx[:, :5]) and out.max() < 85
    with pytest.raises(ModelConfigError, match="exceeds block_size"):
        tiny(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ModelConfigError, match="vocab_size is None"):
        GPT(GPTConfig.tiny())
    with pytest.raises(ValidationError, match="divisible"):
        GPTConfig(d_model=30, n_head=4)


def test_same_seed_same_model():
    torch.manual_seed(3)
    a = GPT(GPTConfig.tiny(85))
    torch.manual_seed(3)
    b = GPT(GPTConfig.tiny(85))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# ---------------------------------------------------------------------------------------------- config


def test_config_validation_and_json_round_trip(tmp_path):
    cfg = tiny_config(tmp_path / "r", optimizer="scape", optimizer_kwargs={"sparsity": 0.9})
    path = cfg.save(tmp_path / "r" / "config.json")
    assert TrainConfig.load(path) == cfg
    assert cfg.resolved_run_id == "r" and cfg.resolved_events_path == tmp_path / "events.sqlite"
    with pytest.raises(ValidationError, match="comm must be 'fp32'"):
        tiny_config(tmp_path, optimizer="scape", comm="fp8")
    with pytest.raises(ValidationError, match="must not hold 'lr'"):
        tiny_config(tmp_path, optimizer_kwargs={"lr": 1.0})
    with pytest.raises(ValidationError):
        tiny_config(tmp_path, optimizer="sgd")
    (tmp_path / "bad.json").write_text(json.dumps({"run_dir": "x", "stepz": 3}))
    with pytest.raises(RunConfigError, match="bad.json is invalid"):
        TrainConfig.load(tmp_path / "bad.json")
    with pytest.raises(RunConfigError, match="cannot read"):
        TrainConfig.load(tmp_path / "missing.json")


def test_cosine_schedule_with_warmup(tmp_path):
    cfg = tiny_config(tmp_path, steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(cfg, 1) == pytest.approx(1e-4) and lr_at(cfg, 10) == pytest.approx(1e-3)
    assert lr_at(cfg, 55) == pytest.approx(0.55e-3)  # halfway through the decay
    assert lr_at(cfg, 100) == pytest.approx(1e-4)
    lrs = [lr_at(cfg, s) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lr_at(cfg.model_copy(update={"schedule": "constant"}), 80) == 1e-3


def test_comm_hook_resolution(tmp_path):
    model = GPT(GPTConfig.tiny(85))
    state, hook, builtin = _resolve_hook(tiny_config(tmp_path), model)
    assert callable(hook) and not builtin  # lab.training.comm.hooks is there
    with pytest.raises(ValidationError, match="'nope' found using 'hook' does not match"):  # typed comm (#23)
        tiny_config(tmp_path, comm="nope")
    # fp32 is lab.training.comm.hooks.fp32_hook (no second copy in run.py); a codec name is not a hook name
    state, hook, builtin = _resolve_hook(tiny_config(tmp_path), model)
    assert hook is fp32_hook and not builtin and state is not None
    import lab.training.run as run_module

    assert not hasattr(run_module, "fp32_allreduce_hook")
    with pytest.raises(ValidationError, match="'fp8_e4m3' found using 'hook' does not match"):
        tiny_config(tmp_path, comm="fp8_e4m3")


# ---------------------------------------------------------------------------------------------- in-process runs


@pytest.mark.parametrize("optimizer", ["adamw", "adams", "scape"])
def test_stopped_and_resumed_run_is_bit_identical(tmp_path, optimizer):
    kw = {"optimizer": optimizer, "tensorboard": False}
    whole = train(tiny_config(tmp_path / "whole", **kw))
    first = train(tiny_config(tmp_path / "parts", stop_after=6, **kw))
    assert (first.state, first.last_step) == ("stopped", 6)
    assert sorted(p.name for p in (tmp_path / "parts" / "checkpoints").iterdir()) == ["step_00000004", "step_00000006"]
    second = train(tiny_config(tmp_path / "parts", **kw))
    assert (second.state, second.start_step, second.last_step) == ("finished", 6, STEPS)
    assert {**first.losses, **second.losses} == whole.losses  # exact float equality
    assert second.val_losses == {k: v for k, v in whole.val_losses.items() if k > 6}
    assert second.param_sha256 == whole.param_sha256
    assert whole.losses[STEPS] < whole.losses[1]
    # the vocabulary was written once and reused
    assert (tmp_path / "parts" / "vocab.json").is_file()


def test_resume_refuses_another_configuration(tmp_path):
    train(tiny_config(tmp_path / "r", stop_after=4, tensorboard=False))
    with pytest.raises(CheckpointError, match="another configuration"):
        train(tiny_config(tmp_path / "r", tensorboard=False, batch_size=4))
    # another peak rate under the same run folder is another trajectory: refused too (a stale benchmark folder
    # once resumed a run at the wrong rate), and the refusal names the rates
    with pytest.raises(CheckpointError, match="another configuration.*'lr': 0.003.*'lr': 0.002"):
        train(tiny_config(tmp_path / "r", tensorboard=False, lr=2e-3))


def test_a_checkpoint_from_before_the_schedule_fingerprint_still_resumes():
    from lab.training.run import _same_configuration

    now = {"seed": 0, "batch_size": 8, "schedule": {"lr": 1e-3, "warmup_steps": 2, "schedule": "cosine", "min_lr_ratio": 0.1}}
    assert _same_configuration({"seed": 0, "batch_size": 8}, now)
    assert _same_configuration(dict(now), now)
    assert not _same_configuration({**now, "schedule": {**now["schedule"], "lr": 2e-3}}, now)
    assert not _same_configuration({"seed": 1, "batch_size": 8}, now)


def test_a_raising_run_records_failed_with_the_error(tmp_path):
    cfg = tiny_config(tmp_path / "boom", fault=FaultSpec(step=3, kind="raise"), tensorboard=False)
    with pytest.raises(TrainingError, match="injected fault at step 3"):
        train(cfg)
    mon = RunMonitor(tmp_path / "events.sqlite")
    st = mon.status("boom")
    assert st.loc[0, "state"] == "failed" and st.loc[0, "step"] == 3
    assert st.loc[0, "error"] == "TrainingError: injected fault at step 3 on rank 0"
    assert mon.run_state("boom") == "failed"
    assert list(mon.metrics("boom").index) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------- monitor unit


def test_monitor_reads_status_heartbeats_and_follows_a_cursor(tmp_path):
    events = tmp_path / "events.sqlite"
    mon = RunMonitor(events, heartbeat_timeout_s=5.0)  # opened before anything is written
    assert mon.runs().empty and mon.run_state("x") == "unknown"
    r0, r1 = RunRecorder(events, "x", 0), RunRecorder(events, "x", 1)
    r0.run_started(config={"optimizer": "adamw", "comm": "fp32", "steps": 3}, world_size=2, n_params=10)
    for r in (r0, r1):
        r.status("started", 0)
    update = mon.follow(0)
    assert update.runs == {"x"} and update.steps.empty and len(update.events) == 3
    for step in (1, 2):
        r0.step(step, loss=3.0 - step, lr=1e-3, step_s=0.5, compute_s=0.4, comm_s=0.1, bytes_sent=40, grad_rel_err=None)
    r0.eval(2, 1.5)
    r1.status("heartbeat", 2)
    update = mon.follow(update.cursor)
    assert list(update.steps["step"]) == [1, 2] and list(update.steps["run_id"]) == ["x", "x"]
    assert list(update.evals["val_loss"]) == [1.5]
    assert mon.follow(update.cursor).events == []
    r0.step(2, loss=0.25, lr=1e-3, step_s=0.5, compute_s=0.4, comm_s=0.1, bytes_sent=40)  # a resume rewrote step 2
    m = mon.metrics("x")
    assert list(m.index) == [1, 2] and m.loc[2, "loss"] == 0.25 and m.loc[2, "val_loss"] == 1.5
    assert math.isnan(m.loc[1, "val_loss"]) and math.isnan(m.loc[1, "grad_rel_err"])
    now = time.time()
    st = mon.status("x", now=now)
    assert list(st["state"]) == ["started", "running"]
    assert mon.run_state("x", now=now) == "running"
    r0.status("finished", 2, param_sha256="ab")
    late = now + 60
    st = mon.status("x", now=late)
    assert st.loc[0, "state"] == "finished" and st.loc[1, "state"] == "dead"
    assert mon.run_state("x", now=late) == "dead"
    r1.status("finished", 2, param_sha256="ab")
    assert mon.run_state("x", now=late) == "finished"
    runs = mon.runs(now=late)
    assert runs.loc[0, "run_id"] == "x" and runs.loc[0, "last_step"] == 2 and runs.loc[0, "state"] == "finished"
    for r in (r0, r1):
        r.close()


# ---------------------------------------------------------------------------------------------- real torchrun


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory):
    """An uninterrupted 2-rank run, watched with follow() while it runs."""
    root = tmp_path_factory.mktemp("runs")
    cfg = tiny_config(root / "ref")
    proc = launch(cfg, 2)
    mon = RunMonitor(root / "events.sqlite", heartbeat_timeout_s=5.0)
    cursor, updates = 0, []
    while proc.poll() is None:
        update = mon.follow(cursor)
        cursor = update.cursor
        if update.events:
            updates.append(update)
        time.sleep(0.05)
    updates.append(mon.follow(cursor))
    rc = _wait(proc)
    return cfg, rc, mon, updates


def test_two_rank_torchrun_keeps_replicas_identical_and_learns(ref_run):
    cfg, rc, mon, updates = ref_run
    log = (cfg.run_dir / "launch.log").read_text()
    assert rc == 0, log[-3000:]
    assert json.loads((cfg.run_dir / "config.json").read_text())["steps"] == STEPS  # launch wrote the config
    status = mon.status("ref")
    assert list(status.index) == [0, 1] and set(status["state"]) == {"finished"}
    assert status.loc[0, "param_sha256"] == status.loc[1, "param_sha256"]  # replicas bit-identical
    assert len(set(status["pid"])) == 2
    m = mon.metrics("ref")
    assert list(m.index) == list(range(1, STEPS + 1))
    assert m["loss"].iloc[-3:].mean() < m["loss"].iloc[:3].mean() - 0.2
    assert m.loc[STEPS, "val_loss"] < m.loc[5, "val_loss"]
    n_params = mon.config("ref")["n_params"]
    assert (m["bytes_sent"] == 4 * n_params).all() and (m["dense_bytes"] == 4 * n_params).all()
    assert ((m["compute_s"] + m["comm_s"] - m["step_s"]).abs() < 1e-9).all() and (m["comm_s"] >= 0).all()
    assert (m["tokens"] == 2 * 8 * 32).all()
    run = mon.runs().set_index("run_id").loc["ref"]
    assert (run["world_size"], run["state"], run["optimizer"], run["comm"], run["last_step"]) == (2, "finished", "adamw", "fp32", STEPS)


def test_monitor_followed_the_run_incrementally(ref_run):
    _, _, mon, updates = ref_run
    seen_steps = [s for u in updates for s in u.steps["step"]]
    assert seen_steps == list(range(1, STEPS + 1))  # every step exactly once, in order
    assert sum(1 for u in updates if u.events) >= 2  # it arrived in more than one piece
    kinds = [e.kind for u in updates for e in u.events]
    assert kinds.index("train.status") < kinds.index("train.step")


def test_tensorboard_files_hold_the_scalars(ref_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, _, mon, _ = ref_run
    acc = EventAccumulator(str(cfg.run_dir / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "time/step_s", "time/comm_s", "comm/bytes_sent", "val/loss"} <= set(tags)
    loss = acc.Scalars("train/loss")
    assert [s.step for s in loss] == list(range(1, STEPS + 1))
    logged = mon.metrics("ref")["loss"]
    assert [s.value for s in loss] == pytest.approx(list(logged), rel=1e-6)
    assert [s.step for s in acc.Scalars("val/loss")] == [5, 10]


@pytest.fixture(scope="module")
def crashed_run(ref_run):
    """The reference config with rank 1 SIGKILLed after step 6 (checkpoint at 4), then relaunched."""
    ref_cfg, _, _, _ = ref_run
    root = ref_cfg.run_dir.parent
    cfg = tiny_config(root / "crash", fault=FaultSpec(step=6, rank=1, kind="sigkill"))
    rc_crash = _wait(launch(cfg, 2))
    mon = RunMonitor(root / "events.sqlite", heartbeat_timeout_s=3.0)
    status = mon.status("crash")
    after_crash = {"status": status, "metrics": mon.metrics("crash"), "run_state": mon.run_state("crash"),
                   # judged after the heartbeat timeout (no sleeping: the monitor takes the time to judge at)
                   "late": mon.status("crash", now=status.loc[1, "last_seen"] + 10) if 1 in status.index else None}
    rc_resume = _wait(launch(cfg.model_copy(update={"fault": None}), 2))
    return cfg, rc_crash, rc_resume, mon, after_crash


def test_a_killed_rank_is_reported_dead_and_its_peer_failed(crashed_run):
    cfg, rc_crash, _, mon, after = crashed_run
    assert rc_crash != 0
    st = after["status"]
    dead = st.loc[1]
    assert dead["state"] in ("started", "running") or dead["age_s"] > 3.0  # no final word from rank 1
    assert dead["step"] <= 6
    assert st.loc[0, "state"] == "failed" and st.loc[0, "error"]  # SIGTERM from torchrun, or gloo's broken pipe
    assert after["late"].loc[1, "state"] == "dead"  # judged after the heartbeat timeout
    assert after["run_state"] == "failed"
    assert list(after["metrics"].index) == list(range(1, 7)) or list(after["metrics"].index) == list(range(1, 8))


def test_the_relaunched_run_resumes_bit_exactly(crashed_run, ref_run):
    cfg, _, rc_resume, mon, _ = crashed_run
    assert rc_resume == 0, (cfg.run_dir / "launch.log").read_text()[-3000:]
    assert mon.config("crash")["start_step"] == 4
    st = mon.status("crash")
    assert set(st["state"]) == {"finished"}
    ref = mon.metrics("ref")
    got = mon.metrics("crash")
    assert list(got.index) == list(range(1, STEPS + 1))
    assert list(got["loss"]) == list(ref["loss"])  # bit-identical to the uninterrupted run
    assert got.loc[10, "val_loss"] == ref.loc[10, "val_loss"]
    assert st.loc[0, "param_sha256"] == mon.status("ref").loc[0, "param_sha256"]
    run = mon.runs().set_index("run_id").loc["crash"]
    assert run["starts"] == 2 and run["state"] == "finished"
    # TensorBoard dropped the crashed attempt's steps after the checkpoint: each step once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(cfg.run_dir / "tb"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [s.step for s in loss] == list(range(1, STEPS + 1))
    assert [s.value for s in loss] == pytest.approx(list(ref["loss"]), rel=1e-6)


@pytest.mark.slow
def test_torchrun_restarts_the_workers_and_they_resume(tmp_path):
    """``launch(..., max_restarts=1)``: rank 1 SIGKILLed at step 6 in the first attempt; torchrun restarts
    both workers (a fresh store prefix per attempt), they resume from step 4 and finish bit-exactly."""
    cfg = tiny_config(tmp_path / "restart", fault=FaultSpec(step=6, rank=1, kind="sigkill"))
    proc = launch(cfg, 2, max_restarts=1)
    assert _wait(proc, 180) == 0, (cfg.run_dir / "launch.log").read_text()[-3000:]
    mon = RunMonitor(tmp_path / "events.sqlite")
    whole = train(tiny_config(tmp_path / "whole-1rank", tensorboard=False, batch_size=16))  # same global batch
    got = mon.metrics("restart")
    assert list(got.index) == list(range(1, STEPS + 1))
    assert mon.config("restart")["start_step"] == 4 and mon.runs().set_index("run_id").loc["restart", "starts"] == 2
    st = mon.status("restart")
    assert set(st["state"]) == {"finished"} and st.loc[0, "param_sha256"] == st.loc[1, "param_sha256"]
    # one rank with the same global batch sees the same windows: the losses agree up to summation order
    assert list(got["loss"]) == pytest.approx([whole.losses[s] for s in range(1, STEPS + 1)], rel=1e-4)
