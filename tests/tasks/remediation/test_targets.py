"""Where remediation moves a job: a gang moves whole, to N units of its SKU on one node
(or on as many nodes as its spec names), leased all or none to its next attempt; its
silent ranks are fenced together."""

from __future__ import annotations

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.remediation.devices import jobs_on_device
from gpuflow.tasks.remediation.steps import (
    RemediationPolicy,
    checkpoint_job,
    ensure_capacity,
    migrate_job,
)
from gpuflow.tasks.remediation.targets import (
    gang_target,
    release_reservation,
    reserve_target,
    unused_reservation,
)

from tests.tasks.remediation.helpers import A100, make_cluster, small_spec


@pytest.fixture
def cluster(gpuflow_home):
    return make_cluster(gpuflow_home)


def _placed_gang(
    cluster,
    tmp_path,
    job_id: str = "gang",
    launcher: str = "deployment",
    nodes: int | None = None,
    min_count: int | None = None,
):
    """A gang of 2 A100s placed by a scheduling pass, with a launch record; no rank runs
    (the job is silent to remediation). Returns (service, the job as remediation sees it
    on its rank-0 device, that device)."""
    from gpuflow.tasks.remediation.launch import remember_launch
    from gpuflow.tasks.scheduling.model import JobRequest
    from gpuflow.tasks.scheduling.service import SchedulerService
    from gpuflow.tasks.training.binding import DeviceRequest

    service = SchedulerService.for_cluster(cluster)
    spec = small_spec(job_id, steps=20, interval=10).model_copy(update={"gpus": 2, "nodes": nodes})
    if min_count is None:
        request = JobRequest(job_id=job_id, count=2, skus=(A100,), nodes=nodes)
    else:  # elastic: min_count..2, placed at 2 while two are free on one node
        request = JobRequest(job_id=job_id, count=min_count, max_count=2, skus=(A100,))
    service.submit(request, train=spec.model_dump())
    assert service.schedule_once().placed, "the pass placed nothing"
    storage = CheckpointStorage(path=str(tmp_path / "ck"))
    remember_launch(service.inventory, spec, storage, DeviceRequest(sku=A100), launcher=launcher)
    inv = service.inventory
    record = inv.job(job_id)
    assert len(record.resource_ids) == 2
    first = inv.resource(record.resource_ids[0])
    device = inv.device(first.node, first.device_index)
    (job,), _ = jobs_on_device(inv, device)
    return service, job, device


def test_a_gang_is_seen_whole_and_reserves_n_units_on_one_other_node(cluster, tmp_path) -> None:
    service, job, device = _placed_gang(cluster, tmp_path)
    inv = service.inventory
    assert job.gang_size == 2 and job.units == tuple(inv.job("gang").resource_ids)
    inv.cordon(device.node, device.index, "test: isolated")  # as isolate does
    # Capacity for a gang counts its N units, not one.
    assert ensure_capacity(inv, [job], RemediationPolicy(use_spares=False))["short"] == {}

    reservation = reserve_target(inv, cluster.get_backend(), job)
    assert reservation is not None and len(reservation.bindings) == 2
    assert not set(reservation.resource_ids) & set(job.units)  # never its own units
    assert len(reservation.nodes) == 1 and reservation.nodes != (device.node,)
    attempt = inv.job("gang").attempt
    leases = [inv.lease(r) for r in reservation.resource_ids]
    assert {(lease.owner, lease.attempt) for lease in leases} == {("gang", attempt + 1)}
    # Ranks in device order: rank 0's unit first.
    indices = [inv.resource(r).device_index for r in reservation.resource_ids]
    assert indices == sorted(indices)

    # A run that died after reserving leaves it: the next run finds the same whole set.
    again = unused_reservation(inv, cluster.get_backend(), job)
    assert again is not None and again.resource_ids == reservation.resource_ids
    assert reserve_target(inv, cluster.get_backend(), job).resource_ids == reservation.resource_ids


def test_a_gang_that_names_two_nodes_moves_to_two_nodes_one_unit_on_each(cluster, tmp_path) -> None:
    service, job, device = _placed_gang(cluster, tmp_path, nodes=2)
    inv = service.inventory
    assert job.gang_nodes == 2
    assert len({inv.resource(r).node for r in job.units}) == 2  # placed one per node
    inv.cordon(device.node, device.index, "test: isolated")
    target = gang_target(inv, job)
    assert target is not None and not set(target) & set(job.units)
    assert len({inv.resource(r).node for r in target}) == 2
    # With one node's other unit taken, two nodes with a free unit no longer exist.
    (other,) = [r for r in target if inv.resource(r).node != device.node]
    inv.acquire_lease(other, "filler", 600)
    assert gang_target(inv, job) is None


