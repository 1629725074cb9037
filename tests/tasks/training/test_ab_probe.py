"""The timed A/B: block order, untimed first steps, the decision by medians, its state."""

from __future__ import annotations

import math

import pytest
import torch
from gpuflow.tasks.training.ab_probe import ABProbe, Decision, ProbeConfig

FP32, BF16 = torch.float32, torch.bfloat16


def _probe(first: torch.dtype = FP32, **config: object) -> ABProbe:
    return ABProbe(
        config=ProbeConfig(**config),  # type: ignore[arg-type]
        reference=FP32,
        candidate=BF16,
        first=first,
        trigger="test",
        first_step=1,
    )


def _run(probe: ABProbe, times: dict[torch.dtype, list[float]]) -> list[torch.dtype]:
    """Feed the probe each arm's next time; return the dtype of every step."""
    seen, left = [], {k: list(v) for k, v in times.items()}
    while not probe.done:
        seen.append(probe.dtype)
        probe.record(left[probe.dtype].pop(0))
    return seen


def test_blocks_alternate_from_the_dtype_in_force() -> None:
    p = _probe(first=BF16, timed_steps=2, untimed_steps=1, rounds=2)
    seen = _run(p, {FP32: [1.0] * 6, BF16: [0.5] * 6})
    assert seen == [BF16] * 3 + [FP32] * 3 + [BF16] * 3 + [FP32] * 3
    assert p.config.total_steps == 12


def test_first_step_of_each_block_is_not_timed() -> None:
    p = _probe(timed_steps=2, untimed_steps=1, rounds=2)
    # The first step of each block is 100x slower (a new dtype's warm-up): not counted.
    _run(p, {FP32: [100.0, 1.0, 1.0, 100.0, 1.0, 1.0], BF16: [100.0, 0.5, 0.5, 100.0, 0.5, 0.5]})
    assert p.times == {"fp32": [1.0] * 4, "bf16": [0.5] * 4}
    d = p.decide(last_step=12)
    assert (d.chosen, d.timed_steps, d.speedup) == ("bf16", 4, 2.0)
    assert "bf16 pays" in d.reason and (d.first_step, d.last_step) == (1, 12)


@pytest.mark.parametrize(
    ("cand", "chosen", "words"),
    [(1.5, "fp32", "slower"), (0.97, "fp32", "under the 5% gain"), (0.9, "bf16", "pays")],
)
def test_the_candidate_must_beat_the_gain(cand: float, chosen: str, words: str) -> None:
    p = _probe(timed_steps=3, untimed_steps=0, rounds=1)
    _run(p, {FP32: [1.0] * 3, BF16: [cand] * 3})
    d = p.decide(last_step=6)
    assert d.chosen == chosen and words in d.reason


def test_the_median_shrugs_off_one_stray_step() -> None:
    p = _probe(timed_steps=5, untimed_steps=0, rounds=1)
    _run(p, {FP32: [1.0] * 5, BF16: [0.6, 0.6, 50.0, 0.6, 0.6]})  # a checkpoint write
    assert p.decide(last_step=10).chosen == "bf16"


def test_abort_keeps_the_reference() -> None:
    p = _probe()
    p.record(1.0)
    d = p.abort(last_step=2, why="numeric guard: non-finite loss nan")
    assert d.chosen == "fp32" and "aborted" in d.reason and math.isnan(d.candidate_step_s)


def test_state_round_trip_continues_the_same_probe() -> None:
    times = {FP32: [1.0, 1.1, 0.9, 1.0, 1.2] * 2, BF16: [0.5, 0.6, 0.4, 0.5, 0.7] * 2}
    whole = _probe()
    _run(whole, times)
    half = _probe()
    left = {k: list(v) for k, v in times.items()}
    for _ in range(7):
        half.record(left[half.dtype].pop(0))
    again = ABProbe.from_state(half.config, half.state_dict())
    assert again.state_dict() == half.state_dict()
    _run(again, left)
    assert again.decide(20) == whole.decide(20)
    assert Decision.from_dict(whole.decide(20).to_dict()) == whole.decide(20)


def test_bad_config_and_input_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="timed_steps"):
        ProbeConfig(timed_steps=0)
    with pytest.raises(ValueError, match="min_gain"):
        ProbeConfig(min_gain=1.0)
    with pytest.raises(ValueError, match="stop_when_slower"):
        ProbeConfig(stop_when_slower=1.0)
    with pytest.raises(ValueError, match="format"):
        ABProbe.from_state(ProbeConfig(), {**_probe().state_dict(), "format": 99})
    p = _probe()
    with pytest.raises(ValueError, match="step_time_s"):
        p.record(math.nan)
    assert p.position == 0
