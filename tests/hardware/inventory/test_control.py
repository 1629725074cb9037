"""The job control channel: request, poll, acknowledge and wait, across processes.
On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

import time

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import ControlTimeoutError, Inventory

from tests.hardware.inventory.helpers import MP
from tests.helpers.clock import ManualClock


def _ack_worker(url: str, job_id: str, checkpoint_id: str, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        deadline = time.monotonic() + 30
        while (req := inv.poll_control(job_id)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no request came")
            time.sleep(0.02)
        inv.ack_control(req.request_id, checkpoint_id)
        out.put(None)
    except BaseException as exc:
        out.put(repr(exc))


def test_control_round_trip_with_a_second_process(inv: Inventory) -> None:
    inv.record_job("train-1", {"model": "lm"}, state="running")  # seeded directly
    out = MP.Queue()
    child = MP.Process(target=_ack_worker, args=(inv.url, "train-1", "ckpt-7", out))
    child.start()
    rid = inv.request_control("train-1", "checkpoint-and-stop")
    acked = inv.wait_for_ack(rid, timeout_s=30, poll_s=0.02)
    assert out.get(timeout=30) is None
    child.join(timeout=30)
    assert (acked.status, acked.checkpoint_id, acked.action) == (
        "acked",
        "ckpt-7",
        "checkpoint-and-stop",
    )
    assert acked.acked_at_s is not None
    assert inv.poll_control("train-1") is None
    assert inv.job("train-1").last_checkpoint_id == "ckpt-7"


def test_control_order_dedupe_ack_and_errors(inv: Inventory, clock: ManualClock) -> None:
    assert inv.poll_control("j") is None
    first = inv.request_control("j", "checkpoint-now")
    assert inv.request_control("j", "checkpoint-now") == first  # still pending: same id
    clock.t = 1001.0
    second = inv.request_control("j", "checkpoint-and-stop")
    other = inv.request_control("k", "checkpoint-now")
    polled = inv.poll_control("j")
    assert polled is not None and (polled.request_id, polled.status) == (first, "pending")
    assert polled.requested_at_s == 1000.0
    clock.t = 1002.0
    acked = inv.ack_control(first, "c1")
    assert (acked.status, acked.acked_at_s, acked.checkpoint_id) == ("acked", 1002.0, "c1")
    assert inv.ack_control(first, "c2").checkpoint_id == "c1"  # first ack wins
    assert inv.poll_control("j").request_id == second  # type: ignore[union-attr]
    assert inv.control_request(other).job_id == "k"
    assert [r.request_id for r in inv.control_requests("j")] == [first, second]
    assert inv.request_control("j", "checkpoint-now") not in (first, second)  # new one
    with pytest.raises(InvalidRequestError, match="checkpoint-now, checkpoint-and-stop"):
        inv.request_control("j", "stop")
    with pytest.raises(InvalidRequestError, match="unknown control request id 999"):
        inv.ack_control(999, "c")
    with pytest.raises(InvalidRequestError, match="checkpoint id"):
        inv.ack_control(second, "")


def test_wait_for_ack_times_out_with_the_request(inv: Inventory) -> None:
    rid = inv.request_control("j", "checkpoint-now")
    start = time.monotonic()
    with pytest.raises(ControlTimeoutError) as err:
        inv.wait_for_ack(rid, timeout_s=0.1, poll_s=0.02)
    assert 0.09 <= time.monotonic() - start < 2
    assert isinstance(err.value, TimeoutError) and err.value.request.status == "pending"
