"""`gpuflow up` / `gpuflow join` / `gpuflow down`: a control plane, and only what it started.

up: Prefect server (SQLite under GPUFLOW_HOME, or a PostgreSQL URL) → MLflow tracking
server (SQLite under GPUFLOW_HOME or a given URL; artifacts local or on S3), both on
``--host`` (loopback by default) → the process work pool, Blocks and the MLflow URL saved
on the server → every deployment of prefect.yaml applied (with schedules and event
triggers) → node queues and per-node deployments (gpuflow.controlplane_nodes) → worker(s).

join (on a host that owns devices): that host's node registered on a control plane
elsewhere and a worker started for it, pointed at that control plane's Prefect and MLflow.

Both start the host's telemetry exporter beside its workers (`gpuflow telemetry serve`, one
per host: `up`'s exports the local backend, or its ``--node-worker`` nodes; `join`'s its
node) and wait until its /metrics answers; its URL is recorded and printed.

Every process gets its own session and a log under GPUFLOW_HOME/logs
(gpuflow.controlplane_procs); their pids and command lines go to GPUFLOW_HOME/
controlplane.json (`up`) or join-<node>.json (`join`), which is all `down` acts on. Those
hold no secret: database URLs reach the servers through their environment.

``local_stores`` names where those records live by default, and ``recording_env`` lets
another process (the tour) record there, so `gpuflow up` shows its runs afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from gpuflow.controlplane_address import (
    LOOPBACK,
    ListenAddress,
    check_port,
    free_port,
    listen_address,
)
from gpuflow.controlplane_nodes import read_mlflow_url, register_nodes, validate_node_names
from gpuflow.controlplane_procs import (
    ControlPlaneError,
    Report,
    Service,
    alive,
    console_script,
    run,
    start,
    stop,
    wait_http,
    worker_argv,
)
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.home import gpuflow_home
from gpuflow.tasks.telemetry.settings import DEFAULT_PORT as DEFAULT_EXPORTER_PORT
from gpuflow.tasks.telemetry.settings import PORT_TAKEN
from gpuflow.tasks.worker_queues import node_queue_name

__all__ = ["ControlPlane", "ControlPlaneError", "Service", "down", "join", "up"]

STATE_FILE = "controlplane.json"
POOL = "gpuflow-process"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
EXPORTER = "telemetry-exporter"  # the service name of a host's telemetry exporter
SERVER_START_TIMEOUT_S = 180  # a server's first start migrates its database
EXPORTER_PORT_ATTEMPTS = 3  # free ports tried for an exporter asked to take any (port 0)
JOIN_CHECK_TIMEOUT_S = 10
# Where `gpuflow up` reads the store URLs from (gpuflow.cli): kept from other processes.
SECRET_ENV = ("GPUFLOW_PREFECT_DATABASE_URL", "GPUFLOW_MLFLOW_BACKEND_URI")


@dataclass
class ControlPlane:
    home: str
    project_dir: str
    prefect_api_url: str
    prefect_ui_url: str
    mlflow_url: str
    pool: str
    services: list[Service] = field(default_factory=list)
    deployments: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ControlPlane:
        services = [Service(**s) for s in d.pop("services", [])]
        return cls(**d, services=services)

    @property
    def exporter_url(self) -> str | None:
        """This host's telemetry exporter (/metrics), if one was started."""
        return next((s.url for s in self.services if s.name == EXPORTER), None)

    def client_env(self) -> dict[str, str]:
        """What a process needs to use this control plane."""
        return {
            "PREFECT_API_URL": self.prefect_api_url,
            "MLFLOW_TRACKING_URI": self.mlflow_url,
            "GPUFLOW_HOME": self.home,
            "GPUFLOW_PROJECT_DIR": self.project_dir,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }


@dataclass(frozen=True)
class LocalStores:
    """Where a control plane on one GPUFLOW_HOME keeps its records unless given URLs: the
    Prefect home and database, the MLflow backend store and artifacts (the same SQLite file
    that tasks/tracking.py records into when no tracking server is set)."""

    prefect_home: Path
    prefect_database: Path
    mlflow_dir: Path
    mlflow_database: Path
    mlflow_artifacts_uri: str

    @property
    def prefect_database_url(self) -> str:
        return f"sqlite+aiosqlite:///{self.prefect_database}"

    @property
    def mlflow_backend_uri(self) -> str:
        return f"sqlite:///{self.mlflow_database}"


