"""The `train` and `compare_precision` flows on the twin, with local and S3 checkpoints."""

from __future__ import annotations

import mlflow
import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.flows import compare_precision as compare_precision_module
from gpuflow.flows.compare_precision import compare_precision
from gpuflow.flows.train import train
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.tracking import tracking_uri
from gpuflow.tasks.training import control, job
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.checkpoint import CheckpointManager, ModelMismatchError
from gpuflow.tasks.training.precision import PrecisionError
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import open_store
from pydantic import SecretStr

from tests.helpers.precision import cpu_reduced_policy

pytestmark = pytest.mark.integration


def _spec(job_id: str, **kw) -> TrainSpec:
    return TrainSpec(
        job_id=job_id,
        model="llama-tiny",
        steps=kw.pop("steps", 30),
        checkpoint_interval=kw.pop("checkpoint_interval", 10),
        **kw,
    )


def _run(run_id: str):
    return mlflow.MlflowClient(tracking_uri()).get_run(run_id)


def test_train_records_run_and_releases_lease(tmp_path) -> None:
    storage = CheckpointStorage(path=str(tmp_path / "ckpt"))
    out = train(_spec("flow-local"), device=DeviceRequest(sku="a100-40gb"), storage=storage)
    assert out["steps_done"] == 30 and out["eval_loss"] > 0
    run = _run(out["run_id"])
    assert run.data.params["model"] == "llama-tiny"
    assert run.data.tags["gpuflow.sku"] == "NVIDIA A100-SXM4-40GB"
    assert run.data.tags["gpuflow.node"].startswith("a100-")
    history = mlflow.MlflowClient(tracking_uri()).get_metric_history(out["run_id"], "loss")
    assert [m.step for m in history] == list(range(1, 31))
    models = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list"
    )
    assert any(m.source_run_id == out["run_id"] for m in models)
    inventory = Inventory()
    assert inventory.leases(owner="flow-local") == []
    assert inventory.job("flow-local").state == "finished"
    ids = [c.checkpoint_id for c in CheckpointManager(open_store(storage), "flow-local").list()]
    assert ids[-1] == "step-000000030"


def test_task_retry_resumes_from_checkpoint_not_zero(tmp_path) -> None:
    failures = []

    def crash_once(job_id: str, total: int, info) -> None:
        if info.step == 25 and not failures:
            failures.append(info.step)
            raise RuntimeError("simulated crash at step 25")

    control.step_observers.append(crash_once)
    try:
        out = train(
            _spec("flow-retry"), storage=CheckpointStorage(path=str(tmp_path)), log_model=False
        )
    finally:
        control.step_observers.remove(crash_once)
    assert failures == [25]
    assert out["resumed_from_step"] == 20  # the retry picked up the step-20 checkpoint
    assert out["steps_done"] == 30


def test_lease_released_when_training_fails(tmp_path, monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("device exploded")

    monkeypatch.setattr(job, "train_loop", boom)
    monkeypatch.setattr(job.train_loop_task, "retries", 0)
    with pytest.raises(RuntimeError, match="device exploded"):
        train(_spec("flow-fail"), storage=CheckpointStorage(path=str(tmp_path)), log_model=False)
    assert Inventory().leases(owner="flow-fail") == []


def test_refusals_come_before_any_lease(tmp_path) -> None:
    storage = CheckpointStorage(path=str(tmp_path))
    with pytest.raises(PrecisionError, match="bf16"):
        train(
            _spec("flow-v100", precision="bf16"), device=DeviceRequest(sku="v100"), storage=storage
        )
    assert Inventory().leases() == []
    # A checkpoint of another model under the same job id: refused, nothing overwritten.
    train(_spec("flow-mix", steps=10), storage=storage, log_model=False)
    before = CheckpointManager(open_store(storage), "flow-mix").list()
    other = TrainSpec(job_id="flow-mix", model="byte-lm", steps=10)
    with pytest.raises(ModelMismatchError):
        train(other, storage=storage, log_model=False)
    assert CheckpointManager(open_store(storage), "flow-mix").list() == before


def test_train_with_s3_checkpoints(s3_server: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(
        Bucket="gpuflow-ckpt"
    )
    storage = CheckpointStorage(
        kind="s3",
        bucket="gpuflow-ckpt",
        prefix="jobs",
        endpoint_url=s3_server,
        region_name="us-east-1",
        access_key_id="testing",
        secret_access_key=SecretStr("testing"),
    )
    out = train(_spec("flow-s3"), storage=storage, log_model=False)
    assert out["checkpoints"][-1] == "step-000000030"
    keys = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").list_objects_v2(
        Bucket="gpuflow-ckpt", Prefix="jobs/"
    )["Contents"]
    assert any("flow-s3/step-000000030/" in k["Key"] for k in keys)


def test_train_refuses_missing_bucket(s3_server: str) -> None:
    storage = CheckpointStorage(
        kind="s3", bucket="no-such-bucket", endpoint_url=s3_server, region_name="us-east-1"
    )
    with pytest.raises(Exception, match="no-such-bucket"):
        train(_spec("flow-nobucket"), storage=storage)
    assert Inventory().leases() == []


def test_compare_precision_puts_speedup_and_delta_on_parent(tmp_path, monkeypatch) -> None:
    reduced = cpu_reduced_policy()  # bf16 where the CPU has it natively, else fp16
    asked: list[DeviceRequest | None] = []

    def spy(job, device=None, **kw):
        asked.append(device)
        return train(job, device=device, **kw)

    monkeypatch.setattr(compare_precision_module, "train", spy)
    out = compare_precision(
        _spec("cmp", steps=20, checkpoint_interval=20),
        candidates=["auto", reduced],
        storage=CheckpointStorage(path=str(tmp_path)),
    )
    # The baseline goes where the scheduler puts it; every candidate is pinned to its unit.
    assert asked[0] is None
    client = mlflow.MlflowClient(tracking_uri())
    parent = client.get_run(out["parent_run_id"])
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{out['parent_run_id']}'"
    )
    by_policy = {c.data.tags["gpuflow.precision_policy"]: c for c in children}
    base = by_policy["fp32"].data.tags
    for request in asked[1:]:
        assert request is not None and request.sku == base["gpuflow.sku"]
        assert request.resource_id == base["gpuflow.resource_id"]
    assert all(
        (c.data.tags["gpuflow.resource_id"], c.data.tags["gpuflow.sku"])
        == (base["gpuflow.resource_id"], base["gpuflow.sku"])
        for c in children
    )
    for policy in ("auto", reduced):
        assert parent.data.metrics[f"speedup_{policy}"] > 0
        assert parent.data.metrics[f"convergence_delta_{policy}"] >= 0
        assert parent.data.tags[f"gpuflow.verdict_{policy}"] in ("pass", "fail")
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{out['parent_run_id']}'"
    )
    assert sorted(c.data.tags["gpuflow.precision_policy"] for c in children) == sorted(
        ["auto", reduced, "fp32"]
    )
    assert all(
        "speedup" in c.data.metrics and "convergence_delta" in c.data.metrics for c in children
    )