def test_a_gang_with_no_node_of_n_free_units_has_no_target_and_leases_nothing(
    cluster, tmp_path
) -> None:
    service, job, device = _placed_gang(cluster, tmp_path)
    inv = service.inventory
    other = "a100-1" if device.node == "a100-0" else "a100-0"
    (busy, _) = [r.resource_id for r in inv.free_resources(sku=A100) if r.node == other]
    inv.acquire_lease(busy, "filler", 600)  # one of the other node's two is taken
    inv.cordon(device.node, device.index, "test: isolated")
    # One free A100 on another node, one on the spare (not active): no node has two.
    assert gang_target(inv, job) is None
    assert reserve_target(inv, cluster.get_backend(), job) is None
    assert sorted(lease.resource_id for lease in inv.leases(owner="gang")) == sorted(job.units)

    # The spare promoted (fail over): its two A100s are a whole target.
    inv.set_node_role("a100-spare-0", "active")
    reservation = reserve_target(inv, cluster.get_backend(), job)
    assert reservation is not None and reservation.nodes == ("a100-spare-0",)
    release_reservation(inv, "gang", reservation)
    assert all(inv.lease(r) is None for r in reservation.resource_ids)


def test_a_partial_reservation_left_behind_is_given_back(cluster, tmp_path) -> None:
    service, job, device = _placed_gang(cluster, tmp_path)
    inv = service.inventory
    reservation = reserve_target(inv, cluster.get_backend(), job)
    assert reservation is not None
    inv.release_lease(reservation.resource_ids[1], "gang")  # one unit lapsed, say
    assert unused_reservation(inv, cluster.get_backend(), job) is None
    assert inv.lease(reservation.resource_ids[0]) is None  # the rest given back too


def test_a_silent_gang_is_fenced_on_every_unit_and_queued_with_its_checkpoint(
    cluster, tmp_path
) -> None:
    service, job, device = _placed_gang(cluster, tmp_path)
    inv = service.inventory
    policy = RemediationPolicy(checkpoint_timeout_s=0.2, release_grace_s=0.2)
    ck = checkpoint_job(inv, job, device_present=True, policy=policy, incident_id="inc-g")
    assert ck.how == "none" and ck.fenced
    assert inv.leases(owner="gang") == []  # both ranks' units taken away, not only one
    assert inv.job("gang").state == "queued"


def test_a_gang_relaunch_refused_by_its_launcher_gives_every_unit_back(cluster, tmp_path) -> None:
    """In-process jobs are one-unit jobs: a gang record that says in-process is refused
    with the reason, and the job stays checkpointed and queued, holding nothing."""
    service, job, device = _placed_gang(cluster, tmp_path, launcher="in-process")
    inv = service.inventory
    policy = RemediationPolicy(checkpoint_timeout_s=0.2, release_grace_s=0.2)
    ck = checkpoint_job(inv, job, device_present=True, policy=policy, incident_id="inc-r")
    inv.cordon(device.node, device.index, "test: isolated")
    reservation = reserve_target(inv, cluster.get_backend(), job)
    assert reservation is not None
    out = migrate_job(cluster, job, ck, reservation)
    assert out.status == "queued" and "gang of 2" in out.detail
    assert inv.leases(owner="gang") == [] and inv.job("gang").state == "queued"


def test_an_elastic_gang_with_no_target_of_its_size_is_placed_again_smaller(
    cluster, tmp_path
) -> None:
    """Shrink, where the spec allows it: no node has two free units, so remediation leaves
    the gang checkpointed and queued, and the scheduler places it again at one unit (its
    minimum); it trains as one rank, its 2-rank checkpoint resharded (tests/flows/
    test_train.py resumes a 2-rank checkpoint on one rank)."""
    from gpuflow.tasks.scheduling.launch import gang_spec

    service, job, device = _placed_gang(cluster, tmp_path, min_count=1)
    inv = service.inventory
    assert job.gang_size == 2
    other = "a100-1" if device.node == "a100-0" else "a100-0"
    for rid in [r.resource_id for r in inv.free_resources(sku=A100) if r.node == other]:
        inv.acquire_lease(rid, "filler", 600)  # the other node is full
    policy = RemediationPolicy(checkpoint_timeout_s=0.2, release_grace_s=0.2)
    ck = checkpoint_job(inv, job, device_present=True, policy=policy, incident_id="inc-s")
    inv.cordon(device.node, device.index, "test: isolated")
    out = migrate_job(cluster, job, ck, None)
    assert out.status == "queued" and "places it again at 1 to 2 units" in out.detail
    assert inv.leases(owner="gang") == []

    report = service.schedule_once()
    assert [p["job_id"] for p in report.placed] == ["gang"]
    (unit,) = inv.job("gang").resource_ids  # one: the healthy unit left on its node
    assert inv.resource(unit).node == device.node and unit != job.resource_id
    spec = gang_spec(service.train_spec("gang"), "gang", 1)
    assert spec["gpus"] == 1
