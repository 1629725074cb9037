"""NVIDIA's tritonclient (from PyPI, a dev extra) beside gpuflow: in one environment and
one process with our OIP messages, and as an independent client of a shard and of a
forwarding chain's head."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from gpuflow.tasks.edge.serving.proto import oip
from tritonclient.grpc import service_pb2 as triton_pb

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 10


def test_both_message_sets_live_in_one_process_and_agree_on_the_wire() -> None:
    """Triton's stubs sit in protobuf's default pool under the same `inference` names;
    ours in a pool of their own: no duplicate symbol, and each side parses the other."""
    ours = oip.ModelInferRequest(model_name="m", id="r1")
    tensor = ours.inputs.add(name="x", datatype="FP32", shape=[3, 4])
    tensor.parameters["binary_data_size"].int64_param = 48
    ours.raw_input_contents.append(X.tobytes())
    ours.outputs.add(name="y")
    theirs = triton_pb.ModelInferRequest.FromString(ours.SerializeToString())
    assert (theirs.model_name, theirs.id, theirs.outputs[0].name) == ("m", "r1", "y")
    assert list(theirs.inputs[0].shape) == [3, 4]
    assert theirs.inputs[0].parameters["binary_data_size"].int64_param == 48
    assert theirs.raw_input_contents[0] == X.tobytes()
    back = oip.ModelInferRequest.FromString(theirs.SerializeToString())
    assert back == ours
    assert (
        oip.ModelInferRequest.DESCRIPTOR.full_name
        == triton_pb.ModelInferRequest.DESCRIPTOR.full_name
    )
    assert oip.ModelInferRequest.DESCRIPTOR.file.pool is not triton_pb.DESCRIPTOR.pool


def test_tritonclient_runs_a_shard(mlp, mlp_servers) -> None:
    h2 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    client = triton.InferenceServerClient(url=mlp_servers[2].address)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("mlp-shard2")
        meta = client.get_model_metadata("mlp-shard2")
        assert [i.name for i in meta.inputs] == ["h2"]
        assert {o.name for o in meta.outputs} == {"y", "probs"}
        tensor = triton.InferInput("h2", list(h2.shape), "FP32")
        tensor.set_data_from_numpy(h2)
        result = client.infer("mlp-shard2", [tensor], request_id="t1")
    finally:
        client.close()
    assert result.get_response().id == "t1"
    session = ort.InferenceSession(
        str(mlp.shard_dirs[2] / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    y, probs = session.run(["y", "probs"], {"h2": h2})
    np.testing.assert_array_equal(result.as_numpy("y"), y)
    np.testing.assert_array_equal(result.as_numpy("probs"), probs)


def test_tritonclient_runs_the_chain_through_its_head(mlp, mlp_forwarding) -> None:
    client = triton.InferenceServerClient(url=mlp_forwarding[0].address)
    try:
        assert client.is_model_ready("mlp-shard0")
        meta = client.get_model_metadata("mlp-shard0")
        assert [i.name for i in meta.inputs] == ["x"]
        # The head describes what it returns: the chain's outputs, not its own h1.
        assert {o.name for o in meta.outputs} == {"y", "probs"}
        tensor = triton.InferInput("x", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        wanted = [triton.InferRequestedOutput("probs")]
        result = client.infer("mlp-shard0", [tensor], outputs=wanted)
    finally:
        client.close()
    expected = mlp.reference({"x": X})["probs"]
    np.testing.assert_allclose(result.as_numpy("probs"), expected, rtol=1e-5, atol=1e-6)
    assert result.as_numpy("y") is None  # only what was asked for comes back


def test_tritonclient_sees_a_bad_request_refused(mlp_servers) -> None:
    client = triton.InferenceServerClient(url=mlp_servers[2].address)
    try:
        tensor = triton.InferInput("h2", [2, 5], "FP32")  # the shard takes [N, 6]
        tensor.set_data_from_numpy(np.zeros((2, 5), dtype=np.float32))
        with pytest.raises(triton.InferenceServerException) as err:
            client.infer("mlp-shard2", [tensor])
    finally:
        client.close()
    assert "INVALID_ARGUMENT" in str(err.value.status())


def test_the_shared_memory_messages_are_tritons() -> None:
    """Field names, numbers and types of the extension's messages, as Triton defines them."""

    def fields(descriptor) -> list[tuple[str, int, int, int]]:
        out = [(f.name, f.number, f.type, f.label) for f in descriptor.fields]
        for nested in descriptor.nested_types:
            out += [(f"{nested.name}.{n}", *rest) for n, *rest in fields(nested)]
        return sorted(out)

    for name in (
        "SystemSharedMemoryStatusRequest",
        "SystemSharedMemoryStatusResponse",
        "SystemSharedMemoryRegisterRequest",
        "SystemSharedMemoryRegisterResponse",
        "SystemSharedMemoryUnregisterRequest",
        "SystemSharedMemoryUnregisterResponse",
    ):
        ours = getattr(oip, name).DESCRIPTOR
        assert fields(ours) == fields(getattr(triton_pb, name).DESCRIPTOR), name


