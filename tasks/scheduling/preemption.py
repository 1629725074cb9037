"""Preemption: which running jobs make room for a queued one, and what each gives up.

Only *strictly lower-priority, preemptible* running jobs are victims. A victim either is
preempted (checkpoint-and-stop, re-queued whole) or, an elastic job above its minimum,
*shrinks*: it gives up surplus units through a checkpoint and keeps running on the rest;
shrinks are tried before whole evictions.

The victim order: **lowest priority first**; within one priority, the least work at risk
per freed unit; then the bigger victim (fewer evictions), then the job id. The work a
victim loses is what it did since its last checkpoint (device-seconds: its devices x the
time since that checkpoint): checkpoint-and-stop saves it, but only if the checkpoint
succeeds, and the restart repeats the warm-up either way. A plan is worth (its highest
victim priority, its total work at risk, its number of victims), compared in that order:
a priority-9 job is never evicted where evicting priority-0 jobs makes room.

Exact minimum-cost cover is a knapsack; a decision must take milliseconds, so this is the
classic greedy in victim order, then a pruning pass that drops any chosen victim the
others already cover (highest priority first, then costliest), then the classic fix that
bounds the greedy's error: a single victim that alone covers the need, of no higher
priority than the plan's highest, replaces the plan if it loses less work.

Where to look: the job's pools in its order of preference, skipping pools where lower
priorities hold too few units (RunningIndex); the first pool where eviction makes room
wins. A node-local gang evicts on one node: a lower bound per node first, exact plans in
bound order until the bound exceeds the best plan (branch and bound). A gang that names
its nodes takes the cheapest plans of that many nodes. A pinned job can evict only
whoever runs on its resources.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuflow.tasks.scheduling.fleet_index import PoolKey, Unit
from gpuflow.tasks.scheduling.model import (
    QUEUED,
    RUNNING,
    VDCU,
    Eviction,
    JobRequest,
    Preemption,
)
from gpuflow.tasks.scheduling.placement import node_local, ordered_pools, vdcu_candidates
from gpuflow.tasks.scheduling.state import EngineState, Job


@dataclass(frozen=True)
class Candidate:
    job_id: str
    units: tuple[str, ...]  # the units it would give, useful to the request
    cost: float  # work at risk (device-seconds)
    priority: int
    shrink: bool = False  # an elastic job giving only its surplus


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    release: tuple[str, ...]  # units it frees (a shrink frees only what is needed)


# One victim as the hot path sees it; its first four fields are the victim order, so a
# sorted list or a heap of entries is the greedy's order.
Entry = tuple[int, float, int, str, int, bool, float]
# (priority, cost per freed unit, -units, job, units, shrink, cost)
Score = tuple[int, float, int]  # (highest victim priority, total work at risk, victims)


def cover(entries: Sequence[Entry], need: int) -> tuple[Score, list[Entry]] | None:
    """The victims (in victim order) that free at least ``need`` units, and the plan's
    score; None if all of them together free fewer."""
    if sum(e[4] for e in entries) < need:
        return None
    order = sorted(entries)
    chosen: list[Entry] = []
    got = 0
    for e in order:
        chosen.append(e)
        got += e[4]
        if got >= need:
            break
    for e in sorted(chosen, key=lambda e: (-e[0], -e[6], e[3])):
        if got - e[4] >= need:
            chosen.remove(e)
            got -= e[4]
    top = max(e[0] for e in chosen)
    total = sum(e[6] for e in chosen)
    single = min(
        (e for e in order if e[4] >= need),
        key=lambda e: (e[0], e[6], e[4], e[3]),
        default=None,
    )
    if single is not None and single[0] <= top and single[6] < total:
        return (single[0], single[6], 1), [single]
    return (top, total, len(chosen)), chosen


def choose_victims(need: int, candidates: Sequence[Candidate]) -> list[Choice] | None:
    """The victims (one candidate per job) that free at least ``need`` units, in victim
    order; None if impossible."""
    if need <= 0:
        return []
    usable = {c.job_id: c for c in candidates if c.units}
    entries = [
        (c.priority, c.cost / len(c.units), -len(c.units), c.job_id, len(c.units), c.shrink, c.cost)
        for c in usable.values()
    ]
    found = cover(entries, need)
    if found is None:
        return None
    out: list[Choice] = []
    left = need
    for e in found[1]:
        c = usable[e[3]]
        # A shrink gives only what is still needed; a preempted job frees everything.
        give = c.units[: max(0, left)] if c.shrink else c.units
        if c.shrink and not give:
            continue
        out.append(Choice(c, tuple(give)))
        left -= len(give)
    return out


# -- planning over the engine's state ---------------------------------------------------

Risk = dict[str, tuple[float, float] | None]  # victim -> (work at risk, per unit); None: not one


def plan(state: EngineState, job: Job, now: float) -> Preemption | None:
    """The victims whose units would let the queued ``job`` run, or None."""
    if job.state != QUEUED or job.waiting_for or not state.config.preemption:
        return None
    req = job.request
    if req.resource_ids:
        return _plan_pinned(state, job, now)
    risk: Risk = {}
    for pool in ordered_pools(state.fleet, job, req.policy or state.config.policy):
        units = state.running.units.get(pool)
        if not units or min(units) >= job.priority:
            continue  # nobody lower here
        low = sum(n for prio, n in units.items() if prio < job.priority)
        if low + state.fleet.free_count(pool, req.kind, req.profile) < req.min_units:
            continue  # even evicting every lower job would not make room
        if req.kind == "device" and node_local(state.config, state.fleet, req, pool):
            found = _plan_on_one_node(state, job, pool, now, risk)
        elif req.nodes:
            found = _plan_on_nodes(state, job, pool, now, risk)
        else:
            found = _plan_in_pool(state, job, pool, now)
        if found is not None:
            # The job's most preferred pool where eviction makes room wins: a job that
            # prefers H100 evicts there, not on the V100s where it happens to be cheaper.
            return found
    return None


def _plan_pinned(state: EngineState, job: Job, now: float) -> Preemption | None:
    """A pinned job can only evict whoever runs on its resources, and only if every one of
    them may be evicted."""
    fleet = state.fleet
    risk: Risk = {}
    release: dict[str, list[str]] = {}
    for rid in job.request.resource_ids:
        unit = fleet.units.get(rid)
        if unit is None or not unit.dev.available:
            return None
        if unit.owner is None:
            if unit.holder not in (None, job.job_id):
                return None
            continue
        if _risk(state, unit.owner, job, now, risk) is None:
            return None  # an equal or higher priority, or an outside lease, runs there
        release.setdefault(unit.owner, []).append(rid)
    if not release:
        return None
    unit = fleet.units[job.request.resource_ids[0]]
    evictions = tuple(
        Eviction(vid, "preempt", tuple(rids), risk[vid][0], state.jobs[vid].priority)  # type: ignore[index]
        for vid, rids in release.items()
    )
    return Preemption(job.job_id, unit.dev.region, unit.dev.sku, None, evictions)


def _risk(
    state: EngineState, vid: str, job: Job, now: float, cache: Risk
) -> tuple[float, float] | None:
    """(work at risk, per allocated unit) of an eligible victim; None if not eligible."""
    if vid in cache:
        return cache[vid]
    v = state.jobs.get(vid)
    out = None
    if (
        v is not None
        and v.state == RUNNING
        and v.request.preemptible
        and v.priority < job.priority
        and v.allocation
    ):
        cost = v.work_at_risk_s(now)
        out = (cost, cost / len(v.allocation))
    cache[vid] = out
    return out


def _victim_units(victim: Job, req: JobRequest, node: str | None = None) -> list[Unit]:
    """The victim's units the request could use (its kind, size, available; on ``node``)."""
    units = list(victim.allocation.values())
    if req.kind == "mig":
        units = [u for u in units if u.profile == req.profile]
    elif req.kind == VDCU:
        cu, mb = req.compute_units or 0, req.memory_mb or 0
        units = [u for u in units if (u.compute_units or 0) >= cu and u.memory_mb >= mb]
    units = [u for u in units if u.dev.available]
    if node is not None:
        units = [u for u in units if u.node == node]
    return units


