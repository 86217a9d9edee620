"""The committed ConFiner benchmark (benchmarks/results/video.json): complete, chosen on the validation split from the
declared grid, its floors behaving as floors, and the README's tables printed from it (no figure typed by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import video as B

ROOT = Path(__file__).resolve().parents[1]
DOC = json.loads((ROOT / "benchmarks" / "results" / "video.json").read_text())
ROWS = {r["mode"]: r for r in DOC["results"]}
GENERATED = [m for m in B.MODES if m not in ("real_heldout", "real_train_clips", "static_train_frame")]


def test_every_mode_is_measured_on_the_declared_number_of_videos():
    assert list(ROWS) == B.MODES or sorted(ROWS) == sorted(B.MODES)
    n = DOC["setup"]["videos_per_mode"]
    assert n >= 64
    for m in GENERATED:
        r = ROWS[m]
        assert r["videos"] == n and r["frame_quality"]["n"] == n, m
        for key in ("frame_quality", "subject_consistency", "motion_smoothness", "motion_distance"):
            lo, hi = r[key]["ci95"]
            assert lo <= r[key]["mean"] <= hi, (m, key, r[key])


def test_every_confiner_row_was_chosen_on_validation_from_the_same_grid():
    sel = DOC["selection"]
    for row, (mode, c, r) in B.CONFINER.items():
        # the other re-noising reading is the coordinated row's grid at the reading not chosen there
        pts = [q for q in sel["grid"] if q["row"] == (row if row != "confiner_coordinated_other_renoise" else "confiner_coordinated")]
        assert sorted({q["t_e"] for q in pts}) == sorted(B.T_E_GRID), row
        chosen = sel["chosen"][row]
        assert ROWS[row]["setting"]["t_e"] == chosen["t_e"] in B.T_E_GRID
        same = [q for q in pts if q["renoise"] == chosen["renoise"]] if mode == "coordinated" else pts
        assert min(same, key=lambda q: q["val_frame_quality"])["t_e"] == chosen["t_e"], row
    assert [q["t_e"] for q in DOC["selection_long"]["grid"]] == list(B.T_E_GRID_LONG)
    assert DOC["selection_long"]["t_e"] == min(DOC["selection_long"]["grid"], key=lambda q: q["val_seam_jump"])["t_e"]
    assert {r["t_e"] for r in DOC["long"]} == {DOC["selection_long"]["t_e"]}


def test_the_do_nothing_floor_maxes_consistency_and_smoothness_but_not_motion():
    """A still video scores 1.0 on VBench's consistency and smoothness; the motion distance is what tells it apart:
    it scores the reference clips' mean frame-to-frame jump, and real held-out clips move more like the training
    clips than a still frame does."""
    still, heldout, train = ROWS["static_train_frame"], ROWS["real_heldout"], ROWS["real_train_clips"]
    assert still["subject_consistency"]["mean"] == pytest.approx(1.0) and still["motion_smoothness"]["mean"] == pytest.approx(1.0)
    assert still["mean_frame_jump"]["mean"] == 0.0
    assert heldout["motion_distance_heldout"]["mean"] == 0.0
    assert still["motion_distance_heldout"]["mean"] == pytest.approx(heldout["mean_frame_jump"]["mean"], rel=1e-6)
    assert still["motion_distance"]["mean"] > heldout["motion_distance"]["mean"] > train["motion_distance"]["mean"]


def test_paired_differences_name_their_reference_and_the_4_step_rows_are_compared_with_their_input():
    for m in GENERATED:
        if m == "control_expert_alone":
            continue
        assert ROWS[m]["frame_quality_minus_control"]["versus"] == "control_expert_alone"
        assert ROWS[m]["subject_consistency_minus_control"]["versus"] == "control_expert_alone"
    for m, (_, c, _) in B.CONFINER.items():
        assert ("frame_quality_minus_control_stage" in ROWS[m]) == (c == 4), m


def test_the_readme_tables_are_the_committed_run():
    readme = (ROOT / "README.md").read_text()
    for line in B.table(DOC).splitlines():
        assert line in readme, f"README lacks this line of `python -m benchmarks.video --out benchmarks/results/video.json --table`: {line}"


def test_paired_comparisons_cover_the_goal_and_the_ablation_on_the_same_videos():
    pairs = [(q["mode"], q["versus"]) for q in DOC["paired"]]
    assert pairs == list(B.PAIRS)
    for q in DOC["paired"]:
        fd, sc = q["frame_quality_diff"], q["subject_consistency_diff"]
        assert fd["n"] == sc["n"] == DOC["setup"]["videos_per_mode"], q["mode"]
        assert fd["ci95"][0] <= fd["mean"] <= fd["ci95"][1] and sc["ci95"][0] <= sc["mean"] <= sc["ci95"][1], q
        # the paired FD difference is the difference of the two rows' FDs (one set of videos each)
        assert fd["mean"] == pytest.approx(ROWS[q["mode"]]["frame_quality"]["mean"] - ROWS[q["versus"]]["frame_quality"]["mean"], abs=1e-6)
        assert sc["mean"] == pytest.approx(ROWS[q["mode"]]["subject_consistency"]["mean"] - ROWS[q["versus"]]["subject_consistency"]["mean"], abs=1e-6)


def test_denoising_diagnostic_backs_the_readme_why():
    """Every expert is probed at its own timestep for each ratio, and the README's explanation holds in the committed
    numbers: the spatial expert's x0_hat is below the control expert's at every ratio (interval below zero)."""
    from lab.generative.video.schedules import get_schedule

    rows = DOC["denoising"]["rows"]
    assert sorted({q["noise_to_signal"] for q in rows}) == sorted(B.NOISE_TO_SIGNAL)
    for q in rows:
        assert q["t"] == get_schedule(q["schedule"]).timestep_at(q["noise_to_signal"]), q
        assert q["psnr"]["n"] == DOC["denoising"]["clips"] >= 8
    for q in (q for q in rows if q["expert"] == "spatial"):
        assert q["spatial_minus_control"]["ci95"][1] < 0, q
