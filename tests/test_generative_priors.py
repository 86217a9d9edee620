"""Exact flow priors (lab.generative.priors) against independent dense-algebra and Monte-Carlo computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from lab.generative.errors import PriorError
from lab.generative.operators import OPERATORS, get_operator
from lab.generative.priors import EmpiricalPrior, FlowPrior, GaussianPrior, LearnedPrior


@pytest.fixture(scope="module")
def digits() -> torch.Tensor:
    """scikit-learn's 1,797 real 8x8 digits (values 0..16) as (N, 1, 8, 8) on [-1, 1]."""
    return torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 8 - 1


@pytest.fixture(scope="module")
def gauss(digits) -> GaussianPrior:
    return GaussianPrior.fit(digits[:1500], ridge=1e-3)


def random_gaussian(d=4, seed=0):
    g = np.random.default_rng(seed)
    B = g.normal(size=(d, d))
    cov = B @ B.T / d + 0.1 * np.eye(d)
    mu = g.normal(size=d)
    return mu, cov


def test_fit_matches_numpy(digits, gauss):
    X = digits[:1500].double().flatten(1).numpy()
    np.testing.assert_allclose(gauss.mean.flatten().numpy(), X.mean(0), atol=1e-12)
    np.testing.assert_allclose(gauss.cov.numpy(), np.cov(X, rowvar=False) + 1e-3 * np.eye(64), atol=1e-10)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.7, 0.99, 1.0])
