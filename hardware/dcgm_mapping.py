"""gpuflow's telemetry in DCGM exporter's words: which TelemetrySample field is which DCGM
field, in which unit, and the labels a device or a MIG instance carries.

Platform engineers already chart NVIDIA fleets from NVIDIA's dcgm-exporter, so a field with
a DCGM counterpart goes out under DCGM's name and unit, for every vendor (a Hygon DCU's
temperature is DCGM_FI_DEV_GPU_TEMP too: one query covers the mixed fleet). Sources: the
names, types and help texts of dcgm-exporter's ``etc/default-counters.csv``
(github.com/NVIDIA/dcgm-exporter); the fields outside that file (FB_TOTAL, POWER_MGMT_LIMIT,
ECC, ROW_REMAP_PENDING, CLOCKS_EVENT_REASONS) from DCGM's ``dcgmlib/dcgm_fields.h``
(github.com/NVIDIA/DCGM); the labels from dcgm-exporter's
``internal/pkg/rendermetrics/render_metrics.go`` template (``gpu``, ``UUID``,
``modelName``, ``Hostname``, and ``GPU_I_PROFILE``/``GPU_I_ID`` on a GPU instance).

A field the device's backend cannot read (None in the sample) has no series at all:
absent, not zero, so "no ECC errors" never shows for a DCU that cannot count them.

Pure: the standard library and hardware/ only, so any process can map a sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuflow.hardware.backend import (
    Backend,
    ClockState,
    DeviceInfo,
    Partition,
    TelemetrySample,
)
from gpuflow.hardware.nvml.telemetry import CLOCK_EVENT_BITS
from gpuflow.hardware.skus import sku as lookup_sku

# The exposition type. DCGM's counters (energy, ECC, remapped rows) keep their exact DCGM
# names and go out untyped ("unknown"): prometheus_client writes a counter's samples as
# <name>_total (OpenMetrics), which would rename what every DCGM dashboard queries;
# PromQL's rate() and increase() read an untyped series all the same.
MetricKind = Literal["gauge", "counter", "unknown"]

# dcgm-exporter's label names (render_metrics.go), and gpuflow's one addition to them.
GPU, UUID, MODEL_NAME, HOSTNAME = "gpu", "UUID", "modelName", "Hostname"
GPU_I_PROFILE, GPU_I_ID = "GPU_I_PROFILE", "GPU_I_ID"
VENDOR = "vendor"  # NVIDIA | Hygon: a mixed fleet's dashboards split by it


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: its name, exposition type, unit, help, the TelemetrySample
    field it comes from, and how to read that field (None: the backend cannot)."""

    name: str
    kind: MetricKind
    unit: str
    help: str
    source: str  # the gpuflow field (docs/telemetry.md's mapping table lists it)
    read: Callable[[Any], float | None]  # of a TelemetrySample (a ClockState: CLOCK_SPECS)

    @property
    def dcgm(self) -> bool:
        return self.name.startswith("DCGM_FI_")


def _opt(value: float | bool | None) -> float | None:
    return None if value is None else float(value)


def clock_event_mask(reasons: Sequence[str]) -> int:
    """NVML's clock-event bitmask (what DCGM_FI_DEV_CLOCKS_EVENT_REASONS holds) of the
    reason names a sample carries."""
    return sum(CLOCK_EVENT_BITS.get(r, 0) for r in set(reasons))


def _mask(s: TelemetrySample) -> float | None:
    return None if s.clock_event_reasons is None else float(clock_event_mask(s.clock_event_reasons))


# Also what a GPU instance reports of itself (its memory size).
FB_TOTAL = MetricSpec(
    "DCGM_FI_DEV_FB_TOTAL", "gauge", "MiB",
    "Total framebuffer memory (in MiB); on a GPU instance, the instance's.",
    "memory_total_mb", lambda s: float(s.memory_total_mb),
)  # fmt: skip


