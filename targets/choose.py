"""Which profile a bundle runs under: `--target` when given, else the one the bundle was exported for, else
what this machine looks like.

A bundle exported with `edge-export --target nuc` carries `nuc` in its manifest; running it on the NUC must
not fall back to the generic `x86` profile (a 65 W energy estimate instead of 28 W) because detection could
not name the machine. The bundle's target is taken only where it fits this machine's kind (an x86 profile
on x86, a board profile elsewhere): an Orin bundle checked on a laptop runs under the laptop's profile, and
says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge_runtime.targets.detect import GENERIC_X86, Detection, read_facts, resolve_target
from edge_runtime.targets.loader import known_targets, load_target
from edge_runtime.targets.schema import TargetProfile


@dataclass(frozen=True)
class TargetChoice:
    detection: Detection  # the profile, and the paragraph saying why (printed under --verbose)
    warning: str | None = None  # one line the user always sees: the bundle's target was not used
    auto: bool = True  # not named by --target (a TensorRT profile may then fall back to ONNX Runtime CPU)

    @property
    def profile(self) -> TargetProfile:
        return self.detection.profile


def is_board_profile(profile: TargetProfile) -> bool:
    """An ARM board's profile (detected by device-tree), as opposed to an x86 machine's."""
    hints = profile.detect
    return profile.name != GENERIC_X86 and bool(hints.device_tree_model or hints.device_tree_compatible)


def choose_target(spec: str, bundle_target: str | None, root: Path = Path("/")) -> TargetChoice:
    """`spec` is `--target` (a name, a YAML path or 'auto'); `bundle_target` the bundle's manifest's target."""
    if spec != "auto":
        named = resolve_target(spec, root)
        warning = None
        if bundle_target and bundle_target != named.profile.name:
            warning = (
                f"this bundle was exported for target '{bundle_target}'; running under '{named.profile.name}' "
                "as --target says"
            )
        return TargetChoice(named, warning, auto=False)
    if bundle_target and bundle_target in known_targets():
        profile = load_target(bundle_target)
        machine_is_x86 = read_facts(root).is_x86
        if is_board_profile(profile) != machine_is_x86:
            return TargetChoice(Detection(profile, f"target '{profile.name}' from the bundle's manifest"))
        detected = resolve_target("auto", root)
        kind = "an x86 machine" if machine_is_x86 else "not an x86 machine"
        warning = (
            f"this bundle was exported for target '{bundle_target}' and this is {kind}; running under "
            f"'{detected.profile.name}' (--target NAME chooses)"
        )
        return TargetChoice(detected, warning)
    return TargetChoice(resolve_target("auto", root))
