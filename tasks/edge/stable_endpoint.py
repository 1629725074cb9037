"""The stable endpoint of a deployment name, as a process: started once, kept at its address.

``ensure_endpoint(name)`` starts serving/endpoint.py for ``name`` if it is not running
(again at the address it had, if it had one), in a session of its own like the shards,
and records it in ``GPUFLOW_HOME/edge/<name>/endpoint.json``; its target file is the
name's ``target`` (deploy.set_current writes the current head there). ``stop_endpoint``
stops it (teardown of every version does).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from gpuflow.tasks.edge.home import (
    EdgeDeployError,
    name_dir,
    process_running,
    spawn_detached,
    target_file,
)

ENDPOINT_MODULE = "gpuflow.tasks.edge.serving.endpoint"
ENDPOINT_FILE = "endpoint.json"
_READY = "READY endpoint "


def _record_path(name: str) -> Path:
    return name_dir(name) / ENDPOINT_FILE


def endpoint_record(name: str) -> dict | None:
    path = _record_path(name)
    return json.loads(path.read_text()) if path.is_file() else None


def _alive(pid: int, name: str) -> bool:
    return process_running(pid, ENDPOINT_MODULE, str(target_file(name)))


def endpoint_alive(name: str) -> bool:
    record = endpoint_record(name)
    return record is not None and _alive(int(record["pid"]), name)


def ensure_endpoint(name: str, host: str = "127.0.0.1", timeout_s: float = 30.0) -> str:
    """The endpoint's address, starting it first if it is not running."""
    record = endpoint_record(name)
    if record is not None and _alive(int(record["pid"]), name):
        return str(record["address"])
    port = int(record["address"].rsplit(":", 1)[1]) if record else 0
    host = record.get("host", host) if record else host
    log_path = name_dir(name) / "logs" / "endpoint.log"
    argv = [sys.executable, "-m", ENDPOINT_MODULE, "--target-file", str(target_file(name))]
    argv += ["--host", host, "--port", str(port)]
    process = spawn_detached(argv, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith(_READY):
                address = line.split("address=", 1)[1].strip()
                _record_path(name).write_text(
                    json.dumps({"pid": process.pid, "address": address, "host": host}) + "\n"
                )
                return address
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
            process.wait()
            raise EdgeDeployError(
                f"the endpoint of {name!r} did not start: {log_path.read_text()[-1000:]}"
            )
        time.sleep(0.05)


def stop_endpoint(name: str, timeout_s: float = 10.0) -> bool:
    """SIGTERM the endpoint (SIGKILL after ``timeout_s``); True if one was running."""
    record = endpoint_record(name)
    if record is None or not _alive(int(record["pid"]), name):
        return False
    pid = int(record["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid, name):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    return True


# --- Prefect task ---------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

ensure_endpoint_task = task(ensure_endpoint, name="edge-endpoint", cache_policy=NONE)
