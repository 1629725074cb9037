"""Every packaged shard in Triton's and KServe's own formats, checked with their own
definitions where we have them (Triton's ModelConfig ships with tritonclient)."""

from __future__ import annotations

import os
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml
from google.protobuf import text_format
from gpuflow.blocks.edge_fleet import default_nodes
from gpuflow.tasks.edge.manifest import ShardManifest, TensorSpec
from gpuflow.tasks.edge.package import PROBE_PORT, SERVING_UID, dockerfile_text
from gpuflow.tasks.edge.runtimes import (
    kserve_manifest,
    kserve_name,
    triton_config_text,
    write_kserve_manifest,
    write_triton_repository,
)
from gpuflow.tasks.edge.serving.shard_model import cpu_quota_threads
from tritonclient.grpc import model_config_pb2

from .test_slice_serve import _package


def _manifest(**fields) -> ShardManifest:
    base = dict(
        model_name="resnet18_digits-shard1",
        shard_index=1,
        num_shards=2,
        onnx_file="model.onnx",
        sha256="ab" * 32,
        inputs=[TensorSpec("h", (-1, 64, 4, 4), "FP32")],
        outputs=[TensorSpec("logits", (-1, 10), "FP32"), TensorSpec("ids", (-1,), "INT64")],
    )
    return ShardManifest(**{**base, **fields})


def test_triton_config_is_a_valid_model_config() -> None:
    config = text_format.Parse(triton_config_text(_manifest()), model_config_pb2.ModelConfig())
    assert config.name == "resnet18_digits-shard1"
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 0
    assert [(i.name, list(i.dims)) for i in config.input] == [("h", [-1, 64, 4, 4])]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    assert [o.data_type for o in config.output] == [
        model_config_pb2.TYPE_FP32,
        model_config_pb2.TYPE_INT64,
    ]


def test_packaged_shards_carry_a_triton_repository_and_a_kserve_service(
    exported_digits, digits_profile
) -> None:
    _, _, packaged = _package(exported_digits, digits_profile, default_nodes(2), "runtimes")
    for shard in packaged:
        m = shard.manifest
        model_dir = shard.directory / "triton" / m.model_name
        config = text_format.Parse(
            (model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
        assert config.name == m.model_name
        assert [i.name for i in config.input] == [t.name for t in m.inputs]
        served = model_dir / "1" / "model.onnx"
        assert served.read_bytes() == (shard.directory / "model.onnx").read_bytes()
        # The graph Triton would load takes the inputs the config declares.
        session = ort.InferenceSession(str(served), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == [i.name for i in config.input]
        service = yaml.safe_load((shard.directory / "kserve.yaml").read_text())
        assert service["kind"] == "InferenceService"
        assert service["metadata"]["annotations"]["gpuflow.io/sha256"] == m.sha256
        model = service["spec"]["predictor"]["model"]
        assert model["protocolVersion"] == "v2" and model["modelFormat"]["name"] == "onnx"
        text = (shard.directory / "Dockerfile").read_text()
        assert f"USER {SERVING_UID}" in text and "HEALTHCHECK" in text
        assert f'"--http-port", "{PROBE_PORT}"' in text


def test_kserve_names_are_dns_labels_and_the_storage_is_the_callers() -> None:
    assert kserve_name("resnet18_digits-shard1") == "resnet18-digits-shard1"
    assert kserve_name("9lives") == "m-9lives"
    assert len(kserve_name("x" * 100)) == 63
    service = kserve_manifest(_manifest(), storage_uri="s3://models/r18/shard1/triton")
    assert service["spec"]["predictor"]["model"]["storageUri"] == "s3://models/r18/shard1/triton"
    assert "CHANGE-ME" in kserve_manifest(_manifest())["spec"]["predictor"]["model"]["storageUri"]


def test_a_rewritten_repository_replaces_the_old_model(tmp_path: Path) -> None:
    manifest = _manifest()
    (tmp_path / "model.onnx").write_bytes(b"first")
    write_triton_repository(tmp_path, manifest)
    (tmp_path / "model.onnx").unlink()
    (tmp_path / "model.onnx").write_bytes(b"second")
    repo = write_triton_repository(tmp_path, manifest)
    assert (repo / manifest.model_name / "1" / "model.onnx").read_bytes() == b"second"
    assert write_kserve_manifest(tmp_path, manifest).exists()
    assert "ENTRYPOINT" in dockerfile_text(manifest)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("max 100000", None), ("150000 100000", 2), ("50000 100000", 1), ("garbage", None)],
)
def test_threads_follow_the_cpu_quota(tmp_path: Path, text: str, expected: int | None) -> None:
    cores = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(text)
    want = cores if expected is None else min(cores, expected)
    assert cpu_quota_threads(tmp_path / "cpu.max") == want
    assert cpu_quota_threads(tmp_path / "missing") == cores
    assert cpu_quota_threads() >= 1  # this machine's own cgroup, whatever it says
