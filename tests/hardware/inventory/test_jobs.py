"""The jobs registry: recording a job retry-safely, placing and moving it, listing and
input errors. On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory

from tests.helpers.clock import ManualClock


def test_jobs_registry(inv: Inventory, clock: ManualClock) -> None:
    job = inv.record_job("j1", {"model": "lm", "gpus": 2}, resource_ids=["MIG-a"])
    assert (job.state, job.resource_ids, job.last_checkpoint_id) == ("queued", ("MIG-a",), None)
    assert inv.record_job("j1", {"model": "lm", "gpus": 2}) == job  # retry-safe
    with pytest.raises(InvalidRequestError, match="another spec"):
        inv.record_job("j1", {"model": "other"})
    clock.t = 1001.0
    inv.record_job("j2", {"model": "cnn"})
    inv.place_job("j1", ["MIG-a"], attempt=1)
    inv.transition_job("j1", "running", expect_attempt=1)
    clock.t = 1005.0
    moved = inv.transition_job(
        "j1", "stopped", last_checkpoint_id="ck-3", resource_ids=[], reason="preempted"
    )
    assert (moved.state, moved.last_checkpoint_id, moved.resource_ids) == (
        "stopped",
        "ck-3",
        (),
    )
    assert moved.info == {"reason": "preempted"} and moved.updated_at_s == 1005.0
    assert inv.place_job("j1", ["MIG-a"], attempt=2, node="n1").info == {
        "reason": "preempted",
        "node": "n1",
    }
    inv.transition_job("j1", "running", expect_attempt=2)
    assert [j.job_id for j in inv.jobs()] == ["j1", "j2"]
    assert [j.job_id for j in inv.jobs("queued")] == ["j2"]
    with pytest.raises(InvalidRequestError, match="queued, placed, launching, running"):
        inv.transition_job("j1", "paused")
    with pytest.raises(InvalidRequestError, match="unknown job 'nope'"):
        inv.job("nope")
    with pytest.raises(InvalidRequestError, match="JSON"):
        inv.transition_job("j1", "running", blob=object())
    with pytest.raises(InvalidRequestError, match="resource_ids"):
        inv.record_job("j3", {}, resource_ids="MIG-a")
    assert inv.job("j1").state == "running"


def test_an_ended_job_recorded_with_another_spec_takes_it_and_counts_on(inv: Inventory) -> None:
    inv.record_job("again", {"gpus": 2})
    inv.place_job("again", [], attempt=1)
    inv.transition_job("again", "running", expect_attempt=1)
    with pytest.raises(InvalidRequestError, match="another spec .*it is running"):
        inv.record_job("again", {"gpus": 1})
    inv.transition_job("again", "finished", expect_attempt=1, last_checkpoint_id="ck-9")
    job = inv.record_job("again", {"gpus": 1})  # resumed on one unit
    assert (job.spec, job.state, job.attempt) == ({"gpus": 1}, "queued", 1)
    assert job.last_checkpoint_id == "ck-9"
    assert inv.place_job("again", [], attempt=2).attempt == 2  # attempts count on
