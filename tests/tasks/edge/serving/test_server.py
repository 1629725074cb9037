"""The OIP shard server in-process: every RPC, malformed requests, big tensors, bad shards."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from gpuflow.tasks.edge.manifest import ManifestError, ShardIntegrityError, load_manifest
from gpuflow.tasks.edge.serving.client import OipClient, OipError
from gpuflow.tasks.edge.serving.codec import build_infer_request
from gpuflow.tasks.edge.serving.proto import oip as pb
from gpuflow.tasks.edge.serving.server import PLATFORM, SERVER_NAME, ShardServer

X = np.array([[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, -0.5, 3.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def head(mlp_servers: list[ShardServer]) -> ShardServer:
    return mlp_servers[0]


@pytest.fixture(scope="module")
def client(head: ShardServer):
    with OipClient(head.address, timeout_s=10) as c:
        yield c


def test_health_and_metadata_rpcs(head: ShardServer, client: OipClient) -> None:
    assert client.server_live() is True
    assert client.server_ready() is True
    assert client.model_ready("mlp-shard0") is True
    assert client.model_ready("mlp-shard1") is False  # served elsewhere, not here
    assert client.model_ready("mlp-shard0", version="7") is False
    server = client.server_metadata()
    assert (
        server.name == SERVER_NAME
        and server.version
        and server.extensions == ("system_shared_memory",)
    )
    meta = client.model_metadata("mlp-shard0")
    assert meta.name == "mlp-shard0" and meta.platform == PLATFORM and meta.versions == ()
    assert [(t.name, t.datatype, t.shape) for t in meta.inputs] == [("x", "FP32", (-1, 4))]
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [("h1", "FP32", (-1, 8))]
    with pytest.raises(OipError) as err:
        client.model_metadata("resnet50")
    assert err.value.code is grpc.StatusCode.NOT_FOUND
    assert "'resnet50'" in err.value.details and "mlp-shard0" in err.value.details


def test_infer_matches_the_full_model_prefix(mlp, client: OipClient) -> None:
    h1 = client.infer("mlp-shard0", {"x": X})["h1"]
    w1, b1 = _initializer(mlp.full_onnx, "w1"), _initializer(mlp.full_onnx, "b1")
    np.testing.assert_allclose(h1, np.maximum(X @ w1 + b1, 0), rtol=1e-6, atol=1e-6)
    assert h1.shape == (2, 8) and h1.dtype == np.float32


def test_request_id_is_echoed_and_requested_outputs_filter(
    mlp, mlp_servers: list[ShardServer]
) -> None:
    with OipClient(mlp_servers[2].address) as last:
        h2 = np.abs(np.random.default_rng(1).standard_normal((3, 6))).astype(np.float32)
        request = build_infer_request("mlp-shard2", {"h2": h2}, ["probs"], request_id="req-42")
        response = last.infer_request(request)
        assert response.id == "req-42" and response.model_name == "mlp-shard2"
        assert [o.name for o in response.outputs] == ["probs"]
        both = last.infer("mlp-shard2", {"h2": h2})
        assert list(both) == ["y", "probs"]
        np.testing.assert_allclose(both["probs"].sum(axis=1), 1.0, rtol=1e-5)


def _good() -> pb.ModelInferRequest:
    return build_infer_request("mlp-shard0", {"x": X})


def _with(**changes) -> pb.ModelInferRequest:
    request = _good()
    for key, value in changes.items():
        if key == "shape":
            del request.inputs[0].shape[:]
            request.inputs[0].shape.extend(value)
        elif key in ("name", "datatype"):
            setattr(request.inputs[0], key, value)
        else:
            setattr(request, key, value)
    return request


def _extra_input() -> pb.ModelInferRequest:
    request = _good()
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.raw_input_contents.append(request.raw_input_contents[0])
    return request


def _short_bytes() -> pb.ModelInferRequest:
    request = _good()
    request.raw_input_contents[0] = request.raw_input_contents[0][:-4]
    return request


def _missing_raw() -> pb.ModelInferRequest:
    request = _good()
    del request.raw_input_contents[:]
    return request


def _no_inputs() -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="mlp-shard0")


def _unknown_output() -> pb.ModelInferRequest:
    request = _good()
    request.outputs.add(name="logits")
    return request


UNKNOWN = {
    "unknown model": (lambda: _with(model_name="resnet50"), "model 'resnet50' is not served"),
    "unknown version": (lambda: _with(model_version="3"), "has no version '3'"),
}
MALFORMED = {
    "wrong input name": (lambda: _with(name="input"), "has no input 'input'"),
    "wrong datatype": (lambda: _with(datatype="FP64"), "datatype 'FP64' but model"),
    "unknown datatype": (lambda: _with(datatype="FLOAT"), "datatype 'FLOAT' but model"),
    "wrong rank": (lambda: _with(shape=[8]), "shape [8] does not match"),
    "wrong dim": (lambda: _with(shape=[4, 2]), "shape [4, 2] does not match"),
    "negative dim": (lambda: _with(shape=[-2, 4]), "shape [-2, 4] does not match"),
    "byte size": (_short_bytes, "raw contents are 28 bytes but shape [2, 4]"),
    "no contents": (_missing_raw, "fp32_contents holds 0 elements"),
    "repeated input": (_extra_input, "input 'x' is given twice"),
    "missing input": (_no_inputs, r"inputs \['x'\] are missing"),
    "unknown output": (_unknown_output, r"has no outputs \['logits'\]"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_is_invalid_argument_and_server_keeps_serving(
    case: str, client: OipClient
) -> None:
    make, expected = MALFORMED[case]
    with pytest.raises(OipError) as err:
        client.infer_request(make())
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert expected.replace("\\", "") in err.value.details or pytest.fail(
        f"{expected!r} not in {err.value.details!r}"
    )
    # The same server still answers a good request.
    assert client.infer("mlp-shard0", {"x": X})["h1"].shape == (2, 8)


@pytest.mark.parametrize("case", sorted(UNKNOWN))
def test_an_unknown_model_is_not_found_as_triton_answers(case: str, client: OipClient) -> None:
    make, expected = UNKNOWN[case]
    with pytest.raises(OipError) as err:
        client.infer_request(make())
    assert err.value.code is grpc.StatusCode.NOT_FOUND, err.value
    assert expected in err.value.details
    assert client.infer("mlp-shard0", {"x": X})["h1"].shape == (2, 8)


def test_typed_contents_request_is_served(client: OipClient) -> None:
    request = pb.ModelInferRequest(model_name="mlp-shard0")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    tensor.contents.fp32_contents.extend(X.ravel().tolist())
    typed = client.infer_request(request)
    raw = client.infer("mlp-shard0", {"x": X})
    np.testing.assert_array_equal(
        np.frombuffer(typed.raw_output_contents[0], np.float32).reshape(2, 8), raw["h1"]
    )


def test_activation_over_4_mib_passes_both_ways(big, start_server) -> None:
    server = start_server(big.shard_dirs[0])
    a = np.linspace(-1, 1, big_elements(big), dtype=np.float32).reshape(1, -1)
    assert a.nbytes > 5 * 1024 * 1024
    with OipClient(server.address) as c:
        h = c.infer("big-shard0", {"a": a})["h"]
    np.testing.assert_array_equal(h, 2 * a)


def test_default_grpc_limit_would_refuse_that_activation(big, start_server) -> None:
    """Why the limits are raised: a stock channel cannot take the 6.4 MB answer."""
    server = start_server(big.shard_dirs[0])
    a = np.zeros((1, big_elements(big)), np.float32)
    request = build_infer_request("big-shard0", {"a": a})
    options = [("grpc.max_send_message_length", 64 << 20)]  # receive stays at 4 MiB
    with grpc.insecure_channel(server.address, options=options) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def big_elements(big) -> int:
    return load_manifest(big.shard_dirs[0]).inputs[0].shape[1]


def _initializer(onnx_path: Path, name: str) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(onnx_path)
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def test_tampered_shard_refuses_to_start(mlp, start_server, tmp_path: Path) -> None:
    shard = _copy_shard(mlp.shard_dirs[1], tmp_path / "tampered")
    with open(shard / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ShardIntegrityError, match="sha256 mismatch"):
        start_server(shard)


def test_manifest_that_disagrees_with_the_graph_refuses_to_start(
    mlp, start_server, tmp_path: Path
) -> None:
    shard = _copy_shard(mlp.shard_dirs[1], tmp_path / "renamed")
    data = json.loads((shard / "manifest.json").read_text())
    data["inputs"][0]["name"] = "hidden"
    (shard / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="manifest input 'hidden' is not a graph input"):
        start_server(shard)
    data["inputs"][0]["name"] = "h1"
    data["inputs"][0]["dtype"] = "FP16"
    (shard / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="FP16 in the manifest but FP32 in the ONNX file"):
        start_server(shard)


def test_forwarding_needs_the_next_model_name(mlp, start_server: Callable) -> None:
    with pytest.raises(ManifestError, match="needs the next shard's model name"):
        start_server(mlp.shard_dirs[0], forward_to="127.0.0.1:9")


def test_taken_port_is_an_error_not_a_shared_port(mlp, head: ShardServer, start_server) -> None:
    with pytest.raises(OSError, match="cannot bind"):
        start_server(mlp.shard_dirs[0], port=head.port)


def test_stop_turns_readiness_off_then_closes(mlp, start_server) -> None:
    server = start_server(mlp.shard_dirs[0])
    with OipClient(server.address, timeout_s=2) as c:
        assert c.server_ready()
        server.stop(grace_s=0.2)
        with pytest.raises(OipError) as err:
            c.server_live()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert server.address in str(err.value) and "ServerLive" in str(err.value)


def test_client_rejects_bad_arguments_before_connecting() -> None:
    with pytest.raises(ManifestError, match="host:port"):
        OipClient("localhost")
    with pytest.raises(ValueError, match="timeout_s"):
        OipClient("127.0.0.1:1", timeout_s=0)


def test_wait_until_ready_times_out_with_the_reason() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        OipClient(f"127.0.0.1:{port}", timeout_s=1) as c,
        pytest.raises(TimeoutError, match="not ready after 0.3 s: ServerReady"),
    ):
        c.wait_until_ready("m", timeout_s=0.3, poll_s=0.05)


def _copy_shard(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst
