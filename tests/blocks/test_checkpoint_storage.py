"""The CheckpointStorage block: validation, the store it configures, secrets kept secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.training.checkpoint import checkpoint_manager
from gpuflow.tasks.training.storage import LocalStorage, S3Storage, open_store
from pydantic import ValidationError

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def test_default_is_local_under_gpuflow_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    block = CheckpointStorage()
    store = open_store(block)
    assert isinstance(store, LocalStorage)
    assert store.root == (tmp_path / "home" / "checkpoints").resolve()
    assert store.root.is_dir()


def test_local_path_and_manager(tmp_path: Path) -> None:
    block = CheckpointStorage(path=str(tmp_path / "ckpts"), keep_last=2)
    manager = checkpoint_manager(block, "job-7")
    assert manager.keep_last == 2 and manager.job_id == "job-7"
    manager.save({"sampler": {"position": 1}}, 1, {})
    assert (tmp_path / "ckpts" / "job-7" / "step-000000001" / "manifest.json").is_file()


def test_s3_store_carries_every_setting() -> None:
    block = CheckpointStorage(
        kind="s3",
        bucket="team-ckpts",
        prefix="llm/",
        endpoint_url="http://127.0.0.1:9",
        region_name="eu-west-1",
        access_key_id="AKIAEXAMPLE",
        secret_access_key=SECRET,
        multipart_threshold_mb=32,
        multipart_chunk_mb=8,
    )
    store = open_store(block, verify=False)  # nothing listens on port 9: no call is made
    assert isinstance(store, S3Storage)
    assert (store.bucket, store.prefix, store.endpoint_url) == (
        "team-ckpts",
        "llm/",
        "http://127.0.0.1:9",
    )
    assert store.region_name == "eu-west-1" and store.access_key_id == "AKIAEXAMPLE"
    assert (store.multipart_threshold_mb, store.multipart_chunk_mb) == (32, 8)
    assert SECRET not in repr(store)


def test_secret_never_shown() -> None:
    block = CheckpointStorage(
        kind="s3", bucket="b-1", access_key_id="AKIAEXAMPLE", secret_access_key=SECRET
    )
    assert SECRET not in repr(block)
    assert SECRET not in str(block)
    assert SECRET not in block.model_dump_json()
    assert SECRET not in str(block.model_dump())
    assert block.secret_access_key.get_secret_value() == SECRET
    assert "secret_access_key" in CheckpointStorage.model_json_schema()["secret_fields"]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"kind": "s3"}, "needs a bucket"),
        ({"kind": "s3", "bucket": "b-1", "access_key_id": "AKIA"}, "both access_key_id"),
        ({"kind": "s3", "bucket": "b-1", "secret_access_key": "x"}, "both access_key_id"),
        ({"kind": "local", "bucket": "b-1"}, "does not use a bucket"),
        ({"kind": "gcs"}, "kind"),
        ({"keep_last": 0}, "keep_last"),
        ({"kind": "s3", "bucket": "b-1", "multipart_chunk_mb": 1}, "multipart_chunk_mb"),
    ],
)
def test_invalid_settings_are_refused(fields: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        CheckpointStorage(**fields)


def test_block_type_metadata() -> None:
    assert CheckpointStorage.get_block_type_name() == "gpuflow Checkpoint Storage"
    assert CheckpointStorage.get_block_type_slug() == "gpuflow-checkpoint-storage"
    assert "checkpoint" in (CheckpointStorage.get_description() or "").lower()
    assert CheckpointStorage._logo_url is None
