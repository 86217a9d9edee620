"""Restoration methods (lab.generative.restore) on exact priors.

- ReBridge-Flow's closed form is the joint minimiser of its Posterior Bridge Defect (dense normal equations).
- Every method spends exactly its NFE budget.
- On a Gaussian prior fitted to real 8x8 digits, every method is scored against the exact Bayes
  posterior mean (computed by the prior, itself checked in test_generative_priors.py).
- With an empirical prior and no noise, denoising an image of the set is (near) exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from lab.generative.errors import MethodError, NFEBudgetError
from lab.generative.metrics import mse, psnr
from lab.generative.operators import OPERATORS, get_operator
from lab.generative.priors import EmpiricalPrior, GaussianPrior, LearnedPrior
from lab.generative.restore import METHODS, available_methods, restore
from lab.generative.restore.rebridge import defect_terms, gamma_t, ode_limit, recouple

TASKS = ["denoise", "deblur", "sr2", "inpaint_random", "inpaint_box"]
FLOW_METHODS = ["rebridge", "pnp_flow", "flower", "ot_ode", "d_flow"]


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    """scikit-learn's 1,797 real 8x8 digits as (N, 1, 8, 8) on [-1, 1]."""
    return torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 8 - 1


@pytest.fixture(scope="module")
def gauss(digits) -> GaussianPrior:
    return GaussianPrior.fit(digits[:1500], ridge=1e-3)


# --------------------------------------------------------------------------- ReBridge closed form
def dense_minimiser(x, v, t, y, A, s2, rho, lam, kappa):
    """argmin_{a,b} J_t(a, b) (Eq. 6) from its normal equations, solved densely (one image, float64)."""
    n = x.size
    I = np.eye(n)
    a_hat, b_hat = x - t * v, x + (1 - t) * v
    M = np.block([
        [(lam + kappa * (1 - t) ** 2) * I, kappa * t * (1 - t) * I],
        [kappa * t * (1 - t) * I, A.T @ A / s2 + (rho + kappa * t**2) * I],
    ])
    rhs = np.concatenate([lam * a_hat + kappa * (1 - t) * x, A.T @ y / s2 + rho * b_hat + kappa * t * x])
    sol = np.linalg.solve(M, rhs)
    return sol[:n], sol[n:]


@pytest.mark.parametrize("t", [0.15, 0.5, 0.9])
@pytest.mark.parametrize("rho,lam,kappa", [(1.0, 1.0, 5.0), (0.5, 2.0, 0.3), (1.0, 0.0, 5.0), (0.0, 1.0, 5.0), (1.0, 1.0, 0.0)])
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_rebridge_closed_form_is_the_joint_minimiser_of_the_defect(name, rho, lam, kappa, t):
    op = get_operator(name, (1, 8, 8))
    A = op.as_matrix().numpy()
    g = torch.Generator().manual_seed(7)
    x = torch.randn((1, 1, 8, 8), generator=g, dtype=torch.float64)
    v = torch.randn((1, 1, 8, 8), generator=g, dtype=torch.float64)
    y = op.measure(torch.randn((1, 1, 8, 8), generator=g, dtype=torch.float64), g)
    e = recouple(x, t, v, y, op, rho=rho, lam=lam, kappa=kappa)
    a_ref, b_ref = dense_minimiser(x.flatten().numpy(), v.flatten().numpy(), t, y.flatten().numpy(), A, op.sigma_y**2, rho, lam, kappa)
    scale = 1 + np.abs(b_ref).max()
    np.testing.assert_allclose(e.b_bar.flatten().numpy(), b_ref, atol=1e-8 * scale)
    np.testing.assert_allclose(e.a_bar.flatten().numpy(), a_ref, atol=1e-8 * scale)
    assert e.gamma == pytest.approx(op.sigma_y**2 * (rho + kappa * lam * t**2 / (lam + kappa * (1 - t) ** 2)))

    # the minimum is a minimum: random perturbations never lower J (Prop. 3.1)
    J0 = defect_terms(e.a_bar, e.b_bar, x, t, y, op, e.a_hat, e.b_hat, rho, lam, kappa)["defect"]
    for _ in range(5):
        da, db = 1e-3 * torch.randn_like(x), 1e-3 * torch.randn_like(x)
        J = defect_terms(e.a_bar + da, e.b_bar + db, x, t, y, op, e.a_hat, e.b_hat, rho, lam, kappa)["defect"]
        assert float(J) >= float(J0) - 1e-9 * (1 + float(J0))
    # exact contraction of the bridge residual (Prop. 3.2): r_RC = eta_t r_CS
    eta = lam / (lam + kappa * (1 - t) ** 2)
    r_cs = x - ((1 - t) * e.a_hat + t * e.b_bar)
    r_rc = x - ((1 - t) * e.a_bar + t * e.b_bar)
    torch.testing.assert_close(r_rc, eta * r_cs)
    # the update is the prior velocity plus c(t) (b_bar - b_hat), c = 1 + kappa t (1-t) / (lambda + kappa (1-t)^2)
    c = 1 + kappa * t * (1 - t) / (lam + kappa * (1 - t) ** 2)
    torch.testing.assert_close(e.b_bar - e.a_bar, v + c * (e.b_bar - e.b_hat))


