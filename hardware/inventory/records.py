"""What the inventory hands out: plain frozen dataclasses, its vocabularies and its errors.

Callers get copies, never ORM rows: a record outlives the transaction that read it and
can cross a process boundary (pickle) without dragging a database session along.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from gpuflow.hardware.backend import HardwareError

NODE_ROLES = ("active", "spare")
RESOURCE_KINDS = ("device", "mig", "vdcu")
CONTROL_ACTIONS = ("checkpoint-now", "checkpoint-and-stop")
CONTROL_STATUSES = ("pending", "acked")


class JobState(StrEnum):
    """Where a job is in its lifecycle (the transitions are in lifecycle.py)."""

    QUEUED = "queued"  # waiting for a placement
    PLACED = "placed"  # resources leased for a new attempt; nothing started yet
    LAUNCHING = "launching"  # a runner is being started for the attempt
    RUNNING = "running"  # the attempt's runner trains
    CHECKPOINTING = "checkpointing"  # asked to stop; writing its last checkpoint
    STOPPED = "stopped"  # stopped on request with a checkpoint; waits to be re-queued
    FINISHED = "finished"
    FAILED = "failed"  # failed, cancelled or quarantined (info says which)
    LOST = "lost"  # its runner is gone (lease lapsed, device died); waits to be re-queued


JOB_STATES = tuple(s.value for s in JobState)


class LeaseError(HardwareError):
    """A lease could not be taken, renewed or found."""


class LeaseConflictError(LeaseError):
    """Someone else holds an unexpired lease on the resource."""

    def __init__(
        self, resource_id: str, holder: str, expires_at_s: float, detail: str = ""
    ) -> None:
        self.resource_id = resource_id
        self.holder = holder
        self.expires_at_s = expires_at_s
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"resource {resource_id!r} is leased by {holder!r} until {expires_at_s:.3f}{extra}"
        )


class ResourceUnavailableError(LeaseError):
    """The resource exists but may not be leased now (cordoned, absent, spare, split...)."""

    def __init__(self, resource_id: str, reason: str) -> None:
        self.resource_id = resource_id
        self.reason = reason
        super().__init__(f"resource {resource_id!r} cannot be leased: {reason}")


class LeaseNotHeldError(LeaseError):
    """A renewal by someone who does not hold a live lease on the resource."""


class LeaseLostError(LeaseError):
    """A runner's lease lapsed or was taken over: it must stop and write nothing more."""


class JobTransitionError(HardwareError):
    """A job lifecycle write that did not happen."""


class IllegalTransitionError(JobTransitionError, ValueError):
    """The lifecycle has no such move (e.g. finished -> running)."""

    def __init__(self, job_id: str, state: str, to: str, allowed: tuple[str, ...]) -> None:
        self.job_id, self.state, self.to = job_id, state, to
        super().__init__(
            f"job {job_id!r} is {state}: it cannot go to {to} "
            f"(from {state} it may go to: {', '.join(allowed) or 'nothing'})"
        )


class JobConflictError(JobTransitionError):
    """A compare-and-swap on (state, attempt) lost: someone else moved the job first."""

    def __init__(self, job_id: str, expected: str, found: str, to: str | None = None) -> None:
        self.job_id, self.expected, self.found = job_id, expected, found
        asked = f" to {to}" if to else ""
        super().__init__(
            f"job {job_id!r} changed under us: expected {expected}, found {found}; "
            f"the move{asked} was not written"
        )


class LockBusyError(HardwareError):
    """A fleet-wide lock (the scheduler's pass lock) is held by someone else."""

    def __init__(self, name: str, holder: str, expires_at_s: float) -> None:
        self.name, self.holder, self.expires_at_s = name, holder, expires_at_s
        super().__init__(
            f"another pass is running: lock {name!r} is held by {holder!r} until {expires_at_s:.3f}"
        )


class ControlTimeoutError(HardwareError, TimeoutError):
    """A control request was not acknowledged in time; ``request`` is its last state."""

    def __init__(self, request: ControlRequest, timeout_s: float) -> None:
        self.request = request
        super().__init__(
            f"control request {request.request_id} ({request.action} for job "
            f"{request.job_id!r}) not acknowledged within {timeout_s:g} s"
        )


class _Record:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class NodeRecord(_Record):
    name: str
    region: str
    role: str  # one of NODE_ROLES
    backend: str
    first_seen_s: float
    last_seen_s: float


