"""The shard manifest: round trip, validation, and the sha256 check servers rely on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpuflow.tasks.edge.manifest import (
    ManifestError,
    ShardIntegrityError,
    ShardManifest,
    TensorSpec,
    file_sha256,
    kserve_dtype,
    load_manifest,
    parse_hop,
    save_manifest,
    verify_shard,
)


def _shard(tmp_path: Path, payload: bytes = b"onnx bytes") -> ShardManifest:
    (tmp_path / "model.onnx").write_bytes(payload)
    manifest = ShardManifest(
        model_name="m-shard0",
        shard_index=0,
        num_shards=2,
        onnx_file="model.onnx",
        sha256=file_sha256(tmp_path / "model.onnx"),
        inputs=[TensorSpec("input", (-1, 3, 8, 8), "FP32")],
        outputs=[TensorSpec("relu_4", (-1, 32, 8, 8), "FP32")],
        next_hop="127.0.0.1:9001",
        opset=18,
    )
    save_manifest(manifest, tmp_path)
    return manifest


def test_round_trip_and_verify(tmp_path: Path) -> None:
    manifest = _shard(tmp_path)
    assert load_manifest(tmp_path) == manifest
    assert verify_shard(tmp_path) == manifest
    assert not manifest.is_last


def test_sha256_mismatch_is_refused(tmp_path: Path) -> None:
    _shard(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"onnx bytes, altered")
    with pytest.raises(ShardIntegrityError, match="sha256 mismatch"):
        verify_shard(tmp_path)


def test_missing_file_and_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest.json"):
        load_manifest(tmp_path)
    _shard(tmp_path)
    (tmp_path / "model.onnx").unlink()
    with pytest.raises(ShardIntegrityError, match="missing"):
        verify_shard(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shard_index": 2}, "shard_index"),
        ({"num_shards": 0}, "num_shards"),
        ({"onnx_file": "../x.onnx"}, "bare file name"),
        ({"sha256": "abc"}, "sha256"),
        ({"next_hop": "nohost"}, "host:port"),
        ({"model_name": "bad name"}, "model_name"),
        ({"inputs": []}, "at least one input"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, change: dict, message: str) -> None:
    base = _shard(tmp_path).to_dict()
    base.pop("manifest_version")
    base.update(change)
    with pytest.raises(ManifestError, match=message):
        ShardManifest.from_dict(base)


def test_tensor_spec_matching_and_dtypes() -> None:
    spec = TensorSpec("x", (-1, 4), "FP32")
    assert spec.matches(np.zeros((3, 4), np.float32))
    assert not spec.matches(np.zeros((3, 5), np.float32))
    assert not spec.matches(np.zeros((3, 4), np.float64))
    assert kserve_dtype(np.int64) == "INT64"
    with pytest.raises(ValueError, match="unknown KServe datatype"):
        TensorSpec("x", (1,), "FLOAT")
    assert parse_hop("127.0.0.1:8001") == ("127.0.0.1", 8001)
    with pytest.raises(ManifestError):
        parse_hop("127.0.0.1:70000")
