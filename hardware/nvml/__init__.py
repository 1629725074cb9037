"""NVIDIA GPUs on this host through NVML (nvidia-ml-py, module ``pynvml``).

Laid out like Zeus's device layer: ``errors`` maps NVML's codes to HardwareErrors (one
table, one ``@nvml_call`` decorator), ``device`` is one GPU as thin typed NVML calls,
``session`` the library-level calls, and ``mig_profiles``, ``mig``, ``telemetry`` and
``control`` the logic on top; ``backend`` composes them into NvmlBackend.
"""

from gpuflow.hardware.nvml.backend import NvmlBackend
from gpuflow.hardware.nvml.mig_profiles import mig_profile_name
from gpuflow.hardware.nvml.telemetry import (
    CLOCK_EVENT_BITS,
    EccCounter,
    decode_clock_event_reasons,
)

__all__ = [
    "CLOCK_EVENT_BITS",
    "EccCounter",
    "NvmlBackend",
    "decode_clock_event_reasons",
    "mig_profile_name",
]
