"""The re-coupled ADMM variant (lab.generative.restore.recoupled_admm) and validation tuning (lab.generative.tuning).

- On the Gaussian prior fitted to real 8x8 digits, the variant comes within 0.5 dB of the exact Bayes
  posterior mean on every task at 50 NFE, on validation digits and on images drawn from the prior,
  is at least as good as Flower and beats ReBridge-Flow as written; with more steps it converges to
  the posterior mean itself (the ADMM fixed point).
- Exact NFE; the trajectory record has ReBridge's fields and they reproduce the updates.
- Tuning reads only the validation split, picks from the grid deterministically (ties: first point),
  and the committed tuned.json is what restore(hyper="tuned") uses.
- These tests never read the test split (digits 1600-1796): it is the benchmark's alone
  (``benchmarks/restoration.py``); the fixtures hand them digits whose test rows are NaN.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from lab.generative.errors import GenerativeError, MethodError
from lab.generative.metrics import psnr
from lab.generative.operators import get_operator
from lab.generative.restore import restore
from lab.generative.restore.recoupled_admm import ADMMStep, penalty, time_grid
from lab.generative import tuning

TASKS = ["denoise", "deblur", "sr2", "inpaint_random", "inpaint_box"]


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    """The 1,797 digits with the test split's rows set to NaN: any score read from them would be NaN."""
    images = tuning.load_digit_images().clone()
    test = tuning.split_indices("test")
    images[test.start: test.stop] = float("nan")
    return images


def validation_digits(digits, n: int) -> torch.Tensor:
    """The first ``n`` validation digits (float64); the variant runs with its paper defaults here, so
    no value was chosen on them."""
    val = tuning.split_indices("validation")
    x = digits[val.start: val.start + n].double()
    assert torch.isfinite(x).all() and n <= len(val)
    return x


@pytest.fixture(scope="module")
def gauss(digits):
    return tuning.make_prior("gaussian-digits", digits)


@pytest.fixture(scope="module")
def scores(gauss, digits):
    """Mean unclipped PSNR at 50 NFE on 48 validation digits and 48 draws from the prior."""
    sets = {"validation": validation_digits(digits, 48),
            "prior": gauss.sample_clean(48, torch.Generator().manual_seed(21), dtype=torch.float64)}
    out = {}
    for name, x in sets.items():
        for task in TASKS:
            op = get_operator(task, (1, 8, 8))
            y = op.measure(x, torch.Generator().manual_seed(22))
            for method in ("bayes", "recoupled_admm", "flower", "rebridge"):
                r = restore(method, y, op, gauss, nfe=50, seed=5)
                out[name, task, method] = float(psnr(r.x, x, clip=False).mean())
    return out


@pytest.mark.parametrize("images", ["validation", "prior"])
@pytest.mark.parametrize("task", TASKS)
def test_variant_within_half_a_db_of_bayes_and_ahead_of_flower_and_rebridge(scores, task, images):
    bayes = scores[images, task, "bayes"]
    v = scores[images, task, "recoupled_admm"]
    print(f"{images} {task}: bayes {bayes:.2f} variant {v:.2f} flower {scores[images, task, 'flower']:.2f} "
          f"rebridge {scores[images, task, 'rebridge']:.2f}")
    assert v >= bayes - 0.1, (bayes, v)  # the goal is 0.5 dB; measured here: within 0.02 dB (the variant can pass Bayes on held-out digits)
    assert v >= scores[images, task, "flower"], scores
    assert v >= scores[images, task, "rebridge"] + 1.0, scores


