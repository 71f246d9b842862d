"""GPTQ's Hessian factorised in place (exporters/hessian.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_runtime.exporters.hessian import FACTOR_BLOCK, inverse_cholesky_upper, permute_in_place


def test_gptq_factorises_its_hessian_where_it_lies():
    """GPTQ's chol(H^-1) (upper) is made in the Hessian's own memory: its result is a view of it, equals
    the inverse's factor, and a matrix that is not positive definite is refused as numpy's Cholesky does."""
    rng = np.random.default_rng(3)
    for k in (5, FACTOR_BLOCK, 2 * FACTOR_BLOCK + 37):
        x = rng.standard_normal((k + 20, k))
        h = x.T @ x + 0.1 * np.eye(k)
        order = rng.permutation(k)
        work = h.copy()
        permute_in_place(work, order)
        np.testing.assert_array_equal(work, h[np.ix_(order, order)])
        hp = work.copy()
        reversed_h = np.ascontiguousarray(hp[::-1, ::-1])
        u = inverse_cholesky_upper(reversed_h)
        assert np.shares_memory(u, reversed_h)
        assert not np.tril(u, -1).any()
        np.testing.assert_allclose(u, np.linalg.cholesky(np.linalg.inv(hp)).T, rtol=1e-8, atol=1e-10)
    bad = np.eye(FACTOR_BLOCK + 3)
    bad[-1, -1] = -1.0
    with pytest.raises(np.linalg.LinAlgError):
        inverse_cholesky_upper(bad)
