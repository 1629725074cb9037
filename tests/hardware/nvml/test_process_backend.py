"""One NVML backend per process (hardware/select.py): one nvmlInit and one XID event set
across monitor rounds, so an XID between two rounds is reported, and shut down on exit."""

from __future__ import annotations

import socket

import pytest
from gpuflow.hardware import select
from gpuflow.hardware.nvml import backend as nvml_backend

from tests.hardware.nvml.helpers import FakeNvml


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    fake = FakeNvml(["a100-40gb", "h100"])
    monkeypatch.setattr(nvml_backend, "import_pynvml", lambda: fake)
    select.close_process_backends()
    yield fake
    select.close_process_backends()


def test_every_get_backend_of_a_process_is_the_same_nvml_session(fake) -> None:
    first = select.get_backend("nvml")
    assert select.get_backend("nvml") is first
    assert fake.calls.count("nvmlInit") == 1 and fake._init_count == 1


def test_an_xid_between_two_monitor_rounds_is_reported_not_missed(fake) -> None:
    node = socket.gethostname()
    select.get_backend("nvml").telemetry(node, 1)  # round 1
    fake.inject_xid(1, 79)
    sample = select.get_backend("nvml").telemetry(node, 1)  # round 2, a new call
    assert 79 in sample.xids


def test_closing_shuts_nvml_down_and_the_next_call_opens_a_new_session(fake) -> None:
    first = select.get_backend("nvml")
    select.close_process_backends()
    assert first.closed and fake._init_count == 0
    second = select.get_backend("nvml")
    assert second is not first and fake._init_count == 1
