"""Which device an event or an operator means, and which jobs run on it.

A device is named "NODE:INDEX" by operators and ``gpuflow.device.<node>.<index>`` by the
health-risk event (DESIGN.md section 3). Node names may contain dots, the index never
does, so the event form is split at its last dot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import ACTIVE_STATES as LIFECYCLE_ACTIVE
from gpuflow.hardware.inventory import WAITING_STATES as LIFECYCLE_WAITING
from gpuflow.hardware.inventory import DeviceRecord, Inventory, Lease

RESOURCE_PREFIX = "gpuflow.device."
_INDEX = re.compile(r"^\d{1,6}$")

# Job states remediation may take over. Active attempts (placed, launching, running,
# checkpointing) are on the device now; "queued", "stopped" and "lost" ones only when an
# earlier remediation step or a crash handler put them there for this very device
# (info["remediation"]["device_uuid"]): a job stopped by preemption belongs to the
# scheduler, not to us. The lifecycle (hardware.inventory) defines both sets.
ACTIVE_STATES = LIFECYCLE_ACTIVE
WAITING_STATES = LIFECYCLE_WAITING


@dataclass(frozen=True)
class DeviceRef:
    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"

    @property
    def resource_id(self) -> str:
        """The Prefect event resource id of the device."""
        return f"{RESOURCE_PREFIX}{self.node}.{self.index}"


def parse_device_ref(text: object) -> DeviceRef:
    """A DeviceRef from "NODE:INDEX" or "gpuflow.device.<node>.<index>"."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError(
            f"a device is NODE:INDEX or {RESOURCE_PREFIX}NODE.INDEX, got {text!r}"
        )
    value = text.strip()
    if value.startswith(RESOURCE_PREFIX):
        node, sep, index = value[len(RESOURCE_PREFIX) :].rpartition(".")
    else:
        node, sep, index = value.rpartition(":")
    if not sep or not node or not _INDEX.match(index):
        raise InvalidRequestError(
            f"cannot read a device from {text!r}: use NODE:INDEX (a100-0:3) or "
            f"{RESOURCE_PREFIX}NODE.INDEX"
        )
    return DeviceRef(node, int(index))


@dataclass(frozen=True)
class JobOnDevice:
    """A job remediation is responsible for moving off a device."""

    job_id: str
    state: str
    resource_id: str  # what it holds (or held) on the device
    kind: str  # device | mig | vdcu
    profile: str | None
    sku: str
    region: str
    holds_lease: bool  # an unexpired lease: its process is (probably) alive
    last_checkpoint_id: str | None
    device_request: dict[str, Any]  # what the job asked for when it was first placed
    launch: dict[str, Any] | None  # how to start it again (tasks.remediation.launch)
    # Every unit of the attempt, rank 0's first: a gang (N > 1) moves whole.
    resource_ids: tuple[str, ...] = ()

    @property
    def units(self) -> tuple[str, ...]:
        """What the job holds (or held): its attempt's units, else the one on the device."""
        return self.resource_ids or (self.resource_id,)

    @property
    def gang_size(self) -> int:
        return len(self.units)

    @property
    def gang_nodes(self) -> int:
        """The nodes its spec spreads it over (``nodes``), else 1: a gang moves to one
        node, or to as many as it asked for, gang_size / that on each."""
        spec = (self.launch or {}).get("train_spec") or {}
        return int(spec.get("nodes") or 1)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def device_resource_ids(inventory: Inventory, device: DeviceRecord) -> set[str]:
    """The device's own id and those of its partitions."""
    ids = {device.uuid}
    ids.update(p.uuid for p in inventory.partitions(device.node, device.index))
    return ids


def jobs_on_device(
    inventory: Inventory, device: DeviceRecord
) -> tuple[list[JobOnDevice], list[Lease]]:
    """(jobs to move, leases held by owners that are not registered jobs).

    The second list is what remediation cannot move (a serving replica, a hand-made
    lease): it is reported to the operators, never touched.
    """
    ids = device_resource_ids(inventory, device)
    leases = [lease for lease in inventory.leases() if lease.resource_id in ids]
    leased_by = {lease.owner: lease for lease in leases}
    jobs: list[JobOnDevice] = []
    seen: set[str] = set()
    for job in inventory.jobs():
        mine = [r for r in job.resource_ids if r in ids]
        if not mine:
            continue
        marked = (job.info.get("remediation") or {}).get("device_uuid") == device.uuid
        if job.state not in ACTIVE_STATES and not (job.state in WAITING_STATES and marked):
            continue
        resource = inventory.resource(mine[0])
        jobs.append(
            JobOnDevice(
                job_id=job.job_id,
                state=job.state,
                resource_id=resource.resource_id,
                kind=resource.kind,
                profile=resource.profile,
                sku=resource.sku,
                region=resource.region,
                holds_lease=job.job_id in leased_by,
                last_checkpoint_id=job.last_checkpoint_id,
                device_request=dict(job.spec.get("device") or {}),
                launch=job.info.get("launch"),
                resource_ids=tuple(job.resource_ids),
            )
        )
        seen.add(job.job_id)
    others = [lease for lease in leases if lease.owner not in seen]
    return jobs, others
