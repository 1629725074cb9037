"""CheckpointStorage: where a training job's checkpoints go (a local folder or S3).

The block is configuration only; tasks.training.storage.open_store turns it into a store
and tasks.training.checkpoint.checkpoint_manager into a job's CheckpointManager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gpuflow.hardware.home import gpuflow_home
from prefect.blocks.core import Block
from pydantic import Field, SecretStr, model_validator

# S3 refuses multipart parts under 5 MiB (except the last one).
S3_MIN_PART_MB = 5


class CheckpointStorage(Block):
    """Checkpoint storage for gpuflow training jobs.

    ``kind`` local keeps checkpoints in ``path`` (empty = GPUFLOW_HOME/checkpoints, resolved
    on the host that uses the block). ``kind`` s3 uses ``bucket`` under ``prefix`` on AWS or
    any S3-compatible store (``endpoint_url``: MinIO, Ceph RGW, ...); without keys, boto3's
    usual credential chain (environment, profile, instance role) applies. ``keep_last`` is
    how many committed checkpoints each job keeps.
    """

    _block_type_name = "gpuflow Checkpoint Storage"
    _block_type_slug = "gpuflow-checkpoint-storage"
    _description = "Where gpuflow training checkpoints live: a local folder or an S3 bucket."

    kind: Literal["local", "s3"] = Field(default="local", description="local or s3.")
    path: str = Field(
        default="",
        description="Local folder for checkpoints; empty for GPUFLOW_HOME/checkpoints.",
    )
    bucket: str = Field(default="", description="S3 bucket (kind s3).")
    prefix: str = Field(default="", description="Key prefix inside the bucket.")
    endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint (MinIO, Ceph); empty for AWS."
    )
    region_name: str | None = Field(default=None, description="S3 region.")
    access_key_id: str | None = Field(
        default=None, description="S3 access key id; empty for boto3's default credentials."
    )
    secret_access_key: SecretStr | None = Field(default=None, description="S3 secret access key.")
    keep_last: int = Field(default=3, ge=1, description="Committed checkpoints kept per job.")
    multipart_threshold_mb: int = Field(
        default=64, ge=S3_MIN_PART_MB, description="Objects from this size upload in parts."
    )
    multipart_chunk_mb: int = Field(
        default=16, ge=S3_MIN_PART_MB, description="Size of each multipart part."
    )

    @model_validator(mode="after")
    def _consistent(self) -> CheckpointStorage:
        if self.kind == "s3":
            if not self.bucket:
                raise ValueError("CheckpointStorage kind 's3' needs a bucket")
            has_secret = bool(self.secret_access_key and self.secret_access_key.get_secret_value())
            if bool(self.access_key_id) != has_secret:
                raise ValueError(
                    "CheckpointStorage kind 's3' needs both access_key_id and "
                    "secret_access_key, or neither (to use boto3's default credentials)"
                )
        elif self.bucket:
            raise ValueError(
                f"CheckpointStorage kind 'local' does not use a bucket (got {self.bucket!r}); "
                "set kind='s3'"
            )
        return self

    def local_root(self) -> Path:
        """The folder a local store writes to (GPUFLOW_HOME/checkpoints when path is empty)."""
        if self.path:
            return Path(self.path).expanduser()
        return gpuflow_home() / "checkpoints"
