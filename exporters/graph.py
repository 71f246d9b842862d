"""GraphBuilder: a thin, explicit way to write ONNX graphs from numpy (no tracing).

Nodes are named by their place in the model (`/model/layers.3/attn/q_proj/MatMul`), outputs after
their node (`.../MatMul/output_0`), small constants are de-duplicated by value, and weights keep
the name of the parameter they came from so a bundle can be read against its checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ONNX_DTYPE = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
}

Dim = int | str


class TensorSink(Protocol):
    """Where initializers' bytes go as they are made (external_data.ExternalDataWriter)."""

    def place(self, tensor: onnx.TensorProto) -> onnx.TensorProto: ...


class _Streamed(list):
    """Initializers handed to a sink on append: their bytes written out, references kept."""

    def __init__(self, sink: TensorSink):
        super().__init__()
        self.sink = sink

    def append(self, tensor: onnx.TensorProto) -> None:
        super().append(self.sink.place(tensor))  # the reference the sink returns: the bytes' arena goes


class GraphBuilder:
    def __init__(self, name: str, opset: int, dtype: np.dtype, sink: TensorSink | None = None):
        """`sink`: the top-level graph's initializers go there as they are made, in order (their bytes written
        at the offsets save_with_external_data would give them), so the graph holds references only."""
        self.name = name
        self.opset = opset
        self.dtype = np.dtype(dtype)  # activation dtype
        self.kv_dtype = self.dtype  # the KV cache's (past_*/present_*): fp16 under an fp32 graph where the ops take it
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = [] if sink is None else _Streamed(sink)
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._consts: dict[tuple, str] = {}
        self._names: set[str] = set()
        self.domains: dict[str, int] = {}
        self._root = self  # where constants and weights live: the top-level graph
        self._weights: dict[str, tuple[tuple[int, ...], np.dtype]] = {}  # name -> (shape, dtype)
        self._scope = ""  # prefix of this builder's node names

    # -- graph I/O ------------------------------------------------------------------------------

    def input(self, name: str, dtype: np.dtype, shape: Sequence[Dim]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, ONNX_DTYPE[np.dtype(dtype)], list(shape)))
        return name

    def output(self, value: str, name: str, dtype: np.dtype, shape: Sequence[Dim]) -> str:
        """Expose `value` as graph output `name` (an Identity only if it is not already called that)."""
        if value != name:
            self.op("Identity", [value], f"/model/outputs/{name}", out=name)
        self.outputs.append(helper.make_tensor_value_info(name, ONNX_DTYPE[np.dtype(dtype)], list(shape)))
        return name

    # -- nodes ----------------------------------------------------------------------------------

    def op(
        self, op_type: str, inputs: Sequence[str], name: str, *, out: str | None = None, domain: str = "", **attrs
    ) -> str:
        """Add one node with a single output; returns the output's name."""
        return self.op_multi(op_type, inputs, name, n_out=1, outs=[out] if out else None, domain=domain, **attrs)[0]

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        *,
        n_out: int,
        outs: Sequence[str] | None = None,
        domain: str = "",
        **attrs,
    ) -> list[str]:
        name = self._scope + name
        if name in self._names:
            raise ValueError(f"duplicate node name {name}")  # a builder bug, not a user error
        self._names.add(name)
        outputs = list(outs) if outs else [f"{name}/output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, domain=domain or None, **attrs))
        return outputs

    # -- constants and weights ------------------------------------------------------------------

    def const(self, value: np.ndarray | Sequence[int] | float, dtype: np.dtype | None = None) -> str:
        """A small constant, shared by every node that uses the same value (branches included)."""
        if self._root is not self:
            return self._root.const(value, dtype)
        arr = np.asarray(value, dtype=dtype if dtype is not None else None)
        if arr.dtype == np.float64:
            arr = arr.astype(self.dtype)
        key = (arr.dtype.str, arr.shape, hashlib.sha1(arr.tobytes()).hexdigest())
        if key not in self._consts:
            name = f"/model/constants/{arr.dtype.name}_{'x'.join(map(str, arr.shape)) or 'scalar'}_{len(self._consts)}"
            self.initializers.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def weight(self, name: str, array: np.ndarray) -> str:
        """A parameter, stored once in the top-level graph under `name`: branches that build the same
        layer (the same name) read that one copy from the outer scope."""
        root = self._root
        kind = (tuple(array.shape), np.dtype(array.dtype))
        if name not in root._weights:
            root._weights[name] = kind
            root.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        elif root._weights[name] != kind:  # two different tensors under one name: a builder bug
            raise ValueError(f"weight {name} already stored as {root._weights[name]}, now given {kind}")
        return name

    def branch(self, name: str, scope: str = "") -> GraphBuilder:
        """A builder for a control-flow body (If/Loop branch): it may read this graph's values by name.
        `scope` prefixes its node (and so its value) names, so two branches can build the same layers."""
        sub = GraphBuilder(name, self.opset, self.dtype)
        sub.kv_dtype = self.kv_dtype
        sub._names = self._names  # node names stay unique across the whole model
        sub.domains = self.domains
        sub._root = self._root
        sub._scope = self._scope + scope
        return sub

    def to_graph(self, outputs: Sequence[tuple[str, np.dtype]]) -> onnx.GraphProto:
        """This builder as a body graph without inputs, producing `outputs` (name, dtype; shapes free)."""
        outs = [helper.make_tensor_value_info(name, ONNX_DTYPE[np.dtype(dt)], None) for name, dt in outputs]
        return helper.make_graph(self.nodes, self.name, [], outs, self.initializers)

    def to_model(self, producer: str, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in self.domains.items()]
        model = helper.make_model(graph, opset_imports=opsets, producer_name=producer, doc_string=doc)
        model.ir_version = 10  # readable by onnxruntime >= 1.17 and TensorRT 10's parser
        return model
