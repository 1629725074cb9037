"""Serve model shards over the Open Inference Protocol (KServe v2) gRPC API and run chains.

- ``server``: one shard per server (``python -m gpuflow.tasks.edge.serving.server``), optionally
  forwarding to the next shard; ``start_shard_server``/``serve_shard`` in-process.
- ``process``: the same as a child process, with readiness and graceful stop.
- ``client``: ``OipClient`` for any OIP server.
- ``chain``: run a chain by a driver or by forwarding, and pipelined for throughput.
- ``proto``: the protocol's .proto, its descriptor and ``oip`` (the messages built from it).
- ``probes``, ``metrics``: grpc.health.v1, HTTP health and Prometheus for each server.

Names are imported lazily: ``python -m gpuflow.tasks.edge.serving.server`` must not find the server
module already imported by its package (runpy warns and may run it twice).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChainDriver": "chain",
    "PipelinedRun": "chain",
    "pipelined_driver": "chain",
    "pipelined_forwarding": "chain",
    "run_chain_driver": "chain",
    "run_chain_forwarding": "chain",
    "run_pipelined": "chain",
    "ModelMetadata": "client",
    "OipClient": "client",
    "OipError": "client",
    "ServerMetadata": "client",
    "ShardProcess": "process",
    "ShardStartError": "process",
    "start_shard_process": "process",
    "ShardServer": "server",
    "serve_shard": "server",
    "start_shard_server": "server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
