"""RAPL, amdgpu, NVML and the CPU estimate on fixture trees and fakes; choosing a meter with fallback."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from edge_runtime.errors import SensorPermissionError, SensorReadError, SensorUnavailableError, TelemetryError
from edge_runtime.targets import load_target
from edge_runtime.telemetry import (
    METER_KINDS,
    AmdgpuMeter,
    Boundary,
    CpuEstimateMeter,
    MeterKind,
    MeterOptions,
    NvmlMeter,
    RaplMeter,
    choose_meter,
    meter_for_profile,
    open_meter,
)
from edge_runtime.telemetry.select import FACTORIES

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
NUC_PKG = "sys/class/powercap/intel-rapl:0/energy_uj"
NUC_PSYS = "sys/class/powercap/intel-rapl:1/energy_uj"
AMD_PKG = "sys/class/powercap/intel-rapl:0/energy_uj"
AMD_CORE = "sys/class/powercap/intel-rapl:0/intel-rapl:0:0/energy_uj"


def _copy(tmp_path: Path, tree: str) -> Path:
    return Path(shutil.copytree(FIXTURES / tree, tmp_path / tree))


def _deny(*names: str):
    """An opener that raises PermissionError for the named files, as a non-root user sees post-CVE RAPL."""

    def opener(path: Path) -> str:
        if path.name in names:
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    return opener


# ---------------------------------------------------------------------------------------------
# RAPL
# ---------------------------------------------------------------------------------------------


def test_intel_rapl_prefers_psys_and_counts_from_zero(tmp_path):
    root = _copy(tmp_path, "intel-nuc")
    meter = RaplMeter(root)
    assert meter.kind is MeterKind.ENERGY and meter.boundary is Boundary.PLATFORM_PSYS
    assert meter.read().value == 0.0
    (root / NUC_PSYS).write_text(f"{154571208422 + 12_500_000}\n")
    (root / NUC_PKG).write_text(f"{124599532281 + 7_250_000}\n")
    reading = meter.read()
    assert reading.value == pytest.approx(12.5)  # joules over psys only
    assert reading.rails["package-0"] == pytest.approx(7.25)
    assert {"package-0", "package-0/core", "package-0/uncore", "psys", "dram"} == set(reading.rails)
    assert "psys" in meter.description


def test_mmio_duplicate_of_the_package_is_not_counted_twice():
    zones = [z.key for z in RaplMeter(FIXTURES / "intel-nuc").zones]
    assert zones.count("package-0") == 1
    assert all("mmio" not in str(z.path) for z in RaplMeter(FIXTURES / "intel-nuc").zones)


def test_without_psys_the_total_is_package_plus_dram(tmp_path):
    root = _copy(tmp_path, "intel-nuc")
    shutil.rmtree(root / "sys/class/powercap/intel-rapl:1")
    meter = RaplMeter(root)
    assert meter.boundary is Boundary.CPU_PACKAGE
    assert [z.key for z in meter.total] == ["package-0", "dram"]  # core/uncore are inside the package
    (root / NUC_PKG).write_text(f"{124599532281 + 3_000_000}\n")
    (root / "sys/class/powercap/intel-rapl:2/energy_uj").write_text(f"{182178908522 + 1_000_000}\n")
    assert meter.read().value == pytest.approx(4.0)


def test_amd_counter_wrap_adds_one_range(tmp_path):
    root = _copy(tmp_path, "amd-minipc")
    (root / AMD_PKG).write_text("65532000000\n")
    meter = RaplMeter(root)
    assert meter.boundary is Boundary.CPU_PACKAGE and [z.key for z in meter.total] == ["package-0"]
    (root / AMD_PKG).write_text("1000000\n")  # wrapped past max_energy_range_uj = 65532610987
    assert meter.read().value == pytest.approx(1_610_987 / 1e6)  # the research file's worked example
    (root / AMD_PKG).write_text("3000000\n")
    assert meter.read().value == pytest.approx((1_610_987 + 2_000_000) / 1e6)


def test_backwards_counter_without_a_range_is_a_read_error(tmp_path):
    root = _copy(tmp_path, "amd-minipc")
    (root / "sys/class/powercap/intel-rapl:0/max_energy_range_uj").unlink()
    meter = RaplMeter(root)
    (root / AMD_PKG).write_text("5\n")
    with pytest.raises(SensorReadError, match=r"went from 64930873566 to 5.*max_energy_range_uj"):
        meter.read()


def test_rapl_permission_denied_explains_the_cve_and_the_fix():
    with pytest.raises(SensorPermissionError) as info:
        RaplMeter(FIXTURES / "intel-nuc", opener=_deny("energy_uj"))
    message = str(info.value)
    assert "permission denied reading" in message and "energy_uj" in message
    assert "CVE-2020-8694" in message and "chmod a+r" in message


def test_no_rapl_zone_is_unavailable(tmp_path):
    with pytest.raises(SensorUnavailableError, match="no RAPL zone"):
        RaplMeter(tmp_path)


def test_rapl_named_domains_and_a_missing_one(tmp_path):
    meter = RaplMeter(FIXTURES / "intel-nuc", domains=("package-0",))
    assert [z.key for z in meter.total] == ["package-0"] and meter.boundary is Boundary.CPU_PACKAGE
    with pytest.raises(SensorUnavailableError, match=r"RAPL domain.*gpu not found"):
        RaplMeter(FIXTURES / "intel-nuc", domains=("gpu",))


# ---------------------------------------------------------------------------------------------
# amdgpu, NVML, estimate
# ---------------------------------------------------------------------------------------------


def test_amdgpu_prefers_instantaneous_power(tmp_path):
    meter = AmdgpuMeter(FIXTURES / "amd-minipc")
    assert meter.read().value == pytest.approx(15.012)
    assert meter.boundary is Boundary.APU_SOCKET and "CPU" in meter.description
    root = _copy(tmp_path, "amd-minipc")
    (root / "sys/class/hwmon/hwmon2/power1_input").unlink()
    assert AmdgpuMeter(root).read().value == pytest.approx(14.23)  # only power1_average on some APUs


def test_amdgpu_absent_is_unavailable():
    with pytest.raises(SensorUnavailableError, match="no amdgpu hwmon"):
        AmdgpuMeter(FIXTURES / "intel-nuc")


class FakeNvml:
    """The slice of pynvml the meter uses; counters in mJ as NVML returns them."""

    class NVMLError(Exception):
        pass

    def __init__(self, energy=None, power_mw=66712, gpus=1):
        self.energy = [81234567, 81301234] if energy is None else list(energy)
        self.power_mw, self.gpus, self.shutdown = power_mw, gpus, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"handle{i}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.energy:
            raise self.NVMLError("Not Supported")
        return self.energy.pop(0) if len(self.energy) > 1 else self.energy[0]

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw


def test_nvml_energy_counter_difference():
    nvml = FakeNvml()
    meter = NvmlMeter(nvml=nvml)
    assert meter.kind is MeterKind.ENERGY and meter.boundary is Boundary.GPU_BOARD
    assert meter.read().value == pytest.approx((81301234 - 81234567) / 1e3)  # 66.667 J
    meter.close()
    assert nvml.shutdown


def test_nvml_pre_volta_falls_back_to_power():
    meter = NvmlMeter(nvml=FakeNvml(energy=[]))
    assert meter.kind is MeterKind.POWER
    assert meter.read().value == pytest.approx(66.712)


def test_nvml_without_pynvml_is_skipped_cleanly(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(SensorUnavailableError, match="nvidia-ml-py"):
        NvmlMeter()


def test_nvml_no_gpu_is_unavailable():
    with pytest.raises(SensorUnavailableError, match="no NVIDIA GPU"):
        NvmlMeter(nvml=FakeNvml(gpus=0))


def _stat(tmp_path: Path, busy: int, idle: int) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc/stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 {busy} 0 0 {idle} 0 0 0 0 0 0\n")


def test_estimate_follows_cpu_utilisation_and_says_estimate(tmp_path):
    _stat(tmp_path, busy=1000, idle=9000)
    meter = CpuEstimateMeter(tdp_watts=28, idle_watts=6, root=tmp_path)
    _stat(tmp_path, busy=1000 + 75, idle=9000 + 25)  # 75 % busy since the last read
    assert meter.read().value == pytest.approx(6 + 22 * 0.75)
    assert meter.read().value == pytest.approx(6 + 22 * 0.75)  # no tick since: keeps the last figure
    _stat(tmp_path, busy=1075, idle=9025 + 100)
    assert meter.read().value == pytest.approx(6.0)
    assert meter.estimate and meter.boundary is Boundary.ESTIMATE
    assert meter.description.startswith("estimate") and "no sensor" in meter.description


def test_estimate_needs_sane_figures(tmp_path):
    _stat(tmp_path, 1, 1)
    with pytest.raises(SensorUnavailableError, match="idle_watts"):
        CpuEstimateMeter(tdp_watts=5, idle_watts=6, root=tmp_path)


# ---------------------------------------------------------------------------------------------
# Choosing a meter
# ---------------------------------------------------------------------------------------------


def test_every_meter_kind_has_a_factory():
    assert set(FACTORIES) == set(METER_KINDS)
    with pytest.raises(TelemetryError, match=r"unknown power meter kind 'wattmeter'.*rpi5-pmic"):
        open_meter("wattmeter")


def test_rapl_permission_denied_falls_back_to_amdgpu_with_a_note():
    options = MeterOptions(root=FIXTURES / "amd-minipc", opener=_deny("energy_uj"))
    choice = meter_for_profile(load_target("amd-minipc"), options)
    assert choice.meter.kind_name == "amdgpu"
    assert len(choice.notes) == 1 and choice.notes[0].startswith("rapl: permission denied")
    assert "CVE-2020-8694" in choice.notes[0]


def test_nothing_readable_falls_back_to_the_labelled_estimate(tmp_path):
    root = _copy(tmp_path, "intel-nuc")
    _stat(root, 10, 90)
    choice = meter_for_profile(load_target("nuc"), MeterOptions(root=root, opener=_deny("energy_uj")))
    assert choice.meter.estimate and choice.meter.kind_name == "estimate"
    assert choice.notes[-1] == "no sensor could be read: power figures are an estimate"
    assert choice.meter.description.startswith("estimate")


def test_jetson_profile_opens_ina3221_with_the_profiles_rails():
    choice = meter_for_profile(load_target("orin-agx"), MeterOptions(root=FIXTURES / "orin-agx-jp6"))
    assert choice.meter.kind_name == "ina3221" and choice.notes == ()
    assert choice.meter.total_rails == ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")


def test_pi5_profile_uses_the_injected_runner():
    pmic = (FIXTURES / "captured" / "pmic_read_adc_pi5_rev1.txt").read_text()
    options = MeterOptions(root=FIXTURES / "rpi5", runner=lambda argv: pmic)
    assert meter_for_profile(load_target("rpi5"), options).meter.kind_name == "rpi5-pmic"


def test_no_meter_at_all_lists_every_reason(tmp_path):
    with pytest.raises(SensorUnavailableError) as info:
        choose_meter(["rapl"], MeterOptions(root=tmp_path))
    message = str(info.value)
    assert "rapl: no RAPL zone" in message and "estimate: the estimate needs power.tdp_watts" in message


def test_nvml_kind_opens_through_the_options():
    meter = open_meter("nvml", MeterOptions(nvml=FakeNvml()))
    assert meter.kind_name == "nvml" and meter.boundary is Boundary.GPU_BOARD
