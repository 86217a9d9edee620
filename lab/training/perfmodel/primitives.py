"""The primitives of one GPT training step, as functions both the sampler and the measured runs call.

The performance model predicts a step from the times of its operators measured in isolation
(Zhang et al., arXiv 2509.22832, Sec. III-B: each operator micro-benchmarked alone). For that to be a
prediction of *this* step, the step has to be built from the same kernels: :mod:`.parallel` composes its
stage module out of these functions and :mod:`.profile` times each one alone, forward and backward apart,
over a shape sweep. The functions are the pre-LN GPT of :mod:`lab.training.model` (learned positions,
biases, exact GeLU, causal :func:`torch.nn.functional.scaled_dot_product_attention`, untied head), with
Megatron-LM's tensor parallelism (Shoeybi et al. 2019, Sec. 3): column-parallel QKV / FFN-up,
row-parallel out-proj / FFN-down, vocabulary-parallel embedding, head and cross-entropy.

Collectives are *not* inside these functions: they are the autograd functions at the end of the module
(:class:`CopyToTensorParallel`, :class:`ReduceFromTensorParallel`), so the sampler times the compute
alone and the communication model (:mod:`.comm`) times the collectives.

Shapes: ``b`` micro-batch, ``s`` sequence, ``d`` hidden, ``h`` heads (``h_local = h / tp`` on one rank),
``N = b s`` tokens, ``V_local = V_padded / tp``. Tensors are the parameters' dtype (fp32 here; bf16 where
the precision says so); token ids int64.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["embedding", "position_embedding", "layernorm", "linear", "attention", "gelu", "residual",
           "cross_entropy", "VocabParallelCrossEntropy", "CopyToTensorParallel", "ReduceFromTensorParallel",
           "KIND_OF", "TP_COMM_SECONDS"]

#: Wall seconds spent in this process's TP collectives (the measured runs read and reset it per step).
TP_COMM_SECONDS = [0.0]


def _timed_all_reduce(t, **kw):
    t0 = time.perf_counter()
    dist.all_reduce(t, **kw)
    TP_COMM_SECONDS[0] += time.perf_counter() - t0

#: The regressor (primitive kind) each operator name of :func:`.operators.decompose` is timed by.
KIND_OF: dict[str, str] = {
    "embedding": "embedding", "position_embedding": "position_embedding",
    "layernorm_attn": "layernorm", "layernorm_mlp": "layernorm", "layernorm_final": "layernorm",
    "qkv_linear": "linear", "attn_out_linear": "linear", "ffn_up_linear": "linear",
    "ffn_down_linear": "linear", "vocab_linear": "linear",
    "attention": "attention", "gelu": "gelu", "residual_attn": "residual", "residual_mlp": "residual",
    "cross_entropy": "cross_entropy", "optimizer_step": "optimizer_step",
}


def embedding(idx: torch.Tensor, weight: torch.Tensor, vocab_start: int = 0, tp: int = 1) -> torch.Tensor:
    """Token embedding; with ``tp > 1`` the vocabulary-parallel local part (rows ``vocab_start ..
    vocab_start + V_local``, zero for ids outside; the TP all-reduce sums the shards).

    ``idx: (b, s)`` int64, ``weight: (V_local, d)`` -> ``(b, s, d)``.
    """
    if tp == 1:
        return F.embedding(idx, weight)
    outside = (idx < vocab_start) | (idx >= vocab_start + weight.shape[0])
    local = (idx - vocab_start).masked_fill(outside, 0)
    return F.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)


def position_embedding(tok: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``tok + pos_emb(0 .. s-1)``: ``tok: (b, s, d)``, ``weight: (block_size, d)`` -> ``(b, s, d)``."""
    pos = torch.arange(tok.shape[1], device=tok.device)
    return tok + F.embedding(pos, weight)


def layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """LayerNorm over the last dim ``d`` (eps 1e-5, as :class:`torch.nn.LayerNorm`)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T + b``: ``x: (..., k)``, ``weight: (n, k)`` -> ``(..., n)``."""
    return F.linear(x, weight, bias)


def attention(qkv: torch.Tensor, h_local: int) -> torch.Tensor:
    """Causal multi-head attention of the local heads from the fused QKV projection.

    ``qkv: (b, s, 3 d_local)`` with ``d_local = h_local * d_head`` -> ``(b, s, d_local)``: split, heads
    to dim 1, :func:`~torch.nn.functional.scaled_dot_product_attention` (``is_causal=True``), heads back
    and contiguous (as :class:`lab.training.model.CausalSelfAttention`).
    """
    b, s, three_c = qkv.shape
    c = three_c // 3
    q, k, v = qkv.split(c, dim=2)
    q, k, v = (t.view(b, s, h_local, c // h_local).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).contiguous().view(b, s, c)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GeLU."""
    return F.gelu(x)


def residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` (the residual add)."""
    return x + y


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-LM's vocabulary-parallel cross-entropy (Shoeybi et al. 2019, Sec. 3, "parallel
    cross-entropy"): three all-reduces of one fp32 per token (max, sum of exp, target logit) over the TP
    group instead of gathering ``(N, V)`` logits. With ``group=None`` the reductions are skipped (the
    sampler's compute-only timing). ``logits: (N, V_local)``, ``targets: (N,)`` -> mean loss (scalar)."""

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, group):
        lmax = logits.max(dim=-1).values.float()
        if group is not None:
            _timed_all_reduce(lmax, op=dist.ReduceOp.MAX, group=group)
        shifted = logits.float() - lmax.unsqueeze(-1)
        outside = (targets < vocab_start) | (targets >= vocab_start + logits.shape[-1])
        local_t = (targets - vocab_start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        if group is not None:
            _timed_all_reduce(sum_exp, group=group)
            _timed_all_reduce(target_logit, group=group)
        loss = (sum_exp.log() - target_logit).mean()
        ctx.save_for_backward(exp, sum_exp, local_t, outside)
        return loss.to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        exp, sum_exp, local_t, outside = ctx.saved_tensors
        g = exp / sum_exp.unsqueeze(-1)
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, local_t] -= (~outside).to(g.dtype)
        g.mul_(grad / g.shape[0])
        return g, None, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0, tp: int = 1,
                  group=None) -> torch.Tensor:
    """Mean next-token cross-entropy (nats): ``logits: (N, V_local)``, ``targets: (N,)`` int64.

    ``tp == 1``: :func:`torch.nn.functional.cross_entropy`; else :class:`VocabParallelCrossEntropy`.
    """
    if tp == 1:
        return F.cross_entropy(logits, targets)
    return VocabParallelCrossEntropy.apply(logits, targets, vocab_start, group)


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward (before a column-parallel
    linear). ``group=None`` (tp 1) is the identity both ways."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        _timed_all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward (after a row-parallel linear), identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        if x.is_contiguous():  # in place (a linear's output: its backward does not need it)
            ctx.mark_dirty(x)
        else:
            x = x.contiguous()
        _timed_all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None
