"""Operator-level decomposition of one GPT training step (FLOPs and bytes per operator).

Source: Zhang et al., "Efficient Fine-Grained GPU Performance Modeling for Distributed Deep Learning of
LLM" (arXiv 2509.22832, HiPC 2025), Sec. III-A (operator-level decomposition: embedding, (RMS)LayerNorm,
linear1 = QKV, RoPE, flash-attention, linear2 = attention out-projection, residual add, linear3 / linear4
= FFN up / down, GeLU, final LayerNorm, linear_final = vocabulary projection, parallel cross-entropy,
the optimizer step per stage; TP all-reduce, PP point-to-point, DP all-reduce / all-gather). Tensor
parallelism is Megatron-LM's (Shoeybi et al. 2019, Sec. 3): QKV and FFN-up column-parallel, out-proj and
FFN-down row-parallel, two all-reduces per block forward and two backward, vocabulary-parallel embedding,
head and cross-entropy.

Counting conventions (the same for every operator, so the counts are checkable by hand):

* FLOPs are floating-point operations (a multiply-add is 2), **per rank and per micro-batch** for
  the ``micro_batch`` phase, per rank and per step for ``grad_sync`` and ``update``.
* Bytes are the minimum device-memory traffic of an unfused kernel: every input read once, every output
  written once (element size from the precision; token ids int64). Attention is counted as a fused
  (flash) kernel: q, k, v, o (and their gradients) move, the ``s x s`` score matrix does not.
* A linear ``y = x W^T + b`` with ``x: (N, k)``, ``W: (n, k)``: forward ``2 N k n`` (+ ``N n`` bias),
  backward ``4 N k n`` (input and weight gradients) (+ ``N n`` bias gradient) (Kaplan et al. 2020,
  Sec. 2.1; Narayanan et al. 2021, Sec. 5.1: backward = 2 x forward).
* Element-wise operators use the per-element constants below; backward is taken as twice forward
  where no closer count is stated.
* For collectives ``fwd_bytes`` / ``bwd_bytes`` are the **message size of one call** on one rank
  (what the collective reduces, gathers or sends), ``calls`` how many such calls; the wire bytes follow
  from the algorithm (see :mod:`lab.training.perfmodel.roofline`).

The architecture follows :mod:`lab.training.model` (pre-LN GPT-2: learned positions, biases, exact GeLU,
untied head); ``PerfConfig.rope`` switches to rotary embeddings (no position table, RoPE on q and k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from lab.training.perfmodel.config import PerfConfig

__all__ = ["Operator", "decompose", "stage_parameters", "LN_FLOPS_PER_ELEMENT", "GELU_FLOPS_PER_ELEMENT",
           "SOFTMAX_FLOPS_PER_SCORE", "ROPE_FLOPS_PER_ELEMENT", "CE_FWD_FLOPS_PER_LOGIT",
           "CE_BWD_FLOPS_PER_LOGIT", "ADAM_FLOPS_PER_PARAM", "ADAM_STATE_BYTES_PER_PARAM"]

#: LayerNorm forward FLOPs per element: mean, subtract, square, variance sum, scale by 1/std, gamma, beta.
LN_FLOPS_PER_ELEMENT = 7
#: GeLU forward FLOPs per element (exact erf form x * 0.5 * (1 + erf(x / sqrt 2)), erf counted as 5).
GELU_FLOPS_PER_ELEMENT = 8
#: Softmax FLOPs per attention score, each direction (scale, max, subtract, exp, normalise).
SOFTMAX_FLOPS_PER_SCORE = 5
#: RoPE FLOPs per rotated element of q and k (x cos + rot(x) sin: 2 multiplies, 1 add), each direction.
ROPE_FLOPS_PER_ELEMENT = 3
#: Cross-entropy forward FLOPs per logit (max, subtract, exp, sum) and backward (subtract, exp, scale).
CE_FWD_FLOPS_PER_LOGIT, CE_BWD_FLOPS_PER_LOGIT = 4, 3
#: AdamW FLOPs per parameter: decay 2, first moment 3, second moment 4, sqrt 1, eps 1, divide 1, lr 1, subtract 1.
ADAM_FLOPS_PER_PARAM = 14
#: AdamW fp32 state traffic per parameter: master weight, m and v each read and written (6 x 4 bytes).
ADAM_STATE_BYTES_PER_PARAM = 24

Phase = Literal["micro_batch", "grad_sync", "update"]
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv"]


@dataclass(frozen=True)
class Operator:
    """One operator (compute kernel or collective) of one pipeline stage.

    Attributes
    ----------
    name : str
        ``embedding``, ``position_embedding``, ``layernorm_attn``, ``qkv_linear``, ``rope``,
        ``attention``, ``attn_out_linear``, ``residual_attn``, ``layernorm_mlp``, ``ffn_up_linear``,
        ``gelu``, ``ffn_down_linear``, ``residual_mlp``, ``layernorm_final``, ``vocab_linear``,
        ``cross_entropy``, ``optimizer_step``; collectives ``tp_allreduce_{embedding,attn,mlp,head,ce}``,
        ``pp_p2p``, ``dp_allreduce``, ``dp_allgather``.
    stage : int
        Pipeline stage, ``0 .. pp - 1``.
    layer : int or None
        Global block index for per-block operators, else None.
    phase : {"micro_batch", "grad_sync", "update"}
        ``micro_batch``: runs forward and backward once per micro-batch; ``grad_sync``: once per step
        after the last backward; ``update``: once per step after the sync (counts in ``fwd_*``).
    fwd_flops, bwd_flops : float
        FLOPs per rank (per micro-batch in the ``micro_batch`` phase).
    fwd_bytes, bwd_bytes : float
        Compute: device-memory bytes moved per rank. Collective: message bytes of one call per rank.
    matmul : bool
        Runs on matrix units (tensor cores) at the precision's matmul peak; else vector (fp32) peak.
    collective : {"all_reduce", "all_gather", "reduce_scatter", "send_recv"} or None
        None for a compute operator. For ``all_gather`` the message is the gathered (output) size.
    group : {"tp", "pp", "dp"} or None
        The process group of a collective.
    group_size : int
        Ranks in the group (1 for compute operators).
    group_stride : int
        Global-rank distance between consecutive members (tp 1, dp ``tp``, pp ``tp * dp``; ranks are
        placed tp-innermost, as Megatron-LM), which decides whether the group crosses nodes.
    calls : int
        Calls per direction (e.g. three small all-reduces of the vocabulary-parallel cross-entropy,
        one per gradient bucket for ``dp_allreduce``).
    """

    name: str
    stage: int
    layer: int | None
    phase: Phase
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float
    matmul: bool = False
    collective: Collective | None = None
    group: Literal["tp", "pp", "dp"] | None = None
    group_size: int = 1
    group_stride: int = 1
    calls: int = 1

    @property
    def is_collective(self) -> bool:
        """True for a communication operator."""
        return self.collective is not None


def _linear(name, stage, layer, N, k, n, bias, e) -> Operator:
    """``y = x W^T (+ b)``, ``x: (N, k)``, ``W: (n, k)``; see the module's counting conventions."""
    bn = n if bias else 0
    return Operator(name, stage, layer, "micro_batch",
                    fwd_flops=2 * N * k * n + N * bn, bwd_flops=4 * N * k * n + N * bn,
                    fwd_bytes=(N * k + n * k + N * n + bn) * e,
                    bwd_bytes=(2 * N * k + 2 * n * k + N * n + bn) * e, matmul=True)


