"""GPTQ's factorisations done in the Hessian's own memory (quant.gptq_rows): numpy's Cholesky and inverse always
copy, and at K = 8192 (a 1B model's down_proj) each K x K float64 copy is 0.5 GB
(docs/decisions/export-memory.md, addendum 2026-12-07)."""

from __future__ import annotations

import numpy as np

# Rows or columns a step of the in-place factorisations works on at a time: their temporaries are this many
# rows of the matrix (16 MB at K = 8192), never a K x K copy
FACTOR_BLOCK = 256


def permute_in_place(a: np.ndarray, order: np.ndarray) -> None:
    """a := a[order][:, order] without a copy of `a`: each block of rows gathers its columns, then the rows
    move along the cycles of `order` with one row held aside."""
    n = a.shape[0]
    if np.array_equal(order, np.arange(n)):
        return
    for r in range(0, n, FACTOR_BLOCK):
        a[r : r + FACTOR_BLOCK] = a[r : r + FACTOR_BLOCK][:, order]
    placed = np.zeros(n, bool)
    for start in range(n):
        if placed[start] or order[start] == start:
            continue
        held, i = a[start].copy(), start
        while True:  # row i takes row order[i]; the cycle closes on the held row
            placed[i], j = True, order[i]
            if j == start:
                a[i] = held
                break
            a[i] = a[j]
            i = j


def inverse_cholesky_upper(reversed_h: np.ndarray) -> np.ndarray:
    """U upper triangular with U^T U = h^-1 (GPTQ's `Hinv`), without forming h^-1, from `reversed_h` = J h J
    (J the reversal of rows and columns): cholesky(J h J) = L gives h = V V^T for the upper triangular
    V = J L J, so h^-1 = V^-T V^-1 and U = V^-1 = J L^-1 J. A Cholesky and a triangular inverse (a general
    inverse and a second Cholesky did about three times the arithmetic), both done in `reversed_h`'s memory,
    which this consumes: U is returned as a reversed view of it. numpy's Cholesky and inverse always copy."""
    cholesky_in_place(reversed_h)
    invert_lower_in_place(reversed_h)
    return reversed_h[::-1, ::-1]


def cholesky_in_place(a: np.ndarray) -> None:
    """a (symmetric positive definite, C order) := its lower Cholesky factor L, zeros above: left-looking by
    blocks of FACTOR_BLOCK columns, each updated by one product with the columns before it, its diagonal
    block factorised by LAPACK, the rows below solved against it. Raises np.linalg.LinAlgError as
    np.linalg.cholesky does."""
    n = a.shape[0]
    for j in range(0, n, FACTOR_BLOCK):
        e = min(j + FACTOR_BLOCK, n)
        if j:
            a[j:, j:e] -= a[j:, :j] @ a[j:e, :j].T
        low = np.linalg.cholesky(a[j:e, j:e])
        a[j:e, j:e] = low
        a[j:e, e:] = 0.0
        if e < n:  # X L^T = B: X^T = L^-1 B^T, a block of rows at a time
            for r in range(e, n, FACTOR_BLOCK):
                rows = slice(r, min(r + FACTOR_BLOCK, n))
                a[rows, j:e] = np.linalg.solve(low, a[rows, j:e].T).T


def invert_lower_in_place(low: np.ndarray) -> None:
    """low (lower triangular, zeros above) := its inverse, by halves ([[A, 0], [B, C]]^-1 =
    [[A^-1, 0], [-C^-1 B A^-1, C^-1]]), B's products a block of rows or columns at a time: numpy has no
    triangular inverse, and its general one copies."""
    n = low.shape[0]
    if n <= FACTOR_BLOCK:
        low[:] = np.tril(np.linalg.inv(low))  # LAPACK's inverse of a triangular block: triangular up to rounding
        return
    h = n // 2
    invert_lower_in_place(low[:h, :h])
    invert_lower_in_place(low[h:, h:])
    b, a_inv, c_inv = low[h:, :h], low[:h, :h], low[h:, h:]
    for r in range(0, n - h, FACTOR_BLOCK):
        b[r : r + FACTOR_BLOCK] = b[r : r + FACTOR_BLOCK] @ a_inv
    for c in range(0, h, FACTOR_BLOCK):
        b[:, c : c + FACTOR_BLOCK] = -(c_inv @ b[:, c : c + FACTOR_BLOCK])
