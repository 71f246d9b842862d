"""Target profiles: the built-ins, the schema check's messages, user overrides, and auto-detection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from edge_runtime.errors import DetectionError, EdgeRuntimeError, ProfileSchemaError, TargetError, UnknownTargetError
from edge_runtime.targets import detect_target, known_targets, load_target, read_facts, resolve_target
from edge_runtime.targets.loader import BUILTIN_DIR
from edge_runtime.telemetry import METER_KINDS

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
REQUIRED = {"orin-agx", "orin-nx", "orin-nano", "rpi5", "rpi4", "nuc", "amd-minipc", "x86"}


def _builtin(name: str) -> dict:
    return yaml.safe_load((BUILTIN_DIR / f"{name}.yaml").read_text())


def _write(tmp_path: Path, data, name: str = "custom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------------
# Built-in profiles
# ---------------------------------------------------------------------------------------------


def test_every_required_profile_is_shipped_and_loads():
    assert REQUIRED <= set(known_targets())
    for name in known_targets():
        profile = load_target(name)
        assert profile.name == name
        assert profile.source.endswith(f"{name}.yaml")
        assert profile.memory_budget_bytes > 0 and profile.kv_cache.window > 0
        assert set(profile.power.meters) <= set(METER_KINDS)
        assert profile.power.meters[-1] == "estimate"  # every target ends on the labelled fallback
        assert 0 < profile.power.idle_watts < profile.power.tdp_watts


def test_jetson_profiles_use_tensorrt_and_the_right_total_rails():
    for name in ("orin-agx", "orin-nx", "orin-nano"):
        profile = load_target(name)
        assert (profile.backend.name, profile.graph_flavor) == ("tensorrt", "trt")
        assert profile.backend.tensorrt is not None and "fp16" in profile.backend.tensorrt.precision
        assert profile.block_size in (64, 128)
        assert profile.power.meters[0] == "ina3221"
    assert load_target("orin-agx").power.total_rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")
    assert load_target("orin-nano").power.total_rails == ("VDD_IN",)
    assert load_target("orin-nx").power.total_rails == ("VDD_IN",)


def test_cpu_profiles_use_onnxruntime_and_their_meters():
    for name in ("rpi5", "rpi4", "nuc", "amd-minipc", "x86"):
        profile = load_target(name)
        assert (profile.backend.name, profile.graph_flavor) == ("onnxruntime", "ort")
        assert profile.backend.providers == ("CPUExecutionProvider",) and profile.backend.tensorrt is None
    assert load_target("rpi5").power.meters[0] == "rpi5-pmic"
    assert load_target("rpi5").power.sample_hz <= 10  # PMIC reads cost ~23 ms each
    assert load_target("rpi4").power.meters == ("estimate",)  # no on-board current sensor
    assert load_target("nuc").power.meters[0] == "rapl"
    assert load_target("amd-minipc").power.meters[:2] == ("rapl", "amdgpu")
    # x86 first-use exports take edge-runtime's INT4 kernel where it is built; ARM ones keep MLAS's
    assert [load_target(n).matmul_kernel for n in ("nuc", "amd-minipc", "x86")] == ["edge"] * 3
    assert [load_target(n).matmul_kernel for n in ("rpi5", "rpi4", "orin-nano")] == ["mlas"] * 3


# ---------------------------------------------------------------------------------------------
# Schema errors name the file, the key and the fix
# ---------------------------------------------------------------------------------------------


def _edit(data: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    if value is _DELETE:
        del data[last]
    else:
        data[last] = value


_DELETE = object()

SCHEMA_CASES = [
    ("quantisation", "int4", ["unknown key 'quantisation'", "did you mean 'quantization'"]),
    ("backend.thread", 4, ["unknown key 'backend.thread'", "did you mean 'threads'", "allowed keys in 'backend'"]),
    ("backend.threads", "six", ["'backend.threads' = 'six'", "integer"]),
    ("memory_budget_bytes", True, ["'memory_budget_bytes' = True", "integer"]),
    ("memory_budget_bytes", 0, ["'memory_budget_bytes' = 0", ">= 1"]),
    ("quantization", "int3", ["'quantization' = 'int3'", "int4-awq"]),
    ("kv_cache", _DELETE, ["required key 'kv_cache' is missing"]),
    ("kv_cache.sinks", -1, ["'kv_cache.sinks' = -1"]),
    ("power.meters", ["ina3221", "wattmeter"], ["'power.meters'", "'wattmeter'", "rpi5-pmic"]),
    ("power.tdp_watts", "lots", ["'power.tdp_watts' = 'lots'", "positive number"]),
    ("power.idle_watts", 99, ["'power.idle_watts' = 99", "below power.tdp_watts"]),
    ("graph_flavor", "ort", ["'graph_flavor' = 'ort'", "tensorrt backend"]),
    ("block_size", 32, ["'block_size' = 32", "64 or 128"]),
    ("block_size", 48, ["'block_size' = 48", "32, 64, 128"]),
    ("backend.tensorrt.precision", ["fp16", "fp4"], ["'backend.tensorrt.precision'", "'fp4'"]),
    ("backend.providers", ["CPUExecutionProvider"], ["'backend.providers'", "onnxruntime backend only"]),
    ("detect.sensors", ["VDD_IN"], ["'detect.sensors'", "KIND:NAME"]),
    ("detect", "jetson", ["'detect' = 'jetson'", "mapping"]),
    ("matmul_kernel", "edge", ["'matmul_kernel' = 'edge'", "graph_flavor is 'ort'"]),
    ("matmul_kernel", "avx512", ["'matmul_kernel' = 'avx512'", "mlas, edge"]),
    ("mixed_precision", "q6k", ["'mixed_precision' = 'q6k'", "none, llama-down, sensitivity"]),
]


@pytest.mark.parametrize(("key", "value", "expected"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_errors_name_file_key_and_fix(tmp_path, key, value, expected):
    data = _builtin("orin-nano")
    _edit(data, key, value)
    path = _write(tmp_path, data)
    with pytest.raises(ProfileSchemaError) as info:
        load_target(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message


def test_schema_error_is_a_target_error(tmp_path):
    path = _write(tmp_path, ["not", "a", "mapping"])
    with pytest.raises(TargetError, match="must be a mapping"):
        load_target(path)
    assert issubclass(ProfileSchemaError, EdgeRuntimeError)


def test_onnxruntime_profile_rejects_a_tensorrt_section(tmp_path):
    data = _builtin("rpi5")
    data["backend"]["tensorrt"] = {"precision": ["fp16"], "workspace_bytes": 1}
    with pytest.raises(ProfileSchemaError, match=r"'backend.tensorrt'.*tensorrt backend only"):
        load_target(_write(tmp_path, data))


def test_invalid_yaml_names_the_line(tmp_path):
    path = _write(tmp_path, "name: x\nbackend: [unclosed\n")
    with pytest.raises(ProfileSchemaError, match=r"not valid YAML at line \d+"):
        load_target(path)


# ---------------------------------------------------------------------------------------------
# Names, paths and overrides
# ---------------------------------------------------------------------------------------------


def test_unknown_name_lists_the_known_targets():
    with pytest.raises(UnknownTargetError) as info:
        load_target("jetson-thor")
    message = str(info.value)
    assert "'jetson-thor'" in message
    for name in known_targets():
        assert name in message


def test_missing_profile_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(UnknownTargetError, match="does not exist") as info:
        load_target(str(missing))
    assert str(missing) in str(info.value)


def test_a_user_file_overrides_the_builtin_of_the_same_name(tmp_path):
    data = _builtin("orin-nano")
    data["memory_budget_bytes"] = 3_000_000_000
    path = _write(tmp_path, data, "orin-nano.yaml")
    assert load_target(path).memory_budget_bytes == 3_000_000_000
    assert load_target(str(path)).source == str(path)
    assert load_target("orin-nano").memory_budget_bytes != 3_000_000_000


def test_extends_restates_only_what_changes(tmp_path):
    path = _write(
        tmp_path, "extends: rpi5\nmemory_budget_bytes: 7_000_000_000\nkv_cache:\n  window: 2044\n", "pi8g.yaml"
    )
    profile = load_target(path)
    assert profile.name == "pi8g"
    assert profile.memory_budget_bytes == 7_000_000_000
    assert (profile.kv_cache.sinks, profile.kv_cache.window) == (4, 2044)  # sinks inherited
    assert profile.power == load_target("rpi5").power


def test_extends_must_name_a_builtin(tmp_path):
    path = _write(tmp_path, "extends: rpi9\n")
    with pytest.raises(ProfileSchemaError, match="'extends' = 'rpi9' must name a built-in target: amd-minipc"):
        load_target(path)


def test_extended_profile_is_still_checked(tmp_path):
    path = _write(tmp_path, "extends: nuc\nbackend:\n  threads: many\n")
    with pytest.raises(ProfileSchemaError, match=r"'backend.threads' = 'many'"):
        load_target(path)


# ---------------------------------------------------------------------------------------------
# Auto-detection on fixture trees
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        ("orin-nano-jp6", "orin-nano"),
        ("orin-agx-jp6", "orin-agx"),
        ("rpi5", "rpi5"),
        ("rpi4", "rpi4"),
        ("intel-nuc", "nuc"),
        ("amd-minipc", "amd-minipc"),
    ],
)
def test_detect_picks_the_profile_for_each_fixture_machine(tree, expected):
    detection = detect_target(FIXTURES / tree)
    assert detection.profile.name == expected
    assert not detection.fallback
    assert f"'{expected}'" in detection.reason


def test_facts_read_from_the_fixture_tree():
    nano = read_facts(FIXTURES / "orin-nano-jp6")
    assert nano.model == "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
    assert "nvidia,p3767-0005" in nano.compatible and not nano.is_x86
    assert {"rail:VDD_IN", "rail:VDD_CPU_GPU_CV", "rail:VDD_SOC"} <= nano.sensors
    nuc = read_facts(FIXTURES / "intel-nuc")
    assert nuc.cpu_vendor == "GenuineIntel" and "avx2" in nuc.cpu_flags
    assert {"powercap:package-0", "powercap:psys", "powercap:core"} <= nuc.sensors


def test_compatible_outranks_a_devkit_model_string(tmp_path):
    # An Orin NX module on the Orin Nano devkit carrier can report the Nano devkit's model string.
    root = tmp_path / "nx"
    shutil.copytree(FIXTURES / "orin-nano-jp6", root)
    (root / "proc/device-tree/compatible").write_bytes(b"nvidia,p3768-0000+p3767-0000\x00nvidia,p3767-0000\x00")
    assert detect_target(root).profile.name == "orin-nx"


def test_agx_is_told_apart_by_its_rails_when_names_are_custom(tmp_path):
    root = tmp_path / "agx"
    shutil.copytree(FIXTURES / "orin-agx-jp6", root)
    (root / "proc/device-tree/model").write_bytes(b"Orin NX / AGX Orin robot carrier\x00")
    (root / "proc/device-tree/compatible").write_bytes(b"acme,robot\x00nvidia,tegra234\x00")
    # Both orin-nx and orin-agx match the model; only AGX has VIN_SYS_5V0 and VDD_GPU_SOC rails.
    detection = detect_target(root)
    assert detection.profile.name == "orin-agx"
    assert "rail:VIN_SYS_5V0" in detection.reason


def test_an_unresolvable_tie_asks_for_a_target(tmp_path):
    root = tmp_path / "tie"
    shutil.copytree(FIXTURES / "orin-nano-jp6", root)
    (root / "proc/device-tree/model").write_bytes(b"Orin NX or Orin Nano carrier\x00")
    (root / "proc/device-tree/compatible").write_bytes(b"acme,carrier\x00")
    with pytest.raises(DetectionError, match="orin-nano, orin-nx equally"):
        detect_target(root)


@pytest.mark.parametrize(
    ("vendor", "flags"),
    [("HygonGenuine", "fpu sse sse2 avx avx2"), ("GenuineIntel", "fpu sse sse2 sse4_2 avx")],
    ids=["unknown-vendor", "intel-without-avx2"],
)
def test_unknown_x86_falls_back_to_generic_and_says_so(tmp_path, vendor, flags):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n")
    detection = detect_target(tmp_path)
    assert detection.profile.name == "x86"
    assert detection.fallback
    assert "generic 'x86' profile" in detection.reason and vendor in detection.reason


def test_unknown_arm_board_is_an_error_listing_targets(tmp_path):
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"Pine64 RockPro64 v2.1\x00")
    with pytest.raises(DetectionError) as info:
        detect_target(tmp_path)
    message = str(info.value)
    assert "'Pine64 RockPro64 v2.1'" in message and "orin-nano" in message and "--target" in message


def test_resolve_target_handles_auto_names_and_paths(tmp_path):
    assert resolve_target("auto", FIXTURES / "rpi5").profile.name == "rpi5"
    assert resolve_target("rpi4").profile.name == "rpi4"
    path = _write(tmp_path, "extends: x86\n", "mybox.yaml")
    assert resolve_target(str(path)).profile.name == "mybox"
