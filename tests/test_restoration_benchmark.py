"""benchmarks.restoration on its --quick setting (a few seconds): keys, row schema, the Bayes ceiling, claims, goals.

Also the learned-prior path, with a stand-in loader (a tiny velocity network on 28x28 images): the
benchmark includes a prior as soon as ``lab.generative.priors.load_learned_prior`` returns one.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import restoration as R

ROW_KEYS = {"prior", "dataset", "task", "method", "nfe", "psnr", "ssim", "s_per_image", "n_images", "psnr_ci95",
            "tuning_budget", "below_naive"}
PAIRED_KEYS = {"prior", "dataset", "task", "nfe", "method", "versus", "psnr_diff", "psnr_diff_ci95"}
NO_NFE = ("bayes", "naive", "tikhonov")
CLAIM_KEYS = {"claim", "paper_value", "measured", "holds"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("restoration") / "r.json"
    R.main(["--quick", "--out", str(out), "--quiet"])
    return json.loads(out.read_text())


def test_top_level_keys_and_inputs(quick):
    for key in ("benchmark", "machine", "inputs", "priors", "results", "claims", "goals", "degraded", "learned_priors"):
        assert key in quick, key
    assert quick["benchmark"] == "restoration"
    assert quick["machine"]["torch"].startswith("2.13.0")
    assert quick["inputs"]["quick"] is True and quick["inputs"]["nfes"] == [20]
    assert quick["priors"]["gaussian"]["n_images"] == R.QUICK["n_images"]
    assert quick["priors"]["gaussian"]["tasks"] == list(R.QUICK["tasks"])


def test_rows_have_the_schema_and_cover_every_method_and_task(quick):
    rows = quick["results"]
    assert len(rows) == len(R.QUICK["tasks"]) * len(R.METHODS)
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert r["prior"] == "gaussian" and r["dataset"] == "sklearn-digits-8x8"
        assert r["nfe"] == 20 and r["n_images"] == R.QUICK["n_images"]
        assert math.isfinite(r["psnr"]) and 5 < r["psnr"] < 60
        assert -1 <= r["ssim"] <= 1 and r["s_per_image"] >= 0
        assert r["hyper_source"]
        assert r["nfe_used"] == (0 if r["method"] in NO_NFE else 20)
        lo, hi = r["psnr_ci95"]
        assert lo <= r["psnr"] <= hi and hi - lo < 4 * r["psnr_std"] + 1e-9, r
    assert {(r["task"], r["method"]) for r in rows} == {(t, m) for t in R.QUICK["tasks"] for m in R.METHODS}
    # the floor: naive is the measurement's own PSNR (the "degraded" entry); every row below it is flagged
    for t in R.QUICK["tasks"]:
        naive = next(r for r in rows if r["task"] == t and r["method"] == "naive")
        assert naive["psnr"] == quick["degraded"]["gaussian"][t]["psnr"] and naive["below_naive"] is False
        for r in rows:
            if r["task"] == t and r["method"] != "naive":
                assert r["below_naive"] == (round(r["psnr"], 2) < round(naive["psnr"], 2)), r
    # equal budgets: every tuned row spent the same number of validation evaluations (Flower: at most as many,
    # its space is the divisors of the NFE); the paper's values and the exact methods spent none
    from lab.generative import tuning

    for r in rows:
        if r["method"] in ("bayes", "naive", "rebridge_as_written"):
            assert r["tuning_budget"] == 0, r
        elif r["method"] == "flower":
            assert 1 <= r["tuning_budget"] <= tuning.BUDGET, r
        else:
            assert r["tuning_budget"] == tuning.BUDGET, r
    # every method that has tuned values for the digits prior uses them; rebridge_as_written never does
    for r in rows:
        if r["method"] == "rebridge_as_written":
            assert r["hyper_source"] == "paper" and r["hyper"]["kappa"] == 5.0 and r["hyper"]["lam"] == 1.0
        elif r["method"] not in ("bayes", "naive"):
            assert r["hyper_source"].startswith("tuned:gaussian-digits"), r


def test_bayes_rows_and_gap_to_bayes(quick):
    rows = quick["results"]
    bayes = {r["task"]: r for r in rows if r["method"] == "bayes"}
    assert set(bayes) == set(R.QUICK["tasks"])
    for r in rows:
        assert r["gap_to_bayes_db"] == pytest.approx(bayes[r["task"]]["psnr"] - r["psnr"], abs=2e-4)
        # On this quick set nobody beats the exact posterior mean. (On real held-out digits, which are not
        # draws from the fitted Gaussian, a method can: the variant passes it by 0.06 dB on box inpainting.)
        assert r["gap_to_bayes_db"] >= -1e-6, r
    assert all(b["gap_to_bayes_db"] == 0 for b in bayes.values())


def test_paired_rows_versus_flower_and_the_variant(quick):
    rows = {(r["task"], r["method"]): r for r in quick["results"]}
    paired = quick["paired"]
    assert len(paired) == len(R.QUICK["tasks"]) * len(R.VERSUS) * (len(R.METHODS) - 1)
    assert set(R.VERSUS) == {"flower", "recoupled_admm", "naive"}
    for p in paired:
        assert PAIRED_KEYS <= set(p), p
        assert p["versus"] in R.VERSUS and p["method"] != p["versus"] and p["nfe"] == 20
        # the mean of the per-image differences is the difference of the means
        assert p["psnr_diff"] == pytest.approx(rows[p["task"], p["method"]]["psnr"] - rows[p["task"], p["versus"]]["psnr"],
                                               abs=2e-4)
        lo, hi = p["psnr_diff_ci95"]
        assert lo <= p["psnr_diff"] <= hi
    # rebridge_as_written against itself is not a row; against Flower it is
    assert {(p["method"], p["versus"]) for p in paired} >= {("rebridge_as_written", "flower"), ("flower", "recoupled_admm")}


def test_bootstrap_interval():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(400, generator=g, dtype=torch.float64) + 3.0
    lo, hi = R.bootstrap_ci(v, seed=1)
    se = float(v.std() / 20)
    assert lo < float(v.mean()) < hi
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.15)  # the normal-theory width for a mean
    assert R.bootstrap_ci(v, seed=1) == [lo, hi]  # seeded
    assert R.bootstrap_ci(torch.full((50,), 2.5)) == [2.5, 2.5]
    assert R.bootstrap_ci(torch.tensor([1.0])) == [1.0, 1.0]
    # paired: a method 0.1 dB above another on every image has a point interval at 0.1 however noisy the images
    a = torch.randn(200, generator=g, dtype=torch.float64) * 5
    assert R.bootstrap_ci((a + 0.1) - a) == [pytest.approx(0.1), pytest.approx(0.1)]


def test_merge_puts_a_run_into_an_earlier_table_row_by_row(quick):
    row = lambda prior, ds, task, nfe, method, psnr, **kw: dict(  # noqa: E731
        prior=prior, dataset=ds, task=task, nfe=nfe, method=method, psnr=psnr, psnr_std=2.0, n_images=16,
        hyper_source="paper", **kw)
    old = {"priors": {"gaussian": {"dataset": "sklearn-digits-8x8", "kind": "exact"},
                      "mnist": {"dataset": "mnist", "kind": "learned"}},
           "results": [row("gaussian", "sklearn-digits-8x8", "sr2", 20, "flower", 1.0),
                       row("mnist", "mnist", "sr4", 20, "flower", 2.0), row("mnist", "mnist", "sr4", 50, "flower", 2.5),
                       row("mnist", "mnist", "sr4", 20, "rebridge", 9.0)],
           "paired": [], "claims": [{"prior": "mnist", "claim": "c"}, {"prior": "gaussian", "claim": "old"}],
           "goals": [], "degraded": {"mnist": {"sr4": {"psnr": 3.0}}}, "learned_priors": {"mnist": "included"},
           "inputs": {"n_images": 16}, "seconds": 10.0}
    # a partial rerun of mnist: the floor at NFE 20, without its claims
    part = {"priors": {"mnist": {"dataset": "mnist", "kind": "learned", "claims": "none"}},
            "results": [row("mnist", "mnist", "sr4", 20, "naive", 5.0, tuning_budget=0, psnr_ci95=[4.0, 6.0], below_naive=False)],
            "paired": [], "claims": [], "degraded": {"mnist": {"sr4": {"psnr": 5.0}}}, "learned_priors": {},
            "inputs": {"n_images": 16}, "seconds": 1.0}
    out = R.merge(part, old, "old.json")
    by = {(r["task"], r["nfe"], r["method"]): r for r in out["results"] if r["prior"] == "mnist"}
    assert set(by) == {("sr4", 20, "flower"), ("sr4", 50, "flower"), ("sr4", 20, "rebridge"), ("sr4", 20, "naive")}
    # below the floor is flagged on carried rows too, at the same NFE only; carried rows get a normal interval
    assert by["sr4", 20, "flower"]["below_naive"] is True and by["sr4", 20, "rebridge"]["below_naive"] is False
    assert by["sr4", 50, "flower"]["below_naive"] is False  # no naive row at NFE 50
    assert by["sr4", 20, "flower"]["psnr_ci95"] == [pytest.approx(2.0 - 0.98), pytest.approx(2.0 + 0.98)]
    assert by["sr4", 20, "flower"]["psnr_ci95_method"] == "normal" and "psnr_ci95_method" not in by["sr4", 20, "naive"]
    assert by["sr4", 20, "flower"]["tuning_budget"] == 0  # the paper's values
    assert out["priors"]["mnist"]["reruns"] == [part["priors"]["mnist"]]  # partly rerun: the earlier entry is kept
    assert [c["claim"] for c in out["claims"]] == ["c", "old"] and out["inputs"]["carried_over"]["claims_of"] == ["mnist"]
    assert out["degraded"]["mnist"] == {"sr4": {"psnr": 5.0}}
    assert out["inputs"]["carried_over"]["priors_carried"] == ["gaussian"]
    assert out["inputs"]["carried_over"]["priors_partly_rerun"] == ["mnist"]
    # a full rerun of a prior replaces its rows and its entry; the quick run's rows all come in
    out = R.merge(dict(quick, benchmark="restoration"), old, "old.json")
    gauss = [r for r in out["results"] if r["prior"] == "gaussian"]
    assert len(gauss) == len(quick["results"]) and all(r["psnr"] != 1.0 for r in gauss)  # the old sr2/flower row replaced
    assert out["priors"]["gaussian"] == quick["priors"]["gaussian"]  # every earlier row replaced: the new entry
    assert [c["claim"] for c in out["claims"] if c["prior"] == "gaussian"] == [c["claim"] for c in quick["claims"]]


def test_combine_folds_runs_into_a_table_in_order(tmp_path, capsys):
    """--combine runs nothing: parts run side by side (each without --merge) go into the table one after the other,
    a later part's row replacing an earlier one; --note is kept; --combine without --merge is refused."""
    row = lambda task, nfe, method, psnr: dict(prior="mnist", dataset="mnist", task=task, nfe=nfe, method=method,  # noqa: E731
                                               psnr=psnr, psnr_std=1.0, n_images=4, hyper_source="paper")

    def run(rows, seconds):
        return {"benchmark": "restoration", "priors": {"mnist": {"dataset": "mnist", "kind": "learned", "claims": "none"}},
                "results": rows, "paired": [], "claims": [], "degraded": {}, "learned_priors": {"mnist": "included"},
                "inputs": {"n_images": 4}, "seconds": seconds}

    base = run([row("sr4", 20, "flower", 1.0), row("sr4", 100, "flower", 7.0)], 10.0)
    a = run([row("sr4", 20, "flower", 2.0), row("sr4", 20, "naive", 1.5)], 1.0)
    b = run([row("sr4", 20, "flower", 3.0), row("sr4", 50, "flower", 4.0)], 2.0)
    files = {}
    for name, d in (("base", base), ("a", a), ("b", b)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(d))
    out = tmp_path / "out.json"
    R.main(["--combine", str(files["a"]), str(files["b"]), "--merge", str(files["base"]), "--out", str(out), "--note", "why"])
    got = json.loads(out.read_text())
    by = {(r["task"], r["nfe"], r["method"]): r["psnr"] for r in got["results"]}
    assert by == {("sr4", 20, "flower"): 3.0, ("sr4", 100, "flower"): 7.0, ("sr4", 20, "naive"): 1.5, ("sr4", 50, "flower"): 4.0}
    assert got["inputs"]["note"] == "why" and got["seconds"] == 13.0
    assert got["inputs"]["carried_over"]["from"] == str(files["a"])  # b was put into (a put into base)
    assert got["inputs"]["carried_over"]["their_inputs"]["carried_over"]["from"] == str(files["base"])
    expected = R.merge(json.loads(json.dumps(b)), R.merge(json.loads(json.dumps(a)), base, str(files["base"])), str(files["a"]))
    assert got["results"] == expected["results"]
    with pytest.raises(SystemExit):
        R.main(["--combine", str(files["a"]), "--out", str(out)])
    assert "--combine needs --merge" in capsys.readouterr().err


