"""Reading the fleet, cordons, the spare pool, device health and what is free to lease."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError, TelemetrySample
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import (
    StoreBase,
    check_choice,
    check_name,
    device_record,
    node_record,
)
from gpuflow.hardware.inventory.records import (
    NODE_ROLES,
    RESOURCE_KINDS,
    Cordon,
    DeviceRecord,
    DeviceSlot,
    NodeRecord,
    PartitionRecord,
    Resource,
)
from gpuflow.hardware.skus import sku as sku_spec
from sqlalchemy import Connection, Row, delete, insert, select, update

_TUPLE_FIELDS = ("clock_event_reasons", "xids")


def _canonical_sku(name: str) -> str:
    """Full SKU name for an alias ("a100-40gb"); names outside the table pass unchanged."""
    try:
        return sku_spec(name).name
    except InvalidRequestError:
        return name


class FleetMixin(StoreBase):
    # -- nodes, devices, partitions ------------------------------------------------------
    def nodes(self) -> list[NodeRecord]:
        with self._read() as conn:
            rows = conn.execute(select(schema.nodes).order_by(schema.nodes.c.name))
            return [node_record(r) for r in rows]

    def node(self, name: str) -> NodeRecord:
        with self._read() as conn:
            return node_record(self._node_row(conn, name))

    def devices(
        self, node: str | None = None, *, present: bool | None = None
    ) -> list[DeviceRecord]:
        """Devices (absent ones too, unless ``present`` says otherwise), by node and index."""
        d = schema.devices
        with self._read() as conn:
            query = select(d).order_by(d.c.node, d.c.device_index, d.c.present.desc())
            if node is not None:
                self._node_row(conn, node)
                query = query.where(d.c.node == node)
            if present is not None:
                query = query.where(d.c.present == bool(present))
            return [device_record(r) for r in conn.execute(query)]

    @staticmethod
    def _device_slots(conn: Connection) -> list[DeviceSlot]:
        """Present devices by node and index, as placements see them (no telemetry: most
        of a monitored device's row, and nothing a placement decides on)."""
        d = schema.devices
        query = (
            select(
                d.c.node,
                d.c.device_index,
                d.c.uuid,
                d.c.vendor,
                d.c.sku,
                d.c.memory_total_mb,
                d.c.partition_kinds,
                d.c.healthy,
            )
            .where(d.c.present == True)  # noqa: E712
            .order_by(d.c.node, d.c.device_index)
        )
        return [
            DeviceSlot(
                r.node,
                r.device_index,
                r.uuid,
                r.vendor,
                r.sku,
                r.memory_total_mb,
                tuple(k for k in r.partition_kinds.split(",") if k),
                bool(r.healthy),
            )
            for r in conn.execute(query)
        ]

    def device(self, node: str, index: int) -> DeviceRecord:
        """The device at node:index (the present one, else the one last seen there)."""
        with self._read() as conn:
            return device_record(self._device_row(conn, node, index))

    def partitions(
        self, node: str | None = None, index: int | None = None
    ) -> list[PartitionRecord]:
        """Partitions recorded, by node, device and placement; optionally of one node/device."""
        d = schema.devices
        if index is not None and node is None:
            raise InvalidRequestError("partitions(index=...) needs the node as well")
        with self._read() as conn:
            where = []
            if node is not None:
                self._node_row(conn, node)
                where.append(d.c.node == node)
            if index is not None:
                where.append(d.c.uuid == self._device_row(conn, node, index).uuid)
            return self._partition_records(conn, *where)

    @staticmethod
    def _partition_records(conn: Connection, *where: Any) -> list[PartitionRecord]:
        """Partitions with their device's place (one join), by node, device and placement."""
        d, p = schema.devices, schema.partitions
        query = select(p, d.c.node.label("dev_node"), d.c.device_index.label("dev_index")).join(
            d, d.c.uuid == p.c.device_uuid
        )
        out = [
            PartitionRecord(
                uuid=r.uuid,
                node=r.dev_node,
                device_index=r.dev_index,
                device_uuid=r.device_uuid,
                profile=r.profile,
                kind=r.kind,
                memory_mb=r.memory_mb,
                compute_units=r.compute_units,
                placement_start=r.placement_start,
                placement_size=r.placement_size,
            )
            for r in conn.execute(query.where(*where))
        ]
        out.sort(key=lambda r: (r.node, r.device_index, r.placement_start or 0, r.uuid))
        return out

    def last_telemetry(self, node: str, index: int) -> TelemetrySample | None:
        """The newest telemetry sample recorded for the device, or None."""
        data = self.device(node, index).telemetry
        if data is None:
            return None
        fields = dict(data)
        for name in _TUPLE_FIELDS:
            # JSON keeps lists; null is a field the device's backend cannot read.
            value = fields.get(name, ())
            fields[name] = None if value is None else tuple(value)
        return TelemetrySample(**fields)

    def set_device_health(
        self, node: str, index: int, healthy: bool, reason: str | None = None
    ) -> DeviceRecord:
        """Mark a device healthy or not (the health model's verdict); unhealthy is not free."""
        if not isinstance(healthy, bool):
            raise InvalidRequestError(f"healthy must be True or False, got {healthy!r}")
        if reason is not None:
            check_name(reason, "health reason")

        def work(conn: Connection) -> DeviceRecord:
            row = self._device_row(conn, node, index)
            d = schema.devices
            conn.execute(
                update(d).where(d.c.uuid == row.uuid).values(healthy=healthy, health_reason=reason)
            )
            return device_record(conn.execute(select(d).where(d.c.uuid == row.uuid)).one())

        return self._write(work)

    # -- spare pool ----------------------------------------------------------------------
    def spare_nodes(self) -> list[NodeRecord]:
        return [n for n in self.nodes() if n.role == "spare"]

    def set_node_role(self, node: str, role: str) -> NodeRecord:
        """Move a node between the active fleet and the spare pool; later syncs keep it."""
        check_choice(role, NODE_ROLES, "node role")

        def work(conn: Connection) -> NodeRecord:
            self._node_row(conn, node)
            n = schema.nodes
            conn.execute(update(n).where(n.c.name == node).values(role=role))
            return node_record(conn.execute(select(n).where(n.c.name == node)).one())

        return self._write(work)

    # -- cordons -------------------------------------------------------------------------
    def cordon(self, node: str, index: int | None = None, reason: str = "") -> Cordon:
        """Keep new leases off a device, or off a whole node (``index`` None).

        A device cordon follows the physical device (its uuid) if NVML renumbers.
        Cordoning again replaces the reason. Existing leases are left alone.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRequestError("a cordon needs a reason (who or what asked, and why)")

        def work(conn: Connection) -> Cordon:
            target = schema.NODE_CORDON
            if index is None:
                self._node_row(conn, node)
            else:
                target = self._device_row(conn, node, index).uuid
            c = schema.cordons
            match = (c.c.node == node) & (c.c.device_uuid == target)
            if conn.execute(select(c.c.id).where(match)).first() is None:
                conn.execute(
                    insert(c).values(
                        node=node, device_uuid=target, reason=reason, created_at=self._clock()
                    )
                )
            else:
                conn.execute(update(c).where(match).values(reason=reason))
            return self._cordon_record(conn.execute(select(c).where(match)).one(), index)

        return self._write(work)

    def uncordon(self, node: str, index: int | None = None) -> bool:
        """Lift a device's or a node's cordon; False when there was none. A node's uncordon
        leaves its device cordons in place."""

        def work(conn: Connection) -> bool:
            target = schema.NODE_CORDON
            if index is None:
                self._node_row(conn, node)
            else:
                target = self._device_row(conn, node, index).uuid
            c = schema.cordons
            result = conn.execute(delete(c).where(c.c.node == node, c.c.device_uuid == target))
            return result.rowcount > 0

        return self._write(work)

    def is_cordoned(self, node: str, index: int | None = None) -> bool:
        """Whether the node (``index`` None), or the device, is cordoned; a node cordon
        covers every device on it."""
        with self._read() as conn:
            if index is None:
                self._node_row(conn, node)
                c = schema.cordons
                hit = conn.execute(
                    select(c.c.id).where(c.c.node == node, c.c.device_uuid == schema.NODE_CORDON)
                ).first()
                return hit is not None
            row = self._device_row(conn, node, index)
            return bool(self._cordon_rows(conn, node, row.uuid))

    def cordons(self) -> list[Cordon]:
        with self._read() as conn:
            return self._cordon_records(conn)

    @classmethod
    def _cordon_records(cls, conn: Connection) -> list[Cordon]:
        c, d = schema.cordons, schema.devices
        rows = conn.execute(
            select(c, d.c.device_index)
            .select_from(c.outerjoin(d, d.c.uuid == c.c.device_uuid))
            .order_by(c.c.node, c.c.id)
        )
        return [cls._cordon_record(r, r.device_index) for r in rows]

    # -- leasable resources --------------------------------------------------------------
    def free_resources(
        self,
        sku: str | None = None,
        kind: str | None = None,
        profile: str | None = None,
        region: str | None = None,
        include_cordoned: bool = False,
    ) -> list[Resource]:
        """Resources a new lease could take now, by node, device and placement.

        Free means: not under an unexpired lease; its device present and healthy; its node
        active (not in the spare pool); not cordoned (unless ``include_cordoned``). A device
        that has partitions is never free as a whole; a partition is not free while its
        device is leased whole. ``sku`` takes full names or aliases ("a100-40gb").
        """
        if kind is not None:
            check_choice(kind, RESOURCE_KINDS, "resource kind")
        for value, what in ((sku, "sku"), (profile, "profile"), (region, "region")):
            if value is not None:
                check_name(value, what)
        want_sku = _canonical_sku(sku) if sku is not None else None
        with self._read() as conn:
            return [
                r
                for r in self._resources(conn, include_cordoned=include_cordoned, free_only=True)
                if (want_sku is None or r.sku == want_sku)
                and (kind is None or r.kind == kind)
                and (profile is None or r.profile == profile)
                and (region is None or r.region == region)
            ]

    def resource(self, resource_id: str) -> Resource:
        """The resource with this id, free or not."""
        return self.resources_by_id([resource_id])[0]

    def resources_by_id(self, resource_ids: Sequence[str]) -> list[Resource]:
        """The resources with these ids, in that order, free or not, from one read: a
        handful of indexed look-ups, whatever the fleet's size (a placement asks this for
        every unit it starts). An unknown id raises InvalidRequestError naming it."""
        ids = [check_name(r, "resource id") for r in resource_ids]
        if not ids:
            return []
        d_t, p_t, n_t, c_t = schema.devices, schema.partitions, schema.nodes, schema.cordons
        with self._read() as conn:
            devs = {r.uuid: r for r in conn.execute(select(d_t).where(d_t.c.uuid.in_(ids)))}
            rest = [r for r in ids if r not in devs]
            parts = (
                {r.uuid: r for r in conn.execute(select(p_t).where(p_t.c.uuid.in_(rest)))}
                if rest
                else {}
            )
            for rid in rest:
                if rid not in parts:
                    self._resolve(conn, rid)  # raises: unknown resource, named
            owners = sorted({p.device_uuid for p in parts.values()} - set(devs))
            if owners:
                devs.update(
                    (r.uuid, r) for r in conn.execute(select(d_t).where(d_t.c.uuid.in_(owners)))
                )
            names = sorted({r.node for r in devs.values()})
            region = {
                r.name: r.region
                for r in conn.execute(select(n_t.c.name, n_t.c.region).where(n_t.c.name.in_(names)))
            }
            cordoned_nodes: set[str] = set()
            cordoned_devices: set[str] = set()
            for c in conn.execute(
                select(c_t.c.node, c_t.c.device_uuid).where(
                    c_t.c.node.in_(names) | c_t.c.device_uuid.in_(list(devs))
                )
            ):
                if c.device_uuid == schema.NODE_CORDON:
                    cordoned_nodes.add(c.node)
                else:
                    cordoned_devices.add(c.device_uuid)
        out = []
        for rid in ids:
            p = parts.get(rid)
            d = devs[rid] if p is None else devs[p.device_uuid]
            if d.node not in region:
                raise InvalidRequestError(f"resource {rid!r} is on an unknown node")
            out.append(
                Resource(
                    resource_id=rid,
                    kind="device" if p is None else p.kind,
                    node=d.node,
                    device_index=d.device_index,
                    device_uuid=d.uuid,
                    vendor=d.vendor,
                    sku=d.sku,
                    region=region[d.node],
                    memory_mb=d.memory_total_mb if p is None else p.memory_mb,
                    compute_units=None if p is None else p.compute_units,
                    profile=None if p is None else p.profile,
                    placement_start=None if p is None else p.placement_start,
                    cordoned=d.node in cordoned_nodes or d.uuid in cordoned_devices,
                )
            )
        return out

    def _resources(
        self, conn: Connection, *, include_cordoned: bool, free_only: bool
    ) -> list[Resource]:
        n_t, d_t, p_t, l_t, c_t = (
            schema.nodes,
            schema.devices,
            schema.partitions,
            schema.leases,
            schema.cordons,
        )
        now = self._clock()
        node_rows = {r.name: r for r in conn.execute(select(n_t))}
        leased = set(
            conn.execute(select(l_t.c.resource_id).where(l_t.c.expires_at > now)).scalars()
        )
        cordoned_nodes: set[str] = set()
        cordoned_devices: set[str] = set()
        for c in conn.execute(select(c_t.c.node, c_t.c.device_uuid)):
            if c.device_uuid == schema.NODE_CORDON:
                cordoned_nodes.add(c.node)
            else:
                cordoned_devices.add(c.device_uuid)
        parts_by_device: dict[str, list[Row[Any]]] = {}
        for p in conn.execute(select(p_t).order_by(p_t.c.placement_start, p_t.c.uuid)):
            parts_by_device.setdefault(p.device_uuid, []).append(p)

        out: list[Resource] = []
        query = select(d_t).order_by(d_t.c.node, d_t.c.device_index)
        if free_only:
            query = query.where(d_t.c.present == True, d_t.c.healthy == True)  # noqa: E712
        for d in conn.execute(query):
            node = node_rows[d.node]
            cordoned = d.node in cordoned_nodes or d.uuid in cordoned_devices
            if free_only and (node.role != "active" or (cordoned and not include_cordoned)):
                continue
            common = {
                "node": d.node,
                "device_index": d.device_index,
                "device_uuid": d.uuid,
                "vendor": d.vendor,
                "sku": d.sku,
                "region": node.region,
                "cordoned": cordoned,
            }
            parts = parts_by_device.get(d.uuid, [])
            whole_leased = d.uuid in leased
            if not free_only or (not parts and not whole_leased):
                out.append(
                    Resource(
                        resource_id=d.uuid,
                        kind="device",
                        memory_mb=d.memory_total_mb,
                        compute_units=None,
                        profile=None,
                        placement_start=None,
                        **common,
                    )
                )
            if free_only and whole_leased:
                continue
            for p in parts:
                if free_only and p.uuid in leased:
                    continue
                out.append(
                    Resource(
                        resource_id=p.uuid,
                        kind=p.kind,
                        memory_mb=p.memory_mb,
                        compute_units=p.compute_units,
                        profile=p.profile,
                        placement_start=p.placement_start,
                        **common,
                    )
                )
        return out
