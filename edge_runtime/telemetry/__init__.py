"""Power telemetry: meters behind one interface, a sampling thread, and energy per phase (docs/architecture.md §9).

Every figure carries its measurement boundary; a figure no sensor produced is labelled "estimate".
Sensor facts and sample outputs: docs/research/power-telemetry.md.
"""

from edge_runtime.telemetry.amdgpu import AmdgpuMeter
from edge_runtime.telemetry.base import METER_KINDS, Boundary, MeterKind, PowerMeter, Reading, Sysfs
from edge_runtime.telemetry.estimate import CpuEstimateMeter
from edge_runtime.telemetry.ina3221 import Ina3221Meter
from edge_runtime.telemetry.ina3221x import Ina3221xMeter
from edge_runtime.telemetry.integrate import Gap, Sample
from edge_runtime.telemetry.nvml import NvmlMeter
from edge_runtime.telemetry.rapl import RaplMeter
from edge_runtime.telemetry.results import EnergyReport, IdleBaseline, PhaseEnergy
from edge_runtime.telemetry.rpi_pmic import RpiPmicMeter, parse_pmic_adc
from edge_runtime.telemetry.sampler import Sampler
from edge_runtime.telemetry.select import MeterChoice, MeterOptions, choose_meter, meter_for_profile, open_meter

__all__ = [
    "METER_KINDS",
    "AmdgpuMeter",
    "Boundary",
    "CpuEstimateMeter",
    "EnergyReport",
    "Gap",
    "IdleBaseline",
    "Ina3221Meter",
    "Ina3221xMeter",
    "MeterChoice",
    "MeterKind",
    "MeterOptions",
    "NvmlMeter",
    "PhaseEnergy",
    "PowerMeter",
    "RaplMeter",
    "Reading",
    "RpiPmicMeter",
    "Sample",
    "Sampler",
    "Sysfs",
    "choose_meter",
    "meter_for_profile",
    "open_meter",
    "parse_pmic_adc",
]
