"""A plain K-quant writer for tests (gguf-py quantizes Q4_0..Q8_0 but raises NotImplementedError for the K-quants):
round-to-nearest Q4_K / Q5_K / Q6_K blocks of a float matrix, in llama.cpp's bit layout, so a tiny checkpoint can be
written as a K-quant GGUF whose weights are close to the checkpoint's. Not llama.cpp's search for the best scales:
the tests need the layout, and weights near enough that the model's output is not noise."""

from __future__ import annotations

import numpy as np

_MAX = {"Q4_K": 15, "Q5_K": 31}


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def _q45_k(w: np.ndarray, name: str) -> np.ndarray:
    """[n, 256] -> [n, 144 or 176] bytes: 8 sub-blocks of 32, w ~ d*sc*q - dmin*m with 6-bit sc, m."""
    n, top = w.shape[0], _MAX[name]
    sub = w.reshape(n, 8, 32).astype(np.float32)
    lo = np.minimum(sub.min(-1), 0)  # the minimum's share is subtracted: m >= 0
    scale = (sub.max(-1) - lo) / top
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = (-lo.min(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(np.divide(scale, d[:, None], out=np.zeros_like(scale), where=d[:, None] > 0)), 0, 63)
    m = np.clip(np.rint(np.divide(-lo, dmin[:, None], out=np.zeros_like(lo), where=dmin[:, None] > 0)), 0, 63)
    step = (d[:, None] * sc)[:, :, None]
    q = np.divide(sub + (dmin[:, None] * m)[:, :, None], step, out=np.zeros_like(sub), where=step > 0)
    q = np.clip(np.rint(q), 0, top).astype(np.uint8).reshape(n, 256)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    scales = np.concatenate(
        [(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6), (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
         (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4)], axis=1,
    )  # fmt: skip
    chunks = q.reshape(n, 4, 2, 32)  # per 64: low nibbles its first 32, high its second
    qs = ((chunks[:, :, 0] & 0xF) | ((chunks[:, :, 1] & 0xF) << 4)).reshape(n, 128)
    parts = [_f16(d).reshape(n, 2), _f16(dmin).reshape(n, 2), scales]
    if name == "Q5_K":  # bit j of byte l: the high bit of element 32 j + l
        high = (q.reshape(n, 8, 32) >> 4) & 1
        parts.append((high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8))
    return np.concatenate([*parts, qs], axis=1)


def _q6_k(w: np.ndarray) -> np.ndarray:
    """[n, 256] -> [n, 210] bytes: 16 sub-blocks of 16, w ~ d*s6*(q - 32), s6 int8."""
    n = w.shape[0]
    sub = w.reshape(n, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    s6 = np.clip(np.rint(np.divide(scale, d[:, None], out=np.zeros_like(scale), where=d[:, None] > 0)), -128, 127)
    step = (d[:, None] * s6)[:, :, None]
    q = np.divide(sub, step, out=np.zeros_like(sub), where=step != 0)
    q = (np.clip(np.rint(q), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)  # half, chunk c, l
    qh = sum(((q[:, :, c] >> 4) & 3) << (2 * c) for c in range(4)).astype(np.uint8)
    # ql's 64 bytes a half: [chunk 0 | chunk 2 << 4] for l < 32, then [chunk 1 | chunk 3 << 4]
    low = q & 0xF
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], 2)
    return np.concatenate(
        [ql.reshape(n, 128), qh.reshape(n, 64), s6.astype(np.int8).view(np.uint8), _f16(d).reshape(n, 2)], axis=1
    )


def quantize_k(w: np.ndarray, name: str) -> np.ndarray:
    """A float matrix [out, in] (in a multiple of 256) as `name` blocks, uint8 [out, in / 256 * bytes]."""
    out = w.shape[0]
    blocks = w.reshape(-1, 256)
    raw = _q6_k(blocks) if name == "Q6_K" else _q45_k(blocks, name)
    return np.ascontiguousarray(raw.reshape(out, -1))
