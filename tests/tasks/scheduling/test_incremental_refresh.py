"""The service keeps its engine across passes and applies only what the inventory's change
journal names (service_state.py): after every kind of change, made by this service or by
another process, its engine must be the one a fresh service rebuilds from the whole
inventory, and it must have got there without a rebuild unless the fleet changed."""

from __future__ import annotations

from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.scheduling.model import JobRequest, SchedulerConfig
from gpuflow.tasks.scheduling.service import SchedulerService

from tests.helpers.clock import ManualClock
from tests.helpers.engine_state import engine_state

TTL_S = 60.0


def _a100(job_id: str, **kw) -> JobRequest:
    return JobRequest(job_id=job_id, skus=("a100-40gb",), **kw)


def _differences(kept: dict, rebuilt: dict) -> str:
    """Where the kept engine and the rebuilt one disagree, entry by entry."""
    out = []
    for part in kept:
        a, b = kept[part], rebuilt[part]
        if a == b:
            continue
        if isinstance(a, dict):
            out += [
                f"{part}[{key}]: kept {a.get(key)} / rebuilt {b.get(key)}"
                for key in sorted(set(a) | set(b), key=str)
                if a.get(key) != b.get(key)
            ]
        else:
            out.append(f"{part}: kept {a} / rebuilt {b}")
    return "\n".join(out)


class Pair:
    """A long-lived service, and a fresh one built for each comparison, on one store."""

    def __init__(self, cluster) -> None:
        self.url = cluster.inventory_url.get_secret_value()
        self.backend = cluster.get_backend()
        self.clock = ManualClock(1_000_000.0)
        self.config = SchedulerConfig(lease_ttl_s=TTL_S)
        self.kept = self.service()
        self.other = Inventory(self.url, now=self.clock)  # another process's writes

    def service(self) -> SchedulerService:
        inv = Inventory(self.url, now=self.clock)
        return SchedulerService(
            inv, self.backend, self.config, now=self.clock, stop_grace_s=120.0, lock_wait_s=0.0
        )

    def check(self) -> dict:
        kept = engine_state(self.kept.refresh())
        fresh = self.service()
        try:
            rebuilt = engine_state(fresh.refresh())
        finally:
            fresh.inventory.close()
        assert kept == rebuilt, _differences(kept, rebuilt)
        return kept

    def keep_runners(self) -> None:
        """What each runner's LeaseKeeper does: renew every unit of its attempt."""
        for r in self.other.jobs():
            if r.resource_ids and r.state in ("placed", "launching", "running"):
                self.other.renew_leases(r.job_id, r.attempt, list(r.resource_ids), TTL_S)

    def close(self) -> None:
        self.kept.inventory.close()
        self.other.close()


def test_a_kept_engine_is_the_rebuilt_one_through_every_kind_of_change(cluster) -> None:
    pair = Pair(cluster)
    svc, other = pair.kept, pair.other
    try:
        svc.submit(_a100("gang", count=2, priority=1))
        svc.submit(_a100("one", priority=1))
        svc.submit(JobRequest(job_id="v", skus=("v100",), count=2))
        pair.check()
        assert len(svc.schedule_once().placed) == 3
        state = pair.check()
        assert state["jobs"]["gang"]["state"] == "running"
        # Another process: a lease the scheduler did not make, and a job that finishes.
        other.acquire_lease(state["free"][0], "someone-else", TTL_S)
        svc.job_done("v", ok=True, attempt=other.job("v").attempt)
        state = pair.check()
        assert "v" not in state["jobs"]
        assert state["units"][sorted(state["units"])[0]] is not None
        # A high-priority job that needs the gang's devices: victims asked to stop.
        svc.submit(_a100("urgent", count=4, priority=9))
        svc.schedule_once()
        state = pair.check()
        assert state["jobs"]["gang"]["state"] == "stopping"
        assert "gang" in state["jobs"]["urgent"]["waiting_for"]
        # The victims answer (their loop checkpoints and stops), the next pass re-queues them.
        for job_id in ("gang", "one"):
            req = other.poll_control(job_id)
            if req is not None:
                other.ack_control(req.request_id, "step-000000010")
        pair.clock.t += 31.0  # past the ack grace
        pair.keep_runners()
        svc.schedule_once()
        state = pair.check()
        assert state["jobs"]["gang"]["state"] == "queued"
        # A cancel, then time: the runners stop renewing and their leases lapse.
        svc.cancel("one")
        pair.clock.t += 2 * TTL_S
        svc.schedule_once()
        pair.check()
        assert svc.rebuilds == 1, "nothing but jobs and leases changed: no rebuild"
        # The fleet changes (a cordon): the next refresh rebuilds, and agrees.
        other.cordon("v100-0", reason="maintenance")
        pair.check()
        assert svc.rebuilds == 2
    finally:
        pair.close()


def test_a_service_behind_a_pruned_journal_rebuilds(cluster) -> None:
    pair = Pair(cluster)
    try:
        pair.kept.submit(_a100("a"))
        pair.kept.schedule_once()
        pair.other.record_job("not-scheduled", {"kind": "adhoc"})
        assert pair.other.prune_journal(keep=0) > 0
        pair.kept.submit(_a100("b"))
        assert pair.kept.rebuilds == 2
        pair.check()
    finally:
        pair.close()


def test_renewals_by_runners_are_read_when_due_and_restore_nothing(cluster) -> None:
    pair = Pair(cluster)
    svc = pair.kept
    try:
        svc.submit(_a100("a"))
        svc.submit(_a100("g", count=2))
        svc.schedule_once()
        for _ in range(6):  # three TTLs: every lease is due three times
            pair.clock.t += TTL_S / 2
            pair.keep_runners()
            report = svc.schedule_once()
            assert report.lost == [] and report.requeued == [], report
        state = pair.check()
        assert {j: s["state"] for j, s in state["jobs"].items()} == {"a": "running", "g": "running"}
        assert svc.rebuilds == 1
    finally:
        pair.close()
