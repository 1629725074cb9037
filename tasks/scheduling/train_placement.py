"""The `train` flow's placement, from the scheduler instead of "first free device".

``placement_for_train`` is a drop-in for tasks.training.job.acquire: same inputs (the
cluster, a DeviceRequest, the job id), same output (a Binding on a leased resource, with
the torch device), but the lease comes through the scheduler, so the job gets a
homogeneous, policy-placed unit, waits its turn or preempts by priority, and appears in
``gpuflow schedule list``. A job the `schedule` flow already placed gets its binding
straight away (the lease is there, owned by the job's current attempt). Placement goes
through the service's pass lock: one writer, whoever asks.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.scheduling.model import JobRequest, NoCapacityError, SchedulerConfig
from gpuflow.tasks.scheduling.service import SchedulerService, is_scheduled
from gpuflow.tasks.training.binding import DeviceRequest
from prefect import task
from prefect.cache_policies import NONE


def request_from_device(
    device: DeviceRequest,
    job_id: str,
    priority: int = 0,
    count: int = 1,
    nodes: int | None = None,
) -> JobRequest:
    """A JobRequest for ``count`` units (a gang: homogeneous; over exactly ``nodes`` nodes
    when given) from a DeviceRequest."""
    sku, profile, region = device.sku, device.profile, device.region
    pinned = device.pinned
    if pinned:
        return JobRequest(
            job_id=job_id,
            priority=priority,
            profile=profile,
            resource_ids=pinned,
            count=len(pinned),
        )
    return JobRequest(
        job_id=job_id,
        priority=priority,
        profile=profile,
        skus=(sku,) if sku else (),
        region=region,
        count=count,
        nodes=nodes,
    )


def _pinned_request(
    service: SchedulerService, pinned: tuple[str, ...], job_id: str, priority: int
) -> JobRequest:
    """A request pinned to resources takes their own kind and profile (one of each: a gang
    is homogeneous, and a pinned set that is not is refused before anything is leased)."""
    resources = [service.inventory.resource(rid) for rid in pinned]
    shapes = {(r.sku, r.kind, r.profile) for r in resources}
    if len(shapes) > 1:
        raise InvalidRequestError(
            f"job {job_id!r}: pinned units {list(pinned)} are not homogeneous "
            f"(sku, kind, profile: {sorted(map(str, shapes))})"
        )
    res = resources[0]
    return JobRequest(
        job_id=job_id,
        priority=priority,
        resource_ids=pinned,
        count=len(pinned),
        profile=None if res.kind == "device" else res.profile,
    )


def placement_for_train(
    cluster: Any,
    device: DeviceRequest,
    job_id: str,
    *,
    priority: int = 0,
    preempt: bool = False,
    wait_s: float = 0.0,
    poll_s: float = 2.0,
    train: dict[str, Any] | None = None,
    config: SchedulerConfig | None = None,
):  # -> tasks.training.binding.Binding (imported lazily: it pulls in torch)
    """Lease ``device`` for ``job_id`` through the scheduler and bind torch to it.

    A job the scheduler already runs: its binding at once. Otherwise it is submitted (a
    refusal raises SubmissionRefused with the reason) and placed now if it can be, by
    preempting lower priorities when ``preempt``; else retried every ``poll_s`` for
    ``wait_s`` seconds. Still no room: the submission is withdrawn and NoCapacityError
    raised, so the flow fails like an empty fleet did before (its task retries re-ask).
    """
    (binding,) = gang_placement(
        cluster,
        device,
        job_id,
        1,
        priority=priority,
        preempt=preempt,
        wait_s=wait_s,
        poll_s=poll_s,
        train=train,
        config=config,
    )
    return binding


def gang_placement(
    cluster: Any,
    device: DeviceRequest,
    job_id: str,
    count: int,
    *,
    priority: int = 0,
    preempt: bool = False,
    wait_s: float = 0.0,
    poll_s: float = 2.0,
    train: dict[str, Any] | None = None,
    config: SchedulerConfig | None = None,
    nodes: int | None = None,
) -> list:  # -> list[tasks.training.binding.Binding], the primary first
    """placement_for_train for ``count`` units: a homogeneous gang, one Binding per unit
    (the scheduler's gang placement: same SKU and kind, all or none), over exactly
    ``nodes`` nodes when given (count/nodes on each; pinned units must span that many)."""
    from gpuflow.tasks.training.binding import Binding, _sku_or_none, torch_device_for

    service = SchedulerService.for_cluster(cluster, config)
    inventory = service.inventory
    known = {r.job_id: r for r in inventory.jobs() if r.job_id == job_id}
    record = known.get(job_id)
    if record is not None and not is_scheduled(record):
        raise InvalidRequestError(
            f"job id {job_id!r} is in the jobs registry but not as a scheduled job; use another id"
        )
    if record is None or record.state in ("finished", "failed"):
        pinned = device.pinned
        if pinned:
            if len(pinned) != count:
                raise InvalidRequestError(
                    f"job {job_id!r}: a gang of {count} cannot be pinned to {len(pinned)} "
                    f"unit(s) {list(pinned)}; pin one unit per rank"
                )
            request = _pinned_request(service, pinned, job_id, priority)
            _check_pinned_nodes(inventory, job_id, pinned, nodes)
        else:
            request = request_from_device(device, job_id, priority, count, nodes)
        service.submit(request, train=train)
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        placement = service.place_one(job_id, preempt=preempt, ack_timeout_s=min(30.0, wait_s))
        if placement is not None:
            break
        if time.monotonic() + poll_s > deadline:
            service.cancel(job_id)
            what = request_from_device(device, job_id, priority, count, nodes).describe()
            raise NoCapacityError(
                f"no room for job {job_id!r} ({what}) within {wait_s:g} s: "
                "every matching unit is leased, cordoned or unhealthy; submit it to the queue "
                "(`gpuflow schedule submit`) to wait its turn"
            )
        time.sleep(poll_s)
    attempt = inventory.job(job_id).attempt
    bindings = []
    for resource_id in placement.resource_ids:
        resource = inventory.resource(resource_id)
        lease = inventory.lease(resource_id)
        if lease is None or lease.owner != job_id or lease.attempt != attempt:
            raise NoCapacityError(
                f"job {job_id!r} lost its lease on {resource_id} right after placement "
                f"(attempt {attempt})"
            )
        bindings.append(
            Binding(
                resource,
                lease,
                _sku_or_none(resource.sku),
                torch_device_for(service.backend),
                service.backend.name,
            )
        )
    return bindings


def _check_pinned_nodes(
    inventory: Any, job_id: str, pinned: tuple[str, ...], nodes: int | None
) -> None:
    if nodes is None:
        return
    per_node = Counter(inventory.resource(rid).node for rid in pinned)
    if len(per_node) != nodes or len(set(per_node.values())) != 1:
        shape = ", ".join(f"{n} on {node}" for node, n in sorted(per_node.items()))
        raise InvalidRequestError(
            f"job {job_id!r} spans {nodes} node(s), the same units on each, but its pinned "
            f"units are {shape}"
        )


def release_placement(
    cluster: Any, binding: Any, job_id: str, ok: bool = True, stopped_by_request: bool = False
) -> None:
    """The counterpart of placement_for_train (a drop-in for tasks.training.job.release):
    give the leases back and tell the scheduler how the job ended. A job stopped on request
    (preempted, shrunk, cancelled) is re-queued by the next scheduling pass."""
    service = SchedulerService.for_cluster(cluster)
    attempt = binding.lease.attempt
    if stopped_by_request:
        # The device goes to whoever the stop was for, at once; the pass re-queues the job.
        for lease in service.inventory.leases(owner=job_id):
            if lease.attempt == attempt:
                service.inventory.release_lease(lease.resource_id, job_id, attempt=attempt)
    service.job_done(job_id, ok=ok, stopped_by_request=stopped_by_request, attempt=attempt)
    service.backend.end_workload(job_id)


placement_for_train_task = task(
    placement_for_train, name="place-job", retries=3, retry_delay_seconds=5, cache_policy=NONE
)
gang_placement_task = task(
    gang_placement, name="place-gang", retries=3, retry_delay_seconds=5, cache_policy=NONE
)
release_placement_task = task(
    release_placement, name="release-placement", retries=3, retry_delay_seconds=2, cache_policy=NONE
)
