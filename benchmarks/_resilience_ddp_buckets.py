"""Why restart-the-world + DCP was not bit-identical: one rank of a 3-phase experiment (torchrun, 4 ranks).

    torchrun --standalone --nproc-per-node 4 benchmarks/_resilience_ddp_buckets.py PHASE MODE OUT.json

PHASE ``ref``: steps 1..10 uninterrupted; ``a``: steps 1..5 then ``dcp.save``; ``b`` (a new torchrun):
``dcp.load`` then steps 6..10. MODE ``ddp`` (the baseline as it was: ``DDP(model)``), ``manual`` (one
flat ``all_reduce`` of the gradients, no DDP), ``ddp_unused`` (``DDP(model, find_unused_parameters=True)``,
which never rebuilds buckets). Rank 0 writes per step the loss and SHA-256 prefixes of the all-reduced
gradients and of the parameters after the step. Result (README, resilience section): with ``ddp`` the
gradients of step 6 -- the first resumed step -- differ from the uninterrupted run's while its loss is
equal (same parameters); ``manual`` and ``ddp_unused`` are bit-identical through step 10.
"""
import os, sys, json, hashlib
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from lab.training.data import BatchSampler, TextCorpus
from lab.training.model import GPT, GPTConfig
from lab.training.run import _param_groups, param_sha256
from lab.training.resilience.worker import _lr
from lab.training.resilience.config import ResilienceConfig
phase, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
N, K = 10, 5
rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1); torch.use_deterministic_algorithms(True, warn_only=True)
dist.init_process_group("gloo")
train = {"model": {"block_size": 64, "n_layer": 2, "n_head": 4, "d_model": 128}, "workers": 4, "steps": N, "batch_size": 4, "lr": 3e-3, "warmup_steps": 5}
cfg = ResilienceConfig(run_dir="/tmp/_resilience_ddp_buckets", **train)
corpus = TextCorpus(cfg.val_plays); tokens = corpus.train_tokens
mcfg = GPTConfig(**{**train["model"], "vocab_size": corpus.tokenizer.vocab_size})
torch.manual_seed(cfg.seed); model = GPT(mcfg)
net = (DDP(model, find_unused_parameters=True) if mode == "ddp_unused" else DDP(model)) if mode.startswith("ddp") else model
if mode == "ddp_static": net._set_static_graph()
opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
sampler = BatchSampler(len(tokens), mcfg.block_size, cfg.batch_size, ws, cfg.seed)
ck = os.path.join(os.path.dirname(out), f"ck_{mode}")
start, end = (0, N) if phase == "ref" else ((0, K) if phase == "a" else (K, N))
if phase == "b":
    msd, osd = get_state_dict(model, opt); st = {"model": msd, "optim": osd, "step": torch.tensor(0)}
    dcp.load(st, checkpoint_id=ck); set_state_dict(model, opt, model_state_dict=st["model"], optim_state_dict=st["optim"])
log = {}
for step in range(start + 1, end + 1):
    for g in opt.param_groups: g["lr"] = _lr(cfg, step)
    x, y = sampler.batch(tokens, step, rank)
    _, loss = net(x, y); loss.backward()
    if mode == "manual":
        ps = [p for p in model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.view(-1) for p in ps]); dist.all_reduce(flat); flat /= ws
        off = 0
        for p in ps:
            k = p.numel(); p.grad.copy_(flat[off:off+k].view_as(p)); off += k
    gsha = hashlib.sha256(b"".join(p.grad.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:12]
    opt.step(); opt.zero_grad(set_to_none=True)
    log[step] = {"loss": float(loss), "grad": gsha, "param": param_sha256(model)[:12]}
if phase == "a":
    msd, osd = get_state_dict(model, opt); dcp.save({"model": msd, "optim": osd, "step": torch.tensor(K)}, checkpoint_id=ck)
if rank == 0: json.dump(log, open(out, "w"))
dist.destroy_process_group()