def _greedy_prefix(entries: list[Entry], need: int) -> list[Entry] | None:
    """The first entries in victim order until they cover ``need``: exactly the part of
    the list the greedy of ``cover`` looks at."""
    if sum(e[4] for e in entries) < need:
        return None
    heapq.heapify(entries)
    out = []
    got = 0
    while got < need:
        e = heapq.heappop(entries)
        out.append(e)
        got += e[4]
    return out


def _choices(
    state: EngineState, job: Job, prefix: list[Entry], need: int, node: str | None
) -> list[Choice] | None:
    """Candidates (with their unit ids) for the few entries a plan is made of."""
    cands = []
    for prio, _per_unit, _neg, vid, _n, shrink, cost in prefix:
        v = state.jobs[vid]
        units = _victim_units(v, job.request, node)
        if shrink:
            surplus = len(v.allocation) - v.request.min_units
            units = units[-surplus:]
        cands.append(Candidate(vid, tuple(u.rid for u in units), cost, prio, shrink))
    return choose_victims(need, cands)


def _entries(
    state: EngineState,
    job: Job,
    vids: Iterable[tuple[str, int]],
    now: float,
    risk: Risk,
    elastic_whole: bool,
) -> list[Entry]:
    """One entry per eligible victim of (victim, units it would free). ``elastic_whole``
    False (the first tier) lets elastic jobs give only their surplus."""
    out = []
    for vid, n in vids:
        r = _risk(state, vid, job, now, risk)
        if r is None or n <= 0:
            continue
        v = state.jobs[vid]
        surplus = len(v.allocation) - v.request.min_units
        if not elastic_whole and v.request.elastic and surplus > 0:
            give = min(n, surplus)
            out.append((v.priority, r[0] / give, -give, vid, give, True, r[0]))
        else:
            out.append((v.priority, r[0] / n, -n, vid, n, False, r[0]))
    return out


