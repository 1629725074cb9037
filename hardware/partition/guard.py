"""What an apply checks and settles outside the devices themselves: the inventory.

Before anything changes, ``InventoryGuard.reserve`` takes the devices to change out of
service (one write transaction: refused, naming the leases, if any is leased; cordoned
otherwise, so no lease can start on them meanwhile). After the apply, successful or
rolled back, ``settle`` re-reads the fleet into the inventory (a rollback recreates
partitions under new MIG UUIDs), requeues jobs whose placement names a partition that is
gone, and lifts the reservation. ``settle`` always runs: the apply's finally does it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuflow.hardware.backend import Backend, DeviceInfo
from gpuflow.hardware.inventory import Inventory


class ChangeGuard(Protocol):
    def reserve(self, backend: Backend, devices: Sequence[DeviceInfo], reason: str) -> None:
        """Refuse (DeviceBusyError) or hold the devices for the change."""

    def settle(self, backend: Backend, reason: str) -> dict[str, Any]:
        """After the change: what it invalidated, for the report."""


@dataclass
class InventoryGuard:
    """The durable inventory as an apply's guard."""

    inventory: Inventory
    reserved: list[tuple[str, int]] = field(default_factory=list)

    def reserve(self, backend: Backend, devices: Sequence[DeviceInfo], reason: str) -> None:
        self.inventory.sync(backend)  # the devices must be known to be cordoned
        self.reserved = self.inventory.reserve_devices([(d.node, d.index) for d in devices], reason)

    def settle(self, backend: Backend, reason: str) -> dict[str, Any]:
        try:
            report = self.inventory.sync(backend)
            requeued = self.inventory.invalidate_vanished(f"repartitioned ({reason})")
        finally:
            self.inventory.release_devices(self.reserved, reason)
            self.reserved = []
        return {
            "partitions_added": list(report.partitions_added),
            "partitions_removed": list(report.partitions_removed),
            "leases_ended": [lease.resource_id for lease in report.leases_ended],
            "jobs_requeued": [job.job_id for job in requeued],
        }
