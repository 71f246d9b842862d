"""Architecture knowledge: one small file per Hugging Face `model_type`, resolved through an alias table.

arch = get_arch(config)          # Architecture for config["model_type"]
args = arch.parse(config)        # typed ModelArgs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_runtime.errors import UnsupportedArchitectureError

from . import gemma3, granite, llama, mistral, qwen2, qwen3, smollm3
from .base import Architecture, LayerWeights, ModelArgs, ModelWeights, RopeConfig, RopeKind, WeightNames

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a for a in (llama.ARCH, mistral.ARCH, qwen2.ARCH, qwen3.ARCH, gemma3.ARCH, smollm3.ARCH, granite.ARCH)
}

# model_type -> architecture file, where the model is the same network under another name.
ALIASES: dict[str, str] = {"ministral": "mistral"}

# The demo checkpoint trained by scripts/train_demo_model.py and shipped with the package.
DEMO_MODEL = "shakespeare-llama-5m"
CHECKPOINTS_DIR = Path(__file__).resolve().parent / "checkpoints"
DEMO_CHECKPOINT = CHECKPOINTS_DIR / DEMO_MODEL
# Checkpoints shipped with the package, by name, wherever it is installed: `edge-export demo`, `--model demo`.
NAMED_CHECKPOINTS: dict[str, Path] = {"demo": DEMO_CHECKPOINT, DEMO_MODEL: DEMO_CHECKPOINT}
# The calibration text for checkpoints that ship none: general technical English and Python code
# (scripts/make_calibration_text.py; its source and licence in the README.md beside it).
GENERAL_CALIBRATION = Path(__file__).resolve().parent / "calibration" / "general_en_code.txt"


def resolve_checkpoint(spec: str | Path) -> Path:
    """A bundled checkpoint's name -> its directory; anything else is a path. A bare name wins over a folder
    of that name in the working directory (`edge-export demo -o demo` must work twice): write `./demo` for it."""
    if isinstance(spec, str) and spec in NAMED_CHECKPOINTS:
        return NAMED_CHECKPOINTS[spec]
    return Path(spec)


def supported_model_types() -> list[str]:
    return sorted([*ARCHITECTURES, *ALIASES])


def get_arch(config: dict[str, Any] | str) -> Architecture:
    """The architecture for a config dict (or a bare `model_type` string)."""
    model_type = config if isinstance(config, str) else config.get("model_type")
    name = ALIASES.get(model_type, model_type) if isinstance(model_type, str) else None
    if name not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}"
        )
    return ARCHITECTURES[name]


__all__ = [
    "ALIASES",
    "ARCHITECTURES",
    "CHECKPOINTS_DIR",
    "DEMO_CHECKPOINT",
    "DEMO_MODEL",
    "GENERAL_CALIBRATION",
    "NAMED_CHECKPOINTS",
    "Architecture",
    "LayerWeights",
    "ModelArgs",
    "ModelWeights",
    "RopeConfig",
    "RopeKind",
    "WeightNames",
    "get_arch",
    "resolve_checkpoint",
    "supported_model_types",
]
