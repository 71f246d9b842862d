"""Decoder layers made on demand: a checkpoint's weights read from its file one layer at a
time, instead of every layer widened to float32 at once.

    layers = LazyLayers(n, make)        # make(i) -> LayerWeights
    for lw in layers: ...               # layer i is built when reached; only the latest one is kept

A 1B model's layers are 4.9 GB as float32, 2.5 GB as the bf16 the file stores; an export reads each
layer a few times (block checks, quantization, the record), so it pays a bf16 -> float32 widening per read
(about a second per GB here) to hold one layer's float32 at a time. The last layer built stays cached, so
reading several fields of one layer (`layers[i].q`, `layers[i].k`) widens it once and hands back the same
arrays (code that finds an array's quantized form by identity sees stable ids).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, overload

from edge_runtime.models import LayerWeights


class LazyLayers(Sequence[LayerWeights]):
    _live: ClassVar[weakref.WeakSet[LazyLayers]] = weakref.WeakSet()

    def __init__(self, count: int, make: Callable[[int], LayerWeights]):
        self._count, self._make = count, make
        self._cached: tuple[int, LayerWeights] | None = None
        LazyLayers._live.add(self)

    @classmethod
    def release_all(cls) -> None:
        """Drop every instance's kept layer: between export stages, where nobody holds a layer's arrays for
        their identity, a kept layer is only memory (two float32 layers of an 8B model are 1.7 GB)."""
        for layers in list(cls._live):
            layers._cached = None

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> LayerWeights: ...
    @overload
    def __getitem__(self, i: slice) -> list[LayerWeights]: ...
    def __getitem__(self, i: int | slice) -> LayerWeights | list[LayerWeights]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"layer {i} of {self._count}")
        if self._cached is None or self._cached[0] != i:
            self._cached = None  # drop the previous layer before building the next: one layer's floats at a time
            self._cached = (i, self._make(i))
        return self._cached[1]

    def __iter__(self) -> Iterator[LayerWeights]:
        for i in range(self._count):
            yield self[i]

    def __repr__(self) -> str:
        return f"LazyLayers({self._count} layers, built on demand)"
