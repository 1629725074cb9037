"""Run a chain of OIP shard servers: by a driver, by forwarding, and pipelined.

Two ways to run a k-shard chain:

- driver: the caller calls shard 0, hands its outputs to shard 1's inputs (names from
  shard 1's ModelMetadata, see handoff.py), calls shard 1, and so on. Every boundary tensor
  crosses the network twice (shard -> driver -> next shard).
- forwarding: the caller calls shard 0 only; each server calls the next itself (server.py's
  forwarding mode) and the final outputs come back along the chain. Each boundary tensor
  crosses once, but the responses travel back through every hop.

Either way one request visits the shards in turn, so slicing does not lower single-request
latency; it raises throughput when several requests are in flight, each shard working on
a different one (``run_pipelined``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType

import numpy as np
from gpuflow.tasks.edge.serving.client import OipClient
from gpuflow.tasks.edge.serving.handoff import map_outputs_to_inputs

Tensors = dict[str, np.ndarray]


class ChainDriver:
    """Calls each shard in turn; thread-safe, so one driver can serve pipelined requests."""

    def __init__(
        self, addresses: Sequence[str], model_names: Sequence[str], timeout_s: float = 30.0
    ) -> None:
        addresses, model_names = list(addresses), list(model_names)
        if not addresses:
            raise ValueError("a chain needs at least one shard address")
        if len(addresses) != len(model_names):
            raise ValueError(
                f"{len(addresses)} addresses but {len(model_names)} model names; "
                "give one model name per shard"
            )
        self.model_names = model_names
        self.clients: list[OipClient] = []
        try:
            for address in addresses:
                self.clients.append(OipClient(address, timeout_s=timeout_s))
            # Input names of every shard after the first, fetched once: they never change
            # while the chain runs, and a metadata round trip per hop would be pure overhead.
            self.input_names = [
                client.model_metadata(name).input_names
                for client, name in zip(self.clients[1:], model_names[1:], strict=True)
            ]
        except BaseException:
            self.close()
            raise

    def infer_timed(self, inputs: Mapping[str, np.ndarray]) -> tuple[Tensors, list[float]]:
        """The chain's final outputs and the wall time of each hop's call in seconds."""
        current: Mapping[str, np.ndarray] = inputs
        hop_s: list[float] = []
        outputs: Tensors = {}
        for index, (client, name) in enumerate(zip(self.clients, self.model_names, strict=True)):
            started = time.perf_counter()
            outputs = client.infer(name, current)
            hop_s.append(time.perf_counter() - started)
            if index < len(self.input_names):
                current = map_outputs_to_inputs(outputs, self.input_names[index])
        return outputs, hop_s

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Tensors:
        return self.infer_timed(inputs)[0]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> ChainDriver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run_chain_driver(
    addresses: Sequence[str],
    model_names: Sequence[str],
    inputs: Mapping[str, np.ndarray],
    timeout_s: float = 30.0,
) -> Tensors:
    """One request through the chain, the caller driving every hop."""
    with ChainDriver(addresses, model_names, timeout_s) as driver:
        return driver.infer(inputs)


def run_chain_forwarding(
    first_address: str,
    model_name: str,
    inputs: Mapping[str, np.ndarray],
    timeout_s: float = 30.0,
) -> Tensors:
    """One request to the head of a forwarding chain; the servers pass it along."""
    with OipClient(first_address, timeout_s=timeout_s) as client:
        return client.infer(model_name, inputs)


@dataclass(frozen=True)
class PipelinedRun:
    """Outcome of a pipelined run: outputs and latency per request, in request order."""

    outputs: list[Tensors]
    latencies_s: list[float]
    wall_s: float
    in_flight: int

    @property
    def throughput_rps(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s > 0 else float("inf")

    def latency_percentile_s(self, q: float) -> float:
        """The q-th percentile (0-100) of per-request latency, linear interpolation."""
        return float(np.percentile(self.latencies_s, q))

    @property
    def latency_median_s(self) -> float:
        return statistics.median(self.latencies_s)


def run_pipelined(
    infer: Callable[[Mapping[str, np.ndarray]], Tensors],
    requests: Sequence[Mapping[str, np.ndarray]],
    in_flight: int = 4,
) -> PipelinedRun:
    """Send ``requests`` through ``infer`` with up to ``in_flight`` of them at once.

    A closed loop: a new request starts as soon as one finishes, so with in_flight >= the
    number of shards every shard has work. A request's latency runs from the moment it is
    sent to its answer (time waiting for a free slot is not counted). The first failure
    is raised once every request has finished.
    """
    if not requests:
        raise ValueError("run_pipelined needs at least one request")
    if not isinstance(in_flight, int) or in_flight < 1:
        raise ValueError(f"in_flight must be a positive int, got {in_flight!r}")
    latencies = [0.0] * len(requests)
    outputs: list[Tensors] = [{} for _ in requests]
    lock = threading.Lock()

    def one(index: int) -> None:
        started = time.perf_counter()
        result = infer(requests[index])
        elapsed = time.perf_counter() - started
        with lock:
            latencies[index] = elapsed
            outputs[index] = result

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="oip-pipeline") as pool:
        futures = [pool.submit(one, i) for i in range(len(requests))]
        errors = [f.exception() for f in futures]
    wall_s = time.perf_counter() - started
    for error in errors:
        if error is not None:
            raise error
    return PipelinedRun(outputs=outputs, latencies_s=latencies, wall_s=wall_s, in_flight=in_flight)


def pipelined_driver(
    addresses: Sequence[str],
    model_names: Sequence[str],
    requests: Sequence[Mapping[str, np.ndarray]],
    in_flight: int = 4,
    timeout_s: float = 30.0,
) -> PipelinedRun:
    """run_pipelined over a driver-run chain."""
    with ChainDriver(addresses, model_names, timeout_s) as driver:
        return run_pipelined(driver.infer, requests, in_flight)


def pipelined_forwarding(
    first_address: str,
    model_name: str,
    requests: Sequence[Mapping[str, np.ndarray]],
    in_flight: int = 4,
    timeout_s: float = 30.0,
) -> PipelinedRun:
    """run_pipelined over a forwarding chain (or a single, unsplit model server)."""
    with OipClient(first_address, timeout_s=timeout_s) as client:
        return run_pipelined(lambda x: client.infer(model_name, x), requests, in_flight)
