"""`--target auto` on x86: DMI, CPU model strings and core counts decide between a device profile and the
generic `x86` one, and the reason printed says which facts did (fixture trees in tests/fixtures/detect/)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge_runtime.targets import detect_target, read_facts

DETECT = Path(__file__).parent / "fixtures" / "detect"
TELEMETRY = Path(__file__).parent / "fixtures" / "telemetry"


@pytest.mark.parametrize(
    ("tree", "expected", "fallback", "said"),
    [
        ("xeon-vm", "x86", True, ["a virtual machine", "CPU flag 'hypervisor'", "'QEMU'", "2 logical CPUs"]),
        ("cloud-vm-no-flag", "x86", True, ["a virtual machine", "'Amazon EC2'"]),
        ("xeon-server", "x86", True, ["a server", "chassis type 23", "64 logical CPUs"]),
        ("intel-desktop", "x86", True, ["neither a mini PC nor a server", "i7-13700K"]),
        ("intel-minipc", "nuc", False, ["a mini PC", "chassis type 35", "N100"]),
        ("nuc-board", "nuc", False, ["DMI names 'NUC13ANBi7'", "i7-1360P"]),
    ],
)
def test_x86_machines_get_the_profile_their_facts_support(tree, expected, fallback, said):
    detection = detect_target(DETECT / tree)
    assert (detection.profile.name, detection.fallback) == (expected, fallback)
    for words in said:
        assert words in detection.reason
    if fallback:
        assert "generic 'x86' profile" in detection.reason


def test_dmi_and_cpu_facts_are_read():
    f = read_facts(DETECT / "xeon-server")
    assert (f.dmi_vendor, f.dmi_product, f.dmi_board, f.chassis_type) == ("Dell Inc.", "PowerEdge R750", "0PJ0FH", 23)
    assert f.cpu_model == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz" and f.logical_cpus == 64
    assert f.x86_class()[0] == "server"


def test_a_vm_is_never_a_nuc_even_with_a_nuc_product_name(tmp_path):
    root = tmp_path / "vm"
    shutil.copytree(TELEMETRY / "intel-nuc", root)
    cpuinfo = root / "proc/cpuinfo"
    cpuinfo.write_text(cpuinfo.read_text().replace("flags\t\t: ", "flags\t\t: hypervisor ", 1))
    detection = detect_target(root)
    assert detection.profile.name == "x86" and "virtual machine" in detection.reason


def test_many_cores_without_other_signs_are_server_class(tmp_path):
    root = tmp_path / "big"
    shutil.copytree(DETECT / "intel-desktop", root)
    text = (root / "proc/cpuinfo").read_text()
    block = text.split("\n\n")[0]
    (root / "proc/cpuinfo").write_text(
        "\n\n".join(block.replace("processor\t: 0", f"processor\t: {i}") for i in range(48))
    )
    detection = detect_target(root)
    assert detection.profile.name == "x86" and "server-class core count (48 logical CPUs" in detection.reason
