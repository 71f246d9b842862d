"""What quantization and pruning read of one group of Linears' inputs X [n, K] over the calibration tokens.

Two forms of the same statistics:

- the Gram matrix X^T X (float64, K x K): GPTQ's Hessian, pruning's column norms and reconstruction,
  --mixed sensitivity's energies; exact, and what every input up to SAMPLE_ROWS wide keeps;
- a row sample (float32, SAMPLE_ROWS x K): every stride-th row after each sequence's first, with the
  first rows kept exactly. Where a consumer needs only ||X D^T||^2 for candidate weight errors D (AWQ's
  scale search, the manifest's output errors), inputs wider than the sample take it instead:
  the Llama-3.1-8B shape's down_proj input is 14,336 wide, so its Gram matrix is 1.6 GB and each AWQ
  candidate's loss costs 4096 x 14336^2 x 2 = 1.7 TFLOP; the sample is 117 MB and 0.24 TFLOP. Below that
  width the Gram matrix is both smaller and cheaper, so small models' statistics are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SAMPLE_ROWS = 2048
ERROR_BLOCK_ELEMENTS = 1 << 24  # output_error's float32 blocks of a sampled input's Linear
# X^T X is taken over this many rows at once (float32 products, summed into the float64 Gram matrix): one
# BLAS call over 4096 rows runs 2.3x faster than eight over 512 (a 1536-wide input, 2 x86 cores), and the
# buffer (4096 x K float32) is what it costs: 25 MB at K = 1536, 235 MB at an 8B model's 14,336.
GRAM_ROWS = 4096


@dataclass
class RowSample:
    """Every `stride`-th row of the calibration inputs after each sequence's first, and the first rows."""

    rows: np.ndarray  # [SAMPLE_ROWS or fewer, K] float32, filled in order
    firsts: list[np.ndarray]  # [K] float32 each: each sequence's first row, counted exactly
    stride: int
    taken: int = 0
    seen: int = 0  # rows after a first row seen so far

    @classmethod
    def empty(cls, k: int, later_rows: int) -> RowSample:
        """`later_rows`: how many rows after the first ones the calibration set has (sets the stride)."""
        stride = max(1, -(-later_rows // SAMPLE_ROWS))
        return cls(np.empty((-(-later_rows // stride), k), np.float32), [], stride)

    def add(self, x32: np.ndarray) -> None:
        self.firsts.append(x32[0].copy())
        rest = x32[1:]
        picked = rest[(-self.seen) % self.stride :: self.stride]  # global indices that are multiples of stride
        if self.taken + len(picked) > len(self.rows):  # more rows than the set declared: a caller bug
            raise ValueError(f"row sample of {len(self.rows)} rows is full: more calibration rows than declared")
        self.rows[self.taken : self.taken + len(picked)] = picked
        self.taken += len(picked)
        self.seen += len(rest)

    def squared_norm(self, d32: np.ndarray) -> float:
        """Estimate of the sum over all rows x of |x d^T|^2: the first rows exactly, the rest from the sample."""
        sampled = self.rows[: self.taken]
        rest = float(np.square(sampled @ d32.T, dtype=np.float64).sum()) * (self.seen / max(self.taken, 1))
        first = np.asarray(self.firsts, np.float32).reshape(-1, d32.shape[1])
        return rest + float(np.square(first @ d32.T, dtype=np.float64).sum())

    def divided(self, s: np.ndarray) -> RowSample:
        s32 = np.asarray(s, np.float32)
        return RowSample(
            self.rows[: self.taken] / s32, [f / s32 for f in self.firsts], self.stride, self.taken, self.seen
        )


@dataclass
class InputStats:
    """One group of Linears' input statistics, accumulated per forward so memory does not grow with the
    calibration length (the rows themselves are 0.4 MB a token on a 135M model): X^T X or a row sample
    (module docstring), and sum |X| (AWQ's salience). Rows wait in a GRAM_ROWS buffer until it is full
    (or `gram` is read), so X^T X is a few large products."""

    _gram: np.ndarray | None  # [K, K] float64; None where `sample` stands in for it
    abs_sum: np.ndarray  # [K] float64
    rows: int
    # The row of each sequence's first token (the attention sink), times sqrt(T - 1): its Gram matrix
    # counts that row once per later token of its sequence, since every query attends to the sink's key
    # and value and an error there reaches every position, where X^T X weighs it as 1 row of ~500.
    sinks: list[np.ndarray]  # [K] float64 each, one per sequence
    # sum X and sum of (T - 1) x_0 over sequences: the constant column of X^T X (with and without the
    # sink weighting), which pruning's reconstruction needs to refit a bias
    col_sum: np.ndarray  # [K] float64
    sink_sum: np.ndarray  # [K] float64
    sample: RowSample | None = None
    _pending: np.ndarray | None = None  # [GRAM_ROWS, K] float32, allocated on the first row
    _filled: int = 0

    @property
    def gram(self) -> np.ndarray | None:
        """X^T X over every row added so far."""
        self._flush()
        return self._gram

    def _flush(self) -> None:
        if self._filled:
            x = self._pending[: self._filled]
            self._gram += (x.T @ x).astype(np.float64)  # x.T @ x of one buffer: numpy's symmetric product
            self._filled = 0

    def _gather(self, x32: np.ndarray) -> None:
        if self._pending is None:
            self._pending = np.empty((GRAM_ROWS, x32.shape[1]), np.float32)
        done = 0
        while done < len(x32):
            take = min(len(x32) - done, GRAM_ROWS - self._filled)
            self._pending[self._filled : self._filled + take] = x32[done : done + take]
            self._filled, done = self._filled + take, done + take
            if self._filled == GRAM_ROWS:
                self._flush()

    def release(self) -> None:
        """X^T X complete, the row buffer freed (the statistics are read, no more rows come)."""
        self._flush()
        self._pending = None

    @classmethod
    def empty(cls, k: int, sample_rows: int | None = None) -> InputStats:
        """`sample_rows`: keep a row sample instead of X^T X when K > SAMPLE_ROWS, for a calibration set
        with this many rows after its sequences' first (None: always X^T X)."""
        sample = RowSample.empty(k, sample_rows) if sample_rows is not None and k > SAMPLE_ROWS else None
        gram = None if sample is not None else np.zeros((k, k))
        return cls(gram, np.zeros(k), 0, [], np.zeros(k), np.zeros(k), sample)

    def add(self, x: np.ndarray) -> None:
        """The rows of one sequence, first token first."""
        x32 = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        if self.sample is not None:
            self.sample.add(x32)
        else:  # float32 products of GRAM_ROWS rows, summed in float64: statistics, not the forward
            self._gather(x32)
        self.abs_sum += np.abs(x32).sum(axis=0, dtype=np.float64)
        self.rows += x32.shape[0]
        self.sinks.append(np.sqrt(x32.shape[0] - 1) * x32[0].astype(np.float64))
        self.col_sum += x32.sum(axis=0, dtype=np.float64)
        self.sink_sum += (x32.shape[0] - 1) * x32[0].astype(np.float64)

    def _full(self, what: str) -> np.ndarray:
        gram = self.gram
        if gram is None:  # a caller bug: the consumer should have asked for X^T X (calibrate.LayerInputStream)
            raise ValueError(f"{what} needs X^T X; these statistics keep a row sample of a wide input")
        return gram

    @property
    def sink_gram(self) -> np.ndarray:
        s = np.asarray(self.sinks).reshape(-1, self.abs_sum.shape[0])
        return s.T @ s

    def sink_weighted(self, weight: float) -> np.ndarray:
        """X^T X with each sequence's first row also counted `weight` times per later token (GPTQ's Hessian)."""
        gram = self._full("the sink-weighted Gram matrix")
        if not weight:
            return gram
        out = self.sink_gram  # a new K x K array, scaled and summed in place: one copy, not three
        out *= weight
        out += gram
        return out

    def squared_output(self, weight: float = 0.0) -> Callable[[np.ndarray], float]:
        """d [out, K] -> ||X d^T||^2 over the calibration rows, the sinks also counted `weight` times per
        later token: from X^T X (sum((d G) * d), K x K instead of n x K per call) or from the row sample."""
        if self.sample is None:
            g = self.sink_weighted(weight)
            return lambda d: float(((d @ g) * d).sum())
        sample, sinks = self.sample, np.asarray(self.sinks, np.float32).reshape(-1, self.abs_sum.shape[0])

        def estimate(d: np.ndarray) -> float:
            d32 = np.asarray(d, np.float32)
            extra = float(np.square(sinks @ d32.T, dtype=np.float64).sum()) if weight else 0.0
            return sample.squared_norm(d32) + weight * extra

        return estimate

    @property
    def mean_abs(self) -> np.ndarray:
        return self.abs_sum / max(self.rows, 1)

    @property
    def column_norms(self) -> np.ndarray:
        return np.sqrt(np.maximum(np.diag(self._full("column norms")), 0.0))

    def divided(self, s: np.ndarray) -> InputStats:
        """The statistics of X / s (s per input channel)."""
        s = np.asarray(s, dtype=np.float64)
        return InputStats(
            None if self.sample is not None else self.gram / np.outer(s, s),
            self.abs_sum / s,
            self.rows,
            [r / s for r in self.sinks],
            self.col_sum / s,
            self.sink_sum / s,
            None if self.sample is None else self.sample.divided(s),
        )

    def output_error(self, approx: np.ndarray, exact: np.ndarray) -> float:
        """||X approx^T - X exact^T||_F / ||X exact^T||_F on the calibration rows."""
        return relative(*self.output_energies(approx, exact))

    def output_energies(self, approx: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
        """(||X (approx - exact)^T||_F^2, ||X exact^T||_F^2) on the calibration rows: output_error's two
        halves, which --mixed sensitivity's scores reuse (quant_mixed.layer_scores)."""
        if self.sample is not None:  # float32, a block of output rows at a time (an 8B gate_proj: 235 MB a copy)
            norm, num, den = self.squared_output(), 0.0, 0.0
            step = max(1, ERROR_BLOCK_ELEMENTS // max(exact.shape[1], 1))
            for r in range(0, exact.shape[0], step):
                w = np.asarray(exact[r : r + step], np.float32)
                num += norm(np.asarray(approx[r : r + step], np.float32) - w)
                den += norm(w)
            return num, den
        w = np.asarray(exact, dtype=np.float64)
        d = np.asarray(approx, dtype=np.float64) - w
        norm = self.squared_output()
        return norm(d), norm(w)


def relative(num: float, den: float) -> float:
    """sqrt(num / den) of output_energies' pair: a relative output error (0 where the output is 0)."""
    return float(np.sqrt(max(num, 0.0) / den)) if den > 0 else 0.0
