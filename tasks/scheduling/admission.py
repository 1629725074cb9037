"""Admission: the pools that could ever run a request, or why none can.

A request is refused up front (SubmissionRefused, nothing queued) when no pool of the
fleet's *shape* could hold it: a profile no allowed SKU offers, a vDCU bigger than a DCU,
an unknown region, SKU or pinned resource, or more units than a pool has. Capacity counts
present devices on active nodes, cordoned and unhealthy ones included (they may come
back). Spare nodes do not count: the engine never places on them, so a request that fits
only with them would wait forever; it is refused naming the spares to promote first.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuflow.tasks.scheduling.fleet_index import Dev, FleetIndex, PoolKey
from gpuflow.tasks.scheduling.model import VDCU, JobRequest, SubmissionRefused
from gpuflow.tasks.scheduling.state import Job


def feasible_pools(fleet: FleetIndex, request: JobRequest) -> tuple[PoolKey, ...]:
    """The pools that could ever run ``request``, best first; SubmissionRefused with the
    reason when there are none."""
    if not fleet.pools:
        raise SubmissionRefused("the scheduler knows no devices yet (sync the inventory first)")
    if request.resource_ids:
        return _pinned_pool(fleet, request)
    regions = fleet.regions()
    if request.region is not None and request.region not in regions:
        raise SubmissionRefused(
            f"unknown region {request.region!r}; the fleet has: {', '.join(regions)}"
        )
    if request.region is None:
        allowed_regions = regions
    elif request.allow_spill:
        allowed_regions = [request.region] + [r for r in regions if r != request.region]
    else:
        allowed_regions = [request.region]
    in_regions = [s for s in fleet.skus() if any((r, s) in fleet.pools for r in allowed_regions)]
    skus = list(request.skus) if request.skus else in_regions
    missing = [s for s in skus if s not in in_regions]
    if request.skus and len(missing) == len(skus):
        raise SubmissionRefused(
            f"no {' / '.join(skus)} in {' / '.join(allowed_regions)}; "
            f"the fleet there has: {', '.join(in_regions) or 'nothing'}"
        )
    skus = [s for s in skus if s not in missing]
    fitting: list[PoolKey] = []
    reasons: list[str] = []
    for s in skus:
        for r in allowed_regions:
            if (r, s) not in fleet.pools:
                continue
            per_device, why = units_per_device(fleet, request, (r, s))
            cap = capacity(fleet, request, (r, s), per_device)
            if cap < request.count:
                reasons.append(why or _short_of(fleet, request, (r, s), cap, per_device))
            elif request.nodes and (spread := _short_of_nodes(fleet, request, (r, s))):
                reasons.append(spread)
            else:
                fitting.append((r, s))
    if not fitting:
        what = request.describe()
        detail = "; ".join(dict.fromkeys(reasons)) or "no pool matches"
        raise SubmissionRefused(f"no fleet of this shape can run {what}: {detail}")
    return tuple(fitting)


def candidates(fleet: FleetIndex, job: Job) -> tuple[PoolKey, ...]:
    """The job's feasible pools, recomputed only when the fleet's shape changed; () while
    the fleet is smaller than the job (it waits for the fleet to return)."""
    if job.shape_version != fleet.shape_version:
        try:
            job.candidates = feasible_pools(fleet, job.request)
        except SubmissionRefused:
            job.candidates = ()
        job.shape_version = fleet.shape_version
    return job.candidates


def units_per_device(fleet: FleetIndex, request: JobRequest, key: PoolKey) -> tuple[int, str]:
    """How many units of the request's kind one device of the pool holds at most, and why
    none; -1 when only the pool's existing partitions count (a SKU the tables do not know)."""
    region, sku = key
    if request.kind == "device":
        return 1, ""
    spec = next((d.spec for d in _pool_devices(fleet, key)), None)
    if request.kind == "mig":
        if spec is not None and spec.supports_mig:
            prof = next((p for p in spec.mig_profiles if p.name == request.profile), None)
            if prof is None:
                offered = ", ".join(p.name for p in spec.mig_profiles)
                return 0, f"{sku} offers no MIG profile {request.profile} (it offers {offered})"
            return prof.max_count, ""
        if spec is None and (region, sku, request.profile or "") in fleet.parts:
            return -1, ""
        return 0, f"{sku} has no MIG"
    if spec is None or not spec.supports_vdcu:
        return 0, f"{sku} offers no vDCUs"
    cu, mb = request.compute_units or 1, request.memory_mb or 1
    if cu > spec.compute_units or mb > spec.memory_total_mb:
        return 0, (
            f"a vDCU of {cu} CUs / {mb} MiB exceeds a whole {sku} "
            f"({spec.compute_units} CUs, {spec.memory_total_mb} MiB)"
        )
    return min(spec.vdcu_max_count, spec.compute_units // cu, spec.memory_total_mb // mb), ""


def capacity(fleet: FleetIndex, request: JobRequest, key: PoolKey, per_device: int) -> int:
    """The most units of the request's kind the pool's active nodes could ever hold."""
    if per_device < 0:
        return fleet.parts[(key[0], key[1], request.profile or "")].count
    return fleet.pools[key].active_devices * per_device


def _short_of(
    fleet: FleetIndex, request: JobRequest, key: PoolKey, cap: int, per_device: int
) -> str:
    """Why the pool is too small: its size, and the spare nodes that would make it fit."""
    region, sku = key
    spares = fleet.pools[key].spare_devices
    if per_device <= 0 or not spares:
        return f"{region}/{sku} has room for at most {cap}"
    # The fewest spares that close the gap: the biggest first, then by name.
    needed: list[str] = []
    total = cap
    for node, devices in sorted(spares.items(), key=lambda kv: (-kv[1], kv[0])):
        if total >= request.count:
            break
        needed.append(node)
        total += devices * per_device
    if total < request.count:
        return (
            f"{region}/{sku} has room for at most {cap} "
            f"({total} with its spare nodes {', '.join(sorted(spares))})"
        )
    what = {"device": "devices", "mig": f"{request.profile} instances", VDCU: "vDCUs"}
    names = ", ".join(needed)
    return (
        f"it needs {request.count} {what[request.kind]} of {sku}; the active {region} pool "
        f"has {cap}; spare node(s) {names} would make it fit: promote them first "
        f"(set_node_role(name, 'active')), the scheduler does not place on spares"
    )


def _short_of_nodes(fleet: FleetIndex, request: JobRequest, key: PoolKey) -> str:
    """Why the pool cannot give ``request.nodes`` active nodes of ``per_node`` devices
    each ("" if it can)."""
    on_node: dict[str, int] = {}
    for d in _pool_devices(fleet, key):
        if fleet.nodes[d.node].active:
            on_node[d.node] = on_node.get(d.node, 0) + 1
    big = sorted(n for n, k in on_node.items() if k >= request.per_node)
    if len(big) >= (request.nodes or 1):
        return ""
    return (
        f"{key[0]}/{key[1]} has {len(big)} node(s) with {request.per_node} or more devices "
        f"({', '.join(big) or 'none'}), not {request.nodes}"
    )


def _pool_devices(fleet: FleetIndex, key: PoolKey) -> Iterator[Dev]:
    for name in fleet.pools[key].nodes:
        for d in fleet.nodes[name].devices:
            if d.sku == key[1]:
                yield d


def _pinned_pool(fleet: FleetIndex, request: JobRequest) -> tuple[PoolKey, ...]:
    units = []
    for rid in request.resource_ids:
        unit = fleet.units.get(rid)
        if unit is None:
            raise SubmissionRefused(
                f"unknown resource {rid!r}: not a device or partition of the fleet"
            )
        units.append(unit)
    pools = {u.pool for u in units}
    kinds = {(u.kind, u.profile) for u in units}
    if len(pools) > 1 or len(kinds) > 1:
        raise SubmissionRefused(
            f"pinned resources must be one kind on one SKU in one region; got {sorted(pools)} "
            f"and {sorted(k for k, _ in kinds)}"
        )
    kind, profile = next(iter(kinds))
    if kind != request.kind or (kind == "mig" and profile != request.profile):
        what = profile if kind == "mig" else kind
        raise SubmissionRefused(
            f"pinned resources are {what} units, the request asks for {request.describe()}"
        )
    return (next(iter(pools)),)
