"""Every shard in the field's own serving runtimes too: a Triton model repository and a
KServe InferenceService, beside gpuflow's own server (package.py writes all three).

* Triton: ``triton/<model>/config.pbtxt`` and ``triton/<model>/1/model.onnx`` (Triton's
  model repository layout; ``tritonserver --model-repository=<shard>/triton``). The
  config is text protobuf of Triton's ModelConfig: platform ``onnxruntime_onnx``,
  ``max_batch_size: 0`` (the shapes carry their batch dimension as -1, as the manifest's
  do), the inputs and outputs with Triton's data types, one instance.
* KServe: ``kserve.yaml``, an InferenceService (serving.kserve.io/v1beta1) whose predictor
  serves that repository with KServe's Triton runtime over the v2 protocol (gRPC on the
  h2c port), the shard's sha256 as an annotation. ``storageUri`` is where the operator
  puts the ``triton/`` folder (an S3 or PVC path): the argument, or a placeholder to edit.

Tests parse the config with Triton's own ModelConfig message (tritonclient ships it).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import yaml
from gpuflow.tasks.edge.manifest import ShardManifest, TensorSpec

TRITON_DIR = "triton"
KSERVE_FILE = "kserve.yaml"
TRITON_PLATFORM = "onnxruntime_onnx"
KSERVE_GRPC_PORT = 9000  # KServe's default container port for a v2 gRPC predictor
# KServe's datatypes are Triton's without the prefix, except BYTES (TYPE_STRING).
_TRITON_TYPE = {"BYTES": "TYPE_STRING"}


def triton_type(dtype: str) -> str:
    return _TRITON_TYPE.get(dtype, f"TYPE_{dtype}")


def _tensor_block(kind: str, specs: list[TensorSpec]) -> list[str]:
    lines = []
    for spec in specs:
        dims = ", ".join(str(int(d)) for d in spec.shape)
        lines += [
            f"{kind} [",
            "  {",
            f'    name: "{spec.name}"',
            f"    data_type: {triton_type(spec.dtype)}",
            f"    dims: [ {dims} ]",
            "  }",
            "]",
        ]
    return lines


def triton_config_text(manifest: ShardManifest) -> str:
    """config.pbtxt of the shard as a Triton model."""
    lines = [
        f'name: "{manifest.model_name}"',
        f'platform: "{TRITON_PLATFORM}"',
        "max_batch_size: 0",
        *_tensor_block("input", manifest.inputs),
        *_tensor_block("output", manifest.outputs),
        "instance_group [ { count: 1, kind: KIND_AUTO } ]",
    ]
    return "\n".join(lines) + "\n"


def write_triton_repository(shard_dir: Path, manifest: ShardManifest) -> Path:
    """``shard_dir/triton/<model>/{config.pbtxt,1/model.onnx}``; returns the repository."""
    repo = shard_dir / TRITON_DIR
    model_dir = repo / manifest.model_name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    target = version_dir / "model.onnx"
    target.unlink(missing_ok=True)
    source = shard_dir / manifest.onnx_file
    try:
        os.link(source, target)  # the same bytes, not twice on disk
    except OSError:
        shutil.copyfile(source, target)
    (model_dir / "config.pbtxt").write_text(triton_config_text(manifest))
    return repo


def kserve_name(model_name: str) -> str:
    """An InferenceService name (a DNS-1035 label: lower case, digits, '-', 63 at most)."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"m-{name}".rstrip("-")
    return name[:63].rstrip("-")


def kserve_manifest(manifest: ShardManifest, storage_uri: str | None = None) -> dict:
    where = storage_uri or f"s3://CHANGE-ME/{manifest.model_name}/{TRITON_DIR}"
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": kserve_name(manifest.model_name),
            "annotations": {
                "gpuflow.io/model-name": manifest.model_name,
                "gpuflow.io/shard": f"{manifest.shard_index}/{manifest.num_shards}",
                "gpuflow.io/sha256": manifest.sha256,
            },
        },
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "onnx"},
                    "protocolVersion": "v2",
                    "runtime": "kserve-tritonserver",
                    "storageUri": where,
                    "ports": [
                        {"name": "h2c", "protocol": "TCP", "containerPort": KSERVE_GRPC_PORT}
                    ],
                }
            }
        },
    }


def write_kserve_manifest(
    shard_dir: Path, manifest: ShardManifest, storage_uri: str | None = None
) -> Path:
    path = shard_dir / KSERVE_FILE
    path.write_text(yaml.safe_dump(kserve_manifest(manifest, storage_uri), sort_keys=False))
    return path
