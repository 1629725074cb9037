"""Repartitioning proposals: when no existing MIG/vDCU partition fits, which device to cut.

A proposal is a list of steps, one per device: partitions to destroy (only free ones) and
partitions to create. Each step also renders as a partition plan in mig-parted's format
(hardware.partition), scoped to that one device, so an operator can review it or
apply it with ``gpuflow hw partition apply``. Fitting uses the same exact placement search
as the partition plans (hardware.placement.fit_mig), memoised per (SKU, layout, profile):
a fleet of thousands of devices has only a handful of distinct layouts.

Devices are tried in this order (binpack; spread tries whole devices before idle cut ones):
additive cuts beside busy partitions, idle cut devices (destroy, recreate), whole idle
devices. A whole-device request may instead merge idle cut devices back. While a step is
under way the job holds its device (nobody else takes it mid-cut); ``apply_step`` records
the cut once carried out, ``abandon_step`` lets the device go.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError, PartitionRequest
from gpuflow.hardware.placement import LayoutError, Occupied, fit_mig
from gpuflow.hardware.skus import SkuSpec
from gpuflow.tasks.scheduling.fleet_index import Dev, FleetIndex, PoolKey, Unit
from gpuflow.tasks.scheduling.model import QUEUED, RESERVED, VDCU, Placement, SchedulerConfig
from gpuflow.tasks.scheduling.placement import (
    choose_node,
    node_local,
    pick_parts,
    pick_whole,
    vdcu_candidates,
)
from gpuflow.tasks.scheduling.state import Job, hold

Signature = tuple[tuple[int, int, int, str], ...]


@dataclass(frozen=True)
class RepartitionStep:
    """Cut one device for ``job_id``: destroy ``destroy`` (free partitions), then create."""

    job_id: str
    node: str
    index: int
    device_uuid: str
    sku: str
    kind: str  # mig | vdcu
    destroy: tuple[str, ...]
    create: tuple[PartitionRequest, ...]
    keep: tuple[tuple[str, int | None, int | None], ...] = ()  # (profile, CUs, MiB) left as is

    @classmethod
    def on_device(
        cls,
        job_id: str,
        dev: Dev,
        kind: str,
        destroy: tuple[str, ...] = (),
        create: tuple[PartitionRequest, ...] = (),
        keep: tuple[tuple[str, int | None, int | None], ...] = (),
    ) -> RepartitionStep:
        return cls(job_id, dev.node, dev.index, dev.uuid, dev.sku, kind, destroy, create, keep)

    def desired_layout(self) -> dict[str, Any]:
        """The device's whole layout after the step, as a mig-parted plan entry."""
        entry: dict[str, Any] = {
            "device-filter": [self.sku],
            "devices": [self.index],
            "nodes": [self.node],
            "mig-enabled": True,
        }
        if not self.create and not self.keep:
            # A merge: the device goes back to whole (MIG off; no vDCUs).
            entry["mig-enabled"] = False
            entry["mig-devices"] = {}
            return entry
        if self.kind == "mig":
            counts = Counter(p for p, _, _ in self.keep) + Counter(r.profile for r in self.create)
            entry["mig-devices"] = dict(sorted(counts.items()))
        else:
            entry["mig-devices"] = {}
            entry["vdcu-devices"] = [
                {"compute-units": cu, "memory-mb": mb} for _, cu, mb in self.keep
            ] + [{"compute-units": r.compute_units, "memory-mb": r.memory_mb} for r in self.create]
        return entry

    def plan_document(self) -> dict[str, Any]:
        """A one-device partition plan (mig-parted ``version: v1``)."""
        return {"version": "v1", "mig-configs": {f"gpuflow-{self.job_id}": [self.desired_layout()]}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "node": self.node,
            "index": self.index,
            "device_uuid": self.device_uuid,
            "sku": self.sku,
            "kind": self.kind,
            "destroy": list(self.destroy),
            "create": [{k: v for k, v in vars(r).items() if v is not None} for r in self.create],
            "plan": self.plan_document(),
        }


def plan_for(steps: list[RepartitionStep] | tuple[RepartitionStep, ...]) -> dict[str, Any]:
    """All steps of one proposal as a single plan document."""
    entries = [s.desired_layout() for s in steps]
    name = f"gpuflow-{steps[0].job_id}" if steps else "gpuflow-empty"
    return {"version": "v1", "mig-configs": {name: entries}}


@lru_cache(maxsize=4096)
def mig_fit(
    spec: SkuSpec, layout: Signature, profile: str, want: int
) -> tuple[PartitionRequest, ...]:
    """The most instances of ``profile`` (up to ``want``) that fit beside ``layout``, with
    their placements; () when none does or the SKU lacks the profile."""
    if not spec.supports_mig or all(p.name != profile for p in spec.mig_profiles):
        return ()
    existing = [Occupied(start, size, slices) for start, size, slices, _ in layout]
    counts = Counter(name for _, _, _, name in layout)
    best: tuple[PartitionRequest, ...] = ()
    for m in range(1, want + 1):
        try:
            fitted = fit_mig(
                spec.name, spec.mig_profiles, [PartitionRequest(profile)] * m, existing, counts
            )
        except LayoutError:
            break
        best = tuple(fitted)
    return best


