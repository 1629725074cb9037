"""The environment of the Prefect workers a test's control plane starts.

A worker asks its server for runs every PREFECT_WORKER_QUERY_SECONDS (10 s by default):
each deployment run a test waits for would wait ~5 s on average just to be picked up,
several times per test. The tests' workers ask every second; nothing else changes.
"""

from __future__ import annotations

FAST_WORKERS = {"PREFECT_WORKER_QUERY_SECONDS": "1"}
