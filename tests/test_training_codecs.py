"""Gradient codecs (lab.training.comm.codecs): hand-computed round trips, sizes on the wire, edges, NaN policy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lab import LabError
from lab.training import CodecError, NonFiniteError, TrainingError
from lab.training.comm import CODECS, Float32Codec, FP8Codec, NVFP4Codec, get_codec

ALL = list(CODECS) + ["fp8_e4m3_b5", "fp8_e5m2_b3"]
NAN, INF = math.nan, math.inf


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def roundtrip(codec, x):
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == codec.nbytes(x.numel()) == codec.encoded_nbytes(x.numel())
    return payload, codec.decode(payload, x.numel())


def f32(payload_bytes):
    return payload_bytes.clone().view(torch.float32)


# -- registry and parameters ------------------------------------------------------------------


def test_registry_names_and_errors():
    for name in ALL:
        assert get_codec(name).name == name
    assert get_codec("fp8_e5m2_b128") == FP8Codec("e5m2", 128)
    assert get_codec("nvfp4", nonfinite="propagate").nonfinite == "propagate"
    assert issubclass(CodecError, TrainingError) and issubclass(TrainingError, LabError)
    for bad in ("fp16", "fp8_e4m3_b0", "fp8_e3m4", "FP8_E4M3", ""):
        with pytest.raises(CodecError, match="unknown codec"):
            get_codec(bad)
    for kwargs in ({"fmt": "e3m4"}, {"block_size": 0}, {"block_size": True}, {"block_size": 2.0}, {"nonfinite": "ignore"}):
        with pytest.raises(CodecError):
            FP8Codec(**kwargs)


def test_sizes_are_stated_exactly():
    assert [Float32Codec().nbytes(n) for n in (0, 1, 10)] == [0, 4, 40]
    assert [FP8Codec("e4m3").nbytes(n) for n in (0, 1, 1000)] == [4, 5, 1004]
    assert [FP8Codec("e5m2", 128).nbytes(n) for n in (0, 1, 128, 129, 1000)] == [0, 5, 132, 137, 1032]
    assert [NVFP4Codec().nbytes(n) for n in (0, 1, 16, 17, 1024)] == [4, 13, 13, 22, 4 + 9 * 64]
    with pytest.raises(CodecError):
        NVFP4Codec().nbytes(-1)


# -- hand-computed values -----------------------------------------------------------------------


def test_fp32_is_the_identity():
    x = t([0.0, -1.5, 3.25e-20, 6.0e30, -0.0])
    payload, y = roundtrip(Float32Codec(), x)
    assert torch.equal(payload, x.view(torch.uint8)) and torch.equal(y, x)
    assert y.data_ptr() != x.data_ptr() and payload.data_ptr() != x.data_ptr()


def test_fp8_e4m3_per_tensor_hand_values():
    # amax 1000 -> scale 1000/448; x/scale = 0, 0.448, -0.896, 200.704, 448
    # E4M3 (3 mantissa bits): 0.448 -> 0.4375 (step 1/32), -0.896 -> -0.875 (step 1/16), 200.704 -> 208 (step 16)
    codec = FP8Codec("e4m3")
    payload, y = roundtrip(codec, t([0.0, 1.0, -2.0, 448.0, 1000.0]))
    assert f32(payload[:4]).item() == pytest.approx(1000 / 448, rel=1e-7)
    assert payload[4:].view(torch.float8_e4m3fn).float().tolist() == [0.0, 0.4375, -0.875, 208.0, 448.0]
    torch.testing.assert_close(y, t([0.0, 0.9765625, -1.953125, 208 * 1000 / 448, 1000.0]), rtol=1e-6, atol=0)


def test_fp8_ties_round_to_even():
    # e4m3, amax 1792 -> scale 4 exactly: 1.0625 is halfway 1 (mantissa 000) / 1.125 -> 1; 1.1875 -> 1.25 (010)
    _, y = roundtrip(FP8Codec("e4m3"), t([4.25, 4.75, -4.25, 1792.0]))
    assert y.tolist() == [4.0, 5.0, -4.0, 1792.0]
    # e5m2 (2 mantissa bits), amax 114688 -> scale 2: y = 1, -1.5, 2.5 exact; ties to the even mantissa:
    # 2.75 -> 3 (10, not 2.5 = 01), 2.25 -> 2 (00), 1.125 -> 1 (00), 1.375 -> 1.5 (10); 2.625 is no tie -> 2.5
    _, y = roundtrip(FP8Codec("e5m2"), t([0.0, 2.0, -3.0, 5.0, 5.5, 4.5, 2.25, 2.75, 5.25, 114688.0]))
    assert y.tolist() == [0.0, 2.0, -3.0, 5.0, 6.0, 4.0, 2.0, 3.0, 5.0, 114688.0]


def test_fp8_per_block_hand_values_with_partial_last_block():
    codec = FP8Codec("e4m3", 2)
    payload, y = roundtrip(codec, t([1.0, -2.0, 448.0, 1000.0, 3.0]))
    assert payload.numel() == 3 * 4 + 5
    torch.testing.assert_close(f32(payload[:12]), t([2 / 448, 1000 / 448, 3 / 448]), rtol=1e-7, atol=0)
    assert payload[12:].view(torch.float8_e4m3fn).float().tolist() == [224.0, -448.0, 208.0, 448.0, 448.0]
    torch.testing.assert_close(y, t([1.0, -2.0, 208 * 1000 / 448, 1000.0, 3.0]), rtol=1e-6, atol=0)


def test_fp8_saturates_when_the_scale_rounds_down():
    # find an amax whose float32 scale makes amax / scale land above the format's max
    for fmt, fmax in (("e4m3", 448.0), ("e5m2", 57344.0)):
        cand = torch.linspace(1.0, 2.0, 20001)
        over = cand / (cand / fmax) > fmax
        assert over.any()
        amax = cand[over][0].item()
        payload, y = roundtrip(FP8Codec(fmt), t([amax, -amax, 0.5 * amax]))
        codes = payload[4:].view(FP8Codec(fmt).dtype).float()
        assert codes[:2].tolist() == [fmax, -fmax]
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y[:2], t([amax, -amax]), rtol=1e-6, atol=0)


def test_nvfp4_e2m1_rounding_hand_values():
    # amax 2688 = 6 * 448 -> global scale 1, block scale 448 (exact in E4M3): the codes see x / 448
    grid = [0.0, 0.25, 0.5, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -2.5, -5.0, 0.3, 2.9, 4.9]
    want = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -2.0, -4.0, 0.5, 3.0, 4.0]
    codec = NVFP4Codec()
    payload, y = roundtrip(codec, t(grid) * 448)
    assert payload.numel() == 4 + 1 + 8
    assert f32(payload[:4]).item() == 1.0
    assert payload[4:5].view(torch.float8_e4m3fn).item() == 448.0
    # element 2i in the low nibble: (0.5 -> code 1, 0.75 -> 1.0 = code 2) and (-0.25 -> -0 = 8, -2.5 -> -2 = 0xC)
    assert payload[5 + 1].item() == 0x21 and payload[5 + 5].item() == 0xC8
    assert y.tolist() == [v * 448 for v in want]


def test_nvfp4_saturates_above_six_times_the_rounded_block_scale():
    # block 0 sets amax 2688 (global scale 1); block 1 has amax 1632 -> scale 1632/6 = 272, which E4M3
    # rounds (tie, even) down to 256: 1632/256 = 6.375 saturates to 6 -> 1536; 1300/256 = 5.08 -> 6;
    # 1200/256 = 4.69 -> 4; 100/256 = 0.39 -> 0.5
    block0 = [2688.0] + [0.0] * 15
    block1 = [1632.0, 1300.0, 1200.0, 100.0, -1632.0] + [0.0] * 11
    payload, y = roundtrip(NVFP4Codec(), t(block0 + block1))
    assert payload[4:6].view(torch.float8_e4m3fn).float().tolist() == [448.0, 256.0]
    assert y[16:21].tolist() == [1536.0, 1536.0, 1024.0, 128.0, -1536.0]
    assert y[:16].tolist() == block0


def test_nvfp4_two_level_scale_and_single_element():
    payload, y = roundtrip(NVFP4Codec(), t([3.0]))
    assert payload.numel() == 13
    assert f32(payload[:4]).item() == pytest.approx(3.0 / 2688, rel=1e-7)
    assert payload[4:5].view(torch.float8_e4m3fn).item() == 448.0
    assert y.item() == pytest.approx(3.0, rel=1e-6)
    # a block far below the tensor's amax: its E4M3 scale underflows to 0 and it decodes to zeros
    _, y = roundtrip(NVFP4Codec(), t([1.0e6] + [0.0] * 15 + [1.0e-3] * 16))
    assert y[16:].abs().max().item() == 0.0


# -- zeros, edges, dtypes, devices ----------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_zeros_stay_zeros(name):
    codec = get_codec(name)
    payload, y = roundtrip(codec, torch.zeros(37))
    assert torch.equal(y, torch.zeros(37))
    if name.startswith("fp8") or name == "nvfp4":
        assert f32(payload[:4]).item() == 1.0  # scale 1 for an all-zero group


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("numel", [0, 1, 2, 15, 16, 17, 31, 32, 33, 127, 128, 129, 300])
def test_block_edges(name, numel):
    codec = get_codec(name)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)) * 3
    payload, y = roundtrip(codec, x)
    assert y.shape == (numel,) and y.dtype == torch.float32
    assert_within_bound(codec, x, y)


@pytest.mark.parametrize("name", ["fp32", "fp8_e4m3", "fp8_e5m2_b32", "nvfp4"])
def test_shapes_dtypes_and_slices_of_a_gathered_buffer(name):
    codec = get_codec(name)
    x = (torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0)) * 0.01).to(torch.bfloat16)
    payload = codec.encode(x, name="w")
    y = codec.decode(payload, x.numel(), dtype=torch.bfloat16)
    assert y.shape == (105,) and y.dtype == torch.bfloat16 and y.device == x.device
    # payloads of odd sizes concatenated as an all_gather would: slices at unaligned offsets decode the same
    a, b = torch.randn(7), torch.randn(45)
    pa, pb = codec.encode(a), codec.encode(b)
    wire = torch.cat([torch.zeros(3, dtype=torch.uint8), pa, pb])
    assert torch.equal(codec.decode(wire[3 : 3 + pa.numel()], 7), codec.decode(pa, 7))
    assert torch.equal(codec.decode(wire[3 + pa.numel() :], 45), codec.decode(pb, 45))


def test_decode_rejects_wrong_payloads_and_encode_wrong_inputs():
    codec = FP8Codec("e4m3", 4)
    payload = codec.encode(torch.randn(10))
    with pytest.raises(CodecError, match="bytes"):
        codec.decode(payload, 11)
    with pytest.raises(CodecError, match="uint8"):
        codec.decode(payload.to(torch.int8), 10)
    with pytest.raises(CodecError, match="uint8"):
        codec.decode(payload.view(1, -1), 10)
    with pytest.raises(CodecError, match="dtype"):
        codec.decode(payload, 10, dtype=torch.int32)
    with pytest.raises(CodecError, match="int64"):
        codec.encode(torch.arange(4), name="counts")
    assert codec.decode(codec.encode(torch.empty(0)), 0).shape == (0,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ALL)
def test_cuda_matches_cpu_bytes(name):
    codec = get_codec(name)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    payload = codec.encode(x.cuda())
    assert payload.is_cuda and torch.equal(payload.cpu(), codec.encode(x))
    y = codec.decode(payload, 1000)
    assert y.is_cuda and torch.equal(y.cpu(), codec.decode(codec.encode(x), 1000))


# -- non-finite values ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_nonfinite_raises_naming_the_tensor(name):
    codec = get_codec(name)
    with pytest.raises(NonFiniteError, match=r"'layers\.3\.fc2\.weight'.*2 NaN, 1 inf") as info:
        codec.encode(t([1.0, NAN, -INF, NAN, 2.0]), name="layers.3.fc2.weight")
    assert info.value.tensor_name == "layers.3.fc2.weight" and info.value.codec == name
    assert (info.value.n_nan, info.value.n_inf) == (2, 1)
    assert isinstance(info.value, CodecError)


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nonfinite_propagate_poisons_its_scale_group(bad):
    x = torch.linspace(-1, 1, 40)
    x[21] = bad  # in block 2 of blocks of 8
    _, y = roundtrip(get_codec("fp8_e4m3", nonfinite="propagate"), x)
    assert torch.isnan(y).all()
    _, y = roundtrip(get_codec("fp8_e5m2_b8", nonfinite="propagate"), x)
    assert torch.isnan(y[16:24]).all() and torch.isfinite(torch.cat([y[:16], y[24:]])).all()
    _, y = roundtrip(get_codec("nvfp4", nonfinite="propagate"), x)
    assert torch.isnan(y).all()
    _, y = roundtrip(get_codec("fp32", nonfinite="propagate"), x)
    torch.testing.assert_close(y, x, rtol=0, atol=0, equal_nan=True)


# -- accuracy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, bound",
    [("fp8_e4m3", 0.04), ("fp8_e5m2", 0.07), ("fp8_e4m3_b128", 0.04), ("fp8_e5m2_b32", 0.07), ("nvfp4", 0.12)],
)
def test_relative_error_on_gaussian_data(name, bound):
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(7))
    _, y = roundtrip(get_codec(name), x)
    rel = ((y - x).norm() / x.norm()).item()
    assert rel < bound
    assert rel > bound / 4  # it is lossy in the measured amount (e4m3 ~0.027, e5m2 ~0.053, nvfp4 ~0.095)


def test_block_scales_follow_magnitudes_that_vary_by_block():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 128, generator=g) * torch.logspace(0, -8, 64).unsqueeze(1)).reshape(-1)
    err = {n: ((roundtrip(get_codec(n), x)[1] - x).norm() / x.norm()).item() for n in ("fp8_e4m3", "fp8_e4m3_b128")}
    small = x.reshape(64, 128)[32:].reshape(-1)  # blocks 1e4..1e8 times below the largest
    err_small = {n: ((roundtrip(get_codec(n), small)[1] - small).norm() / small.norm()).item() for n in err}
    assert err["fp8_e4m3_b128"] <= err["fp8_e4m3"] < 0.04
    per_tensor_tail = get_codec("fp8_e4m3").decode(get_codec("fp8_e4m3").encode(x), x.numel()).reshape(64, 128)[48:]
    assert per_tensor_tail.abs().max().item() == 0.0  # flushed to zero by one tensor-wide scale
    assert err_small["fp8_e4m3_b128"] < 0.04


# -- property: error within the format's step ------------------------------------------------------------

_MANTISSA = {"e4m3": (3, 2.0**-10), "e5m2": (2, 2.0**-17)}  # mantissa bits, half the smallest subnormal


def assert_within_bound(codec, x, y):
    """Each decoded value is within half a step of the format (in float64, with float32 slack)."""
    x64, y64 = x.double(), y.double()
    err = (y64 - x64).abs()
    assert torch.isfinite(y64).all()
    assert (y64 * x64 >= 0).all()  # sign kept (zeros may flush)
    if isinstance(codec, Float32Codec):
        assert torch.equal(y, x)
        return
    if x.numel() == 0:
        return
    ax = x64.abs()
    if isinstance(codec, FP8Codec):
        mbits, sub_half = _MANTISSA[codec.fmt]
        b = codec.block_size or x.numel()
        amax = torch.nn.functional.pad(ax, (0, -x.numel() % b)).view(-1, b).amax(1).repeat_interleave(b)[: x.numel()]
        scale = amax / codec.fmt_max
        bound = 2.0 ** -(mbits + 1) * ax + sub_half * scale + 1e-6 * (ax + scale)
    else:
        b = 16
        block_amax = torch.nn.functional.pad(ax, (0, -x.numel() % b)).view(-1, b).amax(1).repeat_interleave(b)[: x.numel()]
        g = ax.max() / 2688
        # E2M1 half step <= |x|/4 (or eff/4 below 1), E4M3 block-scale rounding <= 1/16 relative (2**-10
        # absolute when subnormal), which can saturate the block's top values by that much
        eff = block_amax / 6 * (1 + 2.0**-4) + g * 2.0**-10
        bound = 0.25 * ax + 0.25 * eff + torch.maximum(block_amax / 16, 6 * g * 2.0**-10) + 1e-6 * (ax + block_amax)
    bad = err > bound
    assert not bad.any(), f"{codec.name}: x={x64[bad][:5].tolist()} y={y64[bad][:5].tolist()} bound={bound[bad][:5].tolist()}"


_magnitudes = st.floats(min_value=2.0**-100, max_value=2.0**100, width=32)
_values = st.one_of(st.just(0.0), _magnitudes, _magnitudes.map(lambda v: -v))


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3_b5", "fp8_e5m2_b3", "nvfp4"])
@settings(max_examples=150, deadline=None)
@given(values=st.lists(_values, max_size=70))
def test_roundtrip_error_within_the_format_step(name, values):
    x = t(values)
    codec = get_codec(name)
    payload, y = roundtrip(codec, x)
    assert_within_bound(codec, x, y)
