"""Fault classes of the twin and how each one unfolds on a device. Pure (dicts in, dicts out).

A device record (see hardware.sim.fleet) carries ``health`` (healthy | degrading |
failed | lost), the active degradation ``fault``, the ``failure`` that ended it, and the
persistent error counters NVML exposes. This module says what each class does to them,
and when; the fleet module runs the clock.

Classes with precursors:

* ``hbm`` - HBM degradation over a lead time L: corrected ECC errors grow (quadratically in
  its progress, up to the fault's ``errors_at_failure``, HBM_CORRECTED_AT_FAILURE when the
  fault has none), a row remap / page retirement becomes pending at 0.6 and again at 0.8 of
  its progress (XID 63, repeat offender), and at L an uncorrectable error (XID 48, 94, 95)
  or a remap failure (XID 64) fails the device. A fault with a stall (``stall_at``,
  ``stall_s``, hardware.sim.hazard) pauses at progress ``stall_at`` for ``stall_s`` (L
  includes the pause): nothing grows meanwhile.
* ``thermal`` - thermal-interface degradation: the thermal resistance rises
  (1 + (m_fail - 1) x^2, x = elapsed / L) until even idle power would pass the shutdown
  temperature at L; the physics then shows a temperature drift, throttling (SwThermal,
  then HwSlowdown) and the failure when the shutdown temperature is reached (GPU off the
  bus, XID 79).

Abrupt, no precursor: ``xid79`` (fell off the bus: present=False, calls raise
DeviceLostError) and ``ecc-uncorrectable`` (XID 48: the device fails, needs a reset).
Injected only: ``remap-pending`` (XID 63, the device keeps working) and ``app-fatal`` (an
application's fatal error, XID 13: what it takes down depends on the sharing mode).

The shape parameters here (growth curves, stage fractions, background error rates) are
estimates, chosen so precursors come in the published order; see docs/hardware.md.
"""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.skus import SkuSpec

DAY_S = 86_400.0

FAULT_KINDS: dict[str, str] = {
    "xid79": "GPU falls off the bus now (XID 79): abrupt, no precursor; the device is lost",
    "hbm": "HBM degradation starts now: corrected ECC growth, XID 63 remaps, then an "
    "uncorrectable error (XID 48/94/95) or remap failure (XID 64) fails it after a lead time",
    "thermal": "thermal-interface degradation starts now: thermal resistance drifts up; "
    "temperature drift, HwSlowdown, then shutdown at the shutdown temperature",
    "ecc-uncorrectable": "double-bit ECC error now (XID 48): the device fails until reset",
    "remap-pending": "a row remap / page retirement is pending now (XID 63); the device keeps working",
    "app-fatal": "an application fatal error (XID 13) in a tenant of the device",
}

HBM_STAGES: tuple[tuple[float, str], ...] = ((0.6, "remap"), (0.8, "remap"), (1.0, "final"))
HBM_CORRECTED_AT_FAILURE = 400  # estimate: errors at failure of a fault without its own level
BACKGROUND_SBE_PER_DAY = 0.02  # estimate: sporadic corrected errors of a healthy device
LEMON_SBE_PER_DAY = 5.0  # estimate: lemons carry most single-bit errors (Titan)
THERMAL_FAIL_MARGIN_C = 5.0  # at L, idle steady temperature = shutdown + this
THERMAL_PIECES = 200  # the thermal drift is integrated in this many constant pieces
APP_FATAL_XID = 13
LOST_XID = 79
XID_LOG_MAX = 256


def uses_row_remapping(s: SkuSpec) -> bool:
    """Ampere and later remap rows; V100 and the DCUs retire pages instead."""
    return s.vendor == "NVIDIA" and s.supports_mig


def zero_counters() -> dict[str, Any]:
    return {
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "retired_pages": 0,
        "remap_correctable": 0,
        "remap_uncorrectable": 0,
        "remap_pending": False,
        "remap_failure": False,
    }


def sku_final_xid(s: SkuSpec, xid: int) -> int:
    """Contained/uncontained ECC reporting (94/95) exists on row-remapping parts only."""
    if xid in (94, 95) and not uses_row_remapping(s):
        return 48
    return xid


def hbm_shape_fields(draw: Any) -> dict[str, float]:
    """The fault-dict fields of a hazard draw's HBM shape (empty for other classes)."""
    if draw.kind != "hbm" or draw.lead_s <= 0:
        return {}
    return {
        "errors_at_failure": draw.errors_at_failure,
        "stall_at": draw.stall_at,
        "stall_s": draw.stall_s,
    }