def test_gaussian_velocity_and_denoiser_equal_dense_conditional_gaussian(gauss, t):
    """v* = E[x1 - x0 | x_t] and E[x1 | x_t] by the conditional-Gaussian formula on the joint of (x1 - x0, x1, x_t)."""
    mu = gauss.mean.flatten().numpy()
    S = gauss.cov.numpy()
    d = mu.size
    I = np.eye(d)
    Cxx = t**2 * S + (1 - t) ** 2 * I  # Cov(x_t)
    Cvx = t * S - (1 - t) * I  # Cov(x1 - x0, x_t)
    C1x = t * S  # Cov(x1, x_t)
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    xf = x.flatten(1).numpy()
    v_dense = mu + (xf - t * mu) @ np.linalg.solve(Cxx, Cvx.T)
    d_dense = mu + (xf - t * mu) @ np.linalg.solve(Cxx, C1x.T)
    np.testing.assert_allclose(gauss.velocity(x, t).flatten(1).numpy(), v_dense, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(gauss.clean_estimate(x, t).flatten(1).numpy(), d_dense, rtol=1e-8, atol=1e-8)
    if t < 1:  # the identity E[x1|x_t] = x + (1-t) v
        np.testing.assert_allclose(d_dense, xf + (1 - t) * v_dense, rtol=1e-8, atol=1e-8)


def test_gaussian_velocity_is_the_monte_carlo_regression_of_x1_minus_x0_on_xt():
    """Draw (x0, x1), regress x1 - x0 on x_t (affine least squares): the fitted map is v*."""
    mu, cov = random_gaussian(4, seed=1)
    prior = GaussianPrior(torch.tensor(mu).reshape(1, 2, 2), torch.tensor(cov))
    rng = np.random.default_rng(2)
    n, t = 400_000, 0.4
    x1 = rng.multivariate_normal(mu, cov, size=n)
    x0 = rng.normal(size=(n, 4))
    xt = (1 - t) * x0 + t * x1
    design = np.hstack([xt, np.ones((n, 1))])
    coef, *_ = np.linalg.lstsq(design, x1 - x0, rcond=None)
    probe = rng.normal(size=(8, 4))
    v_mc = np.hstack([probe, np.ones((8, 1))]) @ coef
    v = prior.velocity(torch.tensor(probe).reshape(8, 1, 2, 2), t).flatten(1).numpy()
    np.testing.assert_allclose(v, v_mc, atol=0.02)


def test_gaussian_flow_transports_noise_to_the_fitted_gaussian():
    """The flow map of a Gaussian prior is affine, x1 = M x0 + c: push 0 and the basis vectors through
    Euler steps (no sampling error) and check that N(0, I) lands on N(mu, Sigma): c = mu, M M^T = Sigma."""
    mu, cov = random_gaussian(4, seed=3)
    prior = GaussianPrior(torch.tensor(mu).reshape(1, 2, 2), torch.tensor(cov))
    K = 2000
    x = torch.cat([torch.zeros(1, 4), torch.eye(4)]).double().reshape(5, 1, 2, 2)
    for k in range(K):
        x = x + prior.velocity(x, k / K) / K
    x = x.flatten(1).numpy()
    c, M = x[0], (x[1:] - x[0]).T
    np.testing.assert_allclose(c, mu, atol=1e-2)
    np.testing.assert_allclose(M @ M.T, cov, atol=2e-2)
    # and the sampler (Euler, same rule) draws from it
    s = prior.sample(20_000, nfe=200, generator=torch.Generator().manual_seed(0), dtype=torch.float64).flatten(1).numpy()
    assert prior.nfe == K + 200
    np.testing.assert_allclose(s.mean(0), mu, atol=0.05)
    np.testing.assert_allclose(np.cov(s, rowvar=False), cov, atol=0.2)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_gaussian_posterior_mean_equals_dense_precision_formula(gauss, name):
    """E[x1|y] = (Sigma^-1 + A^T A / s^2)^-1 (Sigma^-1 mu + A^T y / s^2): the information form, not the code's covariance form."""
    op = get_operator(name, (1, 8, 8))
    A = op.as_matrix().numpy()
    mu = gauss.mean.flatten().numpy()
    S = gauss.cov.numpy()
    s2 = op.sigma_y**2
    before = gauss.nfe
    x = gauss.sample_clean(6, torch.Generator().manual_seed(1), dtype=torch.float64)
    y = op.measure(x, torch.Generator().manual_seed(2))
    P = np.linalg.inv(S) + A.T @ A / s2
    want = np.linalg.solve(P, (np.linalg.solve(S, mu)[:, None] + A.T @ y.flatten(1).numpy().T / s2)).T
    got = gauss.posterior_mean(y, op)
    assert got.shape == x.shape and got.dtype == y.dtype
    np.testing.assert_allclose(got.flatten(1).numpy(), want, rtol=1e-7, atol=1e-7)
    # the posterior covariance matches the information form too
    np.testing.assert_allclose(gauss.posterior_covariance(op).numpy(), np.linalg.inv(P), rtol=1e-6, atol=1e-8)
    assert gauss.nfe == before  # the ceiling costs no network evaluation


def test_bayes_mse_equals_posterior_covariance_trace(gauss):
    """Over images drawn from the prior, the posterior mean's MSE equals tr(Cov[x1|y]) / d."""
    op = get_operator("inpaint_random", (1, 8, 8))
    x = gauss.sample_clean(4000, torch.Generator().manual_seed(0), dtype=torch.float64)
    y = op.measure(x, torch.Generator().manual_seed(1))
    mse = float(((gauss.posterior_mean(y, op) - x) ** 2).mean())
    assert mse == pytest.approx(float(torch.trace(gauss.posterior_covariance(op))) / 64, rel=0.03)


def test_empirical_prior_weights_and_denoiser_equal_brute_force_likelihood(digits):
    X = digits[:50].double()
    prior = EmpiricalPrior(X)
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    for t in (0.1, 0.5, 0.9):
        Xf, xf = X.flatten(1).numpy(), x.flatten(1).numpy()
        s = 1 - t
        # log N(x; t x_i, s^2 I) per atom, normalised
        logp = -((xf[:, None, :] - t * Xf[None]) ** 2).sum(-1) / (2 * s**2)
        w = np.exp(logp - logp.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
        np.testing.assert_allclose(prior.posterior_weights(x, t).numpy(), w, atol=1e-10)
        np.testing.assert_allclose(prior.clean_estimate(x, t).flatten(1).numpy(), w @ Xf, atol=1e-10)
        np.testing.assert_allclose(prior.velocity(x, t).flatten(1).numpy(), (w @ Xf - xf) / s, atol=1e-9)
    # at t = 1 the denoiser returns the atom itself; at t = 0 the mean of the set
    torch.testing.assert_close(prior.clean_estimate(X[:4], 1.0), X[:4])
    torch.testing.assert_close(prior.clean_estimate(x, 0.0), X.mean(0, keepdim=True).expand(3, -1, -1, -1))


def test_empirical_posterior_mean_equals_brute_force(digits):
    X = digits[:40].double()
    prior = EmpiricalPrior(X)
    op = get_operator("sr2", (1, 8, 8), sigma_y=0.3)
    y = op.measure(X[:3], torch.Generator().manual_seed(0))
    HX = op.H(X).flatten(1).numpy()
    yf = y.flatten(1).numpy()
    logp = -((yf[:, None] - HX[None]) ** 2).sum(-1) / (2 * 0.09)
    w = np.exp(logp - logp.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(prior.posterior_mean(y, op).flatten(1).numpy(), w @ X.flatten(1).numpy(), atol=1e-10)
    # noiseless: the matching atom exactly
    op0 = get_operator("denoise", (1, 8, 8), sigma_y=0.0)
    torch.testing.assert_close(prior.posterior_mean(X[5:7], op0), X[5:7])


def test_nfe_counting():
    mu, cov = random_gaussian(4)
    prior = GaussianPrior(torch.tensor(mu).reshape(1, 2, 2), torch.tensor(cov))
    x = torch.randn(7, 1, 2, 2)
    prior.velocity(x, 0.5)
    prior.clean_estimate(x, torch.full((7,), 0.2))
    prior.denoiser(x, torch.tensor(0.9))
    assert prior.nfe == 3  # one per batched call, whatever the batch size
    prior.sample(3, nfe=11)
    assert prior.nfe == 14
    prior.reset_nfe()
    assert prior.nfe == 0
    assert isinstance(prior, FlowPrior)


def test_float32_in_float32_out_and_per_sample_times(gauss):
    x = torch.randn(3, 1, 8, 8)
    t = torch.tensor([0.1, 0.5, 0.9])
    v = gauss.velocity(x, t)
    assert v.dtype == torch.float32 and v.shape == x.shape
    for i in range(3):
        torch.testing.assert_close(v[i : i + 1], gauss.velocity(x[i : i + 1], float(t[i])))


def test_learned_prior_wraps_any_module():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Conv2d(1, 1, 3, padding=1)

        def forward(self, x, t):
            return self.lin(x) * t[:, None, None, None]

    net = Net()
    prior = LearnedPrior(net, (1, 4, 4), time_scale=1000.0)
    x = torch.randn(2, 1, 4, 4)
    v = prior.velocity(x, 0.25)
    torch.testing.assert_close(v, net.lin(x) * 250.0)
    x.requires_grad_(True)
    prior.clean_estimate(x, 0.5).sum().backward()  # gradients flow (OT-ODE, D-Flow need them)
    assert x.grad is not None and prior.nfe == 2

    class Out:  # diffusers-style output object
        def __init__(self, sample):
            self.sample = sample

    p2 = LearnedPrior(lambda x, t: Out(x * 2), (1, 4, 4))
    torch.testing.assert_close(p2.velocity(x.detach(), 0.1), x.detach() * 2)
    p3 = LearnedPrior(lambda x, t: x[:, :, :2], (1, 4, 4))
    with pytest.raises(PriorError, match="network returned"):
        p3.velocity(x.detach(), 0.1)


def test_prior_errors(gauss, digits):
    with pytest.raises(PriorError, match=r"GaussianPrior\.velocity: expected x of shape \(B, 1, 8, 8\), got \(1, 8, 8\)"):
        gauss.velocity(torch.zeros(1, 8, 8), 0.5)
    with pytest.raises(PriorError, match=r"t must lie in \[0, 1\]"):
        gauss.velocity(torch.zeros(1, 1, 8, 8), 1.5)
    with pytest.raises(PriorError, match=r"tensor of shape \(3,\), got \(2,\)"):
        gauss.velocity(torch.zeros(3, 1, 8, 8), torch.tensor([0.1, 0.2]))
    with pytest.raises(PriorError, match="N >= 2"):
        GaussianPrior.fit(digits[:1])
    with pytest.raises(PriorError, match="positive definite"):
        GaussianPrior(torch.zeros(1, 1, 2), torch.zeros(2, 2))
    with pytest.raises(PriorError, match="symmetric"):
        GaussianPrior(torch.zeros(1, 1, 2), torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(PriorError, match="operator acts on images"):
        gauss.posterior_mean(torch.zeros(1, 1, 4, 4), get_operator("denoise", (1, 4, 4)))
    with pytest.raises(PriorError, match="images must be a tensor"):
        EmpiricalPrior(torch.zeros(8, 8))


def test_tuning_key_is_declared_on_every_prior(gauss):
    """Issue #22: ``tuning_key`` is a FlowPrior attribute (None unless a kind was tuned for it), not bolted on."""
    from lab.generative import tuning

    assert FlowPrior.tuning_key is None and gauss.tuning_key is None and "tuning_key" in vars(gauss)
    assert EmpiricalPrior(torch.zeros(3, 1, 2, 2)).tuning_key is None
    assert LearnedPrior(nn.Conv2d(1, 1, 1), (1, 2, 2)).tuning_key is None
    assert FlowPrior((1, 2, 2), tuning_key="gaussian-digits").tuning_key == "gaussian-digits"
    assert tuning.make_prior("gaussian-digits").tuning_key == "gaussian-digits"
    for bad in ("", 3):
        with pytest.raises(PriorError, match="tuning_key must be a non-empty str"):
            FlowPrior((1, 2, 2), tuning_key=bad)