def _plan_on_one_node(
    state: EngineState, job: Job, pool: PoolKey, now: float, risk: Risk
) -> Preemption | None:
    """A node-local gang: the best plan on any one node of the pool (branch and bound)."""
    req = job.request
    p = state.fleet.pools[pool]
    held = Counter(u.node for u in job.holds.values())
    # A lower bound per node first: no plan there evicts below the priority that lower
    # jobs must reach to free enough units, and every freed unit costs at least its
    # cheapest victim's per-unit work (any plan pays at least one whole victim).
    bounds: list[tuple[int, float, str, int]] = []
    for node in p.nodes:
        nj = state.running.node_jobs.get(node)
        if not nj:
            continue
        need = req.min_units - p.free_on(node) - held[node]
        if need <= 0:
            continue
        eligible: list[tuple[int, int]] = []  # (priority, units)
        cheapest = math.inf  # per unit
        cheapest_job = math.inf
        for vid, n in nj.items():
            r = risk[vid] if vid in risk else _risk(state, vid, job, now, risk)
            if r is not None:
                eligible.append((state.jobs[vid].priority, n))
                if r[1] < cheapest:
                    cheapest = r[1]
                if r[0] < cheapest_job:
                    cheapest_job = r[0]
        top = _priority_reached(eligible, need)
        if top is None:
            continue
        bounds.append((top, max(cheapest * need, cheapest_job), node, need))
    bounds.sort()
    best: tuple[Score, str, int, list[Entry]] | None = None
    for top, low, node, need in bounds:
        if best is not None and (top, low) >= best[0][:2]:
            break
        found = _cover_on_node(state, job, state.running.node_jobs[node], need, now, risk)
        if found is None:
            continue
        if best is None or found[0] < best[0]:
            best = (found[0], node, need, found[1])
    if best is None:
        return None
    _, node, need, chosen = best
    choices = _choices(state, job, chosen, need, node)
    if not choices:
        return None
    return _preemption(job, pool, node, choices)


def _plan_on_nodes(
    state: EngineState, job: Job, pool: PoolKey, now: float, risk: Risk
) -> Preemption | None:
    """A gang that names its nodes: per_node devices on each of ``nodes`` nodes. Each
    node's own best plan (as for a node-local gang; a node with room already costs
    nothing), then the ``nodes`` cheapest of them, compared as plans are. A victim running
    on two of the chosen nodes is evicted once: a preempted job frees all its units."""
    req = job.request
    p = state.fleet.pools[pool]
    held = Counter(u.node for u in job.holds.values())
    free_plan: Score = (-(10**9), 0.0, 0)  # below every plan that evicts anyone
    plans: list[tuple[Score, str, list[Choice]]] = []
    for node in p.nodes:
        need = req.per_node - p.free_on(node) - held[node]
        if need <= 0:
            plans.append((free_plan, node, []))
            continue
        nj = state.running.node_jobs.get(node)
        found = _cover_on_node(state, job, nj, need, now, risk) if nj else None
        if found is None:
            continue
        choices = _choices(state, job, found[1], need, node)
        if choices:
            plans.append((found[0], node, choices))
    if len(plans) < (req.nodes or 1):
        return None
    plans.sort(key=lambda plan: (plan[0], plan[1]))
    merged: dict[str, Choice] = {}
    for _score, _node, choices in plans[: req.nodes]:
        for c in choices:
            before = merged.get(c.candidate.job_id)
            if before is None:
                merged[c.candidate.job_id] = c
                continue
            # Preempted on either node: preempted (it frees everything it runs on).
            keep = before.candidate if not before.candidate.shrink else c.candidate
            release = tuple(dict.fromkeys(before.release + c.release))
            merged[c.candidate.job_id] = Choice(keep, release)
    if not merged:
        return None  # room without evicting anyone: placement takes it
    return _preemption(job, pool, None, list(merged.values()))