def test_claims_rows(quick):
    claims = quick["claims"]
    for c in claims:
        assert CLAIM_KEYS <= set(c), c
        assert isinstance(c["claim"], str) and c["claim"]
        assert c["paper_value"] not in (None, "", {})
        assert c["measured"] not in (None, "", {})
        assert isinstance(c["holds"], bool)
        assert c["criterion"] and c["prior"] == "gaussian"
    text = " | ".join(c["claim"] for c in claims)
    for needle in ("kappa sweep", "rho = 0", "clean-side anchoring only", "hard re-coupling", "K sweep",
                   "flow prior only", "beats PnP-Flow and Flower", "Prop. 3.2", "rho = lambda = 1"):
        assert needle in text, needle
    # the closed form's residual identity is exact; rho enters only as sigma_y^2 rho, so rho = 0 changes nothing
    prop = next(c for c in claims if "Prop. 3.2" in c["claim"])
    assert prop["holds"] and prop["measured"]["max_relative_error"] < 1e-9
    rho0 = next(c for c in claims if c["claim"].startswith("rho = 0"))
    assert not rho0["holds"]
    for task, m in rho0["measured"].items():
        if isinstance(m, dict):
            assert abs(m["full_minus_ablation_db"]) < 0.01, (task, m)


def test_goals(quick):
    goals = quick["goals"]
    bayes_goal = [g for g in goals if g.get("prior") == "gaussian"]
    assert len(bayes_goal) == 1 and bayes_goal[0]["nfe"] == 20
    assert set(bayes_goal[0]["gap_db"]) == set(R.QUICK["tasks"])
    assert bayes_goal[0]["holds"] is True  # the variant is within 0.5 dB of the ceiling


