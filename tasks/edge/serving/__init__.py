"""Serve model shards over the Open Inference Protocol (KServe v2) gRPC API and run chains.

- ``server``: one shard per server (``python -m tasks.edge.serving.server``), optionally
  forwarding to the next shard; ``start_shard_server``/``serve_shard`` in-process.
- ``process``: the same as a child process, with readiness and graceful stop.
- ``client``: ``OipClient`` for any OIP server.
- ``chain``: run a chain by a driver or by forwarding, and pipelined for throughput.
- ``proto``: the protocol's .proto and its generated stubs (scripts/gen_oip_protos.sh).
"""

from tasks.edge.serving.chain import (
    ChainDriver,
    PipelinedRun,
    pipelined_driver,
    pipelined_forwarding,
    run_chain_driver,
    run_chain_forwarding,
    run_pipelined,
)
from tasks.edge.serving.client import ModelMetadata, OipClient, OipError, ServerMetadata
from tasks.edge.serving.process import ShardProcess, ShardStartError, start_shard_process
from tasks.edge.serving.server import ShardServer, serve_shard, start_shard_server

__all__ = [
    "ChainDriver",
    "ModelMetadata",
    "OipClient",
    "OipError",
    "PipelinedRun",
    "ServerMetadata",
    "ShardProcess",
    "ShardServer",
    "ShardStartError",
    "pipelined_driver",
    "pipelined_forwarding",
    "run_chain_driver",
    "run_chain_forwarding",
    "run_pipelined",
    "serve_shard",
    "start_shard_process",
    "start_shard_server",
]
