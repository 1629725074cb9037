"""What a training job is: the parameters a user gives the `train` flow."""

from __future__ import annotations

import re
import uuid
from typing import Literal

from gpuflow.tasks.training.guard import validate_clip_norm
from gpuflow.tasks.training.models import MODELS, model_spec
from pydantic import BaseModel, Field, field_validator, model_validator

_JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def check_job_id(value: str | None) -> str | None:
    """A job id names checkpoint folders and S3 prefixes: a safe, bounded name or none."""
    if value is not None and not _JOB_ID.match(value):
        raise ValueError(f"job_id {value!r}: use 1-128 letters, digits, '_', '.', '-'")
    return value


class TrainSpec(BaseModel):
    """A training job. Defaults come from the model's recommended settings."""

    job_id: str | None = Field(
        default=None,
        description="Names the job's checkpoints and control channel; empty: <model>-<random>. "
        "Reuse an id to resume that job from its latest checkpoint.",
    )
    model: str = Field(default="llama-tiny", description=f"One of: {', '.join(MODELS)}")
    dataset: str | None = Field(
        default=None, description="pydoc-topics | digits; default: the model's"
    )
    steps: int = Field(
        default=200, ge=1, description="Optimizer steps in total (resume counts on)."
    )
    batch_size: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=2, description="Language models only.")
    lr: float | None = Field(default=None, gt=0)
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "auto"
    grad_clip_norm: float | None = Field(
        default=None,
        description="Clip the total gradient norm (L2, after unscaling) to this; none: no "
        "clipping. The norm is taken either way: a non-finite one skips the step.",
    )
    compile: bool = Field(
        default=False,
        description="torch.compile the model's forward. Off by default: on a 2-core CPU it "
        "saves ~13 % of a bf16 step and nothing significant in fp32, after a 25-35 s "
        "compile per dtype (docs/benchmarks.md). Runs under deterministic algorithms, so a "
        "resume stays exact.",
    )
    checkpoint_interval: int = Field(default=50, ge=1, description="Steps between checkpoints.")
    keep_last: int = Field(default=3, ge=1)
    seed: int = Field(default=0, ge=0)
    eval_batches: int = Field(default=8, ge=1)
    log_every: int = Field(default=10, ge=1)
    # A gang (tasks/training/distributed/): how many units train as ranks, how often the
    # elastic agent restarts a failed gang from its last checkpoint, the collective
    # backend (default: chosen from the leased devices), and how the ranks hold the model.
    gpus: int = Field(default=1, ge=1, le=64, description="Ranks: one per leased unit.")
    nodes: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Nodes the gang spans, gpus/nodes units on each (one elastic agent per "
        "node); none: where the scheduler places it (one node when it fits on one).",
    )
    max_restarts: int = Field(default=1, ge=0, le=100)
    backend: Literal["gloo", "nccl"] | None = None
    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp",
        description="A gang's ranks: ddp (each holds the whole model) or fsdp (FSDP2: each "
        "holds 1/N of the parameters, gradients and optimizer state).",
    )

    energy: Literal["managed", "tune", "pinned"] = Field(
        default="managed",
        description="Power limits: managed (the DVFS controller may tune the job's devices), "
        "tune (the job probes power limits in its first steps and keeps the best within "
        "energy_slowdown for the rest of the run), pinned (the job runs at power_limit_w "
        "and nothing else changes it).",
    )
    energy_slowdown: float = Field(
        default=0.10, ge=0.0, le=1.0, description="tune: the slowdown bound (0.10 = 10 %)."
    )
    power_limit_w: float | None = Field(
        default=None, gt=0, description="pinned: the power limit in watts for every device."
    )

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str | None) -> str | None:
        return check_job_id(value)

    @field_validator("grad_clip_norm")
    @classmethod
    def _grad_clip_norm(cls, value: float | None) -> float | None:
        # inf/NaN would "clip" to nothing or poison every gradient; 0 would erase them.
        return validate_clip_norm(value)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if value not in MODELS:
            raise ValueError(f"unknown model {value!r}; known: {', '.join(MODELS)}")
        return value

    @model_validator(mode="after")
    def _nodes(self) -> TrainSpec:
        if self.nodes is not None and self.gpus % self.nodes:
            raise ValueError(
                f"nodes {self.nodes}: gpus {self.gpus} does not split evenly over them (each "
                f"node runs the same number of ranks; ask for a multiple of {self.nodes})"
            )
        return self

    @model_validator(mode="after")
    def _energy(self) -> TrainSpec:
        if (self.energy == "pinned") != (self.power_limit_w is not None):
            raise ValueError(
                f"power_limit_w {self.power_limit_w!r} with energy {self.energy!r}: a limit "
                "is given exactly when energy is 'pinned'"
            )
        if self.energy != "managed" and self.distributed:
            raise ValueError(
                f"energy {self.energy!r} is for single-device jobs; a gang's devices are "
                "the DVFS controller's (energy 'managed')"
            )
        return self

    @model_validator(mode="after")
    def _dataset(self) -> TrainSpec:
        if self.job_id is None:
            self.job_id = f"{self.model}-{uuid.uuid4().hex[:8]}"
        spec = model_spec(self.model)
        if self.dataset is None and spec.dataset is None:
            raise ValueError(f"model {self.model!r} has no offline dataset; pass dataset=")
        want = "lm" if (self.dataset or spec.dataset) == "pydoc-topics" else "image"
        if want != spec.task:
            raise ValueError(
                f"dataset {self.dataset!r} does not fit model {self.model!r} (a {spec.task} model)"
            )
        return self

    @property
    def distributed(self) -> bool:
        """Whether it trains as a gang under torch.distributed: several units, or FSDP2
        (one rank of it too: a gang shrunk to one unit keeps its parallelism)."""
        return self.gpus > 1 or self.parallel == "fsdp"

    # Resolved settings: the spec's value, else the model's recommended one.
    @property
    def resolved_dataset(self) -> str:
        return self.dataset or model_spec(self.model).dataset  # type: ignore[return-value]

    @property
    def resolved_batch_size(self) -> int:
        return self.batch_size or model_spec(self.model).batch_size

    @property
    def resolved_seq_len(self) -> int | None:
        spec = model_spec(self.model)
        return (self.seq_len or spec.seq_len) if spec.task == "lm" else None

    @property
    def resolved_lr(self) -> float:
        return self.lr or model_spec(self.model).lr
