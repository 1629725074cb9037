"""Fleet discovery and telemetry: what `gpuflow hw list` and the `inventory` flow show."""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.backend import Backend, DeviceLostError, NodeInfo, TelemetrySample
from gpuflow.hardware.health import HealthStatus, health_status
from prefect import task


def read_node_telemetry(backend: Backend, node: NodeInfo) -> list[TelemetrySample | None]:
    """One sample per device of ``node``; None for a device that no longer answers."""
    samples: list[TelemetrySample | None] = []
    for dev in node.devices:
        try:
            samples.append(backend.telemetry(node.name, dev.index))
        except DeviceLostError:
            samples.append(None)
    return samples


def fleet_rows(backend: Backend) -> list[dict[str, Any]]:
    """A row per device: identity, partitions, telemetry and health (JSON-ready)."""
    rows: list[dict[str, Any]] = []
    for node in backend.discover():
        for dev, sample in zip(node.devices, read_node_telemetry(backend, node), strict=True):
            try:
                parts = [p.to_dict() for p in backend.partitions(node.name, dev.index)]
            except DeviceLostError:
                parts = []
            status = health_status(sample) if sample else HealthStatus("lost", ("no answer",))
            rows.append(
                {
                    "node": node.name,
                    "region": node.region,
                    "role": node.role,
                    "index": dev.index,
                    "vendor": dev.vendor,
                    "sku": dev.sku,
                    "uuid": dev.uuid,
                    "memory_total_mb": dev.memory_total_mb,
                    "partitions": parts,
                    "temperature_c": round(sample.temperature_c, 1) if sample else None,
                    "power_mw": sample.power_mw if sample else None,
                    "utilization_ratio": sample.utilization_ratio if sample else None,
                    "memory_used_mb": sample.memory_used_mb if sample else None,
                    "health": status.level,
                    "health_reasons": list(status.reasons),
                    # Optional fields this device's backend cannot read (e.g. ECC and XIDs
                    # on a hy-smi DCU): its "ok" says nothing about those signals.
                    "telemetry_unreadable": sorted(sample.unreadable_fields()) if sample else [],
                }
            )
    return rows


def partition_summary(partitions: list[dict[str, Any]]) -> str:
    """'3g.20gb@4, 2g.10gb@0' or 'vdcu 20cu/8192MiB' for a table cell."""
    cells = []
    for p in partitions:
        if p["kind"] == "vdcu":
            cells.append(f"vdcu {p['compute_units']}cu/{p['memory_mb']}MiB")
        else:
            cells.append(f"{p['profile']}@{p['placement_start']}")
    return ", ".join(cells) or "-"


@task(name="discover-fleet", retries=2, retry_delay_seconds=2)
def discover_fleet_task(backend: Backend) -> list[NodeInfo]:
    return backend.discover()


@task(name="read-node-telemetry", retries=2, retry_delay_seconds=2)
def read_node_telemetry_task(backend: Backend, node: NodeInfo) -> list[TelemetrySample | None]:
    return read_node_telemetry(backend, node)
