#!/usr/bin/env bash
# Installs gpuflow into a fresh virtual environment beside one of the field's own serving
# packages from PyPI, then imports both in one process and sends an OIP message from ours
# to theirs and back. CI's dev extras already hold tritonclient[grpc] (the suite runs
# tests/tasks/edge/serving/test_tritonclient.py); this covers the others:
#   scripts/check_coexistence.sh kserve      (KServe's SDK and its OIP stubs)
#   scripts/check_coexistence.sh mlserver    (Seldon's MLServer and its OIP stubs; fails
#                                            today: MLServer 1.7.1 wants fastapi<0.116,
#                                            Prefect 3.9 fastapi>=0.139; docs/edge.md)
#   scripts/check_coexistence.sh tritonclient
# It takes minutes (a new environment with torch, Prefect and MLflow). Exit status 0: both
# installed side by side and spoke.
set -euo pipefail
which="${1:?usage: check_coexistence.sh kserve|mlserver|tritonclient}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
case "$which" in
  kserve) package="kserve"; stubs="kserve.protocol.grpc.grpc_predict_v2_pb2" ;;
  mlserver) package="mlserver"; stubs="mlserver.grpc.dataplane_pb2" ;;
  tritonclient) package="tritonclient[grpc]"; stubs="tritonclient.grpc.service_pb2" ;;
  *) echo "unknown package '$which': kserve, mlserver or tritonclient" >&2; exit 2 ;;
esac
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
PYTHONWARNINGS="ignore:Editable installation" "$venv/bin/python" -m pip install --quiet -e "$root" "$package"
"$venv/bin/python" -m pip check
"$venv/bin/python" - "$stubs" <<'PY'
import importlib
import sys

import google.protobuf
import gpuflow.tasks.edge.serving  # noqa: F401 - the server, client and codec import
from gpuflow.tasks.edge.serving.proto import oip

theirs = importlib.import_module(sys.argv[1])
request = oip.ModelInferRequest(model_name="m", id="r1")
request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
request.raw_input_contents.append(b"\0" * 8)
parsed = theirs.ModelInferRequest.FromString(request.SerializeToString())
assert (parsed.model_name, parsed.id, list(parsed.inputs[0].shape)) == ("m", "r1", [1, 2])
assert oip.ModelInferRequest.FromString(parsed.SerializeToString()) == request
print(f"gpuflow and {sys.argv[1]} side by side, protobuf {google.protobuf.__version__}: ok")
PY
