"""Operator decomposition (lab.training.perfmodel.operators): counts against hand-computed values."""

import math

import pytest
from pydantic import ValidationError

from lab.training.perfmodel import PerfConfig, decompose, stage_parameters

# One block, d=8, h=2, s=4, b=1, V=10, fp32 (e=4): N = b*s = 4 tokens. Values computed by hand from the
# conventions in the module docstring (2Nkn + Nn bias forward, 4Nkn + Nn backward, ...).
TINY = dict(n_layer=1, d_model=8, n_head=2, seq_len=4, vocab_size=10, micro_batch=1)
HAND = {  # name: (fwd_flops, bwd_flops, fwd_bytes, bwd_bytes)
    "layernorm_attn": (224, 448, 320, 480),        # 7*32; (2*32 + 16)*4; (3*32 + 8 + 16)*4
    "qkv_linear": (1632, 3168, 1376, 2272),         # 2*4*8*24 + 4*24; (32 + 192 + 96 + 24)*4
    "attention": (672, 1184, 512, 1024),            # 4*1*16*8 + 5*(1*2*16); 4*32*4
    "attn_out_linear": (544, 1056, 544, 928),       # 2*4*8*8 + 32; (32 + 64 + 32 + 8)*4; (64 + 128 + 32 + 8)*4
    "residual_attn": (32, 32, 384, 384),
    "layernorm_mlp": (224, 448, 320, 480),
    "ffn_up_linear": (2176, 4224, 1792, 2944),      # 2*4*8*32 + 128; (32 + 256 + 128 + 32)*4; (64 + 512 + 128 + 32)*4
    "gelu": (1024, 2048, 1024, 1536),               # 8*128; 2*128*4
    "ffn_down_linear": (2080, 4128, 1696, 3232),    # 2*4*32*8 + 32; (128+256+32+8)*4; (256+512+32+8)*4
    "residual_mlp": (32, 32, 384, 384),
}


def _by_name(ops, layer=0):
    return {o.name: o for o in ops if o.layer == layer}


def test_one_block_matches_hand_counts():
    ops = _by_name(decompose(PerfConfig(**TINY)))
    assert list(ops) == list(HAND)  # execution order, no RoPE / collectives for this config
    for name, (ff, bf, fb, bb) in HAND.items():
        o = ops[name]
        assert (o.fwd_flops, o.bwd_flops, o.fwd_bytes, o.bwd_bytes) == (ff, bf, fb, bb), name


def test_stage_ends_and_update():
    ops = decompose(PerfConfig(**TINY))
    names = [o.name for o in ops]
    assert names[:2] == ["embedding", "position_embedding"]
    assert names[-4:] == ["layernorm_final", "vocab_linear", "cross_entropy", "optimizer_step"]
    vocab = next(o for o in ops if o.name == "vocab_linear")
    assert (vocab.fwd_flops, vocab.bwd_flops) == (2 * 4 * 8 * 10, 4 * 4 * 8 * 10)  # no bias on the head
    ce = next(o for o in ops if o.name == "cross_entropy")
    assert (ce.fwd_flops, ce.bwd_flops, ce.fwd_bytes, ce.bwd_bytes) == (160, 120, 40 * 4 + 32, 2 * 40 * 4)
    step = next(o for o in ops if o.name == "optimizer_step")
    p = stage_parameters(PerfConfig(**TINY))[0]
    assert (step.fwd_flops, step.fwd_bytes) == (14 * p, 28 * p)  # fp32 AdamW: 7 tensors x 4 bytes


@pytest.mark.parametrize("shape", [dict(n_layer=2, n_head=2, d_model=32, block_size=32),
                                   dict(n_layer=3, n_head=4, d_model=16, block_size=8, bias=False)])
def test_parameter_count_matches_the_real_gpt(shape):
    from lab.training.model import GPT, GPTConfig

    gpt = GPTConfig(vocab_size=85, **shape)
    assert sum(stage_parameters(PerfConfig.from_gpt_config(gpt))) == GPT(gpt).num_parameters()
    split = PerfConfig.from_gpt_config(gpt, pp=2)
    assert sum(stage_parameters(split)) == GPT(gpt).num_parameters()


