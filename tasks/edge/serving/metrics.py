"""What a shard server counts, in Prometheus, named as Triton names the same things.

Per model and version (labels ``model``, ``version``, as Triton's):

| metric | type | Triton's | meaning |
|---|---|---|---|
| ``nv_inference_request_success`` | counter | same | ModelInfer calls answered OK |
| ``nv_inference_request_failure`` | counter | same, with ``reason`` | calls that failed: ``REJECTED`` (malformed, unknown model), ``CANCELED`` (cancelled or past their deadline), ``BACKEND`` (the model or the next hop failed), ``OTHER`` |
| ``nv_inference_count`` | counter | same | inferences: the batch sizes of successful calls |
| ``nv_inference_exec_count`` | counter | same | model executions (one per successful call: no dynamic batching) |
| ``nv_inference_request_duration_us`` | counter | same | cumulative time in ModelInfer, microseconds |
| ``nv_inference_compute_input_duration_us`` | counter | same | cumulative time decoding the inputs (shared-memory regions read) |
| ``nv_inference_compute_infer_duration_us`` | counter | same | cumulative time in the model itself |
| ``nv_inference_compute_output_duration_us`` | counter | same | cumulative time writing the outputs into the response or the caller's shared memory |
| ``gpuflow_inference_forward_duration_us`` | counter | none (Triton's ensembles count per step) | cumulative time a forwarding shard spent on its next hop: handing over its outputs and the next hop's whole answer |
| ``nv_inference_pending_request_count`` | gauge | same | calls in ModelInfer now: the queue depth |
| ``gpuflow_inference_request_duration_seconds`` | histogram | none (Triton exports summaries, off by default) | latency of every call, success or not |

The four phase counters split a call's duration: what is left of it once the model, the
decoding, the encoding and the next hop are taken out is the server's own framing (the
stream, the handler), and what a caller waits on top of the duration is the way between
the processes (the wire, the wake-ups): ``gpuflow bench edge`` splits a hop this way.

Each server has a registry of its own (two shards in one process, as in the tests, do
not mix their counts); the HTTP probe server (probes.py) exposes it at ``/metrics``.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import grpc
from gpuflow.tasks.edge.serving.stream import parse_stream_error
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LABELS = ("model", "version")
_REASON = {
    grpc.StatusCode.INVALID_ARGUMENT: "REJECTED",
    grpc.StatusCode.NOT_FOUND: "REJECTED",
    grpc.StatusCode.FAILED_PRECONDITION: "REJECTED",
    grpc.StatusCode.CANCELLED: "CANCELED",
    grpc.StatusCode.DEADLINE_EXCEEDED: "CANCELED",
    grpc.StatusCode.INTERNAL: "BACKEND",
    grpc.StatusCode.UNAVAILABLE: "BACKEND",
}
PHASE_COUNTERS = {
    "input": (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds",
    ),
    "infer": (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
    ),
    "output": (
        "nv_inference_compute_output_duration_us",
        "Cumulative compute output duration in microseconds",
    ),
    "forward": (
        "gpuflow_inference_forward_duration_us",
        "Cumulative time on the next hop (hand-over and its answer) in microseconds",
    ),
}
# From a loopback hop (~1 ms) to a large model on a slow node (tens of seconds).
_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def failure_reason(code: grpc.StatusCode | None) -> str:
    return _REASON.get(code, "OTHER") if code is not None else "OTHER"


class ShardMetrics:
    """The counters of one served model."""

    def __init__(self, model: str, version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"model": model, "version": version or "1"}
        r = self.registry
        self.success = Counter(
            "nv_inference_request_success", "Successful inference requests", _LABELS, registry=r
        )
        self.failure = Counter(
            "nv_inference_request_failure",
            "Failed inference requests",
            (*_LABELS, "reason"),
            registry=r,
        )
        self.count = Counter("nv_inference_count", "Inferences performed", _LABELS, registry=r)
        self.exec_count = Counter(
            "nv_inference_exec_count", "Model executions performed", _LABELS, registry=r
        )
        self.duration_us = Counter(
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds",
            _LABELS,
            registry=r,
        )
        # One counter per phase of a call (Triton's names where Triton has the phase).
        self.phase_us = {
            phase: Counter(name, help_text, _LABELS, registry=r)
            for phase, (name, help_text) in PHASE_COUNTERS.items()
        }
        self.pending = Gauge(
            "nv_inference_pending_request_count",
            "Inference requests in the server now",
            _LABELS,
            registry=r,
        )
        self.latency = Histogram(
            "gpuflow_inference_request_duration_seconds",
            "Inference request latency, every request",
            _LABELS,
            buckets=_BUCKETS_S,
            registry=r,
        )
        # Series exist from the start at zero: a scrape before the first request sees them.
        for metric in (
            self.success,
            self.count,
            self.exec_count,
            self.duration_us,
            *self.phase_us.values(),
        ):
            metric.labels(**self.labels)
        self.pending.labels(**self.labels).set(0)

    def observe(self, seconds: float, batch: int, code: grpc.StatusCode | None) -> None:
        """One finished call: ``code`` None or OK is a success."""
        labels = self.labels
        self.duration_us.labels(**labels).inc(seconds * 1e6)
        self.latency.labels(**labels).observe(seconds)
        if code in (None, grpc.StatusCode.OK):
            self.success.labels(**labels).inc()
            self.count.labels(**labels).inc(batch)
            self.exec_count.labels(**labels).inc()
        else:
            self.failure.labels(**labels, reason=failure_reason(code)).inc()

    def observe_phase(self, phase: str, seconds: float) -> None:
        """Time one call spent in ``phase`` (a key of PHASE_COUNTERS): "infer" is the
        model's own run time, without decoding, forwarding or encoding."""
        self.phase_us[phase].labels(**self.labels).inc(seconds * 1e6)


