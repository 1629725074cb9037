"""What a multi-modal training job is, and how its parts sit on ranks (the layout).

Layouts (``Layout.roles``: the parts each rank holds, rank 0 first):

* ``single``: one rank holds the vision tower, the text tower and the head.
* ``branch``, head ``separate``: rank 0 the head, rank 1 the vision tower, rank 2 the text
  tower (the seed's §4.1: a third device for the contrastive head).
* ``branch``, head ``vision``: rank 0 the vision tower and the head, rank 1 the text tower
  (two devices; the head is small and needs no device of its own).

Rank 0 always holds the head: it sees the loss first, logs, and commits checkpoints.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from gpuflow.tasks.multimodal.model import HEAD, PARTS, SIZES, TEXT, VISION
from gpuflow.tasks.training.spec import check_job_id
from pydantic import BaseModel, Field, field_validator, model_validator

LAYOUTS = ("single", "branch")
HEAD_PLACES = ("separate", "vision")


@dataclass(frozen=True)
class Layout:
    name: str
    roles: tuple[tuple[str, ...], ...]

    @property
    def world_size(self) -> int:
        return len(self.roles)

    def rank_of(self, part: str) -> int:
        return next(r for r, parts in enumerate(self.roles) if part in parts)

    def role_name(self, rank: int) -> str:
        """What a rank is called in logs and metrics: its parts joined ("vision+head")."""
        return "+".join(self.roles[rank])


def layout_for(name: str, head: str = "separate") -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"layout {name!r} is not one of: {', '.join(LAYOUTS)}")
    if head not in HEAD_PLACES:
        raise ValueError(f"head {head!r} is not one of: {', '.join(HEAD_PLACES)}")
    if name == "single":
        return Layout(name, (PARTS,))
    if head == "vision":
        return Layout(name, ((VISION, HEAD), (TEXT,)))
    return Layout(name, ((HEAD,), (VISION,), (TEXT,)))


class MultimodalSpec(BaseModel):
    """A CLIP-style training job on captioned digits (tasks/multimodal/data.py)."""

    job_id: str | None = Field(
        default=None,
        description="Names the job's checkpoints; empty: <size>-<random>. Reuse an id to "
        "resume that job from its latest checkpoint (in either layout).",
    )
    size: str = Field(default="clip-tiny", description=f"One of: {', '.join(SIZES)}")
    layout: Literal["single", "branch"] = "branch"
    head: Literal["separate", "vision"] = Field(
        default="separate",
        description="branch: the contrastive head on a third rank (separate) or with the "
        "vision tower (vision, two ranks).",
    )
    steps: int = Field(default=100, ge=1, description="Optimizer steps in total.")
    batch_size: int = Field(default=64, ge=2, description="The global batch: every negative.")
    micro_batches: int = Field(
        default=1,
        ge=1,
        description="Towers run the batch in this many pieces (features without a graph, "
        "then each piece again with one: gradient caching); the loss still sees the whole "
        "batch, so the negatives do not change.",
    )
    lr: float = Field(default=5e-4, gt=0)
    warmup_steps: int = Field(default=10, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    seed: int = Field(default=0, ge=0)
    checkpointing: bool = Field(
        default=False, description="Gradient checkpointing of the vision tower's blocks."
    )
    text_int8: bool = Field(
        default=False,
        description="The text tower's linear weights as frozen int8 (embeddings, norms, "
        "biases and the projection train).",
    )
    workers: int = Field(
        default=1, ge=0, le=16, description="DataLoader worker processes per tower rank."
    )
    checkpoint_interval: int = Field(default=50, ge=1)
    keep_last: int = Field(default=2, ge=1)
    log_every: int = Field(default=10, ge=1)
    max_restarts: int = Field(default=1, ge=0, le=100)
    backend: Literal["gloo", "nccl"] | None = None
    threads_per_rank: int = Field(default=1, ge=1, le=64)

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str | None) -> str | None:
        return check_job_id(value)

    @field_validator("size")
    @classmethod
    def _size(cls, value: str) -> str:
        if value not in SIZES:
            raise ValueError(f"unknown size {value!r}; known: {', '.join(SIZES)}")
        return value

    @model_validator(mode="after")
    def _shape(self) -> MultimodalSpec:
        if self.batch_size % self.micro_batches:
            raise ValueError(
                f"batch_size {self.batch_size} does not split into {self.micro_batches} "
                "equal micro-batches"
            )
        if self.job_id is None:
            self.job_id = f"{self.size}-{uuid.uuid4().hex[:8]}"
        return self

    @property
    def resolved_layout(self) -> Layout:
        return layout_for(self.layout, self.head)
