"""A training attempt on a leased device, fenced: the LeaseKeeper renews on a timer
whatever a step costs, a lost lease stops the attempt before it writes anything more, and
job-state writes are compare-and-swaps on the attempt. Inventory on SQLite and PostgreSQL,
on a clock the test moves (no real minutes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.inventory import Inventory, LeaseLostError
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.checkpoint import checkpoint_manager
from gpuflow.tasks.training.job import LEASE_TTL_S, acquire, run_training
from gpuflow.tasks.training.loop import StepInfo
from gpuflow.tasks.training.spec import TrainSpec

from tests.helpers.clock import GatedClock, caught_up
from tests.helpers.cluster import Cluster


@pytest.fixture
def clock() -> GatedClock:
    return GatedClock()


@pytest.fixture
def cluster(inventory_url: str, clock: GatedClock) -> Any:
    inventory = Inventory(inventory_url, now=clock)
    backend = SimBackend()
    inventory.sync(backend)
    yield Cluster(inventory, backend)
    inventory.close()


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(kind="local", path=str(tmp_path / "ckpt"))


def test_a_job_with_10_s_steps_keeps_its_lease_for_minutes_of_steps(
    cluster: Cluster, storage: CheckpointStorage, clock: GatedClock
) -> None:
    inv = cluster.inventory
    binding = acquire(cluster, DeviceRequest(), "slow")
    rid = binding.resource.resource_id
    keepers: list[Any] = []
    seen: list[float] = []

    def ten_second_step(info: StepInfo) -> None:
        clock.advance(10.0)  # the step "took" 10 s
        assert caught_up(keepers[0], clock)
        lease = inv.lease(rid)
        assert lease is not None, f"lease lapsed at step {info.step} (t={clock.t})"
        assert (lease.owner, lease.attempt) == ("slow", binding.lease.attempt)
        seen.append(lease.expires_at_s - clock.t)

    spec = TrainSpec(job_id="slow", model="llama-tiny", steps=36, checkpoint_interval=12)
    result = run_training(
        spec,
        storage,
        cluster,
        binding,
        extra_hooks=(ten_second_step,),
        lease_keeper=clock.keeper(keepers),
    )
    assert result.steps_done == 36 and clock.t - 1000.0 == 360.0  # six minutes of steps
    assert keepers[0].renewals >= 1 + 3  # at the start, then every TTL/3 (100 s)
    assert min(seen) > LEASE_TTL_S - LEASE_TTL_S / 3 - 10.0  # never close to lapsing
    job = inv.job("slow")
    assert (job.state, job.attempt, job.last_checkpoint_id) == ("finished", 1, "step-000000036")


def test_an_attempt_whose_lease_is_taken_over_stops_and_writes_nothing_more(
    cluster: Cluster, storage: CheckpointStorage, clock: GatedClock
) -> None:
    inv = cluster.inventory
    binding = acquire(cluster, DeviceRequest(), "twice")
    rid = binding.resource.resource_id
    keepers: list[Any] = []
    steps_after: list[int] = []

    def taken_over_at_step_5(info: StepInfo) -> None:
        if info.step < 5:
            return
        if info.step > 5:
            steps_after.append(info.step)
            return
        # Remediation (or a pass) decides attempt 1 is gone and places attempt 2 here.
        inv.acquire_lease(rid, "twice", LEASE_TTL_S, attempt=2)
        inv.place_job("twice", [rid], attempt=2, supersede=True)
        clock.advance(LEASE_TTL_S / 3)  # the keeper's next renewal is due: it finds it gone
        assert caught_up(keepers[0], clock) and keepers[0].lost

    spec = TrainSpec(job_id="twice", model="llama-tiny", steps=20, checkpoint_interval=2)
    with pytest.raises(LeaseLostError, match="attempt 1 lapsed or were taken over"):
        run_training(
            spec,
            storage,
            cluster,
            binding,
            extra_hooks=(taken_over_at_step_5,),
            lease_keeper=clock.keeper(keepers),
        )
    assert steps_after == []  # not one more step
    saved = [c.checkpoint_id for c in checkpoint_manager(storage, "twice").list()]
    assert saved == ["step-000000002", "step-000000004"]  # none after the takeover
    job = inv.job("twice")
    assert (job.state, job.attempt, job.last_checkpoint_id) == ("placed", 2, "step-000000004")
    lease = inv.lease(rid)
    assert lease is not None and lease.attempt == 2  # attempt 1 did not release it


def test_a_stale_binding_cannot_start_training(
    cluster: Cluster, storage: CheckpointStorage, clock: GatedClock
) -> None:
    inv = cluster.inventory
    old = acquire(cluster, DeviceRequest(), "stale")
    inv.release_lease(old.resource.resource_id, "stale", attempt=1)
    acquire(cluster, DeviceRequest(), "stale")  # attempt 2, wherever
    spec = TrainSpec(job_id="stale", model="llama-tiny", steps=4)
    with pytest.raises(LeaseLostError):
        run_training(spec, storage, cluster, old, lease_keeper=clock.keeper([]))
    assert checkpoint_manager(storage, "stale").list() == []
    assert inv.job("stale").attempt == 2
