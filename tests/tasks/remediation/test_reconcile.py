"""Resumable incidents in the ledger: phases, claims that lapse, takeovers, and which
abandoned incident the reconciler finishes or rolls back (SQLite and PostgreSQL)."""

from __future__ import annotations

import time

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.reconcile import FINISH, ROLL_BACK, abandoned_incidents
from sqlalchemy import text

from tests.tasks.remediation.helpers import make_cluster


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def inventory(gpuflow_home, inventory_url: str) -> Inventory:
    cluster = make_cluster(gpuflow_home)
    inventory = Inventory(inventory_url)
    inventory.sync(cluster.get_backend())
    return inventory


def test_a_run_that_stops_renewing_leaves_its_incident_to_be_taken_over(
    inventory: Inventory,
) -> None:
    clock = Clock()
    ledger = L.Ledger(inventory.url, clock=clock)
    dev = inventory.devices()[0]
    inc, _ = ledger.open_incident(dev, "predicted", "risk", claim_by="run-a")
    assert inc.phase == L.OPENED and inc.claimed_by == "run-a"
    ledger.set_phase(inc.incident_id, L.CHECKPOINTING)
    assert ledger.set_phase(inc.incident_id, L.ISOLATED).phase == L.CHECKPOINTING  # never back
    assert ledger.abandoned() == [] and not ledger.take_over(inc.incident_id, "run-b", "x")

    clock.now += L.CLAIM_TTL_S + 1  # run-a died: nobody renewed its claim
    (gone,) = ledger.abandoned()
    assert gone.incident_id == inc.incident_id and gone.phase == L.CHECKPOINTING
    assert ledger.take_over(inc.incident_id, "run-b", "reconcile")
    assert not ledger.take_over(inc.incident_id, "run-c", "reconcile")  # run-b holds it now
    after = ledger.incident(inc.incident_id)
    assert after.claimed_by == "run-b" and after.takeovers == 1
    assert after.timeline[-1]["what"] == L.TAKEN_OVER
    assert ledger.claimed_by("run-b")[0].incident_id == inc.incident_id

    ledger.set_status(inc.incident_id, "done")
    ledger.release_claim(inc.incident_id, "run-b")
    assert ledger.incident(inc.incident_id).phase == L.CLOSED
    clock.now += L.CLAIM_TTL_S + 1
    assert ledger.abandoned() == []  # closed: nothing to take over
    assert not ledger.take_over(inc.incident_id, "run-d", "late")


def test_the_reconciler_finishes_an_incident_until_it_was_abandoned_too_often(
    inventory: Inventory,
) -> None:
    clock = Clock()
    ledger = L.Ledger(inventory.url, clock=clock)
    inc, _ = ledger.open_incident(inventory.devices()[1], "predicted", "risk", claim_by="r0")
    actions = []
    for run in ("r1", "r2", "r3"):
        clock.now += L.CLAIM_TTL_S + 1
        (item,) = abandoned_incidents(ledger, max_takeovers=3)
        actions.append(item.action)
        assert ledger.take_over(inc.incident_id, run, "reconcile")
    clock.now += L.CLAIM_TTL_S + 1
    (last,) = abandoned_incidents(ledger, max_takeovers=3)
    assert actions == [FINISH] * 3 and last.action == ROLL_BACK and last.takeovers == 3
    with pytest.raises(InvalidRequestError, match="max_takeovers"):
        abandoned_incidents(ledger, max_takeovers=0)


def test_the_claim_ttl_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(L.CLAIM_TTL_ENV, "2.5")
    assert L.incident_claim_ttl_s() == 2.5
    monkeypatch.setenv(L.CLAIM_TTL_ENV, "soon")
    with pytest.raises(InvalidRequestError, match="GPUFLOW_INCIDENT_CLAIM_TTL_S='soon'"):
        L.incident_claim_ttl_s()


def test_a_ledger_from_before_phases_gets_its_columns(inventory: Inventory) -> None:
    ledger = L.Ledger(inventory.url)
    inc, _ = ledger.open_incident(inventory.devices()[2], "manual", "old")
    with ledger._engine.begin() as conn:
        for column in ("phase", "takeovers"):
            conn.execute(text(f"ALTER TABLE gf_remediation_incidents DROP COLUMN {column}"))
    ledger.close()
    reopened = L.Ledger(inventory.url)
    old = reopened.incident(inc.incident_id)
    assert old.phase == L.OPENED and old.takeovers == 0
