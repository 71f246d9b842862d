"""Jetson INA3221 readers on fixture sysfs trees: JetPack 5/6 hwmon and the JetPack 4 IIO layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge_runtime.errors import SensorPermissionError, SensorReadError, SensorUnavailableError
from edge_runtime.telemetry import Boundary, Ina3221Meter, Ina3221xMeter, MeterKind

FIXTURES = Path(__file__).parent / "fixtures" / "telemetry"
NANO_HWMON = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
AGX_0040 = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"


def _copy(tmp_path: Path, tree: str) -> Path:
    return Path(shutil.copytree(FIXTURES / tree, tmp_path / tree))


def _watts(mv: float, ma: float) -> float:
    return mv * ma / 1e6


def test_orin_nano_total_is_vdd_in_with_every_rail_reported():
    meter = Ina3221Meter(FIXTURES / "orin-nano-jp6")
    reading = meter.read()
    assert meter.kind is MeterKind.POWER and meter.boundary is Boundary.MODULE_INPUT
    assert meter.total_rails == ("VDD_IN",)
    assert reading.value == pytest.approx(_watts(5064, 981))  # ~4.97 W, as tegrastats F-J1 shows
    assert reading.value == pytest.approx(4.968, abs=0.002)
    assert reading.rails == pytest.approx(
        {"VDD_IN": _watts(5064, 981), "VDD_CPU_GPU_CV": _watts(5056, 86), "VDD_SOC": _watts(5056, 338)}
    )
    assert "sum of shunt voltages" not in reading.rails  # channel 7 is not a rail
    assert "module input" in meter.description and "VDD_IN" in meter.description


def test_update_interval_caps_the_sampling_rate():
    # 6 ms conversion time: anything above ~166 Hz rereads the same value; 100 Hz is the cap anyway.
    assert Ina3221Meter(FIXTURES / "orin-nano-jp6").max_rate_hz == 100.0


def test_agx_orin_sums_three_rails_and_skips_nc_and_ddr():
    meter = Ina3221Meter(FIXTURES / "orin-agx-jp6")
    reading = meter.read()
    expected = _watts(843, 6170) + _watts(780, 3437) + _watts(4968, 953)
    assert reading.value == pytest.approx(expected)
    assert meter.boundary is Boundary.SOC_RAILS  # no input rail on AGX: a SoC-side sum, not module input
    assert "NC" not in reading.rails
    # The DDR rail is reported per rail but not added (it is fed from VIN_SYS_5V0).
    assert reading.rails["VDDQ_VDD2_1V8AO"] == pytest.approx(_watts(1800, 341))
    assert set(reading.rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}


def test_profile_rails_override_the_automatic_total():
    meter = Ina3221Meter(FIXTURES / "orin-nano-jp6", total_rails=("VDD_CPU_GPU_CV", "VDD_SOC"))
    assert meter.read().value == pytest.approx(_watts(5056, 86) + _watts(5056, 338))
    assert meter.boundary is Boundary.SOC_RAILS


def test_a_missing_total_rail_names_it_and_the_rails_present(tmp_path):
    with pytest.raises(SensorUnavailableError) as info:
        Ina3221Meter(FIXTURES / "orin-nano-jp6", total_rails=("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"))
    message = str(info.value)
    assert "VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 not found" in message
    assert "VDD_CPU_GPU_CV, VDD_IN, VDD_SOC" in message and "power.total_rails" in message


def test_a_board_with_no_known_total_asks_for_total_rails(tmp_path):
    root = _copy(tmp_path, "orin-nano-jp6")
    (root / NANO_HWMON / "in1_label").write_text("VDD_MODULE\n")
    with pytest.raises(SensorUnavailableError, match=r"include no known total.*power.total_rails"):
        Ina3221Meter(root)


def test_disabled_and_unlabelled_channels_are_skipped(tmp_path):
    root = _copy(tmp_path, "orin-nano-jp6")
    (root / NANO_HWMON / "in3_enable").write_text("0\n")
    (root / NANO_HWMON / "in2_label").unlink()
    assert set(Ina3221Meter(root).read().rails) == {"VDD_IN"}


def test_mainline_agx_without_nc_labels(tmp_path):
    # The mainline device tree disables the NC channels: no label files at all.
    root = _copy(tmp_path, "orin-agx-jp6")
    hwmon4 = root / "sys/bus/i2c/drivers/ina3221/1-0041/hwmon/hwmon4"
    for name in ("in1_label", "in3_label", "in1_input", "in3_input", "curr1_input", "curr3_input"):
        (hwmon4 / name).unlink()
    assert set(Ina3221Meter(root).read().rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}


def test_chip_found_through_class_hwmon_by_name(tmp_path):
    # Some kernels expose the chip only as /sys/class/hwmon/hwmonN with name "ina3221".
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "orin-nano-jp6" / NANO_HWMON, root / "sys/class/hwmon/hwmon5")
    assert Ina3221Meter(root).read().value == pytest.approx(_watts(5064, 981))


def test_no_chip_is_unavailable(tmp_path):
    with pytest.raises(SensorUnavailableError, match="no INA3221 hwmon device"):
        Ina3221Meter(tmp_path)


def test_permission_denied_at_open_says_how_to_fix():
    def opener(path: Path) -> str:
        if path.name.endswith("_input"):
            raise PermissionError(13, "Permission denied")
        return path.read_text()

    with pytest.raises(SensorPermissionError, match=r"permission denied reading .*in1_input.*chmod a\+r"):
        Ina3221Meter(FIXTURES / "orin-nano-jp6", opener=opener)


def test_a_vanished_chip_is_a_read_error_naming_the_file(tmp_path):
    root = _copy(tmp_path, "orin-nano-jp6")
    meter = Ina3221Meter(root)
    shutil.rmtree(root / NANO_HWMON)
    with pytest.raises(SensorReadError, match="in1_input"):
        meter.read()


def test_garbled_value_is_a_read_error(tmp_path):
    root = _copy(tmp_path, "orin-nano-jp6")
    meter = Ina3221Meter(root)
    (root / NANO_HWMON / "curr1_input").write_text("\n")
    with pytest.raises(SensorReadError, match="not a number"):
        meter.read()


def test_values_are_reread_on_every_read(tmp_path):
    root = _copy(tmp_path, "orin-nano-jp6")
    meter = Ina3221Meter(root)
    (root / NANO_HWMON / "curr1_input").write_text("2400\n")
    assert meter.read().value == pytest.approx(_watts(5064, 2400))


# ---------------------------------------------------------------------------------------------
# JetPack 4: ina3221x (IIO)
# ---------------------------------------------------------------------------------------------


def test_jp4_nano_total_is_pom_5v_in_from_the_power_file():
    meter = Ina3221xMeter(FIXTURES / "jetson-nano-jp4")
    reading = meter.read()
    assert meter.boundary is Boundary.MODULE_INPUT and meter.total_rails == ("POM_5V_IN",)
    assert reading.value == pytest.approx(0.933)  # in_power0_input, mW
    assert reading.rails == pytest.approx({"POM_5V_IN": 0.933, "POM_5V_GPU": 0.0, "POM_5V_CPU": 0.084})


def test_jp4_without_power_files_multiplies_volts_and_amps(tmp_path):
    root = _copy(tmp_path, "jetson-nano-jp4")
    for power in root.glob("sys/bus/i2c/drivers/ina3221x/*/iio:device0/in_power*_input"):
        power.unlink()
    assert Ina3221xMeter(root).read().value == pytest.approx(_watts(5016, 186))


def test_jp4_layout_absent_is_unavailable():
    with pytest.raises(SensorUnavailableError, match="no ina3221x IIO device"):
        Ina3221xMeter(FIXTURES / "orin-nano-jp6")
