"""Package a plan: one folder per shard with its ONNX file, manifest, a Dockerfile, and the
same shard as a Triton model repository and a KServe InferenceService (runtimes.py).

Each shard is cut out of the whole model with ``onnx.utils.extract_model`` between the
boundary tensors of the plan, so shard i's output tensor is shard i+1's input tensor under
the same name. The Dockerfile describes a serving image for the shard (written, not built
here); it takes the gpuflow source as a named build context:

    docker build --build-context gpuflow=<repo root> -t <tag> <shard folder>
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import onnx
import onnx.utils
from gpuflow.tasks.edge.cuts import GraphCuts
from gpuflow.tasks.edge.manifest import ShardManifest, TensorSpec, file_sha256, save_manifest
from gpuflow.tasks.edge.partition import Plan
from gpuflow.tasks.edge.runtimes import write_kserve_manifest, write_triton_repository
from gpuflow.tasks.edge.shard_image import SERVING_DISTRIBUTIONS, SERVING_SOURCES

SHARD_ONNX = "model.onnx"
DOCKERFILE = "Dockerfile"
SERVING_PORT = 8001
PROBE_PORT = 8000  # HTTP: /v2/health/*, /metrics (serving/probes.py)
SERVING_UID = 10001  # the image runs as this unprivileged user


@dataclass(frozen=True)
class PackagedShard:
    """A shard folder on disk and its manifest."""

    directory: Path
    manifest: ShardManifest


def shard_model_name(model_name: str, index: int) -> str:
    """The OIP model name of shard ``index`` of ``model_name``."""
    return f"{model_name}-shard{index}"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def dockerfile_text(manifest: ShardManifest) -> str:
    """A Dockerfile for a serving image of one shard (pinned to the versions used here).

    It runs as an unprivileged user; onnxruntime's threads follow the container's CPU quota
    (the server's default, shard_model.cpu_quota_threads); Docker's HEALTHCHECK asks the
    shard's own readiness endpoint."""
    pins = " ".join(
        f"{dist}=={ver}" if ver else dist
        for dist, ver in ((dist, _version(dist)) for dist in SERVING_DISTRIBUTIONS)
    )
    copies = "\n".join(
        f"COPY --from=gpuflow {' '.join(sources)} {target}" for sources, target in SERVING_SOURCES
    )
    probe = (
        "import sys, urllib.request; "
        f"r = urllib.request.urlopen('http://127.0.0.1:{PROBE_PORT}/v2/health/ready', timeout=2); "
        "sys.exit(r.status != 200)"
    )
    return f"""# syntax=docker/dockerfile:1.4
# Serving image for shard {manifest.shard_index} of {manifest.num_shards} of \
{manifest.source_model or manifest.model_name}.
# Build (the gpuflow source tree is a named build context, this folder the main one):
#   docker build --build-context gpuflow=<gpuflow repo> -t {manifest.model_name} .
FROM python:3.11-slim
RUN pip install --no-cache-dir {pins} \
 && useradd --system --uid {SERVING_UID} --no-create-home gpuflow
WORKDIR /opt/gpuflow
{copies}
COPY {manifest.onnx_file} manifest.json /shard/
USER {SERVING_UID}
# OIP gRPC (and grpc.health.v1) on {SERVING_PORT}; HTTP probes and /metrics on {PROBE_PORT}.
EXPOSE {SERVING_PORT} {PROBE_PORT}
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "{probe}"]
# The server checks model.onnx against the manifest's sha256 before it serves.
# Forwarding: add --forward-to NEXT_HOST:PORT --forward-model NEXT_MODEL (or set next_hop).
ENTRYPOINT ["python", "-m", "gpuflow.tasks.edge.serving.server", "--shard-dir", "/shard", \
"--host", "0.0.0.0", "--port", "{SERVING_PORT}", "--http-port", "{PROBE_PORT}"]
"""


def package_plan(
    onnx_path: str | Path,
    cuts: GraphCuts,
    plan: Plan,
    out_dir: str | Path,
    *,
    source_model: str,
    opset: int | None = None,
    version: str = "",
    segment_ms: list[float] | None = None,
) -> list[PackagedShard]:
    """Write ``out_dir/shard-<i>/{model.onnx,manifest.json,Dockerfile,triton/,kserve.yaml}``
    for every shard."""
    onnx_path = Path(onnx_path)
    out_dir = Path(out_dir)
    boundaries = cuts.boundaries
    k = len(plan.shards)
    packaged: list[PackagedShard] = []
    for shard in plan.shards:
        in_spec: TensorSpec = boundaries[shard.first_segment]
        out_spec: TensorSpec = boundaries[shard.stop_segment]
        shard_dir = out_dir / f"shard-{shard.index}"
        shard_dir.mkdir(parents=True, exist_ok=True)
        shard_path = shard_dir / SHARD_ONNX
        if k == 1:
            shard_path.write_bytes(onnx_path.read_bytes())
        else:
            onnx.utils.extract_model(
                str(onnx_path), str(shard_path), [in_spec.name], [out_spec.name]
            )
        cost = sum(segment_ms[shard.first_segment : shard.stop_segment]) if segment_ms else None
        manifest = ShardManifest(
            model_name=shard_model_name(source_model, shard.index),
            shard_index=shard.index,
            num_shards=k,
            onnx_file=SHARD_ONNX,
            sha256=file_sha256(shard_path),
            inputs=[in_spec],
            outputs=[out_spec],
            next_hop=None,
            source_model=source_model,
            opset=opset,
            version=version,
            cost_ms=cost,
            extra={"node": shard.node, "segments": [shard.first_segment, shard.stop_segment]},
        )
        save_manifest(manifest, shard_dir)
        (shard_dir / DOCKERFILE).write_text(dockerfile_text(manifest))
        write_triton_repository(shard_dir, manifest)
        write_kserve_manifest(shard_dir, manifest)
        packaged.append(PackagedShard(shard_dir, manifest))
    (out_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    return packaged


# --- Prefect task ---------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

package_task = task(package_plan, name="edge-package", cache_policy=NONE)
