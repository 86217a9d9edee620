"""One rank of the restart-the-world baseline (run by ``torchrun --max-restarts`` from benchmarks.resilience).

The same GPT, corpus, batches and AdamW hyper-parameters as the hot-swap run, data-parallel with DDP; a
``torch.distributed.checkpoint`` (DCP) save every ``interval`` steps (``dcp.save``) or a non-blocking
``dcp.async_save`` (on its own gloo group; the previous one is awaited before the next); on a start, the
newest complete checkpoint (its ``.metadata`` file written) is loaded. Injected kills are
``[attempt, step, rank]`` triples: that rank SIGKILLs itself after that step in that torchrun attempt.
Events go to a JSON-lines log: ``proc_start``, ``pg_ready``, ``restored``, ``step``, ``killed``, ``final``.
"""

from __future__ import annotations

import time

T_PROC = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    spec = json.loads(Path(ap.parse_args().spec).read_text())
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lab.training.data import BatchSampler, TextCorpus
    from lab.training.model import GPT, GPTConfig
    from lab.training.run import _init_process_group, _param_groups, param_sha256
    from lab.training.resilience.worker import _lr
    from lab.training.resilience.config import ResilienceConfig

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_path = Path(spec["log"])

    def log(kind: str, **kw) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps({"kind": kind, "rank": rank, "attempt": attempt, "time": time.time(), **kw}) + "\n")

    log("proc_start", t=T_PROC)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    _init_process_group(rank, ws, torch.device("cpu"), 30.0)
    log("pg_ready")
    cfg = ResilienceConfig(run_dir=spec["ckpt"], **spec["train"])
    corpus = TextCorpus(cfg.val_plays)
    tokens = corpus.train_tokens
    mcfg = GPTConfig(**{**spec["train"]["model"], "vocab_size": corpus.tokenizer.vocab_size})
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg)
    # find_unused_parameters=True: DDP then never rebuilds its gradient buckets, so every step of every
    # attempt all-reduces the same bucket layout. With the default, the first step of each torchrun
    # attempt all-reduces one bucket of all parameters and later steps the buckets rebuilt in gradient
    # ready order: the elements land in different chunks of gloo's ring all-reduce, are summed in a
    # different order, and a resumed run drifts from the uninterrupted one in the last bits at its
    # first resumed step (torch/nn/parallel/distributed.py, BucketCapacityConfig and
    # Reducer::should_rebuild_buckets; measured in the README).
    net = DDP(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    sampler = BatchSampler(len(tokens), mcfg.block_size, cfg.batch_size, ws, cfg.seed)
    ckpt = Path(spec["ckpt"])
    done = sorted(int(d.name[5:]) for d in ckpt.glob("step_*") if (d / ".metadata").is_file()) if ckpt.is_dir() else []
    start = 0
    if done:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=str(ckpt / f"step_{done[-1]:08d}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"])
    log("restored", step=start)
    interval, mode = int(spec["interval"]), spec["mode"]
    save_group = dist.new_group(backend="gloo") if mode == "async" else None
    pending = None
    kills = {tuple(k) for k in spec["kills"]}
    for step in range(start + 1, cfg.steps + 1):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step)
        x, y = sampler.batch(tokens, step, rank)
        _, loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - t0
        save_s = 0.0
        if interval and step % interval == 0:
            t1 = time.perf_counter()
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd, "step": torch.tensor(step)}
            cid = str(ckpt / f"step_{step:08d}")
            if mode == "async":
                if pending is not None:
                    pending.result()
                pending = dcp.async_save(state, checkpoint_id=cid, process_group=save_group)
            else:
                dcp.save(state, checkpoint_id=cid)
            save_s = time.perf_counter() - t1
        if rank == 0:
            log("step", step=step, step_s=step_s, save_s=save_s)
        if (attempt, step, rank) in kills:
            log("killed", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
    if pending is not None:
        pending.result()
    dist.barrier()
    if rank == 0:
        log("final", sha=param_sha256(model), step=cfg.steps,
            maxrss_kb=__import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
