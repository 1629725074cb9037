"""Deployments of a sliced model: shard server processes, their records, rollback, teardown.

A deployment is one version of a named chain, kept under
``GPUFLOW_HOME/edge/<name>/<version>/``: the packaged shards, the server logs and
``deployment.json`` (status, per-shard node, address and pid). ``GPUFLOW_HOME/edge/<name>/
current`` names the version that serves. A new version is started beside the current one
(other ports), checked, and only then made current, the previous version's processes
stopped; if its check fails its own processes are stopped and the previous version keeps
serving (the rollback). Shard processes run in their own session so they outlive the
command that started them; stopping one checks first that the pid is still that server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.hardware.home import replace_atomically
from gpuflow.tasks.edge.home import (
    EdgeDeployError,
    edge_root,
    name_dir,
    process_running,
    spawn_detached,
    target_file,
    version_dir,
)
from gpuflow.tasks.edge.manifest import load_manifest, save_manifest, verify_shard
from gpuflow.tasks.edge.nodes import check_reachable, free_port

Mode = Literal["forward", "driver"]
DEPLOYMENT_FILE = "deployment.json"
CURRENT_FILE = "current"
SERVER_MODULE = "gpuflow.tasks.edge.serving.server"
_READY_PREFIX = "READY "


@dataclass
class ShardRecord:
    """One running shard server."""

    index: int
    model_name: str
    node: str
    address: str
    pid: int
    shard_dir: str
    log_path: str
    # The shard's HTTP probes and /metrics (serving/probes.py); "" in records from before.
    http_address: str = ""
    # The EdgeNode it was started with, so a supervisor restarts it the same way.
    node_settings: dict = field(default_factory=dict)


@dataclass
class Deployment:
    """One version of a named chain and its processes."""

    name: str
    version: str
    source_model: str
    mode: Mode
    status: str  # starting | verifying | active | rolled-back | failed | superseded | stopped
    shards: list[ShardRecord] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    check: dict | None = None
    note: str = ""

    @property
    def root(self) -> Path:
        return version_dir(self.name, self.version)

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.shards]

    @property
    def model_names(self) -> list[str]:
        return [s.model_name for s in self.shards]

    def save(self) -> Path:
        path = self.root / DEPLOYMENT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, name: str, version: str) -> Deployment:
        path = version_dir(name, version) / DEPLOYMENT_FILE
        if not path.is_file():
            raise EdgeDeployError(f"no deployment {name!r} version {version!r} ({path} missing)")
        data = json.loads(path.read_text())
        data["shards"] = [ShardRecord(**s) for s in data.get("shards", [])]
        return cls(**data)


def list_versions(name: str) -> list[str]:
    root = name_dir(name)
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name)]
    return sorted(found, key=lambda v: int(v[1:]))


def new_version(name: str) -> str:
    """Create and return the next version folder name (v1, v2, ...)."""
    versions = list_versions(name)
    number = int(versions[-1][1:]) + 1 if versions else 1
    version = f"v{number}"
    version_dir(name, version).mkdir(parents=True)
    return version


def current_version(name: str) -> str | None:
    path = name_dir(name) / CURRENT_FILE
    return path.read_text().strip() or None if path.is_file() else None


def set_current(name: str, version: str | None) -> None:
    """Make ``version`` the one that serves ``name``, and point the stable endpoint at its
    head (a forwarding chain's first shard; a driver-mode chain has no single entry)."""
    path = name_dir(name) / CURRENT_FILE
    head = ""
    if version is not None:
        deployment = Deployment.load(name, version)
        if deployment.mode == "forward" and deployment.shards:
            head = deployment.shards[0].address
    replace_atomically(target_file(name), (head + "\n" if head else "").encode(), ".target-")
    if version is None:
        path.unlink(missing_ok=True)
    else:
        replace_atomically(path, (version + "\n").encode(), ".current-")


def deployment_names() -> list[str]:
    root = edge_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


# --- processes --------------------------------------------------------------------------


def _is_our_server(pid: int, shard_dir: str) -> bool:
    """True when ``pid`` is alive and is the shard server of ``shard_dir`` (pids get reused)."""
    return process_running(pid, SERVER_MODULE, shard_dir)


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_shard(record: ShardRecord, timeout_s: float = 10.0) -> bool:
    """SIGTERM the shard server (if it is still ours), SIGKILL after ``timeout_s``.

    Returns True if a process was stopped.
    """
    if not _is_our_server(record.pid, record.shard_dir):
        return False
    try:
        os.kill(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not _is_our_server(record.pid, record.shard_dir):
            return True
        time.sleep(0.05)
    try:
        os.kill(record.pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    for _ in range(100):
        _reap(record.pid)
        if not _is_our_server(record.pid, record.shard_dir):
            break
        time.sleep(0.05)
    return True


def shard_alive(record: ShardRecord) -> bool:
    return _is_our_server(record.pid, record.shard_dir)


def _launch_argv(
    shard_dir: Path, node: EdgeNode, port: int, forward_to: str | None, forward_model: str | None
) -> list[str]:
    argv = [sys.executable, "-m", SERVER_MODULE, "--shard-dir", str(shard_dir)]
    argv += ["--host", node.host, "--port", str(port)]
    argv += ["--intra-op-threads", str(node.intra_op_threads)]
    argv += ["--http-port", "0"]  # probes and metrics on a free port; the READY line says it
    if forward_to:
        argv += ["--forward-to", forward_to, "--forward-model", str(forward_model)]
    else:
        argv.append("--no-forward")
    if node.cpus:
        taskset = shutil.which("taskset")
        if taskset:  # taskset execs the server, so the pid stays the server's
            argv = [taskset, "-c", ",".join(str(c) for c in node.cpus), *argv]
    return argv


def start_one(
    shard_dir: Path,
    node: EdgeNode,
    log_path: Path,
    forward_to: str | None,
    forward_model: str | None,
    ready_timeout_s: float,
    port: int | None = None,
) -> tuple[int, str, str]:
    """Start one server in its own session; wait for its READY line (``port``: exactly
    there, as a restart must; default: the node's). (pid, address, HTTP probe address)."""
    if port is None:
        port = 0 if node.base_port == 0 else free_port(node.host, node.base_port)
    argv = _launch_argv(shard_dir, node, port, forward_to, forward_model)
    process = spawn_detached(argv, log_path)
    if node.cpus and not shutil.which("taskset"):
        try:
            os.sched_setaffinity(process.pid, node.cpus)
        except OSError:
            pass
    deadline = time.monotonic() + ready_timeout_s
    while True:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        for line in text.splitlines():
            if line.startswith(_READY_PREFIX):
                fields = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                http = fields.get("http", "-")
                return process.pid, fields["address"], "" if http == "-" else http
        code = process.poll()
        if code is not None:
            raise EdgeDeployError(
                f"shard server for {shard_dir.name} on node {node.name!r} exited with code "
                f"{code} before it was ready: {text.strip()[-1500:]}"
            )
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise EdgeDeployError(
                f"shard server for {shard_dir.name} on node {node.name!r} not ready after "
                f"{ready_timeout_s:.0f} s: {text.strip()[-1500:]}"
            )
        time.sleep(0.05)


def launch(
    deployment: Deployment,
    shard_dirs: list[Path],
    nodes: list[EdgeNode],
    *,
    ready_timeout_s: float = 60.0,
) -> Deployment:
    """Start one server per shard (shard i on nodes[i]) and wait until the chain is ready.

    Forward mode starts the last shard first so each server knows its next hop, which is
    also written into the deployed copy of its manifest. On any failure every process this
    call started is stopped before the error propagates: nothing is left half-deployed.
    """
    if len(nodes) < len(shard_dirs):
        raise EdgeDeployError(f"{len(shard_dirs)} shards but only {len(nodes)} nodes")
    for node in nodes[: len(shard_dirs)]:
        check_reachable(node)
    for shard_dir in shard_dirs:
        verify_shard(shard_dir)  # a corrupted shard is refused before anything starts
    deployment.status = "starting"
    deployment.shards = []
    deployment.save()
    started: list[ShardRecord] = []
    try:
        next_hop: tuple[str, str] | None = None
        for index in reversed(range(len(shard_dirs))):
            shard_dir, node = shard_dirs[index], nodes[index]
            manifest = load_manifest(shard_dir)
            forward = next_hop if deployment.mode == "forward" else None
            if manifest.next_hop != (forward[0] if forward else None):
                save_manifest(
                    _replace(manifest, next_hop=forward[0] if forward else None), shard_dir
                )
            log_path = deployment.root / "logs" / f"shard-{index}.log"
            pid, address, http_address = start_one(
                shard_dir,
                node,
                log_path,
                forward[0] if forward else None,
                forward[1] if forward else None,
                ready_timeout_s,
            )
            record = ShardRecord(
                index,
                manifest.model_name,
                node.name,
                address,
                pid,
                str(shard_dir),
                str(log_path),
                http_address,
                node.model_dump(),
            )
            started.append(record)
            deployment.shards = sorted(started, key=lambda s: s.index)
            deployment.save()  # pids on disk at once: `teardown` can find them after a crash
            next_hop = (address, manifest.model_name)
        wait_ready(deployment, timeout_s=ready_timeout_s)
    except BaseException:
        for record in started:
            stop_shard(record)
        deployment.status = "failed"
        deployment.save()
        raise
    deployment.status = "verifying"
    deployment.save()
    return deployment


def _replace(manifest, **changes):  # dataclasses.replace re-runs validation
    from dataclasses import replace

    return replace(manifest, **changes)


def wait_ready(deployment: Deployment, timeout_s: float = 60.0) -> None:
    """Every shard answers ModelReady over OIP (a forwarding head only when its hops do)."""
    from gpuflow.tasks.edge.serving.client import OipClient

    for record in deployment.shards:
        with OipClient(record.address, timeout_s=5.0) as client:
            try:
                client.wait_until_ready(record.model_name, timeout_s=timeout_s)
            except TimeoutError as exc:
                raise EdgeDeployError(
                    f"shard {record.index} ({record.model_name}) on node {record.node!r} "
                    f"at {record.address} is unreachable: {exc}"
                ) from None


def stop_deployment(deployment: Deployment, status: str = "stopped") -> int:
    """Stop every shard process of a deployment; returns how many were running."""
    stopped = sum(stop_shard(record) for record in deployment.shards)
    deployment.status = status
    deployment.save()
    return stopped


def teardown(name: str, version: str | None = None) -> list[tuple[str, int]]:
    """Stop a deployment's processes (default: every version of ``name``); clears current.

    Returns (version, processes stopped) pairs.
    """
    versions = [version] if version else list_versions(name)
    if not versions:
        raise EdgeDeployError(f"no edge deployment named {name!r}")
    result = []
    for v in versions:
        deployment = Deployment.load(name, v)
        running = any(shard_alive(s) for s in deployment.shards)
        if running or deployment.status in (
            "active",
            "degraded",
            "standby",
            "starting",
            "verifying",
        ):
            result.append((v, stop_deployment(deployment, "stopped")))
    if version is None or current_version(name) == version:
        set_current(name, None)
    if version is None:  # the whole name goes: its stable endpoint too
        from gpuflow.tasks.edge.stable_endpoint import stop_endpoint

        stop_endpoint(name)
    return result


def deployment_status(name: str) -> list[dict]:
    """Every version of ``name`` with its status and which of its shards are alive."""
    current = current_version(name)
    rows = []
    for v in list_versions(name):
        try:
            deployment = Deployment.load(name, v)
        except EdgeDeployError:
            continue
        rows.append(
            {
                "name": name,
                "version": v,
                "current": v == current,
                "status": deployment.status,
                "model": deployment.source_model,
                "mode": deployment.mode,
                "shards": [
                    {
                        "index": s.index,
                        "node": s.node,
                        "address": s.address,
                        "http": s.http_address,
                        "pid": s.pid,
                        "alive": shard_alive(s),
                    }
                    for s in deployment.shards
                ],
                "check": deployment.check,
                "note": deployment.note,
            }
        )
    return rows


# --- Prefect tasks --------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

# No retries: launch cleans up after itself and a retry would only repeat a clear error.
launch_task = task(launch, name="edge-deploy-shards", cache_policy=NONE)
stop_task = task(stop_deployment, name="edge-stop-deployment", cache_policy=NONE)
