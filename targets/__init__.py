"""Device target profiles (YAML), their schema check and auto-detection (docs/architecture.md §8)."""

from edge_runtime.targets.detect import Detection, MachineFacts, detect_target, read_facts, resolve_target
from edge_runtime.targets.loader import known_targets, load_target
from edge_runtime.targets.schema import (
    BackendSpec,
    DetectHints,
    KVCacheSpec,
    PowerSpec,
    TargetProfile,
    TensorRTOptions,
    parse_profile,
)

__all__ = [
    "BackendSpec",
    "DetectHints",
    "Detection",
    "KVCacheSpec",
    "MachineFacts",
    "PowerSpec",
    "TargetProfile",
    "TensorRTOptions",
    "detect_target",
    "known_targets",
    "load_target",
    "parse_profile",
    "read_facts",
    "resolve_target",
]
