"""HygonBackend against tests/hardware/fake_hy_smi.py, plus the parsers on public samples."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from gpuflow.hardware import hygon_parse as hp
from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.hygon import HygonBackend, sku_name_for
from gpuflow.hardware.placement import LayoutError

FAKE = Path(__file__).with_name("fake_hy_smi.py")
NODE = "dcu-node-1"

_spec = importlib.util.spec_from_file_location("fake_hy_smi", FAKE)
assert _spec and _spec.loader
fake_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_module)


class Fake:
    def __init__(self, state: Path, log: Path) -> None:
        self.state_path = state
        self.log = log

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def clear(self) -> None:
        self.log.write_text("")

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def write(self, state: dict) -> None:
        self.state_path.write_text(json.dumps(state))

    def edit(self, fn) -> None:  # type: ignore[no-untyped-def]
        s = self.state()
        fn(s)
        self.write(s)


def _mutating(call: list[str]) -> bool:
    return any(
        a in call
        for a in (
            "-create-vdevices",
            "-destroy-vdevice",
            "-cgi",
            "-dci",
            "-dgi",
            "--setsclk",
            "--resetclocks",
            "--setpoweroverdrive",
        )
    )


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    # `#!/usr/bin/env python3` should find this interpreter, not a slow pyenv shim.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    state, log = tmp_path / "hy-smi-state.json", tmp_path / "hy-smi-calls.log"
    monkeypatch.setenv("FAKE_HY_SMI_STATE", str(state))
    monkeypatch.setenv("FAKE_HY_SMI_LOG", str(log))
    monkeypatch.delenv("FAKE_HY_SMI_MODE", raising=False)
    f = Fake(state, log)
    f.write(fake_module.default_state())
    return f


@pytest.fixture
def backend(fake: Fake) -> HygonBackend:
    return HygonBackend(executable=str(FAKE), node_name=NODE, region="cn-north")


def vdcu(cu: object, mem: object) -> PartitionRequest:
    return PartitionRequest(profile="vdcu", compute_units=cu, memory_mb=mem)  # type: ignore[arg-type]


HAMI = [vdcu(5, 4096), vdcu(15, 8192), vdcu(20, 8192), vdcu(20, 8192)]


def test_fake_is_an_executable_script() -> None:
    assert os.access(FAKE, os.X_OK)
    assert FAKE.read_text().startswith("#!/usr/bin/env python3\n")


# -- discovery ----------------------------------------------------------------------------


def test_discovery(backend: HygonBackend) -> None:
    (node,) = backend.discover()
    assert (node.name, node.region, node.role) == (NODE, "cn-north", "active")
    assert [d.index for d in node.devices] == [0, 1]
    d0 = node.devices[0]
    assert d0.vendor == "Hygon"
    assert d0.sku == "Hygon DCU Z100"  # "Z100L" maps onto the SKU table
    assert d0.uuid == "DCU0Z1000000"
    assert d0.memory_total_mb == 32752
    assert d0.partition_kinds == ("vdcu",)
    (profile,) = backend.partition_profiles(NODE, 0)
    assert (profile.name, profile.kind, profile.compute_slices, profile.memory_mb) == (
        "vdcu",
        "vdcu",
        60,
        32752,
    )
    assert profile.max_count == 4
    assert any("mig" in n for n in backend.notes())  # why MIG is absent is recorded


def test_sku_names() -> None:
    assert sku_name_for("K100_AI") == "Hygon DCU K100"
    assert sku_name_for("Z100") == "Hygon DCU Z100"
    assert sku_name_for("BW1000") == "BW1000"


def test_driver_without_virtual_subcommand(fake: Fake, backend: HygonBackend) -> None:
    # Drivers before 6.2.26 ship `hy-virtual`: devices are found, but offer no vDCU.
    fake.edit(lambda s: s.update(virtual=False, label="HCU"))
    fake.edit(lambda s: s["devices"][0].update(series="K100_AI", memory_mib=65520))
    d0 = backend.discover()[0].devices[0]
    assert (d0.sku, d0.memory_total_mb, d0.partition_kinds) == ("Hygon DCU K100", 65520, ())
    assert backend.partition_profiles(NODE, 0) == []
    assert any("hy-smi virtual" in n and "invalid choice" in n for n in backend.notes())
    with pytest.raises(UnsupportedError, match="no vDCUs"):
        backend.create_partitions(NODE, 0, [vdcu(5, 1024)])
    with pytest.raises(UnsupportedError, match="neither vDCUs nor MIG"):
        backend.set_partition_mode(NODE, 0, True)
    assert backend.partitions(NODE, 0) == []
    assert backend.clocks(NODE, 0).sm_clock_mhz == 1500  # "HCU[0]" text lines parse too


def test_available(fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ok, why = HygonBackend.available(str(tmp_path / "no-such-hy-smi"))
    assert not ok and "not found" in why
    ok, why = HygonBackend.available(str(FAKE))
    assert ok and "2 DCU" in why
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "fail")
    ok, why = HygonBackend.available(str(FAKE))
    assert not ok and "driver not loaded" in why


# -- vDCU round trip ------------------------------------------------------------------------


def test_create_show_destroy_round_trip(fake: Fake, backend: HygonBackend) -> None:
    backend.discover()
    fake.clear()
    created = backend.create_partitions(NODE, 0, HAMI)
    creates = [c for c in fake.calls() if "-create-vdevices" in c]
    assert [c for c in creates] == [
        [
            "virtual",
            "-create-vdevices",
            "4",
            "-d",
            "0",
            "-vdevice-compute-units",
            "5,15,20,20",
            "-vdevice-memory-size",
            "4096,8192,8192,8192",
        ]
    ]
    assert [(p.compute_units, p.memory_mb) for p in created] == [
        (5, 4096),
        (15, 8192),
        (20, 8192),
        (20, 8192),
    ]
    assert [p.uuid for p in created] == ["vdcu-0", "vdcu-1", "vdcu-2", "vdcu-3"]
    assert all(p.kind == "vdcu" and p.device_index == 0 and p.node == NODE for p in created)
    assert backend.partitions(NODE, 0) == created
    assert backend.partitions(NODE, 1) == []
    assert backend.partition_mode(NODE, 0) and not backend.partition_mode(NODE, 1)

    # vDCU numbers are host-wide: the next DCU's vDCUs continue after them.
    more = backend.create_partitions(NODE, 1, [vdcu(30, 16000)])
    assert [p.uuid for p in more] == ["vdcu-4"]

    fake.clear()
    backend.destroy_partitions(NODE, 0)
    assert [c for c in fake.calls() if _mutating(c)] == [["virtual", "-d", "0", "-destroy-vdevice"]]
    assert backend.partitions(NODE, 0) == []
    assert not backend.partition_mode(NODE, 0)
    assert [p.uuid for p in backend.partitions(NODE, 1)] == ["vdcu-4"]


def test_destroy_with_every_uuid_named_is_allowed(fake: Fake, backend: HygonBackend) -> None:
    created = backend.create_partitions(NODE, 0, HAMI[:2])
    backend.destroy_partitions(NODE, 0, [p.uuid for p in reversed(created)])
    assert backend.partitions(NODE, 0) == []


def test_destroy_subset_unknown_and_bad_ids(fake: Fake, backend: HygonBackend) -> None:
    created = backend.create_partitions(NODE, 0, HAMI[:2])
    fake.clear()
    with pytest.raises(UnsupportedError, match="destroys all vDCUs of a DCU"):
        backend.destroy_partitions(NODE, 0, [created[0].uuid])
    with pytest.raises(InvalidRequestError, match="no partitions"):
        backend.destroy_partitions(NODE, 0, ["vdcu-99"])
    with pytest.raises(InvalidRequestError, match="list of partition ids"):
        backend.destroy_partitions(NODE, 0, "vdcu-0")  # a bare string is not a list
    assert not any(_mutating(c) for c in fake.calls())
    assert len(backend.partitions(NODE, 0)) == 2


def test_destroy_nothing_runs_no_destroy(fake: Fake, backend: HygonBackend) -> None:
    backend.destroy_partitions(NODE, 1)
    assert not any(_mutating(c) for c in fake.calls())


def test_existing_vdcus_are_refused_before_creating(fake: Fake, backend: HygonBackend) -> None:
    backend.create_partitions(NODE, 0, [vdcu(10, 1024)])
    fake.clear()
    with pytest.raises(InvalidRequestError, match="already has partitions"):
        backend.create_partitions(NODE, 0, [vdcu(10, 1024)])
    assert not any(_mutating(c) for c in fake.calls())


def test_partition_mode(fake: Fake, backend: HygonBackend) -> None:
    backend.set_partition_mode(NODE, 0, True)  # vDCUs need no mode: a no-op
    backend.create_partitions(NODE, 0, [vdcu(10, 1024)])
    with pytest.raises(InvalidRequestError, match="destroy them first"):
        backend.set_partition_mode(NODE, 0, False)
    backend.set_partition_mode(NODE, 1, False)
    assert not any(_mutating(c) for c in fake.calls() if "-create-vdevices" not in c)


# -- validation happens before any command ------------------------------------------------------

INVALID = [
    pytest.param(0, [vdcu(5, 1024)] * 5, LayoutError, "at most 4", id="five-vdcus"),
    pytest.param(
        0, [vdcu(40, 1024), vdcu(21, 1024)], LayoutError, "61 compute units", id="cu-over"
    ),
    pytest.param(0, [vdcu(5, 30000), vdcu(5, 3000)], LayoutError, "MiB", id="memory-over"),
    pytest.param(0, [vdcu(5, -1)], LayoutError, "memory", id="negative-memory"),
    pytest.param(0, [vdcu(0, 1024)], LayoutError, "compute unit", id="zero-cu"),
    pytest.param(0, [vdcu(5.5, 1024)], InvalidRequestError, "must be an int", id="float-cu"),
    pytest.param(0, [vdcu(True, 1024)], InvalidRequestError, "must be an int", id="bool-cu"),
    pytest.param(0, [vdcu(5, "1024")], InvalidRequestError, "must be an int", id="str-memory"),
    pytest.param(0, [], InvalidRequestError, "no partition", id="empty"),
    pytest.param(0, vdcu(5, 1024), InvalidRequestError, "list of PartitionRequest", id="not-list"),
    pytest.param(
        0,
        [vdcu(5, 1024), PartitionRequest(profile="2g.15gb")],
        InvalidRequestError,
        "one request",
        id="mixed-kinds",
    ),
    pytest.param(
        0,
        [PartitionRequest(profile="vdcu", compute_units=5, memory_mb=64, placement_start=0)],
        InvalidRequestError,
        "MIG only",
        id="placement-on-vdcu",
    ),
    pytest.param(
        "0; rm -rf /", [vdcu(5, 1024)], InvalidRequestError, "must be an int", id="shell-id"
    ),
    pytest.param(-1, [vdcu(5, 1024)], InvalidRequestError, ">= 0", id="negative-id"),
    pytest.param(7, [vdcu(5, 1024)], InvalidRequestError, "no DCU 7", id="unknown-id"),
    pytest.param(0, [PartitionRequest(profile="2g.15gb")], UnsupportedError, "no MIG", id="no-mig"),
]


@pytest.mark.parametrize(("index", "requests", "error", "match"), INVALID)
def test_invalid_requests_run_no_command(
    fake: Fake, backend: HygonBackend, index: object, requests: object, error: type, match: str
) -> None:
    backend.discover()  # the budgets come from discovery, done once and cached
    fake.clear()
    with pytest.raises(error, match=match):
        backend.create_partitions(NODE, index, requests)  # type: ignore[arg-type]
    assert fake.calls() == []


def test_cold_backend_never_mutates_on_invalid_requests(fake: Fake) -> None:
    for index, requests in [("0; rm -rf /", [vdcu(5, 1)]), (0, [vdcu(5, 1024)] * 5)]:
        cold = HygonBackend(executable=str(FAKE), node_name=NODE)
        with pytest.raises(InvalidRequestError):
            cold.create_partitions(NODE, index, requests)  # type: ignore[arg-type]
    calls = fake.calls()
    assert not any(_mutating(c) for c in calls)
    assert not any("rm -rf" in a for c in calls for a in c)


def test_wrong_node_is_refused(fake: Fake, backend: HygonBackend) -> None:
    with pytest.raises(InvalidRequestError, match="not this host"):
        backend.partitions("other-host", 0)
    assert fake.calls() == []


# -- the tool failing or talking nonsense -----------------------------------------------------------


def test_nonzero_exit_is_a_hardware_error_with_command_and_stderr(
    backend: HygonBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "fail")
    with pytest.raises(HardwareError) as err:
        backend.discover()
    msg = str(err.value)
    assert "exited with status 1" in msg
    assert "--showproductname" in msg and str(FAKE) in msg
    assert "driver not loaded (simulated)" in msg


def test_tool_refusing_a_create_is_reported(fake: Fake, backend: HygonBackend) -> None:
    backend.discover()  # the backend believes in 60 CUs ...
    fake.edit(lambda s: s["devices"][0].update(compute_units=30))  # ... the driver now says 30
    with pytest.raises(HardwareError) as err:
        backend.create_partitions(NODE, 0, HAMI)
    assert "-create-vdevices 4" in str(err.value)
    assert "not enough compute units on device 0" in str(err.value)


def test_garbage_output_is_quoted(backend: HygonBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "garbage")
    with pytest.raises(HardwareError) as err:
        backend.discover()
    msg = str(err.value)
    assert "unexpected output" in msg
    assert "GARBAGE-0xDEADBEEF" in msg  # the offending output is quoted ...
    assert "more characters" in msg  # ... and cut to a sensible length
    assert len(msg) < 1200


def test_garbage_telemetry_after_discovery(
    backend: HygonBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.discover()
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "garbage")
    with pytest.raises(HardwareError, match="Segmentation fault"):
        backend.telemetry(NODE, 0)
    with pytest.raises(HardwareError, match="GARBAGE"):
        backend.partitions(NODE, 0)


def test_create_that_silently_does_nothing_is_caught(
    backend: HygonBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.discover()
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "noop")
    with pytest.raises(HardwareError, match="created successfully.*not the requested"):
        backend.create_partitions(NODE, 0, HAMI)


# -- telemetry -------------------------------------------------------------------------------


def test_telemetry_and_energy_estimate(fake: Fake) -> None:
    now = [100.0]
    b = HygonBackend(executable=str(FAKE), node_name=NODE, clock=lambda: now[0])
    s = b.telemetry(NODE, 0)
    assert s.present
    assert s.temperature_c == 41.0  # junction sensor
    assert s.power_mw == 120_000
    assert s.utilization_ratio == pytest.approx(0.35)
    assert (s.memory_used_mb, s.memory_total_mb) == (1024, 32752)
    assert s.sm_clock_mhz == 1500
    assert s.power_limit_mw == 300_000
    assert s.energy_mj == 0  # the estimate starts with this instance
    assert (s.ecc_corrected_total, s.xids, s.remapped_rows_pending) == (0, (), False)
    now[0] = 110.0
    assert b.telemetry(NODE, 0).energy_mj == 1_200_000  # 120 W for 10 s
    fake.edit(lambda st: st["devices"][0].update(power_w=200.0))
    now[0] = 120.0
    assert b.energy_mj(NODE, 0) == 1_200_000 + 1_600_000  # trapezoid 120 -> 200 W
    assert b.telemetry(NODE, 1).energy_mj == 0  # per device


def test_telemetry_of_a_device_that_fell_off(fake: Fake, backend: HygonBackend) -> None:
    backend.discover()
    fake.edit(lambda s: s["devices"][1].update(present=False))
    s = backend.telemetry(NODE, 1)
    assert not s.present and s.power_mw == 0
    assert backend.telemetry(NODE, 0).present


def test_telemetry_missing_or_bad_field_is_an_error(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(lambda s: s["devices"][0].update(hide_fields=["Average Graphics Package Power (W)"]))
    with pytest.raises(HardwareError, match="lacks 'Average Graphics Package Power"):
        backend.telemetry(NODE, 0)
    fake.edit(lambda s: s["devices"][0].update(hide_fields=[], use_pct=250.0))
    with pytest.raises(HardwareError, match="outside 0..100"):
        backend.telemetry(NODE, 0)
    # Fields hy-smi may not report at all are optional.
    fake.edit(
        lambda s: s["devices"][0].update(
            use_pct=1.0, hide_fields=["sclk clock speed:", "Max Graphics Package Power (W)"]
        )
    )
    s = backend.telemetry(NODE, 0)
    assert (s.sm_clock_mhz, s.power_limit_mw) == (0, 0)


# -- clocks and power ------------------------------------------------------------------------


def test_clocks_lock_and_reset(fake: Fake, backend: HygonBackend) -> None:
    c = backend.clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.sm_clock_min_mhz, c.sm_clock_max_mhz) == (1500, 300, 1500)
    assert c.locked_min_mhz is None
    fake.clear()
    backend.set_locked_clocks(NODE, 0, 700, 1300)
    assert [c for c in fake.calls() if _mutating(c)] == [["-d", "0", "--setsclk", "1", "2"]]
    c = backend.clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.locked_min_mhz, c.locked_max_mhz) == (1200, 800, 1200)
    backend.reset_locked_clocks(NODE, 0)
    c = backend.clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.locked_min_mhz) == (1500, None)


@pytest.mark.parametrize(
    ("lo", "hi", "match"),
    [
        (900, 1100, "no sclk level"),
        (1600, 1700, "no sclk level"),
        (1300, 700, "min_mhz <= max_mhz"),
        (0, 700, "0 < min_mhz"),
        (700.0, 1300, "ints"),
    ],
)
def test_bad_clock_locks_run_no_setter(
    fake: Fake, backend: HygonBackend, lo: object, hi: object, match: str
) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        backend.set_locked_clocks(NODE, 0, lo, hi)  # type: ignore[arg-type]
    assert not any(_mutating(c) for c in fake.calls())


def test_power_limits_and_cap(fake: Fake, backend: HygonBackend) -> None:
    lim = backend.power_limits(NODE, 0)
    assert (lim.limit_mw, lim.min_limit_mw, lim.max_limit_mw) == (300_000, 100_000, 300_000)
    fake.clear()
    backend.set_power_limit_mw(NODE, 0, 250_000)
    assert [c for c in fake.calls() if _mutating(c)] == [["-d", "0", "--setpoweroverdrive", "250"]]
    assert backend.power_limits(NODE, 0).limit_mw == 250_000
    fake.clear()
    for bad, match in [
        (250_500, "whole watts"),
        (400_000, "outside"),
        (50_000, "outside"),
        ("250000", "int"),
    ]:
        with pytest.raises(InvalidRequestError, match=match):
            backend.set_power_limit_mw(NODE, 0, bad)  # type: ignore[arg-type]
    assert not any(_mutating(c) for c in fake.calls())


def test_unknown_model_power_range_is_the_current_cap(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(lambda s: s["devices"][0].update(series="BW1000", max_power_w=450.0))
    lim = backend.power_limits(NODE, 0)
    assert lim.min_limit_mw == lim.max_limit_mw == lim.limit_mw == 450_000


def test_setters_missing_from_help_are_unsupported(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(lambda s: s.update(control=False))
    with pytest.raises(UnsupportedError, match="--setsclk"):
        backend.set_locked_clocks(NODE, 0, 300, 1500)
    with pytest.raises(UnsupportedError, match="--setpoweroverdrive"):
        backend.set_power_limit_mw(NODE, 0, 200_000)
    with pytest.raises(UnsupportedError, match="--resetclocks"):
        backend.reset_locked_clocks(NODE, 0)
    with pytest.raises(UnsupportedError, match="applications clocks"):
        backend.set_applications_clocks(NODE, 0, 1000, 1500)
    assert not any(_mutating(c) for c in fake.calls())


# -- MIG ---------------------------------------------------------------------------------------


def _mig_state(s: dict) -> None:
    # The C-3000 "BW" geometry GPUStack's runbook reports: 4 slices, 80 CUs, 65520 MiB.
    s["mig"] = True
    s["devices"][0].update(
        series="BW1000",
        compute_units=80,
        memory_mib=65520,
        mig_profiles=[
            {
                "name": "2g.15gb",
                "id": 5,
                "slices": 1,
                "memory_mib": 16380,
                "max": 4,
                "starts": [0, 1, 2, 3],
                "cus": 20,
            },
            {
                "name": "4g.31gb",
                "id": 3,
                "slices": 2,
                "memory_mib": 32760,
                "max": 2,
                "starts": [0, 2],
                "cus": 40,
            },
            {
                "name": "8g.63gb",
                "id": 0,
                "slices": 4,
                "memory_mib": 65520,
                "max": 1,
                "starts": [0],
                "cus": 80,
            },
        ],
    )


def test_mig_discovery_create_destroy(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(_mig_state)
    d0, d1 = backend.discover()[0].devices
    assert d0.partition_kinds == ("vdcu", "mig") and d1.partition_kinds == ("vdcu",)
    profiles = {p.name: p for p in backend.partition_profiles(NODE, 0) if p.kind == "mig"}
    assert profiles["4g.31gb"].profile_id == 3
    assert profiles["4g.31gb"].placement_starts == (0, 2)
    assert profiles["4g.31gb"].placement_size == 2
    assert profiles["2g.15gb"].max_count == 4
    assert profiles["2g.15gb"].memory_mb == 16384  # hy-smi prints GiB with 2 decimals

    fake.clear()
    created = backend.create_partitions(
        NODE,
        0,
        [PartitionRequest("2g.15gb"), PartitionRequest("4g.31gb"), PartitionRequest("2g.15gb")],
    )
    cgi = [c for c in fake.calls() if "-cgi" in c]
    assert cgi == [  # largest first, the documented syntax
        ["mig", "-cgi", "3", "-C", "-i", "0"],
        ["mig", "-cgi", "5", "-C", "-i", "0"],
        ["mig", "-cgi", "5", "-C", "-i", "0"],
    ]
    assert sorted((p.profile, p.placement_start) for p in created) == [
        ("2g.15gb", 2),
        ("2g.15gb", 3),
        ("4g.31gb", 0),
    ]
    assert backend.partition_mode(NODE, 0)

    fake.clear()
    with pytest.raises(LayoutError):  # no room for 4 more slices
        backend.create_partitions(NODE, 0, [PartitionRequest("8g.63gb")])
    with pytest.raises(UnsupportedError, match="placement"):
        backend.create_partitions(NODE, 0, [PartitionRequest("2g.15gb", placement_start=3)])
    with pytest.raises(InvalidRequestError, match="vDCUs only"):
        backend.create_partitions(NODE, 0, [PartitionRequest("2g.15gb", memory_mb=5)])
    assert not any(_mutating(c) for c in fake.calls())

    one = next(p for p in created if p.profile == "4g.31gb")
    backend.destroy_partitions(NODE, 0, [one.uuid])
    assert sorted(p.profile for p in backend.partitions(NODE, 0)) == ["2g.15gb", "2g.15gb"]
    fake.clear()
    backend.destroy_partitions(NODE, 0)
    assert [c for c in fake.calls() if _mutating(c)] == [
        ["mig", "-dci", "-i", "0"],
        ["mig", "-dgi", "-i", "0"],
    ]
    assert backend.partitions(NODE, 0) == []


# -- parsers on public samples -----------------------------------------------------------------

HAMI_VDEVICE_SAMPLE = """Virtual Device 0:
 Actual Device: 7
 Compute units: 5
 Global memory: 4294967296 bytes
