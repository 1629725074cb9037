"""A timed A/B of two dtypes on the job's own steps: the evidence ``auto`` decides on.

Utilization says a device is busy, not that reduced precision makes it faster: a CPU
emulates fp16 slower than it runs fp32, a V100 has no bf16, a loop bound by its data
loader gains nothing. So ``auto`` times the real training step in each dtype, on this
device, this job and this world size, and keeps the reduced dtype only where it measured
faster.

The probe runs blocks of steps, alternating the reference (fp32) and the candidate (the
device's reduced dtype), starting with whichever is in force so that no switch is spent
on the start: ``A B A B`` for two rounds. The first step of each block is not timed (the
autocast weight-cast cache, allocator and kernel selection of a new dtype land there).
Interleaving puts a drift of the machine's speed (a neighbour's job, turbo, a checkpoint
write) on both arms alike. The candidate wins when its median step is at least
``min_gain`` faster than the reference's median.

Every step is still a real training step: the probe costs only the time of its slower
blocks, and on resume it continues where it was (its state is in the checkpoint).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from gpuflow.tasks.training.precision import dtype_from_name, dtype_name

PROBE_STATE_FORMAT = 1


@dataclass(frozen=True)
class Decision:
    """The outcome of one A/B: what was timed, over which steps, and what was chosen."""

    trigger: str  # why the probe ran
    first_step: int  # the first step of the probe (1-based, as StepInfo counts)
    last_step: int  # the step that ended it
    reference: str  # "fp32"
    candidate: str  # "bf16" / "fp16"
    reference_step_s: float  # median timed step; nan when aborted before any timing
    candidate_step_s: float
    timed_steps: int  # per arm
    chosen: str
    reason: str

    @property
    def speedup(self) -> float:
        """Reference over candidate median step time (> 1: the candidate is faster)."""
        if self.candidate_step_s > 0 and math.isfinite(self.candidate_step_s):
            return self.reference_step_s / self.candidate_step_s
        return math.nan

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "speedup": self.speedup}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        return cls(
            trigger=str(d["trigger"]),
            first_step=int(d["first_step"]),
            last_step=int(d["last_step"]),
            reference=str(d["reference"]),
            candidate=str(d["candidate"]),
            reference_step_s=float(d["reference_step_s"]),
            candidate_step_s=float(d["candidate_step_s"]),
            timed_steps=int(d["timed_steps"]),
            chosen=str(d["chosen"]),
            reason=str(d["reason"]),
        )


def _positive_int(name: str, value: object, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    return value


@dataclass(frozen=True)
class ProbeConfig:
    """How an A/B is run: ``timed_steps`` per block after ``untimed_steps``, ``rounds``
    blocks per arm, and the gain the candidate needs to win."""

    timed_steps: int = 4
    untimed_steps: int = 1
    rounds: int = 2
    min_gain: float = 0.05
    # A candidate this many times slower than fp32 after one block of each is not timed
    # again (fp16 emulated on a CPU runs ~12x slower: a second block would cost minutes).
    stop_when_slower: float = 2.0

    def __post_init__(self) -> None:
        _positive_int("probe timed_steps", self.timed_steps, 1)
        _positive_int("probe untimed_steps", self.untimed_steps, 0)
        _positive_int("probe rounds", self.rounds, 1)
        if not (isinstance(self.min_gain, (int, float)) and 0.0 <= self.min_gain < 1.0):
            raise ValueError(f"probe min_gain must be in [0, 1); got {self.min_gain!r}")
        if not (isinstance(self.stop_when_slower, (int, float)) and self.stop_when_slower > 1.0):
            raise ValueError(
                f"probe stop_when_slower must be a ratio > 1; got {self.stop_when_slower!r}"
            )

    @property
    def block_steps(self) -> int:
        return self.untimed_steps + self.timed_steps

    @property
    def total_steps(self) -> int:
        return 2 * self.rounds * self.block_steps


@dataclass
class ABProbe:
    """One A/B in progress. ``dtype`` is what the next step runs in; ``record`` takes that
    step's time; ``done`` once every block ran; then ``decide``."""

    config: ProbeConfig
    reference: torch.dtype
    candidate: torch.dtype
    first: torch.dtype  # the arm of the first block (the dtype in force when it started)
    trigger: str
    first_step: int
    position: int = 0  # steps of the probe done
    times: dict[str, list[float]] = field(default_factory=dict)  # timed steps per arm
    stopped_early: bool = False  # the candidate was far slower after one block of each

    def __post_init__(self) -> None:
        if self.first not in (self.reference, self.candidate):
            raise ValueError("a probe starts in one of its two arms")
        for dt in (self.reference, self.candidate):
            self.times.setdefault(dtype_name(dt), [])

    @property
    def _second(self) -> torch.dtype:
        return self.candidate if self.first == self.reference else self.reference

    def _arm_at(self, position: int) -> torch.dtype:
        block = position // self.config.block_steps
        return self.first if block % 2 == 0 else self._second

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the next step of the probe runs in."""
        return self._arm_at(min(self.position, self.config.total_steps - 1))

    @property
    def done(self) -> bool:
        return self.stopped_early or self.position >= self.config.total_steps

    def record(self, step_time_s: float) -> None:
        """The step just run (in ``dtype``) took ``step_time_s``."""
        if self.done:
            raise RuntimeError("the probe is complete; decide() it")
        if not (math.isfinite(step_time_s) and step_time_s >= 0):
            raise ValueError(f"step_time_s must be a finite number >= 0; got {step_time_s!r}")
        if self.position % self.config.block_steps >= self.config.untimed_steps:
            self.times[dtype_name(self.dtype)].append(float(step_time_s))
        self.position += 1
        if self.position % self.config.block_steps == 0:  # a block ended
            ref_s, cand_s, n = self._medians()
            if n >= self.config.timed_steps and cand_s >= self.config.stop_when_slower * ref_s:
                self.stopped_early = True

    def _medians(self) -> tuple[float, float, int]:
        ref = self.times[dtype_name(self.reference)]
        cand = self.times[dtype_name(self.candidate)]
        med = lambda xs: statistics.median(xs) if xs else math.nan  # noqa: E731
        return med(ref), med(cand), min(len(ref), len(cand))

    def decide(self, last_step: int) -> Decision:
        """The candidate if its median step beat the reference's by ``min_gain``; never a
        dtype that measured slower."""
        ref_s, cand_s, n = self._medians()
        ref_n, cand_n = dtype_name(self.reference), dtype_name(self.candidate)
        wins = cand_s < ref_s * (1.0 - self.config.min_gain)
        ratio = ref_s / cand_s if cand_s > 0 else math.inf
        if wins:
            reason = (
                f"A/B: {cand_n} median step {cand_s * 1e3:.2f} ms vs {ref_n} {ref_s * 1e3:.2f} "
                f"ms over {n} timed steps each ({ratio:.2f}x): {cand_n} pays"
            )
        else:
            verdict = "slower" if cand_s >= ref_s else f"under the {self.config.min_gain:.0%} gain"
            if self.stopped_early:
                verdict += f"; not timed again at {self.config.stop_when_slower:g}x or worse"
            reason = (
                f"A/B: {cand_n} median step {cand_s * 1e3:.2f} ms vs {ref_n} {ref_s * 1e3:.2f} "
                f"ms over {n} timed steps each ({ratio:.2f}x, {verdict}): staying {ref_n}"
            )
        return Decision(
            trigger=self.trigger,
            first_step=self.first_step,
            last_step=last_step,
            reference=ref_n,
            candidate=cand_n,
            reference_step_s=ref_s,
            candidate_step_s=cand_s,
            timed_steps=n,
            chosen=cand_n if wins else ref_n,
            reason=reason,
        )

    def abort(self, last_step: int, why: str) -> Decision:
        """End the probe early (the numeric guard fired): the reference is kept."""
        ref_s, cand_s, n = self._medians()
        ref_n = dtype_name(self.reference)
        return Decision(
            trigger=self.trigger,
            first_step=self.first_step,
            last_step=last_step,
            reference=ref_n,
            candidate=dtype_name(self.candidate),
            reference_step_s=ref_s,
            candidate_step_s=cand_s,
            timed_steps=n,
            chosen=ref_n,
            reason=f"A/B aborted: {why}; {ref_n} kept",
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": PROBE_STATE_FORMAT,
            "reference": dtype_name(self.reference),
            "candidate": dtype_name(self.candidate),
            "first": dtype_name(self.first),
            "trigger": self.trigger,
            "first_step": self.first_step,
            "position": self.position,
            "times": {k: list(v) for k, v in self.times.items()},
            "stopped_early": self.stopped_early,
        }

    @classmethod
    def from_state(cls, config: ProbeConfig, state: dict[str, Any]) -> ABProbe:
        if state.get("format") != PROBE_STATE_FORMAT:
            raise ValueError(
                f"A/B probe state format {state.get('format')!r}; this code reads "
                f"{PROBE_STATE_FORMAT}"
            )
        return cls(
            config=config,
            reference=dtype_from_name(state["reference"], "probe state 'reference'"),
            candidate=dtype_from_name(state["candidate"], "probe state 'candidate'"),
            first=dtype_from_name(state["first"], "probe state 'first'"),
            trigger=str(state["trigger"]),
            first_step=int(state["first_step"]),
            position=int(state["position"]),
            times={str(k): [float(x) for x in v] for k, v in state["times"].items()},
            stopped_early=bool(state.get("stopped_early", False)),
        )