def test_degraded_reference(quick):
    for task in R.QUICK["tasks"]:
        d = quick["degraded"]["gaussian"][task]
        assert math.isfinite(d["psnr"]) and -1 <= d["ssim"] <= 1


def test_learned_prior_status_without_and_with_a_loader(monkeypatch):
    from lab.generative import datasets
    from lab.generative.priors import LearnedPrior

    # the real probe never raises: each shipped name is either included or says why not
    specs, status = R.learned_prior_specs()
    assert set(status) == set(R.LEARNED_NAMES)
    assert [s.name for s in specs] == [n for n in R.LEARNED_NAMES if status[n] == "included"]
    assert all(v == "included" or v.startswith("not included: ") for v in status.values())

    monkeypatch.setattr(R, "_find_loader", lambda: None)
    specs, status = R.learned_prior_specs(("mnist",))
    assert specs == [] and status["mnist"].startswith("not included")

    class Tiny(torch.nn.Module):  # v(x, t) = -x + t-dependent bias: a stand-in velocity network
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 1, 3, padding=1)

        def forward(self, x, t):
            return self.conv(x) - x + t[:, None, None, None] / 1000

    def fake_loader(name):
        if name != "mnist":
            raise FileNotFoundError(f"no weights for {name}")
        torch.manual_seed(0)
        return LearnedPrior(Tiny(), (1, 28, 28), time_scale=1000)

    monkeypatch.setattr(R, "_find_loader", lambda: fake_loader)
    monkeypatch.setattr(datasets, "load", lambda name, split="train": torch.rand(5, 1, 28, 28) * 2 - 1)
    specs, status = R.learned_prior_specs(("mnist", "natural32"))
    assert [s.name for s in specs] == ["mnist"] and status["mnist"] == "included"
    assert status["natural32"].startswith("not included: FileNotFoundError")
    assert specs[0].tasks_for((1, 28, 28)) == ("denoise", "deblur", "sr4", "inpaint_random", "inpaint_box")
    out = R.run(priors=("mnist",), nfes=(20,), n_images=2, tasks=("sr4", "inpaint_box"),
                methods=("bayes", "recoupled_admm", "flower", "pnp_flow", "rebridge"), claims=False, log=lambda s: None)
    rows = out["results"]
    assert {r["method"] for r in rows} == {"recoupled_admm", "flower", "pnp_flow", "rebridge"}  # no ceiling for a network
    assert all(r["prior"] == "mnist" and r["hyper_source"] == "paper" and "gap_to_bayes_db" not in r for r in rows)
    assert all(r["tuning_budget"] == 0 for r in rows)  # no tuned entry: the paper's values, nothing spent
    goal = [g for g in out["goals"] if g["prior"] == "mnist"]
    assert goal and goal[0]["binding"] is True and goal[0]["wins"].endswith("/2")
    # the goal is about all five tasks: a two-task run does not decide it
    assert goal[0]["holds"] is None and goal[0]["status"] == "not evaluated: 2 of the 5 tasks ran"