# Every backend reads these (TelemetrySample's fields up to power_limit_mw).
ALWAYS_READ: tuple[MetricSpec, ...] = (
    MetricSpec(
        "DCGM_FI_DEV_GPU_TEMP", "gauge", "°C", "GPU temperature (in C).", "temperature_c",
        lambda s: s.temperature_c,
    ),
    MetricSpec(
        "DCGM_FI_DEV_POWER_USAGE", "gauge", "W", "Power draw (in W).", "power_mw",
        lambda s: s.power_mw / 1000.0,
    ),
    MetricSpec(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "unknown", "mJ",
        "Total energy consumption since boot (in mJ); a DCGM counter.", "energy_mj",
        lambda s: float(s.energy_mj),
    ),
    MetricSpec(
        "DCGM_FI_DEV_SM_CLOCK", "gauge", "MHz", "SM clock frequency (in MHz).", "sm_clock_mhz",
        lambda s: float(s.sm_clock_mhz),
    ),
    MetricSpec(
        "DCGM_FI_DEV_GPU_UTIL", "gauge", "%", "GPU utilization (in %).", "utilization_ratio",
        lambda s: round(s.utilization_ratio * 100.0, 6),
    ),
    MetricSpec(
        "DCGM_FI_DEV_FB_USED", "gauge", "MiB", "Framebuffer memory used (in MiB).",
        "memory_used_mb", lambda s: float(s.memory_used_mb),
    ),
    MetricSpec(
        "DCGM_FI_DEV_FB_FREE", "gauge", "MiB", "Framebuffer memory free (in MiB).",
        "memory_total_mb - memory_used_mb",
        lambda s: float(max(s.memory_total_mb - s.memory_used_mb, 0)),
    ),
    FB_TOTAL,
    MetricSpec(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "W", "Current power limit (in W).",
        "power_limit_mw", lambda s: s.power_limit_mw / 1000.0,
    ),
)  # fmt: skip


def ecc_specs(ecc_counter: str = "volatile") -> tuple[MetricSpec, MetricSpec]:
    """The ECC totals under DCGM's volatile names (since the driver loaded, cleared by a
    reset: NVML's default and the twin's meaning) or its aggregate ones (the device's
    lifetime: NvmlBackend(ecc_counter="aggregate"))."""
    kind = "AGG" if ecc_counter == "aggregate" else "VOL"
    word = "aggregate (lifetime)" if kind == "AGG" else "volatile (since the driver loaded)"
    return (
        MetricSpec(
            f"DCGM_FI_DEV_ECC_SBE_{kind}_TOTAL", "unknown", "errors",
            f"Total number of single-bit {word} ECC errors; a DCGM counter.",
            "ecc_corrected_total", lambda s: _opt(s.ecc_corrected_total),
        ),
        MetricSpec(
            f"DCGM_FI_DEV_ECC_DBE_{kind}_TOTAL", "unknown", "errors",
            f"Total number of double-bit {word} ECC errors; a DCGM counter.",
            "ecc_uncorrected_total", lambda s: _opt(s.ecc_uncorrected_total),
        ),
    )  # fmt: skip


# The optional fields (backend.TELEMETRY_FIELDS) besides ECC and XIDs.
OPTIONAL: tuple[MetricSpec, ...] = (
    MetricSpec(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "unknown", "rows",
        "Number of remapped rows for correctable errors; a DCGM counter.",
        "remapped_rows_correctable", lambda s: _opt(s.remapped_rows_correctable),
    ),
    MetricSpec(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "unknown", "rows",
        "Number of remapped rows for uncorrectable errors; a DCGM counter.",
        "remapped_rows_uncorrectable", lambda s: _opt(s.remapped_rows_uncorrectable),
    ),
    MetricSpec(
        "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "0/1",
        "Whether remapping of rows is pending (a GPU reset applies it).",
        "remapped_rows_pending", lambda s: _opt(s.remapped_rows_pending),
    ),
    MetricSpec(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "0/1", "Whether remapping of rows has failed.",
        "remapped_rows_failure", lambda s: _opt(s.remapped_rows_failure),
    ),
    MetricSpec(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "bitmask",
        "Current clock event (throttle) reasons, NVML's bitmask.",
        "clock_event_reasons", _mask,
    ),
    # DCGM splits retired pages by cause (RETIRED_SBE / RETIRED_DBE); gpuflow reads their
    # sum, which has no DCGM name.
    MetricSpec(
        "gpuflow_retired_pages", "gauge", "pages",
        "Retired memory pages, both causes (Volta; Ampere and later remap rows instead).",
        "retired_pages", lambda s: _opt(s.retired_pages),
    ),
)  # fmt: skip

# The applications clocks, from Backend.clocks (the interface has no current memory
# clock, so DCGM_FI_DEV_MEM_CLOCK is absent everywhere; these are the nearest it reads).
CLOCK_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "DCGM_FI_DEV_APP_SM_CLOCK", "gauge", "MHz", "SM application clock (in MHz).",
        "clocks().applications_sm_clock_mhz",
        lambda c: _opt(c.applications_sm_clock_mhz),
    ),
    MetricSpec(
        "DCGM_FI_DEV_APP_MEM_CLOCK", "gauge", "MHz", "Memory application clock (in MHz).",
        "clocks().applications_mem_clock_mhz",
        lambda c: _opt(c.applications_mem_clock_mhz),
    ),
)  # fmt: skip


def clock_values(clocks: ClockState) -> list[tuple[MetricSpec, float]]:
    """(metric, value) for the applications clocks the device reports."""
    return [(spec, v) for spec in CLOCK_SPECS if (v := spec.read(clocks)) is not None]


