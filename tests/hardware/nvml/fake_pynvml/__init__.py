"""An in-repo fake of the ``pynvml`` module (nvidia-ml-py) that enforces NVML's rules.

Tests hand a ``FakeNvml`` to ``NvmlBackend(nvml=...)``. It offers the same function names,
parameter names, return types and constants as nvidia-ml-py (a test compares the
signatures), and it refuses what real NVML refuses, because a fake that accepts anything
lets backend bugs through:

- GPU-instance calls take the profile *id* from ``nvmlDeviceGetGpuInstanceProfileInfo``,
  not the ``NVML_GPU_INSTANCE_PROFILE_*`` enum; an enum that is no id of the device fails
  with NVML_ERROR_INVALID_ARGUMENT, and one that happens to equal another profile's id
  (enum 0 == id 0 == 7g) silently means that other profile, as on real hardware.
- Placements per profile, memory-slice overlap, per-profile counts and the GPU's compute
  slices (7 on an A100, 4 on an A30): NVML_ERROR_INSUFFICIENT_RESOURCES; remaining
  capacity is computed from them.
- MIG calls on a GPU without MIG mode: NVML_ERROR_NOT_SUPPORTED (the V100 always); a mode
  change still pending a reset: NVML_ERROR_INVALID_STATE for instance creation. As nvml.h
  documents, the v1 GI profile info and the possible placements answer with MIG mode off
  on a MIG-capable GPU (``profiles_with_mig_off=False``: an R535 driver, whose v1 info
  needs MIG on); the versioned (v2) info needs MIG on.
- A GPU instance with live compute instances cannot be destroyed: NVML_ERROR_IN_USE.
- Everything but nvmlInit/nvmlErrorString fails with NVML_ERROR_UNINITIALIZED before init.
- XIDs only reach event sets that registered nvmlEventTypeXidCriticalError for the device;
  nvmlEventSetWait raises NVML_ERROR_TIMEOUT when nothing is pending.
- ``lose_gpu(i)``: every call on that device raises NVML_ERROR_GPU_IS_LOST.

Handles are real ctypes pointers of pynvml's handle types (c_nvmlDevice_t, ...), and the
structs are pynvml's own, so the backend cannot lean on anything real NVML would not give.
Devices are built from hardware/skus.py, plus cards no table knows (``FAKE_ONLY_CARDS``:
"future-gpu", NVIDIA Future GPU) that only NVML's answers describe.
"""

from __future__ import annotations

from tests.hardware.nvml.fake_pynvml.control import FakeControl
from tests.hardware.nvml.fake_pynvml.mig import FakeMig
from tests.hardware.nvml.fake_pynvml.model import (
    CONSTANTS,
    FAKE_ONLY_CARDS,
    STRUCTS,
    FakeDevice,
    NVMLError,
    make_device,
    nvmlErrorString,
)
from tests.hardware.nvml.fake_pynvml.telemetry import FakeTelemetry

__all__ = [
    "CONSTANTS",
    "FAKE_ONLY_CARDS",
    "STRUCTS",
    "FakeDevice",
    "FakeNvml",
    "NVMLError",
    "api_names",
    "make_device",
    "nvmlErrorString",
]

globals().update(CONSTANTS)  # like pynvml: fake_pynvml.NVML_ERROR_GPU_IS_LOST, ...


class FakeNvml(FakeMig, FakeTelemetry, FakeControl):
    """A pynvml stand-in for ``devices`` (SKU names or aliases from hardware/skus.py)."""


def api_names() -> list[str]:
    """Names of the pynvml functions the fake implements (for the signature test)."""
    return sorted(
        {
            name
            for cls in FakeNvml.__mro__
            for name, value in vars(cls).items()
            if getattr(value, "nvml_api", False)
        }
    )
