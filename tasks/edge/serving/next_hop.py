"""A forwarding shard's next hop: one client for the life of the server, the next shard's
input names fetched once, and its readiness (which the forwarding shard's own readiness
includes).

The client keeps one channel open (a channel per call cost 2.4 ms a hop), hands the
boundary tensor over in shared memory where the next shard shares this host (Triton's
system shared-memory extension, shm.py) and sends requests on persistent ModelStreamInfer
streams where one is free (stream.py), else unary ModelInfer.
"""

from __future__ import annotations

import threading

import grpc
from gpuflow.tasks.edge.serving.client import ModelMetadata, OipClient, SharedMemoryMode
from gpuflow.tasks.edge.serving.proto import oip as pb

# How long readiness waits for a next hop's answer: readiness probes must stay cheap.
_NEXT_HOP_PROBE_S = 2.0


class NextHop:
    """The forwarding target: a client plus the next shard's input names, fetched once."""

    def __init__(
        self,
        address: str,
        model_name: str,
        max_message_mb: int,
        timeout_s: float,
        shared_memory: SharedMemoryMode = "auto",
    ):
        self.address = address
        self.model_name = model_name
        self.timeout_s = timeout_s
        # A next hop on this host gets the boundary tensor through shared memory (client.py),
        # on a few open ModelStreamInfer streams (stream.py).
        self.client = OipClient(
            address,
            timeout_s=timeout_s,
            max_message_mb=max_message_mb,
            shared_memory=shared_memory,
            streaming=True,
        )
        self._metadata: ModelMetadata | None = None
        self._lock = threading.Lock()

    def metadata(self) -> ModelMetadata:
        """The next shard's metadata, fetched once (OipError while it cannot be reached)."""
        with self._lock:
            if self._metadata is None:
                self._metadata = self.client.model_metadata(self.model_name)
            return self._metadata

    def input_names(self) -> list[str]:
        return self.metadata().input_names

    def ready(self) -> bool:
        try:
            request = pb.ModelReadyRequest(name=self.model_name)
            return bool(self.client.stub.ModelReady(request, timeout=_NEXT_HOP_PROBE_S).ready)
        except grpc.RpcError:
            return False
