"""Where a job runs: lease a device or partition from the inventory, bind torch to it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.hardware.inventory import Inventory, Lease, LeaseConflictError, Resource
from gpuflow.hardware.skus import SkuSpec, sku
from pydantic import BaseModel, Field, model_validator

log = logging.getLogger(__name__)


class DeviceRequest(BaseModel):
    """What a job asks for: a whole device of a SKU, a partition of a profile, or one by id."""

    sku: str | None = Field(
        default=None, description="SKU name or alias (a100-40gb, v100, dcu-z100...)"
    )
    profile: str | None = Field(
        default=None, description="MIG profile (3g.20gb...) or 'vdcu'; none: a whole device"
    )
    resource_id: str | None = Field(default=None, description="A device or partition uuid")
    resource_ids: list[str] | None = Field(
        default=None,
        description="A gang pinned to these units (remediation's homogeneous target set)",
    )
    region: str | None = None

    @model_validator(mode="after")
    def _one_pin(self) -> DeviceRequest:
        if self.resource_ids is not None:
            if self.resource_id is not None:
                raise ValueError("pin one resource_id or a gang's resource_ids, not both")
            if not self.resource_ids or len(set(self.resource_ids)) != len(self.resource_ids):
                raise ValueError(f"resource_ids {self.resource_ids!r}: give distinct unit ids")
        return self

    @property
    def pinned(self) -> tuple[str, ...]:
        """The units this request is pinned to (none: the scheduler chooses)."""
        if self.resource_ids:
            return tuple(self.resource_ids)
        return (self.resource_id,) if self.resource_id else ()


@dataclass(frozen=True)
class Binding:
    resource: Resource
    lease: Lease
    sku: SkuSpec | None
    torch_device: torch.device
    backend_name: str


def torch_device_for(backend: Backend) -> torch.device:
    """The twin's devices run their jobs on this machine's CPU; real ones on CUDA/ROCm."""
    if backend.name != "sim" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def lease_device(
    inventory: Inventory,
    backend: Backend,
    request: DeviceRequest,
    owner: str,
    ttl_s: float = 300.0,
    attempt: int = 0,
) -> Binding:
    """Lease the first free resource matching ``request`` to (``owner``, ``attempt``);
    refuse clearly when none is."""
    if not inventory.devices():
        inventory.sync(backend)
    sku_name = sku(request.sku).name if request.sku else None
    if request.resource_id:
        candidates = [inventory.resource(request.resource_id)]
    else:
        kind = None if request.profile is None else ("vdcu" if request.profile == "vdcu" else "mig")
        candidates = inventory.free_resources(
            sku=sku_name,
            kind=kind or "device",
            profile=request.profile if kind == "mig" else None,
            region=request.region,
        )
    for res in candidates:
        try:
            lease = inventory.acquire_lease(res.resource_id, owner, ttl_s, attempt=attempt)
        except LeaseConflictError:
            continue  # another process took it between the query and the lease
        spec = _sku_or_none(res.sku)
        log.info(
            "job %s leased %s (%s on %s:%d)",
            owner,
            res.resource_id,
            res.sku,
            res.node,
            res.device_index,
        )
        return Binding(res, lease, spec, torch_device_for(backend), backend.name)
    raise InvalidRequestError(
        f"no free resource matches {request.model_dump(exclude_none=True) or 'any device'}: "
        "all are leased, cordoned, unhealthy or on spare nodes"
    )


def _sku_or_none(name: str) -> SkuSpec | None:
    try:
        return sku(name)
    except InvalidRequestError:
        return None  # a real device of a model the tables do not know: no SKU limits


def bind_held_lease(
    inventory: Inventory, backend: Backend, resource_id: str, owner: str, attempt: int
) -> Binding | None:
    """The Binding of a lease already held on ``resource_id`` by (``owner``, ``attempt``)
    (a placement someone else made); None when that attempt does not hold it."""
    lease = inventory.lease(resource_id)
    if lease is None or lease.owner != owner or lease.attempt != attempt:
        return None
    res = inventory.resource(resource_id)
    return Binding(res, lease, _sku_or_none(res.sku), torch_device_for(backend), backend.name)


def attempt_resources(inventory: Inventory, job_id: str, attempt: int, primary: str) -> list[str]:
    """Every unit the attempt was placed on, ``primary`` first: what its runner keeps
    leased. A gang trained by one process (a scheduled job of N units whose spec asks for
    one GPU) still keeps all N, so the scheduler never has to renew a running job's
    leases for it."""
    record = inventory.job(job_id)
    placed = list(record.resource_ids) if record.attempt == attempt else []
    return [primary, *(r for r in placed if r != primary)]
