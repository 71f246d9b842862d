"""Open a Hugging Face checkpoint directory: config -> architecture -> typed args -> bound weights.

ckpt = load_checkpoint("models/checkpoints/shakespeare-llama-5m")
ckpt.args.num_layers, ckpt.weights.layers[0].q.shape
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.bounded_read import read_text_bounded
from edge_runtime.errors import CheckpointError, ConfigError, CorruptCheckpointError
from edge_runtime.models import Architecture, LayerWeights, ModelArgs, ModelWeights, get_arch
from edge_runtime.models.base import WeightFolds

from .lazy_layers import LazyLayers
from .safetensors_io import CheckpointTensors
from .tables import StoredTable


@dataclass
class Checkpoint:
    path: Path
    config: dict[str, Any]
    arch: Architecture
    args: ModelArgs
    # float32; the layers read from the file through the architecture's folds, widened one at a time (LazyLayers)
    weights: ModelWeights
    tensors: CheckpointTensors

    @property
    def tokenizer_file(self) -> Path | None:
        path = self.path / "tokenizer.json"
        return path if path.is_file() else None


MAX_CONFIG_BYTES = 4 << 20  # a config.json is a few KB


def read_config(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"'{directory}' is a file, not a checkpoint directory (or a .gguf file)")
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory '{directory}' does not exist")
    path = directory / "config.json"
    if not path.exists():
        raise CheckpointError(f"'{directory}' has no config.json; is it a Hugging Face checkpoint directory?")
    try:  # a regular file of a config's size: a FIFO would block, /dev/zero never end
        config = json.loads(read_text_bounded(path, MAX_CONFIG_BYTES, "config", ConfigError))
    except json.JSONDecodeError as e:
        raise ConfigError(f"'{path}' is not valid JSON: {e}") from e
    except RecursionError:
        raise ConfigError(f"'{path}' is nested too deeply to be a model config") from None
    if not isinstance(config, dict):
        raise ConfigError(f"'{path}' must hold a JSON object")
    return config


def load_checkpoint(directory: str | Path, *, stored_tables: bool = False) -> Checkpoint:
    """Parse the config and bind every tensor; raises a `CheckpointError` subclass naming the problem.
    `stored_tables`: the embedding table and LM head stay in the file, read a block of rows at a time
    (StoredTable, tables.py), for an export that quantizes them."""
    directory = Path(directory)
    config = read_config(directory)
    arch = get_arch(config)
    args = arch.parse(config)
    tensors = CheckpointTensors(directory)
    folds = arch.folds(config) if arch.folds is not None else WeightFolds()
    weights = _bind_lazily(arch, args, tensors, stored_tables, folds)
    return Checkpoint(path=directory, config=config, arch=arch, args=args, weights=weights, tensors=tensors)


def _bind_lazily(
    arch: Architecture, args: ModelArgs, tensors: CheckpointTensors, stored_tables: bool, folds: WeightFolds
) -> ModelWeights:
    """The weight map bound on the file's stored bytes (names and shapes checked, nothing widened), then every
    tensor checked finite one at a time (the load still refuses a NaN, naming it), the tables kept as float32
    or in the file (`stored_tables`), and the layers widened on demand (a 1B model's float32
    layers are 4.9 GB, an 8B model's tables 4.2 GB), each through the architecture's `folds`."""
    raw = arch.weights.bind(args, tensors.keys(), tensors.raw)
    names: list[dict[str, str]] = []
    for i, lw in enumerate(raw.layers):
        fields = {f: t.format(i=i) for f, t in arch.weights.layer.items() if getattr(lw, f, None) is not None}
        for name in fields.values():
            finite_tensor(name, tensors[name])
        names.append(fields)

    def table(name: str) -> np.ndarray:
        if not stored_tables:
            return finite_tensor(name, tensors[name])
        stored = StoredTable(lambda rows: tensors.get_rows(name, rows), tensors.shape(name))
        for rows, part in stored.parts():
            finite_tensor(name, part, first_row=rows.start)
        return stored

    embed = table(arch.weights.embed)
    tied = raw.lm_head is raw.embed
    lm_head = embed if tied else table(arch.weights.lm_head)
    final_norm = folds.final_norm(finite_tensor(arch.weights.final_norm, tensors[arch.weights.final_norm]))

    def layer(i: int) -> LayerWeights:
        return folds.layer(LayerWeights(**{f: tensors[name] for f, name in names[i].items()}))

    return ModelWeights(embed=embed, final_norm=final_norm, lm_head=lm_head, layers=LazyLayers(len(names), layer))


_SCAN_ROWS = 1 << 22  # elements per isfinite pass on the error path: bounded temporaries


def finite_tensor(name: str, arr: np.ndarray, first_row: int | None = None) -> np.ndarray:
    """`arr`, refused if it holds NaN or Inf: otherwise the export would fail late, validation reporting
    "differs by nan", with no hint of which weight is to blame. One float sum per tensor (NaN and Inf
    propagate through it); only when it is not finite are the values counted, in bounded chunks.
    `first_row`: `arr` is the rows of `name` from this one on (a table checked a part at a time)."""
    if not np.issubdtype(arr.dtype, np.floating):
        return arr
    with np.errstate(over="ignore", invalid="ignore"):
        total = arr.sum(dtype=np.float64)
    if np.isfinite(total):
        return arr
    flat = arr.reshape(-1)
    bad = sum(int(np.count_nonzero(~np.isfinite(flat[i : i + _SCAN_ROWS]))) for i in range(0, flat.size, _SCAN_ROWS))
    where = "" if first_row is None else f" in rows {first_row}..{first_row + len(arr) - 1}"
    raise CorruptCheckpointError(
        f"tensor '{name}' holds {bad} NaN or Inf value{'s' if bad != 1 else ''} of {flat.size}{where}; the "
        "checkpoint is corrupted (or was saved after a diverged training step)"
    )
