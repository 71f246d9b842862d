"""Raspberry Pi 5 PMIC reader on captured `vcgencmd pmic_read_adc` outputs, with an injected runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_runtime.errors import SensorPermissionError, SensorReadError, SensorUnavailableError
from edge_runtime.telemetry import Boundary, RpiPmicMeter, Sampler, parse_pmic_adc

CAPTURED = Path(__file__).parent / "fixtures" / "telemetry" / "captured"
PI5_REV1 = (CAPTURED / "pmic_read_adc_pi5_rev1.txt").read_text()
PAIRED_RAILS = {
    "3V7_WL_SW", "3V3_SYS", "1V8_SYS", "DDR_VDD2", "DDR_VDDQ", "1V1_SYS",
    "0V8_SW", "VDD_CORE", "3V3_DAC", "3V3_ADC", "0V8_AON", "HDMI",
}  # fmt: skip


def _runner(*outputs: str):
    """A command runner that replays outputs in turn (the last one forever) and records its calls."""
    calls: list[list[str]] = []

    def run(argv):
        calls.append(list(argv))
        return outputs[min(len(calls) - 1, len(outputs) - 1)]

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_captured_pi5_output_pairs_twelve_rails_by_name():
    watts = parse_pmic_adc(PI5_REV1)
    assert set(watts) == PAIRED_RAILS  # EXT5V and BATT have a voltage but no current
    # Paired by name although the indexes differ: VDD_CORE is current(7) and volt(15).
    assert watts["VDD_CORE"] == pytest.approx(6.22421000 * 0.86173300)
    assert watts["VDD_CORE"] == pytest.approx(5.36, abs=0.01)  # the research file's figure
    assert sum(watts.values()) == pytest.approx(7.2, abs=0.05)


def test_partial_capture_sums_only_complete_pairs():
    watts = parse_pmic_adc((CAPTURED / "pmic_read_adc_partial.txt").read_text())
    assert watts == pytest.approx(
        {"3V3_SYS": 0.12687090 * 3.32952100, "1V8_SYS": 0.20299340 * 1.80317300, "VDD_CORE": 1.91102000 * 0.87355220}
    )


def test_current_only_capture_yields_no_power():
    # Geerling's first lines: a shell prompt, current lines only, then "...": nothing can be paired.
    assert parse_pmic_adc((CAPTURED / "pmic_read_adc_geerling_first_lines.txt").read_text()) == {}


def test_unpaired_nan_and_mailbox_separators_are_handled():
    text = (
        "  VDD_CORE_A current(7)=1.00000000A\x00  VDD_CORE_V volt(15)=0.80000000V\x00"
        "  NO_VOLT_A current(9)=0.5A\x00  BATT_V volt(25)=nanV\x00  HDMI_A current(22)=nanA\x00"
        "  HDMI_V volt(23)=5.08664000V\x00"
    )
    assert parse_pmic_adc(text) == pytest.approx({"VDD_CORE": 0.8})


def test_meter_sums_rails_and_is_capped_at_10_hz():
    run = _runner(PI5_REV1)
    meter = RpiPmicMeter(run)
    reading = meter.read()
    assert meter.boundary is Boundary.PMIC_RAILS and not meter.estimate
    assert reading.value == pytest.approx(sum(parse_pmic_adc(PI5_REV1).values()))
    assert set(reading.rails) == PAIRED_RAILS
    assert run.calls[0] == ["vcgencmd", "pmic_read_adc"]
    assert "12 rails" in meter.description and "excludes USB" in meter.description
    assert meter.max_rate_hz == 10.0
    assert Sampler(meter, rate_hz=50).rate_hz == 10.0  # a 50 Hz request is capped for the PMIC


def test_firmware_rail_names_are_not_hard_coded():
    renamed = PI5_REV1.replace("0V8_SW_", "0V8_SYS_")  # 2023 firmware naming
    assert "0V8_SYS" in RpiPmicMeter(_runner(renamed)).read().rails


@pytest.mark.parametrize(
    ("output", "error", "match"),
    [
        ("", SensorUnavailableError, "no rail with both current and voltage.*Raspberry Pi 5"),
        ('error=1 error_msg="Command not registered"\n', SensorUnavailableError, "Command not registered"),
        ("failed to open vchiq instance\n", SensorPermissionError, "video"),
    ],
    ids=["empty", "pi4-error-msg", "no-video-group"],
)
def test_unusable_outputs_are_unavailable_with_a_reason(output, error, match):
    with pytest.raises(error, match=match):
        RpiPmicMeter(_runner(output))


def test_missing_vcgencmd_and_permission_errors_name_the_fix():
    def missing(argv):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    def denied(argv):
        raise PermissionError(13, "Permission denied")

    with pytest.raises(SensorUnavailableError, match="raspi-utils"):
        RpiPmicMeter(missing)
    with pytest.raises(SensorPermissionError, match="`video` group"):
        RpiPmicMeter(denied)


def test_a_command_failure_mid_run_is_a_read_error():
    calls = {"n": 0}

    def flaky(argv):
        calls["n"] += 1
        if calls["n"] > 1:
            raise SensorReadError("`vcgencmd pmic_read_adc` exited with 255: mailbox timeout")
        return PI5_REV1

    meter = RpiPmicMeter(flaky)
    with pytest.raises(SensorReadError, match="mailbox timeout"):
        meter.read()


def test_a_rail_that_disappears_is_a_read_error_not_a_smaller_sum():
    without_hdmi = "\n".join(line for line in PI5_REV1.splitlines() if "HDMI_V" not in line)
    meter = RpiPmicMeter(_runner(PI5_REV1, without_hdmi))
    with pytest.raises(SensorReadError, match=r"no longer reports rail.*HDMI"):
        meter.read()