- 5 -
Virtual Device 1:
 Actual Device: 7
 Compute units: 15
 Global memory: 8589934592 bytes
"""


def test_parse_virtual_info_on_the_hami_sample() -> None:
    rows = hp.parse_virtual_info(HAMI_VDEVICE_SAMPLE, virtual=True, what="t")
    assert [(r.index, r.actual_device, r.compute_units, r.memory_mb) for r in rows] == [
        (0, 7, 5, 4096),
        (1, 7, 15, 8192),
    ]
    phys = hp.parse_virtual_info(
        "\nDevice 0:\n Actual Device: 0\n Compute units: 60\n Global memory: 34342961152 bytes\n",
        virtual=False,
        what="t",
    )
    assert (phys[0].compute_units, phys[0].memory_mb) == (60, 32752)
    assert hp.parse_virtual_info("", virtual=True, what="t") == []
    with pytest.raises(HardwareError, match="lacks compute units"):
        hp.parse_virtual_info("Virtual Device 0:\n Actual Device: 1\n", virtual=True, what="t")
    with pytest.raises(HardwareError, match="no 'Device N:' block"):
        hp.parse_virtual_info("Permission denied", virtual=False, what="t")


def test_parse_card_json_samples() -> None:
    # categraf's documented hy_smi output, behind a banner line some builds print.
    text = "WARNING: hyhal version mismatch\n" + json.dumps(
        {
            "card0": {"Temperature (Sensor junction) (C)": "40", "HCU use (%)": "10"},
            "system": {"Driver version": "6.1.0"},
        }
    )
    cards = hp.parse_card_json(text, "t")
    assert list(cards) == [0]
    assert hp.card_number(cards[0], ("DCU use (%)", "HCU use (%)"), "t", text) == 10.0
    assert hp.card_number(cards[0], ("Unknown (W)",), "t", text) is None
    with pytest.raises(HardwareError, match="not a number"):
        hp.card_number({"x": "hot"}, ("x",), "t", text)
    with pytest.raises(HardwareError, match="no 'cardN'"):
        hp.parse_card_json('{"error": "no device"}', "t")
    with pytest.raises(HardwareError, match="invalid JSON"):
        hp.parse_card_json("{card0: 1}", "t")


def test_quote_truncates() -> None:
    assert hp.quote("a\nb") == repr("a\nb")
    q = hp.quote("x" * 1000, limit=10)
    assert q.startswith(repr("x" * 10)) and "990 more characters" in q


def test_parse_clock_levels_text() -> None:
    text = (
        "HCU[0]\t\t: Supported sclk frequencies on HCU0\n"
        "HCU[0]\t\t: 0: 300Mhz\nHCU[0]\t\t: 1: 1500Mhz *\nHCU[0]\t\t: \n"
        "HCU[0]\t\t: Supported mclk frequencies on HCU0\nHCU[0]\t\t: 0: 1000Mhz *\n"
    )
    levels = hp.parse_clock_levels(text, "t")[0]
    assert levels["sclk"].levels == ((0, 300), (1, 1500)) and levels["sclk"].current_mhz == 1500
    assert levels["mclk"].current_mhz == 1000
    with pytest.raises(HardwareError):
        hp.parse_clock_levels("nothing here", "t")


def test_parse_mig_tables_in_nvidia_smi_layout() -> None:
    lgip = """+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
