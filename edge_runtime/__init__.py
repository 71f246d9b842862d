"""edge-runtime: on-device LLM inference with a static memory pool, a StreamingLLM cache and power telemetry.

    import edge_runtime
    engine = edge_runtime.load("bundle/", target="auto")
    result = edge_runtime.generate(engine, edge_runtime.Tokenizer.for_engine(engine), "ROMEO.")

The device-side package. `edge_runtime.models` (architecture knowledge) and `edge_runtime.exporters`
(the host-side build pipeline) are mapped into this namespace from the top-level `models/` and
`exporters/` folders (docs/architecture.md §1). Importing this module stays light: the API below loads lazily.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.3.0"

# onnxruntime's Linux wheel starts a telemetry client when it loads, writing a device id and an event
# database under ~/.cache/Microsoft; on a device nothing should leave traces or phone home. The
# variable must be set before onnxruntime is imported; setdefault leaves an explicit choice alone.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

_LAZY = {
    "load": "edge_runtime.engine",
    "LoadOptions": "edge_runtime.engine",
    "Engine": "edge_runtime.engine",
    "generate": "edge_runtime.generate",
    "stream_generate": "edge_runtime.generate",
    "GenerationConfig": "edge_runtime.generate",
    "SamplingParams": "edge_runtime.sampling",
    "Session": "edge_runtime.session",
    "Tokenizer": "edge_runtime.tokenizer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edge_runtime' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
