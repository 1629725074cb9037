"""Hops on persistent ModelStreamInfer streams: one stream carries many requests, a
request's error keeps its status code and the stream goes on, a stopped next hop ends its
streams at once and the head falls back to a unary call, a late answer is
DEADLINE_EXCEEDED, and /metrics counts requests that came on a stream."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from gpuflow.tasks.edge.serving.client import OipClient, OipError
from gpuflow.tasks.edge.serving.proto import oip as pb
from gpuflow.tasks.edge.serving.stream import (
    StreamBroken,
    StreamPool,
    parse_stream_error,
    stream_error,
)
from prometheus_client.parser import text_string_to_metric_families

X = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
H2 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)


def _metrics(http_address: str) -> dict[str, float]:
    """Sample name -> value, summed over labels."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_a_stream_error_keeps_its_status_code_and_free_text_is_unknown() -> None:
    text = stream_error(grpc.StatusCode.NOT_FOUND, "model 'x': not here: at all")
    assert parse_stream_error(text) == (grpc.StatusCode.NOT_FOUND, "model 'x': not here: at all")
    assert parse_stream_error("inference failed") == (
        grpc.StatusCode.UNKNOWN,
        "inference failed",
    )
    assert parse_stream_error("OK: fine")[0] is grpc.StatusCode.UNKNOWN  # never a success


def test_a_forwarding_chain_sends_every_hop_on_one_open_stream(mlp, start_server) -> None:
    tail = start_server(mlp.shard_dirs[2], forward_to="")
    mid = start_server(mlp.shard_dirs[1], forward_to=tail.address, forward_model="mlp-shard2")
    head = start_server(mlp.shard_dirs[0], forward_to=mid.address, forward_model="mlp-shard1")
    with OipClient(head.address) as client:  # the caller's own hop is unary
        for _ in range(5):
            got = client.infer("mlp-shard0", {"x": X})
            np.testing.assert_allclose(got["probs"], mlp.reference({"x": X})["probs"], rtol=1e-5)
    for upstream, downstream in ((head, mid), (mid, tail)):
        assert len(upstream.servicer.next_hop.client._streams._open) == 1
        assert len(downstream.servicer._streams) == 1


def test_an_error_on_the_stream_keeps_its_code_and_the_stream_goes_on(mlp, start_server) -> None:
    tail = start_server(mlp.shard_dirs[2], forward_to="", http_port=0)
    with OipClient(tail.address, streaming=True) as client:
        client.infer("mlp-shard2", {"h2": H2})
        with pytest.raises(OipError) as bad_shape:
            client.infer("mlp-shard2", {"h2": H2[:, :5]})
        with pytest.raises(OipError) as unknown:
            client.infer("nope", {"h2": H2})
        client.infer("mlp-shard2", {"h2": H2})
        assert len(client._streams._open) == 1  # the same stream throughout
    assert bad_shape.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "h2" in bad_shape.value.details
    assert unknown.value.code is grpc.StatusCode.NOT_FOUND
    m = _metrics(tail.http_address)
    assert m["nv_inference_request_success_total"] == 2
    assert m["nv_inference_request_failure_total"] == 2
    assert m["nv_inference_pending_request_count"] == 0
    assert m["gpuflow_inference_request_duration_seconds_count"] == 4


def test_a_stopped_next_hop_ends_its_streams_and_the_head_falls_back(mlp, start_server) -> None:
    tail = start_server(mlp.shard_dirs[2], forward_to="")
    port = tail.port
    head = start_server(mlp.shard_dirs[1], forward_to=tail.address, forward_model="mlp-shard2")
    h1 = np.abs(np.random.default_rng(1).standard_normal((2, 8))).astype(np.float32)
    with OipClient(head.address) as client:
        client.infer("mlp-shard1", {"h1": h1})
        assert len(tail.servicer._streams) == 1
        started = time.monotonic()
        tail.stop(grace_s=60.0)  # an open stream would hold the whole grace period
        assert time.monotonic() - started < 30.0
        assert tail.servicer._streams == set()
        with pytest.raises(OipError) as gone:
            client.infer("mlp-shard1", {"h1": h1})
        assert gone.value.code is grpc.StatusCode.UNAVAILABLE  # the unary call's answer
        # Back at the same address (as the supervisor restarts it): a new stream.
        again = start_server(mlp.shard_dirs[2], port=port, forward_to="")
        client.wait_until_ready("mlp-shard1", timeout_s=30.0)  # the head's channel reconnects
        got = client.infer("mlp-shard1", {"h1": h1})
        assert set(got) == {"y", "probs"}
        assert len(again.servicer._streams) == 1


def test_a_late_answer_is_deadline_exceeded_and_its_stream_dropped() -> None:
    gate = threading.Event()  # the server answers only once the test opens it

    def hold(requests, context):
        for request in requests:
            gate.wait(30)
            yield pb.ModelStreamInferResponse(
                infer_response=pb.ModelInferResponse(model_name=request.model_name)
            )

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.stream_stream_rpc_method_handler(
        hold,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(pb.SERVICE, {"ModelStreamInfer": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    pool = StreamPool(
        pb.GRPCInferenceServiceStub(channel).ModelStreamInfer,
        lambda code, details: OipError("ModelInfer", "here", code, details),
    )
    try:
        with pytest.raises(OipError) as late:
            pool.infer(pb.ModelInferRequest(model_name="m"), timeout_s=0.3)
        assert late.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert pool._open == set() and pool._idle == []
        gate.set()
        answer = pool.infer(pb.ModelInferRequest(model_name="m2"), timeout_s=30.0)
        assert answer.model_name == "m2"
    finally:
        gate.set()
        pool.close()
        channel.close()
        server.stop(0)


def test_streams_are_capped_and_a_closed_pool_sends_nothing() -> None:
    opened = []

    class Ended:
        """A call the server ended at once: the exchange finds the stream broken."""

        def __next__(self):
            raise StopIteration

        def cancel(self) -> None:
            pass

    def open_call(requests):
        opened.append(requests)
        return Ended()

    pool = StreamPool(open_call, lambda code, details: RuntimeError(details), max_streams=0)
    with pytest.raises(StreamBroken, match="no idle stream"):
        pool.infer(pb.ModelInferRequest(), 1.0)
    assert opened == []
    pool = StreamPool(open_call, lambda code, details: RuntimeError(details), max_streams=1)
    with pytest.raises(StreamBroken, match="ended the stream"):
        pool.infer(pb.ModelInferRequest(), 1.0)
    assert len(opened) == 1 and pool._open == set()  # the broken one was dropped
    pool.close()
    with pytest.raises(StreamBroken):
        pool.infer(pb.ModelInferRequest(), 1.0)
    assert len(opened) == 1
    with pytest.raises(ValueError, match="max_streams"):
        StreamPool(open_call, RuntimeError, max_streams=-1)
