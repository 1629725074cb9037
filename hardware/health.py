"""A device's health at a glance, from one telemetry sample.

These are the threshold rules an operator would apply by eye (and the rule baseline
the predictive health model is compared against): critical XIDs, pending row remaps,
uncorrectable ECC, thermal slowdown, a device that fell off the bus.
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

    def __str__(self) -> str:
        return self.level if not self.reasons else f"{self.level}: {', '.join(self.reasons)}"


def health_status(sample: TelemetrySample) -> HealthStatus:
    if not sample.present:
        return HealthStatus("lost", ("fell off the bus",))
    critical: list[str] = []
    warn: list[str] = []
    xids = sorted(set(sample.xids) & CRITICAL_XIDS)
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
        for r in sample.clock_event_reasons
        if r in ("HwSlowdown", "HwThermalSlowdown", "SwThermalSlowdown", "HwPowerBrakeSlowdown")
    ]
    if throttles:
        warn.append("throttled " + "/".join(throttles))
    if critical:
        return HealthStatus("critical", tuple(critical + warn))
    if warn:
        return HealthStatus("warn", tuple(warn))
    return HealthStatus("ok", ())
