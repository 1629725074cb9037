from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from gpuflow.hardware.backend import DeviceLostError, HardwareError, PartitionRequest
from gpuflow.hardware.select import get_backend
from gpuflow.hardware.sim import SimBackend

REPO = Path(__file__).resolve().parents[3]


def test_state_lives_under_gpuflow_home(gpuflow_home: Path, twin: SimBackend) -> None:
    state = gpuflow_home / "twin" / "state.json"
    assert state.exists()
    data = json.loads(state.read_text())
    assert data["spec"]["name"] == "gpuflow-default"
    assert not [p for p in state.parent.iterdir() if p.name.startswith(".state-")]
    assert get_backend("sim").name == "sim"


def test_two_instances_share_the_fleet(quiet: SimBackend) -> None:
    other = SimBackend()
    quiet.set_partition_mode("a100-0", 0, True)
    (part,) = quiet.create_partitions("a100-0", 0, [PartitionRequest("3g.20gb")])
    quiet.set_workload("a100-0", 0, "job", 1.0, memory_mb=1000, partition_uuid=part.uuid)
    quiet.inject_fault("a100-0", 1, "xid79")
    assert other.partitions("a100-0", 0) == [part]
    assert other.partition_mode("a100-0", 0)
    assert other.workload_status("job") == "running"
    assert other.telemetry("a100-0", 0).memory_used_mb == 1000
    assert other.telemetry("a100-0", 1).present is False
    with pytest.raises(DeviceLostError):
        other.clocks("a100-0", 1)
    before = quiet.now_s()
    other.advance(3600)
    assert quiet.now_s() >= before + 3600
    assert [e["event"] for e in other.fault_log()] == ["failure"]


def test_a_fault_injected_in_another_process_shows_in_telemetry(
    gpuflow_home: Path, quiet: SimBackend
) -> None:
    assert quiet.telemetry("a100-0", 1).xids == ()  # this instance has read the device once
    code = (
        "from gpuflow.hardware.sim import SimBackend; "
        "r = SimBackend().inject_fault('a100-0', 1, 'xid79'); "
        "print(r['xids'])"
    )
    env = {**os.environ, "GPUFLOW_HOME": str(gpuflow_home), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "[79]"
    t = quiet.telemetry("a100-0", 1)
    assert t.present is False and t.xids == (79,)
    assert quiet.telemetry("a100-0", 1).xids == ()  # each XID is delivered once per instance
    # A new reader (another monitor) sees recent XIDs on its first read.
    assert SimBackend().telemetry("a100-0", 1).xids == (79,)
    assert quiet.workload_status("nobody") == "absent"


def test_a_different_spec_needs_a_reset(quiet: SimBackend, write_spec: Callable[..., Path]) -> None:
    other_spec = write_spec(
        {
            "name": "tiny",
            "seed": 1,
            "nodes": [
                {
                    "name": "h0",
                    "region": "r",
                    "role": "active",
                    "devices": [{"sku": "h100", "count": 1}],
                }
            ],
        }
    )
    with pytest.raises(HardwareError, match="reset"):
        SimBackend(spec_path=other_spec)
    SimBackend().reset(spec_path=other_spec)
    twin = SimBackend(spec_path=other_spec)  # the same spec again is fine
    assert [d.sku for d in twin.devices()] == ["NVIDIA H100 80GB HBM3"]
    assert quiet.telemetry("h0", 0).present  # the old instance follows the new state
    twin.reset()
    assert len(SimBackend().devices()) == 18
    SimBackend.reset_state(spec_path=other_spec)  # what `gpuflow sim reset --spec` calls
    assert len(twin.devices()) == 1


def test_concurrent_writers_lose_no_update(quiet: SimBackend) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            b = SimBackend()
            for i in range(10):
                b.set_workload("a100-0", 0, f"t{n}-{i}", 0.01, memory_mb=10)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(quiet.tenants("a100-0", 0)) == 40
    assert quiet.telemetry("a100-0", 0).memory_used_mb == 400


def test_discovery_matches_the_spec(twin: SimBackend) -> None:
    nodes = twin.discover()
    assert [n.name for n in nodes] == ["a100-0", "a100-1", "a100-spare-0", "v100-0", "dcu-0"]
    devs = twin.devices()
    assert len(devs) == 18 and len({d.uuid for d in devs}) == 18
    a100 = twin.device("a100-0", 0)
    assert a100.uuid.startswith("GPU-") and a100.pci_device_id == "0x20B010DE"
    assert a100.partition_kinds == ("mig",)
    assert twin.device("v100-0", 0).partition_kinds == ()
    assert twin.device("dcu-0", 1).partition_kinds == ("vdcu",)
    assert twin.device("dcu-0", 1).vendor == "Hygon"
    # Deterministic from the seed: another home, the same uuids.
    other = SimBackend(home=Path(twin.home) / "elsewhere")
    assert [d.uuid for d in other.devices()] == [d.uuid for d in devs]


def test_a_corrupt_state_says_reset_and_reset_recovers(
    gpuflow_home: Path, twin: SimBackend
) -> None:
    (gpuflow_home / "twin" / "state.json").write_text("{not json", encoding="utf-8")
    broken = SimBackend()
    with pytest.raises(HardwareError, match="reset"):
        broken.telemetry("a100-0", 0)
    broken.reset()
    assert twin.telemetry("a100-0", 0).present
