"""The multi-modal flows' steps as Prefect tasks; the logic is in plain functions."""

from __future__ import annotations

from typing import Any

from gpuflow.tasks.multimodal.checkpoint import load_model
from gpuflow.tasks.multimodal.data import CaptionedDigits
from gpuflow.tasks.multimodal.job import run_multimodal_job
from gpuflow.tasks.multimodal.loop import model_config
from gpuflow.tasks.multimodal.model import ClipModel
from gpuflow.tasks.multimodal.quality import evaluate
from gpuflow.tasks.multimodal.recording import (
    open_multimodal_run,
    record_comparison,
    record_multimodal_results,
)
from gpuflow.tasks.multimodal.spec import MultimodalSpec
from gpuflow.tasks.training.checkpoint import checkpoint_manager
from prefect import task
from prefect.cache_policies import NONE


def evaluate_job(spec: MultimodalSpec, storage: Any) -> tuple[dict[str, float], dict[str, float]]:
    """(the newest checkpoint's quality, the same model untrained) on the held-out split."""
    config = model_config(spec)
    held_out = CaptionedDigits("test", image_size=config.image_size)
    manager = checkpoint_manager(storage, spec.job_id, config.fingerprint(spec.text_int8))
    loaded = load_model(manager, config, spec.text_int8)
    if loaded is None:
        raise RuntimeError(f"job {spec.job_id!r} finished without a checkpoint to evaluate")
    untrained = ClipModel.build(config, spec.seed, text_int8=spec.text_int8)
    return evaluate(loaded[0], held_out), evaluate(untrained, held_out)


open_multimodal_run_task = task(open_multimodal_run, name="open-multimodal-run", cache_policy=NONE)
# No retries: torchelastic restarts failed ranks itself (spec.max_restarts) from the last
# committed checkpoint.
train_multimodal_task = task(run_multimodal_job, name="train-multimodal", cache_policy=NONE)
evaluate_task = task(evaluate_job, name="evaluate-multimodal", cache_policy=NONE, retries=1)
record_results_task = task(
    record_multimodal_results, name="record-multimodal", cache_policy=NONE, retries=2
)
record_comparison_task = task(
    record_comparison, name="record-multimodal-comparison", cache_policy=NONE, retries=2
)