def test_worker_processes_give_the_rows_of_one_process():
    """--jobs 2 runs the (prior, task) units in two spawned processes: the same rows, in the same order."""
    kw = dict(priors=("gaussian",), nfes=(20,), n_images=3, tasks=("sr2", "inpaint_random"),
              methods=("bayes", "recoupled_admm", "flower"), claims=False, log=None)
    one, two = R.run(jobs=1, **kw), R.run(jobs=2, **kw)
    key = lambda r: (r["task"], r["method"], r["nfe"], r["psnr"], r["ssim"], r["hyper_source"])  # noqa: E731
    assert [key(r) for r in one["results"]] == [key(r) for r in two["results"]]
    assert len(one["results"]) == 6 and one["degraded"] == two["degraded"]
    assert two["inputs"]["jobs"] == 2


def test_ssim_metric_matches_scikit_image():
    from skimage.metrics import structural_similarity

    from lab.generative.errors import GenerativeError
    from lab.generative.metrics import psnr, ssim

    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 1, 8, 8, generator=g, dtype=torch.float64) * 2 - 1
    z = (x + 0.2 * torch.randn(x.shape, generator=g, dtype=torch.float64)).clamp(-1, 1)
    s = ssim(z, x)
    assert s.shape == (3,) and s.dtype == torch.float64
    assert torch.allclose(ssim(x, x), torch.ones(3, dtype=torch.float64))
    for i in range(3):
        ref = structural_similarity(((z[i, 0] + 1) / 2).numpy(), ((x[i, 0] + 1) / 2).numpy(), data_range=1.0)
        assert float(s[i]) == pytest.approx(ref, abs=1e-12)
    rgb = torch.rand(2, 3, 28, 28, generator=g) * 2 - 1
    assert ssim(rgb, rgb).allclose(torch.ones(2, dtype=torch.float64))
    assert psnr(z, x).shape == (3,)  # the existing metric is unchanged
    with pytest.raises(GenerativeError):
        ssim(x, x[:, :, :4])
    with pytest.raises(GenerativeError):
        ssim(x[:, :, :2, :2], x[:, :, :2, :2])