def new_fault(
    kind: str, source: str, onset_s: float, lead_s: float, final_xid: int
) -> dict[str, Any]:
    return {
        "kind": kind,
        "source": source,
        "onset_s": onset_s,
        "lead_s": max(lead_s, 1.0),
        "final_xid": final_xid,
        "done": 0,  # stages already applied
    }


def next_stage(fault: dict[str, Any]) -> tuple[float, str] | None:
    """(absolute time, stage name) of the fault's next stage, None when none is left."""
    if fault["kind"] == "hbm":
        stages = HBM_STAGES
    elif fault["kind"] == "thermal":
        stages = ((1.0, "final"),)  # a backstop: the physics normally fails it earlier
    else:
        return None
    if fault["done"] >= len(stages):
        return None
    frac, name = stages[fault["done"]]
    return time_at_progress(fault, frac), name


def _active_s(fault: dict[str, Any]) -> float:
    """The lead time less the stall: how long the degradation actually progresses."""
    return max(fault["lead_s"] - fault.get("stall_s", 0.0), 1.0)


def time_at_progress(fault: dict[str, Any], p: float) -> float:
    """When the fault reaches progress ``p`` (the stall, if any, delays what follows it)."""
    active = _active_s(fault)
    stall_at = fault.get("stall_at", 0.0)
    pause = fault.get("stall_s", 0.0) if stall_at > 0 and p > stall_at else 0.0
    return fault["onset_s"] + p * active + pause


def _progress(fault: dict[str, Any], t: float) -> float:
    elapsed = t - fault["onset_s"]
    stall_at = fault.get("stall_at", 0.0)
    active = _active_s(fault)
    if stall_at > 0 and elapsed > stall_at * active:
        elapsed = max(stall_at * active, elapsed - fault.get("stall_s", 0.0))
    return min(max(elapsed / active, 0.0), 1.0)


def hbm_errors_at_failure(fault: dict[str, Any]) -> float:
    return float(fault.get("errors_at_failure", HBM_CORRECTED_AT_FAILURE))


def hbm_corrected(fault: dict[str, Any] | None, t: float) -> int:
    if not fault or fault["kind"] != "hbm":
        return 0
    return int(hbm_errors_at_failure(fault) * _progress(fault, t) ** 2)


def thermal_fail_multiplier(s: SkuSpec, ambient_c: float) -> float:
    """Resistance multiplier at which idle power alone passes the shutdown temperature."""
    rise = s.shutdown_temp_c + THERMAL_FAIL_MARGIN_C - ambient_c
    return max(rise / (s.thermal_resistance_c_per_w * s.power_idle_mw / 1000.0), 1.0)


def thermal_multiplier(
    fault: dict[str, Any] | None, t: float, s: SkuSpec, ambient_c: float
) -> float:
    if not fault or fault["kind"] != "thermal":
        return 1.0
    m_fail = thermal_fail_multiplier(s, ambient_c)
    return 1.0 + (m_fail - 1.0) * _progress(fault, t) ** 2


def background_corrected(dev: dict[str, Any], t: float) -> int:
    """Sporadic corrected errors since the counters were last reset (lemons: many)."""
    rate = LEMON_SBE_PER_DAY if dev["lemon"] else BACKGROUND_SBE_PER_DAY
    phase = (dev["ordinal"] * 0.618034) % 1.0  # spread the devices' first error
    return int(max(t - dev["ecc_base_s"], 0.0) / DAY_S * rate + phase)


def counters_at(dev: dict[str, Any], t: float) -> dict[str, Any]:
    """The persistent error counters as telemetry reads them at time ``t``."""
    c = dict(dev["counters"])
    c["ecc_corrected"] += background_corrected(dev, t) + hbm_corrected(dev["fault"], t)
    return c


def apply_remap(s: SkuSpec, counters: dict[str, Any], correctable: bool) -> None:
    """A row remap (Ampere+) or page retirement (older parts) becomes pending."""
    if uses_row_remapping(s):
        counters["remap_correctable" if correctable else "remap_uncorrectable"] += 1
    else:
        counters["retired_pages"] += 1
    counters["remap_pending"] = True


def apply_uncorrectable(s: SkuSpec, counters: dict[str, Any], xid: int) -> str:
    """Count an uncorrectable error / remap failure; returns the failure reason."""
    counters["ecc_uncorrected"] += 1
    if xid == 64:
        counters["remap_failure"] = True
        return "row remapping / page retirement failed (XID 64)"
    apply_remap(s, counters, correctable=False)
    names = {48: "double-bit ECC error", 94: "contained ECC error", 95: "uncontained ECC error"}
    return f"{names.get(xid, 'uncorrectable ECC error')} (XID {xid})"