def _layernorm(name, stage, layer, N, d, bias, e) -> Operator:
    """LayerNorm over ``d`` on ``N`` tokens (replicated on TP ranks: no sequence parallelism)."""
    npar = 2 * d if bias else d
    return Operator(name, stage, layer, "micro_batch",
                    fwd_flops=LN_FLOPS_PER_ELEMENT * N * d, bwd_flops=2 * LN_FLOPS_PER_ELEMENT * N * d,
                    fwd_bytes=(2 * N * d + npar) * e, bwd_bytes=(3 * N * d + d + npar) * e)


def _elementwise(name, stage, layer, elems, fwd_per, bwd_per, fwd_rw, bwd_rw, e) -> Operator:
    return Operator(name, stage, layer, "micro_batch", fwd_flops=fwd_per * elems, bwd_flops=bwd_per * elems,
                    fwd_bytes=fwd_rw * elems * e, bwd_bytes=bwd_rw * elems * e)


def _tp_allreduce(name, stage, layer, fwd_msg, bwd_msg, cfg: PerfConfig, calls=1) -> Operator:
    return Operator(name, stage, layer, "micro_batch", 0.0, 0.0, fwd_msg, bwd_msg, collective="all_reduce",
                    group="tp", group_size=cfg.tp, group_stride=1, calls=calls)


