"""Hardware files (lab.training.perfmodel.hardware) and the roofline baseline (.roofline) by hand."""

import math
from pathlib import Path

import pytest

from lab.training.errors import HardwareFileError
from lab.training.perfmodel import PerfConfig
from lab.training.perfmodel.hardware import HARDWARE_DIR, available_hardware, load_hardware
from lab.training.perfmodel.roofline import Roofline, collective_time

PERLMUTTER = (HARDWARE_DIR / "perlmutter_a100.toml").read_text()


def _q(key, value, unit, source="spec"):
    return f'[{key}]\nvalue = {value}\nunit = "{unit}"\nsource = "{source}"\nref = "test"\n'


def toy_hardware(tmp_path: Path, gpus_per_node=1) -> Path:
    """1 GFLOP/s at every precision, 1 GB/s memory, links: 1 GB/s and 1 us."""
    text = f'name = "toy"\nsystem = "test"\ngpus_per_node = {gpus_per_node}\n'
    for p in ("fp32", "tf32", "bf16", "fp16"):
        text += _q(f"peak_flops.{p}", "1e9", "FLOP/s")
    text += _q("memory_bandwidth", "1e9", "B/s") + _q("memory_capacity", "1e9", "B")
    for tier in ("intra_node", "inter_node"):
        text += _q(f"links.{tier}.bandwidth", "1e9", "B/s") + _q(f"links.{tier}.latency", "1e-6", "s", "measured")
    path = tmp_path / "toy.toml"
    path.write_text(text)
    return path


def test_shipped_files_load_and_mark_every_number():
    assert available_hardware() == ["perlmutter_a100", "vista_gh200"]
    a100, gh200 = load_hardware("perlmutter_a100"), load_hardware("vista_gh200")
    assert (a100.gpus_per_node, a100.peak("bf16", True), a100.peak("bf16", False)) == (4, 312e12, 19.5e12)
    assert gh200.links.intra_node is None and gh200.memory_bandwidth.value == 4.0e12
    assert a100.link(4, 1) is a100.links.intra_node and a100.link(2, 4) is a100.links.inter_node
    for hw in (a100, gh200):
        assert {hw.peak_flops.fp32.source, hw.memory_bandwidth.source, hw.links.inter_node.latency.source} <= {
            "spec", "measured", "estimate"}


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("[memory_bandwidth]\nvalue = 1555e9\n", "[memory_bandwidth]\n"), "memory_bandwidth.value"),
    (lambda t: t.replace("value = 25e9", "value = -25e9"), "links.inter_node.bandwidth.value"),
    (lambda t: t.replace("value = 3e-6", "value = -3e-6"), "links.inter_node.latency.value"),
    (lambda t: t.replace("value = 156e12\nunit = \"FLOP/s\"", "value = 156e12\nunit = \"TFLOP/s\""), "peak_flops.tf32.unit"),
    (lambda t: t.replace('source = "spec"', 'source = "datasheet"', 1), "peak_flops.fp32.source"),
    (lambda t: t.replace("[peak_flops.fp16]", "[peak_flops.fp8]"), "peak_flops.fp16"),
    (lambda t: t.replace("[links.intra_node.bandwidth]", "[links.nvlink.bandwidth]")
                .replace("[links.intra_node.latency]", "[links.nvlink.latency]"), "links.nvlink"),
])
def test_bad_hardware_file_is_refused_naming_the_field(tmp_path, edit, field):
    bad = edit(PERLMUTTER)
    assert bad != PERLMUTTER
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(HardwareFileError, match=field) as info:
        load_hardware(path)
    assert info.value.field == field and info.value.path == str(path)


def test_missing_intra_node_link_on_a_multi_gpu_node_and_bad_toml(tmp_path):
    path = tmp_path / "nolink.toml"
    path.write_text(PERLMUTTER.split("[links.intra_node.bandwidth]")[0]
                    + "[links.inter_node.bandwidth]" + PERLMUTTER.split("[links.inter_node.bandwidth]")[1])
    with pytest.raises(HardwareFileError, match="links.intra_node is required") as info:
        load_hardware(path)
    assert info.value.field == "links"
    path.write_text("name = \n")
    with pytest.raises(HardwareFileError, match="line 1") as info:
        load_hardware(path)
    assert info.value.field is None
    with pytest.raises(HardwareFileError, match="no such hardware file"):
        load_hardware("summit_v100")


