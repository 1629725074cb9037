"""Availability, init/shutdown and discovery (hardware/nvml/session.py)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    HardwareError,
)
from gpuflow.hardware.nvml import NvmlBackend

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend


def test_available_false_without_driver_or_library():
    ok, why = NvmlBackend.available(nvml=FakeNvml(driver_loaded=False))
    assert not ok and "Driver Not Loaded" in why
    ok, why = NvmlBackend.available(nvml=FakeNvml(library_found=False))
    assert not ok and "Library Not Found" in why
    fake = FakeNvml(["h100", "h100"])
    ok, why = NvmlBackend.available(nvml=fake)
    assert ok and "2 GPU" in why
    assert fake._init_count == 0  # available() shuts NVML down again
    ok, why = NvmlBackend.available(nvml=FakeNvml([]))
    assert not ok and "no GPU" in why


def test_available_with_the_real_pynvml_on_this_machine():
    ok, why = NvmlBackend.available()
    if ok:
        pytest.skip(f"an NVIDIA driver answers here: {why}")
    assert why  # says why, e.g. "NVML Shared Library Not Found"


def test_init_once_and_close_shuts_down():
    fake = FakeNvml()
    b = backend(fake)
    b.discover()
    b.telemetry(NODE, 0)
    assert fake.calls.count("nvmlInit") == 1
    b.close()
    b.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake._init_count == 0
    with pytest.raises(HardwareError, match="closed"):
        b.discover()


def test_init_failure_is_a_hardware_error():
    with pytest.raises(HardwareError, match="Driver Not Loaded"):
        backend(FakeNvml(driver_loaded=False))


def test_discover(monkeypatch):
    monkeypatch.setenv("GPUFLOW_REGION", "eu-west")
    fake = FakeNvml(["a100-40gb", "v100", "h200"])
    [node] = backend(fake).discover()
    assert (node.name, node.region, node.role) == (NODE, "eu-west", "active")
    a100, v100, h200 = node.devices
    assert [d.index for d in node.devices] == [0, 1, 2]
    assert a100.sku == "NVIDIA A100-SXM4-40GB" and a100.vendor == "NVIDIA"
    assert a100.uuid == fake.device(0).uuid and a100.uuid.startswith("GPU-")
    assert a100.memory_total_mb == 40960
    assert a100.pci_device_id == "0x20B010DE"
    assert h200.pci_device_id == "0x233510DE"
    assert a100.partition_kinds == ("mig",) and h200.partition_kinds == ("mig",)
    assert v100.partition_kinds == ()
    monkeypatch.delenv("GPUFLOW_REGION")
    assert backend(FakeNvml()).region == "local"
    assert NvmlBackend(nvml=FakeNvml(), region="r2").region == "r2"