# -- proposals ------------------------------------------------------------------------


def propose(fleet: FleetIndex, job: Job, pool: PoolKey, policy: str) -> Placement | None:
    """Cut devices so the partitions the job needs exist; hold what it will use."""
    req = job.request
    if req.kind == VDCU:
        have = vdcu_candidates(fleet, pool, req)
    else:
        have = pick_parts(fleet, (pool[0], pool[1], req.profile or ""), req.min_units, policy)
    need = req.min_units - len(have)
    if need <= 0:
        return None  # placement would have placed it
    steps = (
        _vdcu_steps(fleet, job, pool, need)
        if req.kind == VDCU
        else _mig_steps(fleet, job, pool, need, policy)
    )
    if steps is None:
        return None
    return _waiting_for(fleet, job, pool, have[: req.min_units], steps)


def propose_merge(
    fleet: FleetIndex, config: SchedulerConfig, job: Job, pool: PoolKey
) -> Placement | None:
    """Whole devices wanted, too few free: merge idle cut devices back into whole ones."""
    idle = [fleet.devices[u] for u in fleet.idle_parted.get(pool, {})]
    if not idle:
        return None
    req = job.request
    p = fleet.pools[pool]
    if node_local(config, fleet, req, pool):
        by_node: dict[str, list[Dev]] = {}
        for d in idle:
            by_node.setdefault(d.node, []).append(d)
        choice = None
        for node, devs in by_node.items():
            if p.free_on(node) + len(devs) >= req.min_units:
                choice = node
                break
        if choice is None:
            return None
        have = [fleet.units[r] for r in p.node_free.get(choice, {})][: req.min_units]
        merge = by_node[choice][: req.min_units - len(have)]
    else:
        have = pick_whole(fleet, pool, min(req.min_units, p.whole_free), "binpack")
        if len(have) + len(idle) < req.min_units:
            return None
        merge = idle[: req.min_units - len(have)]
    steps = [
        RepartitionStep.on_device(job.job_id, d, "mig" if d.mig else VDCU, destroy=tuple(d.parts))
        for d in merge
    ]
    return _waiting_for(fleet, job, pool, have, steps)


def _waiting_for(
    fleet: FleetIndex, job: Job, pool: PoolKey, have: list[Unit], steps: list[RepartitionStep]
) -> Placement:
    """The job waits for ``steps``, holding the units it will use (``have``) and each
    device being cut, so nobody takes them mid-cut."""
    for u in have:
        fleet.set_holder(u, job.job_id)
        job.holds[u.rid] = u
    for step in steps:
        dev = fleet.devices[step.device_uuid]
        if not dev.parts and dev.whole.free:
            fleet.set_holder(dev.whole, job.job_id)  # the device leaves the whole pool
            job.holds[dev.whole.rid] = dev.whole
        for rid in step.destroy:
            u = fleet.units[rid]
            fleet.set_holder(u, job.job_id)
            job.holds[rid] = u
        fleet.set_pending(dev, job.job_id)
    job.pool_key = pool
    return Placement(
        job_id=job.job_id,
        region=pool[0],
        sku=pool[1],
        kind=job.request.kind,
        resource_ids=tuple(u.rid for u in have),
        nodes=tuple(dict.fromkeys(s.node for s in steps)),
        repartition=tuple(steps),
    )


def _mig_steps(
    fleet: FleetIndex, job: Job, pool: PoolKey, need: int, policy: str
) -> list[RepartitionStep] | None:
    profile = job.request.profile or ""
    steps: list[RepartitionStep] = []
    used: set[str] = set()

    def step(dev: Dev, fitted: tuple[PartitionRequest, ...], destroy: tuple[str, ...] = ()) -> None:
        keep = tuple(
            (p.profile or "", p.compute_units, p.memory_mb)
            for p in dev.parts.values()
            if p.rid not in destroy
        )
        steps.append(RepartitionStep.on_device(job.job_id, dev, "mig", destroy, fitted, keep))
        used.add(dev.uuid)

    def additive() -> int:
        left = need - sum(len(s.create) for s in steps)
        for sig, group in list(fleet.layouts.get(pool, {}).items()):
            if left <= 0:
                break
            for uuid in list(group):
                dev = fleet.devices[uuid]
                if dev.spec is None or uuid in used:
                    continue
                fitted = mig_fit(dev.spec, sig, profile, left)
                if not fitted:
                    break  # the same layout everywhere in the group
                step(dev, fitted)
                left -= len(fitted)
                if left <= 0:
                    break
        return left

    def idle_parted() -> int:
        left = need - sum(len(s.create) for s in steps)
        for uuid in list(fleet.idle_parted.get(pool, {})):
            if left <= 0:
                break
            dev = fleet.devices[uuid]
            if dev.spec is None or uuid in used or not dev.mig:
                continue
            fitted = mig_fit(dev.spec, (), profile, left)
            if fitted:
                step(dev, fitted, destroy=tuple(dev.parts))
                left -= len(fitted)
        return left

    def whole() -> int:
        left = need - sum(len(s.create) for s in steps)
        p = fleet.pools[pool]
        while left > 0:
            node = choose_node(fleet, pool, 1, "binpack" if policy != "spread" else "spread")
            candidates = [
                fleet.units[r].dev
                for r in (p.node_free.get(node, {}) if node else {})
                if fleet.units[r].dev.uuid not in used
            ]
            if not candidates:
                # The chosen node's devices are all used by this proposal: scan the rest.
                candidates = [
                    fleet.units[r].dev
                    for rids in p.node_free.values()
                    for r in rids
                    if fleet.units[r].dev.uuid not in used
                ][:1]
            if not candidates:
                break
            dev = candidates[0]
            fitted = mig_fit(dev.spec, (), profile, left) if dev.spec and dev.mig else ()
            if not fitted:
                break
            step(dev, fitted)
            left -= len(fitted)
        return left

    order = (additive, whole, idle_parted) if policy == "spread" else (additive, idle_parted, whole)
    for stage in order:
        if stage() <= 0:
            return steps
    return None


