"""Running hy-smi: finding it, its non-zero exits and output it cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware.backend import (
    HardwareError,
)
from gpuflow.hardware.hygon import HygonBackend

from tests.hardware.hygon.helpers import FAKE, Fake


def test_available(fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ok, why = HygonBackend.available(str(tmp_path / "no-such-hy-smi"))
    assert not ok and "not found" in why
    ok, why = HygonBackend.available(str(FAKE))
    assert ok and "2 DCU" in why
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "fail")
    ok, why = HygonBackend.available(str(FAKE))
    assert not ok and "driver not loaded" in why


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


def test_garbage_output_is_quoted(backend: HygonBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "garbage")
    with pytest.raises(HardwareError) as err:
        backend.discover()
    msg = str(err.value)
    assert "unexpected output" in msg
    assert "GARBAGE-0xDEADBEEF" in msg  # the offending output is quoted ...
    assert "more characters" in msg  # ... and cut to a sensible length
    assert len(msg) < 1200
