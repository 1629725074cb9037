"""The telemetry exporter on the twin, scraped over real HTTP and read back with
prometheus_client's text parser: DCGM names and labels for the 18 default devices, values
equal to `gpuflow hw list --json` at the same moment, faults in the XID/ECC series after the
next refresh, MIG instances with their GPU_I_* labels, cordons and leases, and no series for
what a device's backend cannot read.

The twin's clock is held still (tests/helpers/telemetry.py), so the exporter and the CLI
read one moment; refreshes happen when a test asks (or advances the sampler's clock), never
after a sleep.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from gpuflow.hardware.backend import TELEMETRY_FIELDS, HardwareError, PartitionRequest
from gpuflow.hardware.dcgm_mapping import placement_instance_id, sample_specs
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.telemetry.exporter import TelemetryExporter
from gpuflow.tasks.telemetry.snapshot import SnapshotBuilder, catalogue, sample_name
from typer.testing import CliRunner

from gpuflow.cli import app
from tests.helpers.clock import GatedClock
from tests.helpers.telemetry import Scrape, busy_fleet, freeze_twin_clock, scrape, serving

runner = CliRunner()
A100, V100, DCU = ("a100-0", 1), ("v100-0", 0), ("dcu-0", 0)


@pytest.fixture
def twin(monkeypatch: pytest.MonkeyPatch) -> SimBackend:
    freeze_twin_clock(monkeypatch, time.time())
    return SimBackend()


@pytest.fixture
def inventory(twin: SimBackend) -> Iterator[Inventory]:
    inv = Inventory()
    inv.sync(twin)
    yield inv
    inv.close()


@pytest.fixture
def exporter(twin: SimBackend, inventory: Inventory) -> Iterator[TelemetryExporter]:
    with serving(twin, inventory) as ex:
        yield ex


def _uuid(twin: SimBackend, where: tuple[str, int]) -> str:
    return twin.device(*where).uuid


def _cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_default_device_is_served_in_dcgm_names_equal_to_hw_list(
    exporter: TelemetryExporter,
) -> None:
    got = scrape(exporter.url)
    rows = json.loads(_cli("hw", "list", "--json"))
    assert len(rows) == 18 and {r["vendor"] for r in rows} == {"NVIDIA", "Hygon"}
    for row in rows:
        dev = {"UUID": row["uuid"], "GPU_I_ID": ""}
        labels = got.find("DCGM_FI_DEV_GPU_TEMP", **dev)[0].labels
        assert labels == {
            "gpu": str(row["index"]),
            "UUID": row["uuid"],
            "modelName": row["sku"],
            "Hostname": row["node"],
            "vendor": row["vendor"],
        }
        assert round(got.value("DCGM_FI_DEV_GPU_TEMP", **dev), 1) == row["temperature_c"]
        assert got.value("DCGM_FI_DEV_POWER_USAGE", **dev) * 1000 == pytest.approx(row["power_mw"])
        util = got.value("DCGM_FI_DEV_GPU_UTIL", **dev) / 100
        assert util == pytest.approx(row["utilization_ratio"])
        assert got.value("DCGM_FI_DEV_FB_USED", **dev) == row["memory_used_mb"]
        assert got.value("DCGM_FI_DEV_FB_TOTAL", **dev) == row["memory_total_mb"]
        free = got.value("DCGM_FI_DEV_FB_FREE", **dev)
        assert free == row["memory_total_mb"] - row["memory_used_mb"]
        assert got.value("gpuflow_device_present", **dev) == 1
        # hw list names what the backend cannot read: exactly those have no series.
        for spec in sample_specs():
            if spec.source in TELEMETRY_FIELDS:
                has = bool(got.find(spec.name, **dev))
                assert has == (spec.source not in row["telemetry_unreadable"]), spec.name
        has_xids = bool(got.find("DCGM_FI_DEV_XID_ERRORS", **dev))
        assert has_xids == ("xids" not in row["telemetry_unreadable"])
        risk = got.find("gpuflow_health_risk", **dev)
        assert [(s.labels["model"], s.labels["reason"]) for s in risk] == [("rules", "model")]
        assert 0.0 <= risk[0].value <= 1.0
        info = got.find("gpuflow_device_info", **dev)[0].labels
        assert (info["region"], info["role"], info["backend"]) == (
            row["region"],
            row["role"],
            "sim",
        )
    # Types survive the round trip: DCGM's counters keep their names (untyped), ours are counters.
    assert got.families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"
    assert got.families["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert got.families["gpuflow_exporter_refreshes"].type == "counter"


def test_a_v100_and_a_dcu_lack_the_series_their_backends_cannot_read(
    twin: SimBackend, exporter: TelemetryExporter
) -> None:
    got = scrape(exporter.url)
    remap = {
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    }
    errors = {
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gpuflow_retired_pages",
        "gpuflow_clock_event_reason",
    }
    readings = {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"}

    def names(where: tuple[str, int]) -> set[str]:
        uuid = _uuid(twin, where)
        return {s.name for s in got.samples if s.labels.get("UUID") == uuid}

    v100, dcu, a100 = names(V100), names(DCU), names(A100)
    assert remap <= a100 and not remap & v100 and not remap & dcu  # row remapping: Ampere+
    assert errors <= v100 and not errors & dcu  # hy-smi reads none of them
    assert "gpuflow_retired_pages" not in a100  # Ampere remaps rows instead
    assert readings <= v100 and readings <= dcu and readings <= a100
    assert got.value("gpuflow_health_risk", UUID=_uuid(twin, DCU)) >= 0.0  # scored all the same


def test_an_injected_xid79_shows_within_one_interval(
    twin: SimBackend, inventory: Inventory
) -> None:
    clock = GatedClock()
    with serving(twin, inventory, wait=clock.wait) as exporter:
        uuid = _uuid(twin, A100)
        before = scrape(exporter.url)
        assert before.value("DCGM_FI_DEV_XID_ERRORS", UUID=uuid) == 0
        assert before.find("gpuflow_xid_errors_total", UUID=uuid) == []
        _cli("sim", "inject", "--device", "a100-0:1", "--fault", "xid79")
        # A scrape serves the last snapshot: it never reads the device itself.
        assert scrape(exporter.url).value("DCGM_FI_DEV_XID_ERRORS", UUID=uuid) == 0
        done = exporter.refreshes
        clock.advance(exporter.interval_s)  # the sampler thread's next refresh is due
        assert exporter.wait_for_refresh(done, timeout_s=60)
        after = scrape(exporter.url)
    assert after.value("DCGM_FI_DEV_XID_ERRORS", UUID=uuid) == 79
    assert after.value("gpuflow_xid_errors_total", UUID=uuid, xid="79") == 1
    assert after.value("gpuflow_device_present", UUID=uuid) == 0
    assert after.find("DCGM_FI_DEV_GPU_TEMP", UUID=uuid) == []  # off the bus: no readings
    lost = after.find("gpuflow_health_risk", UUID=uuid)
    assert [(s.value, s.labels["reason"]) for s in lost] == [(1.0, "device lost")]


def test_xids_between_refreshes_are_all_counted_and_ecc_shows(
    twin: SimBackend, exporter: TelemetryExporter
) -> None:
    uuid, dcu = _uuid(twin, A100), _uuid(twin, DCU)
    for _ in range(2):  # no tenant: each is an XID 13 on its own
        _cli("sim", "inject", "--device", "a100-0:1", "--fault", "app-fatal")
    _cli("sim", "inject", "--device", "a100-0:2", "--fault", "ecc-uncorrectable")
    _cli("sim", "inject", "--device", "dcu-0:0", "--fault", "ecc-uncorrectable")
    exporter.refresh()
    got = scrape(exporter.url)
    assert got.value("gpuflow_xid_errors_total", UUID=uuid, xid="13") == 2
    assert got.value("DCGM_FI_DEV_XID_ERRORS", UUID=uuid) == 13
    ecc = _uuid(twin, ("a100-0", 2))
    assert got.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", UUID=ecc) == 1
    assert got.value("gpuflow_xid_errors_total", UUID=ecc, xid="48") == 1
    (failed,) = got.find("gpuflow_health_risk", UUID=ecc)
    assert failed.value == 1.0 and failed.labels["reason"].startswith("device failed")
    # The DCU fails too, but hy-smi shows neither the ECC error nor an XID.
    assert got.find("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", UUID=dcu) == []
    assert got.find("gpuflow_xid_errors_total", UUID=dcu) == []
    exporter.refresh()  # read again: nothing new, nothing counted twice
    again = scrape(exporter.url)
    assert again.value("gpuflow_xid_errors_total", UUID=uuid, xid="13") == 2


def test_a_mig_instance_appears_with_its_profile_labels_and_lease(
    twin: SimBackend, inventory: Inventory, exporter: TelemetryExporter
) -> None:
    twin.set_partition_mode("a100-0", 0, True)
    layout = ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]  # mig-parted's all-balanced
    created = twin.create_partitions("a100-0", 0, [PartitionRequest(p) for p in layout])
    inventory.sync(twin)
    inventory.acquire_lease(created[1].uuid, "job-mig", 3600)
    inventory.acquire_lease(_uuid(twin, V100), "job-whole", 3600)
    inventory.cordon("v100-0", 1, reason="fan noise")
    exporter.refresh()
    got = scrape(exporter.url)
    gpu = _uuid(twin, ("a100-0", 0))
    parts = got.find("gpuflow_partition_info", UUID=gpu)
    want = {
        (p.profile, str(placement_instance_id(p.placement_start, p.placement_size, 8)), p.uuid)
        for p in created
    }
    got_parts = {
        (s.labels["GPU_I_PROFILE"], s.labels["GPU_I_ID"], s.labels["partition_uuid"]) for s in parts
    }
    assert got_parts == want and len({gi for _, gi, _ in got_parts}) == 4
    row = next(r for r in json.loads(_cli("hw", "list", "--json")) if r["uuid"] == gpu)
    assert sorted(p["profile"] for p in row["partitions"]) == sorted(s[0] for s in got_parts)
    for p in created:
        gi = str(placement_instance_id(p.placement_start, p.placement_size, 8))
        labels = {"UUID": gpu, "GPU_I_PROFILE": p.profile, "GPU_I_ID": gi}
        assert got.value("DCGM_FI_DEV_FB_TOTAL", **labels) == p.memory_mb
        assert got.find("DCGM_FI_DEV_FB_TOTAL", **labels)[0].labels["gpu"] == "0"
    (lease,) = got.find("gpuflow_lease_info", UUID=gpu)
    assert lease.labels["owner"] == "job-mig"
    assert lease.labels["GPU_I_PROFILE"] == created[1].profile
    assert lease.labels["resource_id"] == created[1].uuid
    (whole,) = got.find("gpuflow_lease_info", UUID=_uuid(twin, V100))
    assert (whole.labels["owner"], whole.labels["kind"]) == ("job-whole", "device")
    cordoned = _uuid(twin, ("v100-0", 1))
    assert got.value("gpuflow_device_cordoned", UUID=cordoned) == 1
    assert got.value("gpuflow_device_cordoned", UUID=gpu) == 0
    (cordon,) = got.find("gpuflow_cordon_info", UUID=cordoned)
    assert (cordon.labels["scope"], cordon.labels["reason"]) == ("device", "fan noise")


class CountingTwin(SimBackend):
    """The twin, counting telemetry reads; its discovery can be made to fail once."""

    reads = 0
    fail_discovery = False

    def telemetry(self, node, index):  # type: ignore[no-untyped-def]
        CountingTwin.reads += 1
        return super().telemetry(node, index)

    def discover(self):  # type: ignore[no-untyped-def]
        if CountingTwin.fail_discovery:
            CountingTwin.fail_discovery = False
            raise HardwareError("driver busy")
        return super().discover()


def test_scrapes_never_read_the_devices_and_a_failed_refresh_keeps_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freeze_twin_clock(monkeypatch, time.time())
    twin = CountingTwin()
    with serving(twin) as exporter:
        reads = CountingTwin.reads
        assert reads == 18  # the first snapshot, taken before serving
        for _ in range(3):
            assert len(scrape(exporter.url).find("DCGM_FI_DEV_GPU_TEMP")) == 18
        assert CountingTwin.reads == reads
        CountingTwin.fail_discovery = True
        exporter.refresh()
        got = scrape(exporter.url)
    assert len(got.find("DCGM_FI_DEV_GPU_TEMP")) == 18  # the previous snapshot, still served
    assert got.value("gpuflow_exporter_refresh_failures_total") == 1
    assert got.value("gpuflow_exporter_refreshes_total") == 1
    assert got.value("gpuflow_exporter_interval_seconds") == 5


def test_one_node_can_be_exported_alone_and_an_unknown_one_is_refused(twin: SimBackend) -> None:
    with serving(twin, nodes=["dcu-0"]) as exporter:
        got = scrape(exporter.url)
    assert {s.labels["Hostname"] for s in got.find("DCGM_FI_DEV_GPU_TEMP")} == {"dcu-0"}
    assert got.find("gpuflow_exporter_info")[0].labels["nodes"] == "dcu-0"
    with pytest.raises(ValueError, match=r"--node nowhere: not a node of backend 'sim'"):
        SnapshotBuilder(twin, nodes=["nowhere"])


def test_bad_settings_are_refused_naming_the_flag(twin: SimBackend) -> None:
    builder = SnapshotBuilder(twin)
    with pytest.raises(ValueError, match=r"--interval-s 4\.9: interval_s must be >= 5 s"):
        TelemetryExporter(builder, 4.9)
    exporter = TelemetryExporter(builder, 5)
    with pytest.raises(ValueError, match=r"--port 70000 is not in 0\.\.65535"):
        exporter.start("127.0.0.1", 70000)
    with pytest.raises(ValueError, match=r"--host 'no-such-host\.invalid'"):
        exporter.start("no-such-host.invalid", 0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=rf"--port {port} on --host 127.0.0.1 cannot be bound"):
            exporter.start("127.0.0.1", port)
    assert exporter.refreshes == 0  # refused before any device was read


def test_every_metric_the_scrape_holds_is_in_the_catalogue(
    twin: SimBackend, inventory: Inventory, exporter: TelemetryExporter
) -> None:
    """docs/telemetry.md lists the catalogue (tests/test_docs_telemetry.py checks it), so
    nothing is exported that the doc does not name; and a fleet with a partition, a lease,
    a cordon and an XID shows every device-level family of it."""
    busy_fleet(twin, inventory)
    exporter.refresh()
    got: Scrape = scrape(exporter.url)
    declared = {sample_name(spec) for spec in catalogue()}
    assert got.names() <= declared
    # Missing: only what shows that something went wrong.
    errors = {"gpuflow_telemetry_read_errors_total", "gpuflow_exporter_stage_errors_total"}
    assert declared - got.names() == errors
    apps = {"DCGM_FI_DEV_APP_SM_CLOCK": 1095, "DCGM_FI_DEV_APP_MEM_CLOCK": 1215}
    for name, mhz in apps.items():
        assert [s.value for s in got.find(name)] == [mhz]  # only the device that set them
