"""The numeric guard before the optimizer step, and the last check before a checkpoint.

A step whose loss or gradient norm is not finite must not reach ``optimizer.step()``:
one NaN gradient under bf16 turns every weight NaN for good (AdamW's moments keep it),
and the next checkpoint would then rotate the good ones out. So, after ``backward()``
(and after the GradScaler unscaled the gradients, so the norm is the true one):

* the total gradient norm is taken over every gradient (clipped to ``max_norm`` when
  the spec asks for clipping; DTensor norms of FSDP2 shards are made whole first, as
  torchtitan does);
* a non-finite loss or norm skips the step and the precision policy falls back to fp32
  for its cooldown; the skip is logged by the policy with its step and reason;
* except a scaled fp16 step whose loss is finite but whose gradients overflowed: that is
  the GradScaler's normal calibration (its first steps overflow by design), so the scaler
  alone handles it (it skips, backs its scale off and the overflow streak counts it) and
  the guard neither falls back nor touches the scaler's state.

In a gang the verdict is agreed: the loss it judges is the mean over the ranks (the
all-reduce the loop logs anyway; any rank's non-finite loss makes it non-finite) and the
gradient norm is taken after the gradients are synchronized, so every rank skips the same
steps and DDP/FSDP replicas never diverge, at no extra collective per step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

NON_FINITE_LOSS = "non-finite loss"
NON_FINITE_GRAD_NORM = "non-finite gradient norm"


class NonFiniteWeightsError(RuntimeError):
    """A checkpoint was refused because the weights hold inf or NaN."""


@dataclass(frozen=True)
class Skip:
    """One optimizer step the guard skipped: at which step, why, and in which dtype."""

    step: int
    reason: str
    precision: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason, "precision": self.precision}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Skip:
        return cls(step=int(d["step"]), reason=str(d["reason"]), precision=str(d["precision"]))


@dataclass(frozen=True)
class Verdict:
    """What the guard decided about one step (before the optimizer ran)."""

    grad_norm: float  # before clipping; inf/NaN when a gradient is
    reason: str | None  # why the guard skips the step (None: it does not)

    @property
    def skip(self) -> bool:
        return self.reason is not None


def validate_clip_norm(value: float | None) -> float | None:
    """``grad_clip_norm``: None (no clipping) or a positive finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"grad_clip_norm must be a positive number or None; got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"grad_clip_norm must be a positive finite number or None (no clipping); got {value!r}"
        )
    return float(value)


def total_grad_norm(
    parameters: Iterable[torch.nn.Parameter], max_norm: float | None = None
) -> float:
    """The L2 norm over every gradient; clips to ``max_norm`` in place when given and the
    norm is finite (a non-finite one is a skipped step: its gradients are dropped anyway).
    Never raises on inf/NaN: that is the guard's to judge."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.get_total_norm(
        [p.grad for p in params], norm_type=2.0, error_if_nonfinite=False
    )
    full = getattr(norm, "full_tensor", None)  # a DTensor (FSDP2 shards): reduce it whole
    if callable(full):
        norm = full()
    value = float(norm)
    if max_norm is not None and math.isfinite(value):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return value


def judge(loss: float, grad_norm: float, *, scaled: bool) -> Verdict:
    """The guard's verdict on one step.

    ``loss`` is the global batch's (in a gang: the mean over the ranks, non-finite when
    any rank's is), ``grad_norm`` the norm of the synchronized gradients (DDP's
    all-reduced ones, FSDP2's norm made whole), so the verdict is the same on every rank
    without a collective of its own. ``scaled``: the step went through a GradScaler
    (fp16), whose own inf check owns an overflow of the gradients alone.
    """
    if not math.isfinite(loss):
        return Verdict(grad_norm=grad_norm, reason=f"{NON_FINITE_LOSS} {loss}")
    # A scaled step with a finite loss and overflowed gradients is the scaler's: it skips
    # that step itself, and counting it here would double-handle it (a fallback on every
    # calibration overflow of the scale).
    if not math.isfinite(grad_norm) and not scaled:
        return Verdict(grad_norm=grad_norm, reason=f"{NON_FINITE_GRAD_NORM} {grad_norm}")
    return Verdict(grad_norm=grad_norm, reason=None)


def nonfinite_tensors(named: Iterable[tuple[str, Any]]) -> list[str]:
    """The names of the floating tensors among ``named`` that hold inf or NaN (a DTensor:
    this rank's shard of it)."""
    bad: list[str] = []
    with torch.no_grad():
        for name, t in named:
            local = getattr(t, "to_local", None)
            if callable(local):
                t = local()
            if (
                isinstance(t, torch.Tensor)
                and t.is_floating_point()
                and t.numel()
                and not bool(torch.isfinite(t).all())
            ):
                bad.append(name)
    return bad


def nonfinite_error(step: int, bad: list[str]) -> NonFiniteWeightsError:
    where = (": " + ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")) if bad else ""
    return NonFiniteWeightsError(
        f"checkpoint at step {step} refused: the weights hold inf/NaN{where}; "
        "the checkpoints already written are kept"
    )


def refuse_nonfinite_weights(model: torch.nn.Module, step: int) -> None:
    """Raise NonFiniteWeightsError if any parameter or buffer (this rank's shard of it, in
    a gang) holds inf or NaN; the last line of defence before a checkpoint, so
    ``keep_last`` never rotates good checkpoints out for poisoned ones. Buffers too: the
    guard skips a step, but a forward already ran (BatchNorm's running statistics). In a
    gang the rank that finds one fails, and the elastic agent stops the gang and restarts
    it from the last (finite) checkpoint."""
    bad = nonfinite_tensors(itertools.chain(model.named_parameters(), model.named_buffers()))
    if bad:
        raise nonfinite_error(step, bad)


def refuse_nonfinite_state(state: dict[str, Any], step: int) -> None:
    """NonFiniteWeightsError if a checkpoint's ``"model"`` state dict holds inf or NaN."""
    model_state = state.get("model")
    if isinstance(model_state, dict):
        bad = nonfinite_tensors(model_state.items())
        if bad:
            raise nonfinite_error(step, bad)