def stage_parameters(cfg: PerfConfig) -> list[int]:
    """Parameters held by one rank of each pipeline stage (TP-sharded weights divided by ``tp``).

    Per block: QKV ``3 d^2 / tp``, out-proj ``d^2 / tp``, FFN ``2 f d^2 / tp`` weights; biases
    ``3d / tp + d + f d / tp + d`` (row-parallel biases replicated); two LayerNorms ``2 d`` each (``d``
    without bias). Stage 0 adds the token table ``V_p d / tp`` and, without RoPE, the position table
    ``s d``; the last stage adds the final LayerNorm and the untied head ``V_p d / tp``. With ``tp = 1``
    the sum over stages is :meth:`lab.training.model.GPT.num_parameters`.

    Returns
    -------
    list of int
        ``len == pp``.
    """
    d, t, f = cfg.d_model, cfg.tp, cfg.ffn_mult
    ln = 2 * d if cfg.bias else d
    block = (3 * d * d + d * d + 2 * f * d * d) // t + 2 * ln
    if cfg.bias:
        block += 3 * d // t + d + f * d // t + d
    out = [n * block for n in cfg.stage_layers()]
    out[0] += cfg.padded_vocab * d // t + (0 if cfg.rope else cfg.seq_len * d)
    out[-1] += ln + cfg.padded_vocab * d // t
    return out


