"""Where remediation moves a job: the target it leases to the job's next attempt.

A one-unit job gets one healthy unit of its SKU (and partition profile) in its region. A
gang (a job trained as N ranks) moves whole: N units of one SKU and kind on one node (a
gang runs on one node: tasks/training/distributed/launch.py), never the device at risk,
all leased in one transaction or none. A gang is never split over the device's healthy
neighbours and new units while it still runs: its own units are leased to its running
attempt, and leasing them to the next one would fence the ranks mid-checkpoint. So a
gang whose only way out is through its own units has no target before it stops, and is
checkpointed in place like a one-unit job with nowhere to go (plan.checkpoint_action);
once it is stopped (a lost device), migrate reserves afresh and those units count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.hardware.inventory import Inventory, LeaseConflictError, Resource
from gpuflow.tasks.remediation.devices import JobOnDevice
from gpuflow.tasks.training.binding import Binding, DeviceRequest, bind_held_lease, lease_device

log = logging.getLogger(__name__)

RESERVATION_TTL_S = 600.0
_GANG_LEASE_TRIES = 3  # another process may take a chosen unit between the read and the lease


@dataclass(frozen=True)
class Reservation:
    """The units leased to a job's next attempt, in rank order (rank 0's first)."""

    bindings: tuple[Binding, ...]

    def __post_init__(self) -> None:
        if not self.bindings:
            raise ValueError("a reservation holds at least one unit")

    @property
    def primary(self) -> Binding:
        return self.bindings[0]

    @property
    def lease(self):  # -> Lease, the primary unit's (its attempt is the reservation's)
        return self.primary.lease

    @property
    def resource(self) -> Resource:
        return self.primary.resource

    @property
    def resource_ids(self) -> tuple[str, ...]:
        return tuple(b.resource.resource_id for b in self.bindings)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.resource.node for b in self.bindings))


def target_request(job: JobOnDevice) -> DeviceRequest:
    """The same SKU (and partition profile), in the region the job asked for."""
    profile = job.profile if job.kind != "device" else None
    return DeviceRequest(sku=job.sku, profile=profile, region=job.device_request.get("region"))


def reserve_target(
    inventory: Inventory, backend: Backend, job: JobOnDevice, ttl_s: float = RESERVATION_TTL_S
) -> Reservation | None:
    """Lease a healthy target of the job's shape to its next attempt; None when there is
    none. A reservation an earlier run (one that died) left for the same attempt is used
    again while none of its units is cordoned."""
    try:
        # For the job's next attempt: the relaunch places it there (lifecycle place_job).
        attempt = inventory.job(job.job_id).attempt + 1
        left = unused_reservation(inventory, backend, job)
        if left is not None:
            cordoned = [
                b
                for b in left.bindings
                if inventory.is_cordoned(b.resource.node, b.resource.device_index)
            ]
            if not cordoned:
                return left
            release_reservation(inventory, job.job_id, left)
        if job.gang_size == 1:
            binding = lease_device(
                inventory,
                backend,
                target_request(job),
                owner=job.job_id,
                ttl_s=ttl_s,
                attempt=attempt,
            )
            return Reservation((binding,))
        return _reserve_gang(inventory, backend, job, ttl_s, attempt)
    except InvalidRequestError as exc:
        log.warning("job %s: no target: %s", job.job_id, exc)
        return None


def gang_target(inventory: Inventory, job: JobOnDevice) -> list[str] | None:
    """N free units of the gang's shape, or None: on one node, or gang_size / M on each of
    the M nodes its spec names (``gang_nodes``). The nodes with the fewest free units that
    still fit win (binpack: whole free nodes stay whole for big gangs); on each, the
    lowest device indices; nodes in that order, so rank 0 lands on the first."""
    free = inventory.free_resources(
        sku=job.sku,
        kind=job.kind,
        profile=job.profile if job.kind == "mig" else None,
        region=job.device_request.get("region"),
    )
    by_node: dict[str, list[Resource]] = {}
    for res in free:
        if res.resource_id not in job.units:
            by_node.setdefault(res.node, []).append(res)
    nodes = job.gang_nodes
    per_node = job.gang_size // nodes
    fits = sorted(
        (node for node, units in by_node.items() if len(units) >= per_node),
        key=lambda n: (len(by_node[n]), n),
    )
    if len(fits) < nodes:
        return None
    out: list[str] = []
    for node in fits[:nodes]:
        units = sorted(by_node[node], key=lambda r: (r.device_index, r.resource_id))
        out += [r.resource_id for r in units[:per_node]]
    return out


def _reserve_gang(
    inventory: Inventory, backend: Backend, job: JobOnDevice, ttl_s: float, attempt: int
) -> Reservation | None:
    for _ in range(_GANG_LEASE_TRIES):
        units = gang_target(inventory, job)
        if units is None:
            log.warning(
                "job %s: no node has %d free %s units for the gang",
                job.job_id,
                job.gang_size,
                job.sku,
            )
            return None
        try:
            leases = inventory.acquire_leases(units, job.job_id, ttl_s, attempt=attempt)
        except LeaseConflictError:
            continue  # taken between the read and the lease: choose again
        log.info("job %s: gang target %s (attempt %d)", job.job_id, units, attempt)
        return _bound(inventory, backend, job.job_id, [lease.resource_id for lease in leases])
    return None


def _bound(
    inventory: Inventory, backend: Backend, job_id: str, resource_ids: Sequence[str]
) -> Reservation | None:
    """The held leases of ``resource_ids`` (one attempt of ``job_id``) as a Reservation."""
    attempts = {lease.attempt for r in resource_ids if (lease := inventory.lease(r)) is not None}
    if len(attempts) != 1:
        return None
    (attempt,) = attempts
    bindings = [bind_held_lease(inventory, backend, r, job_id, attempt) for r in resource_ids]
    if any(b is None for b in bindings):
        return None
    return Reservation(tuple(b for b in bindings if b is not None))


def held_placement(
    inventory: Inventory, backend: Backend, job_id: str, resource_ids: Sequence[str]
) -> Reservation | None:
    """The job's current placement (made by someone else: a scheduling pass) as a
    Reservation, when its attempt holds every unit of it."""
    return _bound(inventory, backend, job_id, resource_ids) if resource_ids else None


def unused_reservation(
    inventory: Inventory, backend: Backend, job: JobOnDevice
) -> Reservation | None:
    """Leases the job holds for an attempt it has not started (a reservation), if they
    make a whole target; a partial one (some units lapsed) is given back."""
    attempt = inventory.job(job.job_id).attempt
    ahead = [
        lease
        for lease in inventory.leases(owner=job.job_id)
        if lease.attempt > attempt and lease.resource_id not in job.units
    ]
    if not ahead:
        return None
    newest = max(lease.attempt for lease in ahead)
    ids = [lease.resource_id for lease in ahead if lease.attempt == newest]
    ids.sort(key=lambda r: (inventory.resource(r).node, inventory.resource(r).device_index, r))
    found = _bound(inventory, backend, job.job_id, ids)
    if found is not None and len(found.bindings) == job.gang_size:
        return found
    for rid in ids:
        inventory.release_lease(rid, job.job_id)
    return None


def release_reservation(inventory: Inventory, job_id: str, reservation: Reservation | None) -> None:
    for rid in reservation.resource_ids if reservation is not None else ():
        inventory.release_lease(rid, job_id)


def still_held(inventory: Inventory, job_id: str, reservation: Reservation | None) -> bool:
    """Whether the job still holds every unit of the reservation (a retry after it was
    given back must reserve afresh)."""
    if reservation is None:
        return False
    for rid in reservation.resource_ids:
        lease = inventory.lease(rid)
        if lease is None or lease.owner != job_id:
            return False
    return True