TINY = dict(n_layer=1, d_model=8, n_head=2, seq_len=4, vocab_size=10, micro_batch=1)
# Per operator max(FLOPs, bytes) of TINY (counts in tests/test_perfmodel_operators.py; 1 GFLOP/s, 1 GB/s
# -> nanoseconds). Forward: embedding 288, position 384, block 320+1632+672+544+384+320+2176+1024+2080+384
# = 9536, final LN 320, vocab max(2*4*8*10, 608), cross-entropy max(160, 192).
HAND_FWD_NS = 288 + 384 + 9536 + 320 + 640 + 192                    # 11360
# Backward: embedding max(32, 480), position max(32, 256), block 480+3168+1184+1056+384+480+4224+2048+4128+384
# = 17536, final LN 480, vocab max(4*4*8*10, 1056), cross-entropy max(120, 320).
HAND_BWD_NS = 480 + 256 + 17536 + 480 + 1280 + 320                 # 20352
# AdamW on 1080 parameters (block 872, tables 80 + 32, final LN 16, head 80): max(14 * 1080, 28 * 1080).
HAND_UPDATE_NS = 28 * 1080


def test_roofline_on_a_tiny_config_by_hand(tmp_path):
    hw = load_hardware(toy_hardware(tmp_path))
    p = Roofline.predict(PerfConfig(**TINY), hw)
    assert (p.max_fwd_s, p.max_bwd_s) == pytest.approx((HAND_FWD_NS * 1e-9, HAND_BWD_NS * 1e-9))
    assert p.total_s == pytest.approx((HAND_FWD_NS + HAND_BWD_NS + HAND_UPDATE_NS) * 1e-9)
    # m = 2 micro-batches and dp = 2 on the 1 GB/s, 1 us link: ring all-reduce of 1080 * 4 bytes in one bucket
    # = 2 * 1 * 1e-6 + 2 * (1/2) * 4320 / 1e9 s.
    p2 = Roofline.predict(PerfConfig(**TINY, n_micro_batches=2, dp=2), hw)
    sync = 2e-6 + 4320e-9
    assert p2.grad_sync_exposed_s == pytest.approx(sync)
    assert p2.total_s == pytest.approx(2 * (HAND_FWD_NS + HAND_BWD_NS) * 1e-9 + sync + HAND_UPDATE_NS * 1e-9)


def test_alpha_beta_collectives():
    assert collective_time("all_reduce", 4, 1e6, 1e-6, 1e9) == pytest.approx(6e-6 + 1.5e-3)
    assert collective_time("all_gather", 4, 1e6, 1e-6, 1e9) == pytest.approx(3e-6 + 0.75e-3)
    assert collective_time("send_recv", 2, 1e6, 1e-6, 1e9) == pytest.approx(1e-6 + 1e-3)
    assert collective_time("all_reduce", 1, 1e6, 1e-6, 1e9) == 0.0
    with pytest.raises(ValueError, match="broadcast"):
        collective_time("broadcast", 2, 1.0, 0.0, 1.0)


def test_tensor_parallel_collectives_pick_the_tier(tmp_path):
    cfg = PerfConfig(**TINY, tp=2)
    hw = load_hardware("perlmutter_a100")
    rl = Roofline(hw, cfg.precision)
    from lab.training.perfmodel import decompose

    ar = next(o for o in decompose(cfg) if o.name == "tp_allreduce_attn")
    # 2 GPUs on NVLink: 2 * 1 * 2e-6 + 2 * (1/2) * 128 B / 100e9 B/s
    assert rl.op_time(ar, "fwd") == pytest.approx(4e-6 + 128 / 100e9)
    # one GPU per node (Vista): the same all-reduce crosses NDR InfiniBand, 2 * 2e-6 + 128 B / 50e9 B/s
    assert Roofline(load_hardware("vista_gh200"), "fp32").op_time(ar, "fwd") == pytest.approx(4e-6 + 128 / 50e9)
    # tp = 8 does not fit a 4-GPU Perlmutter node: inter-node (Slingshot, 3 us, 25 GB/s)
    ar8 = next(o for o in decompose(PerfConfig(**{**TINY, "n_head": 8}, tp=8)) if o.name == "tp_allreduce_mlp")
    assert rl.op_time(ar8, "bwd") == pytest.approx(2 * 7 * 3e-6 + 2 * 7 / 8 * 128 / 25e9)
    assert math.isfinite(Roofline.predict(cfg, hw, method="simulate", overlap_grad_sync=True).total_s)


def test_non_finite_value_is_refused(tmp_path):
    path = tmp_path / "nan.toml"
    path.write_text(PERLMUTTER.replace("value = 1555e9", "value = nan"))
    with pytest.raises(HardwareFileError, match="memory_bandwidth.value") as info:
        load_hardware(path)
    assert info.value.field == "memory_bandwidth.value"
