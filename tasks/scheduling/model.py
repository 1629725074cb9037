"""What the scheduler is asked and what it answers: requests, its settings, its decisions.

A request names N units of one kind: whole devices, MIG partitions of a profile, or vDCUs
of a size; optionally the SKUs it accepts (in order of preference), a region, a priority,
and a min..max size for an elastic job. Every decision the engine takes is a frozen
dataclass that a caller (the service, the trace simulator, a test) carries out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuflow.hardware.backend import HardwareError, InvalidRequestError
from gpuflow.hardware.skus import sku as sku_spec
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

POLICIES = ("binpack", "spread", "first-fit")
UNIT_KINDS = ("device", "mig", "vdcu")
VDCU = "vdcu"
DEFAULT_QUEUE_DEPTH = 8  # the field's advice is 5-8 (DESIGN.md section 7)
ANY_REGION = "*"  # the queue of jobs that name no region
QUEUE_DEPTH_ENV = "GPUFLOW_QUEUE_DEPTH"
_JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")

# Engine job states. The inventory's jobs registry has fewer (queued, running,
# checkpointed, finished, failed); the service maps them (see service.py).
QUEUED, RESERVED, RUNNING, STOPPING = "queued", "reserved", "running", "stopping"
FINISHED, FAILED, CANCELLED = "finished", "failed", "cancelled"
LIVE_STATES = (QUEUED, RESERVED, RUNNING, STOPPING)
DONE_STATES = (FINISHED, FAILED, CANCELLED)


class SubmissionRefused(InvalidRequestError):
    """A request no fleet of this shape could ever satisfy; nothing was queued."""


class QueueFullError(SubmissionRefused):
    """The pool's queue holds as many jobs as its depth allows."""

    def __init__(self, pool: str, waiting: int, depth: int) -> None:
        self.pool = pool
        self.depth = depth
        where = (
            "jobs that name no region already wait"
            if pool == ANY_REGION
            else f"jobs already wait in pool {pool!r}"
        )
        key = "" if pool == ANY_REGION else f"{pool}="
        super().__init__(
            f"queue full: {waiting} {where} (queue depth {depth}). "
            f"Wait for some to start, or raise the depth: {QUEUE_DEPTH_ENV}={key}{depth * 2} "
            f"(or SchedulerConfig(queue_depths={{{pool!r}: {depth * 2}}}), "
            f"or `gpuflow schedule submit --queue-depth {depth * 2}`)"
        )


class NoCapacityError(HardwareError):
    """A valid request that cannot be placed now, and the caller chose not to wait."""


def canonical_sku(name: str) -> str:
    """The full SKU name for an alias ("a100-40gb"); names outside the table pass unchanged
    (a real device of a model our tables do not know is still schedulable)."""
    try:
        return sku_spec(name).name
    except InvalidRequestError:
        return name


