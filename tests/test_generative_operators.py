"""Degradation operators (lab.generative.operators): adjoints, closed-form solves, noise, errors.

Dense matrices here are built independently of the operators' code (loops over pixels), then the
operators are compared with them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lab import LabError
from lab.generative.errors import GenerativeError, OperatorError
from lab.generative.operators import (
    OPERATORS,
    BoxInpainting,
    GaussianDeblur,
    RandomInpainting,
    SuperResolution,
    get_operator,
)

SHAPES = [(1, 8, 8), (3, 8, 8)]
NAMES = sorted(OPERATORS)


def dense_matrix(op) -> np.ndarray:
    """H as an (m, n) float64 matrix, built from the operator's *parameters* only (not its code)."""
    c, h, w = op.shape
    n = c * h * w
    idx = np.arange(n).reshape(c, h, w)
    if op.name == "denoise":
        return np.eye(n)
    if op.name.startswith("sr"):
        f = op.factor
        A = np.zeros((c * (h // f) * (w // f), n))
        out = np.arange(A.shape[0]).reshape(c, h // f, w // f)
        for ch in range(c):
            for i in range(h):
                for j in range(w):
                    A[out[ch, i // f, j // f], idx[ch, i, j]] = 1.0 / f**2
        return A
    if op.name.startswith("inpaint"):
        m = op.mask.numpy()[0]
        return np.diag(np.concatenate([m.ravel()] * c))
    if op.name == "deblur":
        ks = op.kernel_size
        r = np.arange(ks) - ks // 2
        g = np.exp(-(r**2) / (2 * op.sigma_blur**2))
        k = np.outer(g, g)
        k /= k.sum()
        A = np.zeros((n, n))
        for ch in range(c):
            for i in range(h):
                for j in range(w):
                    for u in range(ks):
                        for v in range(ks):  # y[i, j] = sum_{u,v} k[u, v] x[i - (u - c0), j - (v - c0)] (circular)
                            A[idx[ch, i, j], idx[ch, (i - (u - ks // 2)) % h, (j - (v - ks // 2)) % w]] += k[u, v]
        return A
    raise AssertionError(op.name)


def make(name, shape, **kw):
    return get_operator(name, shape, **kw)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_adjointness(name, shape):
    op = make(name, shape)
    g = torch.Generator().manual_seed(0)
    x = torch.randn((4, *op.shape), generator=g, dtype=torch.float64)
    y = torch.randn((4, *op.measurement_shape), generator=g, dtype=torch.float64)
    lhs = (op.H(x) * y).sum()
    rhs = (x * op.H_adjoint(y)).sum()
    assert abs(float(lhs - rhs)) <= 1e-12 * max(1.0, abs(float(lhs)))
    # float32 as well (the models' dtype)
    lhs32 = (op.H(x.float()) * y.float()).sum()
    rhs32 = (x.float() * op.H_adjoint(y.float())).sum()
    assert abs(float(lhs32 - rhs32)) <= 1e-4 * max(1.0, abs(float(lhs32)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_matches_independent_dense_matrix(name, shape):
    op = make(name, shape)
    A = dense_matrix(op)
    np.testing.assert_allclose(op.as_matrix().numpy(), A, atol=1e-12)
    x = torch.randn((2, *op.shape), dtype=torch.float64)
    np.testing.assert_allclose(op.H(x).flatten(1).numpy(), x.flatten(1).numpy() @ A.T, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.3, 1e-3, 0.04])
@pytest.mark.parametrize("name", NAMES)
def test_solve_HHt_plus_against_dense_inverse(name, gamma):
    op = make(name, (1, 8, 8))
    A = dense_matrix(op)
    v = torch.randn((3, *op.measurement_shape), dtype=torch.float64)
    got = op.solve_HHt_plus(v, gamma).flatten(1).numpy()
    want = np.linalg.solve(A @ A.T + gamma * np.eye(A.shape[0]), v.flatten(1).numpy().T).T
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_solve_per_image_gamma_and_zero_gamma_pseudo_inverse():
    op = make("inpaint_random", (1, 8, 8))
    A = dense_matrix(op)
    v = op.H(torch.randn((2, 1, 8, 8), dtype=torch.float64))  # in the range of H
    got = op.solve_HHt_plus(v, 0.0).flatten(1).numpy()
    want = (np.linalg.pinv(A @ A.T) @ v.flatten(1).numpy().T).T
    np.testing.assert_allclose(got, want, atol=1e-12)
    sr = make("sr2", (1, 8, 8))
    w = torch.randn((2, *sr.measurement_shape), dtype=torch.float64)
    gam = torch.tensor([0.1, 2.0], dtype=torch.float64)
    both = sr.solve_HHt_plus(w, gam)
    for i in range(2):
        np.testing.assert_allclose(both[i : i + 1].numpy(), sr.solve_HHt_plus(w[i : i + 1], float(gam[i])).numpy())


def test_lipschitz_is_largest_eigenvalue_of_HtH():
    for name in NAMES:
        op = make(name, (1, 8, 8))
        A = dense_matrix(op)
        assert op.lipschitz == pytest.approx(np.linalg.eigvalsh(A.T @ A).max(), rel=1e-9)


def test_measurement_shapes_and_names():
    assert make("sr2", (3, 8, 8)).measurement_shape == (3, 4, 4)
    assert make("sr4", (1, 8, 8)).measurement_shape == (1, 2, 2)
    assert make("deblur", (1, 16, 16)).measurement_shape == (1, 16, 16)
    assert make("denoise", (2, 1, 8, 8)).shape == (1, 8, 8)  # a batch size is ignored
    for name in NAMES:
        assert make(name, (1, 8, 8)).name == name


def test_default_noise_levels_follow_rebridge_protocol():
    assert make("denoise", (1, 8, 8)).sigma_y == 0.2
    assert make("deblur", (1, 8, 8)).sigma_y == 0.05
    for name in ("sr2", "sr4", "inpaint_random", "inpaint_box"):
        assert make(name, (1, 8, 8)).sigma_y == 0.01
    assert make("denoise", (1, 8, 8), sigma_y=0.0).sigma_y == 0.0


def test_random_mask_is_seeded_shared_across_channels_and_removes_p():
    op = RandomInpainting((3, 32, 32), p=0.7, seed=5)
    m = op.mask
    assert m.shape == (1, 32, 32)
    assert torch.equal(m, RandomInpainting((3, 32, 32), seed=5).mask)
    assert not torch.equal(m, RandomInpainting((3, 32, 32), seed=6).mask)
    assert abs(1 - float(m.mean()) - 0.7) < 0.06
    x = torch.randn(2, 3, 32, 32)
    y = op.H(x)
    assert torch.equal(y == 0, (m == 0).expand(2, 3, 32, 32) | (x == 0))
    assert op.observed_count == int(m.sum()) * 3


def test_box_mask_centred_and_placed():
    op = BoxInpainting((1, 16, 16), size=6)
    m = op.mask[0]
    assert op.box == (5, 5, 6, 6)
    assert float(m[5:11, 5:11].sum()) == 0 and float(m.sum()) == 256 - 36
    op2 = BoxInpainting((1, 16, 16), size=(2, 3), top_left=(0, 1))
    assert float(op2.mask[0, 0:2, 1:4].sum()) == 0
    assert BoxInpainting((1, 128, 128)).box[2:] == (40, 40)  # ReBridge-Flow's CelebA box


def test_measure_is_seeded_and_noise_only_where_observed():
    x = torch.zeros(64, 1, 16, 16)
    for name in NAMES:
        op = make(name, (1, 16, 16), sigma_y=0.1)
        y1 = op.measure(x, torch.Generator().manual_seed(3))
        y2 = op.measure(x, torch.Generator().manual_seed(3))
        assert torch.equal(y1, y2)
        if name.startswith("inpaint"):
            assert float(y1[:, op.mask == 0].abs().max()) == 0.0
            obs = y1[:, op.mask == 1]
        else:
            obs = y1
        assert abs(float(obs.std()) - 0.1) < 0.01
    op = make("denoise", (1, 16, 16), sigma_y=0.0)
    assert torch.equal(op.measure(x + 0.5), x + 0.5)


def test_blur_default_kernel_fits_and_psf_sums_to_one():
    op = GaussianDeblur((1, 8, 8))
    assert op.kernel_size == 7  # 2*ceil(4*1)+1 = 9 capped at the largest odd size <= 8
    assert GaussianDeblur((1, 64, 64)).kernel_size == 9
    x = torch.ones(1, 1, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(op.H(x), x)  # normalised kernel keeps constants


def test_shape_errors_name_operator_and_expected_shape():
    op = make("sr2", (1, 8, 8))
    with pytest.raises(OperatorError, match=r"SuperResolution\.H: expected x of shape \(B, 1, 8, 8\), got \(1, 8, 8\)"):
        op.H(torch.zeros(1, 8, 8))
    with pytest.raises(OperatorError, match=r"SuperResolution\.H_adjoint: expected y of shape \(B, 1, 4, 4\)"):
        op.H_adjoint(torch.zeros(1, 1, 8, 8))
    with pytest.raises(OperatorError, match=r"solve_HHt_plus: expected v of shape"):
        op.solve_HHt_plus(torch.zeros(1, 1, 8, 8), 0.1)
    with pytest.raises(OperatorError, match="gamma"):
        op.solve_HHt_plus(torch.zeros(1, 1, 4, 4), -1.0)
    with pytest.raises(OperatorError, match="floating-point"):
        make("denoise", (1, 8, 8)).H(torch.zeros(1, 1, 8, 8, dtype=torch.long))


def test_construction_errors():
    with pytest.raises(OperatorError, match="unknown operator 'blur'.*denoise, deblur"):
        get_operator("blur", (1, 8, 8))
    with pytest.raises(OperatorError, match="'deblur'.*unexpected keyword"):
        get_operator("deblur", (1, 8, 8), factor=2)
    with pytest.raises(OperatorError, match="not divisible by factor 4"):
        SuperResolution((1, 10, 10), factor=4)
    with pytest.raises(OperatorError, match="kernel_size 9 exceeds the image"):
        GaussianDeblur((1, 8, 8), kernel_size=9)
    with pytest.raises(OperatorError, match="odd"):
        GaussianDeblur((1, 8, 8), kernel_size=4)
    with pytest.raises(OperatorError, match="p .fraction removed."):
        RandomInpainting((1, 8, 8), p=1.0)
    with pytest.raises(OperatorError, match="does not fit"):
        BoxInpainting((1, 8, 8), size=9)
    with pytest.raises(OperatorError, match="sigma_y"):
        get_operator("denoise", (1, 8, 8), sigma_y=-0.1)
    with pytest.raises(OperatorError, match=r"shape must be \(C, H, W\)"):
        get_operator("denoise", (8, 8))
    # one hierarchy: OperatorError is a GenerativeError, a LabError and a ValueError
    assert issubclass(OperatorError, GenerativeError) and issubclass(OperatorError, LabError)
    assert issubclass(OperatorError, ValueError)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_cpu(name):  # pragma: no cover - only where a GPU is present
    op = make(name, (3, 16, 16))
    x = torch.randn(2, 3, 16, 16)
    y = op.measure(x, torch.Generator().manual_seed(0))
    yc = op.measure(x.cuda(), torch.Generator().manual_seed(0))
    assert yc.is_cuda
    torch.testing.assert_close(yc.cpu(), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(op.solve_HHt_plus(yc, 0.1).cpu(), op.solve_HHt_plus(y, 0.1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(op.H_adjoint(yc).cpu(), op.H_adjoint(y), atol=1e-5, rtol=1e-5)