def _cover_on_node(
    state: EngineState, job: Job, node_jobs: Counter[str], need: int, now: float, risk: Risk
) -> tuple[Score, list[Entry]] | None:
    """The best cover of ``need`` units among one node's jobs (victim -> its units there):
    elastic jobs giving only their surplus first, then whole."""
    for elastic_whole in (False, True):
        found = cover(_entries(state, job, node_jobs.items(), now, risk, elastic_whole), need)
        if found is not None:
            return found
    return None


def _priority_reached(victims: list[tuple[int, int]], need: int) -> int | None:
    """The lowest priority P such that the victims (priority, units) of priority <= P free
    ``need`` units; None if all of them free fewer."""
    got = 0
    for prio, n in sorted(victims):
        got += n
        if got >= need:
            return prio
    return None


def _plan_in_pool(state: EngineState, job: Job, pool: PoolKey, now: float) -> Preemption | None:
    """Victims anywhere in the pool (a gang that may span nodes, partitions, vDCUs)."""
    req = job.request
    fleet = state.fleet
    holds = sum(1 for u in job.holds.values() if u.pool == pool)
    if req.kind == VDCU:
        need = req.min_units - holds - len(vdcu_candidates(fleet, pool, req))
    else:
        need = req.min_units - holds - fleet.free_count(pool, req.kind, req.profile)
    if need <= 0:
        return None
    running = state.running.by_pool.get(pool, {})
    jobs = state.jobs
    prio = job.priority
    key = (req.kind, req.profile if req.kind == "mig" else None)
    sized = req.kind == VDCU and (req.compute_units or req.memory_mb)
    tier1: list[Entry] = []
    tier2: list[Entry] = []
    single: Entry | None = None  # a lone cover: lowest priority, then least work
    single_prio, single_cost = math.inf, math.inf
    fmod = math.fmod
    # The hot loop of a preemption decision: thousands of running jobs in a big pool.
    for vid in running:
        v = jobs[vid]
        if v.state != RUNNING or v.priority >= prio or not v.preemptible or v.unit_key != key:
            continue
        n = len(v.allocation)
        useful = len(_victim_units(v, req)) if sized else n
        if not useful:
            continue
        since = now - v.checkpoint_at_s
        if since < 0:
            since = 0.0
        if v.checkpoint_every_s:
            since = fmod(since, v.checkpoint_every_s)
        cost = since * n
        entry = (v.priority, cost / useful, -useful, vid, useful, False, cost)
        tier2.append(entry)
        if useful >= need and (
            v.priority < single_prio or (v.priority == single_prio and cost < single_cost)
        ):
            single, single_prio, single_cost = entry, v.priority, cost
        surplus = n - v.request.min_units
        if surplus > 0 and v.request.elastic:
            give = min(useful, surplus)
            tier1.append((v.priority, cost / give, -give, vid, give, True, cost))
        else:
            tier1.append(entry)
    prefix = _greedy_prefix(tier1, need) or _greedy_prefix(tier2, need)
    if prefix is not None and single is not None and single[3] not in {e[3] for e in prefix}:
        prefix.append(single)
    if prefix is None:
        return None
    choices = _choices(state, job, prefix, need, None)
    if not choices:
        return None
    return _preemption(job, pool, None, choices)


def _preemption(job: Job, pool: PoolKey, node: str | None, choices: list[Choice]) -> Preemption:
    evictions = tuple(
        Eviction(
            job_id=c.candidate.job_id,
            action="shrink" if c.candidate.shrink else "preempt",
            release=c.release,
            work_at_risk_s=c.candidate.cost,
            priority=c.candidate.priority,
        )
        for c in choices
    )
    return Preemption(job.job_id, pool[0], pool[1], node, evictions)