@dataclass(frozen=True)
class DeviceRecord(_Record):
    node: str
    index: int
    vendor: str
    sku: str
    uuid: str  # also the device's resource id
    memory_total_mb: int
    pci_device_id: str | None
    partition_kinds: tuple[str, ...]
    present: bool
    healthy: bool
    health_reason: str | None
    telemetry: dict[str, Any] | None  # last TelemetrySample.to_dict()
    telemetry_at_s: float | None
    last_seen_s: float


@dataclass(frozen=True)
class PartitionRecord(_Record):
    uuid: str  # also the partition's resource id
    node: str
    device_index: int
    device_uuid: str
    profile: str
    kind: str  # "mig" | "vdcu"
    memory_mb: int
    compute_units: int | None  # vDCU compute units, or MIG compute slices
    placement_start: int | None
    placement_size: int | None


@dataclass(frozen=True)
class Resource(_Record):
    """Something leasable: a whole device (id = its uuid) or a partition (id = its uuid)."""

    resource_id: str
    kind: str  # one of RESOURCE_KINDS
    node: str
    device_index: int
    device_uuid: str
    vendor: str
    sku: str
    region: str
    memory_mb: int
    compute_units: int | None
    profile: str | None  # None for a whole device
    placement_start: int | None
    cordoned: bool


@dataclass(frozen=True)
class Lease(_Record):
    resource_id: str
    owner: str
    acquired_at_s: float
    renewed_at_s: float
    expires_at_s: float
    # Where the resource is; None once the resource is no longer in the inventory.
    kind: str | None = None
    node: str | None = None
    device_index: int | None = None
    attempt: int = 0  # the owner's attempt this lease is for: (owner, attempt) owns it
    token: int = 0  # fencing token: grows with every new holder or attempt, store-wide

    def expired(self, now_s: float) -> bool:
        return self.expires_at_s <= now_s


@dataclass(frozen=True)
class Cordon(_Record):
    node: str
    index: int | None  # None: the whole node
    device_uuid: str | None
    reason: str
    created_at_s: float


@dataclass(frozen=True)
class ControlRequest(_Record):
    request_id: int
    job_id: str
    action: str  # one of CONTROL_ACTIONS
    status: str  # one of CONTROL_STATUSES
    requested_at_s: float
    acked_at_s: float | None
    checkpoint_id: str | None


@dataclass(frozen=True)
class JobRecord(_Record):
    job_id: str
    spec: dict[str, Any]
    state: JobState
    resource_ids: tuple[str, ...]
    last_checkpoint_id: str | None
    info: dict[str, Any]
    created_at_s: float
    updated_at_s: float
    attempt: int = 0  # how many placements it has had; a new placement adds one


class DeviceSlot(NamedTuple):
    """A present device as a placement sees it (InventorySnapshot.devices): a plain tuple,
    cheap to build 10,000 times a pass, without telemetry or history (DeviceRecord has
    those)."""

    node: str
    index: int
    uuid: str
    vendor: str
    sku: str
    memory_total_mb: int
    partition_kinds: tuple[str, ...]
    healthy: bool


@dataclass(frozen=True)
class InventorySnapshot(_Record):
    """What a scheduler pass decides on, read in one transaction (Inventory.snapshot)."""

    at_s: float  # the inventory's clock when it was read
    nodes: tuple[NodeRecord, ...]
    devices: tuple[DeviceSlot, ...]  # the present ones
    partitions: tuple[PartitionRecord, ...]
    cordons: tuple[Cordon, ...]
    leases: tuple[Lease, ...]  # unexpired at at_s
    jobs: tuple[JobRecord, ...]  # the whole registry, oldest first


@dataclass(frozen=True)
class SyncReport(_Record):
    """What one ``Inventory.sync`` changed. Device keys read "node:index"."""

    backend: str
    nodes_added: tuple[str, ...] = ()
    nodes_updated: tuple[str, ...] = ()
    devices_added: tuple[str, ...] = ()
    devices_updated: tuple[str, ...] = ()
    devices_missing: tuple[str, ...] = ()  # newly not present
    devices_returned: tuple[str, ...] = ()  # present again
    partitions_added: tuple[str, ...] = ()
    partitions_updated: tuple[str, ...] = ()
    partitions_removed: tuple[str, ...] = ()
    leases_ended: tuple[Lease, ...] = ()  # their resource is gone
    leases_at_risk: tuple[Lease, ...] = ()  # their device went missing; lease kept
    errors: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return any(
            getattr(self, name)
            for name in (
                "nodes_added",
                "nodes_updated",
                "devices_added",
                "devices_updated",
                "devices_missing",
                "devices_returned",
                "partitions_added",
                "partitions_updated",
                "partitions_removed",
                "leases_ended",
            )
        )
