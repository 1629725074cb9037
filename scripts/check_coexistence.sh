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
#   scripts/check_coexistence.sh mlserver-shard
#                                            (what an edge node runs: the shard server as
#                                            its image holds it, without the control plane,
#                                            beside MLServer; tasks/edge/shard_image.py)
# It takes minutes (a new environment with torch, Prefect and MLflow; less for
# mlserver-shard). Exit status 0: both installed side by side and spoke.
set -euo pipefail
which="${1:?usage: check_coexistence.sh kserve|mlserver|tritonclient|mlserver-shard}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
work="$(mktemp -d)"
venv="$work/venv"
trap 'rm -rf "$work"' EXIT
case "$which" in
  kserve) package="kserve"; stubs="kserve.protocol.grpc.grpc_predict_v2_pb2" ;;
  mlserver | mlserver-shard) package="mlserver"; stubs="mlserver.grpc.dataplane_pb2" ;;
  tritonclient) package="tritonclient[grpc]"; stubs="tritonclient.grpc.service_pb2" ;;
  *) echo "unknown package '$which': kserve, mlserver, tritonclient or mlserver-shard" >&2; exit 2 ;;
esac
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
if [ "$which" = mlserver-shard ]; then
  # The image's distributions (unpinned: pip picks what MLServer accepts) and its files.
  read -r -a serving <<< "$("$python" "$root/tasks/edge/shard_image.py" distributions)"
  "$venv/bin/python" -m pip install --quiet "$package" "${serving[@]}"
  "$python" "$root/tasks/edge/shard_image.py" lay-out "$root" "$work/image"
  # From the image's WORKDIR, as its ENTRYPOINT runs: elsewhere, the repository's own
  # gpuflow/ folder (no tasks/ in it) would shadow the laid-out package.
  cd "$work/image"
  # The server's own entry point must start far enough to parse its arguments.
  "$venv/bin/python" -m gpuflow.tasks.edge.serving.server --help > /dev/null
else
  PYTHONWARNINGS="ignore:Editable installation" "$venv/bin/python" -m pip install --quiet -e "$root" "$package"
fi
"$venv/bin/python" -m pip check
"$venv/bin/python" - "$stubs" "${package%%[*}" <<'PY'
import importlib
import importlib.metadata
import sys

import google.protobuf
import gpuflow.tasks.edge.serving  # noqa: F401 - the server, client and codec import
import gpuflow.tasks.edge.serving.server  # noqa: F401
from gpuflow.tasks.edge.serving.proto import oip

theirs = importlib.import_module(sys.argv[1])
request = oip.ModelInferRequest(model_name="m", id="r1")
request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
request.raw_input_contents.append(b"\0" * 8)
parsed = theirs.ModelInferRequest.FromString(request.SerializeToString())
assert (parsed.model_name, parsed.id, list(parsed.inputs[0].shape)) == ("m", "r1", [1, 2])
assert oip.ModelInferRequest.FromString(parsed.SerializeToString()) == request
version = importlib.metadata.version(sys.argv[2])
print(f"gpuflow and {sys.argv[2]} {version} ({sys.argv[1]}) side by side, ", end="")
print(f"protobuf {google.protobuf.__version__}: ok")
PY
