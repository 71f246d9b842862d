"""Host-side build pipeline (no torch): checkpoint loading and the float64 reference forward.

Later stages (graph building, quantization, validation, bundle writing) land here too.
"""

from .checkpoint import Checkpoint, load_checkpoint, read_config
from .reference import DenseKVCache, ReferenceModel
from .safetensors_io import CheckpointTensors, SafetensorsFile

__all__ = [
    "Checkpoint",
    "CheckpointTensors",
    "DenseKVCache",
    "ReferenceModel",
    "SafetensorsFile",
    "load_checkpoint",
    "read_config",
]