def test_committed_run_is_the_fair_table():
    """benchmarks/results/restoration.json (#22): the exact priors (real digits: all 197 test digits; 200 draws from the
    Gaussian) at NFE 20/50/100 and the learned priors at every NFE re-run since their budgeted tuning (at least NFE 20;
    the same test images for every method of a setting) with every method, the floor (naive, tikhonov) everywhere, an
    interval on every row, paired intervals versus Flower, the variant and naive, each row's tuning budget (the same
    for every tuned method; a learned NFE not re-run keeps its normal-theory intervals), below_naive as defined, the
    Gaussian-sample ceiling, and the claims on each prior with a sweep."""
    from pathlib import Path

    from lab.generative import tuning

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "restoration.json"
    d = json.loads(path.read_text())
    have = {(r["prior"], r["dataset"], r["task"], r["nfe"], r["method"]): r for r in d["results"]}
    paired = {(p["prior"], p["dataset"], p["task"], p["nfe"], p["method"], p["versus"]): p for p in d["paired"]}
    assert set(d["priors"]) == {"gaussian", "gaussian-samples", "empirical", *R.LEARNED_NAMES}
    assert all(v == "included" for v in d["learned_priors"].values())
    settings = {"gaussian": ("gaussian", "sklearn-digits-8x8", 197, R.NFES),
                "gaussian-samples": ("gaussian", "gaussian-samples", 200, R.NFES),
                "empirical": ("empirical", "sklearn-digits-8x8", 197, R.NFES)}
    learned_rerun = {}  # (prior, task) -> the NFEs re-run with the budgeted tuning (bootstrap intervals, no psnr_ci95_method)
    for n in R.LEARNED_NAMES:
        for task in d["priors"][n]["tasks"]:
            rerun = tuple(nfe for nfe in R.NFES if "psnr_ci95_method" not in have[(n, n, task, nfe, "flower")])
            assert 20 in rerun, (n, task, rerun)
            learned_rerun[(n, task)] = rerun
            for nfe in R.NFES:
                if nfe not in rerun:  # carried over from the run before the budget rule, and marked so
                    assert all(r.get("psnr_ci95_method") == "normal" for k, r in have.items()
                               if k[:4] == (n, n, task, nfe) and k[4] not in ("naive", "tikhonov")), (n, task, nfe)
        # >= 200 test images (all of a smaller test split) at NFE 20 and 50; NFE 100, 5x the cost, on >= 40
        n_images = {nfe: have[(n, n, "deblur", nfe, "flower")]["n_images"] for nfe in R.NFES}
        want = min(200, d["priors"][n]["test_split_size"])
        assert all(n_images[nfe] >= (want if nfe < 100 else 40) for nfe in R.NFES), (n, n_images)
        settings[n] = (n, n, n_images, None)
    tuned_file = tuning.load_tuned()["kinds"]
    for kind in tuning.LEARNED_KINDS:  # the learned kinds are tuned by the budget rule too (no grid entries left)
        assert "scores" not in tuned_file[kind] and tuned_file[kind].get("budget") == tuning.BUDGET, kind
    for name, (label, ds, n, nfes) in settings.items():
        tasks = d["priors"][name]["tasks"]
        assert len(tasks) == 5, name
        for task in tasks:
            for nfe in R.NFES:
                for m in ("naive", "tikhonov"):  # the floor at every NFE of every prior
                    assert (label, ds, task, nfe, m) in have, (name, task, nfe, m)
            for nfe in (nfes or learned_rerun[(name, task)]):
                for m in R.METHODS:
                    if m == "bayes" and label != "gaussian":
                        continue
                    r = have[(label, ds, task, nfe, m)]
                    assert r["n_images"] == (n[nfe] if isinstance(n, dict) else n) and r["nfe_used"] == (0 if m in NO_NFE else nfe), r
                    assert "psnr_ci95_method" not in r and r["psnr_ci95"][0] <= r["psnr"] <= r["psnr_ci95"][1], r
                    if m in ("bayes", "naive", "rebridge_as_written"):
                        assert r["tuning_budget"] == 0, r
                    else:
                        assert r["hyper_source"].startswith("tuned:") and 1 <= r["tuning_budget"] <= tuning.BUDGET, r
                        assert r["tuning_budget"] == tuning.BUDGET or m == "flower", r
                    for versus in R.VERSUS:
                        if versus != m:
                            p = paired[(label, ds, task, nfe, m, versus)]
                            assert p["psnr_diff_ci95"][0] <= p["psnr_diff"] <= p["psnr_diff_ci95"][1], p
    # below_naive: under the naive row of the same setting at the table's precision, on every row
    for (label, ds, task, nfe, m), r in have.items():
        naive = have.get((label, ds, task, nfe, "naive"))
        assert r["below_naive"] == bool(naive and m != "naive" and round(r["psnr"], 2) < round(naive["psnr"], 2)), r
        assert "psnr_ci95" in r and "tuning_budget" in r, r
    # the ceiling: on draws from the Gaussian no method passes the posterior mean (beyond rounding of 200 images)
    samples = [r for r in d["results"] if r["dataset"] == "gaussian-samples"]
    assert samples and all(r["gap_to_bayes_db"] >= -0.01 for r in samples)
    claims_by_prior: dict = {}
    for c in d["claims"]:
        claims_by_prior.setdefault(c["prior"], []).append(c)
    assert set(claims_by_prior) == {"gaussian", *R.LEARNED_NAMES}
    assert all(len(v) == 9 for v in claims_by_prior.values())
    binding = [(g["prior"], g["nfe"]) for g in d["goals"] if g.get("binding")]
    assert sorted(binding) == sorted((p, n) for p in R.LEARNED_NAMES for n in R.NFES)


