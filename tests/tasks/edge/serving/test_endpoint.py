"""The stable endpoint forwards whatever it gets to the address in its target file, and
follows the file when it changes; errors come back with the target's own status."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from gpuflow.tasks.edge.serving.client import OipClient, OipError
from gpuflow.tasks.edge.serving.endpoint import EndpointServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

H2 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)


def test_endpoint_follows_its_target_file(mlp, start_server, tmp_path: Path) -> None:
    blue = start_server(mlp.shard_dirs[2])
    green = start_server(mlp.shard_dirs[2])
    target = tmp_path / "target"
    endpoint = EndpointServer(target)
    try:
        with OipClient(endpoint.address) as client:
            with pytest.raises(OipError) as err:
                client.infer("mlp-shard2", {"h2": H2})
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
            assert "no version of this deployment is current" in err.value.details
            target.write_text(blue.address)
            first = client.infer("mlp-shard2", {"h2": H2})
            assert client.model_ready("mlp-shard2")
            with pytest.raises(OipError) as err:  # the target's own answer, passed on
                client.infer("nope", {"h2": H2})
            assert err.value.code is grpc.StatusCode.NOT_FOUND
            blue.stop(grace_s=0)
            with pytest.raises(OipError) as err:
                client.infer("mlp-shard2", {"h2": H2})
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
            target.write_text(green.address + "\n")  # a switch: the next call goes there
            again = client.infer("mlp-shard2", {"h2": H2})
        for name in first:
            np.testing.assert_array_equal(first[name], again[name])
        with grpc.insecure_channel(endpoint.address) as channel:  # any unary method
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert check.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        endpoint.stop()


def test_endpoint_forwards_a_health_watch_stream(mlp, start_server, tmp_path: Path) -> None:
    """grpc.health.v1 Watch through the endpoint: SERVING, then NOT_SERVING when the
    version behind it shuts down, on the one stream."""
    shard = start_server(mlp.shard_dirs[2])
    target = tmp_path / "target"
    target.write_text(shard.address)
    endpoint = EndpointServer(target)
    try:
        with grpc.insecure_channel(endpoint.address) as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), timeout=30
            )
            first = next(stream)
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            shard.stop(grace_s=0.5)
            statuses = []
            with pytest.raises(grpc.RpcError) as ended:  # as it ends at the shard itself
                for response in stream:
                    statuses.append(response.status)
            assert statuses == [health_pb2.HealthCheckResponse.NOT_SERVING]
            assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        endpoint.stop()


def test_endpoint_refuses_a_taken_port(tmp_path: Path) -> None:
    first = EndpointServer(tmp_path / "t")
    try:
        with pytest.raises(OSError, match="cannot bind the endpoint"):
            EndpointServer(tmp_path / "t", port=first.port)
    finally:
        first.stop()


def test_endpoint_forwards_model_stream_infer(mlp, start_server, tmp_path: Path) -> None:
    """Triton's bidirectional ModelStreamInfer through the endpoint: several requests on
    one stream, each answered in order, an error on the stream keeping its code."""
    shard = start_server(mlp.shard_dirs[2])
    target = tmp_path / "target"
    target.write_text(shard.address)
    endpoint = EndpointServer(target)
    try:
        with OipClient(endpoint.address, streaming=True) as client:
            first = client.infer("mlp-shard2", {"h2": H2})
            with pytest.raises(OipError) as err:
                client.infer("nope", {"h2": H2})
            again = client.infer("mlp-shard2", {"h2": H2})
            assert len(client._streams._open) == 1  # one stream, through the endpoint
            assert len(shard.servicer._streams) == 1  # the endpoint kept it a stream upstream
        assert err.value.code is grpc.StatusCode.NOT_FOUND
        with OipClient(shard.address) as direct:
            want = direct.infer("mlp-shard2", {"h2": H2})
        for name in want:
            np.testing.assert_array_equal(first[name], want[name])
            np.testing.assert_array_equal(again[name], want[name])
    finally:
        endpoint.stop()
