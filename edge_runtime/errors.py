"""The one exception hierarchy (docs/architecture.md §10). A leaf module: imports nothing of ours.

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


class ExportError(EdgeRuntimeError):
    """An export that cannot be completed (bad option, validation failure, write failure)."""


class ValidationError(ExportError):
    """An exported graph that disagrees with the float64 reference beyond its precision's tolerance."""


class KernelPinError(EdgeRuntimeError):
    """EDGE_KERNELS_ISA names a MatMulQ4/MatMulQ8 implementation this CPU does not run."""


class BundleError(EdgeRuntimeError):
    """A bundle directory that is missing files, fails its checksums or has an invalid manifest."""


class ManifestVersionError(BundleError):
    """A bundle written in a format version this runtime does not read."""


class TargetError(EdgeRuntimeError):
    """A device target that cannot be loaded or detected."""


class UnknownTargetError(TargetError):
    """A target name that is neither a built-in profile nor a readable profile file."""


class ProfileSchemaError(TargetError):
    """A target profile YAML with an unknown key, a missing key or an ill-typed value."""


class DetectionError(TargetError):
    """`--target auto` could not tell which profile fits this machine."""


class TelemetryError(EdgeRuntimeError):
    """A power meter that cannot be opened or read."""


class SensorUnavailableError(TelemetryError):
    """A power meter whose sensor is absent on this machine (no such device, command or library)."""


class SensorPermissionError(SensorUnavailableError):
    """A sensor that exists but this user may not read (e.g. RAPL `energy_uj`, root-only since CVE-2020-8694)."""


class SensorReadError(TelemetryError):
    """A sensor read that failed after the meter was opened (device vanished, garbled value, command failed)."""


class OutputError(EdgeRuntimeError):
    """An output path that must not be written over or replaced (atomic_write.py): a directory, a block
    device, a socket."""


class ChatTemplateError(EdgeRuntimeError):
    """A conversation the bundle's chat template cannot render (or a bundle without one, or a broken template)."""


class ChatTemplateLimitError(ChatTemplateError):
    """A chat template that went over a render bound (steps, seconds, size: chat.py): a template that loops or
    builds a huge value, refused whatever the conversation."""


class SessionError(EdgeRuntimeError):
    """A conversation session asked to do what its ring cannot (session.py)."""


class RollbackError(SessionError):
    """`truncate` past what the ring's slack rows keep: the dropped tokens' window was already evicted."""


class RingOverflowError(SessionError):
    """One turn longer than the ring's window, with the session set to refuse rather than chunk it."""


class SnapshotError(SessionError):
    """A session snapshot that cannot be restored."""


class SnapshotMismatchError(SnapshotError):
    """A snapshot of another bundle, or of another cache geometry of the same bundle."""


class CorruptSnapshotError(SnapshotError):
    """A snapshot file that is truncated, not a snapshot, or fails its checksum."""


class CorruptOutputError(EdgeRuntimeError):
    """Logits that are NaN/Inf or all equal, or a fused argmax outside the vocabulary: the graph's output
    is garbage, almost always from corrupted weights (logits_check.py)."""


class ConstraintError(EdgeRuntimeError):
    """A structured-output constraint that cannot be used (constrain.py): invalid JSON or JSON schema, an
    unsatisfiable schema, a schema feature the grammar engine does not implement, a regex or Lark syntax
    error. Raised when the constraint is compiled, before anything is generated."""


class SpeculativeError(EdgeRuntimeError):
    """Speculative decoding set up in a way the ring cannot verify (speculative.py): k of 0, or above the slack."""


class DraftMismatchError(SpeculativeError):
    """A draft bundle whose token ids are not the target's: another tokenizer or vocabulary size."""
