"""Placement: which pool a job tries first, and which free units of a pool it gets.

Pure look-ups over the FleetIndex; nothing here changes a unit (the engine holds or starts
what these functions pick). Policies, at node level: binpack takes the node with the
fewest free devices that still fits (whole free nodes stay free for big gangs), spread the
roomiest, first-fit the first in fleet order. At device level partitions go onto devices
that already have busy partitions (binpack), so clean devices stay whole-able. A gang that
fits on one node stays on one node (``node_local_gangs``); bigger ones take whole nodes.
A gang that names its ``nodes`` gets count/nodes devices on each of that many nodes.
"""

from __future__ import annotations

from gpuflow.tasks.scheduling.admission import candidates
from gpuflow.tasks.scheduling.fleet_index import FleetIndex, PoolKey, Unit, spec_or_none
from gpuflow.tasks.scheduling.model import VDCU, JobRequest, SchedulerConfig
from gpuflow.tasks.scheduling.state import Job


def _speed(sku: str) -> float:
    spec = spec_or_none(sku)
    return spec.reduced_tflops if spec is not None else -1.0


def ordered_pools(fleet: FleetIndex, job: Job, policy: str) -> list[PoolKey]:
    """The job's pools in the order it tries them (a job holding units: only theirs)."""
    pools = candidates(fleet, job)
    if job.holds:
        return [job.pool_key] if job.pool_key in pools or job.request.resource_ids else []
    req = job.request
    if req.skus or policy == "first-fit" or len(pools) < 2:
        return list(pools)
    # No stated preference: the fastest SKU that can take the job (the twin's dense
    # reduced-precision throughput; SKUs the tables do not know come last), home region
    # first; pools that cannot take it now go after those that can.
    home = req.region
    free = {p: fleet.free_count(p, req.kind, req.profile) for p in pools}
    return sorted(
        pools,
        key=lambda p: (
            p[0] != home if home else False,
            free[p] < req.min_units,
            -_speed(p[1]),
            p,
        ),
    )


def usable_for(fleet: FleetIndex, unit: Unit, job: Job) -> bool:
    """Whether the job may start on ``unit``: free, or held for it."""
    if unit.owner is not None or unit.holder not in (None, job.job_id):
        return False
    if unit.holder == job.job_id:
        return True
    return fleet.should_be_free(unit)


def node_local(config: SchedulerConfig, fleet: FleetIndex, req: JobRequest, pool: PoolKey) -> bool:
    """Whether the gang must stay on one node of the pool (NVLink): a gang that fits on
    one, unless it asks for its nodes (``nodes``: exactly one node, or several)."""
    if req.nodes is not None:
        return req.nodes == 1
    p = fleet.pools[pool]
    return (
        config.node_local_gangs
        and req.kind == "device"
        and not req.elastic
        and 1 < req.min_units <= p.max_per_node
    )


def pick(
    fleet: FleetIndex, config: SchedulerConfig, job: Job, pool: PoolKey, policy: str
) -> list[Unit] | None:
    """The units the job starts on in ``pool`` (its holds there first); None if too few."""
    req = job.request
    holds = [u for u in job.holds.values() if u.pool == pool]
    free = fleet.free_count(pool, req.kind, req.profile)
    if req.kind == VDCU:
        fits = vdcu_candidates(fleet, pool, req)
        if len(holds) + len(fits) < req.min_units:
            return None
        take = min(req.max_units, len(holds) + len(fits)) - len(holds)
        return holds + fits[: max(0, take)]
    if len(holds) + free < req.min_units:
        return None
    if req.kind == "device" and node_local(config, fleet, req, pool):
        return pick_node_local(fleet, pool, req.min_units, policy, holds)
    if req.nodes:
        return pick_per_node(fleet, pool, req.nodes, req.per_node, policy, holds)
    want = min(req.max_units, len(holds) + free)
    more = max(0, want - len(holds))
    if req.kind == "device":
        picked = pick_whole(fleet, pool, more, policy)
    else:
        picked = pick_parts(fleet, (pool[0], pool[1], req.profile or ""), more, policy)
    return holds + picked


