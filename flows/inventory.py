"""Flow `inventory`: refresh discovery, then read telemetry node by node.

sync ─┬─ telemetry(node 1) ─┐
      ├─ ...                ├─ fleet table artifact
      └─ telemetry(node n) ─┘
"""

from __future__ import annotations

from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.fleet import fleet_rows, partition_summary
from gpuflow.tasks.inventory import collect_node_telemetry_task, sync_inventory_task
from gpuflow.tasks.node_scope import node_backend
from prefect import flow
from prefect.artifacts import create_table_artifact


@flow(name="inventory", log_prints=True)
def inventory(cluster_block: str | None = None, node: str | None = None) -> dict:
    """``node``: that node's telemetry and table only (a host's own inventory run)."""
    cluster = load_cluster(cluster_block)
    report = sync_inventory_task(cluster)
    seen = node_backend(cluster.get_backend(), node)
    futures = [collect_node_telemetry_task.submit(cluster, n.name) for n in seen.discover()]
    samples = [s for f in futures for s in f.result()]
    rows = fleet_rows(seen)
    create_table_artifact(
        [
            {k: r[k] for k in ("node", "index", "sku", "temperature_c", "power_mw", "health")}
            | {"partitions": partition_summary(r["partitions"])}
            for r in rows
        ],
        key="fleet-inventory",
        description="Fleet after the inventory refresh",
    )
    return {"sync": report, "samples": len(samples), "devices": len(rows)}
