"""edge-runtime: on-device LLM inference with a static memory pool, a StreamingLLM cache and power telemetry.

The device-side package. `edge_runtime.models` (architecture knowledge) and `edge_runtime.exporters`
(the host-side build pipeline) are mapped into this namespace from the top-level `models/` and
`exporters/` folders (DESIGN.md §2). This module stays import-light: no numpy, no onnxruntime.
"""

__version__ = "0.1.0"