def pick_node_local(
    fleet: FleetIndex, pool: PoolKey, n: int, policy: str, holds: list[Unit]
) -> list[Unit] | None:
    """``n`` whole devices on one node: the node with most of the job's holds, else one
    chosen by the policy."""
    p = fleet.pools[pool]
    if holds:
        by_node: dict[str, list[Unit]] = {}
        for u in holds:
            by_node.setdefault(u.node, []).append(u)
        for node, mine in sorted(by_node.items(), key=lambda kv: -len(kv[1])):
            if len(mine) >= n:
                return mine[:n]
            if len(mine) + p.free_on(node) >= n:
                rids = list(p.node_free.get(node, {}))[: n - len(mine)]
                return mine + [fleet.units[r] for r in rids]
    node = choose_node(fleet, pool, n, policy)
    if node is None:
        return None
    rids = list(p.node_free[node])[:n]
    return [fleet.units[r] for r in rids]


def pick_per_node(
    fleet: FleetIndex, pool: PoolKey, nodes: int, per_node: int, policy: str, holds: list[Unit]
) -> list[Unit] | None:
    """``per_node`` whole devices on each of ``nodes`` nodes (a multi-node gang), in node
    order; None if fewer nodes have room. Nodes holding units for the job come first
    (most held first), then the policy's: the tightest that fit (binpack), the roomiest
    (spread), fleet order (first-fit)."""
    p = fleet.pools[pool]
    held: dict[str, list[Unit]] = {}
    for u in holds:
        held.setdefault(u.node, []).append(u)
    room = {
        node: n for node in p.nodes if (n := len(held.get(node, ())) + p.free_on(node)) >= per_node
    }
    if len(room) < nodes:
        return None
    order = list(room)  # fleet order
    if policy == "binpack":
        order.sort(key=lambda n: room[n])
    elif policy == "spread":
        order.sort(key=lambda n: -room[n])
    order.sort(key=lambda n: -len(held.get(n, ())))  # stable: the policy's order within
    out: list[Unit] = []
    for node in order[:nodes]:
        mine = held.get(node, [])[:per_node]
        rids = list(p.node_free.get(node, {}))[: per_node - len(mine)]
        out.extend(mine + [fleet.units[r] for r in rids])
    return out


def choose_node(fleet: FleetIndex, pool: PoolKey, n: int, policy: str) -> str | None:
    """A node with ``n`` free whole devices: the tightest (binpack), the roomiest (spread),
    the first in fleet order (first-fit)."""
    p = fleet.pools[pool]
    if policy == "first-fit":
        for node in p.nodes:
            if p.free_on(node) >= n:
                return node
        return None
    sizes = range(n, p.max_per_node + 1)
    for k in reversed(sizes) if policy == "spread" else sizes:
        bucket = p.buckets.get(k)
        if bucket:
            return next(iter(bucket))
    return None


def pick_whole(fleet: FleetIndex, pool: PoolKey, n: int, policy: str) -> list[Unit]:
    """``n`` free whole devices of the pool over any nodes (the caller checked the count)."""
    if n <= 0:
        return []
    p = fleet.pools[pool]
    units = fleet.units
    out: list[Unit] = []
    if policy == "first-fit":
        for node in p.nodes:
            for rid in p.node_free.get(node, ()):
                out.append(units[rid])
                if len(out) == n:
                    return out
        return out
    if n <= p.max_per_node:
        node = choose_node(fleet, pool, n, policy)
        if node is not None:
            return [units[r] for r in list(p.node_free[node])[:n]]
    if policy == "spread":
        # One device per node, roomiest nodes first, round after round.
        lists = [
            list(p.node_free[node])
            for k in sorted(p.buckets, reverse=True)
            for node in p.buckets[k]
        ]
        i = 0
        while len(out) < n:
            for rids in lists:
                if i < len(rids):
                    out.append(units[rids[i]])
                    if len(out) == n:
                        return out
            i += 1
        return out
    # Binpack: whole free nodes first (fewest nodes), the remainder on the tightest node.
    rem = n
    skipped: list[str] = []
    for k in sorted(p.buckets, reverse=True):
        for node in p.buckets[k]:
            if k <= rem:
                out.extend(units[r] for r in p.node_free[node])
                rem -= k
                if rem == 0:
                    return out
            else:
                skipped.append(node)
    best = min(skipped, key=lambda node: p.free_on(node), default=None)
    if best is not None and rem > 0:
        out.extend(units[r] for r in list(p.node_free[best])[:rem])
    return out


