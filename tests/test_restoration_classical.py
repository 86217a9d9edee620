"""The floor methods of the restoration tables (lab.generative.restore.classical): ``naive`` is the input
(or its pseudo-inverse for super-resolution), ``tikhonov`` equals a dense solve of the normal equations."""

from __future__ import annotations

import pytest
import torch

from lab.generative.errors import MethodError
from lab.generative.operators import get_operator
from lab.generative.priors import GaussianPrior
from lab.generative.restore import restore

TASKS = ["denoise", "deblur", "sr2", "inpaint_random", "inpaint_box"]
SHAPE = (1, 6, 6)  # small enough for a dense 36 x 36 solve


@pytest.fixture(scope="module")
def prior():
    g = torch.Generator().manual_seed(0)
    return GaussianPrior.fit(torch.rand(80, *SHAPE, generator=g, dtype=torch.float64) * 2 - 1, ridge=1e-2)


def _y(op, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(3, *SHAPE, generator=g, dtype=torch.float64) * 2 - 1
    return op.measure(x, g)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("lam", [1e-3, 0.3])
def test_tikhonov_equals_a_dense_solve_of_the_normal_equations(task, lam, prior):
    op = get_operator(task, SHAPE)
    y = _y(op)
    A = op.as_matrix(torch.float64)  # (m, n), built column by column from H itself
    n = A.shape[1]
    dense = torch.linalg.solve(A.T @ A + lam * torch.eye(n, dtype=torch.float64), A.T @ y.reshape(3, -1).T).T
    out = restore("tikhonov", y, op, prior, nfe=7, lam=lam)
    assert out.nfe == 0 and out.hyper == {"lam": lam}
    torch.testing.assert_close(out.x.reshape(3, -1), dense, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("task", ["denoise", "deblur", "inpaint_random", "inpaint_box"])
def test_naive_is_the_input_where_it_is_image_shaped(task, prior):
    op = get_operator(task, SHAPE)
    y = _y(op)
    out = restore("naive", y, op, prior, nfe=5)
    assert out.nfe == 0 and out.hyper == {}
    assert torch.equal(out.x, y) and out.x.data_ptr() != y.data_ptr()  # a copy: the caller's y is not aliased


def test_naive_super_resolution_is_block_replication(prior):
    op = get_operator("sr2", SHAPE)
    y = _y(op)
    out = restore("naive", y, op, prior, nfe=5)
    torch.testing.assert_close(out.x, y.repeat_interleave(2, -2).repeat_interleave(2, -1), atol=1e-12, rtol=0)
    torch.testing.assert_close(op.H(out.x), y, atol=1e-12, rtol=0)  # the pseudo-inverse reproduces y


def test_tikhonov_refuses_a_non_positive_weight(prior):
    op = get_operator("denoise", SHAPE)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(MethodError, match="tikhonov: lam must be > 0"):
            restore("tikhonov", _y(op), op, prior, nfe=1, lam=bad)