def _vdcu_steps(
    fleet: FleetIndex, job: Job, pool: PoolKey, need: int
) -> list[RepartitionStep] | None:
    req = job.request
    if req.compute_units is None or req.memory_mb is None:
        return None  # an unsized vDCU request takes existing vDCUs only
    cu, mb = req.compute_units, req.memory_mb
    steps: list[RepartitionStep] = []
    devs = [fleet.devices[u] for u in fleet.vdcu_budget.get(pool, {})]
    p = fleet.pools[pool]
    devs += [
        fleet.units[r].dev for rids in p.node_free.values() for r in rids if fleet.units[r].dev.vdcu
    ]
    left = need
    for dev in devs:
        room = fleet.vdcu_room(dev)
        spec = dev.spec
        if room is None or spec is None:
            continue
        slots = spec.vdcu_max_count - len(dev.parts)
        k = min(left, slots, room[0] // cu, room[1] // mb)
        if k <= 0:
            continue
        keep = tuple((VDCU, u.compute_units, u.memory_mb) for u in dev.parts.values())
        create = tuple(PartitionRequest(VDCU, compute_units=cu, memory_mb=mb) for _ in range(k))
        steps.append(RepartitionStep.on_device(job.job_id, dev, VDCU, (), create, keep))
        left -= k
        if left <= 0:
            return steps
    return None


# -- carrying a step out ----------------------------------------------------------------


def apply_step(
    fleet: FleetIndex,
    job: Job | None,
    step: RepartitionStep,
    created: list[tuple[str, PartitionRequest, int, int | None]],
) -> list[Unit]:
    """Record that ``step`` was carried out (see Engine.apply_repartition): the new
    partitions are held for the step's job; the device is no longer pending."""
    dev = fleet.devices.get(step.device_uuid)
    if dev is None:
        raise InvalidRequestError(f"repartitioned device {step.device_uuid!r} is not in the fleet")
    if dev.whole.holder == step.job_id:
        fleet.set_holder(dev.whole, None)
        if job is not None:
            job.holds.pop(dev.whole.rid, None)
    for rid in step.destroy:
        unit = fleet.units.get(rid)
        if unit is not None:
            fleet.set_holder(unit, None)
            fleet.remove_partition(rid)
        if job is not None:
            job.holds.pop(rid, None)
    out = []
    for rid, req, memory_mb, units in created:
        kind = VDCU if req.profile == VDCU else "mig"
        slices = units
        size = None
        if kind == "mig" and dev.spec is not None:
            prof = dev.spec.mig_profile(req.profile)
            slices, size = prof.compute_slices, prof.placement_size
        u = fleet.add_partition(
            dev.uuid,
            rid,
            req.profile,
            kind,
            memory_mb,
            compute_units=slices,
            placement_start=req.placement_start,
            placement_size=size,
        )
        if job is not None and job.state in (QUEUED, RESERVED):
            fleet.set_holder(u, job.job_id)
            job.holds[rid] = u
        out.append(u)
    fleet.set_pending(dev, None)
    if not dev.parts and job is not None and job.state in (QUEUED, RESERVED) and dev.whole.free:
        hold(fleet, job, dev.whole)  # merged back into a whole device, for this job
        out.append(dev.whole)
    return out


def abandon_step(fleet: FleetIndex, job: Job | None, step: RepartitionStep) -> None:
    """The step could not be carried out: release what it held."""
    dev = fleet.devices.get(step.device_uuid)
    if dev is None:
        return
    for u in [dev.whole, *dev.parts.values()]:
        if u.holder == step.job_id:
            fleet.set_holder(u, None)
            if job is not None:
                job.holds.pop(u.rid, None)
    fleet.set_pending(dev, None)