def test_readme_intervals_are_the_committed_paired_rows():
    """Every "+d [lo, hi]" a README restoration sentence quotes (a win, a loss, a difference to the floor) is a paired
    row of the committed table at the README's precision: the words about who wins cannot drift from the run."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    start = readme.index("## Image restoration with flow priors")
    section = readme[start: readme.index("\n## ", start + 1)]
    bench = readme[readme.index("`python -m benchmarks.restoration --out FILE.json`"):]
    bench = bench[: bench.index("`python -m benchmarks.comm")]
    d = json.loads((root / "benchmarks" / "results" / "restoration.json").read_text())
    have = {(f"{p['psnr_diff']:+.2f}", f"{p['psnr_diff_ci95'][0]:.2f}", f"{p['psnr_diff_ci95'][1]:.2f}") for p in d["paired"]}
    have |= {(f"{-p['psnr_diff']:+.2f}", f"{-p['psnr_diff_ci95'][1]:.2f}", f"{-p['psnr_diff_ci95'][0]:.2f}") for p in d["paired"]}
    have = {(a.replace("-0.00", "+0.00"), b.replace("-0.00", "0.00"), c.replace("-0.00", "0.00")) for a, b, c in have}
    quoted = re.findall(r"([+-]\d+\.\d\d) \[(-?\d+\.\d\d), (-?\d+\.\d\d)\]", section + bench)
    assert len(quoted) >= 10, quoted
    missing = [q for q in quoted if q not in have]
    assert not missing, f"README quotes intervals that no paired row of restoration.json gives: {missing}"
    # and each learned-prior bullet's count of wins over Flower is the table's
    learned = ("mnist", "natural32", "medical32")
    bullets = re.findall(r"Learned priors at NFE (\d+) \(.*?the variant wins (all 15|\d+ of 15)", section, re.S)
    assert sorted(int(n) for n, _ in bullets) == [20, 50, 100], bullets
    for nfe, said in bullets:
        wins = sum(p["psnr_diff_ci95"][0] > 0 for p in d["paired"] if p["prior"] in learned and p["nfe"] == int(nfe)
                   and p["method"] == "recoupled_admm" and p["versus"] == "flower")
        assert said == ("all 15" if wins == 15 else f"{wins} of 15"), (nfe, said, wins)


def test_replace_drops_a_prior_before_its_runs_go_in(tmp_path, capsys):
    """--combine --replace NAME: nothing of NAME's earlier runs (rows, paired rows, claims, degraded, its entry and
    its rerun history) survives; other priors, including one sharing NAME's label on another dataset, are kept."""
    row = lambda prior, ds, nfe, method, psnr: dict(prior=prior, dataset=ds, task="sr4", nfe=nfe, method=method,  # noqa: E731
                                                    psnr=psnr, psnr_std=1.0, n_images=4, hyper_source="paper")
    table = {"benchmark": "restoration",
             "priors": {"gaussian": {"dataset": "digits", "kind": "exact"},
                        "gaussian-samples": {"dataset": "gaussian-samples", "label": "gaussian", "kind": "exact"},
                        "mnist": {"dataset": "mnist", "kind": "learned", "claims": "full", "reruns": [{"n_images": 40}]}},
             "results": [row("gaussian", "digits", 20, "flower", 1.0), row("gaussian", "gaussian-samples", 20, "flower", 1.5),
                         row("mnist", "mnist", 20, "flower", 2.0), row("mnist", "mnist", 100, "flower", 2.5)],
             "paired": [dict(row("mnist", "mnist", 20, "flower", 0.0), versus="naive", psnr_diff=1.0, psnr_diff_ci95=[0.5, 1.5])],
             "claims": [{"prior": "mnist", "claim": "old weights"}, {"prior": "gaussian", "claim": "kept"}],
             "goals": [], "degraded": {"mnist": {"sr4": {"psnr": 3.0}, "deblur": {"psnr": 6.0}}, "gaussian": {"sr4": {"psnr": 4.0}}},
             "learned_priors": {"mnist": "included"}, "inputs": {"n_images": 4}, "seconds": 1.0}
    dropped = R.drop_priors(table, ["gaussian-samples", "mnist"])
    assert [(r["prior"], r["dataset"]) for r in dropped["results"]] == [("gaussian", "digits")]
    assert dropped["paired"] == [] and [c["claim"] for c in dropped["claims"]] == ["kept"]
    assert set(dropped["priors"]) == {"gaussian"} and set(dropped["degraded"]) == {"gaussian"}
    assert dropped["learned_priors"] == {"mnist": "included"} and len(table["results"]) == 4  # the input is untouched
    with pytest.raises(KeyError, match="no prior 'cifar'.*holds: gaussian, gaussian-samples, mnist"):
        R.drop_priors(table, ["cifar"])
    # through the CLI: the run's mnist at NFE 20 is all that is left of mnist; its entry is the run's, no reruns
    part = {"benchmark": "restoration", "priors": {"mnist": {"dataset": "mnist", "kind": "learned", "claims": "none", "n_images": 4}},
            "results": [row("mnist", "mnist", 20, "naive", 5.0)], "paired": [], "claims": [],
            "degraded": {"mnist": {"sr4": {"psnr": 5.0}}}, "learned_priors": {"mnist": "included"},
            "inputs": {"n_images": 4}, "seconds": 2.0}
    (tmp_path / "table.json").write_text(json.dumps(table))
    (tmp_path / "part.json").write_text(json.dumps(part))
    out = tmp_path / "out.json"
    R.main(["--combine", str(tmp_path / "part.json"), "--merge", str(tmp_path / "table.json"), "--replace", "mnist",
            "--out", str(out)])
    d = json.loads(out.read_text())
    assert sorted((r["prior"], r["nfe"], r["method"]) for r in d["results"] if r["prior"] == "mnist") == [("mnist", 20, "naive")]
    assert d["priors"]["mnist"] == part["priors"]["mnist"] and [c["claim"] for c in d["claims"]] == ["kept"]
    assert d["inputs"]["replaced_priors"] == ["mnist"] and d["degraded"]["mnist"] == {"sr4": {"psnr": 5.0}}
    with pytest.raises(SystemExit):
        R.main(["--combine", str(tmp_path / "part.json"), "--merge", str(tmp_path / "table.json"), "--replace", "cifar",
                "--out", str(out)])
    assert "no prior 'cifar'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a replaced prior that no run brings back would vanish: refused
        R.main(["--combine", str(tmp_path / "part.json"), "--merge", str(tmp_path / "table.json"), "--replace", "mnist",
                "gaussian-samples", "--out", str(tmp_path / "vanished.json")])
    assert "--replace gaussian-samples: no run given holds it" in capsys.readouterr().err
    assert not (tmp_path / "vanished.json").exists()
    with pytest.raises(SystemExit):
        R.main(["--replace", "mnist", "--out", str(out)])
    assert "--replace goes with --combine" in capsys.readouterr().err