@pytest.mark.parametrize("task", ["deblur", "inpaint_box"])
def test_variant_converges_to_the_posterior_mean_of_a_gaussian_prior(gauss, digits, task):
    """The multiplier makes the posterior mean the fixed point: the distance to it shrinks with the steps."""
    op = get_operator(task, (1, 8, 8))
    x = validation_digits(digits, 8)
    y = op.measure(x, torch.Generator().manual_seed(0))
    bayes = gauss.posterior_mean(y, op)
    rms = {n: float(((restore("recoupled_admm", y, op, gauss, nfe=n).x - bayes) ** 2).mean().sqrt()) for n in (10, 50, 200)}
    assert rms[200] < rms[50] < rms[10], rms
    assert rms[200] < 0.01, rms  # on the [-1, 1] scale
    # without the multiplier (dual_step = 0: half-quadratic splitting) the same budget stays farther away
    hqs = float(((restore("recoupled_admm", y, op, gauss, nfe=50, dual_step=0.0).x - bayes) ** 2).mean().sqrt())
    assert hqs > 2 * rms[50], (hqs, rms)


@pytest.mark.parametrize("nfe,hyper", [(1, {}), (7, {"grid_power": 0.5}), (20, {"eta": 0.5}), (50, {"dual_step": 1.5})])
def test_variant_spends_exactly_its_budget(gauss, nfe, hyper):
    op = get_operator("inpaint_random", (1, 8, 8))
    y = op.measure(gauss.sample_clean(3, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1))
    before = gauss.nfe
    out = restore("recoupled_admm", y, op, gauss, nfe=nfe, seed=0, **hyper)
    assert out.nfe == nfe == gauss.nfe - before
    assert out.x.shape == (3, 1, 8, 8) and out.x.dtype == y.dtype and torch.isfinite(out.x).all()
    assert len(out.trajectory) == nfe


def test_variant_trajectory_record(gauss):
    op = get_operator("deblur", (1, 8, 8))
    x = gauss.sample_clean(3, torch.Generator().manual_seed(0), dtype=torch.float64)
    y = op.measure(x, torch.Generator().manual_seed(1))
    K = 12
    out = restore("recoupled_admm", y, op, gauss, nfe=K, seed=0, record="full", grid_power=0.7)
    steps = out.trajectory
    ts = time_grid(K, 0.7)
    assert [s.k for s in steps] == list(range(K)) and all(isinstance(s, ADMMStep) for s in steps)
    assert out.hyper == {"grid_power": 0.7, "t_max": 1.0, "dual_step": 1.0, "eta": 0.0, "record": "full"}
    torch.testing.assert_close(out.x, steps[-1].b_bar)  # the output is the last data-consistent endpoint
    for s in steps:
        assert s.t == pytest.approx(ts[s.k]) and s.dt == pytest.approx(ts[s.k + 1] - ts[s.k])
        assert s.rho == pytest.approx(penalty(s.t)) and s.gamma == pytest.approx(op.sigma_y**2 * s.rho)
        for name in ("x", "a", "a_hat", "b_hat", "b_bar", "a_bar"):
            assert getattr(s, name).shape == (3, 1, 8, 8), name
        assert set(s.terms) == {"measurement_defect", "clean_prior_deviation", "multiplier", "defect"}
        T = s.terms
        torch.testing.assert_close(T["defect"], T["measurement_defect"] + T["clean_prior_deviation"] + T["multiplier"])
        for name in ("residual_clean_side", "residual_recoupled", "mismatch_hat", "mismatch_bar", "multiplier_norm"):
            assert getattr(s, name).shape == (3,), name
        # the decoded endpoints lie on the bridge through x (ReBridge Eq. 3)
        torch.testing.assert_close((1 - s.t) * s.a_hat + s.t * s.b_hat, s.x)
    for k in range(1, K):
        s, prev = steps[k], steps[k - 1]
        # the state is the re-coupled bridge of the previous step: x_k = (1 - t_k) a_bar + t_k b_bar
        torch.testing.assert_close(s.x, (1 - s.t) * prev.a_bar + s.t * prev.b_bar)
        torch.testing.assert_close(s.a, prev.a_bar)
        # b_bar minimises ||Hb - y||^2 / (2 s^2) + rho/2 ||b - b_hat||^2 + <w, b - b_hat>, w = a / s_t
        w = s.a / ((1 - s.t) / s.t)
        grad = op.H_adjoint(op.H(s.b_bar) - y) / op.sigma_y**2 + s.rho * (s.b_bar - s.b_hat) + w
        scale = float((op.H_adjoint(y).abs().max() / op.sigma_y**2))
        assert float(grad.abs().max()) < 1e-8 * scale
    # the measurement is matched to about the noise level at the end, far better than by the prior alone
    assert float(steps[-1].mismatch_bar.max()) < 2 * op.sigma_y
    assert float(steps[0].mismatch_hat.min()) > 2 * op.sigma_y
    assert restore("recoupled_admm", y, op, gauss, nfe=5, record="none").trajectory is None
    assert restore("recoupled_admm", y, op, gauss, nfe=5).trajectory[0].b_bar is None  # scalars only


