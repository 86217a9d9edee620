"""lab.generative.video: schedules' x0 hinge, coordinated denoising, ConFiner-Long noise, weights, data split."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from scipy import stats

from lab.generative.learned import build_unet, unet_config
from lab.generative.video import confiner as cf
from lab.generative.video import datasets, metrics
from lab.generative.video.experts import EXPERTS, Expert, WeightsChecksumError, expert_files, load_expert
from lab.generative.video.schedules import SCHEDULES, get_schedule

PAIRS = [(a, b) for a in SCHEDULES for b in SCHEDULES if a != b]


@pytest.mark.parametrize("a,b", PAIRS)
@pytest.mark.parametrize("t", [1, 100, 500, 999])
def test_renoise_exact_x0_on_one_schedule_reads_back_exactly_from_another(a, b, t):
    """Eq. 9/11: noise an exact x0 on schedule a; an expert that predicts the true noise gives x0 back on a,
    re-noising that x0 on b (same eps) and reading x0 back from b is exact."""
    g = torch.Generator().manual_seed(t)
    x0 = torch.rand((3, 8, 16, 16), generator=g, dtype=torch.float64) * 2 - 1
    eps = torch.randn(x0.shape, generator=g, dtype=torch.float64)
    sa, sb = get_schedule(a), get_schedule(b)
    x_a = sa.add_noise(x0, eps, t)
    x0_a = sa.x0_from_eps(x_a, eps, t)
    x_b = sb.add_noise(x0_a, eps, t)
    assert torch.allclose(sb.x0_from_eps(x_b, eps, t), x0, atol=1e-9, rtol=0)
    # the network-output view: an oracle output (eps, or v = eps - x0) decodes to the same x0 on each schedule
    for s, x in ((sa, x_a), (sb, x_b)):
        x0_hat, eps_hat = s.from_output(x, s.target(x0, eps), t)
        assert torch.allclose(x0_hat, x0, atol=1e-9) and torch.allclose(eps_hat, eps, atol=1e-9)
    # different schedules really do put the same (x0, eps) at different noise levels
    assert not torch.allclose(x_a, x_b)


def _tiny_expert(schedule: str, kind: str = "frame", seed: int = 0, name: str = "e") -> Expert:
    torch.manual_seed(seed)
    unet = build_unet(unet_config(16, 1 if kind == "frame" else 8, (8, 16), 1, 4)).eval().requires_grad_(False)
    return Expert(lambda x, t: unet(x, t).sample, get_schedule(schedule), kind, name=name)


def test_coordinated_with_two_identical_experts_is_plain_sampling():
    s1 = _tiny_expert("ddpm_linear", seed=1, name="spatial")
    s2 = _tiny_expert("ddpm_linear", seed=1, name="temporal")
    x = torch.randn((2, 8, 16, 16), generator=torch.Generator().manual_seed(0))
    plain = cf.refine(x, 200, 4, s1, s2, mode="spatial_only")
    coord = cf.refine(x, 200, 4, s1, s2, mode="coordinated", renoise="predicted")
    assert torch.allclose(coord, plain, atol=1e-5)
    # the check can fail: a different temporal expert (other weights, other schedule) changes the result
    other = _tiny_expert("cosine", seed=2, name="temporal")
    assert (cf.refine(x, 200, 4, s1, other, mode="coordinated", renoise="predicted") - plain).abs().max() > 1e-2
    # with fresh re-noising the chain is stochastic, not plain DDIM, even for identical experts
    fresh = cf.refine(x, 200, 4, s1, s2, mode="coordinated", renoise="fresh", generator=torch.Generator().manual_seed(0))
    assert (fresh - plain).abs().max() > 1e-3


def test_nfe_of_every_mode():
    c = _tiny_expert("flow_sigma", "clip", name="control")
    s = _tiny_expert("ddpm_linear", name="spatial")
    t = _tiny_expert("cosine", "clip", name="temporal")
    noise = torch.randn((1, 8, 16, 16))
    want = {"coordinated": 4 + 3 * 5, "spatial_only": 4 + 5, "temporal_only": 4 + 5, "naive_alternation": 4 + 15}
    for mode, n in want.items():
        g = cf.confiner(noise, c, s, t, 4, 5, 100, mode)
        assert g.nfe == n, mode
        assert g.video.shape == noise.shape and torch.isfinite(g.video).all()
    assert cf.sample_expert(s, noise, 10).nfe == 10
    with pytest.raises(cf.ConFinerError, match="bogus"):
        cf.confiner(noise, c, s, t, mode="bogus")
    with pytest.raises(cf.ConFinerError, match="T_e"):
        cf.confiner(noise, c, s, t, t_e=0)


def test_frame_wise_shuffled_base_noise_keeps_each_frame_standard_gaussian():
    g = torch.Generator().manual_seed(0)
    vals = {j: [] for j in range(8)}
    for _ in range(300):
        base = torch.randn((8, 4, 4), generator=g)
        segs = cf.shuffled_noise(base, 3, g)
        for k in range(3):  # each segment is a permutation of the base frames
            assert sorted(segs[k].flatten().tolist()) == sorted(base.flatten().tolist())
        for j in range(8):
            vals[j].append(segs[2, j].flatten())
    for j in range(8):
        x = torch.cat(vals[j]).numpy()
        assert stats.kstest(x, "norm").pvalue > 1e-3, j
    # the test can fail: a biased "shuffle" (scaled frames) is caught
    assert stats.kstest(1.3 * torch.cat(vals[0]).numpy(), "norm").pvalue < 1e-3


def test_confiner_long_strategies_windows_and_nfe():
    c = _tiny_expert("flow_sigma", "clip", name="control")
    s = _tiny_expert("ddpm_linear", name="spatial")
    t = _tiny_expert("cosine", "clip", name="temporal")
    wins = cf._windows(64, 8, True)
    kept = sorted(i for _, _, a, b in wins for i in range(a, b))
    assert kept == list(range(64)) and any(a == 4 and b == 12 for a, b, _, _ in wins)
    assert cf._windows(64, 8, False) == [(s_, s_ + 8, s_, s_ + 8) for s_ in range(0, 64, 8)]
    g = cf.confiner_long(64, c, s, t, size=16, control_steps=2, refine_steps=2)
    assert g.video.shape == (1, 64, 16, 16) and torch.isfinite(g.video).all()
    assert g.nfe == 8 * 2 + 2 * 2 * 8 + 2 * 9   # control, two spatial calls per step x 8 segments, temporal x 9 windows
    off = cf.confiner_long(64, c, s, t, size=16, control_steps=2, refine_steps=2, consistency_init=False,
                           coherence_guidance=False, staggered=False)
    assert off.nfe == 8 * 2 + 2 * 2 * 8 + 2 * 8 and not torch.allclose(off.video, g.video)
    with pytest.raises(cf.ConFinerError, match="multiple"):
        cf.confiner_long(60, c, s, t)


@pytest.mark.parametrize("name", sorted(EXPERTS))
def test_shipped_experts_load_verified(name):
    e = load_expert(name)
    kind, sched, steps = EXPERTS[name]
    assert (e.kind, e.schedule.name, e.full_steps) == (kind, sched, steps)
    x0, eps = e.predict(torch.zeros((1, 8, e.meta["size"], e.meta["size"])), 500)
    assert x0.shape == eps.shape == (1, 8, e.meta["size"], e.meta["size"])


def test_corrupted_weights_are_refused_with_path_and_both_checksums(tmp_path):
    st, side = expert_files("spatial")
    shutil.copy(st, tmp_path / st.name)
    shutil.copy(side, tmp_path / side.name)
    load_expert("spatial", tmp_path)  # intact copy loads
    blob = bytearray((tmp_path / st.name).read_bytes())
    blob[-7] ^= 0xFF
    (tmp_path / st.name).write_bytes(bytes(blob))
    with pytest.raises(WeightsChecksumError) as err:
        load_expert("spatial", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / st.name) in msg and err.value.expected in msg and err.value.actual in msg
    assert err.value.expected != err.value.actual


def test_held_out_frames_are_never_in_training_clips():
    train = datasets.clips("train", 8, 16)
    test = datasets.frames("test", 16)
    assert train.shape[1:] == (8, 16, 16) and float(train.min()) >= -1 and float(train.max()) <= 1
    d = torch.cdist(test.flatten(1), train.flatten(0, 1).flatten(1))
    assert float(d.min()) > 0
    r = datasets.split_ranges(120)  # blocks of 12 frames, pattern t t v s t t t v t s
    assert r == {"train": [(0, 24), (48, 84), (96, 108)], "val": [(24, 36), (84, 96)], "test": [(36, 48), (108, 120)]}
    r = datasets.split_ranges(250)  # blocks of 16, the pattern repeated, the last block (10 frames) train
    assert r["test"] == [(48, 64), (144, 160), (208, 224)] and r["train"][-1] == (224, 250)
    assert sum(b - a for runs in r.values() for a, b in runs) == 250
    # held-out blocks lie all over each video (the split by time put every test frame after every training frame)
    assert r["test"][0][1] < r["train"][-1][0]
    with pytest.raises(datasets.VideoDataError, match="9 frames"):
        datasets.split_ranges(9)
    with pytest.raises(datasets.VideoDataError, match="nosuch"):
        datasets.clips("train", sources=["nosuch"])


def test_metrics_on_known_videos():
    still = torch.zeros((2, 8, 16, 16)) + torch.linspace(-1, 1, 16)
    assert torch.allclose(metrics.motion_smoothness(still), torch.ones(2))
    flicker = still.clone()
    flicker[:, 1::2] *= -1
    assert float(metrics.motion_smoothness(flicker).max()) < 0.9
    f = torch.randn((2, 8, 5))
    assert torch.allclose(metrics.subject_consistency(f[:, :1].expand(2, 8, 5)), torch.ones(2), atol=1e-6)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 3))
    assert metrics.frechet_distance(a, a) < 1e-6 < metrics.frechet_distance(a, a + 1.0)
    # motion_distance: 0 against itself, a still video scores the real mean jump, and more motion is farther
    real = torch.cumsum(torch.randn((6, 8, 5), generator=torch.Generator().manual_seed(1)), dim=1)
    assert metrics.motion_distance(real, real) == 0.0
    jumps = metrics.frame_jumps(real)
    assert jumps.shape == (6, 7) and float(jumps.min()) > 0
    assert abs(metrics.motion_distance(real[:, :1].expand(6, 8, 5), real) - float(jumps.mean())) < 1e-6
    assert metrics.motion_distance(3 * real, real) > metrics.motion_distance(1.1 * real, real) > 0
    seam = torch.zeros((1, 16, 2))
    seam[:, 8:] = 1.0
    seam[:, :, 1] = torch.arange(16) * 0.1
    assert float(metrics.seam_flicker(seam, 8)) > 5
    assert float(metrics.seam_jump(seam, 8)) == pytest.approx((1.0 + 0.1**2) ** 0.5)  # the one seam, 7 -> 8
    # a video jittering everywhere lowers the flicker ratio but not the seam jump
    jitter = seam + torch.randn((1, 16, 2), generator=torch.Generator().manual_seed(0))
    assert float(metrics.seam_flicker(jitter, 8)) < float(metrics.seam_flicker(seam, 8))


def _hand_schedule(name: str, table: dict):
    from lab.generative.video.schedules import Schedule, T

    alpha, sigma = torch.ones(T + 1, dtype=torch.float64), torch.zeros(T + 1, dtype=torch.float64)
    for t, (a, s) in table.items():
        alpha[t], sigma[t] = a, s
    return Schedule(name, alpha, sigma, "epsilon")


def test_coordinated_denoising_matches_a_hand_solved_case_of_eqs_8_to_11():
    """Two frames of one pixel, two refinement steps (t = 500 -> 250 -> 0) on made-up schedules
    S_s: (alpha, sigma) = (3/5, 4/5) at 500, (4/5, 3/5) at 250; S_t: (4/5, 3/5) at 500, (3/5, 4/5) at 250.
    Spatial expert: eps_hat = x / 4 per frame; temporal expert: eps_hat = x - mean over frames.
    By hand (exact fractions), from x = (1/2, -1/4) at t = 500:
      Eq. 8   x0_S = (x - 4/5 x/4) / (3/5) = 4/3 x = (2/3, -1/3)
      Eq. 9   V'' = 4/5 x0_S + 3/5 eps_S = 73/60 x = (73/120, -73/240)
      Eq. 10  eps_T = V'' - mean(V'') = (219/480)(1, -1);  x0_T = (V'' - 3/5 eps_T) / (4/5) = (803/1920, -73/1920)
      Eq. 11  V' = 3/5 x0_T + 4/5 eps_T = (1971/3200, -1241/3200)
      spatial DDIM step to 250: x0 = 4/3 V', eps = V'/4 -> 4/5 x0 + 3/5 eps = (47961/64000, -90593/192000)
    and the same four updates at t = 250 give (1171458083/1843200000, -188161661/614400000)."""
    s_s = _hand_schedule("hand_s", {500: (0.6, 0.8), 250: (0.8, 0.6)})
    s_t = _hand_schedule("hand_t", {500: (0.8, 0.6), 250: (0.6, 0.8)})
    spatial = Expert(lambda x, t: x / 4, s_s, "frame", name="spatial", clip_x0=False)
    temporal = Expert(lambda x, t: x - x.mean(1, keepdim=True), s_t, "clip", name="temporal", clip_x0=False)
    x = torch.tensor([0.5, -0.25], dtype=torch.float64).view(1, 2, 1, 1)
    two = cf.refine(x, 500, 2, spatial, temporal, "coordinated", renoise="predicted").flatten()
    want = torch.tensor([1171458083 / 1843200000, -188161661 / 614400000], dtype=torch.float64)
    assert torch.allclose(two, want, atol=1e-12, rtol=0), two
    assert spatial.nfe == 2 * 2 and temporal.nfe == 2            # three calls per step: spatial, temporal, spatial
    one = cf.refine(x, 500, 1, spatial, temporal, "coordinated", renoise="predicted").flatten()
    assert torch.allclose(one, torch.tensor([1971 / 2400, -1241 / 2400], dtype=torch.float64), atol=1e-12)  # x0 = 4/3 V'
    # fresh re-noising: Eqs. 9 and 11 take two new draws z1, z2 (in that order) instead of the predicted noise
    g = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn((1, 2, 1, 1), generator=g), torch.randn((1, 2, 1, 1), generator=g)
    v2 = 0.8 * torch.tensor([2 / 3, -1 / 3], dtype=torch.float64).view(1, 2, 1, 1) + 0.6 * z1
    eps_t = v2 - v2.mean(1, keepdim=True)
    v1 = 0.6 * (v2 - 0.6 * eps_t) / 0.8 + 0.8 * z2
    fresh = cf.refine(x, 500, 1, spatial, temporal, "coordinated", renoise="fresh", generator=torch.Generator().manual_seed(3))
    assert torch.allclose(fresh, 4 / 3 * v1, atol=1e-6)
    # and the check can fail: swapping the schedules of Eqs. 9 / 11 (a wrong hinge) changes the answer
    swapped = cf.refine(x, 500, 2, Expert(lambda x, t: x / 4, s_t, "frame", clip_x0=False),
                        Expert(lambda x, t: x - x.mean(1, keepdim=True), s_s, "clip", clip_x0=False), "coordinated", renoise="predicted")
    assert (swapped.flatten() - want).abs().max() > 1e-2


def test_training_tracks_the_heldout_loss_and_ships_the_best_ema(tmp_path):
    """train(eval_every=...) records the held-out (val split) loss curve in the sidecar, ships the EMA of its lowest
    point (reloading the shipped file reproduces that number), and stops after ``patience`` evaluations without
    improvement."""
    from lab.generative.video import train as tr

    meta = tr.train("spatial", 40, str(tmp_path), widths=(8, 16), batch=8, eval_every=10, patience=2, lr=1e-2)
    curve = meta["val_loss_curve"]
    assert curve and [c[0] for c in curve] == list(range(10, 10 * len(curve) + 1, 10))
    best_step, best = min(curve, key=lambda c: c[1])
    assert meta["heldout_loss"]["best_step"] == best_step
    shipped = load_expert("spatial", tmp_path)
    xv = tr._heldout_data("spatial", 8, meta["size"])
    assert abs(tr.heldout_loss(shipped.net.unet, "spatial", xv) - best) < 1e-4
    if meta["early_stopped"]:
        assert meta["steps_run"] < 40 and all(c[1] >= best for c in curve[-2:]) and curve[-3][0] >= best_step
    else:
        assert meta["steps_run"] == 40
    with pytest.raises(SystemExit, match="patience"):
        tr.train("spatial", 10, str(tmp_path / "x"), eval_every=5, patience=0)


def test_paired_fd_difference_of_the_benchmark():
    """benchmarks.video.paired_fd_difference: 0 for the same videos, and an interval excluding 0 for shifted ones."""
    from benchmarks.video import paired_fd_difference

    rng = np.random.default_rng(0)
    real = rng.normal(size=(300, 4))
    a = rng.normal(size=(40, 8, 4))
    same = paired_fd_difference(a, a, real, seed=0, n_boot=50)
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0]
    worse = paired_fd_difference(a + 1.0, a, real, seed=0, n_boot=50)
    assert worse["mean"] > 2 and worse["ci95"][0] > 0


def test_ultrasound_cine_is_a_second_domain_read_offline_from_the_registry():
    """pydicom's 30-frame ultrasound cine (registry pydicom_medical_images, checksum-verified) decodes to 30 luma
    frames, splits 18 / 6 / 6 in interleaved blocks of 3, and stays out of the natural-video default the shipped experts use."""
    v = datasets.decode("us_cine")
    assert v.shape == (30, 240, 320) and v.dtype == np.uint8 and v.std() > 10 and v.min() == 0 and v.max() == 255
    assert datasets.frames("train", 16, ["us_cine"]).shape == (18, 1, 16, 16)
    assert datasets.frames("test", 16, ["us_cine"]).shape == (6, 1, 16, 16)
    assert datasets.clips("train", 8, 16, ["us_cine"]).shape == (2, 8, 16, 16)  # only the 9-frame run holds a clip
    with pytest.raises(datasets.VideoDataError, match="us_cine.*longest run.*3 frames"):
        datasets.clips("val", 8, 16, ["us_cine"])
    natural = datasets.clips("train", 8, 16)
    assert natural.shape[0] == datasets.clips("train", 8, 16, datasets.DOMAINS["natural"]).shape[0] == 170
    # frames move: the cine is a video, not a still repeated
    f = datasets.frames_of("us_cine", 16)
    assert float((f[1:] - f[:-1]).abs().mean()) > 1e-3


def test_timestep_at_a_noise_to_signal_ratio_is_hand_solved():
    """flow_sigma: sigma / alpha = t / (T - t), so r = 1 is t = 500 and r = 0.25 is t = 200; ddpm_linear's t for
    r = 1 is where abar_t = 1/2; a non-positive ratio is refused."""
    assert get_schedule("flow_sigma").timestep_at(1.0) == 500
    assert get_schedule("flow_sigma").timestep_at(0.25) == 200
    s = get_schedule("ddpm_linear")
    t = s.timestep_at(1.0)
    abar = s.alpha ** 2
    assert abs(float(abar[t]) - 0.5) <= abs(float(abar[t - 1]) - 0.5) and abs(float(abar[t]) - 0.5) <= abs(float(abar[t + 1]) - 0.5)
    assert 200 < t < 300
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="noise_to_signal"):
            s.timestep_at(bad)


def test_denoising_psnr_of_an_oracle_and_of_a_zero_estimate():
    """An expert whose x0_hat is the truth scores the clamp's ceiling; one that answers 0 scores 10 log10(4 / mean x^2);
    a mismatched eps is refused."""
    clips = torch.rand((3, 8, 16, 16), generator=torch.Generator().manual_seed(0)) * 1.6 - 0.8
    eps = torch.randn(clips.shape, generator=torch.Generator().manual_seed(1))

    class Fixed:
        def __init__(self, answer):
            self.schedule, self.answer = get_schedule("cosine"), answer

        def predict(self, x_t, t):
            return self.answer, eps

    t, oracle = metrics.denoising_psnr(Fixed(clips), clips, 0.5, eps)
    assert t == get_schedule("cosine").timestep_at(0.5) and bool((oracle > 150).all())
    _, zero = metrics.denoising_psnr(Fixed(torch.zeros_like(clips)), clips, 0.5, eps)
    expected = 10 * torch.log10(4 / clips.double().pow(2).flatten(1).mean(1))
    assert torch.allclose(zero, expected, atol=1e-9)
    with pytest.raises(ValueError, match="same shape"):
        metrics.denoising_psnr(Fixed(clips), clips, 0.5, eps[:2])
