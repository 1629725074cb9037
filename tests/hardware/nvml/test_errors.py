"""NVML errors as HardwareErrors (hardware/nvml/errors.py)."""

from __future__ import annotations

import pynvml
import pytest
from gpuflow.hardware.backend import DeviceLostError, HardwareError, UnsupportedError

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend, backend_nvml_calls


def test_other_nvml_errors_quote_nvml():
    fake = FakeNvml()
    b = backend(fake)
    fake.fail_next["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(HardwareError, match="nvmlDeviceGetPowerUsage failed: NVML: Unknown Error"):
        b.telemetry(NODE, 0)


def test_unprivileged_control_says_root():
    fake = FakeNvml(["h100"], privileged=False)
    b = backend(fake)
    with pytest.raises(HardwareError, match="root"):
        b.set_power_limit_mw(NODE, 0, 450_000)
    with pytest.raises(HardwareError, match="Insufficient Permissions"):
        b.set_partition_mode(NODE, 0, True)


@pytest.mark.parametrize(
    ("code", "error", "said"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, DeviceLostError, "GPU is lost (the GPU fell off the bus?)"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, UnsupportedError, "Not Supported"),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, UnsupportedError, "the driver predates it"),
        (pynvml.NVML_ERROR_NO_PERMISSION, HardwareError, "(this needs root)"),
        (pynvml.NVML_ERROR_UNKNOWN, HardwareError, "Unknown Error"),
    ],
)
def test_nvml_codes_become_the_projects_errors(code, error, said):
    fake = FakeNvml(["h100"])
    b = backend(fake)
    fake.fail_next["nvmlDeviceGetPowerManagementLimitConstraints"] = code
    with pytest.raises(HardwareError) as e:
        b.power_limits(NODE, 0)
    assert type(e.value) is error or (error is UnsupportedError and isinstance(e.value, error))
    assert str(e.value).startswith(
        f"{NODE}:0: reading the power limit range: "
        "nvmlDeviceGetPowerManagementLimitConstraints failed: NVML: "
    )
    assert said in str(e.value)


class _OldNvidiaMlPy(FakeNvml):
    """An nvidia-ml-py older than the functions in MISSING (the driver may have them)."""

    MISSING = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTotalEnergyConsumption")

    def __getattribute__(self, name: str):
        if name in type(self).MISSING:
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_function_missing_from_nvidia_ml_py_reads_as_unsupported():
    fake = _OldNvidiaMlPy(["a100-40gb"])
    fake.device(0).clock_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    b = backend(fake)
    s = b.telemetry(NODE, 0)
    assert s.clock_event_reasons == ("SwPowerCap",)  # from the older ThrottleReasons call
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls
    assert s.energy_mj == 0  # an optional field of the sample
    with pytest.raises(UnsupportedError, match="no nvmlDeviceGetTotalEnergyConsumption"):
        b.energy_mj(NODE, 0)  # asked for directly: an error that names the function


def test_every_nvml_call_is_translated_by_nvml_call():
    """No NVML call outside an @nvml_call method: its NVMLError would escape untranslated."""
    sites = backend_nvml_calls()
    assert sites
    assert [s.where for s in sites if not s.in_nvml_call] == []
