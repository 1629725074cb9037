#!/usr/bin/env bash
# Rebuilds the Open Inference Protocol (KServe v2) descriptor that gpuflow's OIP messages
# are made from: tasks/edge/serving/proto/grpc_predict_v2.binpb, a serialized
# FileDescriptorSet of grpc_predict_v2.proto. Run from anywhere after editing the .proto:
#   scripts/gen_oip_protos.sh            (uses .venv/bin/python, or $PYTHON)
# It needs grpcio-tools (`pip install grpcio-tools`, any version: a descriptor set is the
# same bytes whichever protoc wrote it). No Python code is generated: oip.py builds the
# message classes from the descriptor at import, in a descriptor pool of its own, so they
# work on every protobuf runtime from 6.31 on and never clash with KServe's, Triton's or
# MLServer's stubs of the same `inference` package in one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
rel=tasks/edge/serving/proto
"$python" -m grpc_tools.protoc \
  --proto_path="$root/$rel" \
  --descriptor_set_out="$root/$rel/grpc_predict_v2.binpb" \
  grpc_predict_v2.proto
echo "generated: $root/$rel/grpc_predict_v2.binpb"
