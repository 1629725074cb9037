"""Chains of shard servers: driver == forwarding == the unsplit model, pipelined, errors."""

from __future__ import annotations

import socket

import grpc
import numpy as np
import pytest
from gpuflow.tasks.edge.serving.chain import (
    ChainDriver,
    pipelined_driver,
    pipelined_forwarding,
    run_chain_driver,
    run_chain_forwarding,
    run_pipelined,
)
from gpuflow.tasks.edge.serving.client import OipClient, OipError
from gpuflow.tasks.edge.serving.server import ShardServer

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4)).astype(np.float32)


def _addresses(servers: list[ShardServer]) -> list[str]:
    return [s.address for s in servers]


def test_driver_forwarding_and_unsplit_model_agree(
    mlp, mlp_servers, mlp_forwarding, mlp_whole
) -> None:
    reference = mlp.reference({"x": X})
    driven = run_chain_driver(_addresses(mlp_servers), mlp.model_names, {"x": X})
    forwarded = run_chain_forwarding(mlp_forwarding[0].address, "mlp-shard0", {"x": X})
    with OipClient(mlp_whole.address) as whole:
        served_whole = whole.infer("mlp-whole", {"x": X})
    for result in (driven, forwarded, served_whole):
        assert list(result) == ["y", "probs"]
        for name in reference:
            np.testing.assert_allclose(result[name], reference[name], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(driven["y"], forwarded["y"])


def test_forwarding_head_passes_requested_outputs_and_id(mlp_forwarding) -> None:
    from gpuflow.tasks.edge.serving.codec import build_infer_request, decode_response

    with OipClient(mlp_forwarding[0].address) as head:
        response = head.infer_request(
            build_infer_request("mlp-shard0", {"x": X}, ["probs"], request_id="r1")
        )
        assert head.server_ready() and head.model_ready("mlp-shard0")
    assert response.id == "r1" and list(decode_response(response)) == ["probs"]


def test_driver_reports_each_hop(mlp, mlp_servers) -> None:
    with ChainDriver(_addresses(mlp_servers), mlp.model_names) as driver:
        outputs, hop_s = driver.infer_timed({"x": X})
    assert len(hop_s) == 3 and all(t > 0 for t in hop_s)
    assert outputs["probs"].shape == (3, 3)


def test_pipelined_runs_keep_each_answer_with_its_request(mlp, mlp_servers, mlp_forwarding) -> None:
    requests = [{"x": RNG.standard_normal((1, 4)).astype(np.float32)} for _ in range(12)]
    expected = [mlp.reference(r)["y"] for r in requests]
    runs = [
        pipelined_driver(_addresses(mlp_servers), mlp.model_names, requests, in_flight=3),
        pipelined_forwarding(mlp_forwarding[0].address, "mlp-shard0", requests, in_flight=3),
    ]
    for run in runs:
        assert len(run.latencies_s) == 12 and all(t > 0 for t in run.latencies_s)
        assert run.throughput_rps > 0 and run.in_flight == 3
        assert run.latency_percentile_s(99) >= run.latency_median_s
        for got, want in zip(run.outputs, expected, strict=True):
            np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)


def test_pipelined_raises_the_first_failure_after_all_finish() -> None:
    calls: list[int] = []

    def infer(inputs):
        calls.append(1)
        if inputs["i"] == 2:
            raise RuntimeError("shard 2 down")
        return inputs

    with pytest.raises(RuntimeError, match="shard 2 down"):
        run_pipelined(infer, [{"i": i} for i in range(5)], in_flight=2)
    assert len(calls) == 5
    with pytest.raises(ValueError, match="in_flight"):
        run_pipelined(infer, [{"i": 0}], in_flight=0)


def test_big_boundary_tensor_crosses_both_chain_kinds(big, start_server) -> None:
    servers = [start_server(d) for d in big.shard_dirs]
    tail = start_server(big.shard_dirs[1], forward_to="")
    head = start_server(big.shard_dirs[0], forward_to=tail.address, forward_model="big-shard1")
    a = RNG.standard_normal((1, 1_600_000)).astype(np.float32)
    want = big.reference({"a": a})["s"]
    driven = run_chain_driver([s.address for s in servers], big.model_names, {"a": a})
    forwarded = run_chain_forwarding(head.address, "big-shard0", {"a": a})
    np.testing.assert_allclose(driven["s"], want, rtol=1e-5)
    np.testing.assert_array_equal(forwarded["s"], driven["s"])


def test_next_hop_errors_come_back_with_their_code(mlp, start_server) -> None:
    # shard0 forwarding to another shard0: h1 [N,8] is handed to x [N,4] by position and
    # the next hop refuses it; the caller sees the next hop's code and reason.
    tail = start_server(mlp.shard_dirs[0], forward_to="")
    head = start_server(mlp.shard_dirs[0], forward_to=tail.address, forward_model="mlp-shard0")
    with OipClient(head.address) as c, pytest.raises(OipError) as err:
        c.infer("mlp-shard0", {"x": X})
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert f"next hop {tail.address}" in err.value.details and "shape [3, 8]" in err.value.details


def test_unreachable_next_hop_is_unavailable_and_not_ready(mlp, start_server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    head = start_server(mlp.shard_dirs[0], forward_to=dead, forward_model="mlp-shard1")
    with OipClient(head.address) as c:
        assert c.server_live() and not c.server_ready() and not c.model_ready("mlp-shard0")
        with pytest.raises(OipError) as err:
            c.infer("mlp-shard0", {"x": X})
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert f"next hop {dead}" in err.value.details


def test_chain_arguments_are_checked(mlp, mlp_servers) -> None:
    with pytest.raises(ValueError, match="3 addresses but 2 model names"):
        ChainDriver(_addresses(mlp_servers), mlp.model_names[:2])
    with pytest.raises(ValueError, match="at least one shard"):
        ChainDriver([], [])
    with pytest.raises(OipError, match="NOT_FOUND"):  # names swapped: caught at setup
        ChainDriver(_addresses(mlp_servers), list(reversed(mlp.model_names)))
