"""One launcher interface (tasks/launching.py): a `train` deployment run per (job, attempt),
whoever asks and however often, on a real Prefect server with the real `train` deployment
(no worker: the runs stay scheduled, which is what a relaunch in flight looks like)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.launching import DeploymentLauncher, LaunchError, LaunchOrder, idempotency_key

from tests.tasks.remediation.helpers import A100, make_cluster, small_spec

pytestmark = pytest.mark.usefixtures("prefect_server")


# Not "train/train": the session's other tests must not find a `train` deployment (the
# schedule flow would launch through it). Deleted again after this module.
DEPLOYMENT = "launch-test"


@pytest.fixture(scope="module")
def train_deployment(prefect_server: None) -> Iterator[str]:
    from gpuflow.flows.train import train
    from prefect.client.orchestration import get_client

    deployment_id = train.to_deployment(name=DEPLOYMENT).apply()
    yield f"train/{DEPLOYMENT}"
    with get_client(sync_client=True) as client:
        client.delete_deployment(deployment_id)


def _train_runs(job_id: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[DEPLOYMENT]))
        )
    return [r for r in runs if (r.parameters.get("spec") or {}).get("job_id") == job_id]


def _order(job_id: str, attempt: int) -> LaunchOrder:
    spec = small_spec(job_id).model_dump()
    return LaunchOrder(job_id, attempt, "GPU-x", "a100-0", parameters={"spec": spec})


def test_one_flow_run_per_job_attempt_however_often_asked(train_deployment: str) -> None:
    launcher = DeploymentLauncher(train_deployment)
    first = launcher.launch(_order("keyed", 1))
    again = launcher.launch(_order("keyed", 1))  # a retried task, a second launcher
    assert again.flow_run_id == first.flow_run_id
    assert len(_train_runs("keyed")) == 1
    (run,) = _train_runs("keyed")
    assert run.idempotency_key == idempotency_key("keyed", 1)
    assert run.name == "train-keyed-1"
    nxt = launcher.launch(_order("keyed", 2))  # a new attempt is a new run
    assert nxt.flow_run_id != first.flow_run_id and len(_train_runs("keyed")) == 2


def test_a_deployment_that_is_not_there_is_named(prefect_server: None) -> None:
    with pytest.raises(LaunchError, match=r"'nope/nope' for job 'j'.*not deployed"):
        DeploymentLauncher("nope/nope").launch(_order("j", 1))


def test_a_second_signal_while_a_relaunch_is_in_flight_relaunches_nothing_more(
    train_deployment: str, gpuflow_home, tmp_path
) -> None:
    """Two remediations of one device, the second while the first one's `train` run has
    not started yet (the job is queued, its new attempt not placed): one run. Before, each
    signal started its own run of the job."""
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.tasks.remediation.devices import jobs_on_device
    from gpuflow.tasks.remediation.launch import remember_launch
    from gpuflow.tasks.remediation.steps import (
        RemediationPolicy,
        checkpoint_job,
        migrate_job,
        reserve_target,
    )
    from gpuflow.tasks.training.binding import DeviceRequest

    cluster = make_cluster(gpuflow_home)
    inv = Inventory()
    res = inv.free_resources(sku=A100)[0]
    inv.acquire_lease(res.resource_id, "sig", 300, attempt=1)
    inv.record_job("sig", {"device": {}}, "running", [res.resource_id])
    spec = small_spec("sig")
    storage = CheckpointStorage(path=str(tmp_path / "ck"))
    remember_launch(
        inv,
        spec,
        storage,
        DeviceRequest(sku=A100),
        launcher="deployment",
        deployment=train_deployment,
    )
    device = inv.device(res.node, res.device_index)
    policy = RemediationPolicy(checkpoint_timeout_s=0.2, release_grace_s=0.2)

    receipts = []
    for signal in ("inc-1", "inc-2"):
        (job,), _ = jobs_on_device(inv, device)
        ck = checkpoint_job(inv, job, device_present=True, policy=policy, incident_id=signal)
        out = migrate_job(cluster, job, ck, reserve_target(inv, cluster.get_backend(), job))
        assert out.status == "resumed", out.detail
        receipts.append(out.launcher)
    assert receipts[0]["flow_run_id"] == receipts[1]["flow_run_id"]
    (run,) = _train_runs("sig")
    assert run.parameters["device"]["resource_id"] == receipts[0]["resource_id"]
