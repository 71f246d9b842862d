"""The one exception hierarchy (DESIGN.md §9). A leaf module: imports nothing of ours.

Every message names the offending value and, where there is one, the fix. The CLI turns any
`EdgeRuntimeError` into one line and a non-zero exit code.
"""

from __future__ import annotations


class EdgeRuntimeError(Exception):
    """Root of every error this project raises on purpose."""


class CheckpointError(EdgeRuntimeError):
    """A Hugging Face checkpoint directory that cannot be read as given."""


class CorruptCheckpointError(CheckpointError):
    """A safetensors file (or its index) that is truncated, malformed or inconsistent."""


class ConfigError(CheckpointError):
    """A `config.json` with a missing, ill-typed or unsupported setting."""


class UnsupportedArchitectureError(ConfigError):
    """A `model_type` no architecture file handles."""


class WeightMappingError(CheckpointError):
    """Checkpoint tensors that do not match the architecture's weight map (missing, unused or mis-shaped)."""
