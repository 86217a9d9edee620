"""The performance-model explorer's starting point and schedule (``lab.training.perfmodel.explore``) and the
widget's keyword arguments (``widgets.PerfModelExplorer``), which its dashboard's URL parameters fill."""

from __future__ import annotations

import pytest

from lab.training.errors import ExplorerError, TrainingError
from lab.training.perfmodel import PerfConfig
from lab.training.perfmodel.explore import CONTROLS, DEFAULT_CONFIG, Explorer, initial_controls


@pytest.fixture(scope="module")
def explorer():
    return Explorer()


def test_initial_controls_are_the_configs_with_the_given_fields_in_their_place():
    start = initial_controls(pp=4, n_layer=8, hardware="perlmutter_a100")
    assert start == {**{k: getattr(DEFAULT_CONFIG, k) for k in CONTROLS}, "pp": 4, "n_layer": 8,
                     "hardware": "perlmutter_a100", "tier": "loopback", "schedule": "1f1b"}
    # checked one by one, not together: 4 heads over TP 8 is left for the explorer to refuse with its reason
    assert initial_controls(tp=8)["tp"] == 8


@pytest.mark.parametrize("kw, names", [
    ({"d_model": 100}, ["d_model=100", "one of 64, 128"]),
    ({"n_layer": 49}, ["n_layer=49", "an integer from 1 to 48"]),
    ({"hardware": "h100"}, ["hardware='h100'", "local, perlmutter_a100, vista_gh200"]),
    ({"schedule": "zb"}, ["schedule='zb'", "1f1b, afab"]),
    ({"vocab_size": 10}, ["no control 'vocab_size'"]),
])
def test_a_value_no_control_offers_is_named_with_what_it_takes(kw, names):
    with pytest.raises(ExplorerError) as e:
        initial_controls(**kw)
    assert isinstance(e.value, TrainingError) and all(n in str(e.value) for n in names), str(e.value)
    with pytest.raises(ExplorerError):  # a config whose field no control offers, too
        initial_controls(PerfConfig(n_layer=2, d_model=96, n_head=4, seq_len=64, vocab_size=512))


def test_the_schedule_is_simulated_by_both_models_and_the_measured_step_is_only_the_1f1b_runs(explorer):
    cfg = DEFAULT_CONFIG  # the benchmark's PP = 2 run, measured with 1F1B
    one, all_f = explorer.predict(cfg, "local", schedule="1f1b"), explorer.predict(cfg, "local", schedule="afab")
    assert one.measured_s is not None and all_f.measured_s is None
    assert one.prediction.schedule == "1f1b" and all_f.prediction.schedule == "afab"
    for s in range(cfg.pp):  # all forwards before any backward on every stage
        slots = [x for x in all_f.prediction.slots if x.stage == s]
        assert max(x.end for x in slots if x.kind == "F") <= min(x.start for x in slots if x.kind == "B")
    roof = explorer.predict(cfg.model_copy(update={"n_micro_batches": 8}), "vista_gh200", schedule="afab")
    assert roof.model == "roofline" and roof.prediction.schedule == "afab" and roof.measured_s is None
    with pytest.raises(ExplorerError):
        explorer.predict(cfg, "local", schedule="gpipe")
    single = cfg.model_copy(update={"pp": 1})  # one stage: the schedules are the same, measured if it was run
    assert explorer.predict(single, "local", schedule="afab").measured_s == explorer.measured(single)


def test_the_widget_starts_on_its_keyword_arguments(explorer):
    from widgets import PerfModelExplorer

    w = PerfModelExplorer(explorer, hardware="perlmutter_a100", schedule="afab", d_model=1024, n_head=16, n_layer=8,
                          pp=4, n_micro_batches=8)
    assert (w.d_model.value, w.n_head.value, w.n_layer.value, w.pp.value, w.n_micro_batches.value) == (1024, 16, 8, 4, 8)
    assert w.result.model == "roofline" and w.result.config.pp == 4 and w.result.prediction.schedule == "afab"
    fwd = next(t for t in w.gantt.figure["data"] if t["name"] == "forward")
    assert len(fwd["x"]) == 8 * 4 and sorted(set(fwd["y"])) == [f"stage {s}" for s in range(4)]
    assert PerfModelExplorer(explorer).result.measured_s is not None  # the default: the measured PP = 2 run
    with pytest.raises(ExplorerError):
        PerfModelExplorer(explorer, dp=3)
