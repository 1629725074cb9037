"""Run-time precision switching for training loops (DESIGN.md section 5).

Policies:

- ``fp32``: never autocast.
- ``bf16`` / ``fp16``: always autocast to that dtype; refused before training if the device
  (or the twin SKU it stands for) lacks it.
- ``auto``: start in fp32 and move to the device's reduced dtype (bf16 preferred, else fp16)
  while the device is busy (utilization above ``up_threshold``), back to fp32 when it is not
  (below ``down_threshold``).

NVML "utilization" is the share of time a kernel ran, not SM activity. Reduced precision
shortens kernels and so can lower that very figure; a plain threshold would then flip back
and forth. Two thresholds (hysteresis) plus a minimum dwell between switches bound that.

A numeric guard applies to *every* policy that autocasts, fixed ones included: a non-finite
loss, a streak of GradScaler overflows or a loss spike sends training back to fp32 for
``guard_cooldown_steps`` (as fairseq falls back from AMP on exploding loss). A fixed
bf16/fp16 policy then returns to its dtype; ``auto`` returns when utilization says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import statistics
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from gpuflow.hardware.skus import SkuSpec

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("fp32", "bf16", "fp16", "auto")
CPUINFO_PATH = Path("/proc/cpuinfo")
STATE_FORMAT = 1

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


def _dtype_from_name(name: str, what: str) -> torch.dtype:
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


def _as_device(device: torch.device | str) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"not a torch device: {device!r} ({e})") from None


def _where(device: torch.device, sku: SkuSpec | None) -> str:
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
    dev = _as_device(device)
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
    dev = _as_device(device)
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
            f"precision policy {policy!r}: {_where(dev, sku)} does not support {policy}{why}; "
            f"it supports: {supported}"
        )
    return wanted


@dataclass(frozen=True)
class Switch:
    """One precision change: from which dtype to which, at which step, and why."""

    step: int
    from_dtype: torch.dtype
    to_dtype: torch.dtype
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "from": dtype_name(self.from_dtype),
            "to": dtype_name(self.to_dtype),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Switch:
        return cls(
            step=int(d["step"]),
            from_dtype=_dtype_from_name(d["from"], "switch"),
            to_dtype=_dtype_from_name(d["to"], "switch"),
            reason=str(d["reason"]),
        )


class AutoPrecision:
    """Chooses the autocast dtype step by step, with hysteresis, dwell and a numeric guard.

    Per step: ``with ap.autocast(): loss = ...``; ``ap.scale(loss).backward()``;
    ``ap.step(optimizer)``; ``overflowed = ap.update()``; then
    ``ap.observe(step, utilization_ratio, loss.item(), overflowed)``. Switches happen only in
    ``observe``, i.e. between steps.
    """

    def __init__(
        self,
        policy: str,
        device: torch.device | str,
        sku: SkuSpec | None = None,
        up_threshold: float = 0.7,
        down_threshold: float = 0.6,
        min_dwell_steps: int = 20,
        guard_cooldown_steps: int = 50,
        overflow_streak: int = 3,
        spike_factor: float = 3.0,
        spike_window: int = 20,
    ) -> None:
        if not (0.0 <= down_threshold < up_threshold <= 1.0):
            raise ValueError(
                "need 0 <= down_threshold < up_threshold <= 1 (hysteresis); got "
                f"down_threshold={down_threshold}, up_threshold={up_threshold}"
            )
        for name, value, low in (
            ("min_dwell_steps", min_dwell_steps, 0),
            ("guard_cooldown_steps", guard_cooldown_steps, 0),
            ("overflow_streak", overflow_streak, 1),
            ("spike_window", spike_window, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        if not spike_factor > 1.0:
            raise ValueError(f"spike_factor must be > 1; got {spike_factor!r}")
        self.device = _as_device(device)
        self.sku = sku
        self.policy = policy
        self._reduced = validate_policy(policy, self.device, sku)
        self.up_threshold = float(up_threshold)
        self.down_threshold = float(down_threshold)
        self.min_dwell_steps = min_dwell_steps
        self.guard_cooldown_steps = guard_cooldown_steps
        self.overflow_streak = overflow_streak
        self.spike_factor = float(spike_factor)
        self.spike_window = spike_window

        self._current = self._reduced if policy in ("bf16", "fp16") else torch.float32
        assert self._current is not None  # validate_policy returned the fixed dtype
        self._last_step: int | None = None
        self._last_switch_step: int | None = None
        self._cooldown_until: int | None = None  # first step allowed out of fp32 again
        self._overflows_in_row = 0
        self._losses: deque[float] = deque(maxlen=spike_window)
        self.switches: list[Switch] = []
        # One scaler for the object's life, so its scale survives fp16 -> bf16/fp32 -> fp16.
        self._scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(self.device.type) if self._reduced == torch.float16 else None
        )
        self._scaled_this_step = False
        if policy == "auto" and self._reduced is None:
            logger.info("precision auto: %s has no reduced dtype; staying fp32", self._where)

    # --- what to run in -------------------------------------------------------------

    @property
    def _where(self) -> str:
        return _where(self.device, self.sku)

    @property
    def current_dtype(self) -> torch.dtype:
        return self._current

    @property
    def current(self) -> str:
        """Name of the dtype now in force: "fp32", "bf16" or "fp16"."""
        return dtype_name(self._current)

    @property
    def reduced_dtype(self) -> torch.dtype | None:
        """The reduced dtype this policy uses (None: fp32 only)."""
        return self._reduced

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self._scaler

    def in_cooldown(self, step: int) -> bool:
        return self._cooldown_until is not None and step < self._cooldown_until

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context manager for the forward pass in the current dtype (none for fp32)."""
        if self._current == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._current)

    # --- optimizer step helpers (right in every dtype) -------------------------------

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward()`` on: scaled in fp16, unchanged otherwise."""
        self._scaled_this_step = self._current == torch.float16 and self._scaler is not None
        if self._scaled_this_step:
            assert self._scaler is not None
            return self._scaler.scale(loss)
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale gradients in place (before clipping); a no-op unless this step scaled."""
        if self._scaled_this_step:
            assert self._scaler is not None
            self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step; through the scaler (which skips it on inf/NaN grads) if scaled."""
        if self._scaled_this_step:
            assert self._scaler is not None
            self._scaler.step(optimizer)
        else:
            optimizer.step()

    def update(self) -> bool:
        """Finish the step; True when the scaler found inf/NaN grads and skipped it.

        The scaler backs its scale off exactly when it found inf/NaN, so a lower scale
        after ``update()`` is the overflow signal (public API, unlike ``_found_inf``).
        """
        if not self._scaled_this_step:
            return False
        assert self._scaler is not None
        self._scaled_this_step = False
        before = self._scaler.get_scale()
        self._scaler.update()
        return self._scaler.get_scale() < before

    # --- the decision ----------------------------------------------------------------

    def observe(
        self, step: int, utilization_ratio: float | None, loss: float, overflowed: bool
    ) -> Switch | None:
        """Feed one finished step; return the switch it caused, if any.

        ``utilization_ratio`` is NVML utilization as a fraction in [0, 1] (None: unknown,
        no change). The numeric guard is checked first and acts at once (no dwell); the
        utilization rule (``auto`` only) needs ``min_dwell_steps`` since the last switch.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0; got {step!r}")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} is not after the last observed step {self._last_step}")
        if utilization_ratio is not None and not (0.0 <= utilization_ratio <= 1.0):
            raise ValueError(
                f"utilization_ratio must be a fraction in [0, 1] or None; got "
                f"{utilization_ratio!r} (NVML reports percent: divide by 100)"
            )
        loss = float(loss)
        self._last_step = step

        # Numeric guard.
        self._overflows_in_row = self._overflows_in_row + 1 if overflowed else 0
        reason = None
        if not math.isfinite(loss):
            reason = f"non-finite loss {loss}"
        elif self._overflows_in_row >= self.overflow_streak:
            reason = f"{self._overflows_in_row} GradScaler overflows in a row"
        elif len(self._losses) == self.spike_window:
            median = statistics.median(self._losses)
            # Only a positive median gives "factor x median" a meaning.
            if median > 0 and loss > self.spike_factor * median:
                reason = (
                    f"loss spike {loss:.6g} > {self.spike_factor:g} x median {median:.6g} "
                    f"of the last {self.spike_window} steps"
                )
        if math.isfinite(loss):
            # Spikes go in too, so a lasting level shift stops counting as one.
            self._losses.append(loss)
        if reason is not None:
            self._overflows_in_row = 0
            self._cooldown_until = step + self.guard_cooldown_steps
            if self._current != torch.float32:
                return self._switch(
                    step,
                    torch.float32,
                    f"numeric guard: {reason}; fp32 until step {self._cooldown_until}",
                )
            logger.info(
                "precision guard at step %d (already fp32): %s; no reduced precision until step %d",
                step,
                reason,
                self._cooldown_until,
            )
            return None

        if self.in_cooldown(step) or self._reduced is None:
            return None
        if self.policy in ("bf16", "fp16"):
            if self._current == torch.float32:  # only after a guard fallback
                return self._switch(step, self._reduced, "numeric guard cooldown over")
            return None
        if self.policy != "auto" or utilization_ratio is None:
            return None
        dwell_ok = (
            self._last_switch_step is None or step - self._last_switch_step >= self.min_dwell_steps
        )
        if not dwell_ok:
            return None
        if self._current == torch.float32 and utilization_ratio > self.up_threshold:
            return self._switch(
                step,
                self._reduced,
                f"utilization {utilization_ratio:.2f} > up_threshold {self.up_threshold:.2f}",
            )
        if self._current == self._reduced and utilization_ratio < self.down_threshold:
            return self._switch(
                step,
                torch.float32,
                f"utilization {utilization_ratio:.2f} < down_threshold {self.down_threshold:.2f}",
            )
        return None

    def _switch(self, step: int, to_dtype: torch.dtype, reason: str) -> Switch:
        sw = Switch(step=step, from_dtype=self._current, to_dtype=to_dtype, reason=reason)
        self._current = to_dtype
        self._last_switch_step = step
        self.switches.append(sw)
        logger.info(
            "precision switch at step %d: %s -> %s (%s)",
            step,
            dtype_name(sw.from_dtype),
            dtype_name(to_dtype),
            reason,
        )
        return sw

    # --- checkpointing ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume identically (thresholds are configuration, not state)."""
        return {
            "format": STATE_FORMAT,
            "policy": self.policy,
            "reduced": dtype_name(self._reduced) if self._reduced is not None else None,
            "current": self.current,
            "last_step": self._last_step,
            "last_switch_step": self._last_switch_step,
            "cooldown_until": self._cooldown_until,
            "overflows_in_row": self._overflows_in_row,
            "losses": list(self._losses),
            "switches": [s.to_dict() for s in self.switches],
            "scaler": self._scaler.state_dict() if self._scaler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; checks everything before changing anything."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"precision state format {state.get('format')!r}; this code reads {STATE_FORMAT}"
            )
        if state["policy"] != self.policy:
            raise ValueError(
                f"checkpoint precision policy {state['policy']!r} differs from this run's "
                f"{self.policy!r}; resume with the same policy"
            )
        mine = dtype_name(self._reduced) if self._reduced is not None else None
        if state["reduced"] != mine:
            raise ValueError(
                f"checkpoint's reduced dtype {state['reduced']} differs from {mine} on "
                f"{self._where}; it cannot resume identically here"
            )
        current = _dtype_from_name(state["current"], "precision state 'current'")
        if current not in (torch.float32, self._reduced):
            raise ValueError(
                f"precision state: current dtype {state['current']} is not usable here"
            )
        switches = [Switch.from_dict(s) for s in state["switches"]]
        if (state["scaler"] is None) != (self._scaler is None):
            raise ValueError("precision state: GradScaler state present/absent mismatch")
        losses = [float(x) for x in state["losses"]]

        self._current = current
        self._last_step = state["last_step"]
        self._last_switch_step = state["last_switch_step"]
        self._cooldown_until = state["cooldown_until"]
        self._overflows_in_row = int(state["overflows_in_row"])
        self._losses = deque(losses, maxlen=self.spike_window)
        self.switches = switches
        if self._scaler is not None:
            self._scaler.load_state_dict(state["scaler"])
        self._scaled_this_step = False