def local_stores(home: Path | None = None) -> LocalStores:
    home = home or gpuflow_home()
    prefect_home = home / "prefect"
    mlflow_dir = home / "mlflow"
    return LocalStores(
        prefect_home=prefect_home,
        prefect_database=prefect_home / "prefect.db",
        mlflow_dir=mlflow_dir,
        mlflow_database=mlflow_dir / "mlflow.db",
        mlflow_artifacts_uri=(mlflow_dir / "artifacts").as_uri(),
    )


def local_urls(
    prefect_port: int = DEFAULT_PREFECT_PORT,
    mlflow_port: int = DEFAULT_MLFLOW_PORT,
    address: ListenAddress | None = None,
) -> dict[str, str]:
    """The URLs of a control plane on these ports of ``address`` (loopback by default),
    as ControlPlane's fields."""
    address = address or listen_address(LOOPBACK)
    return {
        "prefect_api_url": address.url(prefect_port, "/api"),
        "prefect_ui_url": address.url(prefect_port),
        "mlflow_url": address.url(mlflow_port),
    }


def state_path(home: Path | None = None, node: str | None = None) -> Path:
    """`up`'s record, or with ``node`` the record of `join --node NODE`."""
    return (home or gpuflow_home()) / (f"join-{node}.json" if node else STATE_FILE)


def read_state(home: Path | None = None, node: str | None = None) -> ControlPlane | None:
    path = state_path(home, node)
    if not path.exists():
        return None
    return ControlPlane.from_dict(json.loads(path.read_text()))


def serving(plane: ControlPlane) -> bool:
    """Both servers of ``plane`` still run (workers do not matter to a client)."""
    servers = [s for s in plane.services if s.name in ("prefect-server", "mlflow-server")]
    return len(servers) == 2 and all(alive(s) for s in servers)


def recording_env(home: Path | None = None) -> tuple[dict[str, str | None], ControlPlane | None]:
    """What a process on this machine sets (None: unsets) to record where `gpuflow up` on
    ``home`` serves from, and the control plane it then records through, if one is up.

    Up: its Prefect API and MLflow server. Not up: its local stores themselves - Prefect
    runs a temporary server on the same database, MLflow writes the same SQLite file - so
    a later `gpuflow up` shows those runs (one started with PostgreSQL URLs is recorded
    into while it is up). Telemetry stays off either way, as `up` keeps it.
    """
    home = home or gpuflow_home()
    stores = local_stores(home)
    env: dict[str, str | None] = {
        "PREFECT_HOME": str(stores.prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    plane = read_state(home)
    if plane is not None and serving(plane):
        return env | {
            "PREFECT_API_URL": plane.prefect_api_url,
            "MLFLOW_TRACKING_URI": plane.mlflow_url,
        }, plane
    return env | {
        "PREFECT_API_URL": None,  # a stale one from an earlier `up` would point nowhere
        "PREFECT_API_DATABASE_CONNECTION_URL": stores.prefect_database_url,
        # A new database is migrated first: on a busy small machine that takes longer than
        # Prefect's 20 s; as long as `up` waits for its own server.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(SERVER_START_TIMEOUT_S),
        "MLFLOW_TRACKING_URI": stores.mlflow_backend_uri,
    }, None


def _check_project(project_dir: Path) -> Path:
    project_dir = project_dir.resolve()
    if not (project_dir / "prefect.yaml").is_file():
        raise InvalidRequestError(
            f"{project_dir} has no prefect.yaml; pass --project-dir with the gpuflow checkout"
        )
    return project_dir


def _check_not_running(home: Path, node: str | None = None) -> None:
    existing = read_state(home, node)
    if existing and any(alive(s) for s in existing.services):
        what = f"node {node} has already joined" if node else "a control plane is already up"
        again = f"gpuflow down --node {node}" if node else "gpuflow down"
        raise InvalidRequestError(f"{what} (see {state_path(home, node)}); run `{again}` first")


class _Launcher:
    """Starts the services of one record, writing the record after each, so `down` can
    always clean up; ``check`` fails when one exited right after its start."""

    def __init__(self, plane: ControlPlane, home: Path, node: str | None = None) -> None:
        self.plane, self.path = plane, state_path(home, node)
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(
        self, name: str, argv: list[str], env: dict[str, str], url: str | None = None
    ) -> subprocess.Popen[bytes]:
        proc, service = start(name, argv, env, self.logs, Path(self.plane.project_dir))
        service.url = url
        self.procs.append(proc)
        self.plane.services.append(service)
        self.save()
        return proc

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        """Drop a service that exited at its start (it is retried under another port)."""
        i = self.procs.index(proc)
        del self.procs[i], self.plane.services[i]
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.plane.to_dict(), indent=2))

    def check(self) -> None:
        time.sleep(1.0)
        services = zip(self.plane.services, self.procs, strict=True)
        dead = [s.name for s, p in services if p.poll() is not None]
        if dead:
            raise ControlPlaneError(
                f"{', '.join(dead)} exited right after start (logs in {self.logs})"
            )


