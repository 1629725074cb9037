"""Partition work: validate a plan for the whole fleet, apply it per node, undo a node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.partition import (
    apply_plan,
    dump_yaml,
    export_layout,
    load_plan,
    plan_layouts,
)
from gpuflow.hardware.partition.guard import InventoryGuard
from prefect import task
from prefect.cache_policies import NONE


def validate_plan(
    cluster: GpuCluster, plan_path: str, config: str, nodes: list[str] | None
) -> list[str]:
    """Validate the whole plan against every device first; return the nodes it selects."""
    plan = load_plan(Path(plan_path))
    layouts = plan_layouts(cluster.get_backend(), plan, config, nodes=nodes)
    return sorted({layout.node for layout in layouts})


def snapshot_node(cluster: GpuCluster, node: str) -> str:
    """The node's current layout as a plan document (what a restore re-applies): the
    extended form, whose ``nodes`` keep a restore on this node (and vDCUs included)."""
    return dump_yaml(export_layout(cluster.get_backend(), nodes=[node], with_nodes=True))


def apply_node(cluster: GpuCluster, plan_path: str, config: str, node: str) -> dict[str, Any]:
    """Apply the plan to one node; apply_plan restores that node itself if a step fails."""
    backend = cluster.get_backend()
    guard = InventoryGuard(cluster.get_inventory())  # busy devices refused, re-synced after
    report = apply_plan(backend, load_plan(Path(plan_path)), config, nodes=[node], guard=guard)
    return {
        "node": node,
        "changed": [d.index for d in report.devices if d.changed],
        "unchanged": [d.index for d in report.devices if not d.changed],
        "jobs_requeued": report.settled.get("jobs_requeued", []),
    }


def restore_node(cluster: GpuCluster, node: str, snapshot_yaml: str) -> None:
    """Put a node back to a snapshot taken before the flow changed it."""
    backend = cluster.get_backend()
    guard = InventoryGuard(cluster.get_inventory())
    apply_plan(backend, load_plan(snapshot_yaml), "current", nodes=[node], guard=guard)


def layout_rows(cluster: GpuCluster, nodes: list[str]) -> list[dict[str, Any]]:
    """One row per partition (or per unpartitioned device) of ``nodes``, for a table artifact."""
    backend = cluster.get_backend()
    rows: list[dict[str, Any]] = []
    for node in backend.discover():
        if node.name not in nodes:
            continue
        for dev in node.devices:
            parts = backend.partitions(node.name, dev.index)
            if not parts:
                rows.append(
                    {
                        "node": node.name,
                        "index": dev.index,
                        "sku": dev.sku,
                        "partition": "-",
                        "memory_mb": dev.memory_total_mb,
                        "placement": "-",
                    }
                )
            for p in parts:
                rows.append(
                    {
                        "node": node.name,
                        "index": dev.index,
                        "sku": dev.sku,
                        "partition": p.profile if p.kind == "mig" else f"vdcu {p.compute_units}cu",
                        "memory_mb": p.memory_mb,
                        "placement": "-" if p.placement_start is None else p.placement_start,
                    }
                )
    return rows


# Tasks take the GpuCluster block (plain data) rather than a backend object, and never
# cache: a partition layout must be read fresh each time.
validate_plan_task = task(validate_plan, name="validate-plan", cache_policy=NONE)
snapshot_node_task = task(snapshot_node, name="snapshot-node", cache_policy=NONE)
apply_node_task = task(
    apply_node, name="apply-node", retries=2, retry_delay_seconds=2, cache_policy=NONE
)
restore_node_task = task(
    restore_node, name="restore-node", retries=3, retry_delay_seconds=2, cache_policy=NONE
)
layout_rows_task = task(layout_rows, name="read-layout", cache_policy=NONE)
