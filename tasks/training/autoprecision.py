"""The precision policy in force step by step: fixed dtypes, ``auto``, the numeric guard.

``auto`` adopts reduced precision only on evidence that it pays on this device and job:
a timed A/B of its own steps in each dtype (ab_probe.py). What starts a probe:

* the first one, after ``warmup_steps``;
* a resume on another device, SKU or world size (a move, a resize), and a resume from a
  checkpoint that has no A/B evidence;
* a long dwell: ``reprobe_after_s`` seconds of training since the last A/B;
* utilization (per device, or per MIG instance where the backend reads it) that moved by
  ``utilization_delta`` since the last A/B, at least ``min_dwell_s`` after it. A busy
  device is a reason to look again, never the decision: a kernel that runs shorter in
  bf16 lowers that very figure, a neighbour's job raises it, MIG reads none.
* the end of a numeric-guard cooldown that interrupted reduced precision.

Times are the loop's step times (seconds inside steps, so the dwell does not count eval
or checkpoint pauses); in a gang every rank is fed rank 0's, so every rank reaches rank
0's decision at the same step without a collective of its own.

A numeric guard applies to *every* policy that autocasts: a non-finite loss, a skipped
step (guard.py, before the optimizer), a streak of GradScaler overflows or a loss spike
sends training back to fp32 for ``guard_cooldown_steps`` (as fairseq falls back from AMP
on exploding loss). A fixed bf16/fp16 policy then returns to its dtype; ``auto`` probes
again.

Everything is in ``state_dict``, the probe's timings included, so ``auto`` resumes
exactly where it was.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from gpuflow.hardware.skus import SkuSpec
from gpuflow.tasks.training.ab_probe import ABProbe, Decision, ProbeConfig
from gpuflow.tasks.training.guard import Skip
from gpuflow.tasks.training.precision import (
    as_device,
    dtype_from_name,
    dtype_name,
    validate_policy,
    where,
)

logger = logging.getLogger(__name__)

STATE_FORMAT = 3  # 3 adds the A/B state; 2 added "skips"; 1 and 2 still load
_READABLE_FORMATS = (1, 2, 3)
FIRST_PROBE = "first A/B"
NO_EVIDENCE = "resumed from a checkpoint without A/B evidence"
AFTER_GUARD = "the numeric guard's cooldown ended"


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
            from_dtype=dtype_from_name(d["from"], "switch"),
            to_dtype=dtype_from_name(d["to"], "switch"),
            reason=str(d["reason"]),
        )


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0; got {value!r}")


class AutoPrecision:
    """Chooses the autocast dtype step by step: A/B evidence, numeric guard, GradScaler.

    Per step: ``with ap.autocast(): loss = ...``; ``ap.scale(loss).backward()``;
    ``ap.unscale_(optimizer)`` (before taking the gradient norm); ``ap.step(optimizer,
    skip=...)``; ``overflowed = ap.update()``; then ``ap.observe(step, utilization_ratio,
    loss.item(), overflowed, skipped=..., step_time_s=...)``. Switches happen only in
    ``observe``, i.e. between steps.
    """

    def __init__(
        self,
        policy: str,
        device: torch.device | str,
        sku: SkuSpec | None = None,
        *,
        world_size: int = 1,
        probe: ProbeConfig | None = None,
        warmup_steps: int = 3,
        min_dwell_s: float = 60.0,
        reprobe_after_s: float = 900.0,
        utilization_delta: float = 0.25,
        guard_cooldown_steps: int = 50,
        overflow_streak: int = 3,
        spike_factor: float = 3.0,
        spike_window: int = 20,
    ) -> None:
        _check_int("world_size", world_size, 1)
        _check_int("warmup_steps", warmup_steps, 0)
        _check_int("guard_cooldown_steps", guard_cooldown_steps, 0)
        _check_int("overflow_streak", overflow_streak, 1)
        _check_int("spike_window", spike_window, 1)
        _check_seconds("min_dwell_s", min_dwell_s)
        _check_seconds("reprobe_after_s", reprobe_after_s)
        if not (0.0 < utilization_delta <= 1.0):
            raise ValueError(f"utilization_delta must be in (0, 1]; got {utilization_delta!r}")
        if not spike_factor > 1.0:
            raise ValueError(f"spike_factor must be > 1; got {spike_factor!r}")
        self.device = as_device(device)
        self.sku = sku
        self.policy = policy
        self._reduced = validate_policy(policy, self.device, sku)
        self.context = {
            "device": str(self.device),
            "sku": sku.name if sku is not None else None,
            "world_size": world_size,
        }
        self.probe_config = probe or ProbeConfig()
        self.warmup_steps = warmup_steps
        self.min_dwell_s = float(min_dwell_s)
        self.reprobe_after_s = float(reprobe_after_s)
        self.utilization_delta = float(utilization_delta)
        self.guard_cooldown_steps = guard_cooldown_steps
        self.overflow_streak = overflow_streak
        self.spike_factor = float(spike_factor)
        self.spike_window = spike_window

        self._current = self._reduced if policy in ("bf16", "fp16") else torch.float32
        assert self._current is not None  # validate_policy returned the fixed dtype
        self._last_step: int | None = None
        self._cooldown_until: int | None = None  # first step allowed out of fp32 again
        self._overflows_in_row = 0
        self._losses: deque[float] = deque(maxlen=spike_window)
        self.switches: list[Switch] = []
        self.skips: list[Skip] = []  # optimizer steps the loop's guard skipped
        # auto's evidence: seconds inside steps so far, the probe in flight, every outcome.
        self._train_s = 0.0
        self._probe: ABProbe | None = None
        self.decisions: list[Decision] = []
        self._last_probe_train_s: float | None = None
        self._last_probe_util: float | None = None
        self._last_util: float | None = None
        self._pending: str | None = None  # a trigger waiting for the next timed step
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
        return where(self.device, self.sku)

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

    @property
    def probing(self) -> bool:
        """An A/B is in flight: its steps must be timed to completion (on CUDA the loop
        synchronizes before reading the clock; otherwise it lets kernels run ahead)."""
        return self._probe is not None

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

    @property
    def scaled_this_step(self) -> bool:
        """Whether this step's loss went through the GradScaler (whose inf check then owns
        an overflow of the gradients)."""
        return self._scaled_this_step

    def step(self, optimizer: torch.optim.Optimizer, skip: bool = False) -> None:
        """Optimizer step; through the scaler (which skips it on inf/NaN grads) if scaled.

        ``skip``: the guard refused this step; the optimizer does not run. The scaler is
        not asked either: after ``unscale_`` it has recorded its own inf check, which
        ``update()`` then acts on exactly as after a step it skipped itself (so the
        guard never changes the scaler's state)."""
        if skip:
            return
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
        self,
        step: int,
        utilization_ratio: float | None,
        loss: float,
        overflowed: bool,
        skipped: str | None = None,
        step_time_s: float | None = None,
    ) -> Switch | None:
        """Feed one finished step; return the switch it caused, if any.

        ``utilization_ratio``: NVML utilization as a fraction in [0, 1] (None: no fresh
        reading). ``step_time_s``: the step's time (None: untimed; ``auto`` neither starts
        nor advances an A/B on untimed steps). ``skipped``: why the loop's guard skipped
        this step's optimizer step (None: it did not). The numeric guard is checked first
        and acts at once; an A/B in flight is aborted by it.
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
        if step_time_s is not None and not (math.isfinite(step_time_s) and step_time_s >= 0):
            raise ValueError(
                f"step_time_s must be a finite number >= 0 or None; got {step_time_s!r}"
            )
        loss = float(loss)
        self._last_step = step
        if step_time_s is not None:
            self._train_s += float(step_time_s)
        if utilization_ratio is not None:
            self._last_util = float(utilization_ratio)

        reason = self._guard_reason(step, loss, overflowed, skipped)
        if reason is not None:
            return self._fall_back(step, reason)
        if self.in_cooldown(step) or self._reduced is None:
            return None
        if self.policy in ("bf16", "fp16"):
            if self._current == torch.float32:  # only after a guard fallback
                return self._switch(step, self._reduced, "numeric guard cooldown over")
            return None
        if self.policy != "auto":
            return None
        if self._probe is not None:
            return self._advance_probe(step, step_time_s)
        trigger = self._trigger(step, utilization_ratio, step_time_s)
        if trigger is not None:
            self._pending = None
            self._probe = ABProbe(
                config=self.probe_config,
                reference=torch.float32,
                candidate=self._reduced,
                first=self._current,
                trigger=trigger,
                first_step=step + 1,
            )
            logger.info(
                "precision A/B from step %d (%s): %s vs fp32 on %s",
                step + 1,
                trigger,
                dtype_name(self._reduced),
                self._where,
            )
        return None

    def _guard_reason(
        self, step: int, loss: float, overflowed: bool, skipped: str | None
    ) -> str | None:
        self._overflows_in_row = self._overflows_in_row + 1 if overflowed else 0
        reason = None
        if skipped is not None:
            self.skips.append(Skip(step=step, reason=skipped, precision=self.current))
            logger.warning("step %d skipped by the numeric guard: %s", step, skipped)
            reason = f"step skipped ({skipped})"
        elif not math.isfinite(loss):
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
        return reason

    def _fall_back(self, step: int, reason: str) -> Switch | None:
        self._overflows_in_row = 0
        self._cooldown_until = step + self.guard_cooldown_steps
        if self.policy == "auto" and self._reduced is not None:
            if self._probe is not None:
                self._conclude(self._probe.abort(step, f"numeric guard: {reason}"))
            if self._current != torch.float32:
                self._pending = AFTER_GUARD
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

    def _trigger(self, step: int, util: float | None, step_time_s: float | None) -> str | None:
        if step_time_s is None:
            return None  # an A/B needs timed steps
        if self._pending is not None:
            return self._pending
        if self._last_probe_train_s is None:
            return FIRST_PROBE if step >= self.warmup_steps else None
        since_s = self._train_s - self._last_probe_train_s
        if since_s >= self.reprobe_after_s:
            return f"{since_s:.0f} s of training since the last A/B"
        last = self._last_probe_util
        if (
            util is not None
            and last is not None
            and abs(util - last) >= self.utilization_delta
            and since_s >= self.min_dwell_s
        ):
            return f"utilization {last:.2f} -> {util:.2f} since the last A/B"
        return None

    def _advance_probe(self, step: int, step_time_s: float | None) -> Switch | None:
        probe = self._probe
        assert probe is not None
        if step_time_s is not None:
            probe.record(step_time_s)  # the step just run, in probe.dtype == current
        if probe.done:
            decision = probe.decide(step)
            self._conclude(decision)
            chosen = dtype_from_name(decision.chosen, "decision")
            if chosen != self._current:
                return self._switch(step, chosen, decision.reason)
            return None
        if probe.dtype != self._current:
            return self._switch(
                step, probe.dtype, f"A/B ({probe.trigger}): timing {dtype_name(probe.dtype)}"
            )
        return None

    def _conclude(self, decision: Decision) -> None:
        self._probe = None
        self.decisions.append(decision)
        self._last_probe_train_s = self._train_s
        self._last_probe_util = self._last_util
        logger.info(
            "precision A/B over steps %d-%d (%s) on %s: %s",
            decision.first_step,
            decision.last_step,
            decision.trigger,
            self._where,
            decision.reason,
        )

    def _switch(self, step: int, to_dtype: torch.dtype, reason: str) -> Switch:
        sw = Switch(step=step, from_dtype=self._current, to_dtype=to_dtype, reason=reason)
        self._current = to_dtype
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
            "context": dict(self.context),
            "current": self.current,
            "last_step": self._last_step,
            "cooldown_until": self._cooldown_until,
            "overflows_in_row": self._overflows_in_row,
            "losses": list(self._losses),
            "switches": [s.to_dict() for s in self.switches],
            "skips": [s.to_dict() for s in self.skips],
            "scaler": self._scaler.state_dict() if self._scaler is not None else None,
            "train_s": self._train_s,
            "probe": self._probe.state_dict() if self._probe is not None else None,
            "decisions": [d.to_dict() for d in self.decisions],
            "last_probe_train_s": self._last_probe_train_s,
            "last_probe_util": self._last_probe_util,
            "last_util": self._last_util,
            "pending": self._pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; checks everything before changing anything.

        ``auto`` resumed elsewhere (another device, SKU or world size: a move or a resize)
        keeps its dtype where it can run here and probes again; a fixed policy must find
        the same reduced dtype (validate_policy has refused the device otherwise)."""
        fmt = state.get("format")
        if fmt not in _READABLE_FORMATS:
            raise ValueError(
                f"precision state format {fmt!r}; this code reads "
                f"{', '.join(map(str, _READABLE_FORMATS))}"
            )
        if state["policy"] != self.policy:
            raise ValueError(
                f"checkpoint precision policy {state['policy']!r} differs from this run's "
                f"{self.policy!r}; resume with the same policy"
            )
        auto = self.policy == "auto"
        mine = dtype_name(self._reduced) if self._reduced is not None else None
        saved_context = state.get("context")
        moved = None
        if saved_context is not None and saved_context != self.context:
            moved = (
                f"resumed on {self._describe(self.context)} (was {self._describe(saved_context)})"
            )
        if state["reduced"] != mine:
            if not auto:
                raise ValueError(
                    f"checkpoint's reduced dtype {state['reduced']} differs from {mine} on "
                    f"{self._where}; it cannot resume identically here"
                )
            moved = moved or f"resumed on {self._where}, where the reduced dtype is {mine}"
        current = dtype_from_name(state["current"], "precision state 'current'")
        if current not in (torch.float32, self._reduced):
            if not auto:
                raise ValueError(
                    f"precision state: current dtype {state['current']} is not usable here"
                )
            current = torch.float32
        scaler_state = state["scaler"]
        if (scaler_state is None) != (self._scaler is None):
            if not auto or state["reduced"] == mine:
                raise ValueError("precision state: GradScaler state present/absent mismatch")
            scaler_state = None  # another reduced dtype here: a fresh scaler, or none
        switches = [Switch.from_dict(s) for s in state["switches"]]
        skips = [Skip.from_dict(s) for s in state.get("skips", [])]
        losses = [float(x) for x in state["losses"]]
        decisions = [Decision.from_dict(d) for d in state.get("decisions", [])]
        probe_state = state.get("probe")
        probe = (
            ABProbe.from_state(self.probe_config, probe_state)
            if probe_state is not None and moved is None
            else None
        )
        pending = state.get("pending")
        if auto and self._reduced is not None:
            if moved is not None:
                pending = moved  # the evidence was for another device: look again
            elif fmt < 3:
                pending = NO_EVIDENCE

        self._current = current
        self._last_step = state["last_step"]
        self._cooldown_until = state["cooldown_until"]
        self._overflows_in_row = int(state["overflows_in_row"])
        self._losses = deque(losses, maxlen=self.spike_window)
        self.switches = switches
        self.skips = skips
        if self._scaler is not None and scaler_state is not None:
            self._scaler.load_state_dict(scaler_state)
        self._scaled_this_step = False
        self._train_s = float(state.get("train_s", 0.0))
        self._probe = probe
        self.decisions = decisions
        self._last_probe_train_s = state.get("last_probe_train_s")
        self._last_probe_util = state.get("last_probe_util")
        self._last_util = state.get("last_util")
        self._pending = pending

    @staticmethod
    def _describe(context: dict[str, Any]) -> str:
        sku = f" (SKU {context['sku']})" if context.get("sku") else ""
        return f"{context.get('device')}{sku} x{context.get('world_size')}"
