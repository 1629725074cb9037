"""Inventory work: refresh the durable inventory from discovery and telemetry."""

from __future__ import annotations

from typing import Any

from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.backend import TelemetrySample
from gpuflow.tasks.fleet import read_node_telemetry
from prefect import task
from prefect.cache_policies import NONE


def sync_inventory(cluster: GpuCluster) -> dict[str, Any]:
    """Discovery and partitions into the inventory; returns what changed."""
    backend = cluster.get_backend()
    report = cluster.get_inventory().sync(backend)
    return report.to_dict() if hasattr(report, "to_dict") else dict(vars(report))


def collect_node_telemetry(cluster: GpuCluster, node: str) -> list[TelemetrySample]:
    """One telemetry sample per answering device of ``node``, recorded in the inventory."""
    backend = cluster.get_backend()
    info = next((n for n in backend.discover() if n.name == node), None)
    if info is None:
        raise ValueError(f"node {node!r} is not in the fleet")
    samples = [s for s in read_node_telemetry(backend, info) if s is not None]
    cluster.get_inventory().record_telemetry(samples)
    return samples


sync_inventory_task = task(
    sync_inventory, name="sync-inventory", retries=2, retry_delay_seconds=2, cache_policy=NONE
)
collect_node_telemetry_task = task(
    collect_node_telemetry,
    name="collect-telemetry",
    retries=2,
    retry_delay_seconds=2,
    cache_policy=NONE,
)