def pick_parts(fleet: FleetIndex, key: tuple[str, str, str], n: int, policy: str) -> list[Unit]:
    """Up to ``n`` free MIG partitions of (region, SKU, profile): busy devices first
    (binpack), idle ones first (spread), fleet order (first-fit)."""
    if n <= 0:
        return []
    pp = fleet.parts.get(key)
    if pp is None:
        return []
    units = fleet.units
    out: list[Unit] = []
    if policy == "first-fit":
        order = sorted(pp.dev_free, key=lambda u: (fleet.devices[u].node, fleet.devices[u].index))
    else:
        busy = sorted(pp.buckets, reverse=policy != "spread")
        order = [d for b in busy for d in pp.buckets[b]]
    for dev_uuid in order:
        for rid in pp.dev_free[dev_uuid]:
            out.append(units[rid])
            if len(out) == n:
                return out
    return out


def vdcu_candidates(fleet: FleetIndex, pool: PoolKey, req: JobRequest) -> list[Unit]:
    """Free vDCUs at least as big as asked, smallest first (best fit)."""
    free = fleet.vdcu_free.get(pool)
    if not free:
        return []
    cu, mb = req.compute_units or 0, req.memory_mb or 0
    units = [fleet.units[r] for r in free]
    fits = [u for u in units if (u.compute_units or 0) >= cu and u.memory_mb >= mb]
    fits.sort(key=lambda u: (u.memory_mb, u.compute_units or 0, u.rid))
    return fits


def reservation_units(fleet: FleetIndex, config: SchedulerConfig, job: Job) -> list[Unit]:
    """Free units to hold for a reservation, up to its size, in one pool (the one it holds
    in already, else the roomiest of its pools)."""
    req = job.request
    want = req.max_units - len(job.holds)
    if want <= 0:
        return []
    pools = [job.pool_key] if job.pool_key else list(candidates(fleet, job))
    if not job.pool_key and len(pools) > 1:
        pools.sort(key=lambda p: -fleet.free_count(p, req.kind, req.profile))
    for pool in pools:
        if pool is None:
            continue
        if req.kind == VDCU:
            picked = vdcu_candidates(fleet, pool, req)[:want]
        elif req.kind == "mig":
            picked = pick_parts(fleet, (pool[0], pool[1], req.profile or ""), want, "binpack")
        elif node_local(config, fleet, req, pool):
            p = fleet.pools[pool]
            node = next(iter(job.holds.values())).node if job.holds else None
            if node is None:
                node = max(p.node_free, key=lambda n: len(p.node_free[n]), default=None)
            picked = (
                [fleet.units[r] for r in list(p.node_free.get(node, {}))[:want]] if node else []
            )
        else:
            picked = pick_whole(fleet, pool, min(want, fleet.free_count(pool, "device")), "binpack")
        if picked:
            return picked
    return []


def growth_units(fleet: FleetIndex, job: Job) -> list[Unit]:
    """Free units a running elastic job below its maximum could grow onto, in its pool."""
    assert job.pool_key is not None
    req = job.request
    want = req.max_units - len(job.allocation)
    if req.kind == VDCU:
        return vdcu_candidates(fleet, job.pool_key, req)[:want]
    if req.kind == "mig":
        return pick_parts(fleet, (*job.pool_key, req.profile or ""), want, "binpack")
    free = fleet.free_count(job.pool_key, "device")
    return pick_whole(fleet, job.pool_key, min(want, free), "binpack")
