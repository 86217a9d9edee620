"""lab.hpc.queue: a hand-computed replay, the vectorized replay against the naive oracle, real-trace invariants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.hpc import QueueReplay, QueueSnapshot, ReplayError, load_trace, parse_swf
from lab.hpc.errors import ArgumentError
from lab.hpc.queue import SNAPSHOT_COLUMNS, WAIT_BIN_EDGES, WAIT_BIN_LABELS, naive_snapshots

# Six jobs on a 10-processor machine, times relative to UnixStartTime 1000.
#
#  job submit wait run procs            pending (epoch)  running (epoch)
#   1     0     0  100  4               -                [1000, 1100)
#   2    10    40   60  6               [1010, 1050)     [1050, 1110)
#   3    20    80    0  2               [1020, 1100)     - (zero run time)
#   4    30    90   50  3 (requested)   [1030, 1120)     [1120, 1170)
#   5    40    -1   10  1               unknown wait: excluded (or, with unknown_wait="zero", running [1040, 1050))
#   6    50  3700   20  5               [1050, 4750)     [4750, 4770)
TOY = """\
; UnixStartTime: 1000
; MaxProcs: 10
1 0 0 100 4 -1 -1 4 200 -1 1 -1 -1 -1 -1 -1 -1 -1
2 10 40 60 6 -1 -1 6 100 -1 1 -1 -1 -1 -1 -1 -1 -1
3 20 80 0 2 -1 -1 2 50 -1 1 -1 -1 -1 -1 -1 -1 -1
4 30 90 50 -1 -1 -1 3 -1 -1 1 -1 -1 -1 -1 -1 -1 -1
5 40 -1 10 1 -1 -1 1 60 -1 1 -1 -1 -1 -1 -1 -1 -1
6 50 3700 20 5 -1 -1 5 30 -1 1 -1 -1 -1 -1 -1 -1 -1
"""

# time, pending, running, busy, free, over capacity, utilization, pending_processors (unknown_wait="exclude")
TOY_EXPECTED = [
    (999.0, 0, 0, 0, 10, 0, 0.0, 0),  # before anything
    (1000.0, 0, 1, 4, 6, 0, 0.4, 0),  # job 1 submitted and started at once: running, never pending
    (1009.99, 0, 1, 4, 6, 0, 0.4, 0),
    (1010.0, 1, 1, 4, 6, 0, 0.4, 6),  # t == submit: pending
    (1030.0, 3, 1, 4, 6, 0, 0.4, 11),  # jobs 2, 3, 4 pending (job 5 excluded)
    (1049.5, 3, 1, 4, 6, 0, 0.4, 11),
    (1050.0, 3, 2, 10, 0, 0, 1.0, 10),  # t == start of 2: running, not pending; job 6 submitted
    (1100.0, 2, 1, 6, 4, 0, 0.6, 8),  # t == end of 1: done; job 3 starts and ends at 1100: neither
    (1109.0, 2, 1, 6, 4, 0, 0.6, 8),
    (1110.0, 2, 0, 0, 10, 0, 0.0, 8),  # t == end of 2
    (1120.0, 1, 1, 3, 7, 0, 0.3, 5),  # job 4 runs on its requested 3 processors
    (1170.0, 1, 0, 0, 10, 0, 0.0, 5),
    (4749.0, 1, 0, 0, 10, 0, 0.0, 5),
    (4750.0, 0, 1, 5, 5, 0, 0.5, 0),
    (4770.0, 0, 0, 0, 10, 0, 0.0, 0),  # after everything
]


@pytest.fixture(scope="module")
def toy() -> QueueReplay:
    return QueueReplay(parse_swf(TOY))


def expected_frame(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(SNAPSHOT_COLUMNS))
    nullable = ("free_processors", "over_capacity_processors")
    ints = {c: "int64" for c in SNAPSHOT_COLUMNS if c not in ("time", "utilization", *nullable)}
    return df.astype(ints | {"time": "float64"} | {c: "Int64" for c in nullable})


def test_toy_replay_basics(toy):
    assert len(toy) == 5 and toy.excluded == 1
    assert toy.capacity == 10
    assert (toy.first_submit, toy.last_end, toy.span) == (1000.0, 4770.0, 3770.0)
    assert toy.processors.tolist() == [4, 6, 2, 3, 5]
    assert toy.start.tolist() == [1000.0, 1050.0, 1100.0, 1120.0, 4750.0]
    assert toy.end.tolist() == [1100.0, 1110.0, 1100.0, 1170.0, 4770.0]
    assert repr(toy) == "QueueReplay('<swf>', jobs=5, excluded=1, capacity=10)"


def test_toy_snapshots_by_hand(toy):
    times = [row[0] for row in TOY_EXPECTED]
    got = toy.snapshots(times)
    assert list(got.columns) == list(SNAPSHOT_COLUMNS)
    pd.testing.assert_frame_equal(got, expected_frame(TOY_EXPECTED))
    # any order of times, answered in that order
    shuffled = toy.snapshots(times[::-1])
    pd.testing.assert_frame_equal(shuffled, expected_frame(TOY_EXPECTED[::-1]))


def test_toy_single_snapshot(toy):
    snap = toy.snapshot(1050)
    assert snap == QueueSnapshot(
        time=1050.0, pending=3, running=2, busy_processors=10, free_processors=0, utilization=1.0, pending_processors=10, over_capacity_processors=0
    )
    assert not snap.over_capacity
    assert snap.datetime == pd.Timestamp("1970-01-01 00:17:30", tz="UTC")


def test_toy_unknown_wait_zero_includes_job_5(toy):
    zero = QueueReplay(parse_swf(TOY), unknown_wait="zero")
    assert len(zero) == 6 and zero.excluded == 0
    got = zero.snapshots([1039, 1040, 1045, 1050])
    pd.testing.assert_frame_equal(
        got,
        expected_frame(
            [
                (1039.0, 3, 1, 4, 6, 0, 0.4, 11),
                (1040.0, 3, 2, 5, 5, 0, 0.5, 11),  # job 5 starts when submitted
                (1045.0, 3, 2, 5, 5, 0, 0.5, 11),
                (1050.0, 3, 2, 10, 0, 0, 1.0, 10),  # job 5 ended, job 2 started
            ]
        ),
    )
    # outside job 5's interval the two replays agree
    others = [t for t, *_ in TOY_EXPECTED if not 1040 <= t < 1050]
    pd.testing.assert_frame_equal(zero.snapshots(others), toy.snapshots(others))
    assert zero.wait_times(1000, 1100).tolist() == [0.0, 0.0, 40.0]
    assert zero.wait_histogram(0, 1e10).tolist() == [3, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]


def test_toy_capacity_override_and_fallbacks():
    half = QueueReplay(parse_swf(TOY), capacity=5, name="toy")
    assert half.name == "toy" and half.capacity == 5
    s = half.snapshot(1050)
    # free is never negative: the excess is its own number, and it is why utilization is 2.0
    assert (s.busy_processors, s.free_processors, s.over_capacity_processors, s.utilization) == (10, 0, 5, 2.0)
    assert s.over_capacity
    rows = half.snapshots([1049, 1050, 1100, 1110])
    assert rows["free_processors"].tolist() == [1, 0, 0, 5] and rows["over_capacity_processors"].tolist() == [0, 5, 1, 0]
    v = half.capacity_violations()
    assert list(v.columns) == ["start", "end", "busy_processors", "duration_s"]
    # busy 10 on [1050, 1100), then 6 on [1100, 1110): one episode over capacity, its peak 10
    assert v.to_dict("list") == {"start": [1050.0], "end": [1110.0], "busy_processors": [10], "duration_s": [60.0]}
    nodes_only = QueueReplay(parse_swf(TOY.replace("MaxProcs", "MaxNodes")))
    assert nodes_only.capacity == 10
    unknown = QueueReplay(parse_swf(TOY.replace("; MaxProcs: 10\n", "")))
    assert unknown.capacity is None
    s = unknown.snapshots([1050])
    assert s["busy_processors"].tolist() == [10] and s["free_processors"].isna().tolist() == [True]
    assert unknown.snapshot(1050).free_processors is None and unknown.snapshot(1050).over_capacity_processors is None
    assert s["over_capacity_processors"].isna().tolist() == [True]
    assert np.isnan(s["utilization"].iloc[0])
    assert unknown.capacity_violations().empty


def test_toy_capacity_violations_none(toy):
    v = toy.capacity_violations()
    assert v.empty and list(v.columns) == ["start", "end", "busy_processors", "duration_s"]


def test_toy_pending_jobs(toy):
    got = toy.pending_jobs(1060)
    assert list(got.columns) == ["job_id", "submitted", "waited_s", "processors", "requested_time_s", "wait_s", "run_time_s"]
    assert list(got["submitted"]) == [pd.Timestamp(t, unit="s", tz="UTC") for t in (1020, 1030, 1050)]
    expected = pd.DataFrame(
        {
            "job_id": np.array([3, 4, 6], dtype="int64"),
            "waited_s": [40.0, 30.0, 10.0],  # longest-waiting first
            "processors": np.array([2, 3, 5], dtype="int64"),
            "requested_time_s": [50.0, np.nan, 30.0],
            "wait_s": [80.0, 90.0, 3700.0],
            "run_time_s": [0.0, 50.0, 20.0],
        }
    )
    pd.testing.assert_frame_equal(got.drop(columns="submitted"), expected)
    assert toy.pending_jobs(1060, limit=2)["job_id"].tolist() == [3, 4]
    # boundaries: pending from t == submit, no longer at t == start
    assert toy.pending_jobs(1010)["job_id"].tolist() == [2]
    assert toy.pending_jobs(1050)["job_id"].tolist() == [3, 4, 6]
    assert toy.pending_jobs(1100)["job_id"].tolist() == [4, 6]
    assert toy.pending_jobs(999).empty and list(toy.pending_jobs(999).columns) == list(got.columns)


def test_toy_running_jobs(toy):
    got = toy.running_jobs(1050)
    assert got["job_id"].tolist() == [1, 2]  # earliest start first
    assert got["running_s"].tolist() == [50.0, 0.0]  # started at 1000 and at 1050
    assert got["processors"].tolist() == [4, 6]
    assert got["run_time_s"].tolist() == [100.0, 60.0]
    assert toy.running_jobs(1100)["job_id"].tolist() == [2]  # job 1 ended at 1100, zero-run job 3 never runs
    assert toy.running_jobs(1000)["job_id"].tolist() == [1]
    assert toy.running_jobs(4770).empty


def test_toy_wait_times_window_is_half_open(toy):
    # starts (wait): 1000 (0), 1050 (40), 1100 (80), 1120 (90), 4750 (3700)
    assert toy.wait_times(1000, 1100).tolist() == [0.0, 40.0]  # t0 included, t1 excluded
    assert toy.wait_times(1000.5, 1100.5).tolist() == [40.0, 80.0]
    assert toy.wait_times(1100, 4751).tolist() == [80.0, 90.0, 3700.0]
    assert toy.wait_times(4750, 4750).tolist() == []
    assert toy.wait_times(0, 1e10).dtype == np.float64


def test_toy_wait_histogram(toy):
    assert len(WAIT_BIN_LABELS) == len(WAIT_BIN_EDGES) - 1 == 12
    h = toy.wait_histogram(0, 1e10)
    assert h.dtype == np.int64
    # 0 and 40 s: "<1m"; 80 and 90 s: "1-10m"; 3700 s: "1-2h"
    assert dict(zip(WAIT_BIN_LABELS, h.tolist())) == {
        "<1m": 2, "1-10m": 2, "10m-1h": 0, "1-2h": 1, "2-4h": 0, "4-8h": 0,
        "8-12h": 0, "12h-1d": 0, "1-2d": 0, "2-4d": 0, "4-7d": 0, ">7d": 0,
    }  # fmt: skip
    assert toy.wait_histogram(1050, 1120).tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert toy.wait_histogram(0, 1e10, edges=[0, 60, 3600, np.inf]).tolist() == [2, 2, 1]
    assert toy.wait_histogram(0, 999).sum() == 0


def test_toy_timeline(toy):
    tl = toy.timeline(5, start=1000, end=1100)
    assert tl["time"].tolist() == [1000.0, 1025.0, 1050.0, 1075.0, 1100.0]
    assert tl["busy_processors"].tolist() == [4, 4, 10, 10, 6]
    full = toy.timeline(3)
    assert full["time"].tolist() == [1000.0, 2885.0, 4770.0]


def test_bad_unknown_wait_option():
    with pytest.raises(ArgumentError, match="QueueReplay: unknown_wait='drop': must be 'exclude' or 'zero'") as info:
        QueueReplay(parse_swf(TOY), unknown_wait="drop")
    assert info.value.field == "unknown_wait" and info.value.value == "drop" and isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- property: vectorized == naive


@st.composite
def small_traces(draw):
    n = draw(st.integers(1, 12))
    origin = draw(st.integers(0, 10**9))
    jobs = [
        (draw(st.integers(0, 100)), draw(st.integers(0, 60)), draw(st.integers(0, 60)), draw(st.integers(1, 8)))
        for _ in range(n)
    ]
    lines = [f"; UnixStartTime: {origin}", "; MaxProcs: 16"]
    lines += [f"{i + 1} {s} {w} {r} {p} -1 -1 {p} -1 -1 1 -1 -1 -1 -1 -1 -1 -1" for i, (s, w, r, p) in enumerate(jobs)]
    events = sorted({origin + t for s, w, r, _ in jobs for t in (s, s + w, s + w + r)})
    extra = draw(st.lists(st.floats(-5, 230, allow_nan=False), max_size=10))
    picked = draw(st.lists(st.sampled_from(events), min_size=1, max_size=15))
    return "\n".join(lines) + "\n", jobs, origin, picked + [origin + x for x in extra]


@settings(max_examples=150, deadline=None)
@given(small_traces())
def test_property_snapshots_equal_naive_replay(case):
    text, jobs, origin, times = case
    replay = QueueReplay(parse_swf(text))
    got = replay.snapshots(times)
    submit, wait, run, procs = (np.array(c, dtype=float) for c in zip(*jobs))
    want = naive_snapshots(origin + submit, wait, run, procs, times)
    assert list(zip(got["pending"], got["running"], got["busy_processors"], got["pending_processors"])) == want
    assert (got["free_processors"] == np.maximum(16 - got["busy_processors"], 0)).all()
    assert (got["over_capacity_processors"] == np.maximum(got["busy_processors"] - 16, 0)).all()
    assert (got["free_processors"] >= 0).all()
    assert np.allclose(got["utilization"], got["busy_processors"] / 16)


# --------------------------------------------------------------------------- real traces


@pytest.fixture(scope="module")
def replays() -> dict[str, QueueReplay]:
    return {name: QueueReplay(load_trace(name)) for name in ("theta_2022", "theta_2023", "hpc2n")}


def test_hpc2n_never_exceeds_its_240_processors(replays):
    r = replays["hpc2n"]
    assert r.capacity == 240 and len(r) == 3145 and r.excluded == 25  # 25 jobs have an unknown run time
    at_starts = r.snapshots(r.start)
    assert at_starts["busy_processors"].max() == 224
    assert (at_starts["busy_processors"] <= 240).all()
    assert (at_starts["free_processors"] >= 0).all()
    assert at_starts["utilization"].between(0, 1).all()
    assert r.capacity_violations().empty


@pytest.mark.parametrize(
    ("name", "intervals", "total_s", "max_busy"),
    [("theta_2022", 6, 906.0, 5084), ("theta_2023", 30, 329_713.0, 5538)],
)
def test_theta_traces_oversubscribe_slightly(replays, name, intervals, total_s, max_busy):
    r = replays[name]
    assert r.capacity == 4360 and r.excluded == 0
    v = r.capacity_violations()
    assert len(v) == intervals
    assert v["duration_s"].sum() == total_s
    assert v["busy_processors"].max() == max_busy
    assert (v["busy_processors"] > 4360).all() and (v["end"] > v["start"]).all()
    # the replay reports the excess rather than clipping it
    at_starts = r.snapshots(r.start)
    assert at_starts["busy_processors"].max() == max_busy
    assert at_starts["utilization"].max() == pytest.approx(max_busy / 4360) and at_starts["utilization"].max() > 1
    assert at_starts["free_processors"].min() == 0  # never negative ...
    assert at_starts["over_capacity_processors"].max() == max_busy - 4360  # ... the excess says why
    assert ((at_starts["utilization"] > 1) == (at_starts["over_capacity_processors"] > 0)).all()
    # and inside a reported interval the snapshot agrees
    first = v.iloc[0]
    assert r.snapshot(first["start"]).busy_processors == first["busy_processors"]


@pytest.mark.parametrize("name", ["theta_2022", "theta_2023", "hpc2n"])
def test_real_trace_counts_are_consistent(replays, name):
    r = replays[name]
    events = np.unique(np.concatenate([r.submit, r.start, r.end]))
    times = np.concatenate([events, events - 0.5, [r.first_submit - 1, r.last_end + 1]])
    s = r.snapshots(times)
    for col in ("pending", "running", "busy_processors", "pending_processors"):
        assert (s[col] >= 0).all(), col
    assert ((s["pending"] == 0) == (s["pending_processors"] == 0)).all()
    assert ((s["running"] == 0) == (s["busy_processors"] == 0)).all()
    # every job is in exactly one state: counted independently of the replay's sorted arrays
    sample = np.random.default_rng(0).choice(times, size=200, replace=False)
    sub = r.snapshots(sample)
    finished = (r.end[None, :] <= sample[:, None]).sum(axis=1)
    not_submitted = (r.submit[None, :] > sample[:, None]).sum(axis=1)
    total = sub["pending"].to_numpy() + sub["running"].to_numpy() + finished + not_submitted
    assert (total == len(r)).all()
    edge = r.snapshots([r.first_submit - 1, r.last_end])
    assert edge[["pending", "running", "busy_processors"]].to_numpy().sum() == 0


def test_real_trace_snapshots_match_naive_at_sample_times(replays):
    r = replays["hpc2n"]
    times = np.random.default_rng(1).uniform(r.first_submit, r.last_end, size=40)
    times = np.concatenate([times, r.start[:10], r.end[:10]])
    got = r.snapshots(times)
    want = naive_snapshots(r.submit, r.wait, r.end - r.start, r.processors, times)
    assert list(zip(got["pending"], got["running"], got["busy_processors"], got["pending_processors"])) == want


def test_nasa_needs_unknown_wait_zero():
    trace = load_trace("nasa_ipsc_1993")
    with pytest.raises(ReplayError) as excinfo:
        QueueReplay(trace)
    msg = str(excinfo.value)
    assert "unknown_wait='zero'" in msg
    assert msg == (
        "trace 'nasa_ipsc_1993.swf': none of its 18239 jobs can be replayed (18239 without wait time); "
        "if its submit times are start times (as in the NASA iPSC log), pass unknown_wait='zero'"
    )
    assert isinstance(excinfo.value, ValueError)
    r = QueueReplay(trace, unknown_wait="zero")
    assert (len(r), r.excluded, r.capacity) == (18239, 0, 128)
    assert r.snapshots(r.submit)["pending"].max() == 0  # every job starts when submitted
    assert r.wait_histogram(r.first_submit, r.last_end + 1).tolist() == [18239] + [0] * 11


def test_theta_2022_timeline_has_the_asked_rows(replays):
    r = replays["theta_2022"]
    tl = r.timeline(1000)
    assert len(tl) == 1000 and list(tl.columns) == list(SNAPSHOT_COLUMNS)
    assert tl["time"].iloc[0] == r.first_submit and tl["time"].iloc[-1] == r.last_end
    assert tl["time"].is_monotonic_increasing
    assert tl["pending"].max() > 0 and tl["busy_processors"].max() > 0
    assert tl.iloc[-1][["pending", "running", "busy_processors"]].sum() == 0  # all done at the last end


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "8", True])
def test_capacity_must_be_a_positive_integer(capacity):
    with pytest.raises(ArgumentError, match="capacity=.*: must be a positive integer number of processors") as info:
        QueueReplay(parse_swf(TOY), capacity=capacity)
    assert info.value.field == "capacity" and info.value.value is capacity


def test_non_positive_header_capacity_is_unknown():
    assert QueueReplay(parse_swf(TOY.replace("MaxProcs: 10", "MaxProcs: -1"))).capacity is None
    assert QueueReplay(parse_swf(TOY.replace("MaxProcs: 10", "MaxProcs: 0\n; MaxNodes: 7"))).capacity == 7


def test_snapshot_times_must_be_finite(toy):
    with pytest.raises(ArgumentError, match="finite") as info:
        toy.snapshots([1000.0, float("nan")])
    assert info.value.field == "times"
    with pytest.raises(ArgumentError, match="must be numbers"):  # numpy's own ValueError before
        toy.snapshots(["noon"])
    with pytest.raises(ArgumentError, match="n=0: must be an integer >= 1"):  # numpy's linspace accepted 0, refused -1
        toy.timeline(0)
    with pytest.raises(ArgumentError, match="edges.*strictly increasing"):  # np.histogram's ValueError before
        toy.wait_histogram(0, 5000, edges=[10, 5, 1])


def test_replay_error_says_what_is_missing():
    text = "1 -1 0 10 1 -1 -1 1 10 -1 1 -1 -1 -1 -1 -1 -1 -1\n2 5 0 -1 1 -1 -1 1 10 -1 1 -1 -1 -1 -1 -1 -1 -1\n"
    with pytest.raises(ReplayError) as excinfo:
        QueueReplay(parse_swf(text))
    assert str(excinfo.value) == "trace '<swf>': none of its 2 jobs can be replayed (1 without submit time, 1 without run time)"


def test_site_timeline_free_is_never_negative_and_the_excess_is_reported():
    """lab.hpc.sim: the placement benchmark's site model clips free capacity at 0 and says by how much
    the trace holds more than the machine (issue #16: it used to report free = -8)."""
    from lab.hpc.sim import SiteTimeline

    # two jobs on an 8-processor machine overlap on [50, 100): 6 + 10 = 16 processors held
    site = SiteTimeline(submit=[0, 50], start=[0, 50], end=[100, 150], processors=[6, 10], requested_time=[100, 100], capacity=8, downtime_min_s=None)
    t = np.array([25.0, 75.0, 125.0])
    assert site.busy(t).tolist() == [6, 16, 10]
    assert site.free(t).tolist() == [2, 0, 0]
    assert site.over_capacity(t).tolist() == [0, 8, 2]
    obs = site.observe(75.0)
    assert (obs.busy, obs.free, obs.over_capacity) == (16, 0, 8)


# --------------------------------------------------------------------------- the benchmark's fair baseline


def test_numpy_scan_baseline_matches_the_hand_computed_toy(toy):
    from benchmarks.queue_replay import numpy_scan_snapshots

    times = np.array([r[0] for r in TOY_EXPECTED])
    got = numpy_scan_snapshots(toy.submit, toy.start, toy.end, toy.processors, times)
    want = np.array([(r[1], r[2], r[3], r[7]) for r in TOY_EXPECTED])
    assert np.array_equal(got, want)


def test_queue_replay_benchmark_compares_against_the_numpy_scan_timed_the_same_way():
    # the old benchmark's baseline was a plain-Python loop timed once against the method's best of five
    from benchmarks import queue_replay as bench

    r = bench.run("hpc2n", 50, 5, 2)
    assert r["baseline"].startswith("vectorised NumPy scan") and r["results_agree"]
    assert r["speedup"] == r["snapshots_per_s"] / r["baseline_snapshots_per_s"]
    assert r["baseline_snapshots_per_s"] == 50 / r["baseline_s"]  # all the snapshots, not a subset
    assert "best of 2" in r["timing"] and r["speedup_vs_python_loop"] > r["speedup"] > 0
