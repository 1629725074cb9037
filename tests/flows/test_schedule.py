"""The `schedule` flow end to end on the twin: a high-priority job evicts a running
training job through checkpoint-and-stop; the victim later resumes from the checkpoint it
acknowledged and finishes with no step lost."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.flows.schedule import schedule
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.scheduling.model import JobRequest
from gpuflow.tasks.scheduling.runner import run_scheduled_job
from gpuflow.tasks.scheduling.service import SchedulerService, checkpoint_step
from gpuflow.tasks.training import control as training_control

pytestmark = pytest.mark.integration

ONE_GPU = """
name: one-gpu
seed: 5
faults: {natural: false}
nodes:
  - name: a100-0
    region: cn-north
    role: active
    devices: [{sku: a100-40gb, count: 1}]
"""
STEPS = 30


def test_preempted_training_resumes_from_its_checkpoint_with_no_steps_lost(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(ONE_GPU)
    cluster = GpuCluster(backend="sim", cluster_spec=str(spec))
    cluster.save("sched-e2e", overwrite=True)
    storage = CheckpointStorage(path=str(tmp_path / "ckpt"))
    service = SchedulerService.for_cluster(cluster)
    train = {"model": "llama-tiny", "steps": STEPS, "checkpoint_interval": 10}
    service.submit(JobRequest(job_id="low", skus=("a100-40gb",), priority=0), train=train)
    (placed,) = service.schedule_once().placed
    device = placed["resource_ids"][0]

    inventory = Inventory()
    mid_training = threading.Event()
    hold = {"on": True}

    def pace(job_id: str, total: int, info) -> None:
        # The victim is mid-training: after step 3 it keeps stepping only once the
        # scheduler's request is waiting, so the request surely finds it running.
        if job_id != "low" or not hold["on"] or info.step < 3:
            return
        mid_training.set()
        deadline = time.monotonic() + 120
        while inventory.poll_control("low") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        hold["on"] = False

    training_control.step_observers.append(pace)
    first: dict = {}
    victim = threading.Thread(
        target=lambda: first.update(run_scheduled_job(cluster, storage, "low"))
    )
    try:
        victim.start()
        assert mid_training.wait(120), "the low-priority job never started training"
        service.submit(
            JobRequest(job_id="high", skus=("a100-40gb",), priority=10),
            train={"model": "llama-tiny", "steps": 6, "checkpoint_interval": 3},
        )
        out = schedule(
            cluster_block="sched-e2e", storage=storage, ack_timeout_s=120, launch="in-process"
        )
        victim.join(120)
    finally:
        training_control.step_observers.remove(pace)
    assert not victim.is_alive()

    # The victim acknowledged with a checkpoint and stopped there.
    (request,) = inventory.control_requests("low")
    assert request.action == "checkpoint-and-stop" and request.status == "acked"
    acked_step = checkpoint_step(request.checkpoint_id)
    assert first["stopped_by_request"] is True and first["steps_done"] == acked_step >= 3
    assert first["resource_id"] == device

    # The preemptor ran on the victim's device, then the victim resumed from the checkpoint.
    assert out["launch"] == "in-process"
    victims = [
        v["job_id"] for p in out["passes"] for pre in p["preemptions"] for v in pre["victims"]
    ]
    assert victims == ["low"]
    assert (
        out["results"]["high"]["steps_done"] == 6
        and out["results"]["high"]["resource_id"] == device
    )
    resumed = out["results"]["low"]
    assert resumed["resumed_from_step"] == acked_step
    assert resumed["steps_done"] == STEPS and resumed["stopped_by_request"] is False
    order = [job for p in out["passes"] for job in (x["job_id"] for x in p["placed"])]
    assert order.index("high") < order.index("low")

    states = {v.job_id: (v.state, v.preemptions) for v in service.jobs(include_done=True)}
    assert states == {"low": ("finished", 1), "high": ("finished", 0)}
    assert inventory.leases() == []
    assert out["queue"] == []


def test_drain_places_and_reports_without_launching() -> None:
    from gpuflow.tasks.scheduling.launch import resolve_launch
    from typer.testing import CliRunner

    from gpuflow.cli_schedule import app

    assert resolve_launch("auto", "train/train") == "in-process"  # no train deployment here
    runner = CliRunner()
    out = runner.invoke(app, ["submit", "ext", "--external", "--sku", "v100", "--count", "2"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["drain", "--launch", "none"])
    assert out.exit_code == 0, out.output
    assert "ext" in out.output and "schedule (none)" in out.output
    leases = Inventory().leases(owner="ext")
    assert len(leases) == 2  # placed and leased; its own runner starts it


def test_a_run_of_many_passes_keeps_one_service_and_reads_the_fleet_once(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(ONE_GPU)
    cluster = GpuCluster(backend="sim", cluster_spec=str(spec))
    cluster.save("sched-passes", overwrite=True)
    service = SchedulerService.for_cluster(cluster)
    for job_id in ("a", "b"):
        service.submit(JobRequest(job_id=job_id, skus=("a100-40gb",)))
    out = schedule(cluster_block="sched-passes", launch="none", passes=3, interval_s=0.0)
    assert len(out["passes"]) == 3
    assert [len(p["placed"]) for p in out["passes"]] == [1, 0, 0]  # one GPU: "b" waits
    # One service for the whole run: only its first pass read the whole inventory.
    assert [p["rebuilds"] for p in out["passes"]] == [1, 1, 1]
    with pytest.raises(ValueError, match="passes must be >= 1"):
        schedule(cluster_block="sched-passes", launch="none", passes=0)


TWO_GPUS = ONE_GPU.replace("name: one-gpu", "name: two-gpus").replace("count: 1", "count: 2")


def test_a_placement_of_two_units_trains_as_a_gang_of_two_ranks(tmp_path: Path) -> None:
    """`gpuflow schedule submit --count 2`: one rank per placed unit, whichever launcher
    starts it (the deployment's parameters, or this process)."""
    import mlflow
    from gpuflow.tasks.scheduling.launch import launch_order
    from gpuflow.tasks.tracking import tracking_uri

    spec = tmp_path / "cluster.yaml"
    spec.write_text(TWO_GPUS)
    cluster = GpuCluster(backend="sim", cluster_spec=str(spec))
    storage = CheckpointStorage(path=str(tmp_path / "ckpt"))
    service = SchedulerService.for_cluster(cluster)
    train = {
        "model": "llama-tiny",
        "steps": 4,
        "checkpoint_interval": 2,
        "batch_size": 2,
        "seq_len": 16,
        "precision": "fp32",
        "eval_batches": 1,
    }
    service.submit(JobRequest(job_id="pair", count=2, skus=("a100-40gb",)), train=train)
    (placed,) = service.schedule_once().placed
    units = list(placed["resource_ids"])
    assert len(units) == 2

    order = launch_order(cluster, "pair", None, storage)
    assert order.parameters["spec"]["gpus"] == 2  # the train deployment runs 2 ranks
    assert order.parameters["device"] == {"resource_ids": units}

    out = run_scheduled_job(cluster, storage, "pair")
    assert out["steps_done"] == 4 and out["stopped_by_request"] is False
    run = mlflow.MlflowClient(tracking_uri()).get_run(out["run_id"])
    assert run.data.params["world_size"] == "2" and run.data.params["backend"] == "gloo"
    assert run.data.tags["gpuflow.resource_ids"] == ",".join(units)
    manifest = json.loads((tmp_path / "ckpt/pair/step-000000004/manifest.json").read_text())
    assert manifest["layout"] == "dcp"  # torch.distributed.checkpoint, one shard file per rank
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(manifest["files"])
    assert Inventory().job("pair").state == "finished" and Inventory().leases() == []