def test_gamma_t_refuses_undetermined_source():
    with pytest.raises(MethodError, match="undetermined"):
        gamma_t(1.0, 0.1, 1.0, 0.0, 5.0)
    with pytest.raises(MethodError, match="lam = 0 needs kappa > 0"):
        METHODS["rebridge"](lam=0.0, kappa=0.0)


# --------------------------------------------------------------------------- NFE budgets
@pytest.mark.parametrize("nfe", [20, 50])
@pytest.mark.parametrize("method", FLOW_METHODS)
def test_every_method_spends_exactly_its_budget(gauss, method, nfe):
    op = get_operator("sr2", (1, 8, 8))
    x = gauss.sample_clean(4, torch.Generator().manual_seed(0))
    y = op.measure(x, torch.Generator().manual_seed(1))
    before = gauss.nfe
    out = restore(method, y, op, gauss, nfe=nfe, seed=0)
    assert out.nfe == nfe == gauss.nfe - before
    assert out.x.shape == x.shape and out.x.dtype == y.dtype and torch.isfinite(out.x).all()
    assert out.method == method and out.seconds >= 0


class _TimeSpy(GaussianPrior):
    """The Gaussian prior, recording every query time."""

    def __init__(self, inner):
        super().__init__(inner.mean, inner.cov)
        self.times: list[float] = []

    def _prepare(self, x, t, fn):
        self.times.append(float(t))
        return super()._prepare(x, t, fn)


def test_timesteps_is_the_one_grid():
    from lab.generative.restore.base import timesteps

    g = timesteps(4)
    assert [s.t for s in g] == [0.0, 0.25, 0.5, 0.75] and {s.dt for s in g} == {0.25} and g[-1].t_next == 1.0
    assert [s.k for s in g] == [0, 1, 2, 3]
    g = timesteps(3, start=0.4)  # OT-ODE: K query times in [t0, 1)
    assert g[0].t == 0.4 and g[-1].t_next == 1.0 and g[1].t == pytest.approx(0.6) and g[0].dt == pytest.approx(0.2)
    g = timesteps(4, end=0.9, power=0.5)  # warped: dt is the difference of neighbours
    assert g[1].t == pytest.approx(0.9 * 0.5) and g[-1].t_next == 0.9
    assert all(s.dt == s.t_next - s.t for s in g)
    for bad in [dict(K=0), dict(K=2.5), dict(K=3, start=1.0), dict(K=3, end=1.5), dict(K=3, power=0.0)]:
        with pytest.raises(MethodError, match="timesteps"):
            timesteps(**bad)


@pytest.mark.parametrize("method,kw,nfe,grid", [
    ("rebridge", {}, 6, dict(K=6)),
    ("flower", {}, 6, dict(K=6)),
    ("pnp_flow", {}, 6, dict(K=6)),
    ("ot_ode", {"start_time": 0.3}, 6, dict(K=6, start=0.3)),
    ("recoupled_admm", {"grid_power": 0.7, "t_max": 0.9}, 6, dict(K=6, end=0.9, power=0.7)),
])
def test_every_method_queries_the_prior_on_timesteps(gauss, method, kw, nfe, grid):
    """One copy of the grid rule: each method's query times are exactly those of ``timesteps``."""
    from lab.generative.restore.base import timesteps

    spy = _TimeSpy(gauss)
    op = get_operator("deblur", (1, 8, 8))
    y = op.measure(gauss.sample_clean(2, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1))
    restore(method, y, op, spy, nfe=nfe, seed=0, **kw)
    assert spy.times == [s.t for s in timesteps(**grid)]


