"""The branch layout across real processes (torchelastic's agent, gloo): the same loss and
gradients as one device, micro-batched or not, and checkpoints either layout resumes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.multimodal.job import check_units, run_ranks
from gpuflow.tasks.multimodal.loop import train_rank
from gpuflow.tasks.multimodal.model import HEAD, TEXT, VISION
from gpuflow.tasks.multimodal.spec import MultimodalSpec
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.storage import LocalStorage

UNITS = [GangUnit(f"twin-{i}", "h0", i, "sim") for i in range(3)]
BATCH = 24


def _spec(job_id: str, steps: int, **fields: Any) -> MultimodalSpec:
    base = {"job_id": job_id, "steps": steps, "batch_size": BATCH, "workers": 1}
    return MultimodalSpec(**{**base, **fields})


@pytest.fixture
def solo_group() -> Iterator[None]:
    """A process group of this test process alone: the single layout, run in-process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _single(spec: MultimodalSpec, root: Path, record: bool = False) -> dict[str, Any]:
    single = spec.model_copy(update={"layout": "single"})
    layout = single.resolved_layout
    return train_rank(
        single, LocalStorage(root), layout, 0, torch.device("cpu"), record_gradients=record
    )


def _max_difference(reference: dict[str, dict], ranks: dict[int, dict[str, Any]]) -> float:
    seen: set[str] = set()
    worst = 0.0
    for result in ranks.values():
        for part, grads in result["gradients"].items():
            seen.add(part)
            assert grads.keys() == reference[part].keys(), part
            for name, grad in grads.items():
                worst = max(worst, float((grad - reference[part][name]).abs().max()))
    assert seen == {VISION, TEXT, HEAD}
    return worst


@pytest.mark.slow
def test_branch_layout_resumes_one_device_and_equals_it(tmp_path: Path, solo_group: None) -> None:
    """Two steps on one device (in this process) and a checkpoint; from it, two more steps
    as three processes (head, vision, text), the towers in two micro-batches each, and the
    same two steps on one device again. The first resumed step's loss and every gradient
    are the single device's; so are both steps' losses."""
    import shutil

    first = _single(_spec("moved", 2, checkpoint_interval=2), tmp_path / "branch")
    shutil.copytree(tmp_path / "branch", tmp_path / "one")
    more = _spec("moved", 4, checkpoint_interval=2, micro_batches=2)
    ranks = run_ranks(more, LocalStorage(tmp_path / "branch"), UNITS, record_gradients=True)
    assert [ranks[r]["role"] for r in range(3)] == ["head", "vision", "text"]
    assert ranks[0]["resumed_from_step"] == 2 and len(first["losses"]) == 2
    reference = _single(more.model_copy(update={"micro_batches": 1}), tmp_path / "one", True)
    assert reference["resumed_from_step"] == 2
    loss_difference = max(
        abs(a - b) for a, b in zip(ranks[0]["losses"], reference["losses"], strict=True)
    )
    worst = _max_difference(reference["gradients"], ranks)
    print(f"branch vs one device: |loss difference| {loss_difference:.2e}, max |grad| {worst:.2e}")
    assert worst < 1e-5, f"max |gradient difference| {worst:.2e}"
    assert loss_difference < 1e-5
    assert all(ranks[r]["losses"] == [] for r in (1, 2))  # only the head sees the loss
    ids = [
        c.checkpoint_id
        for c in CheckpointManager(LocalStorage(tmp_path / "branch"), "moved").list()
    ]
    assert ids == ["step-000000002", "step-000000004"]
    # Run once more: nothing left to do, and nothing to measure (no made-up rate).
    again = _single(more, tmp_path / "branch")
    assert again["resumed_from_step"] == 4 and again["losses"] == []
    assert again["samples_per_s"] is None and again["last_checkpoint"] == "step-000000004"


def test_units_must_fit_the_layout() -> None:
    with pytest.raises(InvalidRequestError, match=r"needs 3 unit\(s\), got 2"):
        check_units(_spec("j", 1), UNITS[:2])
    with pytest.raises(InvalidRequestError, match="appears twice"):
        check_units(_spec("j", 1), [UNITS[0], UNITS[1], UNITS[0]])
    spread = [UNITS[0], GangUnit("twin-9", "h1", 0, "sim"), UNITS[2]]
    with pytest.raises(InvalidRequestError, match="span nodes"):
        check_units(_spec("j", 1), spread)
    check_units(_spec("j", 1, layout="single"), UNITS[:1])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"batch_size": 10, "micro_batches": 4}, "does not split into 4"),
        ({"size": "clip-huge"}, "unknown size"),
        ({"job_id": "a b"}, "job_id"),
        ({"layout": "pipeline"}, "layout"),
    ],
)
def test_spec_refuses_bad_fields(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultimodalSpec(**fields)
