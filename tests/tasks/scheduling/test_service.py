"""The scheduler over the inventory and the twin: durable queue, leases, repartitioning on
the device, preemption through the control channel, lost runners, cancel, train placement."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.scheduling.model import (
    JobRequest,
    NoCapacityError,
    QueueFullError,
    SchedulerConfig,
    SubmissionRefused,
)
from gpuflow.tasks.scheduling.service import SPEC_KIND, SchedulerService
from gpuflow.tasks.training.binding import DeviceRequest


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _service(cluster, clock: Clock | None = None, **config) -> SchedulerService:
    url = cluster.inventory_url.get_secret_value()
    inv = Inventory(url, now=clock) if clock else cluster.get_inventory()
    return SchedulerService(
        inv, cluster.get_backend(), SchedulerConfig(**config), now=clock or __import__("time").time
    )


def _a100(job_id: str, **kw) -> JobRequest:
    return JobRequest(job_id=job_id, skus=("a100-40gb",), **kw)


def test_submit_is_durable_and_refusals_write_nothing(cluster) -> None:
    svc = _service(cluster, queue_depth=1)
    svc.submit(_a100("j1", count=2), train={"model": "llama-tiny", "steps": 5})
    rec = svc.inventory.job("j1")
    assert rec.state == "queued" and rec.spec["kind"] == SPEC_KIND
    assert rec.spec["request"]["count"] == 2 and rec.info["sched"]["seq"] == 1
    # A second process sees the same queue.
    other = _service(cluster, queue_depth=1)
    assert [v.job_id for v in other.jobs()] == ["j1"]
    with pytest.raises(QueueFullError, match="queue depth 1"):
        other.submit(JobRequest(job_id="j2", skus=("a100-40gb",)))
    with pytest.raises(SubmissionRefused, match="at most 2"):
        other.submit(JobRequest(job_id="j3", count=3, skus=("v100",)))
    assert {r.job_id for r in svc.inventory.jobs()} == {"j1"}


def test_pass_places_leases_and_describes_the_run_environment(cluster) -> None:
    svc = _service(cluster)
    svc.submit(_a100("gang", count=2))
    report = svc.schedule_once()
    (placed,) = report.placed
    ids = placed["resource_ids"]
    assert len(ids) == 2 and len(placed["nodes"]) == 1  # a node-local gang
    assert {lease.resource_id for lease in svc.inventory.leases(owner="gang")} == set(ids)
    rec = svc.inventory.job("gang")
    assert rec.state == "placed" and list(rec.resource_ids) == ids and rec.attempt == 1
    env = placed["env"]["env_by_node"][placed["nodes"][0]]
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(ids) and env["GPUFLOW_TORCH_DEVICE"] == "cpu"
    k8s = placed["env"]["job_variables"]
    assert k8s["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert k8s["node_selector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    # Done: leases come back on the runner's report.
    svc.job_done("gang")
    assert svc.inventory.leases(owner="gang") == []
    assert [v.state for v in svc.jobs(include_done=True)] == ["finished"]


def test_mig_request_cuts_an_idle_device_on_the_twin(cluster) -> None:
    svc = _service(cluster)
    svc.submit(JobRequest(job_id="mig", count=2, profile="3g.20gb"))
    report = svc.schedule_once()
    (step,) = report.repartitioned
    assert step["plan"]["version"] == "v1"
    (placed,) = report.placed
    backend = cluster.get_backend()
    parts = backend.partitions(step["node"], step["index"])
    assert sorted(p.profile for p in parts) == ["3g.20gb", "3g.20gb"]
    assert set(placed["resource_ids"]) == {p.uuid for p in parts}
    env = placed["env"]["env_by_node"][step["node"]]
    assert all(u.startswith("MIG-") for u in env["CUDA_VISIBLE_DEVICES"].split(","))
    assert placed["env"]["job_variables"]["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": "2"}
    # The cut device is no longer offered whole.
    svc.submit(_a100("whole", count=2))
    (placed,) = svc.schedule_once().placed
    assert step["device_uuid"] not in placed["resource_ids"]


def test_vdcu_request_creates_a_vdcu_and_hygon_variables(cluster) -> None:
    svc = _service(cluster)
    svc.submit(JobRequest(job_id="v", profile="vdcu", compute_units=20, memory_mb=8192))
    (placed,) = svc.schedule_once().placed
    (vdcu,) = cluster.get_backend().partitions("dcu-0", 0)
    assert placed["resource_ids"] == [vdcu.uuid] and vdcu.compute_units == 20
    env = placed["env"]["env_by_node"]["dcu-0"]
    assert env["HIP_VISIBLE_DEVICES"] == "0" and env["GPUFLOW_VDCU_ID"] == vdcu.uuid
    k8s = placed["env"]["job_variables"]
    # A vDCU gpuflow carved beforehand: Hygon's plugin's pre-created vDCU resource.
    assert k8s["resources"]["limits"] == {"hygon.com/dcu-share-20c-8g": "1"}
    assert k8s["pod_annotations"] == {"hygon.com/use-dcutype": "Z100"}


def test_preemption_goes_through_the_control_channel(cluster) -> None:
    svc = _service(cluster)
    for i in range(4):
        svc.submit(_a100(f"low{i}"))
    svc.schedule_once()
    svc.submit(_a100("high", priority=10))
    report = svc.schedule_once()
    (pre,) = report.preemptions
    (victim,) = pre["victims"]
    inv = svc.inventory
    req = inv.poll_control(victim["job_id"])
    assert req is not None and req.action == "checkpoint-and-stop"
    assert report.stopping == [victim["job_id"]] and report.waiting == ["high"]
    # The victim's loop: checkpoint, acknowledge, record, give the device back.
    inv.ack_control(req.request_id, "step-000000007")
    inv.transition_job(victim["job_id"], "stopped", last_checkpoint_id="step-000000007")
    report = svc.schedule_once()
    assert report.requeued == [victim["job_id"]]
    (placed,) = report.placed
    assert placed["job_id"] == "high" and placed["resource_ids"] == victim["release"]
    rec = inv.job(victim["job_id"])
    assert rec.state == "queued" and rec.info["sched"]["resume_checkpoint"] == "step-000000007"
    assert rec.info["sched"]["preemptions"] == 1
    svc.job_done("high")
    (placed,) = svc.schedule_once().placed
    assert placed["job_id"] == victim["job_id"]  # it resumes when its turn comes


def test_runner_that_stops_renewing_is_requeued(cluster) -> None:
    clock = Clock()
    svc = _service(cluster, clock, lease_ttl_s=60)
    svc.submit(_a100("fragile"))
    (first,) = svc.schedule_once().placed
    clock.t += 120  # nobody renewed the primary lease
    report = svc.schedule_once()
    assert report.lost == ["fragile"]
    (again,) = report.placed  # and, the device being free, it is placed again
    assert again["job_id"] == "fragile"
    assert svc.inventory.lease(again["resource_ids"][0]).owner == "fragile"


def test_reservation_holds_leases_until_its_start(cluster) -> None:
    clock = Clock()
    svc = _service(cluster, clock, reservation_lead_s=600)
    svc.submit(JobRequest(job_id="res", count=2, skus=("v100",), start_at_s=clock.t + 300))
    svc.schedule_once()
    held = {lease.resource_id for lease in svc.inventory.leases(owner="res")}
    assert len(held) == 2
    svc.submit(JobRequest(job_id="squatter", skus=("v100",)))
    assert svc.schedule_once().placed == []
    clock.t += 300
    placed = {p["job_id"]: p for p in svc.schedule_once().placed}
    assert set(placed) == {"res"} and set(placed["res"]["resource_ids"]) == held


def test_cancel_waiting_and_running_jobs(cluster) -> None:
    svc = _service(cluster)
    svc.submit(_a100("run"))
    svc.schedule_once()
    svc.submit(_a100("wait", count=2, priority=-1))
    svc.submit(_a100("blocker", count=2))
    svc.schedule_once()
    svc.submit(_a100("queued-one", count=2))
    assert svc.cancel("queued-one") == "cancelled"
    assert svc.cancel("run") == "stopping"
    req = svc.inventory.poll_control("run")
    svc.inventory.ack_control(req.request_id, "step-000000003")
    svc.inventory.transition_job("run", "stopped", last_checkpoint_id="step-000000003")
    svc.schedule_once()
    states = {v.job_id: v.state for v in svc.jobs(include_done=True)}
    assert states["run"] == "cancelled" and states["queued-one"] == "cancelled"
    assert svc.inventory.leases(owner="run") == []


def test_leases_made_outside_the_scheduler_are_respected(cluster) -> None:
    inv = cluster.get_inventory()
    outsider = next(d for d in inv.devices() if d.node == "a100-0" and d.index == 0)
    inv.acquire_lease(outsider.uuid, "someone-else", 600)
    svc = _service(cluster)
    svc.submit(_a100("gang", count=2))
    (placed,) = svc.schedule_once().placed
    assert placed["nodes"] == ["a100-1"]


def test_placement_for_train_binds_through_the_scheduler(cluster) -> None:
    from gpuflow.tasks.scheduling.train_placement import placement_for_train

    b1 = placement_for_train(cluster, DeviceRequest(sku="v100"), "t1")
    assert b1.resource.sku == "Tesla V100-SXM2-32GB" and b1.lease.owner == "t1"
    assert str(b1.torch_device) == "cpu"
    again = placement_for_train(cluster, DeviceRequest(sku="v100"), "t1")
    assert again.resource.resource_id == b1.resource.resource_id  # idempotent for retries
    placement_for_train(cluster, DeviceRequest(sku="v100"), "t2")
    with pytest.raises(NoCapacityError, match="no room for job 't3'"):
        placement_for_train(cluster, DeviceRequest(sku="v100"), "t3")
    svc = SchedulerService.for_cluster(cluster)
    assert "t3" not in [v.job_id for v in svc.jobs()]  # withdrawn, not left to wait
    pinned = placement_for_train(cluster, DeviceRequest(resource_id=_free_a100(svc)), "t4")
    assert pinned.resource.kind == "device"


def test_a_gang_pinned_to_its_units_is_placed_there_or_refused_clearly(cluster) -> None:
    """Remediation's relaunch pins a gang to the N units it reserved."""
    from gpuflow.tasks.scheduling.train_placement import gang_placement

    svc = SchedulerService.for_cluster(cluster)
    by_node: dict[str, list[str]] = {}
    for r in svc.inventory.free_resources(sku="a100-40gb"):
        by_node.setdefault(r.node, []).append(r.resource_id)
    units = next(ids for ids in by_node.values() if len(ids) >= 2)[:2]
    pinned = DeviceRequest(resource_ids=units)
    assert pinned.pinned == tuple(units)
    bindings = gang_placement(cluster, pinned, "g1", 2)
    assert [b.resource.resource_id for b in bindings] == units
    assert {b.lease.owner for b in bindings} == {"g1"}
    with pytest.raises(InvalidRequestError, match="a gang of 3 cannot be pinned to 2 unit"):
        gang_placement(cluster, DeviceRequest(resource_ids=units), "g2", 3)
    v100 = next(r.resource_id for r in svc.inventory.free_resources(sku="v100"))
    with pytest.raises(InvalidRequestError, match="not homogeneous"):
        gang_placement(cluster, DeviceRequest(resource_ids=[_free_a100(svc), v100]), "g3", 2)
    # A gang that names two nodes, pinned to two units of one node: refused, naming them.
    with pytest.raises(InvalidRequestError, match=r"spans 2 node\(s\).*2 on "):
        gang_placement(cluster, DeviceRequest(resource_ids=units), "g4", 2, nodes=2)
    assert {"g2", "g3", "g4"}.isdisjoint(v.job_id for v in svc.jobs())  # nothing written
    with pytest.raises(ValueError, match="not both"):
        DeviceRequest(resource_id=units[0], resource_ids=units)
    with pytest.raises(ValueError, match="distinct unit ids"):
        DeviceRequest(resource_ids=[units[0], units[0]])


def _free_a100(svc: SchedulerService) -> str:
    return next(r.resource_id for r in svc.inventory.free_resources(sku="a100-40gb"))


def test_victim_that_dies_before_acknowledging_is_requeued_and_its_request_answered(
    cluster,
) -> None:
    clock = Clock()
    svc = _service(cluster, clock, lease_ttl_s=60)
    for i in range(4):
        svc.submit(_a100(f"low{i}"))
    svc.schedule_once()
    svc.submit(_a100("high", priority=10))
    (pre,) = svc.schedule_once().preemptions
    victim = pre["victims"][0]["job_id"]
    clock.t += 50
    for i in range(4):  # the others are alive: their runners renew their primary leases
        if f"low{i}" != victim:
            rec = svc.inventory.job(f"low{i}")
            svc.inventory.renew_lease(rec.resource_ids[0], f"low{i}", 60)
    clock.t += 20  # the victim never answered, and its runner stopped renewing
    report = svc.schedule_once()
    assert report.lost == [victim]
    assert [p["job_id"] for p in report.placed][0] == "high"
    (req,) = svc.inventory.control_requests(victim)
    assert req.status == "acked"  # no stale stop waiting for the relaunched victim
    assert svc.inventory.poll_control(victim) is None
