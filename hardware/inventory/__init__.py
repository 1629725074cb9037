"""Durable cluster state shared by every gpuflow process (DESIGN.md section 3).

SQLite under GPUFLOW_HOME by default, any SQLAlchemy URL (PostgreSQL) for several hosts.
Holds nodes, devices, partitions, cordons, the spare pool, leases (owner, expiry,
renewal, attempt, fencing token), the per-job control channel, the scheduler's pass lock,
a jobs registry whose lifecycle is lifecycle.py's state machine, the ledger of power and
clock changes to put back (settings.py) and each job's progress (progress.py). Never
imports Prefect.
"""

from __future__ import annotations

from gpuflow.hardware.inventory.engine import default_url
from gpuflow.hardware.inventory.lifecycle import ACTIVE_STATES, TRANSITIONS, WAITING_STATES
from gpuflow.hardware.inventory.progress import JobProgress
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
    DeviceSlot,
    IllegalTransitionError,
    InventorySnapshot,
    JobConflictError,
    JobRecord,
    JobState,
    JobTransitionError,
    Lease,
    LeaseConflictError,
    LeaseError,
    LeaseLostError,
    LeaseNotHeldError,
    LockBusyError,
    NodeRecord,
    PartitionRecord,
    Resource,
    ResourceUnavailableError,
    SyncReport,
)
from gpuflow.hardware.inventory.setting_records import SettingRecord, SettingsConflictError
from gpuflow.hardware.inventory.store import Inventory

__all__ = [
    "ACTIVE_STATES",
    "TRANSITIONS",
    "WAITING_STATES",
    "CONTROL_ACTIONS",
    "CONTROL_STATUSES",
    "JOB_STATES",
    "NODE_ROLES",
    "RESOURCE_KINDS",
    "ControlRequest",
    "ControlTimeoutError",
    "Cordon",
    "DeviceRecord",
    "DeviceSlot",
    "IllegalTransitionError",
    "Inventory",
    "InventorySnapshot",
    "JobConflictError",
    "JobProgress",
    "JobRecord",
    "JobState",
    "JobTransitionError",
    "Lease",
    "LeaseConflictError",
    "LeaseError",
    "LeaseLostError",
    "LeaseNotHeldError",
    "LockBusyError",
    "NodeRecord",
    "PartitionRecord",
    "Resource",
    "ResourceUnavailableError",
    "SettingRecord",
    "SettingsConflictError",
    "SyncReport",
    "default_url",
]