def test_variant_is_deterministic_unless_eta(gauss):
    op = get_operator("sr2", (1, 8, 8))
    y = op.measure(gauss.sample_clean(4, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1))
    a = restore("recoupled_admm", y, op, gauss, nfe=10, seed=1).x
    torch.testing.assert_close(a, restore("recoupled_admm", y, op, gauss, nfe=10, seed=2).x, rtol=0, atol=0)
    e1 = restore("recoupled_admm", y, op, gauss, nfe=10, seed=1, eta=0.5).x
    assert not torch.equal(e1, restore("recoupled_admm", y, op, gauss, nfe=10, seed=2, eta=0.5).x)
    torch.testing.assert_close(e1, restore("recoupled_admm", y, op, gauss, nfe=10, seed=1, eta=0.5).x, rtol=0, atol=0)


def test_variant_validates_its_hyper_parameters(gauss):
    op = get_operator("denoise", (1, 8, 8))
    y = torch.zeros(1, 1, 8, 8)
    with pytest.raises(MethodError, match="dual_step must be in"):
        restore("recoupled_admm", y, op, gauss, nfe=5, dual_step=1.7)
    with pytest.raises(MethodError, match="grid_power must be > 0"):
        restore("recoupled_admm", y, op, gauss, nfe=5, grid_power=0.0)
    with pytest.raises(MethodError, match="eta must be >= 0"):
        restore("recoupled_admm", y, op, gauss, nfe=5, eta=-0.1)
    with pytest.raises(MethodError, match="penalty needs t in"):
        penalty(1.0)
    # noiseless measurement: gamma = 0, hard data consistency, still finite
    op0 = get_operator("inpaint_box", (1, 8, 8), sigma_y=0.0)
    x = gauss.sample_clean(2, torch.Generator().manual_seed(3))
    out = restore("recoupled_admm", op0.measure(x), op0, gauss, nfe=20)
    assert torch.isfinite(out.x).all()
    torch.testing.assert_close(op0.H(out.x), op0.measure(x), atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- tuning
def test_splits_are_disjoint_and_cover_the_digits(digits):
    ranges = [tuning.split_indices(n) for n in ("train", "validation", "test")]
    sets = [set(r) for r in ranges]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert set().union(*sets) == set(range(digits.shape[0])) == set(range(1797))


SMALL = {"recoupled_admm": {"grid_power": tuning.Axis((0.5, 1.0), "linear", 0.25, 0.2, 2.0),
                            "record": tuning.Axis(("none",), "choice", options=("none", "scalars"))},
         "flower": {"num_samples": tuning.Axis((1, 2), "int", 2.0, 1)}}


def test_tuning_never_reads_test_images_and_is_deterministic(digits):
    poisoned = digits.clone()
    test = tuning.split_indices("test")
    poisoned[test.start: test.stop] = float("nan")  # any read of a test image would make a score NaN
    kw = dict(methods=list(SMALL), tasks=["sr2", "inpaint_box"], nfes=[10], spaces=SMALL, budget=4, seed=3, n_val=16)
    rec = tuning.tune("gaussian-digits", images=poisoned, **kw)
    for task in kw["tasks"]:
        for m in SMALL:
            srch = rec["search"][task][m]["10"]
            # every point ran to a finite score, except those that cannot split the NFE (Flower's num_samples)
            assert all(v is not None and math.isfinite(v) or 10 % p.get("num_samples", 1) for p, v in srch["trials"]), srch
            scores = [-math.inf if v is None else v for _, v in srch["trials"]]
            chosen = rec["tuned"][task][m]["10"]
            assert [p for p, _ in srch["trials"]].index(chosen) == scores.index(max(scores))  # the earliest best
            assert srch["evaluations"] == sum(v > -math.inf for v in scores) <= 4 and srch["budget"] == 4
        # the variant's 4 evaluations are all spent; "record" does not change the output, so the tie keeps "none"
        assert rec["search"][task]["recoupled_admm"]["10"]["evaluations"] == 4
        assert rec["tuned"][task]["recoupled_admm"]["10"]["record"] == "none"
    assert rec["split"]["validation_used"] == [1500, 1516] and rec["seed"] == 3 and rec["budget"] == 4
    assert tuning.tune("gaussian-digits", images=poisoned, **kw) == rec  # same inputs, same choice
    # the check can fail: poisoning the validation images is seen
    bad = digits.clone()
    bad[1500:1600] = float("nan")
    with pytest.raises(GenerativeError, match="no grid point ran"):
        tuning.tune("gaussian-digits", images=bad, **kw)


def test_budgeted_search_extends_an_edge_and_spends_the_same_budget():
    """One rule for every method: the starting grid, then the edge is extended while the best lies on it,
    then refinement; the budget is the same whatever the space; points that cannot run are not counted."""
    calls = []

    def f(p):  # peak at lr = 8 (beyond the starting grid's edge 2), a choice worth 1 dB
        calls.append(dict(p))
        return -abs(math.log2(p["lr"]) - 3) + (1.0 if p["mode"] == "b" else 0.0)

    space = {"lr": tuning.Axis((1.0, 2.0), "log", 2.0, 0.01, 100.0), "mode": tuning.Axis(("a",), "choice", options=("a", "b"))}
    res = tuning.budgeted_search(f, space, budget=6)
    assert res["evaluations"] == len(calls) == 6 and res["budget"] == 6
    assert [p["lr"] for p in calls[:4]] == [1.0, 2.0, 4.0, 8.0]  # extended twice from the edge
    assert res["best"] == {"lr": 8.0, "mode": "b"} and res["edge_extensions"] >= 2
    # a bound stops the extension; the search then switches and refines instead of leaving its space
    bounded = {"lr": tuning.Axis((1.0, 2.0), "log", 2.0, 0.01, 4.0), "mode": space["mode"]}
    res = tuning.budgeted_search(f, bounded, budget=6)
    assert all(p["lr"] <= 4.0 for p, _ in res["trials"]) and res["best"]["lr"] == 4.0 and not res["best_on_edge"]
    # a budget too small to leave the edge is reported
    res = tuning.budgeted_search(f, space, budget=3)
    assert res["best"]["lr"] == 4.0 and res["best_on_edge"] is True
    # infeasible points are recorded, not counted; a small space stops early
    odd = tuning.budgeted_search(lambda p: None if p["n"] % 2 else float(p["n"]),
                                 {"n": tuning.Axis((2, 3), "int", 2.0, 1, 8)}, budget=8)
    assert odd["evaluations"] == sum(v is not None for _, v in odd["trials"]) < 8
    assert odd["best"] == {"n": 8}
    with pytest.raises(GenerativeError, match="exceeds the budget"):
        tuning.budgeted_search(f, {"lr": tuning.Axis((1.0, 2.0, 3.0)), "mode": tuning.Axis(("a", "b"), "choice",
                                                                                          options=("a", "b"))}, budget=4)


def test_every_method_gets_the_same_budget_and_a_starting_grid_within_it():
    from lab.generative.restore import METHODS

    tuned_methods = {m for m, cls in METHODS.items() if dataclasses.fields(cls.Config) and m != "bayes"}
    assert tuned_methods <= set(tuning.SPACES) | {"rebridge"}, tuned_methods - set(tuning.SPACES)
    for m, space in tuning.SPACES.items():
        assert len(tuning.grid_points({n: list(a.initial) for n, a in space.items()})) <= 6, m
        names = {f.name for f in dataclasses.fields(METHODS[m].Config)}
        assert set(space) <= names, (m, set(space) - names)  # each method's own hyper-parameters


def test_committed_tuned_file_records_split_budget_seed_and_command():
    data = json.loads(tuning.TUNED_PATH.read_text())
    for kind in ("gaussian-digits", "gaussian-samples", "empirical-digits"):
        rec = data["kinds"][kind]
        assert f"--prior {kind}" in rec["command"] and isinstance(rec["seed"], int), kind
        assert rec["budget"] == tuning.BUDGET and set(rec["spaces"]) == set(tuning.SPACES)
        if kind != "gaussian-samples":
            assert rec["split"]["train"] == [0, 1500] and rec["split"]["validation"] == [1500, 1600]
            assert rec["split"]["test"] == [1600, 1797] and rec["split"]["validation_used"] == [1500, 1600]
        else:
            assert rec["split"]["validation_used"] == {"n": 100, "seed": tuning.SAMPLE_SEEDS["validation"]}
        for task in tuning.TASKS:
            for m in tuning.SPACES:
                for nfe in tuning.NFES:
                    chosen = rec["tuned"][task][m][str(nfe)]
                    srch = rec["search"][task][m][str(nfe)]
                    ran = [(p, v) for p, v in srch["trials"] if v is not None]
                    assert srch["evaluations"] == len(ran) <= tuning.BUDGET, (kind, task, m, nfe)
                    assert max(v for _, v in ran) == dict((json.dumps(p, sort_keys=True), v) for p, v in ran)[
                        json.dumps(chosen, sort_keys=True)], (kind, task, m, nfe)
                    if m != "flower":  # Flower's num_samples must divide the NFE: its space can be smaller
                        assert srch["evaluations"] == tuning.BUDGET, (kind, task, m, nfe)


def test_restore_uses_tuned_values_on_request(gauss):
    op = get_operator("inpaint_box", (1, 8, 8))
    y = op.measure(gauss.sample_clean(2, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1))
    rec = json.loads(tuning.TUNED_PATH.read_text())["kinds"]["gaussian-digits"]["tuned"]["inpaint_box"]
    out = restore("pnp_flow", y, op, gauss, nfe=50, hyper="tuned")
    assert out.hyper_source == "tuned:gaussian-digits@nfe=50"
    assert {k: out.hyper[k] for k in rec["pnp_flow"]["50"]} == rec["pnp_flow"]["50"]
    # the paper's values stay the default
    assert restore("pnp_flow", y, op, gauss, nfe=50).hyper["alpha"] == 0.5
    assert restore("pnp_flow", y, op, gauss, nfe=50).hyper_source == "paper"
    # nearest tuned NFE (the smaller on ties), explicit keywords win
    assert restore("rebridge", y, op, gauss, nfe=35, hyper="tuned").hyper_source == "tuned:gaussian-digits@nfe=20"
    out = restore("rebridge", y, op, gauss, nfe=80, hyper="tuned", kappa=3.0)
    assert out.hyper["kappa"] == 3.0 and out.hyper["lam"] == rec["rebridge"]["100"]["lam"]
    assert out.hyper_source == "tuned:gaussian-digits@nfe=100+explicit"
    assert restore("recoupled_admm", y, op, gauss, nfe=50, hyper="tuned:gaussian-digits").hyper_source.startswith("tuned:")
    assert restore("bayes", y, op, gauss, nfe=1, hyper="tuned").nfe == 0
    # no kind, unknown kind, method without an entry
    untagged = tuning.PRIOR_KINDS["gaussian-digits"](gauss.sample_clean(100, torch.Generator().manual_seed(0)))
    with pytest.raises(MethodError, match="needs the prior's kind"):
        restore("flower", y, op, untagged, nfe=10, hyper="tuned")
    with pytest.raises(MethodError, match="no tuned hyper-parameters for prior kind 'nope'"):
        restore("flower", y, op, gauss, nfe=10, hyper="tuned:nope")
    with pytest.raises(MethodError, match="no tuned hyper-parameters for 'flower' on task 'sr4'"):
        restore("flower", torch.zeros(2, 1, 2, 2), get_operator("sr4", (1, 8, 8)), gauss, nfe=10, hyper="tuned")
    with pytest.raises(MethodError, match="hyper must be"):
        restore("flower", y, op, gauss, nfe=10, hyper="best")


def test_variant_on_the_empirical_prior(digits):
    """Noiseless denoising of images of the set is exact (gamma = 0 makes every anchoring return y), and
    t_max < 1 keeps a memorising prior in its averaging regime on held-out digits."""
    prior = tuning.make_prior("empirical-digits", digits)
    x = digits[:8]
    op = get_operator("denoise", (1, 8, 8), sigma_y=0.0)
    assert float(psnr(restore("recoupled_admm", op.measure(x), op, prior, nfe=20).x, x).min()) > 100
    box = get_operator("inpaint_box", (1, 8, 8))
    x = digits[1500:1532]  # validation digits
    y = box.measure(x, torch.Generator().manual_seed(0))
    full = float(psnr(restore("recoupled_admm", y, box, prior, nfe=50).x, x).mean())
    capped = float(psnr(restore("recoupled_admm", y, box, prior, nfe=50, t_max=0.6).x, x).mean())
    assert capped > full + 2.0, (full, capped)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_variant_cuda_matches_cpu(gauss):  # pragma: no cover - only where a GPU is present
    op = get_operator("inpaint_random", (1, 8, 8))
    y = op.measure(gauss.sample_clean(4, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1)).double()
    for hyper in ({}, {"eta": 0.5, "grid_power": 0.5, "t_max": 0.8}):
        cpu = restore("recoupled_admm", y, op, gauss, nfe=20, seed=0, **hyper)
        gpu = restore("recoupled_admm", y.cuda(), op, gauss, nfe=20, seed=0, record="full", **hyper)
        assert gpu.x.is_cuda and gpu.trajectory[3].b_bar.device.type == "cpu"
        torch.testing.assert_close(gpu.x.cpu(), cpu.x, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- tuning the learned priors
def test_learned_kind_is_tuned_on_its_val_split_only(monkeypatch):
    """A learned kind reads n_val evenly spaced images of the data set's val split (never test), uses sr4 for sr2."""
    from lab.generative import datasets

    real_load = datasets.load
    reads = []

    def spy(name, split="train"):
        reads.append((name, split))
        return real_load(name, split)

    monkeypatch.setattr(datasets, "load", spy)
    space = {"flower": {"num_samples": tuning.Axis((1, 2), "int", 2.0, 1)}}
    rec = tuning.tune("learned-mnist", tasks=["sr2"], nfes=[4], spaces=space, budget=2, n_val=3, seed=0)
    assert reads == [("mnist", "val")]
    assert rec["tasks"] == ["sr4"] and rec["n_images"] == 3
    n = rec["split"]["val_size"]
    assert rec["split"]["validation_used"] == [0, round((n - 1) / 2), n - 1]
    trials = rec["search"]["sr4"]["flower"]["4"]["trials"]
    assert len(trials) == 2 and all(math.isfinite(v) for _, v in trials)
    chosen = rec["tuned"]["sr4"]["flower"]["4"]
    assert dict((p["num_samples"], v) for p, v in trials)[chosen["num_samples"]] == max(v for _, v in trials)


def test_write_tuned_update_at_another_nfe_keeps_the_method_s_other_nfes(tmp_path):
    """--update with a method tuned at one more NFE adds that NFE's entry; the method's other NFEs stay."""
    path = tmp_path / "tuned.json"
    rec = lambda nfe, v: {"prior": "k", "tuned": {"sr4": {"flower": {str(nfe): {"num_samples": v}}}},  # noqa: E731
                          "search": {"sr4": {"flower": {str(nfe): {"evaluations": 3}}}}, "spaces": {"flower": {}}, "budget": 8,
                          "split": {}, "tasks": ["sr4"], "nfes": [nfe], "seed": 0, "n_images": 2, "rule": "r"}
    tuning.write_tuned(rec(20, 4), path, "first")
    data = tuning.write_tuned(rec(50, 2), path, "second", update=True)
    assert data["kinds"]["k"]["tuned"]["sr4"]["flower"] == {"20": {"num_samples": 4}, "50": {"num_samples": 2}}
    assert set(data["kinds"]["k"]["search"]["sr4"]["flower"]) == {"20", "50"}
    assert tuning.tuned_hyper("k", "sr4", "flower", 20, path) == ({"num_samples": 4}, 20)
    assert tuning.tuned_hyper("k", "sr4", "flower", 50, path) == ({"num_samples": 2}, 50)


def test_committed_learned_kinds_are_tuned_on_validation_and_used():
    """The learned kinds: tuned on 16 val images at NFE 20 by the one rule of every kind (``budgeted_search``: BUDGET
    validation evaluations per method and task, Flower fewer where ``num_samples`` cannot divide the NFE; every
    trial recorded, the best kept), in parts of a few tasks each merged with ``--update`` (#22)."""
    from lab.generative.learned import load_learned_prior

    kinds = json.loads(tuning.TUNED_PATH.read_text())["kinds"]
    for kind, name in tuning.LEARNED_KINDS.items():
        rec = kinds[kind]
        assert rec["nfes"] == [20] and rec["budget"] == tuning.BUDGET
        assert "scores" not in rec and "grids" not in rec  # no entry of the grids of before the budget rule is left
        assert rec["split"]["dataset"] == f"lab.generative.datasets.load({name!r}, 'val')"
        assert len(rec["split"]["validation_used"]) == rec["n_images"] == tuning.LEARNED_N_VAL
        assert f"--prior {kind}" in rec["command"]
        assert all(u["budget"] == tuning.BUDGET and u["split"] == rec["split"] for u in rec.get("updates", []))
        # NFE 20 values serve every NFE; a method whose NFE-20 value cannot spend another NFE (Flower's num_samples
        # must divide it) is tuned at that NFE as well, and only then
        assert all(u["nfes"] == [20] or list(u["spaces"]) == ["flower"] for u in rec.get("updates", []))
        for task in ("denoise", "deblur", "sr4", "inpaint_random", "inpaint_box"):
            for m in tuning.SPACES:
                srch, chosen = rec["search"][task][m]["20"], rec["tuned"][task][m]["20"]
                ran = [(p, v) for p, v in srch["trials"] if v is not None]
                assert srch["evaluations"] == len(ran), (kind, task, m)
                assert max(v for _, v in ran) == [v for p, v in ran if p == chosen][0] == srch["best_psnr"], (kind, task, m)
                assert srch["evaluations"] == tuning.BUDGET or (m == "flower" and 1 <= srch["evaluations"] < tuning.BUDGET)
                assert tuning.tuning_budget(kind, task, m, 50) == srch["evaluations"], (kind, task, m)
    prior = load_learned_prior("mnist")
    assert prior.tuning_key == "learned-mnist"
    op = get_operator("inpaint_box", (1, 28, 28))
    y = op.measure(torch.zeros(1, 1, 28, 28), torch.Generator().manual_seed(0))
    out = restore("flower", y, op, prior, nfe=50, hyper="tuned")
    assert out.hyper_source == "tuned:learned-mnist@nfe=20"
    assert out.hyper["num_samples"] == kinds["learned-mnist"]["tuned"]["inpaint_box"]["flower"]["20"]["num_samples"]
