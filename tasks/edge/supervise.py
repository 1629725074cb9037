"""Keep a deployed chain serving: restart a shard whose process died, where it was.

One pass (``supervise_once``) looks at the current version of a deployment: every shard
whose process is gone is started again with the same shard folder, node settings, address
(port) and next hop, tail first, so that a forwarding shard's next hop is back before it
is. While any shard is down the deployment's status is ``degraded`` (``gpuflow edge
status`` shows it); once every shard answers ModelReady again it is ``active``. The
crashed process's log is kept beside the new one (``shard-<i>.log.1``). A stable endpoint
that died is started again at its address too.

Passes of two processes on one deployment are serialised by a lock file in the
deployment's folder (flock): a second supervisor waits, then finds the shard alive and
does nothing. A deployment that is not active or degraded (stopped, rolled back,
superseded, failed) is left alone. The `edge_supervise` flow runs passes on a schedule.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.deploy import (
    Deployment,
    EdgeDeployError,
    ShardRecord,
    current_version,
    name_dir,
    shard_alive,
    start_one,
    wait_ready,
)
from gpuflow.tasks.edge.stable_endpoint import endpoint_alive, endpoint_record, ensure_endpoint

SUPERVISED = ("active", "degraded")
_LOCK_FILE = ".supervise.lock"


@contextlib.contextmanager
def deployment_lock(name: str) -> Iterator[None]:
    """Exclusive, across processes, for one deployment name (released on exit or death)."""
    folder = name_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / _LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _node(record: ShardRecord) -> EdgeNode:
    if record.node_settings:
        return EdgeNode(**record.node_settings)
    host = record.address.rsplit(":", 1)[0].strip("[]")  # a record from before the settings
    return EdgeNode(name=record.node, host=host)


def _restart(deployment: Deployment, record: ShardRecord, ready_timeout_s: float) -> None:
    following = record.index + 1 < len(deployment.shards) and deployment.mode == "forward"
    nxt = deployment.shards[record.index + 1] if following else None
    log_path = Path(record.log_path)
    if log_path.exists():
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    pid, address, http = start_one(
        Path(record.shard_dir),
        _node(record),
        log_path,
        nxt.address if nxt else None,
        nxt.model_name if nxt else None,
        ready_timeout_s,
        port=_port(record.address),
    )
    if address != record.address:  # cannot happen with an explicit port; never serve elsewhere
        raise EdgeDeployError(f"shard {record.index} came back at {address}, not {record.address}")
    record.pid, record.http_address = pid, http


def supervise_once(
    name: str, version: str | None = None, ready_timeout_s: float = 60.0
) -> dict[str, Any]:
    """One pass; returns {"version", "status", "restarted": [shard indices]}."""
    with deployment_lock(name):
        version = version or current_version(name)
        if version is None:
            raise EdgeDeployError(f"no current version of edge deployment {name!r}")
        deployment = Deployment.load(name, version)
        out: dict[str, Any] = {"version": version, "status": deployment.status, "restarted": []}
        if deployment.status not in SUPERVISED:
            return out
        dead = [s for s in deployment.shards if not shard_alive(s)]
        if dead:
            deployment.status = "degraded"
            deployment.note = f"restarting shard(s) {[s.index for s in dead]}"
            deployment.save()
            for record in sorted(dead, key=lambda s: -s.index):  # the tail first
                _restart(deployment, record, ready_timeout_s)
                deployment.save()  # the new pid on disk at once, as launch does
                out["restarted"].append(record.index)
        wait_ready(deployment, timeout_s=ready_timeout_s)
        if endpoint_record(name) is not None and not endpoint_alive(name):
            ensure_endpoint(name)  # at the address it had
            out["endpoint_restarted"] = True
        if deployment.status != "active":
            deployment.status, deployment.note = "active", ""
            deployment.save()
        out["status"] = deployment.status
        return out


# --- Prefect task ---------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

supervise_task = task(supervise_once, name="edge-supervise-pass", cache_policy=NONE)
