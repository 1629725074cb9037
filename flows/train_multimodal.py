"""Flows `train_multimodal` and `compare_multimodal`.

train_multimodal: open run ─ place the gang (lease) ─ tag ─ train (one rank per unit:
head, vision tower, text tower) ─ release ─ evaluate (trained vs untrained) ─ record ─
close run.

The scheduler places the job's units as one gang of one SKU: 3 for the branch layout with
its head on a third device, 2 with the head beside the vision tower, 1 for the single
layout. compare_multimodal trains the same job in each layout as a child run of one parent
(same seed, same global batch, same SKU), and puts the throughput ratio, memory per
device and quality side by side on the parent.
"""

from __future__ import annotations

from typing import Any

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.multimodal.recording import EXPERIMENT, comparison_rows
from gpuflow.tasks.multimodal.spec import LAYOUTS, MultimodalSpec
from gpuflow.tasks.multimodal.tasks import (
    evaluate_task,
    open_multimodal_run_task,
    record_comparison_task,
    record_results_task,
    train_multimodal_task,
)
from gpuflow.tasks.scheduling.train_placement import (
    gang_placement_task,
    release_placement_task,
)
from gpuflow.tasks.tracking import fail_on_error, open_run
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.job import check_owned_node
from gpuflow.tasks.training.recording import close_run_task, tag_placement_task
from prefect import flow
from prefect.artifacts import create_table_artifact


@flow(name="train_multimodal", log_prints=True)
def train_multimodal(
    spec: MultimodalSpec,
    device: DeviceRequest | None = None,
    storage: CheckpointStorage | None = None,
    cluster_block: str | None = None,
    experiment: str = EXPERIMENT,
    parent_run_id: str | None = None,
    priority: int = 0,
    preempt: bool = False,
    wait_s: float = 0.0,
) -> dict[str, Any]:
    """Train ``spec`` on leased units in its layout; resumes from its newest checkpoint."""
    device = device or DeviceRequest()
    storage = storage or CheckpointStorage()
    cluster = load_cluster(cluster_block)
    run_id = open_multimodal_run_task(spec, experiment, parent_run_id)
    with fail_on_error(run_id):
        bindings = gang_placement_task(
            cluster,
            device,
            spec.job_id,
            spec.resolved_layout.world_size,
            priority=priority,
            preempt=preempt,
            wait_s=wait_s,
        )
        tag_placement_task(run_id, bindings[0])
        ok = False
        try:
            check_owned_node(cluster.get_inventory(), bindings[0], spec.job_id)
            ranks = train_multimodal_task(spec, storage, cluster, bindings, run_id)
            ok = True
        finally:
            release_placement_task(cluster, bindings[0], spec.job_id, ok=ok)
        trained, untrained = evaluate_task(spec, storage)
        figures = record_results_task(run_id, ranks, trained, untrained)
    close_run_task(run_id, "FINISHED")
    return {
        "run_id": run_id,
        "job_id": spec.job_id,
        "layout": spec.resolved_layout.name,
        "roles": [ranks[r]["role"] for r in sorted(ranks)],
        "resource_ids": [ranks[r]["resource_id"] for r in sorted(ranks)],
        "sku": bindings[0].resource.sku,
        "figures": figures,
        "quality": trained,
        "untrained": untrained,
    }


@flow(name="compare_multimodal", log_prints=True)
def compare_multimodal(
    spec: MultimodalSpec,
    layouts: list[str] | None = None,
    device: DeviceRequest | None = None,
    storage: CheckpointStorage | None = None,
    cluster_block: str | None = None,
) -> dict[str, Any]:
    layouts = layouts or ["single", "branch"]
    bad = [name for name in layouts if name not in LAYOUTS]
    if bad or len(set(layouts)) != len(layouts):
        raise ValueError(f"layouts {layouts}: name each of {', '.join(LAYOUTS)} at most once")
    parent_id = open_run(
        EXPERIMENT,
        run_name=f"{spec.job_id}-compare",
        tags={"gpuflow.comparison": "layout", "gpuflow.baseline": "single"},
        params={"size": spec.size, "steps": spec.steps, "batch_size": spec.batch_size},
    )
    with fail_on_error(parent_id):
        results: dict[str, dict[str, Any]] = {}
        asked = device
        for name in layouts:
            job = spec.model_copy(update={"layout": name, "job_id": f"{spec.job_id}-{name}"})
            results[name] = train_multimodal(
                job,
                device=asked,
                storage=storage,
                cluster_block=cluster_block,
                parent_run_id=parent_id,
            )
            # Every arm on the SKU the first one got: a ratio never compares two SKUs.
            asked = (asked or DeviceRequest()).model_copy(update={"sku": results[name]["sku"]})
        rows = comparison_rows(results)
        record_comparison_task(parent_id, rows)
    close_run_task(parent_id, "FINISHED")
    create_table_artifact(rows, key="multimodal-comparison", description=f"{spec.size} layouts")
    return {"parent_run_id": parent_id, "rows": rows, "runs": results}