def test_d_flow_and_sampling_use_timesteps(gauss):
    from lab.generative.restore.base import timesteps
    from lab.generative.restore.d_flow import DFlow

    spy = _TimeSpy(gauss)
    x = torch.zeros(1, 1, 8, 8, dtype=torch.float64)
    DFlow._forward(spy, x, 4, "euler")
    assert spy.times == [s.t for s in timesteps(4)]
    spy.times.clear()
    DFlow._inverse(spy, x, 4, "euler")  # backwards, at each interval's midpoint
    assert spy.times == [0.5 * (s.t + s.t_next) for s in reversed(timesteps(4))]
    spy.times.clear()
    spy.sample(2, 5, torch.Generator().manual_seed(0), dtype=torch.float64)
    assert spy.times == [s.t for s in timesteps(5)]


def test_budget_splits(gauss):
    op = get_operator("denoise", (1, 8, 8))
    y = op.measure(gauss.sample_clean(2, torch.Generator().manual_seed(0)), torch.Generator().manual_seed(1))
    for method in ("pnp_flow", "flower"):
        out = restore(method, y, op, gauss, nfe=20, seed=0, num_samples=4)  # 5 steps x 4 draws
        assert out.nfe == 20
        with pytest.raises(NFEBudgetError, match="not a multiple of 3"):
            restore(method, y, op, gauss, nfe=20, seed=0, num_samples=3)
    assert restore("d_flow", y, op, gauss, nfe=10, seed=0, steps=2, solver="midpoint", inversion_steps=1).nfe == 10
    with pytest.raises(NFEBudgetError, match=r"5 \(inversion\) \+ n x 5"):
        restore("d_flow", y, op, gauss, nfe=23, seed=0)
    with pytest.raises(NFEBudgetError, match="nfe must be an integer >= 1"):
        restore("rebridge", y, op, gauss, nfe=0)
    out = restore("bayes", y, op, gauss, nfe=1)
    assert out.nfe == 0


# --------------------------------------------------------------------------- against the Bayes ceiling
@pytest.fixture(scope="module")
def gaussian_scores(gauss):
    """Mean PSNR (dB, [0, 1] scale, unclipped) of every method on 64 images drawn from the Gaussian prior."""
    x = gauss.sample_clean(64, torch.Generator().manual_seed(11), dtype=torch.float64)
    scores = {}
    for task in TASKS:
        op = get_operator(task, (1, 8, 8))
        y = op.measure(x, torch.Generator().manual_seed(12))
        for method, nfe in [("bayes", 1)] + [(m, n) for m in FLOW_METHODS for n in (20, 50)]:
            out = restore(method, y, op, gauss, nfe=nfe, seed=3)
            scores[task, method, out.nfe] = (
                float(psnr(out.x, x, clip=False).mean()),  # mean of per-image PSNR
                float(-10 * torch.log10(mse(out.x, x, clip=False).mean())),  # PSNR of the mean MSE
            )
    return scores


def test_every_method_scored_against_the_exact_bayes_mean(gaussian_scores, record_property):
    lines = ["task            method     nfe   PSNR  gap-to-Bayes"]
    for (task, method, nfe), (p, _) in sorted(gaussian_scores.items()):
        lines.append(f"{task:15s} {method:9s} {nfe:4d} {p:6.2f} {p - gaussian_scores[task, 'bayes', 0][0]:+6.2f}")
    print("\n" + "\n".join(lines))
    record_property("gaussian_prior_psnr", {f"{t}/{m}/{n}": round(v[0], 3) for (t, m, n), v in gaussian_scores.items()})
    for task in TASKS:
        bayes_p, bayes_m = gaussian_scores[task, "bayes", 0]
        for method in FLOW_METHODS:
            for nfe in (20, 50):
                p, m = gaussian_scores[task, method, nfe]
                assert bayes_m >= m - 1e-9, (task, method, nfe)  # the MMSE estimator: no lower mean squared error
                assert bayes_p >= p - 0.05, (task, method, nfe)
        # the sanity baselines stay within a sane margin of the ceiling
        for nfe in (20, 50):
            assert gaussian_scores[task, "flower", nfe][0] >= bayes_p - 3.0, (task, nfe)
            assert gaussian_scores[task, "pnp_flow", nfe][0] >= bayes_p - 6.0, (task, nfe)


