"""Shared by the remediation, chaos and event-trigger tests: a small quiet twin, a fast
training job, filler leases, and a webhook receiver on loopback."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.training.spec import TrainSpec

# Natural faults off: a test sees only what it injects. Two active A100 nodes, one spare
# A100 node, and a lone V100 (a SKU with no second device anywhere).
FLEET: dict[str, Any] = {
    "name": "remediation-test",
    "seed": 11,
    "faults": {"natural": False},
    "nodes": [
        {
            "name": "a100-0",
            "region": "r1",
            "role": "active",
            "devices": [{"sku": "a100-40gb", "count": 2}],
        },
        {
            "name": "a100-1",
            "region": "r1",
            "role": "active",
            "devices": [{"sku": "a100-40gb", "count": 2}],
        },
        {
            "name": "a100-spare-0",
            "region": "r1",
            "role": "spare",
            "devices": [{"sku": "a100-40gb", "count": 2}],
        },
        {
            "name": "v100-0",
            "region": "r2",
            "role": "active",
            "devices": [{"sku": "v100", "count": 1}],
        },
    ],
}
A100 = "NVIDIA A100-SXM4-40GB"


def make_cluster(home: Path) -> GpuCluster:
    """The quiet twin in ``home`` (GPUFLOW_HOME), synced into the inventory."""
    path = home / "remediation-fleet.yaml"
    path.write_text(yaml.safe_dump(FLEET))
    backend = SimBackend(spec_path=path)
    Inventory().sync(backend)
    return GpuCluster(backend="sim", cluster_spec=str(path))


def small_spec(job_id: str, steps: int = 300, interval: int = 50) -> TrainSpec:
    """llama-tiny at a toy size: ~10 ms a step on one core, exact resume (fp32)."""
    return TrainSpec(
        job_id=job_id,
        model="llama-tiny",
        steps=steps,
        checkpoint_interval=interval,
        batch_size=2,
        seq_len=16,
        precision="fp32",
        eval_batches=1,
    )


def fill(inventory: Inventory, sku: str = A100, owner: str = "filler") -> list[str]:
    """Lease every free device of ``sku`` to fillers (a busy fleet); returns their ids."""
    taken = []
    for i, res in enumerate(inventory.free_resources(sku=sku, kind="device")):
        inventory.acquire_lease(res.resource_id, f"{owner}-{i}", 3600)
        taken.append(res.resource_id)
    return taken


def wait_until(predicate: Any, timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    """Functional wait (not a speed assert): fail with ``what`` if it never happens."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        received = self.messages

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                try:
                    received.append(json.loads(raw))
                except ValueError:
                    received.append({"raw": raw.decode(errors="replace")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def block(self):  # -> CustomWebhookNotificationBlock
        from prefect.blocks.notifications import CustomWebhookNotificationBlock

        return CustomWebhookNotificationBlock(
            name="gpuflow-ops",
            url=self.url,
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
        )

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