def _node_worker(node: str) -> tuple[str, list[str], dict[str, str]]:
    """(service name, argv, extra env) of the worker that owns ``node``: it takes runs from
    that node's queue only, and the train flow refuses a placement on another node."""
    argv = worker_argv(POOL, f"gpuflow-{node}", node_queue_name(node))
    return f"worker-{node}", argv, {"GPUFLOW_NODE": node}


def _exporter(address: ListenAddress, port: int, nodes: tuple[str, ...]) -> list[str]:
    """argv of this host's telemetry exporter: the nodes this host owns, or (none given)
    everything its backend sees. The health model is the registered champion, else the
    rules, as the monitor's."""
    argv = [console_script("gpuflow"), "telemetry", "serve", "--host", address.bind]
    argv += ["--port", str(port)]
    for node in nodes:
        argv += ["--node", node]
    return argv


def _start_exporter(
    launch: _Launcher,
    address: ListenAddress,
    port: int,
    nodes: tuple[str, ...],
    env: dict[str, str],
) -> None:
    """Start the exporter and wait until it serves its first snapshot. Port 0: a free port
    chosen now, not when `up` began - the exporter starts last, and a port found free a
    minute earlier may be taken by then (another process's ephemeral port); if it is taken
    in the instant between, another free port is tried."""
    for attempt in range(1, EXPORTER_PORT_ATTEMPTS + 1):
        chosen = free_port(address) if port == 0 else port
        url = address.url(chosen, "/metrics")
        proc = launch(EXPORTER, _exporter(address, chosen, nodes), env, url)
        try:
            wait_http(url, SERVER_START_TIMEOUT_S, proc, launch.logs / f"{EXPORTER}.log")
            return
        except ControlPlaneError as exc:
            if port != 0 or attempt == EXPORTER_PORT_ATTEMPTS or PORT_TAKEN not in str(exc):
                raise
            launch.forget(proc)


