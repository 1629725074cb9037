"""Refreshing the inventory from a backend: discovery, partitions and telemetry.

The backend is asked everything first, outside any transaction (tool calls can be slow
and must not hold the SQLite write lock); what it said is then applied in one write
transaction, so readers see the old fleet or the new one, never half of each.

Scope: only the nodes this backend reported are touched. On several hosts sharing a
PostgreSQL inventory each host's NVML backend sees its own node only, and must not mark
the others' devices missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    NodeInfo,
    Partition,
    TelemetrySample,
)
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import (
    StoreBase,
    check_choice,
    check_index,
    check_name,
    lease_record,
    mig_compute_slices,
)
from gpuflow.hardware.inventory.records import NODE_ROLES, SyncReport
from sqlalchemy import Connection, delete, insert, select, update

_DEVICE_FIELDS = (
    "node",
    "device_index",
    "vendor",
    "sku",
    "memory_total_mb",
    "pci_device_id",
    "partition_kinds",
)
_PARTITION_FIELDS = (
    "device_uuid",
    "profile",
    "kind",
    "memory_mb",
    "compute_units",
    "placement_start",
    "placement_size",
)


def _key(node: str, index: int) -> str:
    return f"{node}:{index}"


def _device_values(d: DeviceInfo) -> dict[str, Any]:
    return {
        "node": d.node,
        "device_index": d.index,
        "vendor": d.vendor,
        "sku": d.sku,
        "memory_total_mb": int(d.memory_total_mb),
        "pci_device_id": d.pci_device_id,
        "partition_kinds": ",".join(d.partition_kinds),
    }


def _partition_values(p: Partition, device_uuid: str) -> dict[str, Any]:
    units = p.compute_units
    if units is None and p.kind == "mig":
        units = mig_compute_slices(p.profile)
    return {
        "device_uuid": device_uuid,
        "profile": p.profile,
        "kind": p.kind,
        "memory_mb": int(p.memory_mb),
        "compute_units": units,
        "placement_start": p.placement_start,
        "placement_size": p.placement_size,
    }


class _Discovery:
    """What the backend said, checked for consistency before anything is written."""

    def __init__(self, backend: Backend) -> None:
        self.nodes: list[NodeInfo] = list(backend.discover())
        self.devices: dict[str, DeviceInfo] = {}  # uuid -> device
        self.partitions: dict[str, list[Partition]] = {}  # device uuid -> partitions (read)
        self.lost: set[str] = set()  # device uuids that answered DeviceLostError
        self.errors: list[str] = []
        node_names: set[str] = set()
        slots: set[tuple[str, int]] = set()
        partition_ids: set[str] = set()
        for n in self.nodes:
            check_name(n.name, "node name")
            check_name(n.region, f"region of node {n.name!r}")
            check_choice(n.role, NODE_ROLES, f"role of node {n.name!r}")
            if n.name in node_names:
                raise InvalidRequestError(
                    f"backend {backend.name!r} reported node {n.name!r} twice"
                )
            node_names.add(n.name)
            for d in n.devices:
                where = _key(n.name, d.index)
                if d.node != n.name:
                    raise InvalidRequestError(f"device {where} says it is on node {d.node!r}")
                check_index(d.index)
                check_name(d.uuid, f"uuid of device {where}")
                if (d.node, d.index) in slots or d.uuid in self.devices:
                    raise InvalidRequestError(
                        f"backend {backend.name!r} reported device {where} (uuid {d.uuid}) twice"
                    )
                slots.add((d.node, d.index))
                self.devices[d.uuid] = d
                try:
                    parts = list(backend.partitions(d.node, d.index))
                except DeviceLostError as exc:
                    self.lost.add(d.uuid)
                    self.errors.append(f"{where}: device lost: {exc}")
                    continue
                except HardwareError as exc:
                    # Keep what we had: an unreadable device is not an empty one.
                    self.errors.append(f"{where}: partitions unreadable: {exc}")
                    continue
                for p in parts:
                    check_name(p.uuid, f"partition uuid on {where}")
                    if (p.node, p.device_index) != (d.node, d.index):
                        raise InvalidRequestError(
                            f"partition {p.uuid} listed under {where} says it is on "
                            f"{_key(p.node, p.device_index)}"
                        )
                    check_choice(p.kind, ("mig", "vdcu"), f"kind of partition {p.uuid}")
                    if p.uuid in partition_ids:
                        raise InvalidRequestError(f"partition uuid {p.uuid} reported twice")
                    partition_ids.add(p.uuid)
                self.partitions[d.uuid] = parts
        clash = partition_ids & set(self.devices)
        if clash:
            raise InvalidRequestError(f"ids used by a device and a partition: {sorted(clash)}")


class SyncMixin(StoreBase):
    def sync(self, backend: Backend) -> SyncReport:
        """Record what ``backend`` sees now: nodes, devices and partitions.

        New things are added and changed ones updated; devices of a reported node that
        it no longer lists are marked not present (their leases are kept and reported at
        risk); partitions that no longer exist are removed and any lease on one is ended
        and reported. A node's role comes from the backend only when the node is first
        recorded: after that the inventory (``set_node_role``) decides.
        """
        if not isinstance(backend, Backend):
            raise InvalidRequestError(
                f"sync needs a hardware Backend, got {type(backend).__name__}"
            )
        found = _Discovery(backend)
        now = self._clock()
        return self._write(lambda conn: self._apply(conn, backend.name, found, now))

    def _apply(
        self, conn: Connection, backend_name: str, found: _Discovery, now: float
    ) -> SyncReport:
        r: dict[str, list[Any]] = {k: [] for k in SyncReport.__dataclass_fields__ if k != "backend"}
        r["errors"].extend(found.errors)
        n_t, d_t, p_t, l_t = schema.nodes, schema.devices, schema.partitions, schema.leases

        # Nodes.
        for n in found.nodes:
            row = conn.execute(select(n_t).where(n_t.c.name == n.name)).first()
            if row is None:
                conn.execute(
                    insert(n_t).values(
                        name=n.name,
                        region=n.region,
                        role=n.role,
                        backend=backend_name,
                        first_seen=now,
                        last_seen=now,
                    )
                )
                r["nodes_added"].append(n.name)
                continue
            if (row.region, row.backend) != (n.region, backend_name):
                r["nodes_updated"].append(n.name)
            conn.execute(
                update(n_t)
                .where(n_t.c.name == n.name)
                .values(region=n.region, backend=backend_name, last_seen=now)
            )

        # Devices: everything we knew on the reported nodes, plus reported uuids seen elsewhere.
        node_names = [n.name for n in found.nodes]
        before = {
            row.uuid: row
            for row in conn.execute(
                select(d_t).where(d_t.c.node.in_(node_names) | d_t.c.uuid.in_(list(found.devices)))
            )
        }
        at_risk: list[str] = []
        # Phase 1 frees present slots first, so renumbering (NVML shifts indexes when a
        # GPU drops off) and swaps never trip the unique present-slot index mid-way.
        for uuid, row in before.items():
            d = found.devices.get(uuid)
            moving = d is not None and (row.node, row.device_index) != (d.node, d.index)
            if row.present and (d is None or moving):
                conn.execute(update(d_t).where(d_t.c.uuid == uuid).values(present=False))
            if row.present and d is None:
                r["devices_missing"].append(_key(row.node, row.device_index))
                at_risk.append(uuid)
        for uuid, d in found.devices.items():
            values = _device_values(d)
            present = uuid not in found.lost
            row = before.get(uuid)
            if row is None:
                conn.execute(
                    insert(d_t).values(
                        uuid=uuid, present=present, healthy=True, last_seen=now, **values
                    )
                )
                r["devices_added"].append(_key(d.node, d.index))
                continue
            if any(getattr(row, f) != values[f] for f in _DEVICE_FIELDS):
                r["devices_updated"].append(_key(d.node, d.index))
            if present and not row.present:
                r["devices_returned"].append(_key(d.node, d.index))
            if row.present and not present:
                r["devices_missing"].append(_key(d.node, d.index))
                at_risk.append(uuid)
            conn.execute(
                update(d_t)
                .where(d_t.c.uuid == uuid)
                .values(present=present, last_seen=now, **values)
            )

        # Partitions of the devices whose partitions could be read.
        read_devices = list(found.partitions)
        reported = {p.uuid: (p, dev) for dev, ps in found.partitions.items() for p in ps}
        known = {
            row.uuid: row
            for row in conn.execute(
                select(p_t).where(
                    p_t.c.device_uuid.in_(read_devices) | p_t.c.uuid.in_(list(reported))
                )
            )
        }
        taken = (
            conn.execute(select(d_t.c.uuid).where(d_t.c.uuid.in_(list(reported)))).scalars().all()
        )
        if taken:
            raise InvalidRequestError(f"partition ids already used by devices: {sorted(taken)}")
        gone = [row for uuid, row in known.items() if uuid not in reported]
        for row in gone:
            lease = conn.execute(select(l_t).where(l_t.c.resource_id == row.uuid)).first()
            if lease is not None:
                drow = conn.execute(select(d_t).where(d_t.c.uuid == row.device_uuid)).one()
                r["leases_ended"].append(
                    lease_record(lease, row.kind, drow.node, drow.device_index)
                )
                conn.execute(delete(l_t).where(l_t.c.resource_id == row.uuid))
            conn.execute(delete(p_t).where(p_t.c.uuid == row.uuid))
            r["partitions_removed"].append(row.uuid)
        for uuid, (p, dev) in reported.items():
            values = _partition_values(p, dev)
            row = known.get(uuid)
            if row is None:
                conn.execute(insert(p_t).values(uuid=uuid, **values))
                r["partitions_added"].append(uuid)
            elif any(getattr(row, f) != values[f] for f in _PARTITION_FIELDS):
                conn.execute(update(p_t).where(p_t.c.uuid == uuid).values(**values))
                r["partitions_updated"].append(uuid)

        # A device leased whole that now has partitions: double booking ahead; say so.
        for dev, ps in found.partitions.items():
            if not ps:
                continue
            lease = conn.execute(select(l_t).where(l_t.c.resource_id == dev)).first()
            if lease is not None and lease.expires_at > now:
                d = found.devices[dev]
                r["errors"].append(
                    f"{_key(d.node, d.index)}: leased whole by {lease.owner!r} but now has "
                    f"{len(ps)} partition(s)"
                )

        if at_risk:
            rows = list(conn.execute(select(l_t).where(l_t.c.resource_id.in_(at_risk))))
            r["leases_at_risk"] = self._leases_from_rows(conn, rows)
        return SyncReport(backend=backend_name, **{k: tuple(v) for k, v in r.items()})

    def record_telemetry(self, samples: Iterable[TelemetrySample]) -> int:
        """Store each device's latest sample; returns how many were newer than what we had.

        A sample saying ``present=False`` marks the device absent (fell off the bus); one
        from a device that answers marks it present again. All samples are checked first:
        one unknown device rejects the whole batch and nothing is written.
        """
        batch = list(samples)
        for s in batch:
            if not isinstance(s, TelemetrySample):
                raise InvalidRequestError(f"not a TelemetrySample: {s!r}")
        return self._write(lambda conn: self._store_samples(conn, batch))

    def _store_samples(self, conn: Connection, batch: list[TelemetrySample]) -> int:
        d_t = schema.devices
        rows = [self._device_row(conn, s.node, s.index) for s in batch]  # validate all first
        applied = 0
        for s, row in zip(batch, rows, strict=True):
            # Re-read: an earlier sample of this batch may have been for the same device.
            current = conn.execute(select(d_t.c.telemetry_at).where(d_t.c.uuid == row.uuid)).one()
            if current.telemetry_at is not None and s.timestamp_s < current.telemetry_at:
                continue  # out of order: keep the newer one
            conn.execute(
                update(d_t)
                .where(d_t.c.uuid == row.uuid)
                .values(
                    telemetry=s.to_dict(),
                    telemetry_at=float(s.timestamp_s),
                    present=bool(s.present),
                )
            )
            applied += 1
        return applied
