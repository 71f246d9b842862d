"""Execution backends. Each runs one graph call over the static pool; only ONNX Runtime exists today."""
