"""Durable cluster state shared by every gpuflow process (DESIGN.md section 3).

SQLite under GPUFLOW_HOME by default, any SQLAlchemy URL (PostgreSQL) for several hosts.
Holds nodes, devices, partitions, cordons, the spare pool, leases (owner, expiry,
renewal), the per-job control channel and a small jobs registry. Never imports Prefect.
"""

from __future__ import annotations

from gpuflow.hardware.inventory.engine import default_url
from gpuflow.hardware.inventory.records import (
    CONTROL_ACTIONS,
    CONTROL_STATUSES,
    JOB_STATES,
    NODE_ROLES,
    RESOURCE_KINDS,
    ControlRequest,
    ControlTimeoutError,
    Cordon,
    DeviceRecord,
    JobRecord,
    Lease,
    LeaseConflictError,
    LeaseError,
    LeaseNotHeldError,
    NodeRecord,
    PartitionRecord,
    Resource,
    ResourceUnavailableError,
    SyncReport,
)
from gpuflow.hardware.inventory.store import Inventory

__all__ = [
    "CONTROL_ACTIONS",
    "CONTROL_STATUSES",
    "JOB_STATES",
    "NODE_ROLES",
    "RESOURCE_KINDS",
    "ControlRequest",
    "ControlTimeoutError",
    "Cordon",
    "DeviceRecord",
    "Inventory",
    "JobRecord",
    "Lease",
    "LeaseConflictError",
    "LeaseError",
    "LeaseNotHeldError",
    "NodeRecord",
    "PartitionRecord",
    "Resource",
    "ResourceUnavailableError",
    "SyncReport",
    "default_url",
]
