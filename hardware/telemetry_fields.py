"""Which optional telemetry fields each real backend reads, per device family.

The twin reports, per SKU, exactly what the real backend of that SKU would (so what a
health model learns on the twin holds on the fleet), and docs/hardware.md ("Telemetry
per backend") tabulates the same sets with their sources. The NVML backend does not
take these sets on trust: it probes each device (hardware.nvml.telemetry.probe_fields)
and the tests check that a fake A100 and a fake V100 probe to the sets below.

Pure: the standard library and hardware.backend only, so the twin can use it anywhere.
"""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.backend import TELEMETRY_FIELDS, Vendor

ECC_FIELDS = frozenset({"ecc_corrected_total", "ecc_uncorrected_total"})
ROW_REMAP_FIELDS = frozenset(
    {
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    }
)
PAGE_RETIREMENT_FIELDS = frozenset({"retired_pages"})

# NVML on Ampere and later (A100, H100, H200): nvmlDeviceGetTotalEccErrors,
# nvmlDeviceGetRemappedRows, nvmlDeviceGetCurrentClocksEventReasons, XIDs through an
# event set. nvmlDeviceGetRetiredPages answers NOT_SUPPORTED: these parts remap rows
# instead of retiring pages (NVIDIA's memory error management guide).
NVML_ROW_REMAPPING: frozenset[str] = ECC_FIELDS | ROW_REMAP_FIELDS | {"clock_event_reasons", "xids"}
# NVML on Volta (V100): ECC totals and retired pages; nvmlDeviceGetRemappedRows is
# NOT_SUPPORTED (row remapping is Ampere+).
NVML_PAGE_RETIREMENT: frozenset[str] = (
    ECC_FIELDS | PAGE_RETIREMENT_FIELDS | {"clock_event_reasons", "xids"}
)
# hy-smi, as hardware.hygon.telemetry reads it (--showtemp --showpower --showuse
# --showmeminfo vram --showmaxpower --showclocks --json): temperature, power, use, VRAM,
# the power cap and sclk. No public hy-smi sample shows ECC or page counts in that output,
# no clock-event (throttle) reasons and no XID-like event stream, so none of the optional
# fields exists on a DCU.
HY_SMI: frozenset[str] = frozenset()

assert NVML_ROW_REMAPPING <= TELEMETRY_FIELDS and NVML_PAGE_RETIREMENT <= TELEMETRY_FIELDS


def real_backend_fields(vendor: Vendor, row_remapping: bool) -> frozenset[str]:
    """What the real backend of a device reads: hy-smi for Hygon, NVML for NVIDIA (by
    whether the part remaps rows, i.e. Ampere or later)."""
    if vendor == "Hygon":
        return HY_SMI
    return NVML_ROW_REMAPPING if row_remapping else NVML_PAGE_RETIREMENT


def without_unreadable(values: dict[str, Any], readable: frozenset[str]) -> dict[str, Any]:
    """``values`` (field -> value) with every optional field not in ``readable`` set to
    None: how a backend blanks what it cannot read."""
    return {
        k: (v if k not in TELEMETRY_FIELDS or k in readable else None) for k, v in values.items()
    }


__all__ = [
    "ECC_FIELDS",
    "HY_SMI",
    "NVML_PAGE_RETIREMENT",
    "NVML_ROW_REMAPPING",
    "PAGE_RETIREMENT_FIELDS",
    "ROW_REMAP_FIELDS",
    "real_backend_fields",
    "without_unreadable",
]
