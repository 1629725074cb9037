"""Running a placed job in this process: the `schedule` flow's launcher when no `train`
deployment exists (a laptop, CI, the tests), and what a test thread uses to play a
running training job.

It is the train flow's body on the scheduler's lease: preflight, an MLflow run in the
train experiment with the placement as tags, the training loop (which polls the control
channel every step and acknowledges a checkpoint-and-stop with its checkpoint), then the
outcome reported back to the scheduler. A job stopped on request is left "stopped" for
the next pass to re-queue; it resumes from that checkpoint when placed again. An attempt
whose lease was lost (LeaseLostError) reports nothing: a newer attempt owns the job.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.hardware.inventory import LeaseLostError
from gpuflow.tasks.launching import Launcher, LaunchOrder, LaunchReceipt
from gpuflow.tasks.scheduling.launch import gang_spec, launch_placed
from gpuflow.tasks.scheduling.service import SchedulerService
from gpuflow.tasks.scheduling.train_placement import gang_placement, release_placement
from prefect import task
from prefect.cache_policies import NONE

log = logging.getLogger(__name__)


def run_scheduled_job(
    cluster: Any,
    storage: Any,
    job_id: str,
    experiment: str | None = None,
) -> dict[str, Any]:
    """Train scheduled job ``job_id`` on its placement; returns the TrainResult as a dict
    with ``run_id`` and ``resource_id``. Raises if the job has no train spec. This
    process's step observers (tasks.training.control) see its steps, a gang's rank 0's
    through the launcher's relay."""
    import mlflow
    from gpuflow.tasks.tracking import flat_params, tracking_uri, use_experiment
    from gpuflow.tasks.training.binding import DeviceRequest
    from gpuflow.tasks.training.distributed.job import run_gang_training
    from gpuflow.tasks.training.distributed.tasks import tag_gang
    from gpuflow.tasks.training.job import (
        EXPERIMENT,
        preflight,
        result_metrics,
        run_training,
        trains_as_gang,
    )
    from gpuflow.tasks.training.spec import TrainSpec

    service = SchedulerService.for_cluster(cluster)
    train = service.train_spec(job_id)
    if not train:
        raise ValueError(f"scheduled job {job_id!r} has no train spec: nothing to run here")
    # One rank per placed unit: a placement of N units trains as a gang of N.
    units = max(1, len(service.inventory.job(job_id).resource_ids))
    spec = TrainSpec.model_validate(gang_spec(train, job_id, units))
    bindings = gang_placement(cluster, DeviceRequest(), job_id, spec.gpus)
    binding = bindings[0]
    res = binding.resource
    attempt = binding.lease.attempt
    service.inventory.mark_launching(job_id, attempt)
    try:
        gang = trains_as_gang(spec, preflight(spec, storage, cluster, DeviceRequest(sku=res.sku)))
    except Exception:
        service.job_done(job_id, ok=False, attempt=attempt)
        raise
    experiment_id = use_experiment(experiment or EXPERIMENT)
    client = mlflow.MlflowClient(tracking_uri())
    run = client.create_run(
        experiment_id,
        run_name=job_id,
        tags={
            "gpuflow.job_id": job_id,
            "gpuflow.scheduled": "true",
            "gpuflow.node": res.node,
            "gpuflow.sku": res.sku,
            "gpuflow.resource_id": res.resource_id,
            "gpuflow.partition": res.profile or "whole-device",
            "gpuflow.precision_policy": spec.precision,
        },
    )
    run_id = run.info.run_id
    client.log_batch(
        run_id,
        params=[mlflow.entities.Param(k, v) for k, v in flat_params("", spec.model_dump()).items()],
    )
    try:
        if gang:
            result, report = run_gang_training(spec, storage, cluster, bindings, run_id)
            tag_gang(run_id, report)
        else:
            result = run_training(spec, storage, cluster, binding, run_id)
    except LeaseLostError:
        client.set_terminated(run_id, "KILLED")
        raise  # fenced: no release, no job-state write
    except Exception:
        client.set_terminated(run_id, "FAILED")
        release_placement(cluster, binding, job_id, ok=False)
        raise
    for key, value in result_metrics(result).items():
        if value is not None:
            client.log_metric(run_id, key, float(value))
    client.set_tag(run_id, "gpuflow.stopped_by_request", str(result.stopped_by_request).lower())
    client.set_terminated(run_id, "FINISHED")
    release_placement(
        cluster, binding, job_id, ok=True, stopped_by_request=result.stopped_by_request
    )
    return {"run_id": run_id, "resource_id": res.resource_id, **result.to_dict()}


class InlineLauncher(Launcher):
    """A placed job trained to its end inside the calling flow run (run_scheduled_job)."""

    name = "in-process"

    def __init__(self, cluster: Any, storage: Any) -> None:
        self.cluster, self.storage = cluster, storage

    def launch(self, order: LaunchOrder) -> LaunchReceipt:
        result = run_scheduled_job(self.cluster, self.storage, order.job_id)
        return LaunchReceipt(self.name, order.job_id, order.attempt, started=True, result=result)


# No retries here: a failed job is reported to the scheduler, which decides what is next.
run_placed_task = task(launch_placed, name="run-job", cache_policy=NONE)
