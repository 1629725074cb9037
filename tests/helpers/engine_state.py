"""What a scheduling engine knows, as plain data two engines can be compared by.

The service keeps its engine across passes and applies only what the inventory's change
journal names (tasks/scheduling/service_state.py); a fresh service rebuilds its engine
from the whole inventory. The two must agree on everything a decision reads: every live
job's state, units, holds and links, the queue's order, and who owns, holds or earmarks
each unit. What they may differ in is bookkeeping no decision reads (a running job's
``submitted_at_s`` is the restore time).
"""

from __future__ import annotations

from typing import Any

from gpuflow.tasks.scheduling.engine import Engine
from gpuflow.tasks.scheduling.model import DONE_STATES


def engine_state(engine: Engine) -> dict[str, Any]:
    """The engine's decision-relevant state; its own audit must be clean."""
    problems = engine.audit()
    assert problems == [], problems
    jobs = {
        job.job_id: {
            "state": job.state,
            "seq": job.seq,
            "allocation": sorted(job.allocation),
            "holds": sorted(job.holds),
            "pool": job.pool_key,
            "stop_for": job.stop_for,
            "stop_action": job.stop_action,
            "release_on_stop": sorted(job.release_on_stop),
            "waiting_for": sorted(job.waiting_for),
            "preemptions": job.preemptions,
            "last_checkpoint_id": job.last_checkpoint_id,
        }
        for job in engine.jobs.values()
        if job.state not in DONE_STATES
    }
    units = {
        rid: (u.owner, u.holder, u.earmark)
        for rid, u in engine.fleet.units.items()
        if u.owner is not None or u.holder is not None or u.earmark is not None
    }
    return {
        "jobs": jobs,
        "queue": list(engine.queue),
        "reservations": sorted(engine.reservations),
        "units": units,
        "free": sorted(u.rid for u in engine.fleet.free_units()),
    }
