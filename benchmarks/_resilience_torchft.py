"""One replica group (one process) of the TorchFT baseline, run by benchmarks.resilience.

torchft 0.2.0's pattern (its ``train_ddp.py``): a ``torchft.Manager`` talking to a lighthouse, a
reconfigurable ``ProcessGroupGloo``, ``PGTransport`` for live healing from a peer, ``torchft.DistributedDataParallel``
and ``torchft.Optimizer``. The same GPT, corpus and AdamW hyper-parameters as the other methods; the
group's batch is ``BatchSampler(..., world_size=groups).batch(step, group)``. Injected kills: ``[attempt, step]``
pairs for this group (fired at the first committed step at or past ``step``) (``TORCHELASTIC_RESTART_COUNT``); torchrun restarts the process, which heals from a live
peer. JSON-lines events: ``proc_start``, ``step`` (``step`` = the manager's step, ``participants``, ``committed``),
``killed``, ``final``.
"""

from __future__ import annotations

import time

T_PROC = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--group", type=int, required=True)
    args = ap.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    import torch
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    from lab.training.data import BatchSampler, TextCorpus
    from lab.training.model import GPT, GPTConfig
    from lab.training.resilience.config import ResilienceConfig
    from lab.training.resilience.worker import _lr
    from lab.training.run import _param_groups, param_sha256

    group = args.group
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_path = Path(spec["log"])

    def log(kind: str, **kw) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps({"kind": kind, "group": group, "attempt": attempt, "time": time.time(), **kw}) + "\n")

    log("proc_start", t=T_PROC)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = ResilienceConfig(run_dir=spec["dir"], **spec["train"])
    corpus = TextCorpus(cfg.val_plays)
    tokens = corpus.train_tokens
    mcfg = GPTConfig(**{**spec["train"]["model"], "vocab_size": corpus.tokenizer.vocab_size})
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg)
    inner = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    sampler = BatchSampler(len(tokens), mcfg.block_size, cfg.batch_size, spec["groups"], cfg.seed)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])
        log("healed")

    pg = ProcessGroupGloo(timeout=timedelta(seconds=spec["timeout_s"]))
    transport = PGTransport(pg, timeout=timedelta(seconds=30), device=torch.device("cpu"))
    manager = Manager(pg=pg, min_replica_size=spec["min_replicas"], load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"group{group}", timeout=timedelta(seconds=spec["timeout_s"]),
                      checkpoint_transport=transport)
    net = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    kills = {tuple(k) for k in spec["kills"].get(str(group), [])}
    log("ready")
    while manager.current_step() < cfg.steps:
        t0 = time.perf_counter()
        opt.zero_grad()
        step = manager.current_step() + 1
        for g in inner.param_groups:
            g["lr"] = _lr(cfg, step)
        x, y = sampler.batch(tokens, step, group)
        _, loss = net(x, y)
        loss.backward()
        opt.step()
        committed = manager.current_step() == step
        log("step", step=manager.current_step(), participants=manager.num_participants(), committed=committed,
            step_s=time.perf_counter() - t0)
        # this attempt's kill fires at the first committed step at or past its planned step (a group that
        # healed from a peer may jump over the planned step itself)
        if committed and any(a == attempt and step >= k for a, k in kills):
            log("killed", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
    log("final", sha=param_sha256(model), step=manager.current_step(),
        maxrss_kb=__import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss)
    manager.shutdown(wait=False)
    os._exit(0)


if __name__ == "__main__":
    main()
