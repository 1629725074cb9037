"""The engine's in-memory picture of the fleet, indexed so a decision costs O(pools), not O(devices).

A *pool* is one (region, SKU): a gang never leaves one. Per pool the index keeps:

- whole devices: the free ones per node, and nodes bucketed by how many they have free, so
  binpack (smallest bucket that fits) and spread (largest) are a few dict look-ups;
- MIG partitions per (region, SKU, profile): the free ones per device, devices bucketed by
  how many of their partitions are busy (binpack fills busy devices first, so clean ones
  stay whole-able);
- vDCUs: the free ones, and DCUs with budget left for another vDCU;
- partitioned MIG devices grouped by layout (the set of instances on them), so "can k more
  3g.20gb fit anywhere?" is one placement search per distinct layout, memoised.

Every change to a device (who holds what, cordons, health, partitions) goes through
``reindex``, which removes exactly what the device added before and adds it again: the
index cannot drift from the units it describes. ``audit`` recomputes it from scratch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.skus import SkuSpec
from gpuflow.hardware.skus import sku as sku_spec

PoolKey = tuple[str, str]  # (region, sku)
PartKey = tuple[str, str, str]  # (region, sku, profile)
Signature = tuple[tuple[int, int, int, str], ...]  # (start, size, compute slices, profile)


def spec_or_none(name: str) -> SkuSpec | None:
    try:
        return sku_spec(name)
    except InvalidRequestError:
        return None


@dataclass(eq=False, slots=True)
class Unit:
    """One leasable thing: a whole device (rid = its uuid) or one partition."""

    rid: str
    kind: str  # device | mig | vdcu
    dev: Dev
    profile: str | None = None
    memory_mb: int = 0
    compute_units: int | None = None  # vDCU CUs, or MIG compute slices
    placement_start: int | None = None
    placement_size: int | None = None
    owner: str | None = None  # the job running on it (or "external:<owner>")
    holder: str | None = None  # the job it is held for (reservation, preemptor, restart)
    earmark: str | None = None  # a victim frees it for this preemptor

    @property
    def free(self) -> bool:
        return self.owner is None and self.holder is None

    @property
    def node(self) -> str:
        return self.dev.node

    @property
    def pool(self) -> PoolKey:
        return (self.dev.region, self.dev.sku)


@dataclass(eq=False, slots=True)
class Dev:
    uuid: str
    node: str
    index: int
    sku: str
    vendor: str
    region: str
    memory_mb: int
    spec: SkuSpec | None
    mig: bool  # offers MIG
    vdcu: bool  # offers vDCUs
    whole: Unit = field(init=False)
    parts: dict[str, Unit] = field(default_factory=dict)
    usable: bool = True  # present, healthy, on an active node
    cordoned: bool = False
    node_cordoned: bool = False
    pending_for: str | None = None  # a repartition for this job is under way
    # What _index added, so _unindex removes exactly that.
    ix_whole: bool = False
    ix_parts: list[PartKey] = field(default_factory=list)
    ix_busy: int = 0
    ix_vdcu: list[str] = field(default_factory=list)
    ix_layout: Signature | None = None
    ix_budget: bool = False
    ix_idle: bool = False

    @property
    def pool(self) -> PoolKey:
        return (self.region, self.sku)

    @property
    def available(self) -> bool:
        return self.usable and not self.cordoned and not self.node_cordoned

    @property
    def busy(self) -> int:
        return sum(1 for p in self.parts.values() if not p.free)

    @property
    def whole_free(self) -> bool:
        return self.available and not self.parts and self.whole.free and self.pending_for is None

    def signature(self) -> Signature:
        return tuple(
            sorted(
                (
                    p.placement_start or 0,
                    p.placement_size or 0,
                    p.compute_units or 0,
                    p.profile or "",
                )
                for p in self.parts.values()
            )
        )

    def label(self) -> str:
        return f"{self.node}:{self.index} ({self.sku})"


@dataclass(slots=True)
class Node:
    name: str
    region: str
    active: bool = True
    cordoned: bool = False
    devices: list[Dev] = field(default_factory=list)


class Pool:
    """Whole devices of one (region, SKU): free ones per node, nodes bucketed by free count."""

    __slots__ = (
        "key",
        "nodes",
        "node_free",
        "buckets",
        "whole_free",
        "devices",
        "active_devices",
        "spare_devices",
        "max_per_node",
    )

    def __init__(self, key: PoolKey) -> None:
        self.key = key
        self.nodes: dict[str, None] = {}  # fleet order
        self.node_free: dict[str, dict[str, None]] = {}  # node -> free device rids
        self.buckets: dict[int, dict[str, None]] = {}  # free count -> nodes
        self.whole_free = 0
        self.devices = 0  # present devices, whatever their state
        # The pool's shape (what admission counts): devices on active nodes, whatever
        # their state; spare nodes' devices apart, per node (never placed on).
        self.active_devices = 0
        self.spare_devices: dict[str, int] = {}
        self.max_per_node = 0  # on one active node

    def add_free(self, node: str, rid: str) -> None:
        d = self.node_free.setdefault(node, {})
        k = len(d)
        if k:
            del self.buckets[k][node]
        d[rid] = None
        self.buckets.setdefault(k + 1, {})[node] = None
        self.whole_free += 1

    def remove_free(self, node: str, rid: str) -> None:
        d = self.node_free[node]
        k = len(d)
        del self.buckets[k][node]
        del d[rid]
        if d:
            self.buckets.setdefault(k - 1, {})[node] = None
        else:
            del self.node_free[node]
        self.whole_free -= 1

    def free_on(self, node: str) -> int:
        d = self.node_free.get(node)
        return len(d) if d else 0


class PartPool:
    """Free MIG partitions of one (region, SKU, profile), devices bucketed by busy count."""

    __slots__ = ("dev_free", "buckets", "count")

    def __init__(self) -> None:
        self.dev_free: dict[str, dict[str, None]] = {}
        self.buckets: dict[int, dict[str, None]] = {}
        self.count = 0


class FleetIndex:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.devices: dict[str, Dev] = {}
        self.units: dict[str, Unit] = {}
        self.pools: dict[PoolKey, Pool] = {}
        self.parts: dict[PartKey, PartPool] = {}
        self.vdcu_free: dict[PoolKey, dict[str, None]] = {}
        self.vdcu_budget: dict[PoolKey, dict[str, None]] = {}
        self.layouts: dict[PoolKey, dict[Signature, dict[str, None]]] = {}
        self.idle_parted: dict[PoolKey, dict[str, None]] = {}
        self.shape_version = 0  # bumps when devices or partitions appear or go

    # -- building --------------------------------------------------------------------
    def add_node(self, name: str, region: str, active: bool = True, cordoned: bool = False) -> Node:
        if name in self.nodes:
            raise InvalidRequestError(f"node {name!r} added twice to the scheduler's index")
        node = Node(name, region, active, cordoned)
        self.nodes[name] = node
        return node

    def add_device(
        self,
        node: str,
        index: int,
        uuid: str,
        sku: str,
        vendor: str,
        memory_mb: int,
        partition_kinds: Iterable[str] = (),
        *,
        healthy: bool = True,
        cordoned: bool = False,
    ) -> Dev:
        n = self.nodes.get(node)
        if n is None:
            raise InvalidRequestError(f"device {uuid!r} is on unknown node {node!r}")
        if uuid in self.units:
            raise InvalidRequestError(f"resource id {uuid!r} added twice to the scheduler's index")
        spec = spec_or_none(sku)
        kinds = set(partition_kinds)
        dev = Dev(
            uuid=uuid,
            node=node,
            index=index,
            sku=sku,
            vendor=vendor,
            region=n.region,
            memory_mb=memory_mb,
            spec=spec,
            mig="mig" in kinds or bool(spec and spec.supports_mig),
            vdcu="vdcu" in kinds or bool(spec and spec.supports_vdcu),
        )
        dev.whole = Unit(rid=uuid, kind="device", dev=dev, memory_mb=memory_mb)
        dev.usable = healthy and n.active
        dev.cordoned = cordoned
        dev.node_cordoned = n.cordoned
        n.devices.append(dev)
        self.devices[uuid] = dev
        self.units[uuid] = dev.whole
        pool = self.pools.get(dev.pool)
        if pool is None:
            pool = self.pools[dev.pool] = Pool(dev.pool)
        pool.nodes[node] = None
        pool.devices += 1
        if n.active:
            pool.active_devices += 1
            on_node = sum(1 for d in n.devices if d.sku == sku)
            pool.max_per_node = max(pool.max_per_node, on_node)
        else:
            pool.spare_devices[node] = pool.spare_devices.get(node, 0) + 1
        self.shape_version += 1
        self._index(dev)
        return dev

    def add_partition(
        self,
        device_uuid: str,
        rid: str,
        profile: str,
        kind: str,
        memory_mb: int,
        compute_units: int | None = None,
        placement_start: int | None = None,
        placement_size: int | None = None,
    ) -> Unit:
        dev = self.devices.get(device_uuid)
        if dev is None:
            raise InvalidRequestError(f"partition {rid!r} is on unknown device {device_uuid!r}")
        if rid in self.units:
            raise InvalidRequestError(f"resource id {rid!r} added twice to the scheduler's index")
        self._unindex(dev)
        unit = Unit(
            rid=rid,
            kind=kind,
            dev=dev,
            profile=profile,
            memory_mb=memory_mb,
            compute_units=compute_units,
            placement_start=placement_start,
            placement_size=placement_size,
        )
        dev.parts[rid] = unit
        self.units[rid] = unit
        self.shape_version += 1
        self._index(dev)
        return unit

    def remove_partition(self, rid: str) -> None:
        unit = self.units.get(rid)
        if unit is None or unit.kind == "device":
            raise InvalidRequestError(f"no partition {rid!r} in the scheduler's index")
        if not unit.free:
            raise InvalidRequestError(
                f"partition {rid!r} is in use by {unit.owner or unit.holder!r}"
            )
        dev = unit.dev
        self._unindex(dev)
        del dev.parts[rid]
        del self.units[rid]
        self.shape_version += 1
        self._index(dev)

    # -- state changes -----------------------------------------------------------------
    def set_owner(self, unit: Unit, owner: str | None) -> None:
        self._unindex(unit.dev)
        unit.owner = owner
        self._index(unit.dev)

    def set_holder(self, unit: Unit, holder: str | None) -> None:
        self._unindex(unit.dev)
        unit.holder = holder
        self._index(unit.dev)

    def set_pending(self, dev: Dev, job_id: str | None) -> None:
        self._unindex(dev)
        dev.pending_for = job_id
        self._index(dev)

    def set_device(
        self, uuid: str, *, healthy: bool | None = None, cordoned: bool | None = None
    ) -> Dev:
        dev = self.devices.get(uuid)
        if dev is None:
            raise InvalidRequestError(f"no device {uuid!r} in the scheduler's index")
        self._unindex(dev)
        if healthy is not None:
            dev.usable = healthy and self.nodes[dev.node].active
        if cordoned is not None:
            dev.cordoned = cordoned
        self._index(dev)
        return dev

    def set_node_cordon(self, node: str, cordoned: bool) -> None:
        n = self.nodes.get(node)
        if n is None:
            raise InvalidRequestError(f"no node {node!r} in the scheduler's index")
        n.cordoned = cordoned
        for dev in n.devices:
            self._unindex(dev)
            dev.node_cordoned = cordoned
            self._index(dev)

    def device_at(self, node: str, index: int) -> Dev:
        n = self.nodes.get(node)
        if n is None:
            raise InvalidRequestError(f"no node {node!r} in the scheduler's index")
        for dev in n.devices:
            if dev.index == index:
                return dev
        raise InvalidRequestError(
            f"no device {node}:{index}; node {node!r} has {[d.index for d in n.devices]}"
        )

    # -- reading -------------------------------------------------------------------------
    def regions(self) -> list[str]:
        return sorted({k[0] for k in self.pools})

    def skus(self) -> list[str]:
        return sorted({k[1] for k in self.pools})

    def free_count(self, pool: PoolKey, kind: str, profile: str | None = None) -> int:
        if kind == "device":
            p = self.pools.get(pool)
            return p.whole_free if p else 0
        if kind == "mig":
            pp = self.parts.get((pool[0], pool[1], profile or ""))
            return pp.count if pp else 0
        d = self.vdcu_free.get(pool)
        return len(d) if d else 0

    def free_units(self) -> Iterator[Unit]:
        """Every unit the index lists as free (for audits and tests)."""
        for pool in self.pools.values():
            for rids in pool.node_free.values():
                for rid in rids:
                    yield self.units[rid]
        for pp in self.parts.values():
            for rids in pp.dev_free.values():
                for rid in rids:
                    yield self.units[rid]
        for rids in self.vdcu_free.values():
            for rid in rids:
                yield self.units[rid]

    def should_be_free(self, unit: Unit) -> bool:
        """What the index must say about ``unit``, derived from first principles."""
        dev = unit.dev
        if unit.kind == "device":
            return dev.whole_free
        return dev.available and dev.whole.free and unit.free

    def audit(self) -> list[str]:
        """Differences between the index and a recomputation from the units; [] if none."""
        problems: list[str] = []
        listed = [u.rid for u in self.free_units()]
        if len(listed) != len(set(listed)):
            problems.append("a unit is listed free twice")
        listed_set = set(listed)
        for rid, unit in self.units.items():
            want = self.should_be_free(unit)
            if want != (rid in listed_set):
                problems.append(f"{rid}: index says free={rid in listed_set}, state says {want}")
        for key, pool in self.pools.items():
            count = sum(len(v) for v in pool.node_free.values())
            if count != pool.whole_free:
                problems.append(f"pool {key}: whole_free {pool.whole_free} != {count}")
            for k, nodes in pool.buckets.items():
                for node in nodes:
                    if pool.free_on(node) != k:
                        problems.append(f"pool {key}: node {node} in bucket {k}")
        for key, pp in self.parts.items():
            count = sum(len(v) for v in pp.dev_free.values())
            if count != pp.count:
                problems.append(f"parts {key}: count {pp.count} != {count}")
        return problems

    # -- the index itself ----------------------------------------------------------------
    def _index(self, dev: Dev) -> None:
        if not dev.available:
            return
        if not dev.parts:
            if dev.whole.free and dev.pending_for is None:
                self.pools[dev.pool].add_free(dev.node, dev.uuid)
                dev.ix_whole = True
            return
        if not dev.whole.free:
            return  # leased whole while partitioned (a sync conflict): nothing on it is free
        busy = dev.busy
        dev.ix_busy = busy
        region, sku = dev.pool
        for p in dev.parts.values():
            if not p.free:
                continue
            if p.kind == "vdcu":
                self.vdcu_free.setdefault(dev.pool, {})[p.rid] = None
                dev.ix_vdcu.append(p.rid)
                continue
            key = (region, sku, p.profile or "")
            pp = self.parts.get(key)
            if pp is None:
                pp = self.parts[key] = PartPool()
            rids = pp.dev_free.get(dev.uuid)
            if rids is None:
                rids = pp.dev_free[dev.uuid] = {}
                pp.buckets.setdefault(busy, {})[dev.uuid] = None
                dev.ix_parts.append(key)
            rids[p.rid] = None
            pp.count += 1
        if dev.pending_for is not None:
            return
        if dev.mig and any(p.kind == "mig" for p in dev.parts.values()):
            sig = dev.signature()
            self.layouts.setdefault(dev.pool, {}).setdefault(sig, {})[dev.uuid] = None
            dev.ix_layout = sig
        if dev.vdcu and dev.spec is not None and self.vdcu_room(dev) is not None:
            self.vdcu_budget.setdefault(dev.pool, {})[dev.uuid] = None
            dev.ix_budget = True
        if busy == 0:
            self.idle_parted.setdefault(dev.pool, {})[dev.uuid] = None
            dev.ix_idle = True

    def _unindex(self, dev: Dev) -> None:
        if dev.ix_whole:
            self.pools[dev.pool].remove_free(dev.node, dev.uuid)
            dev.ix_whole = False
        for key in dev.ix_parts:
            pp = self.parts[key]
            rids = pp.dev_free.pop(dev.uuid)
            pp.count -= len(rids)
            del pp.buckets[dev.ix_busy][dev.uuid]
        dev.ix_parts.clear()
        if dev.ix_vdcu:
            free = self.vdcu_free[dev.pool]
            for rid in dev.ix_vdcu:
                del free[rid]
            dev.ix_vdcu.clear()
        if dev.ix_layout is not None:
            group = self.layouts[dev.pool][dev.ix_layout]
            del group[dev.uuid]
            if not group:
                del self.layouts[dev.pool][dev.ix_layout]
            dev.ix_layout = None
        if dev.ix_budget:
            del self.vdcu_budget[dev.pool][dev.uuid]
            dev.ix_budget = False
        if dev.ix_idle:
            del self.idle_parted[dev.pool][dev.uuid]
            dev.ix_idle = False

    @staticmethod
    def vdcu_room(dev: Dev) -> tuple[int, int] | None:
        """(compute units, MiB) a DCU still has for another vDCU, or None when it has none."""
        spec = dev.spec
        if spec is None or not spec.supports_vdcu:
            return None
        parts = list(dev.parts.values())
        if len(parts) >= spec.vdcu_max_count:
            return None
        cus = spec.compute_units - sum(p.compute_units or 0 for p in parts)
        mem = spec.memory_total_mb - sum(p.memory_mb for p in parts)
        return (cus, mem) if cus > 0 and mem > 0 else None
