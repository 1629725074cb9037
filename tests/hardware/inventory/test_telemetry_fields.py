"""The inventory keeps a field the device's backend cannot read as absent (None), not 0.
On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

from gpuflow.hardware.backend import TELEMETRY_FIELDS
from gpuflow.hardware.inventory import Inventory

from tests.hardware.inventory.helpers import telemetry_sample


def test_unreadable_fields_round_trip_as_none(synced: Inventory) -> None:
    dcu_like = telemetry_sample("n1", 1, 50.0, **{f: None for f in TELEMETRY_FIELDS})
    synced.record_telemetry([dcu_like])
    back = synced.last_telemetry("n1", 1)
    assert back == dcu_like
    assert back is not None and back.unreadable_fields() == TELEMETRY_FIELDS
    stored = synced.device("n1", 1).telemetry
    assert stored is not None and stored["xids"] is None and stored["ecc_corrected_total"] is None
    # A device whose backend reads the fields keeps its zeros: zero is a reading.
    read = telemetry_sample("n1", 0, 50.0, ecc_corrected_total=0, xids=())
    synced.record_telemetry([read])
    again = synced.last_telemetry("n1", 0)
    assert again is not None and again.ecc_corrected_total == 0 and again.xids == ()


def test_twin_samples_of_every_sku_round_trip(inv: Inventory) -> None:
    from gpuflow.hardware.sim import SimBackend

    twin = SimBackend()
    inv.sync(twin)
    samples = [twin.telemetry(d.node, d.index) for d in twin.devices()]
    inv.record_telemetry(samples)
    for s in samples:
        assert inv.last_telemetry(s.node, s.index) == s
    assert any(s.unreadable_fields() == TELEMETRY_FIELDS for s in samples)  # the DCUs