def _mlflow_server(
    address: ListenAddress,
    port: int,
    backend_uri: str,
    artifacts: str,
    default_artifact_root: str | None,
    base_env: dict[str, str],
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the MLflow server. Its stores go through the environment
    (MLflow's options read MLFLOW_BACKEND_STORE_URI, ...): a PostgreSQL URL carries a
    password, and argv is public on this machine and recorded in the state file."""
    env = {
        **base_env,
        "MLFLOW_BACKEND_STORE_URI": backend_uri,
        "MLFLOW_ARTIFACTS_DESTINATION": artifacts,
        # MLflow refuses requests whose Host header it does not know (DNS rebinding).
        "MLFLOW_SERVER_ALLOWED_HOSTS": address.allowed_host_headers,
        # MLflow's server-side job runner (six queue consumers) serves nothing gpuflow uses.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    env.pop("MLFLOW_DEFAULT_ARTIFACT_ROOT", None)
    if default_artifact_root:
        env["MLFLOW_DEFAULT_ARTIFACT_ROOT"] = default_artifact_root
    argv = [
        console_script("mlflow"),
        "server",
        "--host",
        address.bind,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    return argv, env


def _prefect_server(
    address: ListenAddress, port: int, database_url: str, api_url: str, base_env: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the Prefect server; the database URL in the environment."""
    env = {
        **base_env,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": api_url,
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
    }
    env.pop("PREFECT_API_URL")
    argv = [console_script("prefect"), "server", "start", "--host", address.bind, "--port"]
    return [*argv, str(port)], env


def up(
    project_dir: Path,
    prefect_port: int = DEFAULT_PREFECT_PORT,
    mlflow_port: int = DEFAULT_MLFLOW_PORT,
    workers: int = 1,
    node_workers: tuple[str, ...] = (),
    prefect_database_url: SecretStr | None = None,
    mlflow_backend_uri: SecretStr | None = None,
    mlflow_artifacts: str | None = None,
    deploy: bool = True,
    report: Report = print,
    host: str = LOOPBACK,
    exporter_port: int | None = DEFAULT_EXPORTER_PORT,
) -> ControlPlane:
    """Start the control plane on ``host``; on any failure stop what was started and raise.
    ``exporter_port`` None starts no telemetry exporter."""
    address = listen_address(host)
    home = gpuflow_home()
    _check_not_running(home)
    project_dir = _check_project(project_dir)
    if workers < 0:
        raise InvalidRequestError(f"workers must be >= 0, got {workers}")
    validate_node_names(node_workers)
    prefect_port, mlflow_port = check_port(address, prefect_port), check_port(address, mlflow_port)
    if exporter_port:  # 0 (any free port) is chosen when the exporter starts
        exporter_port = check_port(address, exporter_port)
    stores = local_stores(home)
    stores.mlflow_dir.mkdir(parents=True, exist_ok=True)

    plane = ControlPlane(
        home=str(home),
        project_dir=str(project_dir),
        pool=POOL,
        **local_urls(prefect_port, mlflow_port, address),
    )
    # The store URLs (passwords) reach only the server that uses each, not the workers.
    environ = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    base_env = {**environ, **plane.client_env(), "PREFECT_HOME": str(stores.prefect_home)}
    launch = _Launcher(plane, home)
    python = sys.executable

    try:
        report("starting Prefect server")
        database = prefect_database_url.get_secret_value() if prefect_database_url else None
        argv, env = _prefect_server(
            address,
            prefect_port,
            database or stores.prefect_database_url,
            plane.prefect_api_url,
            base_env,
        )
        prefect_proc = launch("prefect-server", argv, env, plane.prefect_ui_url)

        # Started beside Prefect's (each spends most of its start-up migrating its own
        # database), then waited for together.
        report("starting MLflow tracking server")
        # Local artifacts on a loopback plane: experiments the server creates get the plain
        # folder as their root, as those tasks/tracking.py creates without a server do, so a
        # process records into either way. Reachable from other hosts (or artifacts on S3),
        # the server proxies artifacts (mlflow-artifacts:): no host writes another's disk.
        artifacts = mlflow_artifacts or stores.mlflow_artifacts_uri
        local_root = None if mlflow_artifacts or not address.is_loopback else artifacts
        argv, env = _mlflow_server(
            address,
            mlflow_port,
            mlflow_backend_uri.get_secret_value()
            if mlflow_backend_uri
            else stores.mlflow_backend_uri,
            artifacts,
            local_root,
            base_env,
        )
        mlflow_proc = launch("mlflow-server", argv, env, plane.mlflow_url)
        for url, proc, name in (
            (plane.prefect_api_url, prefect_proc, "prefect-server"),
            (plane.mlflow_url, mlflow_proc, "mlflow-server"),
        ):
            wait_http(f"{url}/health", SERVER_START_TIMEOUT_S, proc, launch.logs / f"{name}.log")

        report(f"creating work pool {POOL}, registering and saving Blocks")
        setup = [python, "-m", "gpuflow.controlplane_blocks", "setup", POOL, plane.mlflow_url]
        run(setup, base_env, project_dir, "setting up the Prefect server")
        if deploy:
            report("applying every deployment of prefect.yaml")
            prefect = console_script("prefect")
            deploy_all = [prefect, "--no-prompt", "deploy", "--all"]
            run(deploy_all, base_env, project_dir, "prefect deploy --all", 600)
            plane.deployments = deployment_names(project_dir)
        if node_workers:
            report(f"registering node(s) {', '.join(node_workers)}")
            nodes = [python, "-m", "gpuflow.controlplane_blocks", "nodes", POOL, *node_workers]
            run(nodes, base_env, project_dir, "registering the nodes")
            if deploy:
                plane.deployments += _node_deployment_names(node_workers)
        for i in range(workers):
            report(f"starting worker {i + 1}/{workers}")
            argv = worker_argv(POOL, f"gpuflow-worker-{i + 1}", "default")
            launch(f"worker-{i + 1}", argv, base_env)
        for node in node_workers:
            report(f"starting the worker of node {node}")
            name, argv, extra = _node_worker(node)
            launch(name, argv, {**base_env, **extra})
        if exporter_port is not None:
            report("starting the telemetry exporter")
            _start_exporter(launch, address, exporter_port, node_workers, base_env)
        launch.check()
    except BaseException:
        report("start-up failed: stopping what was started")
        down(home, report=lambda _msg: None)
        raise
    launch.save()
    return plane


def _node_deployment_names(nodes: tuple[str, ...]) -> list[str]:
    from gpuflow.controlplane_nodes import PER_NODE_FLOWS, node_deployment_name

    return [node_deployment_name(f, n) for n in nodes for f in PER_NODE_FLOWS]


def _check_control(control_url: str) -> str:
    """``control_url`` (a Prefect API URL) if a Prefect server answers there."""
    url = control_url.strip().rstrip("/")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequestError(
            f"--control {control_url!r} is not a Prefect API URL such as http://CONTROL:4200/api"
        )
    try:
        # urlopen raises on any answer but 2xx.
        with urllib.request.urlopen(f"{url}/health", timeout=JOIN_CHECK_TIMEOUT_S):  # noqa: S310 - http(s) checked above
            pass
    except (urllib.error.URLError, OSError) as exc:
        raise InvalidRequestError(f"no Prefect API answers at --control {url} ({exc})") from None
    return url


def join(
    control_url: str,
    node: str,
    project_dir: Path,
    mlflow_url: str | None = None,
    report: Report = print,
    exporter_host: str = LOOPBACK,
    exporter_port: int | None = DEFAULT_EXPORTER_PORT,
) -> ControlPlane:
    """Join this host's ``node`` to the control plane whose Prefect API is ``control_url``:
    its queue and per-node deployments registered there, and a worker for it started here,
    with the node's telemetry exporter on ``exporter_host`` (None port: none) (recorded in
    join-<node>.json for `gpuflow down --node`)."""
    validate_node_names((node,))
    home = gpuflow_home()
    _check_not_running(home, node)
    project_dir = _check_project(project_dir)
    exporter_address = listen_address(exporter_host)
    if exporter_port:  # 0 (any free port) is chosen when the exporter starts
        exporter_port = check_port(exporter_address, exporter_port)
    control_url = _check_control(control_url)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    report(f"registering node {node} on {control_url}")
    with temporary_settings({PREFECT_API_URL: control_url}):
        mlflow_url = mlflow_url or read_mlflow_url()
        if not mlflow_url:
            raise InvalidRequestError(
                f"the control plane at {control_url} does not say where MLflow is "
                "(started by an older gpuflow?); pass --mlflow URL"
            )
        deployments = register_nodes((node,), POOL)
    plane = ControlPlane(
        home=str(home),
        project_dir=str(project_dir),
        prefect_api_url=control_url,
        prefect_ui_url=control_url.removesuffix("/api"),
        mlflow_url=mlflow_url,
        pool=POOL,
        deployments=deployments,
    )
    prefect_home = str(local_stores(home).prefect_home)
    env = {**os.environ, **plane.client_env(), "PREFECT_HOME": prefect_home}
    launch = _Launcher(plane, home, node)
    try:
        report(f"starting the worker of node {node}")
        name, argv, extra = _node_worker(node)
        launch(name, argv, {**env, **extra})
        if exporter_port is not None:
            report(f"starting the telemetry exporter of node {node}")
            _start_exporter(launch, exporter_address, exporter_port, (node,), env)
        launch.check()
    except BaseException:
        down(home, report=lambda _msg: None, node=node)
        raise
    return plane


def deployment_names(project_dir: Path) -> list[str]:
    import yaml

    doc = yaml.safe_load((project_dir / "prefect.yaml").read_text())
    return [f"{d['entrypoint'].rsplit(':', 1)[1]}/{d['name']}" for d in doc.get("deployments", [])]


def down(
    home: Path | None = None,
    timeout_s: float = 20.0,
    report: Report = print,
    node: str | None = None,
) -> list[str]:
    """Stop the services `up` started (with ``node``: `join --node`), and only those;
    return their names."""
    home = home or gpuflow_home()
    plane = read_state(home, node)
    if plane is None:
        what = f"no join of node {node}" if node else "no control plane"
        report(f"{what} recorded here; nothing to stop")
        return []
    # Workers first (a worker stopping still talks to the Prefect server), servers last.
    workers = [s for s in plane.services if s.name.startswith("worker-")]
    servers = [s for s in plane.services if s not in workers]
    stopped = stop(workers, timeout_s, report) + stop(servers, timeout_s, report)
    state_path(home, node).unlink(missing_ok=True)
    return stopped


def status(home: Path | None = None) -> list[dict[str, Any]]:
    plane = read_state(home)
    if plane is None:
        return []
    return [
        {"name": s.name, "pid": s.pid, "alive": alive(s), "url": s.url, "log": s.log}
        for s in plane.services
    ]
