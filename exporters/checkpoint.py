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

from edge_runtime.errors import CheckpointError, ConfigError, CorruptCheckpointError
from edge_runtime.models import Architecture, ModelArgs, ModelWeights, get_arch

from .safetensors_io import CheckpointTensors


@dataclass
class Checkpoint:
    path: Path
    config: dict[str, Any]
    arch: Architecture
    args: ModelArgs
    weights: ModelWeights  # float32 (memory-mapped where the file is fp32)
    tensors: CheckpointTensors

    @property
    def tokenizer_file(self) -> Path | None:
        path = self.path / "tokenizer.json"
        return path if path.is_file() else None


def read_config(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"'{directory}' is a file, not a checkpoint directory (or a .gguf file)")
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory '{directory}' does not exist")
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"'{directory}' has no config.json; is it a Hugging Face checkpoint directory?") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"'{path}' is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ConfigError(f"'{path}' must hold a JSON object")
    return config


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Parse the config and bind every tensor; raises a `CheckpointError` subclass naming the problem."""
    directory = Path(directory)
    config = read_config(directory)
    arch = get_arch(config)
    args = arch.parse(config)
    tensors = CheckpointTensors(directory)
    weights = arch.weights.bind(args, tensors.keys(), lambda name: finite_tensor(name, tensors[name]))
    return Checkpoint(path=directory, config=config, arch=arch, args=args, weights=weights, tensors=tensors)


_SCAN_ROWS = 1 << 22  # elements per isfinite pass on the error path: bounded temporaries


def finite_tensor(name: str, arr: np.ndarray) -> np.ndarray:
    """`arr`, refused if it holds NaN or Inf: otherwise the export would fail late, validation reporting
    "differs by nan", with no hint of which weight is to blame. One float sum per tensor (NaN and Inf
    propagate through it); only when it is not finite are the values counted, in bounded chunks."""
    if not np.issubdtype(arr.dtype, np.floating):
        return arr
    with np.errstate(over="ignore", invalid="ignore"):
        total = arr.sum(dtype=np.float64)
    if np.isfinite(total):
        return arr
    flat = arr.reshape(-1)
    bad = sum(int(np.count_nonzero(~np.isfinite(flat[i : i + _SCAN_ROWS]))) for i in range(0, flat.size, _SCAN_ROWS))
    raise CorruptCheckpointError(
        f"tensor '{name}' holds {bad} NaN or Inf value{'s' if bad != 1 else ''} of {flat.size}; the checkpoint is "
        "corrupted (or was saved after a diverged training step)"
    )