def test_bayes_method_is_the_posterior_mean(gauss):
    op = get_operator("inpaint_box", (1, 8, 8))
    x = gauss.sample_clean(3, torch.Generator().manual_seed(0))
    y = op.measure(x, torch.Generator().manual_seed(1))
    torch.testing.assert_close(restore("bayes", y, op, gauss, nfe=1).x, gauss.posterior_mean(y, op))
    with pytest.raises(MethodError, match="needs an exact prior"):
        restore("bayes", y, op, LearnedPrior(lambda x, t: x, (1, 8, 8)), nfe=1)


# --------------------------------------------------------------------------- empirical prior, noiseless
def test_noiseless_denoising_of_in_set_images_is_near_exact(digits):
    prior = EmpiricalPrior(digits[:300])
    x = digits[:8]
    op = get_operator("denoise", (1, 8, 8), sigma_y=0.0)
    y = op.measure(x)
    assert float(psnr(restore("bayes", y, op, prior, nfe=1).x, x).min()) > 100
    for method in ("flower", "pnp_flow", "rebridge", "ot_ode"):
        p = psnr(restore(method, y, op, prior, nfe=50, seed=0).x, x)
        # Flower's last step returns b1* = y exactly; the others commit to an image of the set early and
        # mostly pick the right one (ReBridge-Flow: 7 of 8 here, see ../shared/notes/rebridge-reproduction.md)
        if method == "flower":
            assert float(p.min()) > 100, method
        else:
            assert float(p.median()) > 40, (method, p.tolist())


# --------------------------------------------------------------------------- ReBridge trajectory, readings, ablations
def test_rebridge_trajectory_exposes_endpoints_and_defect_terms(gauss):
    op = get_operator("inpaint_random", (1, 8, 8))
    x = gauss.sample_clean(3, torch.Generator().manual_seed(0))
    y = op.measure(x, torch.Generator().manual_seed(1))
    out = restore("rebridge", y, op, gauss, nfe=20, seed=0, record="full")
    steps = out.trajectory
    assert len(steps) == 20 and [s.k for s in steps] == list(range(20))
    assert out.hyper == {"rho": 1.0, "lam": 1.0, "kappa": 5.0, "reading": "paper", "record": "full"}
    for s in steps:
        assert s.t == pytest.approx(s.k / 20) and s.dt == pytest.approx(0.05)
        for name in ("a_hat", "b_hat", "b_bar", "a_bar", "x"):
            assert getattr(s, name).shape == (3, 1, 8, 8)
        T = s.terms
        assert set(T) == {"measurement_defect", "clean_prior_deviation", "source_prior_deviation",
                          "flow_prior_deviation", "bridge_residual", "defect"}
        torch.testing.assert_close(T["defect"], T["measurement_defect"] + T["flow_prior_deviation"] + T["bridge_residual"])
        eta = 1 / (1 + 5 * (1 - s.t) ** 2)
        torch.testing.assert_close(s.residual_recoupled, eta * s.residual_clean_side, atol=1e-5, rtol=1e-4)  # float32 run
        assert bool((s.mismatch_bar <= s.mismatch_hat + 1e-9).all())  # anchoring never increases the mismatch
        assert s.gamma == pytest.approx(gamma_t(s.t, op.sigma_y, 1.0, 1.0, 5.0))
    # the recorded endpoints reproduce the state update of Eq. 9
    s = steps[7]
    torch.testing.assert_close(steps[8].x, s.x + s.dt * (s.b_bar - s.a_bar))
    assert restore("rebridge", y, op, gauss, nfe=5, record="none").trajectory is None
    scal = restore("rebridge", y, op, gauss, nfe=5).trajectory
    assert scal[0].b_bar is None and scal[0].terms["defect"].shape == (3,)


