"""One read of everything a scheduler pass decides on: nodes, present devices, partitions,
cordons, unexpired leases and the jobs registry, in a single read transaction.

A pass used to ask for each of them separately; at 10,000 devices and ~3,000 jobs the
separate reads took about twice as long as this one: each device row dragged its
telemetry sample along (JSON, most of a monitored row, never used to place), partitions
were matched to devices with an IN list of every device, cordons built a map of every
device, and each lease's location took two more IN lists. Here partitions, cordons and
leases are located by joins, and on SQLite (WAL) the whole read is one snapshot.
"""

from __future__ import annotations

from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import StoreBase, node_record
from gpuflow.hardware.inventory.fleet import FleetMixin
from gpuflow.hardware.inventory.jobs import JobsMixin
from gpuflow.hardware.inventory.leases import LeaseMixin
from gpuflow.hardware.inventory.records import InventorySnapshot
from sqlalchemy import select


class SnapshotMixin(StoreBase):
    def snapshot(self) -> InventorySnapshot:
        """Nodes, present devices (as DeviceSlots: ``devices()`` has their telemetry),
        partitions, cordons, leases unexpired now and every job, from one transaction."""
        n_t, l_t = schema.nodes, schema.leases
        with self._read() as conn:
            now = self._clock()
            return InventorySnapshot(
                at_s=now,
                nodes=tuple(node_record(r) for r in conn.execute(select(n_t).order_by(n_t.c.name))),
                devices=tuple(FleetMixin._device_slots(conn)),
                partitions=tuple(FleetMixin._partition_records(conn)),
                cordons=tuple(FleetMixin._cordon_records(conn)),
                leases=tuple(LeaseMixin._located_leases(conn, l_t.c.expires_at > now)),
                jobs=tuple(JobsMixin._job_records(conn)),
            )
