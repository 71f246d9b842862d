"""Can GroupQueryAttention serve the ring until it first wraps? A feasibility probe.

    python scripts/gqa_if_probe.py [--heads 9] [--kv-heads 3] [--head-dim 64] [--capacity 256]

scripts/profile_ops.py shows our `ort` graph's attention core (RotaryEmbedding x2, TensorScatter x2,
Attention, the sink `If`) costing more per layer than onnxruntime-genai's one GroupQueryAttention. GQA
cannot run a wrapped ring, but until the first wrap the cache is an ordinary linear one. This probe
checks the three things a "GQA until the wrap, general path after" graph needs from ONNX Runtime, with
GQA inside an `If` whose other branch would hold the general path:
  1. the K/V buffers bound as both past_* and present_* (heads-first, [1, Hkv, C, D]) are updated in
     place through the `If`, rows outside the new tokens untouched;
  2. a multi-token chunk appended after existing rows (chunked prefill) matches a numpy reference:
     causal attention over rows [0, past + n), RoPE (non-interleaved halves) at the row positions;
  3. what the `If` costs per call, against GQA alone.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def build(h: int, kv: int, d: int, c: int, with_if: bool) -> bytes:
    def gqa(tag: str) -> tuple[helper.NodeProto, list[str]]:
        outs = [f"{tag}_out", f"{tag}_k", f"{tag}_v"]
        ins = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_len", "cos", "sin"]
        node = helper.make_node("GroupQueryAttention", ins, outs, domain="com.microsoft", name=tag,
                                num_heads=h, kv_num_heads=kv, do_rotary=1)  # fmt: skip
        return node, outs

    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("qkv", f, [1, "n", (h + 2 * kv) * d]),
        helper.make_tensor_value_info("past_key", f, [1, kv, c, d]),
        helper.make_tensor_value_info("past_value", f, [1, kv, c, d]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total_len", TensorProto.INT32, []),
        helper.make_tensor_value_info("cos", f, [c, d // 2]),
        helper.make_tensor_value_info("sin", f, [c, d // 2]),
        helper.make_tensor_value_info("wrapped", TensorProto.BOOL, []),
    ]
    names = ["out", "present_key", "present_value"]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in names]
    if with_if:
        branches = {}
        for tag in ("then", "else"):  # both GQA here: the probe is about the If, not the general path
            node, outs = gqa(tag)
            results = [helper.make_tensor_value_info(o, f, None) for o in outs]
            branches[tag] = helper.make_graph([node], tag, [], results)
        nodes = [helper.make_node("If", ["wrapped"], names, then_branch=branches["then"], else_branch=branches["else"])]
    else:
        node, _ = gqa("gqa")
        node.output[:] = names
        nodes = [node]
    model = helper.make_model(
        helper.make_graph(nodes, "probe", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    return model.SerializeToString()


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [n, heads, d] at rows whose cos/sin are [n, d/2]; non-interleaved halves."""
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    c, s = cos[:, None], sin[:, None]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--capacity", type=int, default=256)
    a = ap.parse_args()
    h, kv, d, c = a.heads, a.kv_heads, a.head_dim, a.capacity
    rng = np.random.default_rng(0)
    angles = np.arange(c)[:, None] * (1e4 ** (-np.arange(d // 2) / (d // 2)))[None]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    times = {}
    for with_if in (False, True):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.log_severity_level = 3
        sess = ort.InferenceSession(build(h, kv, d, c, with_if), so, providers=["CPUExecutionProvider"])
        keys, values = np.zeros((1, kv, c, d), np.float32), np.zeros((1, kv, c, d), np.float32)
        k_ov, v_ov = ort.OrtValue.ortvalue_from_numpy(keys), ort.OrtValue.ortvalue_from_numpy(values)
        ref_k, ref_v, past = np.zeros((c, kv, d)), np.zeros((c, kv, d)), 0
        for n in (9, 4, 1):  # a prompt, a chunk after it, one decode token
            qkv = rng.standard_normal((1, n, (h + 2 * kv) * d)).astype(np.float32)
            out = np.empty((1, n, h * d), np.float32)
            io = sess.io_binding()
            feeds = {"qkv": qkv, "seqlens_k": np.array([past + n - 1], np.int32), "cos": cos, "sin": sin,
                     "total_len": np.array(past + n, np.int32), "wrapped": np.array(False)}  # fmt: skip
            for name, arr in feeds.items():
                io.bind_cpu_input(name, arr)
            for name in ("past_key", "present_key"):
                (io.bind_ortvalue_input if name.startswith("past") else io.bind_ortvalue_output)(name, k_ov)
            for name in ("past_value", "present_value"):
                (io.bind_ortvalue_input if name.startswith("past") else io.bind_ortvalue_output)(name, v_ov)
            io.bind_ortvalue_output("out", ort.OrtValue.ortvalue_from_numpy(out))
            sess.run_with_iobinding(io)
            # numpy reference
            q = qkv[0, :, : h * d].reshape(n, h, d).astype(np.float64)
            k = qkv[0, :, h * d : (h + kv) * d].reshape(n, kv, d).astype(np.float64)
            v = qkv[0, :, (h + kv) * d :].reshape(n, kv, d).astype(np.float64)
            rows = slice(past, past + n)
            q, ref_k[rows], ref_v[rows] = rope(q, cos[rows], sin[rows]), rope(k, cos[rows], sin[rows]), v
            total = past + n
            kk, vv = np.repeat(ref_k[:total], h // kv, axis=1), np.repeat(ref_v[:total], h // kv, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(d)
            scores += np.where(np.arange(total)[None, :] > (past + np.arange(n))[:, None], -np.inf, 0.0)[None]
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            expected = np.einsum("hqk,khd->qhd", p, vv).reshape(n, h * d)
            in_place = np.allclose(keys[0].transpose(1, 0, 2)[:total], ref_k[:total], atol=1e-4)
            untouched = not keys[0, :, total:].any() and not values[0, :, total:].any()
            err = float(np.abs(out[0] - expected).max())
            label = "GQA inside If" if with_if else "GQA alone"
            print(f"{label}: {n} tokens after {past}: cache updated in place {in_place}, rows beyond untouched "
                  f"{untouched}, max |out - reference| {err:.2e}")  # fmt: skip
            past = total
        t = time.perf_counter()
        for _ in range(2000):
            sess.run_with_iobinding(io)
        times[with_if] = (time.perf_counter() - t) / 2000
    print(f"per call (1 token): GQA alone {times[False] * 1e6:.1f} us, inside If {times[True] * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
