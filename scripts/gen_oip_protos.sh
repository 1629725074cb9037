#!/usr/bin/env bash
# Regenerates the Open Inference Protocol (KServe v2) Python stubs in tasks/edge/serving/proto/
# from grpc_predict_v2.proto with grpcio-tools (a dev extra). Run from anywhere:
#   scripts/gen_oip_protos.sh            (uses .venv/bin/python, or $PYTHON)
# The proto is compiled relative to the repository root so the generated *_pb2_grpc.py imports
# its messages as tasks.edge.serving.proto.grpc_predict_v2_pb2 (no sys.path tricks needed).
# The generated code pins the grpcio / protobuf runtimes it was made with; regenerate after
# changing grpcio-tools and keep pyproject.toml's grpcio/protobuf lower bounds in step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
cd "$root"
"$python" -m grpc_tools.protoc \
  --proto_path=. \
  --python_out=. \
  --pyi_out=. \
  --grpc_python_out=. \
  tasks/edge/serving/proto/grpc_predict_v2.proto
echo "generated: $(ls tasks/edge/serving/proto/grpc_predict_v2_pb2*.py*)"
