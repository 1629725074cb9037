"""The tour's precision step: the compare_precision flow trains the same byte-level LM
under fp32 and AutoPrecision and records both runs, and the comparison, in MLflow."""

from __future__ import annotations

from typing import Any


def compare(steps: int, batch_size: int = 16) -> dict[str, Any]:
    """fp32 vs auto on an A100 of the twin; the flow's result (rows, MLflow parent run)."""
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.flows.compare_precision import compare_precision
    from gpuflow.tasks.training.binding import DeviceRequest
    from gpuflow.tasks.training.spec import TrainSpec

    # The byte-level LM of DESIGN.md section 5, kept short for the tour.
    spec = TrainSpec(
        job_id="tour-compare",
        model="byte-lm",
        steps=steps,
        batch_size=batch_size,
        checkpoint_interval=steps,
    )
    return compare_precision(
        spec,
        candidates=["auto"],
        device=DeviceRequest(sku="a100-40gb"),
        storage=CheckpointStorage(),
    )
