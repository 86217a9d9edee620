"""lab.hpc.sim and benchmarks.placement_replay: hand-solved EASY backfill, probe holes, predictor, bootstrap, end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import placement_replay as pr
from lab.hpc.sim import (
    PlannedProfile,
    QueuePredictor,
    SiteTimeline,
    earliest_fit,
    easy_backfill,
    synthesize_requests,
)

# --------------------------------------------------------------------------------------------- EASY backfill


def test_easy_backfill_short_job_backfills_long_one_must_not():
    # capacity 4.  A: t=0, 2 procs, 10 s.  B (head): t=1, 4 procs -> reservation at 10 (A's requested end),
    # no extra processors.  C: t=2, 2 procs, 5 s -> ends at 7 <= 10: backfills at once.
    # D: t=3, 1 proc, 20 s -> would end at 23 > 10 with 0 extra processors: must wait; it starts when B ends (20).
    start = easy_backfill(submit=[0, 1, 2, 3], requested_time=[10, 10, 5, 20], run_time=[10, 10, 5, 20], processors=[2, 4, 2, 1], capacity=4)
    assert start.tolist() == [0.0, 10.0, 2.0, 20.0]


def test_easy_backfill_uses_extra_processors_at_the_shadow_time():
    # capacity 4.  A: 3 procs until 10.  B (head): 2 procs -> shadow 10, 4 free then, extra = 2.
    # C: 1 proc for 100 s does not end by 10 but fits in the extra processors: starts at 2; B still starts at 10.
    start = easy_backfill([0, 1, 2], [10, 10, 100], [10, 10, 100], [3, 2, 1], 4)
    assert start.tolist() == [0.0, 10.0, 2.0]
    # C asking 2 processors does not fit in the 1 free processor: it waits for A and starts beside B at 10
    start = easy_backfill([0, 1, 2], [10, 10, 100], [10, 10, 100], [3, 2, 2], 4)
    assert start.tolist() == [0.0, 10.0, 10.0]


def test_easy_backfill_plans_with_requests_but_jobs_end_at_their_run_time():
    # A asks 100 s but runs 10: B (needs all 4) starts when A really ends, not at A's request.
    # C (1 proc, asks 50) cannot backfill before B: shadow = 100 (A's request), 0 + 50 <= 100 -> backfills at 2.
    start = easy_backfill([0, 1, 2], [100, 10, 50], [10, 10, 50], [3, 4, 1], 4)
    assert start.tolist() == [0.0, 52.0, 2.0]


def test_easy_backfill_never_overcommits_and_never_starts_early():
    rng = np.random.default_rng(3)
    n, cap = 300, 16
    submit = np.sort(rng.uniform(0, 2000, n))
    run = rng.uniform(1, 200, n)
    req = run * rng.uniform(1, 3, n)
    procs = rng.integers(1, cap + 1, n)
    start = easy_backfill(submit, req, run, procs, cap)
    assert (start >= submit).all()
    events = np.unique(np.concatenate([start, start + run]))
    busy = [(procs[(start <= t) & (start + run > t)]).sum() for t in events]
    assert max(busy) <= cap
    # the head of the queue is never overtaken by a job that delays it: FCFS order among same-size jobs that
    # could not backfill is kept, and with no room for backfilling (all jobs need the whole machine) it is pure FCFS
    full = easy_backfill(submit[:20], req[:20], run[:20], np.full(20, cap), cap)
    assert (np.diff(full) > 0).all()


def test_easy_backfill_refuses_jobs_larger_than_the_machine():
    with pytest.raises(ValueError, match="1..capacity"):
        easy_backfill([0], [10], [10], [5], 4)


def test_synthesized_requests_round_up_to_standard_walltimes():
    assert synthesize_requests([0, 100, 200, 3000, 40000, 62643]).tolist() == [300, 300, 900, 7200, 86400, 129600]


# --------------------------------------------------------------------------------------------- probe holes

# capacity 10; busy: [0,50): 6, [50,100): 9, [100,150): 3, [150,200): 0, [200,300): 10, then 0
TOY = dict(
    submit=[0, 50, 200],
    start=[0, 50, 200],
    end=[100, 150, 300],
    processors=[6, 3, 10],
    requested_time=[200, 100, 100],
    capacity=10,
)


def toy_site(**kw) -> SiteTimeline:
    return SiteTimeline(**{**TOY, **kw}, name="toy")


@pytest.mark.parametrize(
    "t, procs, runtime, expected",
    [
        (0, 4, 60, 100),  # [0,50) is too short, [50,100) has 9 busy; [100,200) holds 4 for 100 s
        (0, 4, 50, 0),  # exactly fits [0, 50): intervals are half-open
        (0, 4, 51, 100),
        (0, 4, 120, 300),  # [100,200) is only 100 s long; next hole opens when job 3 ends
        (95, 1, 10, 95),  # 9 busy + 1 fits; starts at submission
        (120, 10, 30, 150),  # the whole machine is free on [150, 200)
        (120, 10, 60, 300),
        (-1000, 10, 5, -1000),  # before the first job the machine is empty
        (400, 10, 1e6, 400),  # after the last job, forever
    ],
)
def test_probe_start_hand_computed_holes(t, procs, runtime, expected):
    assert toy_site().probe_start(t, procs, runtime) == expected


def test_probe_start_refuses_a_probe_larger_than_the_machine():
    with pytest.raises(ValueError):
        toy_site().probe_start(0, 11, 10)


def _brute_earliest_fit(times, ok, t, d):
    ends = np.append(times[1:], np.inf)
    for c in sorted({t, *times[times > t].tolist()}):
        if d <= 0:
            good = ok[np.searchsorted(times, c, side="right") - 1]
        else:
            good = all(ok[j] for j in range(len(times)) if times[j] < c + d and ends[j] > c)
        if good:
            return c
    return np.inf


def test_earliest_fit_matches_brute_force_across_chunk_boundaries():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(1, 40))
        times = np.concatenate([[0.0], np.cumsum(rng.uniform(1, 10, k - 1))])
        ok = rng.random(k) < 0.6
        ok[-1] = bool(rng.random() < 0.9)
        t = float(rng.uniform(0, times[-1] + 1))
        d = float(rng.choice([0.0, rng.uniform(0, 30)]))
        want = _brute_earliest_fit(times, ok, t, d)
        for chunk in (1, 2, 3, 2048):
            assert earliest_fit(times, ok, t, d, chunk=chunk) == pytest.approx(want), (times, ok, t, d, chunk)


def test_a_downtime_is_only_observed_once_it_has_lasted_an_hour():
    # the downtime [100, 5000) is inferred in hindsight; at submit time only its first hour tells it
    site = SiteTimeline(
        submit=[0, 100, 100], start=[0, 5000, 5000], end=[100, 5100, 5100], processors=[5, 2, 2], requested_time=[100, 100, 100], capacity=10
    )
    assert site.is_down(200).item()  # hindsight
    early = site.observe(200)
    assert not early.down and early.free == 10 and early.n_pending == 2  # 100 s in: looks like an idle machine
    assert not site.observe(3699).down and site.observe(3700).down and site.observe(4999).down
    assert not site.observe(5000).down and not site.observe(50).down
    assert site.known_down([50, 200, 3700, 5000]).tolist() == [False, False, True, False]
    # the planned start of a probe on a site not yet known to be down is "now" (no down penalty)
    assert QueuePredictor().predict_start(early, 2, 60) == 200


def test_downtime_is_detected_and_blocks_probes():
    # capacity 10: job 1 runs [0, 100); jobs 2 and 3 are submitted at 100 and wait until 5000 on an
    # empty machine: a 4,900 s idle-with-2-waiting interval is a downtime.
    site = SiteTimeline(
        submit=[0, 100, 100], start=[0, 5000, 5000], end=[100, 5100, 5100], processors=[5, 2, 2], requested_time=[100, 100, 100], capacity=10
    )
    assert site.downtimes.tolist() == [[100.0, 5000.0]]
    assert site.probe_start(50, 5, 60) == 5000  # [50, 100) is too short; then down until 5000
    assert site.probe_start(50, 5, 40) == 50
    obs = site.observe(3700)  # the downtime has lasted an hour: now it is known
    assert obs.down and obs.free == 0 and obs.busy == 0 and obs.n_pending == 2
    assert site.free(4999).item() == 0 and site.free(5000).item() == 6
    # one waiting job is not enough evidence (it may be held): no downtime
    lone = SiteTimeline(submit=[0, 100], start=[0, 5000], end=[100, 5100], processors=[5, 2], requested_time=[100, 100], capacity=10)
    assert len(lone.downtimes) == 0 and lone.probe_start(50, 5, 60) == 50


# --------------------------------------------------------------------------------------------- observations and predictor


def tiny_site() -> SiteTimeline:
    """capacity 10, observed at t = 1000.

    * 12 past jobs (1 proc each) ended before 900, each ran half its request: median ratio 0.5.
    * R: running since 900, 8 procs, asks 400 s (really runs 600: the observer must not see that).
    * P: pending since 950, 5 procs, asks 100 s.
    """
    past_start = np.arange(12) * 10.0
    submit = np.concatenate([past_start, [900.0, 950.0]])
    start = np.concatenate([past_start, [900.0, 1500.0]])
    end = np.concatenate([past_start + 50.0, [1500.0, 1550.0]])
    procs = np.concatenate([np.ones(12, dtype=int), [8, 5]])
    req = np.concatenate([np.full(12, 100.0), [400.0, 100.0]])
    return SiteTimeline(submit, start, end, procs, req, 10, name="tiny")


def test_observe_shows_the_present_and_hides_the_future():
    obs = tiny_site().observe(1000.0)
    assert (obs.busy, obs.free, obs.n_running, obs.n_pending) == (8, 2, 1, 1)
    assert obs.running_start.tolist() == [900.0] and obs.running_requested.tolist() == [400.0]
    assert obs.pending_processors.tolist() == [5] and obs.pending_requested.tolist() == [100.0]
    assert np.allclose(obs.telemetry.ratios, 0.5) and len(obs.telemetry.ratios) == 12
    assert obs.telemetry.median_ratio() == 0.5
    # nothing about R's real end (1500) or P's real start appears anywhere in the observation
    fields = [v for v in vars(obs).values() if isinstance(v, np.ndarray)] + [v for v in vars(obs.telemetry).values() if isinstance(v, np.ndarray)]
    assert not any(np.isin([1500.0, 1550.0], f).any() for f in fields)
    assert np.isnan(obs.telemetry.arrival_run[-2:]).all()  # R and P had not ended by t


def test_predictor_as_specified_on_a_tiny_trace():
    # r = 0.5: R is expected to end at 900 + 0.5 * 400 = 1100; P is planned at [1100, 1150) on 5 procs.
    obs = tiny_site().observe(1000.0)
    pred = QueuePredictor()
    plan = pred.plan(obs)
    assert plan.times.tolist() == [1000.0, 1100.0, 1150.0]
    assert plan.free.tolist() == [2, 5, 10]
    assert pred.predict_start(obs, 4, 100) == 1100  # 5 free on [1100, 1150), then 10
    assert pred.predict_start(obs, 6, 100) == 1150
    assert pred.predict_start(obs, 2, 100) == 1000  # the 2 free processors stay free until R ends
    assert pred.predict_start(obs, 2, 100, profile=plan) == 1000
    assert pred.predict_start(obs, 11, 10) == float("inf")


def test_predictor_conditional_end_and_next_release():
    obs = tiny_site().observe(1000.0)
    # conditional: R has run 100 of 400 s (0.25): every past job ran 0.5 -> expected end 900 + 200 = 1100 again.
    cond = QueuePredictor(running_end="conditional")
    assert cond.expected_ends(obs).tolist() == [1100.0]
    # observed at 1200, R has outlived every past ratio: its requested end (1300) is expected
    assert cond.expected_ends(tiny_site().observe(1200.0)).tolist() == [1300.0]
    assert QueuePredictor().expected_ends(tiny_site().observe(1200.0)).tolist() == [1200.0]  # as specified: never before t
    # next_release: P may not take the 2 processors free now (it does not need them here: same plan)
    nr = QueuePredictor(pending_start="next_release")
    assert nr.plan(obs).free.tolist() == [2, 5, 10]
    # probe hole of r x request ("expected"): 4 procs x 100 s asks only 50 s
    assert QueuePredictor(probe_duration="expected").predict_start(obs, 4, 100) == 1100


def test_planned_profile_reserve_splits_segments():
    prof = PlannedProfile(np.array([0.0, 10.0]), np.array([4, 8]), 8)
    prof.reserve(5.0, 15.0, 3)
    assert prof.times.tolist() == [0.0, 5.0, 10.0, 15.0]
    assert prof.free.tolist() == [4, 1, 5, 8]
    assert prof.earliest_start(4, 5) == 0.0
    assert prof.earliest_start(4, 6) == 10.0
    assert prof.earliest_start(6, 1) == 15.0


def test_past_probe_waits_use_only_the_recorded_past():
    site = toy_site()
    obs = site.observe(400.0)
    waits, censored = obs.telemetry.past_probe_waits(400.0, 10, 30.0, 10, lookback_s=400.0, step_s=100.0)
    # probes of 10 procs x 30 s submitted at 0, 100, 200, 300: first holes at 150, 150, 300, 300
    assert waits.tolist() == [150.0, 50.0, 100.0, 0.0] and not censored.any()
    waits, censored = site.observe(310.0).telemetry.past_probe_waits(310.0, 10, 30.0, 10, lookback_s=110.0, step_s=100.0)
    assert censored.tolist() == [True]  # submitted at 210, it could not have finished by 310 (hole opens at 300)


# --------------------------------------------------------------------------------------------- bootstrap and policies


def test_bootstrap_resamples_whole_rounds_deterministically():
    extra = np.array([0.0] + [10.0] * 9)
    rounds = np.array([0] + [1] * 9)
    nontrivial = np.ones(10, dtype=bool)
    vals = pr.bootstrap_distribution(extra, nontrivial, rounds, "mean_extra_s", n_resamples=300, seed=7)
    # two rounds drawn with replacement: {0,0} -> 0, {0,1} -> 9, {1,1} -> 10 (probe resampling would give others)
    assert set(np.round(vals, 9).tolist()) <= {0.0, 9.0, 10.0}
    assert len(set(np.round(vals, 9).tolist())) == 3
    again = pr.bootstrap_distribution(extra, nontrivial, rounds, "mean_extra_s", n_resamples=300, seed=7)
    assert np.array_equal(vals, again)
    ci = pr.bootstrap_ci(extra, nontrivial, rounds, "mean_extra_s", n_resamples=300, seed=7)
    assert ci == pr.bootstrap_ci(extra, nontrivial, rounds, "mean_extra_s", n_resamples=300, seed=7)
    assert ci[0] == 0.0 and ci[1] == 10.0
    summary = pr.summarize(extra, nontrivial, rounds, n_resamples=50, seed=1)
    assert summary["mean_extra_s"]["value"] == 9.0
    assert summary["zero_regret_share"]["value"] == 0.1
    assert summary["within_60s_nontrivial"]["value"] == 1.0
    assert summary["p90_extra_s"]["value"] == 10.0


def test_policies_choose_from_observations():
    a, b = toy_site(), tiny_site()
    obs = {"a": a.observe(75.0), "b": b.observe(1000.0)}  # a: 9 busy, 0 pending; b: 8 busy, 1 pending
    assert pr.choose("fixed:b", obs, 1) == "b"
    assert pr.choose("least_pending", obs, 1) == "a"
    assert pr.choose("idle_first", obs, 2) == "b"  # only b has 2 free processors
    assert pr.choose("idle_first", obs, 5) == "a"  # nobody fits: least pending
    assert pr.choose("earliest_completion", obs, 1, {"a": 5.0, "b": 3.0}) == "b"


def test_replay_ties_go_by_site_name_not_list_order():
    # the old replay broke ties by the order the sites were listed in; lab.hpc.placement by site name
    site = toy_site()
    obs = {"zeta": site.observe(75.0), "alpha": site.observe(75.0)}
    assert pr.choose("least_pending", obs, 1) == "alpha"
    assert pr.choose("idle_first", obs, 1) == "alpha"
    assert pr.choose("earliest_completion", obs, 1, {"zeta": 7.0, "alpha": 7.0}) == "alpha"


# --------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def small_replay():
    return pr.run_replay(rounds=3, jobs=12, seed=101, n_resamples=50)


def test_run_replay_smoke_keys_and_types(small_replay):
    r = small_replay
    json.dumps(r)  # JSON-ready
    assert r["rounds"] == 3 and r["jobs"] == 12 and len(r["probes"]) == 12
    assert r["inputs"]["probes_per_round"] == [4]
    assert set(r["dispatch_latency_s"]) == {"theta_2022", "theta_2023", "hpc2n", "nasa_ipsc_1993"}
    assert r["dispatch_latency_s"]["theta_2022"] == 52.0 and r["dispatch_latency_s"]["nasa_ipsc_1993"] == r["dispatch_latency_s"]["hpc2n"]
    assert 0.0 <= r["nontrivial_share"] <= 1.0
    assert r["best_fixed_site"] in r["dispatch_latency_s"]
    expected = {f"fixed:{n}" for n in r["dispatch_latency_s"]} | {"least_pending", "idle_first", "earliest_completion", "earliest_completion_as_specified", "best_fixed"}
    assert set(r["policies"]) == expected
    for name, metrics in r["policies"].items():
        for m in pr.METRICS:
            v, (lo, hi) = metrics[m]["value"], metrics[m]["ci95"]
            assert isinstance(v, float)
            if np.isfinite(v):
                assert lo <= hi
        assert sum(metrics["choices"].values()) == 12
    assert isinstance(r["ratio_median_home_over_earliest"], float)
    assert set(r["goals"]) >= {"within_60s_nontrivial_ge_0.9", "all_met"}
    # the rounds are busy: at least two sites could not start the smallest probe at once
    assert all(rnd["short_sites"] >= 2 for rnd in r["round_list"])


def test_run_replay_fastest_site_has_zero_extra(small_replay):
    r = small_replay
    sites = list(r["dispatch_latency_s"])
    for p in r["probes"]:
        comp = p["completion_s"]
        fastest = min(comp.values())
        assert min(p["extra_s"][f"fixed:{n}"] for n in sites) == 0.0  # records keep 0.01 s
        for n in sites:
            assert p["extra_s"][f"fixed:{n}"] == pytest.approx(comp[n] - fastest, abs=0.02)
            assert comp[n] == pytest.approx(p["wait_s"][n] + p["runtime_s"] + r["dispatch_latency_s"][n], abs=0.02)
            assert p["wait_s"][n] >= 0
        for pol, site in p["chosen"].items():
            assert p["extra_s"][pol] == pytest.approx(comp[site] - fastest, abs=0.02)
        assert 32 <= p["processors"] <= 128 and 600 <= p["runtime_s"] <= 3600
        assert p["requested_s"] % 900 == 0 and p["requested_s"] >= p["runtime_s"]
    share = np.mean([max(p["completion_s"].values()) - min(p["completion_s"].values()) > 60 for p in r["probes"]])
    assert r["nontrivial_share"] == share


def test_run_replay_is_deterministic_for_a_seed(small_replay):
    again = pr.run_replay(rounds=3, jobs=12, seed=101, n_resamples=50)
    assert json.dumps(again["policies"]) == json.dumps(small_replay["policies"])
    assert [p["wait_s"] for p in again["probes"]] == [p["wait_s"] for p in small_replay["probes"]]


def test_rounds_align_local_time_of_week():
    sites = pr.load_sites()
    rounds, _ = pr.sample_rounds(sites, 2, 8, np.random.default_rng(5))
    from datetime import datetime
    from zoneinfo import ZoneInfo

    for rnd in rounds:
        local = [datetime.fromtimestamp(rnd["times"][n], ZoneInfo(s.timezone)) for n, s in sites.items()]
        assert len({(d.weekday(), d.hour, d.minute) for d in local}) == 1
        for n, s in sites.items():
            assert s.submit.min() + 7 * 86400 <= rnd["times"][n] <= s.submit.max() - 7 * 86400


# --------------------------------------------------------------------------------------------- predictor config and QBETS


def test_predictor_settings_are_a_validated_pydantic_config():
    from lab.hpc.errors import ReplayError
    from lab.hpc.sim import QueuePredictorConfig

    pred = QueuePredictor(running_end="conditional", history="qbets", history_quantile=75)
    assert pred.config == QueuePredictorConfig(running_end="conditional", history="qbets", history_quantile=75)
    assert pred.running_end == "conditional" and pred.params()["history_quantile"] == 75.0
    assert QueuePredictor(pred.config).params() == pred.params()
    for bad, field in (({"running_end": "mean"}, "running_end"), ({"ratio_clip": (0.9, 0.1)}, "ratio_clip"),
                       ({"history_quantile": 100}, "history_quantile"), ({"min_jobs": 0}, "min_jobs"), ({"bogus": 1}, "bogus")):
        with pytest.raises(ReplayError, match=f"field '{field}'"):
            QueuePredictor(**bad)
    with pytest.raises(ReplayError, match="not both"):
        QueuePredictor(pred.config, history="none")


def test_bad_replay_input_raises_the_facet_error_not_a_bare_value_error():
    from lab.hpc.errors import ReplayError

    with pytest.raises(ReplayError, match="site 'x': need submit <= start <= end"):
        SiteTimeline([10], [5], [20], [1], [10], 4, name="x")
    with pytest.raises(ReplayError, match="1..capacity"):
        easy_backfill([0], [10], [10], [5], 4)


def test_qbets_bound_is_the_binomial_order_statistic():
    from lab.hpc.sim import qbets_bound

    # n = 100 waits 0..99: the 95 %-confidence upper bound on the median is the 59th smallest (58 s)
    assert qbets_bound(np.arange(100.0), 50, 0.95) == 58.0
    assert qbets_bound(np.arange(100.0), 50, 0.5) == 50.0
    assert qbets_bound(np.arange(5.0), 95, 0.95) is None  # too few waits for a bound
    assert qbets_bound([], 50) is None


def test_forward_simulation_with_requested_walltimes_and_qbets_floor():
    obs = tiny_site().observe(1000.0)
    # pending P planned for its full 100 s request (not r x 100 = 50 s): the 6-processor hole opens at 1200
    assert QueuePredictor(pending_duration="requested").predict_start(obs, 6, 100) == 1200
    assert QueuePredictor(running_end="requested").expected_ends(obs).tolist() == [1300.0]
    # the QBETS floor applies only when the probe does not fit now; past waits here are all 0
    assert QueuePredictor(history="qbets").predict_start(obs, 6, 100) == 1150
    assert QueuePredictor(history="qbets").predict_start(obs, 2, 100) == 1000


def test_fits_now_trusts_the_free_processors_only_where_the_probe_fits():
    site = tiny_site()
    obs = site.observe(1000.0)  # 2 free; P (5 procs) pending
    fits = QueuePredictor(fits_now=True, pending_start="next_release")
    assert fits.predict_start(obs, 2, 1000) == 1000  # fits now: starts now even though its hole is planned shorter
    assert fits.predict_start(obs, 4, 100) == QueuePredictor(pending_start="next_release").predict_start(obs, 4, 100) == 1100


def test_tuning_grid_and_tune_use_validation_weeks_only(monkeypatch):
    assert len(pr.forward_grid()) == 32 and all(n.startswith("earliest_completion|") for n in pr.forward_grid())
    grid = pr.tuning_grid()
    assert len(grid) == 16 and all(n.startswith("earliest_completion|blend|") for n in grid)
    seen = []
    real = pr.evaluate_seeds
    monkeypatch.setattr(pr, "evaluate_seeds", lambda *a, **k: seen.append(k["split"]) or real(*a, **k))
    small = dict(list(grid.items())[:2])
    r = pr.tune(2, 8, seeds=[1], grid=small)
    assert seen == ["validation"] and r["chosen_name"] in small and len(r["table"]) == 2
    assert r["table"][0]["score"] <= r["table"][1]["score"]
    assert {b["policy"] for b in r["baselines"]} >= {"idle_first", "least_pending"}


def test_validation_and_evaluation_weeks_are_disjoint_at_every_site():
    sites = pr.load_sites()
    for s in sites.values():
        weeks = pr.week_mondays(s)
        val, ev = set(pr.split_mondays(weeks, "validation")), set(pr.split_mondays(weeks, "evaluation"))
        assert val and ev and not (val & ev) and val | ev == set(weeks) and max(val) < min(ev)
    rounds, _ = pr.sample_rounds(sites, 3, 12, np.random.default_rng(100), split="evaluation")
    for rnd in rounds:
        for n, s in sites.items():
            assert rnd["week_of"][n] in {d.isoformat() for d in pr.split_mondays(pr.week_mondays(s), "evaluation")}


def test_paired_differences_are_per_seed_method_minus_baseline():
    r = pr.run_replay(2, 8, seeds=[100, 101], n_resamples=20, include_probes=True)
    pair = r["paired"]["earliest_completion-vs-idle_first"]
    for seed_i, seed in enumerate(r["eval_seeds"]):
        probes = [p for p in r["probes"] if p["seed"] == seed]
        d = np.mean([p["extra_s"]["earliest_completion"] for p in probes]) - np.mean([p["extra_s"]["idle_first"] for p in probes])
        assert pair["mean_extra_diff_per_seed"][seed_i] == pytest.approx(d, abs=0.01)  # records keep 0.01 s
    lo, hi = pair["mean_extra_diff_ci95"]
    assert lo <= pair["mean_extra_diff_mean"] <= hi
    assert set(r["paired"]) >= {"earliest_completion-vs-idle_first", "earliest_completion-vs-best_fixed"}
    assert all(k in pair for k in ("mean_extra_diff_ci95", "p90_extra_diff_ci95"))


def test_probe_table_keeps_what_rebuilds_every_policys_extra(small_replay):
    import csv

    r = small_replay
    table = pr.probe_table(r["probes"])
    assert len(table["rows"]) == len(r["probes"]) and table["sites"] == list(r["dispatch_latency_s"])
    for rec, line in zip(r["probes"], table["rows"]):
        row = dict(zip(table["columns"], [int(x) if x else None for x in next(csv.reader([line]))]))
        comp = {n: row[f"wait_s:{n}"] + row["runtime_s"] + r["dispatch_latency_s"][n] for n in table["sites"]}
        for pol in rec["chosen"]:
            assert comp[table["sites"][row[f"chosen:{pol}"]]] - min(comp.values()) == pytest.approx(rec["extra_s"][pol], abs=2.0)  # 1 s rounding


# --------------------------------------------------------------------------------------------- information bound


def test_submitted_profile_and_clairvoyant_start_hand_solved():
    # tiny_site at t = 1000: R runs [900, 1500) on 8 procs asking 400 s (planned end 1300); P (5 procs) waits
    # and really runs [1500, 1550); the 12 past jobs ended long before.
    site = tiny_site()
    times, busy, down = site.submitted_profile(1000.0)
    assert times.tolist() == [1000.0, 1500.0, 1550.0] and busy.tolist() == [8, 5, 0] and not down.any()
    times, busy, _ = site.submitted_profile(1000.0, running_end="requested")
    assert times.tolist() == [1000.0, 1300.0, 1500.0, 1550.0] and busy.tolist() == [8, 0, 5, 0]
    times, busy, _ = site.submitted_profile(1000.0, pending="none")
    assert times.tolist() == [1000.0, 1500.0] and busy.tolist() == [8, 0]
    assert site.clairvoyant_start(1000.0, 5, 100) == 1500.0 == site.probe_start(1000.0, 5, 100)
    assert site.clairvoyant_start(1000.0, 5, 250, running_end="requested") == 1300.0  # [1300, 1550) holds 5 more
    assert site.clairvoyant_start(1000.0, 6, 250, running_end="requested") == 1550.0  # P's 5 + 6 > 10 on [1500, 1550)
    assert site.clairvoyant_start(1000.0, 2, 10) == 1000.0  # 8 busy + 2 fits now
    with pytest.raises(ValueError, match="running_end"):
        site.submitted_profile(1000.0, running_end="median")
    with pytest.raises(ValueError, match="1..10 processors"):
        site.clairvoyant_start(1000.0, 11, 10)


def test_clairvoyant_start_is_the_truth_without_later_jobs_and_never_after_it():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 25))
        submit = np.sort(rng.uniform(0, 1000, n))
        start = submit + rng.exponential(100, n) * (rng.random(n) < 0.7)
        run = rng.uniform(1, 300, n)
        procs = rng.integers(1, 9, n)
        site = SiteTimeline(submit, start, start + run, procs, run * 2, 10, downtime_min_s=None)
        t = float(rng.uniform(0, 1200))
        p, d = int(rng.integers(1, 11)), float(rng.uniform(1, 200))
        known = submit <= t
        got = site.clairvoyant_start(t, p, d)
        # fewer jobs in the profile can only open holes earlier
        assert got <= site.probe_start(t, p, d)
        if known.any():
            only_known = SiteTimeline(submit[known], start[known], (start + run)[known], procs[known], (run * 2)[known], 10, downtime_min_s=None)
            assert got == only_known.probe_start(t, p, d)
        else:
            assert got == t


def test_history_correction_never_moves_a_fitting_start_earlier():
    from lab.hpc.forecast import HistoryBlendPredictor

    site, pred = tiny_site(), pr.default_predictor()
    assert isinstance(pred, HistoryBlendPredictor)
    obs = site.observe(1000.0)
    assert pred.correct(obs, 2, 60, 1234.0, fits_now=True) >= 1234.0
    assert pred.predict_start(obs, 2, 60) == pred.correct(obs, 2, 60, 1000.0, fits_now=True)


def test_information_bound_variants_are_scored_like_the_policies(small_replay):
    bound = small_replay["information_bound"]
    assert set(bound) == {*pr.CLAIRVOYANT, *(f"{k}+history" for k in pr.CLAIRVOYANT)}
    for name, row in bound.items():
        assert row["history"] == name.endswith("+history") and row["given"] == pr.CLAIRVOYANT[name.removesuffix("+history")]
        assert set(row["pooled"]) == set(pr.METRICS) and row["pooled"]["mean_extra_s"] >= 0
        assert len(row["over_seeds"]["mean_extra_s"]["per_seed"]) == len(small_replay["eval_seeds"])


def test_committed_placement_results_carry_the_issue_keys():
    from pathlib import Path

    res = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/placement.json").read_text())
    rep = res["replay"]
    assert len(rep["eval_seeds"]) >= 10 and not set(rep["eval_seeds"]) & set(pr.VALIDATION_SEEDS)
    for key in ("earliest_completion-vs-idle_first", "earliest_completion-vs-best_fixed"):
        assert len(rep["paired"][key]["mean_extra_diff_ci95"]) == 2 and len(rep["paired"][key]["p90_extra_diff_ci95"]) == 2
    assert res["live"]["rounds"] >= 30
    full = rep["information_bound"]["everything_submitted+history"]["over_seeds"]["within_60s_nontrivial"]
    assert full["ci95"][0] <= full["mean"] <= full["ci95"][1]
