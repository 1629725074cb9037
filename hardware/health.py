"""A device's health at a glance, from one telemetry sample.

These are the threshold rules an operator would apply by eye (and the rule baseline
the predictive health model is compared against): critical XIDs, pending row remaps,
uncorrectable ECC, thermal slowdown, a device that fell off the bus. A rule whose input
the device's backend cannot read (None in the sample: no ECC or XIDs from hy-smi, no row
remapping on a V100) cannot fire: the status says so in ``unreadable`` rather than
passing the device as clean on evidence nobody has.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow.hardware.backend import TelemetrySample

# XIDs that mean the device itself is in trouble (DESIGN.md section 4). Application
# XIDs (13, 31, 43, 45, 68, 109) are not here: NVIDIA's device plugin ignores them too.
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
HOT_TEMPERATURE_C = 85.0


@dataclass(frozen=True)
class HealthStatus:
    level: str  # "ok" | "warn" | "critical" | "lost"
    reasons: tuple[str, ...]
    unreadable: tuple[str, ...] = ()  # the optional telemetry fields the rules lacked

    def __str__(self) -> str:
        return self.level if not self.reasons else f"{self.level}: {', '.join(self.reasons)}"


def health_status(sample: TelemetrySample) -> HealthStatus:
    if not sample.present:
        return HealthStatus("lost", ("fell off the bus",))
    critical: list[str] = []
    warn: list[str] = []
    unreadable = tuple(sorted(sample.unreadable_fields()))
    xids = sorted(set(sample.xids or ()) & CRITICAL_XIDS)
    if xids:
        critical.append("XID " + "/".join(str(x) for x in xids))
    if sample.remapped_rows_failure:
        critical.append("row remap failed")
    if sample.remapped_rows_pending:
        critical.append("row remap pending")
    if sample.ecc_uncorrected_total:
        critical.append(f"{sample.ecc_uncorrected_total} uncorrectable ECC")
    if sample.temperature_c > HOT_TEMPERATURE_C:
        warn.append(f"{sample.temperature_c:.0f} C")
    throttles = [
        r
        for r in sample.clock_event_reasons or ()
        if r in ("HwSlowdown", "HwThermalSlowdown", "SwThermalSlowdown", "HwPowerBrakeSlowdown")
    ]
    if throttles:
        warn.append("throttled " + "/".join(throttles))
    if critical:
        return HealthStatus("critical", tuple(critical + warn), unreadable)
    if warn:
        return HealthStatus("warn", tuple(warn), unreadable)
    return HealthStatus("ok", (), unreadable)