def decompose(config: PerfConfig) -> list[Operator]:
    """Every operator of one training step on one rank of each pipeline stage.

    Parameters
    ----------
    config : PerfConfig
        Model shape and parallel degrees.

    Returns
    -------
    list of Operator
        In execution order per stage: stage 0 starts with ``embedding`` (+ ``position_embedding``
        without RoPE, + ``tp_allreduce_embedding`` when ``tp > 1``), each block is ``layernorm_attn,
        qkv_linear, [rope], attention, attn_out_linear, [tp_allreduce_attn], residual_attn,
        layernorm_mlp, ffn_up_linear, gelu, ffn_down_linear, [tp_allreduce_mlp], residual_mlp``, the
        last stage ends with ``layernorm_final, vocab_linear, [tp_allreduce_head], cross_entropy,
        [tp_allreduce_ce]``; ``pp_p2p`` per stage when ``pp > 1``; then per stage ``dp_allreduce``
        (``grad_sync``, when ``dp > 1``), ``optimizer_step`` and, with ZeRO-1 and ``dp > 1``,
        ``dp_allgather`` (``update``). FLOPs and bytes per rank, per micro-batch for the
        ``micro_batch`` phase (units and conventions in the module docstring).

    Notes
    -----
    With ``b`` micro-batch, ``s`` sequence, ``d`` hidden, ``h`` heads, ``t = tp``, ``f`` FFN multiple,
    ``N = b s`` tokens and ``e`` bytes per element, one block's matmul FLOPs forward are
    ``2N(3d^2 + d^2 + 2 f d^2)/t + 4 b s^2 d / t`` (paper Sec. III-A / the estimator's docs: QKV
    ``6d^2/mp``, out ``2d^2/mp``, up and down ``8d^2/mp`` per token at ``f = 4``). TP all-reduces are
    ``N d e`` bytes (Megatron's f / g operators: two forward after the row-parallel linears, two
    backward before the column-parallel ones). PP sends ``N d e / t`` per micro-batch and direction
    (Megatron's scatter-gather optimisation; the paper's ``pp_p2p(b l dim / mp)``). The DP all-reduce
    moves every gradient of the stage (``params * e``) in ``ceil(params e / bucket)`` buckets; with
    ZeRO-1 each rank steps ``params / dp`` and all-gathers ``params * e`` (paper Sec. III-C).
    """
    c = config
    b, s, d, h, t, f, e = c.micro_batch, c.seq_len, c.d_model, c.n_head, c.tp, c.ffn_mult, c.bytes_per_element
    N, Vp, dh = b * s, c.padded_vocab, d // h
    ops: list[Operator] = []
    layer0 = 0
    for st, n_layers in enumerate(c.stage_layers()):
        if st == 0:
            # vocabulary-parallel gather: each rank reads its rows, writes the (masked) (N, d) output;
            # backward scatter-adds dy into its (V_p / t, d) table gradient.
            ops.append(Operator("embedding", st, None, "micro_batch", fwd_flops=0.0, bwd_flops=N * d,
                                fwd_bytes=2 * N * d * e + 8 * N,
                                bwd_bytes=(N * d + Vp * d // t) * e + 8 * N))
            if not c.rope:
                ops.append(Operator("position_embedding", st, None, "micro_batch", fwd_flops=N * d,
                                    bwd_flops=N * d, fwd_bytes=(2 * N * d + s * d) * e,
                                    bwd_bytes=(N * d + s * d) * e))
            if t > 1:
                ops.append(_tp_allreduce("tp_allreduce_embedding", st, None, N * d * e, 0.0, c))
        for layer in range(layer0, layer0 + n_layers):
            ops.append(_layernorm("layernorm_attn", st, layer, N, d, c.bias, e))
            ops.append(_linear("qkv_linear", st, layer, N, d, 3 * d // t, c.bias, e))
            if c.rope:
                qk = 2 * N * d // t
                ops.append(Operator("rope", st, layer, "micro_batch",
                                    fwd_flops=ROPE_FLOPS_PER_ELEMENT * qk, bwd_flops=ROPE_FLOPS_PER_ELEMENT * qk,
                                    fwd_bytes=(2 * qk + 2 * s * dh) * e, bwd_bytes=(2 * qk + 2 * s * dh) * e))
            scores = b * (h // t) * s * s
            ops.append(Operator("attention", st, layer, "micro_batch",
                                fwd_flops=4 * b * s * s * d // t + SOFTMAX_FLOPS_PER_SCORE * scores,
                                bwd_flops=8 * b * s * s * d // t + SOFTMAX_FLOPS_PER_SCORE * scores,
                                fwd_bytes=4 * N * d // t * e, bwd_bytes=8 * N * d // t * e, matmul=True))
            ops.append(_linear("attn_out_linear", st, layer, N, d // t, d, c.bias, e))
            if t > 1:
                ops.append(_tp_allreduce("tp_allreduce_attn", st, layer, N * d * e, N * d * e, c))
            ops.append(_elementwise("residual_attn", st, layer, N * d, 1, 1, 3, 3, e))
            ops.append(_layernorm("layernorm_mlp", st, layer, N, d, c.bias, e))
            ops.append(_linear("ffn_up_linear", st, layer, N, d, f * d // t, c.bias, e))
            ops.append(_elementwise("gelu", st, layer, N * f * d // t, GELU_FLOPS_PER_ELEMENT,
                                    2 * GELU_FLOPS_PER_ELEMENT, 2, 3, e))
            ops.append(_linear("ffn_down_linear", st, layer, N, f * d // t, d, c.bias, e))
            if t > 1:
                ops.append(_tp_allreduce("tp_allreduce_mlp", st, layer, N * d * e, N * d * e, c))
            ops.append(_elementwise("residual_mlp", st, layer, N * d, 1, 1, 3, 3, e))
        layer0 += n_layers
        if st == c.pp - 1:
            ops.append(_layernorm("layernorm_final", st, None, N, d, c.bias, e))
            ops.append(_linear("vocab_linear", st, None, N, d, Vp // t, False, e))
            if t > 1:
                ops.append(_tp_allreduce("tp_allreduce_head", st, None, 0.0, N * d * e, c))
            logits = N * Vp // t
            ops.append(Operator("cross_entropy", st, None, "micro_batch",
                                fwd_flops=CE_FWD_FLOPS_PER_LOGIT * logits, bwd_flops=CE_BWD_FLOPS_PER_LOGIT * logits,
                                fwd_bytes=logits * e + 8 * N, bwd_bytes=2 * logits * e))
            if t > 1:  # max, sum of exp and target logit over the vocabulary shards, fp32 per token
                ops.append(_tp_allreduce("tp_allreduce_ce", st, None, 4 * N, 0.0, c, calls=3))
        if c.pp > 1:
            act = N * d * e / t
            ops.append(Operator("pp_p2p", st, None, "micro_batch", 0.0, 0.0,
                                fwd_bytes=act if st < c.pp - 1 else 0.0, bwd_bytes=act if st > 0 else 0.0,
                                collective="send_recv", group="pp", group_size=2, group_stride=t * c.dp))
    params = stage_parameters(c)
    bucket = c.bucket_cap_mb * 2**20
    for st, p in enumerate(params):
        if c.dp > 1:
            total = p * e
            k = max(1, math.ceil(total / bucket))
            ops.append(Operator("dp_allreduce", st, None, "grad_sync", 0.0, 0.0, total / k, 0.0,
                                collective="all_reduce", group="dp", group_size=c.dp, group_stride=t, calls=k))
        local = p / c.dp if c.zero1 else p
        mixed = c.precision in ("bf16", "fp16")
        ops.append(Operator("optimizer_step", st, None, "update", ADAM_FLOPS_PER_PARAM * local, 0.0,
                            (ADAM_STATE_BYTES_PER_PARAM + e + (e if mixed else 0)) * local, 0.0))
        if c.zero1 and c.dp > 1:
            ops.append(Operator("dp_allgather", st, None, "update", 0.0, 0.0, p * e, 0.0,
                                collective="all_gather", group="dp", group_size=c.dp, group_stride=t))
    return ops
