"""The placement predictors of lab.hpc.forecast: EASY forward simulation against a hand-solved queue,
the site-history waits against brute force, the history-blend predictor, and the tie tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from lab.hpc.errors import PlacementError, ReplayError
from lab.hpc.forecast import EasyForecaster, HistoryBlendPredictor, history_waits, simulate_queue
from lab.hpc.placement import SiteState, earliest_completion
from lab.hpc.sim import SiteTimeline, Telemetry, earliest_fit


def hand_queue(**kw):
    # capacity 10; running A (6 procs, planned/real end 100), B (2 procs, end 50);
    # pending in order: H 8 procs req 100, J 2 procs req 30, K 4 procs req 500 (they run their request)
    return simulate_queue(0.0, 10, [100, 50], [100, 50], [6, 2], [8, 2, 4], [100, 30, 500], [100, 30, 500], **kw)


def test_easy_forward_simulation_matches_the_hand_solved_queue():
    fc = hand_queue()
    # t=0: free 2, H waits (shadow 100, extra 2), J backfills (ends 30 <= 100): free 0
    # t=30: J ends, free 2; t=50: B ends, free 4; t=100: A ends, H starts (free 2), K is the head (shadow 200, extra 6)
    # t=200: H ends, K starts (free 6), queue empty; t=700: K ends
    assert fc.times.tolist() == [0, 30, 50, 100, 200, 700]
    assert fc.free.tolist() == [0, 2, 4, 2, 6, 10]
    assert fc.shadow.tolist() == [100, 100, 100, 200, np.inf, np.inf]
    assert fc.extra.tolist() == [2, 2, 2, 6, 0, 0]
    assert fc.probe_start(2, 30) == 30  # backfills before H's shadow time
    assert fc.probe_start(2, 200) == 30  # too long for the shadow, but fits in H's extra 2
    assert fc.probe_start(4, 10) == 50  # needs B's 2 too; ends before 100
    assert fc.probe_start(4, 150) == 200  # would delay H (t=50) and K (t=100): starts beside K
    assert fc.probe_start(10, 10) == 700  # the whole machine: after K
    assert fc.probe_start(11, 10) == np.inf


def test_easy_forward_simulation_holds_pending_jobs_until_the_next_release():
    # capacity 4; R (1 proc) runs until 30; pending J (2 procs, 100 s) fits the 3 free at t=0, but the live
    # scheduler did not start it: held, it is first considered at R's release (shadow 30, extra 4 - 2 = 2)
    held = simulate_queue(0.0, 4, [30], [30], [1], [2], [100], [100], start_pending=False)
    assert held.probe_start(3, 10) == 0  # ends before J's shadow time: backfills now
    assert held.probe_start(3, 50) == 130  # would delay J (extra 2 < 3): after J ends (J starts at 30)
    started = simulate_queue(0.0, 4, [30], [30], [1], [2], [100], [100], start_pending=True)
    assert started.probe_start(3, 10) == 100  # J took 2 of the free processors at once; 3 free only when J ends


def test_easy_forward_simulation_checks_its_input():
    with pytest.raises(ReplayError, match="running arrays"):
        simulate_queue(0.0, 4, [1, 2], [1], [1], [], [], [])
    with pytest.raises(ReplayError, match="capacity"):
        simulate_queue(0.0, 0, [], [], [], [], [], [])
    with pytest.raises(ReplayError, match="ratio_quantile"):
        EasyForecaster(ratio_quantile=150)


def test_history_waits_match_earliest_fit_on_random_profiles():
    rng = np.random.default_rng(0)
    for _ in range(60):
        k = int(rng.integers(2, 30))
        times = np.sort(rng.uniform(0, 1000, k))
        times[0] = 0.0
        busy, down = rng.integers(0, 11, k), rng.random(k) < 0.1
        tel = Telemetry(ratios=np.zeros(0), waits=np.zeros(0), window_s=1e4, profile_times=times, profile_busy=busy, profile_down=down)
        p, d = int(rng.integers(1, 8)), float(rng.uniform(1, 200))
        fit, waits, censored, free = history_waits(tel, 1000.0, 10, p, d, lookback_s=1000.0, step_s=37.0)
        subs = np.arange(1000.0 - d - 37.0, -1e-9, -37.0)[::-1]
        tt, ok = np.append(times, 1000.0), np.append((busy + p <= 10) & ~down, False)  # nothing known after t
        assert len(subs) == len(waits)
        for s, w, c, f, fr in zip(subs, waits, censored, fit, free):
            e = earliest_fit(tt, ok, s, d)
            assert c == (not np.isfinite(e))
            assert w == pytest.approx(e - s if np.isfinite(e) else max(1000.0 - d - s, 0.0))
            seg = np.searchsorted(tt, s, side="right") - 1
            assert f == ok[seg] and fr == (0 if down[seg] else max(10 - busy[seg], 0))


def blend_site():
    # capacity 4; a 2-proc job every 1000 s from t=0 for 600 s, except that from 20,000 s a 4-proc job
    # runs 20,000..20,900 and a 2-proc job pending from 20,500 to 21,000
    submit = [float(t) for t in range(0, 20000, 1000)] + [20000.0, 20500.0]
    start = submit[:-1] + [21000.0]
    end = [s + 600 for s in submit[:-2]] + [20900.0, 21600.0]
    procs = [2] * 20 + [4, 2]
    return SiteTimeline(submit, start, end, procs, [900.0] * 22, 4, name="s", downtime_min_s=None)


def test_history_blend_predictor_uses_past_fits_now_waits_and_the_forecast_elsewhere():
    site = blend_site()
    pred = HistoryBlendPredictor(lookback_s=20000.0, step_s=100.0, base=dict(running_end="requested", pending_start="next_release", pending_duration="requested", fits_now=True))
    obs = site.observe(19950.0)  # nothing running: 4 free
    fit, waits, _, _ = history_waits(obs.telemetry, obs.time, 4, 4, 300.0, lookback_s=20000.0, step_s=100.0)
    assert fit.any() and (~fit).any()
    assert pred.predict_start(obs, 4, 300.0) == pytest.approx(obs.time + np.percentile(waits[fit], 50))
    busy = site.observe(20600.0)  # the 4-proc job runs (requested end 20,900), a 2-proc job pending
    assert busy.free == 0
    assert pred.predict_start(busy, 3, 300.0, profile=pred.plan(busy)) == pred.base.predict_start(busy, 3, 300.0)
    avg = HistoryBlendPredictor(lookback_s=20000.0, step_s=100.0, not_fit="avg", base=pred.config.base)
    f2, w2, _, _ = history_waits(busy.telemetry, busy.time, 4, 3, 300.0, lookback_s=20000.0, step_s=100.0)
    assert (~f2).sum() >= 6  # 3 procs did not fit while a 2-proc job ran
    want = 0.5 * (pred.base.predict_start(busy, 3, 300.0) + busy.time + w2[~f2].mean())
    assert avg.predict_start(busy, 3, 300.0) == pytest.approx(want) and want != pred.base.predict_start(busy, 3, 300.0)
    with pytest.raises(ReplayError, match="not_fit"):
        HistoryBlendPredictor(not_fit="sometimes")


def test_earliest_completion_tie_tolerance_breaks_near_ties_by_fewest_pending():
    views = [SiteState("a", pending=9, free=0, predicted_completion=100.0), SiteState("b", pending=1, free=5, predicted_completion=140.0), SiteState("c", pending=0, free=5, predicted_completion=400.0)]
    assert earliest_completion(views).site == "a"  # no tolerance: the smallest prediction
    assert earliest_completion(views, tie_within_s=60).site == "b"  # a and b tie; b has fewer pending
    assert earliest_completion(views, tie_within_s=300).site == "c"
    with pytest.raises(PlacementError, match="tie_within_s"):
        earliest_completion(views, tie_within_s=-1)


@pytest.mark.parametrize("target", [None, 2.0, 0.5])
def test_thin_load_keeps_the_offered_load_near_the_target(target):
    from benchmarks.placement_live import thin_load
    from lab.hpc.schedulers.base import JobSpec

    jobs = [(float(i), JobSpec(name="bg", command="sleep 2.00", ntasks=2, walltime_s=60)) for i in range(1000)]
    kept, offered = thin_load(jobs, 4, 1000.0, target, np.random.default_rng(0))  # 4,000 CPU-s over 1,000 s x 4 CPUs
    assert offered == 1.0
    if target is None or target >= offered:
        assert kept == jobs
    else:
        assert 0.4 < len(kept) / len(jobs) < 0.6 and all(j in jobs for j in kept)
