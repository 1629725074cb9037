"""DevicePrefetcher: a batch fetched ahead is never in the checkpointed position.

On CPU (no streams) the same bookkeeping runs: what a GPU run checkpoints is what these
assert. The side-stream copy itself needs a GPU (scripts/gpu_check.py)."""

from __future__ import annotations

import pytest
import torch
from gpuflow.tasks.training.data import build_dataset, make_sampler
from gpuflow.tasks.training.prefetch import DevicePrefetcher

CPU = torch.device("cpu")


def _sampler() -> object:
    return make_sampler(build_dataset("pydoc-topics"), batch_size=4, seed=3, seq_len=16)


def test_batches_are_the_samplers_in_order() -> None:
    plain, ahead = _sampler(), DevicePrefetcher(_sampler(), CPU)
    for _ in range(5):
        a, b = next(plain), next(ahead)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_the_state_is_before_the_batch_fetched_ahead() -> None:
    ahead = DevicePrefetcher(_sampler(), CPU)
    assert ahead.state_dict()["position"] == 0
    taken = [next(ahead) for _ in range(3)]
    assert len(taken) == 3 and ahead.state_dict()["position"] == 3  # not 4
    assert ahead.sampler.state_dict()["position"] == 4  # the inner one is a batch on

    resumed = DevicePrefetcher(_sampler(), CPU)
    resumed.load_state_dict(ahead.state_dict())
    x, _ = next(resumed)
    expected = _sampler()
    for _ in range(3):
        next(expected)
    assert torch.equal(x, next(expected)[0])


def test_a_bad_state_is_refused_and_changes_nothing() -> None:
    ahead = DevicePrefetcher(_sampler(), CPU)
    next(ahead)
    before = ahead.state_dict()
    with pytest.raises(ValueError, match="position"):
        ahead.load_state_dict({**before, "position": -1})
    assert ahead.state_dict() == before