def batch_size(request: Any) -> int:
    """The first input's leading dimension (the batch), 1 when it has none."""
    if request.inputs and request.inputs[0].shape:
        return max(int(request.inputs[0].shape[0]), 0)
    return 1


class InstrumentedServicer:
    """The OIP servicer with ModelInfer counted; every other RPC passes straight through."""

    def __init__(self, inner: Any, metrics: ShardMetrics) -> None:
        self._inner, self.metrics = inner, metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        pending = self.metrics.pending.labels(**self.metrics.labels)
        pending.inc()
        started = time.perf_counter()
        code: grpc.StatusCode | None = grpc.StatusCode.UNKNOWN
        try:
            response = self._inner.ModelInfer(request, context)
            code = None
            return response
        except BaseException:
            # context.abort raised after setting the code; anything else is the server's.
            code = context.code() or grpc.StatusCode.UNKNOWN
            raise
        finally:
            pending.dec()
            self.metrics.observe(time.perf_counter() - started, batch_size(request), code)

    def ModelStreamInfer(self, requests: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """Each request of a stream counted as a ModelInfer is: pending while it is served,
        its latency from taking it off the stream to answering it, its status code from
        the answer's ``error_message``."""
        pending = self.metrics.pending.labels(**self.metrics.labels)
        taken: list[tuple[float, int]] = []  # the request being served (one at a time)

        def counted() -> Any:
            for request in requests:
                pending.inc()
                taken.append((time.perf_counter(), batch_size(request)))
                yield request

        try:
            for response in self._inner.ModelStreamInfer(counted(), context):
                started, batch = taken.pop()
                pending.dec()
                code = parse_stream_error(response.error_message)[0]
                self.metrics.observe(
                    time.perf_counter() - started, batch, code if response.error_message else None
                )
                yield response
        finally:
            for _ in taken:  # taken off the stream, never answered (the stream was cancelled)
                pending.dec()


def scrape_counters(http_address: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Every counter of a shard's /metrics by its sample name (``..._total``), summed over
    labels. Differences over an interval give what the interval's calls took."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{http_address}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http only
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def counter_sample(name: str) -> str:
    """The sample name a counter is scraped under (prometheus_client adds ``_total``)."""
    return f"{name}_total"


def scrape_compute(http_address: str, timeout_s: float = 10.0) -> tuple[float, float]:
    """(cumulative compute µs, executions) from a shard's /metrics: what the model itself
    took, without decoding, forwarding or encoding. Differences over an interval give the
    served stage time per request."""
    values = scrape_counters(http_address, timeout_s)
    return values.get(_COMPUTE_SAMPLE, 0.0), values.get(_EXEC_SAMPLE, 0.0)


_COMPUTE_SAMPLE = counter_sample(PHASE_COUNTERS["infer"][0])
_EXEC_SAMPLE = counter_sample("nv_inference_exec_count")
