"""Device references, the jobs on a device, and the incident ledger (idempotency)."""

from __future__ import annotations

import threading

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.health.events import parse_resource_id, resource_id_for
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.devices import jobs_on_device, parse_device_ref

from tests.tasks.remediation.helpers import A100, make_cluster


@pytest.fixture
def inventory(gpuflow_home, inventory_url: str) -> Inventory:
    # The ledger shares the inventory's database: SQLite, and the session's PostgreSQL.
    cluster = make_cluster(gpuflow_home)
    inventory = Inventory(inventory_url)
    inventory.sync(cluster.get_backend())
    return inventory


def test_device_refs_both_forms_agree_with_the_event_contract() -> None:
    ref = parse_device_ref("a100-0:3")
    assert (ref.node, ref.index) == ("a100-0", 3)
    assert ref.resource_id == resource_id_for("a100-0", 3)
    # Node names may contain dots; the index is after the last one.
    dotted = parse_device_ref(resource_id_for("rack1.node.7", 12))
    assert (dotted.node, dotted.index) == parse_resource_id("gpuflow.device.rack1.node.7.12")
    for bad in ("a100-0", "a100-0:x", ":3", "gpuflow.device.a100-0", "", None, "a:-1"):
        with pytest.raises(InvalidRequestError, match="device"):
            parse_device_ref(bad)


def test_jobs_on_device_takes_running_and_own_queued_jobs_only(inventory: Inventory) -> None:
    a, b, c = [d for d in inventory.devices() if d.sku == A100][:3]
    inventory.acquire_lease(a.uuid, "job-run", 300)
    inventory.record_job("job-run", {"device": {"sku": "a100-40gb"}}, "running", [a.uuid])
    # A job that crashed with this device, marked for remediation: ours.
    inventory.record_job("job-crashed", {"device": {}}, "queued", [a.uuid])
    inventory.transition_job("job-crashed", remediation={"device_uuid": a.uuid})
    # Checkpointed by someone else (preemption): the scheduler's, not ours.
    inventory.record_job("job-preempted", {"device": {}}, "stopped", [a.uuid])
    inventory.record_job("job-done", {"device": {}}, "finished", [a.uuid])
    inventory.record_job("job-elsewhere", {"device": {}}, "running", [b.uuid])
    inventory.acquire_lease(c.uuid, "serving-replica", 300)  # not a job

    jobs, others = jobs_on_device(inventory, a)
    assert sorted(j.job_id for j in jobs) == ["job-crashed", "job-run"]
    run = next(j for j in jobs if j.job_id == "job-run")
    assert run.holds_lease and run.kind == "device" and run.sku == A100
    assert run.device_request == {"sku": "a100-40gb"}
    assert not next(j for j in jobs if j.job_id == "job-crashed").holds_lease
    assert others == []
    _, others_c = jobs_on_device(inventory, c)
    assert [lease.owner for lease in others_c] == ["serving-replica"]


def test_same_event_twice_is_one_incident(inventory: Inventory) -> None:
    dev = inventory.devices()[0]
    ledger = L.Ledger(inventory.url)
    first, dup = ledger.open_incident(
        dev, "predicted", "risk", risk=0.9, event_id="ev-1", first_entry=(L.RISK_SEEN, "0.9")
    )
    assert dup is None and first.status == "open" and first.timeline[0]["what"] == L.RISK_SEEN
    again, dup = ledger.open_incident(dev, "predicted", "risk", event_id="ev-1")
    assert dup == "event" and again.incident_id == first.incident_id
    assert len(again.timeline) == 1  # nothing recorded for a repeat of the same event
    other, dup = ledger.open_incident(dev, "predicted", "risk", event_id="ev-2")
    assert dup == "device" and other.incident_id == first.incident_id
    assert other.timeline[-1]["what"] == L.DUPLICATE
    ledger.set_status(first.incident_id, "done")
    fresh, dup = ledger.open_incident(dev, "reactive", "crash", event_id="ev-3")
    assert dup is None and fresh.incident_id != first.incident_id
    assert ledger.join(first.incident_id, "ev-3", "again") == "event"
    assert ledger.join(first.incident_id, "ev-4", "again") == "device"
    with pytest.raises(InvalidRequestError, match="trigger"):
        ledger.open_incident(dev, "guessed", "x")
    with pytest.raises(InvalidRequestError, match="status"):
        ledger.set_status(first.incident_id, "closed")
    with pytest.raises(InvalidRequestError, match="unknown remediation incident"):
        ledger.incident("inc-nope")


def test_one_run_at_a_time_works_on_an_incident(inventory: Inventory) -> None:
    dev = inventory.devices()[2]
    ledger = L.Ledger(inventory.url)
    inc, _ = ledger.open_incident(dev, "predicted", "risk", claim_by="run-a")
    assert not ledger.claim(inc.incident_id, "run-b")  # run-a holds it
    assert ledger.claim(inc.incident_id, "run-a")  # its own claim: extended
    ledger.release_claim(inc.incident_id, "run-b")  # not b's to release: no effect
    assert not ledger.claim(inc.incident_id, "run-b")
    ledger.release_claim(inc.incident_id, "run-a")
    assert ledger.claim(inc.incident_id, "run-b")
    assert ledger.claim(inc.incident_id, "run-c", ttl_s=1.0) is False
    ledger.release_claim(inc.incident_id, "run-b")
    assert ledger.claim(inc.incident_id, "run-c", ttl_s=-1.0)  # an expired claim is taken over
    assert ledger.claim(inc.incident_id, "run-d")


def test_concurrent_deliveries_of_one_event_open_one_incident(inventory: Inventory) -> None:
    dev = inventory.devices()[1]
    url = inventory.url
    results: list[tuple[str, str | None]] = []
    errors: list[BaseException] = []
    # Opening the ledgers is part of the race: on a fresh PostgreSQL database the four
    # create its tables at once. The barrier times out rather than hang on a dead thread.
    barrier = threading.Barrier(4, timeout=60)

    def deliver() -> None:
        try:
            barrier.wait()
            ledger = L.Ledger(url)
            inc, dup = ledger.open_incident(dev, "predicted", "risk", event_id="ev-race")
            results.append((inc.incident_id, dup))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len({iid for iid, _ in results}) == 1
    assert sorted(d or "new" for _, d in results) == ["event", "event", "event", "new"]
    assert len(L.Ledger(url).incidents(dev.uuid)) == 1