# XIDs are events, not a reading: the exporter folds each sample's list into these.
XID_LAST = MetricSpec(
    "DCGM_FI_DEV_XID_ERRORS", "gauge", "XID",
    "Value of the last XID error encountered (0: none since the exporter started).",
    "xids", lambda s: None,
)  # fmt: skip
XID_COUNT = MetricSpec(
    "gpuflow_xid_errors", "counter", "events",
    "XID events seen since the exporter started, by XID (none is missed between scrapes).",
    "xids", lambda s: None,
)  # fmt: skip


def sample_specs(ecc_counter: str = "volatile") -> tuple[MetricSpec, ...]:
    """Every metric read straight from a sample, in exposition order."""
    return ALWAYS_READ + ecc_specs(ecc_counter) + OPTIONAL


def sample_values(
    sample: TelemetrySample, ecc_counter: str = "volatile"
) -> list[tuple[MetricSpec, float]]:
    """(metric, value) for every field this sample carries. A device that fell off the bus
    answers nothing (its sample's zeros are not readings), so it has none."""
    if not sample.present:
        return []
    out = []
    for spec in sample_specs(ecc_counter):
        value = spec.read(sample)
        if value is not None:
            out.append((spec, value))
    return out


def device_labels(dev: DeviceInfo) -> dict[str, str]:
    """dcgm-exporter's device labels (``gpu`` is the index on its node; ``Hostname`` the
    node, which NVML and hy-smi name after the host) plus the vendor."""
    return {
        GPU: str(dev.index),
        UUID: dev.uuid,
        MODEL_NAME: dev.sku,
        HOSTNAME: dev.node,
        VENDOR: dev.vendor,
    }


def partition_labels(dev: DeviceInfo, partition: Partition, instance_id: int) -> dict[str, str]:
    """A GPU instance's labels, as dcgm-exporter gives a MIG instance: its GPU's labels
    (``UUID`` stays the GPU's) plus GPU_I_PROFILE and GPU_I_ID. A vDCU gets the same
    shape, its profile "vdcu"."""
    return {
        **device_labels(dev),
        GPU_I_PROFILE: partition.profile,
        GPU_I_ID: str(instance_id),
    }


def placement_instance_id(start: int, size: int, memory_slices: int) -> int | None:
    """A stable id for a GPU instance from its placement: its position in a binary tree of
    the memory slices (0 the whole GPU, 1-2 its halves, 3-6 quarters, 7-14 eighths). Two
    instances that do not overlap never share one, and it survives other instances being
    created or destroyed. None when the geometry is not a power-of-two tree."""
    if memory_slices < 1 or size < 1 or size > memory_slices or start < 0:
        return None
    powers = all(n & (n - 1) == 0 for n in (memory_slices, size))
    if not powers or start % size or start + size > memory_slices:
        return None
    return memory_slices // size - 1 + start // size


def _memory_slices(sku_name: str) -> int | None:
    try:
        geometry = lookup_sku(sku_name).mig_geometry
    except (KeyError, ValueError):
        return None
    return geometry.memory_slices if geometry is not None else None


def instance_ids(
    backend: Backend, dev: DeviceInfo, partitions: Sequence[Partition]
) -> dict[str, int]:
    """GPU_I_ID of each partition: the driver's number where the backend has one
    (Backend.gpu_instance_ids), else derived: a MIG instance's from its placement in the
    SKU's memory slices, a vDCU's from its position among the device's vDCUs (hy-smi
    removes a DCU's vDCUs all at once, so positions do not shift under it)."""
    if not partitions:
        return {}
    known: Mapping[str, int] = backend.gpu_instance_ids(dev.node, dev.index)
    memory_slices = _memory_slices(dev.sku)
    out: dict[str, int] = {}
    taken = set(known.values())
    for position, p in enumerate(partitions):
        if p.uuid in known:
            out[p.uuid] = known[p.uuid]
            continue
        derived = None
        if p.kind == "mig" and memory_slices and p.placement_start is not None:
            derived = placement_instance_id(p.placement_start, p.placement_size or 0, memory_slices)
        if derived is None or derived in taken:
            derived = position
            while derived in taken:
                derived += 1
        taken.add(derived)
        out[p.uuid] = derived
    return out


__all__ = [
    "ALWAYS_READ",
    "CLOCK_SPECS",
    "FB_TOTAL",
    "GPU",
    "GPU_I_ID",
    "GPU_I_PROFILE",
    "HOSTNAME",
    "MODEL_NAME",
    "OPTIONAL",
    "UUID",
    "VENDOR",
    "XID_COUNT",
    "XID_LAST",
    "MetricSpec",
    "clock_event_mask",
    "clock_values",
    "device_labels",
    "ecc_specs",
    "instance_ids",
    "partition_labels",
    "placement_instance_id",
    "sample_specs",
    "sample_values",
]
