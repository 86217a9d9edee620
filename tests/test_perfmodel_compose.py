"""Step-time composition (lab.training.perfmodel.compose) on hand-solved pipelines."""

import pytest

from lab.training.perfmodel import PerfConfig
from lab.training.perfmodel.compose import compose, exposed_grad_sync, pipeline_order, simulate_pipeline
from lab.training.perfmodel.operators import Operator


def _ops(fwd, bwd, sync, buckets, update):
    """Operators whose time (seconds) is their FLOP count: stage s forward fwd[s], backward bwd[s], ..."""
    ops = []
    for s in range(len(fwd)):
        ops.append(Operator("block", s, 0, "micro_batch", fwd[s], bwd[s], 0.0, 0.0))
        ops.append(Operator("dp_allreduce", s, None, "grad_sync", sync[s], 0.0, 0.0, 0.0,
                            collective="all_reduce", group="dp", group_size=2, calls=buckets))
        ops.append(Operator("optimizer_step", s, None, "update", update[s], 0.0, 0.0, 0.0))
    return ops


def flops_as_seconds(op, direction):
    return op.fwd_flops if direction == "fwd" else op.bwd_flops


CFG = PerfConfig(n_layer=2, d_model=8, n_head=2, seq_len=4, vocab_size=10, pp=2, dp=2, n_micro_batches=2)
# Two stages: F = (1, 2) s, B = (2, 4) s, m = 2, sync (3, 1) s in 3 buckets, update (0.5, 1.5) s.
OPS = _ops([1.0, 2.0], [2.0, 4.0], [3.0, 1.0], 3, [0.5, 1.5])


def test_closed_form_two_stage():
    p = compose(CFG, OPS, flops_as_seconds)
    # (m - 1 + pp) (max F + max B) = 3 * 6 = 18; + first-stage sync 3; + max update 1.5
    assert (p.pipeline_s, p.max_fwd_s, p.max_bwd_s, p.grad_sync_exposed_s, p.update_s) == (18.0, 2.0, 4.0, 3.0, 1.5)
    assert p.total_s == 22.5
    assert compose(CFG, OPS, flops_as_seconds, schedule="afab").total_s == 22.5


def test_closed_form_with_overlap():
    p = compose(CFG, OPS, flops_as_seconds, overlap_grad_sync=True)
    # k = 3 buckets, C = 3, B_0 = 2: max(C / k, C - B_0 (k - 1) / k) = max(1, 3 - 4/3) = 5/3
    assert p.grad_sync_exposed_s == pytest.approx(5 / 3)
    assert p.total_s == pytest.approx(18 + 5 / 3 + 1.5)


@pytest.mark.parametrize("schedule", ["1f1b", "afab"])
def test_simulated_two_stage_by_hand(schedule):
    slots = simulate_pipeline([1.0, 2.0], [2.0, 4.0], 2, schedule)
    got = {(s.stage, s.kind, s.micro_batch): (s.start, s.end) for s in slots}
    # Hand-solved. 1F1B: stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13];
    # stage 0 B0 [7,9] B1 [13,15]. AFAB: stage 1 F0 [1,3] F1 [3,5] B0 [5,9] B1 [9,13]; stage 0 B0 [9,11] B1 [13,15].
    hand = {"1f1b": {(0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (1, "F", 0): (1, 3), (1, "B", 0): (3, 7),
                     (1, "F", 1): (7, 9), (1, "B", 1): (9, 13), (0, "B", 0): (7, 9), (0, "B", 1): (13, 15)},
            "afab": {(0, "F", 0): (0, 1), (0, "F", 1): (1, 2), (1, "F", 0): (1, 3), (1, "F", 1): (3, 5),
                     (1, "B", 0): (5, 9), (1, "B", 1): (9, 13), (0, "B", 0): (9, 11), (0, "B", 1): (13, 15)}}
    assert got == hand[schedule]
    p = compose(CFG, OPS, flops_as_seconds, schedule=schedule, method="simulate")
    # stage 0 ends at 15 and syncs 3 s, stage 1 ends at 13 and syncs 1 s -> 18, + max update 1.5
    assert (p.pipeline_s, p.total_s) == (15.0, 19.5)


@pytest.mark.parametrize("schedule", ["1f1b", "afab"])
@pytest.mark.parametrize("pp, m", [(2, 4), (3, 5), (4, 2)])
def test_balanced_stages_match_the_closed_form(schedule, pp, m):
    slots = simulate_pipeline([1.0] * pp, [2.0] * pp, m, schedule)
    assert max(s.end for s in slots) == pytest.approx((m - 1 + pp) * 3.0)


def test_orders_and_overlap_edges():
    assert pipeline_order("1f1b", 0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                               ("B", 2), ("B", 3)]
    assert exposed_grad_sync(3.0, 10.0, 4, True) == 0.75     # compute-bound: only the last bucket shows
    assert exposed_grad_sync(3.0, 10.0, 4, False) == 3.0
    with pytest.raises(ValueError, match="schedule"):
        compose(CFG, OPS, flops_as_seconds, schedule="interleaved")
