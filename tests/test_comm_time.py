"""benchmarks.comm_time: time to a target loss, link-rate calibration, and the skip where namespaces cannot be made."""

from __future__ import annotations

import pytest

from benchmarks import comm_time


def test_time_to_target_by_hand():
    step_s = {1: 0.5, 2: 0.5, 3: 1.0, 4: 1.0, 5: 2.0}
    val = {2: 3.0, 4: 2.5, 5: 2.4}
    assert comm_time.time_to_target(step_s, val, 2.5) == 3.0  # steps 1-4
    assert comm_time.time_to_target(step_s, val, 3.0) == 1.0
    assert comm_time.time_to_target(step_s, val, 2.45) == 5.0
    assert comm_time.time_to_target(step_s, val, 2.0) is None


def test_link_rate_gives_the_share_by_hand():
    # 1 MB on the wire per step, 0.1 s of compute: at half the step in communication, 0.1 s for 8 Mbit
    assert comm_time.link_rate_mbit(0.5, 0.1, 1e6, efficiency=1.0) == pytest.approx(80.0)
    assert comm_time.link_rate_mbit(0.75, 0.1, 1e6, efficiency=1.0) == pytest.approx(80.0 / 3)
    with pytest.raises(ValueError, match="share"):
        comm_time.link_rate_mbit(1.0, 0.1, 1e6)


def test_t_interval():
    assert comm_time.t_ci95([1.0]) is None
    lo, hi = comm_time.t_ci95([1.0, 2.0, 3.0])
    assert lo == pytest.approx(2.0 - 4.302653 / 3 ** 0.5, rel=1e-5) and hi == pytest.approx(2.0 + 4.302653 / 3 ** 0.5, rel=1e-5)


def test_skipped_with_the_reason_where_namespaces_cannot_be_made(monkeypatch):
    import lab.training.netns as netns

    monkeypatch.setattr(netns, "netns_unavailable", lambda: "network namespaces need root (CAP_NET_ADMIN)")
    table, detail = comm_time.run_time(quick=True)
    assert table == {}
    assert detail["skipped"] == "shaped-link runs skipped: network namespaces need root (CAP_NET_ADMIN)"
    prof = detail["profile"]  # the profile needs no namespaces: it ran
    assert prof["fp8"]["hook_s_per_step_median"] > 0 and prof["gift_committed"]["mean_vs_fp8"] > 0
    assert prof["gift_bytes_goal_subspace"]["kwargs"]["eigensolver"] == "subspace"
    assert "eigensolver" not in prof["gift_bytes_goal"]["kwargs"]  # the A/B pair differs in the eigensolver only


def test_gift_subspace_method_is_the_bytes_goal_gift_with_subspace_factors():
    gift = comm_time.gift_kwargs()
    a = comm_time._method_spec(comm_time.FULL_TIME, "gift_fp8", gift)
    b = comm_time._method_spec(comm_time.FULL_TIME, "gift_fp8_subspace", gift)
    assert b["comm_kwargs"] == {**a["comm_kwargs"], "eigensolver": "subspace"} and b["lr"] == a["lr"]
    assert "gift_fp8_subspace" in comm_time.FULL_TIME.methods