def test_tritonclient_shared_memory_against_a_shard(mlp, mlp_whole) -> None:
    """tritonclient's own shared-memory utilities: input and output in system shared
    memory registered with our server, nothing but metadata on the wire."""
    import tritonclient.utils.shared_memory as triton_shm

    key = f"/gpuflow-tritonclient-{os.getpid()}"
    handle = triton_shm.create_shared_memory_region("tc-region", key, 4096)
    client = triton.InferenceServerClient(url=mlp_whole.address)
    try:
        triton_shm.set_shared_memory_region(handle, [X])
        client.register_system_shared_memory("tc-region", key, 4096)
        status = client.get_system_shared_memory_status(as_json=True)
        assert status["regions"]["tc-region"]["key"] == key
        tensor = triton.InferInput("x", list(X.shape), "FP32")
        tensor.set_shared_memory("tc-region", X.nbytes)
        wanted = triton.InferRequestedOutput("y")
        wanted.set_shared_memory("tc-region", 3 * 3 * 4, offset=1024)
        result = client.infer("mlp-whole", [tensor], outputs=[wanted])
        out = result.get_output("y")
        assert out.parameters["shared_memory_region"].string_param == "tc-region"
        assert not any(result.get_response().raw_output_contents)  # nothing on the wire
        y = triton_shm.get_contents_as_numpy(handle, np.float32, [3, 3], offset=1024)
        np.testing.assert_array_equal(y, mlp.reference({"x": X})["y"])
        client.unregister_system_shared_memory("tc-region")
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
    finally:
        client.close()
        triton_shm.destroy_shared_memory_region(handle)


def test_tritonclient_streams_to_the_chain_head(mlp, mlp_forwarding) -> None:
    """Triton's streaming API (start_stream / async_stream_infer) against our
    ModelStreamInfer: answers in order, an error reported on the stream, the stream on."""
    import queue

    answers: queue.SimpleQueue = queue.SimpleQueue()
    client = triton.InferenceServerClient(url=mlp_forwarding[0].address)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = triton.InferInput("x", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        client.async_stream_infer("mlp-shard0", [tensor], request_id="s1")
        client.async_stream_infer("nope", [tensor], request_id="s2")
        client.async_stream_infer("mlp-shard0", [tensor], request_id="s3")
        got = [answers.get(timeout=30) for _ in range(3)]
        client.stop_stream()
    finally:
        client.close()
    expected = mlp.reference({"x": X})["probs"]
    for result, error in (got[0], got[2]):
        assert error is None
        np.testing.assert_allclose(result.as_numpy("probs"), expected, rtol=1e-5, atol=1e-6)
    assert [got[0][0].get_response().id, got[2][0].get_response().id] == ["s1", "s3"]
    assert got[1][0] is None and "NOT_FOUND" in got[1][1].message()
