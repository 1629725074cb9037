#!/usr/bin/env bash
# Regenerates the Open Inference Protocol (KServe v2) Python stubs in tasks/edge/serving/proto/
# from grpc_predict_v2.proto with grpcio-tools (a dev extra). Run from anywhere:
#   scripts/gen_oip_protos.sh            (uses .venv/bin/python, or $PYTHON)
# tasks/ is installed as gpuflow.tasks, so the proto is compiled in a scratch tree laid out
# as the installed package (gpuflow/tasks/edge/serving/proto/): the generated *_pb2_grpc.py
# then imports its messages as gpuflow.tasks.edge.serving.proto.grpc_predict_v2_pb2.
# The generated code pins the grpcio / protobuf runtimes it was made with; regenerate after
# changing grpcio-tools and keep pyproject.toml's grpcio/protobuf lower bounds in step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
rel=tasks/edge/serving/proto
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/gpuflow/$rel"
cp "$root/$rel/grpc_predict_v2.proto" "$scratch/gpuflow/$rel/"
cd "$scratch"
"$python" -m grpc_tools.protoc \
  --proto_path=. \
  --python_out=. \
  --pyi_out=. \
  --grpc_python_out=. \
  "gpuflow/$rel/grpc_predict_v2.proto"
cp "gpuflow/$rel"/grpc_predict_v2_pb2*.py* "$root/$rel/"
echo "generated: $(ls "$root/$rel"/grpc_predict_v2_pb2*.py*)"
