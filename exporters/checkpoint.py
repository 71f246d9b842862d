"""Open a Hugging Face checkpoint directory: config -> architecture -> typed args -> bound weights.

ckpt = load_checkpoint("models/checkpoints/shakespeare-llama-5m")
ckpt.args.num_layers, ckpt.weights.layers[0].q.shape
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime.errors import CheckpointError, ConfigError
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
    weights = arch.weights.bind(args, tensors.keys(), tensors.__getitem__)
    return Checkpoint(path=directory, config=config, arch=arch, args=args, weights=weights, tensors=tensors)
