"""Matrices held without their float values: an embedding table or LM head read from the
checkpoint (a 128k-vocabulary table of an 8B model is 2.1 GB as float32, and a quantized export only
ever reads one a block of rows at a time), and a quantized model's matrices (quant.QuantizedTable: the
graph builder needs their integer form, only the reference their values).

    t = StoredTable(read_rows, shape)   # rows widened from the checkpoint file as they are asked for
    t[ids], t[r0:r1]                    # float32 rows
    t @ x, t.astype(...)                # TypeError; np.asarray(t) is all NaN

A `RowTable` is an ndarray of the table's shape and dtype over no bytes (one broadcast NaN), so code that
reads only shapes, sizes and identities (the graph builder, parameter counts, `lm_head is embed`) takes
it as it takes the float table; reading its values goes through `rows` (also `t[...]` with a row
selection), and other uses raise. `np.asarray` gives a subclass no hook to refuse, so the one value is
NaN: a use that slips past the refusals poisons what it computes (validation reports it) instead of
computing with zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

RowSelection = slice | np.ndarray
# Rows a pass over a whole table reads at once: 16 MB of float32, whatever the table's width
PART_ELEMENTS = 1 << 22


class RowTable(np.ndarray):
    """A [rows, in] float32 matrix whose values are read a selection of rows at a time (`rows`)."""

    def __new__(cls, shape: tuple[int, int]) -> RowTable:
        return np.broadcast_to(np.full((), np.nan, np.float32), shape).view(cls)

    def rows(self, sel: RowSelection) -> np.ndarray:
        """float32 [n, in] of the selected rows (a slice, or integer indices)."""
        raise NotImplementedError

    def parts(self) -> Iterator[tuple[slice, np.ndarray]]:
        """(rows, their float32 values) over the whole table, PART_ELEMENTS at a time."""
        n, k = self.shape
        step = max(1, PART_ELEMENTS // max(k, 1))
        for r in range(0, n, step):
            sel = slice(r, min(r + step, n))
            yield sel, self.rows(sel)

    def __getitem__(self, sel: object) -> np.ndarray:
        if isinstance(sel, slice) and sel.step in (None, 1):
            return self.rows(slice(*sel.indices(self.shape[0])[:2]))
        if isinstance(sel, (int, np.integer)):
            return self.rows(np.asarray([sel]))[0]
        if isinstance(sel, (list, np.ndarray)):
            ids = np.asarray(sel)
            if ids.dtype.kind in "iu":
                flat = ids.reshape(-1)
                return self.rows(flat).reshape(*ids.shape, self.shape[1])
        raise TypeError(f"a {type(self).__name__} reads whole rows (a slice or integer indices), not {sel!r}")

    def _refuse(self, *_args: object, **_kwargs: object):
        raise TypeError(f"a {type(self).__name__} holds no float values: read its rows (t[ids], t.rows, t.parts)")

    __array_ufunc__ = _refuse
    __array_function__ = _refuse
    __array__ = _refuse
    astype = _refuse
    tobytes = _refuse


class StoredTable(RowTable):
    """A float table read from its checkpoint file a block of rows at a time, widened to float32 as read."""

    _read: Callable[[RowSelection], np.ndarray] | None

    def __new__(cls, read: Callable[[RowSelection], np.ndarray], shape: tuple[int, int]) -> StoredTable:
        obj = super().__new__(cls, shape)
        obj._read = read
        return obj

    def __array_finalize__(self, obj: object) -> None:
        self._read = None  # a view numpy made (`.T`, a reshape) is not this table's rows; __new__ sets its own

    def rows(self, sel: RowSelection) -> np.ndarray:
        if self._read is None:
            raise TypeError("a view of a StoredTable holds no rows")
        return self._read(sel)
