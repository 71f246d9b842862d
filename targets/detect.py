"""`--target auto`: pick the built-in profile that fits this machine from /proc and /sys.

Facts are read under an injectable filesystem root so tests run on fixture trees. Scoring, strongest
first: a `/proc/device-tree/compatible` entry (names the exact module SKU: Orin NX and Orin Nano
share a devkit carrier whose `model` string may say either), the device-tree `model`, the x86 CPU
vendor; then DMI product names and present sensors break ties.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import DetectionError
from edge_runtime.targets.loader import known_targets, load_target
from edge_runtime.targets.schema import TargetProfile

log = logging.getLogger(__name__)

GENERIC_X86 = "x86"
_SCORE_COMPATIBLE, _SCORE_MODEL, _SCORE_VENDOR, _SCORE_DMI, _SCORE_SENSOR = 100, 50, 20, 5, 1


@dataclass(frozen=True)
class MachineFacts:
    model: str = ""  # /proc/device-tree/model
    compatible: tuple[str, ...] = ()  # /proc/device-tree/compatible entries
    cpu_vendor: str = ""  # x86 vendor_id ("GenuineIntel", "AuthenticAMD"); "" on ARM
    cpu_flags: frozenset[str] = frozenset()
    dmi_product: str = ""
    sensors: frozenset[str] = frozenset()  # "hwmon:<name>", "rail:<label>", "powercap:<zone>"

    @property
    def is_x86(self) -> bool:
        return bool(self.cpu_vendor) or "sse2" in self.cpu_flags


@dataclass(frozen=True)
class Detection:
    profile: TargetProfile
    reason: str  # one line saying what matched, or that this is the generic fallback
    fallback: bool = False


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def _sensors(root: Path) -> frozenset[str]:
    found: set[str] = set()
    for hwmon in sorted((root / "sys/class/hwmon").glob("hwmon*")):
        name = _read(hwmon / "name").strip()
        if name:
            found.add(f"hwmon:{name}")
    ina_dirs = list((root / "sys/bus/i2c/drivers/ina3221").glob("*/hwmon/hwmon*"))
    ina_dirs += [h for h in (root / "sys/class/hwmon").glob("hwmon*") if _read(h / "name").strip() == "ina3221"]
    for hwmon in ina_dirs:
        found.update(f"rail:{_read(label).strip()}" for label in hwmon.glob("in*_label"))
    # Real sysfs lists every zone flat as a symlink; fixture trees may nest subzones one level down.
    powercap = root / "sys/class/powercap"
    for name_file in [*powercap.glob("*/name"), *powercap.glob("*/*/name")]:
        found.add(f"powercap:{_read(name_file).strip()}")
    return frozenset(found)


def read_facts(root: Path = Path("/")) -> MachineFacts:
    """Gather what detection looks at; any file that is missing simply contributes nothing."""
    root = Path(root)
    vendor, flags = "", frozenset[str]()
    for line in _read(root / "proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = frozenset(value.split())
    return MachineFacts(
        model=_read(root / "proc/device-tree/model").strip("\x00\n "),
        compatible=tuple(c for c in _read(root / "proc/device-tree/compatible").split("\x00") if c),
        cpu_vendor=vendor,
        cpu_flags=flags,
        dmi_product=_read(root / "sys/class/dmi/id/product_name").strip(),
        sensors=_sensors(root),
    )


def _score(profile: TargetProfile, facts: MachineFacts) -> tuple[int, list[str]] | None:
    """(score, what matched), or None when the profile cannot be this machine."""
    hints = profile.detect
    if hints.cpu_vendor and facts.cpu_vendor not in hints.cpu_vendor:
        return None
    missing = set(hints.cpu_flags) - facts.cpu_flags
    if missing:
        return None
    score, why = 0, []
    compat = [h for h in hints.device_tree_compatible if any(h in c for c in facts.compatible)]
    if compat:
        score, why = score + _SCORE_COMPATIBLE, [*why, f"device-tree compatible has {compat[0]!r}"]
    model = [h for h in hints.device_tree_model if h in facts.model]
    if model:
        score, why = score + _SCORE_MODEL, [*why, f"device-tree model {facts.model!r} has {model[0]!r}"]
    if hints.cpu_vendor:
        score, why = score + _SCORE_VENDOR, [*why, f"CPU vendor {facts.cpu_vendor}"]
    if score == 0:
        return None  # sensors and DMI alone do not identify a machine
    if any(h in facts.dmi_product for h in hints.dmi_product):
        score, why = score + _SCORE_DMI, [*why, f"DMI product {facts.dmi_product!r}"]
    present = [s for s in hints.sensors if s in facts.sensors]
    if present:
        score, why = score + _SCORE_SENSOR * len(present), [*why, f"sensors {', '.join(present)}"]
    return score, why


def detect_target(root: Path = Path("/")) -> Detection:
    """Pick the built-in profile for the machine whose filesystem is mounted at `root`."""
    facts = read_facts(root)
    scored = []
    for name in known_targets():
        profile = load_target(name)
        result = _score(profile, facts)
        if result is not None:
            scored.append((result[0], name, profile, result[1]))
    scored.sort(key=lambda s: -s[0])
    if scored and (len(scored) == 1 or scored[0][0] > scored[1][0]):
        _, name, profile, why = scored[0]
        return Detection(profile, f"detected target '{name}': {'; '.join(why)}")
    if scored:
        tied = [s[1] for s in scored if s[0] == scored[0][0]]
        raise DetectionError(
            f"this machine matches targets {', '.join(tied)} equally ({'; '.join(scored[0][3])}); "
            "pass --target with one of them"
        )
    if facts.is_x86:
        reason = (
            f"no profile matches this x86 machine (CPU vendor {facts.cpu_vendor or 'unknown'!r}); "
            f"using the generic '{GENERIC_X86}' profile; pass --target NAME or a profile path to choose"
        )
        log.warning(reason)
        return Detection(load_target(GENERIC_X86), reason, fallback=True)
    what = f"device-tree model {facts.model!r}" if facts.model else "no device-tree model, not an x86 CPU"
    raise DetectionError(
        f"cannot detect the target ({what}); pass --target with one of: {', '.join(known_targets())}, "
        "or a path to a profile YAML"
    )


def resolve_target(spec: str, root: Path = Path("/")) -> Detection:
    """`--target` semantics: 'auto' detects; anything else is a built-in name or a profile path."""
    if spec == "auto":
        return detect_target(root)
    profile = load_target(spec)
    return Detection(profile, f"target '{profile.name}' from {profile.source}")
