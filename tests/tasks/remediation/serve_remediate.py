"""Serve the `remediate` deployment with its event trigger (the integration test runs this
in a subprocess against the test Prefect server): python serve_remediate.py NAME BLOCK."""

from __future__ import annotations

import sys

from gpuflow.flows.remediate import remediate_deployment
from prefect import serve

if __name__ == "__main__":
    name, notify_block = sys.argv[1], sys.argv[2]
    serve(remediate_deployment(name=name, parameters={"notify_block": notify_block}))