"""
    (row,) = hp.parse_mig_profiles(lgip, "t")
    assert (row.name, row.profile_id, row.free, row.total, row.memory_mb, row.compute_units) == (
        "1g.5gb",
        19,
        7,
        7,
        4864,
        14,
    )
    assert hp.parse_mig_profiles("No MIG-enabled devices found.", "t") == []
    placements = hp.parse_mig_placements("GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1", "t")
    assert placements == {(0, 19): ((0, 1, 2, 3, 4, 5, 6), 1)}
    lgi = "| GPU instances: |\n|   0  MIG 3g.20gb          9        2          4:4     |\n"
    (inst,) = hp.parse_mig_instances(lgi, "t")
    assert (inst.name, inst.profile_id, inst.instance_id, inst.start, inst.size) == (
        "3g.20gb",
        9,
        2,
        4,
        4,
    )
    assert hp.parse_mig_instances("No GPU instances found: Not Found", "t") == []


# -- the fake fails like the tool ------------------------------------------------------------------


def _run_fake(*args: str) -> tuple[int, str, str]:
    import subprocess

    p = subprocess.run([str(FAKE), *args], capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--bogus-flag"], 2, "unrecognized arguments: --bogus-flag"),
        (["virtual", "-bogus"], 2, "unknown option"),
        (
            [
                "virtual",
                "-create-vdevices",
                "1",
                "-d",
                "9",
                "-vdevice-compute-units",
                "5",
                "-vdevice-memory-size",
                "64",
            ],
            1,
            "device 9 does not exist",
        ),
        (
            [
                "virtual",
                "-create-vdevices",
                "5",
                "-d",
                "0",
                "-vdevice-compute-units",
                "1,1,1,1,1",
                "-vdevice-memory-size",
                "1,1,1,1,1",
            ],
            1,
            "at most 4",
        ),
        (
            [
                "virtual",
                "-create-vdevices",
                "2",
                "-d",
                "0",
                "-vdevice-compute-units",
                "40,40",
                "-vdevice-memory-size",
                "64,64",
            ],
            1,
            "not enough compute units",
        ),
        (
            [
                "virtual",
                "-create-vdevices",
                "1",
                "-d",
                "0",
                "-vdevice-compute-units",
                "4",
                "-vdevice-memory-size",
                "99999",
            ],
            1,
            "not enough memory",
        ),
        (["mig", "-lgip"], 2, "invalid choice: 'mig'"),
    ],
)
def test_fake_fails_like_the_tool(fake: Fake, args: list[str], status: int, message: str) -> None:
    code, _out, err = _run_fake(*args)
    assert code == status and message in err
    assert fake.state()["vdevices"] == []
