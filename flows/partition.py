"""Flow `partition`: validate a plan for the whole fleet, then apply it node by node.

validate ─┬─ snapshot(n) ─ apply(n) ─┐
          └─ ...                      ├─ (any failed: restore the nodes that changed) ─ layout artifact
"""

from __future__ import annotations

from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.partition import (
    apply_node_task,
    layout_rows_task,
    restore_node_task,
    snapshot_node_task,
    validate_plan_task,
)
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact


@flow(name="partition", log_prints=True)
def partition(
    plan_path: str,
    config: str,
    nodes: list[str] | None = None,
    cluster_block: str | None = None,
) -> dict:
    """Apply mig-config ``config`` of the mig-parted plan at ``plan_path``."""
    logger = get_run_logger()
    cluster = load_cluster(cluster_block)
    selected = validate_plan_task(cluster, plan_path, config, nodes)
    snapshots = {node: snapshot_node_task(cluster, node) for node in selected}
    futures = {node: apply_node_task.submit(cluster, plan_path, config, node) for node in selected}
    results, failed = {}, {}
    for node, fut in futures.items():
        fut.wait()
        state = fut.state
        if state.is_completed():
            results[node] = fut.result()
        else:
            failed[node] = str(state.message)
    if failed:
        # A half-applied fleet is worse than none: undo the nodes that did change.
        for node, res in results.items():
            if res["changed"]:
                logger.warning("restoring %s after failures on %s", node, sorted(failed))
                restore_node_task(cluster, node, snapshots[node])
        raise RuntimeError(
            f"partition plan failed on {sorted(failed)} and was rolled back: {failed}"
        )
    create_table_artifact(
        layout_rows_task(cluster, selected),
        key="partition-layout",
        description=f"Layout after applying config `{config}` of `{plan_path}`",
    )
    return results