def test_rebridge_converges_to_its_ode_limit_on_a_hand_solved_two_pixel_case():
    """Issue #22: ReBridge below its input is the method. On a 2-pixel Gaussian prior with pixel 1
    observed, Eq. 9's output tends (at first order in 1/K) to the ODE limit alpha x_0 + beta y + r,
    which keeps a share of the source draw x_0 on the observed pixel whatever K is."""
    import math

    from lab.generative.operators import BoxInpainting

    # the hand-solved case (kappa = 0, sigma_y = 0, N(0, 1)): alpha = exp(-pi/4), beta by one closed-form integrand
    from scipy.integrate import quad

    alpha0, beta0, _ = ode_limit(0.0, 1.0, 1, 0.0, kappa=0.0)
    n = lambda u: u * u + (1 - u) ** 2  # noqa: E731
    beta_hand = quad(lambda u: n(u) ** -0.25 * math.exp(math.atan(2 * u - 1) / 2 - math.pi / 8), 0, 1)[0]
    assert alpha0 == pytest.approx(math.exp(-math.pi / 4), abs=1e-9) and beta0 == pytest.approx(beta_hand, abs=1e-9)
    assert ode_limit(0.0, 1.0, 0, 0.0, kappa=0.0) == pytest.approx((1.0, 0.0, 0.0), abs=1e-9)  # unobserved: its source draw
    # at the paper's kappa = 5 the observed pixel keeps 0.30 of x_0 and 0.91 of y
    a5, b5, _ = ode_limit(0.0, 1.0, 1, 0.01)
    assert a5 == pytest.approx(0.3042, abs=1e-3) and b5 == pytest.approx(0.9058, abs=1e-3)

    mu, s = (0.3, -0.2), (0.5, 2.0)
    prior = GaussianPrior(torch.tensor(mu, dtype=torch.float64).reshape(1, 1, 2), torch.diag(torch.tensor(s, dtype=torch.float64)))
    op = BoxInpainting((1, 1, 2), size=(1, 1), top_left=(0, 1), sigma_y=0.01)  # pixel 1 observed, pixel 2 missing
    assert op.mask.flatten().tolist() == [1.0, 0.0]
    y = torch.tensor([0.8, 0.0], dtype=torch.float64).reshape(1, 1, 1, 2)
    coef = [ode_limit(mu[0], s[0], 1, 0.01), ode_limit(mu[1], s[1], 0, 0.01)]
    err = {}
    for K in (100, 800):
        out = restore("rebridge", y, op, prior, nfe=K, seed=0, record="full")
        x0 = out.trajectory[0].x.flatten()
        limit = torch.tensor([a * float(x0[i]) + b * float(y.flatten()[i]) + r for i, (a, b, r) in enumerate(coef)], dtype=torch.float64)
        err[K] = float((out.x.flatten() - limit).abs().max())
    assert err[800] < 1e-3, err
    assert 5 < err[100] / err[800] < 11, err  # Euler: first order in dt = 1/K
    # the limit is not the posterior mean: on the observed pixel it sits far from y (sigma_y = 0.01)
    observed = float(out.x.flatten()[0])
    assert abs(observed - 0.8) > 10 * op.sigma_y and abs(float(prior.posterior_mean(y, op).flatten()[0]) - 0.8) < op.sigma_y


def test_rebridge_readings_and_switches(gauss):
    op = get_operator("sr2", (1, 8, 8))
    x = gauss.sample_clean(4, torch.Generator().manual_seed(0))
    y = op.measure(x, torch.Generator().manual_seed(1))
    proj = restore("rebridge", y, op, gauss, nfe=10, seed=0, reading="projected", record="full")
    torch.testing.assert_close(proj.x, proj.trajectory[-1].b_bar)  # the projected reading outputs the last b_bar
    cs = restore("rebridge", y, op, gauss, nfe=10, seed=0, reading="clean_side_only", record="full")
    assert all(float(s.terms["source_prior_deviation"].max()) == 0 for s in cs.trajectory)
    # kappa = 0 switches re-coupling off: the paper's step equals the clean-side-only step
    k0 = restore("rebridge", y, op, gauss, nfe=10, seed=0, kappa=0.0)
    torch.testing.assert_close(k0.x, restore("rebridge", y, op, gauss, nfe=10, seed=0, kappa=0.0, reading="clean_side_only").x)
    # aliases of lambda, hard re-coupling, rho = 0
    assert restore("rebridge", y, op, gauss, nfe=10, **{"lambda": 0.0}).hyper["lam"] == 0.0
    assert torch.isfinite(restore("rebridge", y, op, gauss, nfe=10, rho=0.0).x).all()
    # same seed, same result; another seed, another source draw
    a = restore("rebridge", y, op, gauss, nfe=10, seed=4).x
    torch.testing.assert_close(a, restore("rebridge", y, op, gauss, nfe=10, seed=4).x, rtol=0, atol=0)
    assert not torch.equal(a, restore("rebridge", y, op, gauss, nfe=10, seed=5).x)


