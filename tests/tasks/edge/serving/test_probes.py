"""A shard's probes as the systems that run it see them: grpc.health.v1 through grpcio's
own health client, the KServe v2 REST health endpoints over HTTP, and /metrics."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from gpuflow.tasks.edge.serving.client import OipClient, OipError
from gpuflow.tasks.edge.serving.server import ready_line, start_shard_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
H2 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)


def _check(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def _get(address: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_grpc_health_follows_the_shard_and_its_next_hop(mlp, start_server) -> None:
    tail = start_server(mlp.shard_dirs[2])
    head = start_server(mlp.shard_dirs[1], forward_to=tail.address, forward_model="mlp-shard2")
    assert _check(tail.address) == SERVING
    assert _check(head.address, "inference.GRPCInferenceService") == SERVING
    with pytest.raises(grpc.RpcError) as err:
        _check(head.address, "no.such.Service")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    tail.stop(grace_s=0)
    assert _check(head.address) == NOT_SERVING  # the head speaks for the chain


def test_watch_streams_the_change_to_not_serving(mlp) -> None:
    running = start_shard_server(mlp.shard_dirs[2], "127.0.0.1", 0, "")
    try:
        with grpc.insecure_channel(running.address) as channel:
            stream = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            assert next(stream).status == SERVING
            running.health.shutdown()  # what stop() does first
            assert next(stream).status == NOT_SERVING
            stream.cancel()
    finally:
        running.stop(grace_s=0)


def test_http_probes_answer_as_kserve_v2(mlp, start_server) -> None:
    tail = start_server(mlp.shard_dirs[2], http_port=0)
    head = start_server(
        mlp.shard_dirs[1], forward_to=tail.address, forward_model="mlp-shard2", http_port=0
    )
    assert f"http={tail.http_address}" in ready_line(tail)
    assert _get(tail.http_address, "/v2/health/live") == (200, b'{"live": true}')
    assert _get(head.http_address, "/v2/health/ready") == (200, b'{"ready": true}')
    status, body = _get(head.http_address, "/v2/models/mlp-shard1/ready")
    assert status == 200 and json.loads(body)["ready"] is True
    assert _get(head.http_address, "/v2/models/mlp-shard1/versions/9/ready")[0] == 404
    assert _get(head.http_address, "/v2/models/nope/ready")[0] == 404
    assert _get(head.http_address, "/v2/nothing")[0] == 404
    tail.stop(grace_s=0)
    assert _get(head.http_address, "/v2/health/ready") == (503, b'{"ready": false}')
    assert _get(head.http_address, "/v2/health/live")[0] == 200  # alive, just not ready


def test_metrics_count_requests_failures_and_latency(mlp, start_server) -> None:
    running = start_server(mlp.shard_dirs[2], http_port=0)
    labels = (("model", "mlp-shard2"), ("version", "1"))
    before = _samples(_get(running.http_address, "/metrics")[1].decode())
    assert before[("nv_inference_request_success_total", labels)] == 0
    with OipClient(running.address) as client:
        client.infer("mlp-shard2", {"h2": H2})
        client.infer("mlp-shard2", {"h2": H2})
        with pytest.raises(OipError):
            client.infer("mlp-shard2", {"h2": H2[:, :5]})
    status, text = _get(running.http_address, "/metrics")
    after = _samples(text.decode())
    assert status == 200
    assert after[("nv_inference_request_success_total", labels)] == 2
    assert after[("nv_inference_count_total", labels)] == 4  # two batches of 2
    assert after[("nv_inference_exec_count_total", labels)] == 2
    failed = tuple(sorted((*labels, ("reason", "REJECTED"))))
    assert after[("nv_inference_request_failure_total", failed)] == 1
    assert after[("nv_inference_pending_request_count", labels)] == 0
    assert after[("gpuflow_inference_request_duration_seconds_count", labels)] == 3
    assert after[("nv_inference_request_duration_us_total", labels)] > 0


def test_phase_counters_split_a_forwarded_call(mlp, start_server) -> None:
    """Each shard's duration holds its decode, model, encode and next hop (Triton's
    compute_input / compute_infer / compute_output, and the forward); the head's next hop
    holds the tail's whole call: what lets `gpuflow bench edge` split a hop."""
    tail = start_server(mlp.shard_dirs[2], http_port=0)
    head = start_server(
        mlp.shard_dirs[1], forward_to=tail.address, forward_model="mlp-shard2", http_port=0
    )
    h1 = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    with OipClient(head.address) as client:
        for _ in range(3):
            client.infer("mlp-shard1", {"h1": h1})

    def phases(server, model: str) -> dict[str, float]:
        labels = (("model", model), ("version", "1"))
        got = _samples(_get(server.http_address, "/metrics")[1].decode())
        names = {
            "call": "nv_inference_request_duration_us",
            "input": "nv_inference_compute_input_duration_us",
            "infer": "nv_inference_compute_infer_duration_us",
            "output": "nv_inference_compute_output_duration_us",
            "forward": "gpuflow_inference_forward_duration_us",
        }
        return {k: got[(f"{name}_total", labels)] for k, name in names.items()}

    at_head, at_tail = phases(head, "mlp-shard1"), phases(tail, "mlp-shard2")
    assert at_tail["forward"] == 0 and at_tail["output"] > 0
    assert at_head["forward"] >= at_tail["call"] > 0  # the tail's call lies inside it
    for at in (at_head, at_tail):
        assert at["input"] > 0 and at["infer"] > 0
        parts = at["input"] + at["infer"] + at["output"] + at["forward"]
        assert parts <= at["call"]


def test_http_port_is_checked_and_a_taken_one_stops_the_server(mlp) -> None:
    with pytest.raises(ValueError, match="http_port must be an int"):
        start_shard_server(mlp.shard_dirs[2], "127.0.0.1", 0, "", http_port=70000)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="cannot bind the HTTP probes"):
            start_shard_server(mlp.shard_dirs[2], "127.0.0.1", 0, "", http_port=port)