class JobRequest(BaseModel):
    """What a job asks the scheduler for. ``count`` is the minimum size, ``max_count`` the
    most an elastic job may grow to (absent: exactly ``count``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(description="Names the job, its leases and its control channel.")
    count: int = Field(default=1, ge=1, le=100_000, description="Units wanted (the minimum).")
    max_count: int | None = Field(default=None, ge=1, le=100_000, description="Elastic maximum.")
    nodes: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Whole devices on exactly this many nodes, count/nodes on each (a gang "
        "of one agent per node); None: wherever the policy puts them.",
    )
    profile: str | None = Field(
        default=None, description="None: whole devices; a MIG profile (3g.20gb); or 'vdcu'."
    )
    compute_units: int | None = Field(default=None, ge=1, description="vDCU compute units.")
    memory_mb: int | None = Field(default=None, ge=1, description="vDCU memory (MiB).")
    skus: tuple[str, ...] = Field(
        default=(), description="Accepted SKUs, preferred first; empty: any."
    )
    region: str | None = Field(default=None, description="Region (pool); None: any region.")
    allow_spill: bool = Field(
        default=False, description="May run in another region if its own is full."
    )
    priority: int = Field(default=0, ge=-1000, le=1000, description="Higher preempts lower.")
    policy: Literal["binpack", "spread", "first-fit"] | None = None
    resource_ids: tuple[str, ...] = Field(default=(), description="Pin the job to these resources.")
    start_at_s: float | None = Field(default=None, description="A reservation: start at this time.")
    duration_s: float | None = Field(
        default=None, gt=0, description="Expected run time (estimate)."
    )
    preemptible: bool = True

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str) -> str:
        if not _JOB_ID.match(value):
            raise ValueError(f"job_id {value!r}: use 1-128 letters, digits, '_', '.', '-'")
        return value

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is None or value == VDCU:
            return value
        from gpuflow.hardware.partition import normalize_profile

        return normalize_profile(value)  # raises ValueError on a malformed name

    @field_validator("skus")
    @classmethod
    def _skus(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for name in value:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"a SKU must be a non-empty name, got {name!r}")
            full = canonical_sku(name.strip())
            if full not in out:
                out.append(full)
        return tuple(out)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or value == ANY_REGION):
            raise ValueError(f"region must be a region name, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobRequest:
        if self.max_count is not None and self.max_count < self.count:
            raise ValueError(f"max_count {self.max_count} is below count {self.count}")
        if self.profile != VDCU and (self.compute_units is not None or self.memory_mb is not None):
            raise ValueError("compute_units / memory_mb size a vDCU: set profile='vdcu'")
        if self.nodes is not None:
            self._check_nodes()
        if self.resource_ids:
            if len(set(self.resource_ids)) != len(self.resource_ids):
                raise ValueError("resource_ids names a resource twice")
            if self.count != len(self.resource_ids) or self.elastic:
                raise ValueError(
                    f"a pinned job takes exactly its {len(self.resource_ids)} resource(s): "
                    f"count must equal that and max_count stay unset"
                )
        return self

    def _check_nodes(self) -> None:
        nodes = self.nodes or 1
        if self.count % nodes:
            raise ValueError(
                f"nodes {nodes}: count {self.count} does not split evenly (each node runs "
                f"the same number of ranks; ask for a multiple of {nodes})"
            )
        for what, bad in (
            ("max_count (an elastic gang)", self.elastic),
            ("a profile (partitions)", self.profile is not None),
            ("resource_ids (the pinned units name their nodes)", bool(self.resource_ids)),
            ("start_at_s (a reservation)", self.start_at_s is not None),
        ):
            if bad:
                raise ValueError(f"nodes {nodes} cannot be combined with {what}")

    @property
    def per_node(self) -> int:
        """Units on each of its nodes (``nodes`` set), else its whole count."""
        return self.count // (self.nodes or 1)

    @property
    def kind(self) -> str:
        if self.profile is None:
            return "device"
        return VDCU if self.profile == VDCU else "mig"

    @property
    def min_units(self) -> int:
        return self.count

    @property
    def max_units(self) -> int:
        return self.max_count or self.count

    @property
    def elastic(self) -> bool:
        return self.max_units > self.min_units

    @property
    def pool(self) -> str:
        """The queue it waits in: its region, or ANY_REGION."""
        return self.region or ANY_REGION

    def describe(self) -> str:
        size = f"{self.count}" if not self.elastic else f"{self.count}..{self.max_units}"
        what = {"device": "device", "mig": self.profile, VDCU: "vDCU"}[self.kind]
        if self.kind == VDCU and (self.compute_units or self.memory_mb):
            what += f" ({self.compute_units or '?'} CUs, {self.memory_mb or '?'} MiB)"
        skus = f" of {'/'.join(self.skus)}" if self.skus else ""
        where = f" in {self.region}" if self.region else ""
        spread = f" on {self.nodes} node(s)" if self.nodes else ""
        return f"{size} x {what}{skus}{spread}{where}"


def parse_queue_depths(text: str) -> tuple[int | None, dict[str, int]]:
    """``"8"``, ``"cn-north=16"`` or ``"8,cn-north=16"`` -> (default, per pool)."""
    default: int | None = None
    per_pool: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, number = part.rpartition("=")
        try:
            depth = int(number)
        except ValueError:
            raise InvalidRequestError(
                f"{QUEUE_DEPTH_ENV}: {part!r} is not a depth (write 8, or pool=16)"
            ) from None
        if depth < 1:
            raise InvalidRequestError(f"{QUEUE_DEPTH_ENV}: depth must be >= 1, got {depth}")
        if name:
            per_pool[name.strip()] = depth
        else:
            default = depth
    return default, per_pool


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine decides. Binpack by default, so whole devices and whole nodes stay
    free for large jobs; ``node_local_gangs`` keeps a gang that fits on one node on one
    node (NVLink), as Philly's scheduler did for locality."""

    policy: str = "binpack"
    preemption: bool = True
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    queue_depths: Mapping[str, int] = field(default_factory=dict)
    node_local_gangs: bool = True
    reservation_lead_s: float = 600.0  # a reservation starts holding capacity this early
    lease_ttl_s: float = 300.0
    grow_elastic: bool = True
    fifo: bool = False  # queue in arrival order, ignoring priority (first-fit always does)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidRequestError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}")
        for pool, depth in {"default": self.queue_depth, **dict(self.queue_depths)}.items():
            if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                raise InvalidRequestError(
                    f"queue depth for {pool} must be an integer >= 1, got {depth!r}"
                )
        if self.reservation_lead_s < 0 or self.lease_ttl_s <= 0:
            raise InvalidRequestError("reservation_lead_s must be >= 0 and lease_ttl_s > 0")

    def depth(self, pool: str) -> int:
        return int(self.queue_depths.get(pool, self.queue_depth))

    @classmethod
    def from_env(cls, **overrides: Any) -> SchedulerConfig:
        """Defaults, then GPUFLOW_QUEUE_DEPTH ("8", "cn-north=16", "8,cn-east=4"), then
        ``overrides`` (None values are ignored)."""
        values: dict[str, Any] = {}
        text = os.environ.get(QUEUE_DEPTH_ENV, "").strip()
        if text:
            default, per_pool = parse_queue_depths(text)
            if default is not None:
                values["queue_depth"] = default
            if per_pool:
                values["queue_depths"] = per_pool
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# -- decisions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where a job runs. With ``repartition`` steps the job is not placed yet: carry them
    out (``Engine.apply_repartition``) and the partitions they create are held for it."""

    job_id: str
    region: str
    sku: str
    kind: str
    resource_ids: tuple[str, ...]
    nodes: tuple[str, ...]
    repartition: tuple[Any, ...] = ()  # RepartitionStep (tasks.scheduling.repartition)

    @property
    def ready(self) -> bool:
        return not self.repartition

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "region": self.region,
            "sku": self.sku,
            "kind": self.kind,
            "resource_ids": list(self.resource_ids),
            "nodes": list(self.nodes),
            "repartition": [s.to_dict() for s in self.repartition],
        }


@dataclass(frozen=True)
class Eviction:
    """One victim: checkpoint-and-stop, then ``preempt`` (re-queued whole) or ``shrink``
    (an elastic job gives up ``release`` and restarts on the rest)."""

    job_id: str
    action: Literal["preempt", "shrink"]
    release: tuple[str, ...]
    work_at_risk_s: float  # device-seconds since its last checkpoint
    priority: int


@dataclass(frozen=True)
class Preemption:
    job_id: str  # the job the room is made for
    region: str
    sku: str
    node: str | None  # a node-local gang's node
    evictions: tuple[Eviction, ...]

    @property
    def work_at_risk_s(self) -> float:
        return sum(e.work_at_risk_s for e in self.evictions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "region": self.region,
            "sku": self.sku,
            "node": self.node,
            "victims": [
                {
                    "job_id": e.job_id,
                    "action": e.action,
                    "release": list(e.release),
                    "work_at_risk_s": round(e.work_at_risk_s, 3),
                    "priority": e.priority,
                }
                for e in self.evictions
            ],
        }


@dataclass(frozen=True)
class Growth:
    """An elastic job below its maximum gets ``add``; it restarts through a checkpoint."""

    job_id: str
    add: tuple[str, ...]


@dataclass(frozen=True)
class HoldChange:
    """A reservation took (more) capacity to hold for its start time."""

    job_id: str
    added: tuple[str, ...]


@dataclass(frozen=True)
class Activation:
    """A reservation reached its start time and now competes in the queue."""

    job_id: str
