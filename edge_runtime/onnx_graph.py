"""The few things the runtime reads from a bundle's ONNX graph (its nodes' ops, its initializers' element
types), straight from protobuf's wire format.

Importing the `onnx` package (mostly its ml_dtypes dependency) takes longer than the rest of a short
edge-run; the runtime needs a handful of fields, so it reads them here and `onnx` stays an export-time
dependency. Field numbers are onnx.proto's; every other field is skipped by its wire type, as protobuf
skips unknown ones, and so is a field of a known number but another wire type. Repeated occurrences of a
message field merge (their repeated fields concatenate) and a scalar's last occurrence wins, as in
protobuf. Subgraphs are the `g` of attributes of type GRAPH (If, Loop and Scan bodies).

Bounded on crafted input: each length is checked against the bytes present, varints stop at 10 bytes and
subgraphs nest at most MAX_DEPTH deep, so a file is read in one pass over its fields and anything else is
one BundleError line. The file is mapped, not read: inline weights (a bundle without external data) are
skipped without being copied.

    graph = read_graph(bundle / "model.onnx")
    ops = graph_ops(graph)                 # {(domain, op_type)}, subgraphs included
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import BundleError

# onnx.proto field numbers
MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_NODE, GRAPH_INITIALIZER = 1, 5  # GraphProto.node, .initializer
NODE_INPUT, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 4, 5, 7  # NodeProto
ATTRIBUTE_G, ATTRIBUTE_TYPE = 6, 20  # AttributeProto.g, .type
ATTRIBUTE_GRAPH = 5  # AttributeProto.AttributeType.GRAPH
# AttributeType's values (UNDEFINED .. TYPE_PROTOS): onnx.proto is proto2, whose enums are closed, so protobuf
# keeps another value aside and the field's earlier value stands
ATTRIBUTE_TYPES = range(15)
TENSOR_DATA_TYPE, TENSOR_NAME = 2, 8  # TensorProto.data_type, .name

# TensorProto.DataType values graph_weight_types names
INT8, UINT8, INT4 = 3, 2, 22

# Subgraphs (If/Loop/Scan bodies) nest a level or two in real models; protobuf's own parser stops at 100
# message levels, about 30 subgraph levels (a graph, a node and an attribute each).
MAX_DEPTH = 16

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class _Malformed(Exception):
    """Raised inside the reader; read_graph turns it into a BundleError naming the file."""


@dataclass(frozen=True)
class Node:
    op_type: str
    domain: str  # "" is the default ONNX domain
    inputs: tuple[str, ...]
    subgraphs: tuple[Graph, ...]  # of its attributes of type GRAPH (If branches, Loop bodies)


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    initializer_types: dict[str, int]  # name -> TensorProto.DataType (the last of a repeated name)


def read_graph(path: str | Path) -> Graph:
    """ModelProto.graph of the ONNX file at `path` (its external data is not read). A file that is not
    one raises BundleError."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:  # an empty file is an empty ModelProto (mmap refuses it)
                return Graph((), {})
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _model(buf)
    except OSError as e:
        raise BundleError(f"cannot read '{path}': {e.strerror or e}") from None
    except _Malformed as e:
        raise BundleError(f"'{path}' is not a readable ONNX model: {e}") from None


def graph_ops(graph: Graph) -> set[tuple[str, str]]:
    """(domain, op_type) of every node, subgraphs included."""
    ops: set[tuple[str, str]] = set()
    graphs = [graph]
    while graphs:
        g = graphs.pop()
        for node in g.nodes:
            ops.add((node.domain, node.op_type))
            graphs.extend(node.subgraphs)
    return ops


