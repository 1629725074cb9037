"""The device settings ledger (hardware/inventory/settings.py), on SQLite and PostgreSQL:
one holder per device, originals kept from the first change, TTL and lease-bound
staleness, compare-and-swap takeover, and real processes racing for one device."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory, SettingRecord, SettingsConflictError

from tests.hardware.inventory.helpers import MP
from tests.helpers.clock import ManualClock

A, B = "dvfs:run-a", "dvfs:run-b"


def power(
    inv: Inventory, holder: str, limit_mw: int, node: str = "n1", index: int = 0, **kw: Any
) -> SettingRecord:
    """record_setting of a power limit, the original 400 W unless ``original`` says."""
    return inv.record_setting(
        holder,
        node,
        index,
        ttl_s=kw.pop("ttl_s", 10),
        power_limit_mw=limit_mw,
        original_power_limit_mw=kw.pop("original", 400_000),
        **kw,
    )


def test_originals_are_kept_from_each_settings_first_change(inv: Inventory) -> None:
    first = power(inv, A, 300_000, device_uuid="GPU-n1-0")
    assert (first.holder, first.power_limit_mw, first.original_power_limit_mw) == (
        A,
        300_000,
        400_000,
    )
    assert first.changed == ("power_limit",) and first.version == 1
    # A later change of the same setting: the original is still the device's first one.
    again = power(inv, A, 250_000, original=300_000)
    assert (again.power_limit_mw, again.original_power_limit_mw) == (250_000, 400_000)
    # Locked clocks changed for the first time now: "no lock" is their original.
    clocks = inv.record_setting(A, "n1", 0, ttl_s=10, locked_mhz=(900, 1200))
    assert clocks.locked_mhz == (900, 1200) and clocks.original_locked_mhz is None
    assert clocks.changed == ("power_limit", "locked_clocks")
    apps = inv.record_setting(
        A, "n1", 0, ttl_s=10, applications_mhz=(1215, 1000), original_applications_mhz=(1215, 1410)
    )
    assert apps.original_applications_mhz == (1215, 1410)
    assert apps.device_uuid == "GPU-n1-0" and apps.version == 4
    assert inv.settings() == [apps] == inv.settings(A) and inv.settings(B) == []
    assert inv.setting("n1", 0) == apps and inv.setting("n1", 1) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "at least one of"),
        ({"power_limit_mw": 300_000}, "original_power_limit_mw must be a positive integer"),
        ({"power_limit_mw": True, "original_power_limit_mw": 1}, "power_limit_mw must be"),
        ({"locked_mhz": (1200, 900)}, "min > max"),
        ({"locked_mhz": (900,)}, "locked_mhz must be a pair"),
        ({"locked_mhz": (900, 1000), "original_locked_mhz": (0, 5)}, "original_locked_mhz"),
        ({"applications_mhz": ("1215", 1000)}, "applications_mhz must be a pair"),
        ({"power_limit_mw": 1, "original_power_limit_mw": 1, "ttl_s": 0}, "ttl_s must be > 0"),
    ],
)
def test_bad_input_writes_nothing(inv: Inventory, kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    kwargs.setdefault("ttl_s", 10)
    with pytest.raises(InvalidRequestError, match=message):
        inv.record_setting(A, "n1", 0, **kwargs)
    assert inv.settings() == []


def test_a_second_holder_is_refused_while_the_first_lives(
    inv: Inventory, clock: ManualClock
) -> None:
    power(inv, A, 300_000)
    with pytest.raises(
        SettingsConflictError, match=r"n1:0 .*journalled by 'dvfs:run-a' until 1010"
    ) as live:
        power(inv, B, 200_000)
    assert (live.value.holder, live.value.stale) == (A, "")
    power(inv, B, 200_000, index=1)  # another device is free
    clock.t += 10  # A's hold ends: B must still wait for A's change to be restored
    with pytest.raises(SettingsConflictError, match="must be restored first") as stale:
        power(inv, B, 200_000)
    assert "expired at 1010.000" in stale.value.stale
    assert inv.setting("n1", 0).holder == A  # type: ignore[union-attr]


def test_renew_release_and_an_own_lapsed_row(inv: Inventory, clock: ManualClock) -> None:
    power(inv, A, 300_000, index=0)
    power(inv, A, 300_000, index=1)
    power(inv, B, 300_000, node="n2")
    clock.t += 8
    assert inv.renew_settings(A, 10) == 2
    clock.t += 8  # A renewed in time, B did not
    assert [(r.node, r.holder) for r in inv.stale_settings()] == [("n2", B)]
    assert inv.stale_settings(now=clock.t + 5) == inv.settings()
    assert [r.node for r in inv.stale_settings(nodes=["n1"])] == []
    # B's own lapsed row is still B's until someone takes it over: B may go on.
    assert power(inv, B, 250_000, node="n2").expires_at_s == clock.t + 10
    released = inv.release_setting(A, "n1", 1)
    assert released is not None and released.power_limit_mw == 300_000
    assert inv.release_setting(A, "n1", 1) is None  # released already
    assert inv.release_setting(B, "n1", 0) is None  # not B's
    assert [(r.node, r.index) for r in inv.settings()] == [("n1", 0), ("n2", 0)]


def test_stale_rows_are_taken_over_once_and_a_renewed_one_is_not(
    inv: Inventory, clock: ManualClock
) -> None:
    power(inv, A, 300_000, index=0)
    power(inv, B, 300_000, index=1)
    clock.t += 20
    inv.renew_settings(B, 10)  # B came back before anyone restored it
    taken = inv.claim_stale_settings("restore:1", 60)
    assert [(r.index, r.holder, r.taken_from) for r in taken] == [(0, "restore:1", A)]
    assert taken[0].original_power_limit_mw == 400_000  # the originals travel with it
    assert inv.claim_stale_settings("restore:2", 60) == []  # restore:1 holds it now
    assert inv.renew_settings(A, 10) == 0  # it is not A's any more
    with pytest.raises(SettingsConflictError, match="'restore:1'"):
        power(inv, A, 200_000)
    # A restorer that dies leaves the row stale again; the next one keeps whose it was.
    retaken = inv.claim_stale_settings("restore:2", 60, now=clock.t + 61, slots=[("n1", 0)])
    assert [(r.holder, r.taken_from) for r in retaken] == [("restore:2", A)]
    assert inv.claim_stale_settings("restore:3", 60, now=clock.t + 500, slots=[("n9", 0)]) == []


def test_rewind_undoes_one_record_only_while_unchanged(inv: Inventory) -> None:
    first = power(inv, A, 300_000)
    second = inv.record_setting(A, "n1", 0, ttl_s=10, locked_mhz=(900, 1000))
    assert inv.rewind_setting(A, second, first)
    back = inv.setting("n1", 0)
    assert back is not None and back.changed == ("power_limit",) and back.locked_mhz is None
    assert not inv.rewind_setting(A, second, first)  # the row moved on (version)
    assert not inv.rewind_setting(B, back, None)  # not B's
    assert inv.rewind_setting(A, back, None) and inv.settings() == []


def test_a_job_holders_rows_live_only_with_its_lease(synced: Inventory, clock: ManualClock) -> None:
    job = "job-7"
    synced.record_job(job, {"model": "tiny"})
    with pytest.raises(InvalidRequestError, match="'job-7' is a job .* no live lease on n1:1"):
        power(synced, job, 300_000, index=1)
    synced.acquire_lease("GPU-n1-1", job, 30)
    synced.acquire_lease("MIG-a", job, 30)  # a partition's lease covers its device
    power(synced, job, 300_000, index=1, ttl_s=600)
    power(synced, job, 300_000, index=0, ttl_s=600)
    assert synced.stale_settings() == []
    synced.release_lease("GPU-n1-1", job)
    stale = synced.stale_settings()  # at once, though its own hold runs for 600 s
    assert [(r.node, r.index) for r in stale] == [("n1", 1)]
    clock.t += 31  # the MIG lease lapses too
    assert [(r.node, r.index) for r in synced.stale_settings()] == [("n1", 0), ("n1", 1)]
    with pytest.raises(SettingsConflictError, match="job 'job-7' holds no live lease on n1:1"):
        power(synced, "dvfs:x", 200_000, index=1)


# -- real processes racing -------------------------------------------------------------
def _claim_worker(url: str, holder: str, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        go.wait(timeout=30)
        try:
            power(inv, holder, 300_000, ttl_s=600)
            out.put((holder, "won", None))
        except SettingsConflictError as exc:
            out.put((holder, exc.holder, None))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put((holder, "", repr(exc)))


def _take_worker(url: str, restorer: str, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        go.wait(timeout=30)
        out.put(
            (restorer, [(r.node, r.index) for r in inv.claim_stale_settings(restorer, 600)], None)
        )
    except BaseException as exc:
        out.put((restorer, [], repr(exc)))


def _run(target, url: str, n: int) -> list[tuple]:  # type: ignore[no-untyped-def, type-arg]
    go, out = MP.Barrier(n), MP.Queue()
    procs = [MP.Process(target=target, args=(url, f"proc-{i}", go, out)) for i in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert not [r[2] for r in results if r[2]], results
    return results


def test_processes_racing_to_claim_one_device_one_wins(inv: Inventory) -> None:
    results = _run(_claim_worker, inv.url, 6)
    winners = [holder for holder, verdict, _ in results if verdict == "won"]
    assert len(winners) == 1
    # Every loser was refused naming the winner, and the row is the winner's.
    assert {verdict for _, verdict, _ in results if verdict != "won"} == {winners[0]}
    assert [r.holder for r in inv.settings()] == winners


def test_processes_racing_to_take_over_stale_rows_take_each_once(
    inv: Inventory, clock: ManualClock
) -> None:
    clock.t = 1000.0  # the children use the real clock: these rows are long stale
    for node, index in [("n1", 0), ("n1", 1), ("n2", 0)]:
        power(inv, "dvfs:dead", 300_000, node=node, index=index, ttl_s=5)
    results = _run(_take_worker, inv.url, 6)
    taken = Counter(slot for _, slots, _ in results for slot in slots)
    assert taken == Counter([("n1", 0), ("n1", 1), ("n2", 0)])
    assert {r.taken_from for r in inv.settings()} == {"dvfs:dead"}
