"""Any OIP client can call a shard: the bare generated stub, no gpuflow client code, talks to
the server by the protocol's wire names alone."""

from __future__ import annotations

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from gpuflow.tasks.edge.serving.proto import oip as pb


def test_wire_names_are_the_protocols() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    assert [m.name for m in service.methods] == [
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        # Triton's streaming inference (stream.py)
        "ModelStreamInfer",
        # Triton's system shared-memory extension (shm.py)
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
    ]
    request = pb.ModelInferRequest.DESCRIPTOR.fields_by_name
    assert request["raw_input_contents"].number == 7
    assert pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number == 6
    stream = service.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    assert stream.output_type.full_name == "inference.ModelStreamInferResponse"
    fields = pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name
    assert (fields["error_message"].number, fields["infer_response"].number) == (1, 2)


def test_bare_stub_runs_every_rpc(mlp, mlp_servers) -> None:
    address = mlp_servers[2].address
    with grpc.insecure_channel(address) as channel:
        stub = pb.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="mlp-shard2"), timeout=5).ready
        assert stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=5).name
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp-shard2"), timeout=5)
        assert [i.name for i in meta.inputs] == ["h2"]

        h2 = np.arange(12, dtype=np.float32).reshape(2, 6) / 10
        request = pb.ModelInferRequest(model_name="mlp-shard2", id="bare")
        request.inputs.add(name="h2", datatype="FP32", shape=[2, 6])
        request.raw_input_contents.append(h2.tobytes())
        request.outputs.add(name="y")
        response = stub.ModelInfer(request, timeout=5)

    assert response.id == "bare"
    (out,) = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("y", "FP32", [2, 3])
    y = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 3)
    session = ort.InferenceSession(
        str(mlp.shard_dirs[2] / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_array_equal(y, session.run(["y"], {"h2": h2})[0])


def test_bare_stub_sees_invalid_argument(mlp_servers) -> None:
    with grpc.insecure_channel(mlp_servers[2].address) as channel:
        stub = pb.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="mlp-shard2")
        request.inputs.add(name="h2", datatype="FP32", shape=[1, 6])
        request.raw_input_contents.append(b"\0" * 23)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=5)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "23 bytes" in err.value.details()
