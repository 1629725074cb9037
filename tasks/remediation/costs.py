"""What acting on a device would cost, read from the inventory: its jobs' own numbers.

The decision rule (tasks.health.decision) needs, per job on a device, its gang size, how
long ago it last checkpointed, what a checkpoint costs it, and what a restart and a
relaunch cost; per device, whether there is room to move the jobs now. Where each comes
from, best first (the decision records which one it got):

* gang size: the job's attempt units (``JobRecord.resource_ids``), a MIG slice or vDCU
  counting as one;
* time since the last checkpoint: the acknowledgement of the control request that
  produced the job's current checkpoint (``checkpoint-now``/``-and-stop``: an exact
  time); else the job record's last write (every periodic checkpoint writes
  ``last_checkpoint_id``, so this is a lower bound: the scheduler's own estimate,
  tasks/scheduling/refresh.py); a job with no checkpoint yet has everything since its
  attempt started (``info["sched"]["started_at_s"]``, else its creation) at stake;
* checkpoint cost: the median request -> acknowledgement time of the job's answered
  control requests (what a checkpoint stalls the job for, as remediation sees it); else
  the default;
* restart and relaunch: the defaults (nothing records them per job yet);
* room elsewhere: free units of the job's SKU and kind plus what spare nodes offer
  (the same count remediation's fail-over uses).

One ``FleetCosts`` per monitor round: it reads the jobs and where their units are once,
and each job's control requests only when one of its devices needs a decision.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gpuflow.hardware.inventory import ACTIVE_STATES, Inventory, JobRecord
from gpuflow.tasks.health.decision import CostDefaults, DeviceCosts, JobCosts
from gpuflow.tasks.remediation.steps import free_count, spare_offers

Unit = tuple[str, str, str | None]  # (sku, kind, profile) of a job's unit


def _measured(values: list[float]) -> list[float]:
    """Durations that can be trusted: finite and >= 0 (a clock step can make one odd)."""
    return [v for v in values if v == v and 0.0 <= v < float("inf")]


class FleetCosts:
    """Costs of acting on any device, from one read of the inventory (one round).

    Call it with a device (node, index): its ``DeviceCosts``."""

    def __init__(
        self,
        inventory: Inventory,
        defaults: CostDefaults | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.inventory = inventory
        self.defaults = defaults or CostDefaults()
        self.now_s = now()
        # Where every unit is: a device's uuid or one of its partitions'.
        units: dict[str, tuple[tuple[str, int], Unit]] = {}
        sku_of: dict[str, str] = {}
        for d in inventory.devices(present=True):
            units[d.uuid] = ((d.node, d.index), (d.sku, "device", None))
            sku_of[d.uuid] = d.sku
        for p in inventory.partitions():
            sku = sku_of.get(p.device_uuid, "")
            units[p.uuid] = ((p.node, p.device_index), (sku, p.kind, p.profile))
        self._on_device: dict[tuple[str, int], list[tuple[JobRecord, Unit]]] = {}
        for job in inventory.jobs():
            if job.state not in ACTIVE_STATES:
                continue  # waiting jobs hold nothing here that a failure could cost
            seen: set[tuple[str, int]] = set()
            for rid in job.resource_ids:
                where = units.get(rid)
                if where is None or where[0] in seen:
                    continue
                seen.add(where[0])
                self._on_device.setdefault(where[0], []).append((job, where[1]))
        self._jobs: dict[str, JobCosts] = {}
        self._room: dict[tuple[Unit, int], bool] = {}

    def __call__(self, node: str, index: int) -> DeviceCosts:
        placed = self._on_device.get((node, index), [])
        jobs = tuple(self.job_costs(job) for job, _ in placed)
        room = all(self.room_for(unit, len(job.resource_ids)) for job, unit in placed)
        return DeviceCosts(
            jobs=jobs,
            room_elsewhere=room if placed else None,
            cordon_gpu_s=self.defaults.cordon_gpu_s(),
        )

    def room_for(self, unit: Unit, gang: int) -> bool:
        """Enough free (or spare) units of this kind to move a gang of ``gang`` now."""
        key = (unit, gang)
        if key not in self._room:
            sku, kind, profile = unit
            have = free_count(self.inventory, sku, kind, profile)
            if have < gang:
                have += sum(
                    spare_offers(self.inventory, n.name, sku, kind, profile)
                    for n in self.inventory.spare_nodes()
                )
            self._room[key] = have >= gang
        return self._room[key]

    def job_costs(self, job: JobRecord) -> JobCosts:
        if job.job_id not in self._jobs:
            self._jobs[job.job_id] = job_costs(self.inventory, job, self.defaults, self.now_s)
        return self._jobs[job.job_id]


def job_costs(
    inventory: Inventory, job: JobRecord, defaults: CostDefaults, now_s: float
) -> JobCosts:
    """The job's own numbers where the inventory records them, else the defaults; each
    with its source."""
    gang = max(len(job.resource_ids), 1)
    answered = [r for r in inventory.control_requests(job.job_id) if r.acked_at_s is not None]
    sources: dict[str, str] = {"gang_gpus": f"measured: {gang} unit(s) of attempt {job.attempt}"}

    since, sources["since_checkpoint_s"] = _since_checkpoint(job, answered, defaults, now_s, gang)
    took = _measured([r.acked_at_s - r.requested_at_s for r in answered])  # type: ignore[operator]
    if took:
        save = statistics.median(took)
        sources["checkpoint_save_s"] = (
            f"measured: median of {len(took)} checkpoint request(s), request to acknowledgement"
        )
    else:
        save = defaults.checkpoint_save_s
        sources["checkpoint_save_s"] = "default: no answered checkpoint request recorded"
    sources["restart_s"] = "default: DESIGN.md 4 (5-20 min at scale); none recorded per job"
    sources["relaunch_s"] = "default: planned relaunch on a reserved device; none recorded"
    return JobCosts(
        job_id=job.job_id,
        gang_gpus=gang,
        since_checkpoint_s=since,
        checkpoint_save_s=save,
        restart_s=defaults.restart_s,
        relaunch_s=defaults.relaunch_s,
        sources=sources,
    )


def _since_checkpoint(
    job: JobRecord, answered: list[Any], defaults: CostDefaults, now_s: float, gang: int
) -> tuple[float, str]:
    """(seconds since the job's last checkpoint, where that came from)."""
    if job.last_checkpoint_id:
        exact = [r.acked_at_s for r in answered if r.checkpoint_id == job.last_checkpoint_id]
        if exact:
            return max(now_s - max(exact), 0.0), (
                f"measured: checkpoint {job.last_checkpoint_id} acknowledged "
                f"{now_s - max(exact):.0f} s ago"
            )
        ago = now_s - job.updated_at_s
        if ago == ago:
            return max(ago, 0.0), (
                f"job record: {job.last_checkpoint_id}, record last written {ago:.0f} s ago "
                "(a lower bound)"
            )
    started = (job.info.get("sched") or {}).get("started_at_s")
    if isinstance(started, int | float) and started == started:
        return max(now_s - started, 0.0), "measured: no checkpoint yet; the attempt's start"
    if job.created_at_s == job.created_at_s and job.created_at_s > 0:
        return max(now_s - job.created_at_s, 0.0), "job record: no checkpoint yet; its creation"
    half = defaults.young_daly_s(gang) / 2.0
    return half, "default: half the Young/Daly period (nothing recorded)"
