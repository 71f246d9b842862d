"""`--target auto`: pick the built-in profile that fits this machine from /proc and /sys.

Facts are read under an injectable filesystem root so tests run on fixture trees. Scoring, strongest
first: a `/proc/device-tree/compatible` entry (names the exact module SKU: Orin NX and Orin Nano
share a devkit carrier whose `model` string may say either), the device-tree `model`, the x86 CPU
vendor; then DMI product names and present sensors break ties.

An x86 CPU vendor alone says nothing about the machine: an Intel CPU may be a NUC or a 2-core Xeon VM,
whose power is nothing like a NUC's. So an x86 profile (one with `cpu_vendor` hints) matches only a
machine that looks like its class: DMI product or board naming it, or a mini PC (DMI chassis Mini PC /
Stick PC, or a mobile/embedded CPU part) that is neither virtual nor a server. Virtual machines
(`hypervisor` CPU flag, a hypervisor's DMI vendor) and servers (Xeon/EPYC parts, server chassis, many
cores) get the generic `x86` profile, and so does anything undecided; the reason says which facts decided.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import DetectionError
from edge_runtime.targets.loader import known_targets, load_target
from edge_runtime.targets.schema import TargetProfile

GENERIC_X86 = "x86"
_SCORE_COMPATIBLE, _SCORE_MODEL, _SCORE_VENDOR, _SCORE_DMI, _SCORE_SENSOR = 100, 50, 20, 5, 1

# DMI sys_vendor / product_name of hypervisors and clouds (substrings, case-insensitive).
_VIRTUAL_DMI = (
    "qemu",
    "kvm",
    "vmware",
    "virtualbox",
    "innotek",
    "xen",
    "bochs",
    "parallels",
    "openstack",
    "amazon ec2",
    "google compute engine",
    "virtual machine",
    "cloud hypervisor",
    "firecracker",
)
# SMBIOS chassis types: 17 main server, 23 rack mount, 25 multi-system, 28 blade, 29 blade enclosure;
# 35 mini PC, 36 stick PC.
_SERVER_CHASSIS, _MINI_CHASSIS = frozenset({17, 23, 25, 28, 29}), frozenset({35, 36})
_SERVER_CPU = re.compile(r"\b(Xeon|EPYC|Opteron)\b", re.IGNORECASE)
# Mobile and embedded parts, what mini PCs are built from: Intel Core ...-1135G7 / -1360P / -8259U / -12700H,
# Core Ultra, N100/N305, Celeron, Pentium Silver, Atom; AMD Ryzen ... 5800U / 7840HS / 6900HX, Ryzen AI.
_MOBILE_CPU = re.compile(
    r"Core\(TM\)\s+i\d-\d{4,5}(?:G\d|[UHPY][A-Z]?)\b|Core\(TM\) Ultra|Intel\(R\) N\d{2,3}\b|Celeron|"
    r"Pentium\(R\) Silver|Atom|Ryzen (?:\d|AI)\b.*?\b\d{4}(?:U|H|HS|HX)\b|Ryzen AI",
    re.IGNORECASE,
)
MANY_CPUS = 32  # logical CPUs beyond any mini PC's (a NUC 13 Pro i7 has 16)


@dataclass(frozen=True)
class MachineFacts:
    model: str = ""  # /proc/device-tree/model
    compatible: tuple[str, ...] = ()  # /proc/device-tree/compatible entries
    cpu_vendor: str = ""  # x86 vendor_id ("GenuineIntel", "AuthenticAMD"); "" on ARM
    cpu_flags: frozenset[str] = frozenset()
    dmi_product: str = ""
    sensors: frozenset[str] = frozenset()  # "hwmon:<name>", "rail:<label>", "powercap:<zone>"
    dmi_vendor: str = ""  # /sys/class/dmi/id/sys_vendor
    dmi_board: str = ""  # /sys/class/dmi/id/board_name
    chassis_type: int | None = None  # /sys/class/dmi/id/chassis_type (SMBIOS)
    cpu_model: str = ""  # /proc/cpuinfo "model name" (x86)
    logical_cpus: int = 0  # /proc/cpuinfo "processor" entries

    @property
    def is_x86(self) -> bool:
        return bool(self.cpu_vendor) or "sse2" in self.cpu_flags

    def x86_class(self) -> tuple[str, str]:
        """("virtual" | "server" | "mini" | "unknown", the facts that decided it), for x86 machines."""
        cpu = f"CPU {self.cpu_model!r}" if self.cpu_model else "CPU model unknown"
        count = f"{self.logical_cpus} logical CPUs" if self.logical_cpus else "CPU count unknown"
        dmi = " ".join((self.dmi_vendor, self.dmi_product)).lower()
        virtual = [f"DMI {self.dmi_vendor or self.dmi_product!r}"] if any(v in dmi for v in _VIRTUAL_DMI) else []
        if "hypervisor" in self.cpu_flags:
            virtual.insert(0, "CPU flag 'hypervisor'")
        if virtual:
            return "virtual", f"a virtual machine ({', '.join(virtual)}; {cpu}, {count})"
        if self.chassis_type in _SERVER_CHASSIS:
            return "server", f"a server (DMI chassis type {self.chassis_type}; {cpu}, {count})"
        if _SERVER_CPU.search(self.cpu_model):
            return "server", f"a server CPU ({cpu}, {count})"
        if self.logical_cpus > MANY_CPUS:
            return "server", f"a server-class core count ({count}; {cpu})"
        if self.chassis_type in _MINI_CHASSIS:
            return "mini", f"a mini PC (DMI chassis type {self.chassis_type}; {cpu}, {count})"
        if _MOBILE_CPU.search(self.cpu_model):
            return "mini", f"a mobile/embedded CPU ({cpu}, {count})"
        chassis = f"DMI chassis type {self.chassis_type}" if self.chassis_type is not None else "no DMI chassis type"
        return "unknown", f"neither a mini PC nor a server by its facts ({cpu}, {count}, {chassis})"


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
    vendor, flags, cpu_model, cpus = "", frozenset[str](), "", 0
    for line in _read(root / "proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        elif key == "model name" and not cpu_model:
            cpu_model = " ".join(value.split())
        elif key == "processor":
            cpus += 1
    dmi = root / "sys/class/dmi/id"
    chassis = _read(dmi / "chassis_type").strip()
    return MachineFacts(
        model=_read(root / "proc/device-tree/model").strip("\x00\n "),
        compatible=tuple(c for c in _read(root / "proc/device-tree/compatible").split("\x00") if c),
        cpu_vendor=vendor,
        cpu_flags=flags,
        dmi_product=_read(dmi / "product_name").strip(),
        sensors=_sensors(root),
        dmi_vendor=_read(dmi / "sys_vendor").strip(),
        dmi_board=_read(dmi / "board_name").strip(),
        chassis_type=int(chassis) if chassis.isdigit() else None,
        cpu_model=cpu_model,
        logical_cpus=cpus,
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
    dmi = [h for h in hints.dmi_product if h in facts.dmi_product or h in facts.dmi_board]
    if hints.cpu_vendor:
        kind, what = facts.x86_class()
        if kind in ("virtual", "server") or (kind == "unknown" and not dmi):
            return None  # the vendor alone does not make an Intel machine a NUC
        score, why = score + _SCORE_VENDOR, [*why, f"CPU vendor {facts.cpu_vendor}", what]
    if score == 0:
        return None  # sensors and DMI alone do not identify a machine
    if dmi:
        named = facts.dmi_product if dmi[0] in facts.dmi_product else facts.dmi_board
        score, why = score + _SCORE_DMI, [*why, f"DMI names {named!r}"]
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
            f"no device profile fits this x86 machine (CPU vendor {facts.cpu_vendor or 'unknown'!r}): "
            f"{facts.x86_class()[1]}; using the generic '{GENERIC_X86}' profile; pass --target NAME or a profile "
            "path to choose"
        )
        return Detection(load_target(GENERIC_X86), reason, fallback=True)  # the caller prints the reason
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