def test_a_gang_trains_as_two_ranks_on_the_two_units_it_leased(tmp_path) -> None:
    """`gpuflow train --gpus 2` as the flow runs it: two rank processes (torchelastic's
    agent, gloo, DDP), DCP checkpoints under the manifest, the units on the MLflow run."""
    storage = CheckpointStorage(path=str(tmp_path / "ckpt"))
    spec = _spec("flow-gang", steps=10, batch_size=4, precision="fp32", gpus=2)
    out = train(spec, device=DeviceRequest(sku="a100-40gb"), storage=storage, log_model=False)
    assert out["steps_done"] == 10
    run = _run(out["run_id"])
    assert run.data.params["world_size"] == "2" and run.data.params["backend"] == "gloo"
    units = run.data.tags["gpuflow.resource_ids"].split(",")
    assert len(set(units)) == 2
    history = mlflow.MlflowClient(tracking_uri()).get_metric_history(out["run_id"], "loss")
    assert [m.step for m in history] == list(range(1, 11))  # rank 0 alone logs
    manager = CheckpointManager(open_store(storage), "flow-gang")
    (newest, manifest), *_ = manager.committed()
    assert newest == "step-000000010" and manifest["layout"] == "dcp"
    inventory = Inventory()
    assert inventory.leases(owner="flow-gang") == []
    record = inventory.job("flow-gang")
    assert record.state == "finished" and sorted(record.resource_ids) == sorted(units)

    # Shrunk to one unit (an elastic gang the scheduler gave one unit): its sharded
    # checkpoint resumes on a gang of one rank, not in a plain process that cannot read it.
    more = spec.model_copy(update={"gpus": 1, "steps": 12})
    out = train(more, device=DeviceRequest(sku="a100-40gb"), storage=storage, log_model=False)
    assert (out["resumed_from_step"], out["steps_done"]) == (10, 12)
    assert _run(out["run_id"]).data.params["world_size"] == "1"
    (newest, manifest), *_ = manager.committed()
    assert newest == "step-000000012" and manifest["layout"] == "dcp"


TWO_NODES = """
name: two-nodes
seed: 3
faults: {natural: false}
nodes:
  - {name: n0, region: r1, role: active, devices: [{sku: a100-40gb, count: 2}]}
  - {name: n1, region: r1, role: active, devices: [{sku: a100-40gb, count: 2}]}
"""


def test_a_gang_across_two_nodes_runs_one_agent_per_node(tmp_path, monkeypatch) -> None:
    """Two units on two nodes (``nodes=2``: the gang would fit on one of these nodes, so
    without it the scheduler keeps it on one): this run's agent on the first node hosts
    the rendezvous, the second node's agent runs where that node's work runs (here: a
    process of this machine, no `gang-agent` deployment on this server); each keeps its
    own staging."""
    from gpuflow.blocks.gpu_cluster import GpuCluster

    fleet = tmp_path / "two-nodes.yaml"
    fleet.write_text(TWO_NODES)
    GpuCluster(backend="sim", cluster_spec=str(fleet)).save("two-nodes", overwrite=True)
    monkeypatch.setenv("GPUFLOW_GANG_AGENTS", "auto")
    storage = CheckpointStorage(path=str(tmp_path / "ckpt"))
    spec = _spec(
        "across", steps=6, checkpoint_interval=3, batch_size=2, precision="fp32", gpus=2, nodes=2
    )
    out = train(
        spec,
        device=DeviceRequest(sku="a100-40gb"),
        storage=storage,
        cluster_block="two-nodes",
        log_model=False,
    )
    assert out["steps_done"] == 6 and out["stopped_by_request"] is False
    run = _run(out["run_id"])
    assert run.data.params["world_size"] == "2"
    assert run.data.params["nodes"] == "2" and run.data.tags["gpuflow.nodes"] == "n0,n1"
    manager = CheckpointManager(open_store(storage), "across")
    (newest, manifest), *_ = manager.committed()
    assert newest == "step-000000006" and manifest["layout"] == "dcp"
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(manifest["files"])
    inventory = Inventory()
    assert inventory.job("across").state == "finished" and inventory.leases() == []
