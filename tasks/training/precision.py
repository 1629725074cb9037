"""Which training dtypes a device can run, and the precision policies (DESIGN.md section 5).

Policies:

- ``fp32``: never autocast.
- ``bf16`` / ``fp16``: always autocast to that dtype; refused before training if the device
  (or the twin SKU it stands for) lacks it.
- ``auto``: reduced precision (bf16 preferred, else fp16) only where a timed A/B on the
  job's own steps shows it pays on this device (autoprecision.py, ab_probe.py).

This module answers only "can it": CPU flags, CUDA compute capability, ROCm, a twin SKU's
table, checked before any training starts.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import torch
from gpuflow.hardware.skus import SkuSpec

POLICIES: tuple[str, ...] = ("fp32", "bf16", "fp16", "auto")
CPUINFO_PATH = Path("/proc/cpuinfo")

_NAME_TO_DTYPE: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
_DTYPE_TO_NAME: dict[torch.dtype, str] = {v: k for k, v in _NAME_TO_DTYPE.items()}
# CPU flags (as /proc/cpuinfo spells them) that give native bf16 matmuls.
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


class PrecisionError(ValueError):
    """A precision policy cannot run on the device (or twin SKU) it was asked of."""


def dtype_name(dtype: torch.dtype) -> str:
    """Short name ("fp32", "bf16", "fp16") of a training dtype."""
    try:
        return _DTYPE_TO_NAME[dtype]
    except KeyError:
        raise ValueError(f"not a training dtype: {dtype}; known: fp32, bf16, fp16") from None


def dtype_from_name(name: str, what: str) -> torch.dtype:
    """The dtype named "fp32", "bf16" or "fp16"; ``what`` names the field in the error."""
    try:
        return _NAME_TO_DTYPE[name]
    except KeyError:
        raise ValueError(f"{what}: unknown dtype name {name!r}; known: fp32, bf16, fp16") from None


def cpu_flags() -> frozenset[str] | None:
    """The CPU feature flags from ``CPUINFO_PATH``, or None where it cannot be read."""
    try:
        text = CPUINFO_PATH.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def _cpu_has_native_bf16() -> bool:
    flags = cpu_flags()
    if flags is not None:
        return bool(flags & _CPU_BF16_FLAGS)
    # No /proc (macOS, Windows): ask torch's own CPUID probes where this build has them.
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


@functools.cache
def _cpu_autocast_accepts(dtype: torch.dtype) -> bool:
    # Torch warns and silently disables CPU autocast for a dtype it cannot autocast to, so
    # entering it and looking is the only reliable check across versions.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=dtype):
            return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype


def _cuda_has_native_bf16(device: torch.device) -> bool:
    # torch.cuda.is_bf16_supported(including_emulation=False), but for this device rather
    # than the current one. ROCm (Hygon DCU) reports bf16 everywhere, as torch does; pass the
    # SKU so a DCU without it (Z100) is told apart.
    if torch.version.hip:
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, _minor = torch.cuda.get_device_capability(index)
    return major >= 8


def as_device(device: torch.device | str) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"not a torch device: {device!r} ({e})") from None


def where(device: torch.device, sku: SkuSpec | None) -> str:
    return f"device {device}" + (f" (SKU {sku.name})" if sku is not None else "")


def supported_reduced_dtypes(
    device: torch.device | str, sku: SkuSpec | None = None
) -> tuple[torch.dtype, ...]:
    """Reduced dtypes a job on ``device`` may autocast to, best first (bf16, then fp16).

    CPU: bf16 only with AVX512-BF16 or AMX-BF16 (emulated bf16 is no faster than fp32);
    fp16 wherever this torch can autocast to it on CPU (it is emulated on most CPUs and
    slower than fp32, but lets a CPU-backed twin of an fp16-only GPU behave like one).
    CUDA/ROCm: bf16 on compute capability 8.0+ (Ampere on) or ROCm, fp16 always. Other
    device types: none. A twin ``sku`` must also allow a dtype.
    """
    dev = as_device(device)
    found: list[torch.dtype] = []
    if dev.type == "cpu":
        if _cpu_has_native_bf16():
            found.append(torch.bfloat16)
        if _cpu_autocast_accepts(torch.float16):
            found.append(torch.float16)
    elif dev.type == "cuda":
        if not torch.cuda.is_available():
            raise PrecisionError(f"device {dev}: CUDA is not available in this process")
        if _cuda_has_native_bf16(dev):
            found.append(torch.bfloat16)
        found.append(torch.float16)
    if sku is not None:
        allowed = {torch.bfloat16: sku.supports_bf16, torch.float16: sku.supports_fp16}
        found = [d for d in found if allowed[d]]
    return tuple(found)


def reduced_precision_for(
    device: torch.device | str, sku: SkuSpec | None = None
) -> torch.dtype | None:
    """The dtype ``auto`` would switch to on ``device``: bf16, else fp16, else None."""
    found = supported_reduced_dtypes(device, sku)
    return found[0] if found else None


def validate_policy(
    policy: str, device: torch.device | str, sku: SkuSpec | None = None
) -> torch.dtype | None:
    """Check ``policy`` can run on ``device`` (and ``sku``); return its reduced dtype.

    Returns the dtype the policy autocasts to when reduced: None for ``fp32`` (and for
    ``auto`` on a device with no reduced dtype, which then simply stays in fp32). Raises
    ValueError for an unknown policy and PrecisionError (a ValueError) for a fixed
    bf16/fp16 the device or SKU lacks, before any training starts.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown precision policy {policy!r}; valid: {', '.join(POLICIES)}")
    dev = as_device(device)
    if policy == "fp32":
        return None
    found = supported_reduced_dtypes(dev, sku)
    if policy == "auto":
        return found[0] if found else None
    wanted = _NAME_TO_DTYPE[policy]
    if wanted not in found:
        supported = ", ".join(["fp32", *(dtype_name(d) for d in found)])
        why = ""
        if sku is not None and not (sku.supports_bf16 if policy == "bf16" else sku.supports_fp16):
            why = f"; the SKU has no {policy}"
        elif dev.type == "cpu" and policy == "bf16":
            why = "; the CPU has neither AVX512-BF16 nor AMX-BF16"
        raise PrecisionError(
            f"precision policy {policy!r}: {where(dev, sku)} does not support {policy}{why}; "
            f"it supports: {supported}"
        )
    return wanted