# --------------------------------------------------------------------------- learned prior path, errors
class TinyVelocity(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(2, 1, 3, padding=1)

    def forward(self, x, t):
        return self.conv(torch.cat([x, t[:, None, None, None].expand_as(x)], dim=1))


@pytest.mark.parametrize("method", FLOW_METHODS)
def test_methods_run_on_a_learned_prior(method):
    prior = LearnedPrior(TinyVelocity(), (1, 8, 8))
    op = get_operator("inpaint_box", (1, 8, 8))
    y = op.measure(torch.rand(2, 1, 8, 8) * 2 - 1, torch.Generator().manual_seed(0))
    hyper = {"steps": 2, "inversion_steps": 2} if method == "d_flow" else {}
    out = restore(method, y, op, prior, nfe=10, seed=0, **hyper)
    assert out.nfe == 10 and out.x.shape == (2, 1, 8, 8) and torch.isfinite(out.x).all()
    assert not out.x.requires_grad


def test_restore_errors(gauss):
    op = get_operator("denoise", (1, 8, 8))
    y = torch.zeros(2, 1, 8, 8)
    assert available_methods() == ["bayes", "d_flow", "flower", "naive", "ot_ode", "pnp_flow", "rebridge", "recoupled_admm",
                                   "tikhonov"]
    with pytest.raises(MethodError, match="unknown restoration method 'dps'.*rebridge"):
        restore("dps", y, op, gauss, nfe=10)
    with pytest.raises(MethodError, match=r"unknown hyper-parameter\(s\) \['eta'\]"):
        restore("rebridge", y, op, gauss, nfe=10, eta=1.0)
    with pytest.raises(MethodError, match="reading must be one of"):
        restore("rebridge", y, op, gauss, nfe=10, reading="fancy")
    with pytest.raises(MethodError, match=r"expected y of shape \(B, 1, 8, 8\), got \(2, 1, 4, 4\)"):
        restore("flower", torch.zeros(2, 1, 4, 4), op, gauss, nfe=10)
    with pytest.raises(MethodError, match="operator images"):
        restore("flower", torch.zeros(2, 1, 4, 4), get_operator("denoise", (1, 4, 4)), gauss, nfe=10)
    with pytest.raises(MethodError, match="start_time must be in"):
        restore("ot_ode", y, op, gauss, nfe=10, start_time=0.0)
    with pytest.raises(MethodError, match="alpha must be >= 0"):
        restore("pnp_flow", y, op, gauss, nfe=10, alpha=-1.0)

    class Custom(type(op)):
        name = "custom"

    with pytest.raises(MethodError, match=r"no default for \['alpha'\] on task 'custom'"):
        restore("pnp_flow", y, Custom((1, 8, 8)), gauss, nfe=10)
    assert restore("pnp_flow", y, Custom((1, 8, 8)), gauss, nfe=10, alpha=0.5).hyper["alpha"] == 0.5
    # per-task defaults are resolved and reported
    assert restore("ot_ode", y, op, gauss, nfe=10).hyper == {"start_time": 0.3, "gamma": "gamma_t", "init": "adjoint"}
    sr = get_operator("sr2", (1, 8, 8))
    assert restore("pnp_flow", torch.zeros(2, 1, 4, 4), sr, gauss, nfe=10).hyper == {"lr": 1.0, "alpha": 0.3, "num_samples": 1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", FLOW_METHODS + ["bayes"])
def test_cuda_matches_cpu(gauss, method):  # pragma: no cover - only where a GPU is present
    op = get_operator("sr2", (1, 8, 8))
    x = gauss.sample_clean(4, torch.Generator().manual_seed(0))
    y = op.measure(x, torch.Generator().manual_seed(1))
    cpu = restore(method, y.double(), op, gauss, nfe=20, seed=0).x
    gpu = restore(method, y.double().cuda(), op, gauss, nfe=20, seed=0).x
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-6, rtol=1e-6)