def test_tensor_parallel_shards_and_collectives():
    cfg = PerfConfig(**TINY, tp=2, dp=2, bucket_cap_mb=1e-3)
    ops = decompose(cfg)
    blk = _by_name(ops)
    assert blk["qkv_linear"].fwd_flops == 2 * 4 * 8 * 12 + 4 * 12           # column-parallel: 3d/tp outputs
    assert blk["attn_out_linear"].fwd_flops == 2 * 4 * 4 * 8 + 4 * 8        # row-parallel: d/tp inputs
    assert blk["attention"].fwd_flops == 4 * 16 * 8 // 2 + 5 * 1 * 1 * 16   # h/tp = 1 head
    for name in ("tp_allreduce_attn", "tp_allreduce_mlp"):
        o = blk[name]
        assert (o.collective, o.group_size, o.fwd_bytes, o.bwd_bytes) == ("all_reduce", 2, 4 * 8 * 4, 4 * 8 * 4)
    ce = next(o for o in ops if o.name == "tp_allreduce_ce")
    assert (ce.calls, ce.fwd_bytes) == (3, 16)
    dp = next(o for o in ops if o.name == "dp_allreduce")
    p = stage_parameters(cfg)[0]
    assert dp.group_stride == 2 and dp.calls == math.ceil(p * 4 / (1e-3 * 2**20)) > 1 and dp.fwd_bytes * dp.calls == pytest.approx(p * 4)


def test_pipeline_p2p_and_rope():
    cfg = PerfConfig(**{**TINY, "n_layer": 3}, pp=2, tp=1, dp=2, rope=True)
    ops = decompose(cfg)
    assert cfg.stage_layers() == [2, 1]
    assert {o.layer for o in ops if o.stage == 0 and o.layer is not None} == {0, 1}
    p2p = [o for o in ops if o.name == "pp_p2p"]
    assert [(o.stage, o.fwd_bytes, o.bwd_bytes, o.group_stride) for o in p2p] == [(0, 128, 0, 2), (1, 0, 128, 2)]
    assert "position_embedding" not in {o.name for o in ops}
    rope = _by_name(ops)["rope"]
    assert (rope.fwd_flops, rope.fwd_bytes) == (3 * 64, (128 + 2 * 4 * 4) * 4)  # q and k: 2*N*d elements


@pytest.mark.parametrize("bad, field", [(dict(n_head=3), "divisible by n_head"), (dict(tp=4), "divisible by tp"),
                                        (dict(pp=2), "exceeds n_layer"), (dict(micro_batch=0), "micro_batch"),
                                        (dict(precision="fp8"), "precision")])
def test_bad_config_is_refused_naming_the_field(bad, field):
    with pytest.raises(ValidationError, match=field):
        PerfConfig(**{**TINY, **bad})


def test_linear_flops_are_six_n_d_and_every_issue_operator_is_there():
    # Kaplan et al. 2020, Sec. 2.1: a training step's matmul FLOPs are 6 x tokens x (weights in matmuls).
    cfg = PerfConfig(n_layer=4, d_model=64, n_head=4, seq_len=16, vocab_size=100, micro_batch=2, bias=False,
                     pp=2, tp=2, dp=2, rope=True, zero1=True, precision="bf16")
    ops = decompose(cfg)
    linears = [o for o in ops if o.name.endswith("_linear")]
    weights = (12 * 64 * 64 * 4 + 100 * 64) / 2  # per TP rank
    assert sum(o.fwd_flops + o.bwd_flops for o in linears) == 6 * 2 * 16 * weights
    names = {o.name for o in ops}
    assert names == {"embedding", "layernorm_attn", "qkv_linear", "rope", "attention", "attn_out_linear",
                     "residual_attn", "layernorm_mlp", "ffn_up_linear", "gelu", "ffn_down_linear", "residual_mlp",
                     "layernorm_final", "vocab_linear", "cross_entropy", "optimizer_step", "tp_allreduce_embedding",
                     "tp_allreduce_attn", "tp_allreduce_mlp", "tp_allreduce_head", "tp_allreduce_ce", "pp_p2p",
                     "dp_allreduce", "dp_allgather"}
    assert {o.stage for o in ops if o.name == "optimizer_step"} == {0, 1}
    gather = [o for o in ops if o.name == "dp_allgather"]
    assert [o.fwd_bytes for o in gather] == [p * 2 for p in stage_parameters(cfg)]  # bf16 parameters gathered