def _varint(buf: mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    if pos < end and buf[pos] < 0x80:  # most keys and lengths are one byte
        return buf[pos], pos + 1
    value = shift = 0
    for i in range(pos, min(pos + 10, end)):
        b = buf[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, i + 1
        shift += 7
    if pos + 10 <= end:
        raise _Malformed(f"a varint at byte {pos} runs past 10 bytes")
    raise _Malformed(f"a varint at byte {pos} runs past the end of its message (byte {end})")


def _fields(buf: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, a, b) of each field in buf[start:end]: a varint's value in `a`, a
    length-delimited field's span as [a, b); fixed-width values are skipped (a = b = 0)."""
    pos = start
    while pos < end:
        key, at = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = _varint(buf, at, end)
            yield number, wire, value, 0
        elif wire == LENGTH:
            n, at = _varint(buf, at, end)
            if n > end - at:
                raise _Malformed(f"field {number} at byte {pos} claims {n} bytes; {end - at} are left")
            pos = at + n
            yield number, wire, at, pos
        elif wire in (FIXED64, FIXED32):
            pos = at + (8 if wire == FIXED64 else 4)
            if pos > end:
                raise _Malformed(f"field {number} at byte {at} runs past the end of its message (byte {end})")
            yield number, wire, 0, 0
        else:  # groups (3, 4) are not in onnx.proto; 6 and 7 are no wire type
            raise _Malformed(f"field {number} at byte {pos} has wire type {wire}")


def _text(buf: mmap.mmap, a: int, b: int) -> str:
    try:
        return buf[a:b].decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"the string at byte {a} is not UTF-8") from None


def _model(buf: mmap.mmap) -> Graph:
    spans = [(a, b) for number, wire, a, b in _fields(buf, 0, len(buf)) if number == MODEL_GRAPH and wire == LENGTH]
    return _graph(buf, spans, 0)


def _graph(buf: mmap.mmap, spans: list[tuple[int, int]], depth: int) -> Graph:
    """The graph the message spans merge into (a message field given more than once merges)."""
    if depth > MAX_DEPTH:
        raise _Malformed(f"subgraphs nest more than {MAX_DEPTH} deep")
    nodes: list[Node] = []
    initializers: dict[str, int] = {}
    for start, end in spans:
        for number, wire, a, b in _fields(buf, start, end):
            if wire != LENGTH:
                continue
            if number == GRAPH_NODE:
                nodes.append(_node(buf, a, b, depth))
            elif number == GRAPH_INITIALIZER:
                name, data_type = "", 0
                for n2, w2, a2, b2 in _fields(buf, a, b):
                    if n2 == TENSOR_NAME and w2 == LENGTH:
                        name = _text(buf, a2, b2)
                    elif n2 == TENSOR_DATA_TYPE and w2 == VARINT:
                        data_type = _int32(a2)
                initializers[name] = data_type
    return Graph(tuple(nodes), initializers)


def _node(buf: mmap.mmap, start: int, end: int, depth: int) -> Node:
    op_type = domain = ""
    inputs: list[str] = []
    subgraphs: list[Graph] = []
    for number, wire, a, b in _fields(buf, start, end):
        if wire != LENGTH:
            continue
        if number == NODE_OP_TYPE:
            op_type = _text(buf, a, b)
        elif number == NODE_DOMAIN:
            domain = _text(buf, a, b)
        elif number == NODE_INPUT:
            inputs.append(_text(buf, a, b))
        elif number == NODE_ATTRIBUTE:
            kind, g = 0, []
            for n2, w2, a2, b2 in _fields(buf, a, b):
                if n2 == ATTRIBUTE_TYPE and w2 == VARINT and _int32(a2) in ATTRIBUTE_TYPES:
                    kind = _int32(a2)
                elif n2 == ATTRIBUTE_G and w2 == LENGTH:
                    g.append((a2, b2))
            if kind == ATTRIBUTE_GRAPH:
                subgraphs.append(_graph(buf, g, depth + 1))
    return Node(op_type, domain, tuple(inputs), tuple(subgraphs))


def _int32(value: int) -> int:
    """An int32/enum field's value: protobuf keeps the low 32 bits of the varint, two's complement."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value
