"""`gpuflow up` / `gpuflow down`: a local control plane, and only what it started.

up: Prefect server (SQLite under GPUFLOW_HOME, or a PostgreSQL URL) → MLflow tracking
server (SQLite under GPUFLOW_HOME or a given URL; artifacts local or on S3) → the process
work pool → Blocks registered and saved → every deployment of prefect.yaml applied (with
schedules and event triggers) → worker(s). Every process gets its own session (process
group) and a log under GPUFLOW_HOME/logs; their pids and command lines go to
GPUFLOW_HOME/controlplane.json, which is all `down` acts on.

``local_stores`` names where those records live by default, and ``recording_env`` lets
another process (the tour) record there, so `gpuflow up` shows its runs afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.home import gpuflow_home

STATE_FILE = "controlplane.json"
POOL = "gpuflow-process"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
SERVER_START_TIMEOUT_S = 180  # a server's first start migrates its database
Report = Callable[[str], None]


class ControlPlaneError(RuntimeError):
    """A service did not come up; what was started has been stopped again."""


@dataclass
class Service:
    name: str
    pid: int
    argv: list[str]
    log: str
    url: str | None = None
    start_ticks: int | None = None  # /proc start time: tells our process from a reused pid


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
    prefect_port: int = DEFAULT_PREFECT_PORT, mlflow_port: int = DEFAULT_MLFLOW_PORT
) -> dict[str, str]:
    """The URLs of a control plane on these loopback ports (ControlPlane's fields)."""
    return {
        "prefect_api_url": f"http://127.0.0.1:{prefect_port}/api",
        "prefect_ui_url": f"http://127.0.0.1:{prefect_port}",
        "mlflow_url": f"http://127.0.0.1:{mlflow_port}",
    }


def _bin(name: str) -> str:
    """A console script of this environment (prefect, mlflow), never one found on PATH."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise ControlPlaneError(f"{name} is not installed in {Path(sys.executable).parent}")
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port(port: int) -> int:
    if port == 0:
        return _free_port()
    if not 1 <= port <= 65535:
        raise InvalidRequestError(f"port {port} is not in 1..65535")
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise InvalidRequestError(
                f"port {port} on 127.0.0.1 is in use; pick another (--prefect-port/--mlflow-port, 0 = any)"
            ) from None
    return port


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ControlPlaneError(
                f"{url} never came up: the process exited ({proc.returncode}):\n{tail}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - loopback URL we built
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise ControlPlaneError(f"{url} did not answer within {timeout_s:.0f} s (log: {log})")


def _start(
    name: str, argv: list[str], env: dict[str, str], logs: Path, cwd: Path
) -> tuple[subprocess.Popen[bytes], Service]:
    log = logs / f"{name}.log"
    out = log.open("ab")
    proc = subprocess.Popen(  # noqa: S603 - argv list of our own console scripts
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=str(cwd),
        start_new_session=True,
    )
    out.close()
    started = _proc_start(proc.pid)
    return proc, Service(
        name=name,
        pid=proc.pid,
        argv=argv,
        log=str(log),
        start_ticks=started[0] if started else None,
    )


def _run(argv: list[str], env: dict[str, str], cwd: Path, what: str, timeout_s: float = 300) -> str:
    done = subprocess.run(  # noqa: S603 - argv list of our own console scripts
        argv,
        env=env,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise ControlPlaneError(
            f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def state_path(home: Path | None = None) -> Path:
    return (home or gpuflow_home()) / STATE_FILE


def read_state(home: Path | None = None) -> ControlPlane | None:
    path = state_path(home)
    if not path.exists():
        return None
    return ControlPlane.from_dict(json.loads(path.read_text()))


def _proc_start(pid: int) -> tuple[int, str] | None:
    """(start time in clock ticks, state) of a process, from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[19]), fields[0]


def _alive(service: Service) -> bool:
    """The pid runs and is still the process we started (pids get reused)."""
    found = _proc_start(service.pid)
    return found is not None and found[1] != "Z" and found[0] == service.start_ticks


def serving(plane: ControlPlane) -> bool:
    """Both servers of ``plane`` still run (workers do not matter to a client)."""
    servers = [s for s in plane.services if s.name in ("prefect-server", "mlflow-server")]
    return len(servers) == 2 and all(_alive(s) for s in servers)


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
) -> ControlPlane:
    """Start the control plane; on any failure stop what was started and raise."""
    home = gpuflow_home()
    existing = read_state(home)
    if existing and any(_alive(s) for s in existing.services):
        raise InvalidRequestError(
            f"a control plane is already up (see {state_path(home)}); run `gpuflow down` first"
        )
    project_dir = project_dir.resolve()
    if not (project_dir / "prefect.yaml").is_file():
        raise InvalidRequestError(
            f"{project_dir} has no prefect.yaml; pass --project-dir with the gpuflow checkout"
        )
    if workers < 0:
        raise InvalidRequestError(f"workers must be >= 0, got {workers}")
    bad = [n for n in node_workers if not n or not all(c.isalnum() or c in "-_." for c in n)]
    if bad:
        raise InvalidRequestError(f"node worker names {bad} must be letters, digits, '-', '_', '.'")
    prefect_port, mlflow_port = _check_port(prefect_port), _check_port(mlflow_port)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stores = local_stores(home)
    stores.mlflow_dir.mkdir(parents=True, exist_ok=True)

    plane = ControlPlane(
        home=str(home),
        project_dir=str(project_dir),
        pool=POOL,
        **local_urls(prefect_port, mlflow_port),
    )
    base_env = {**os.environ, **plane.client_env(), "PREFECT_HOME": str(stores.prefect_home)}
    procs: list[subprocess.Popen[bytes]] = []

    def launch(
        name: str, argv: list[str], env: dict[str, str], url: str | None = None
    ) -> subprocess.Popen[bytes]:
        proc, service = _start(name, argv, env, logs, project_dir)
        service.url = url
        procs.append(proc)
        plane.services.append(service)
        state_path(home).write_text(
            json.dumps(plane.to_dict(), indent=2)
        )  # down can always clean up
        return proc

    try:
        report("starting Prefect server")
        server_env = {
            **base_env,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_API_URL": plane.prefect_api_url,
        }
        server_env.pop("PREFECT_API_URL")
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = (
            prefect_database_url.get_secret_value()
            if prefect_database_url
            else stores.prefect_database_url
        )
        proc = launch(
            "prefect-server",
            [
                _bin("prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(prefect_port),
            ],
            server_env,
            plane.prefect_ui_url,
        )
        _wait_http(
            f"{plane.prefect_api_url}/health",
            SERVER_START_TIMEOUT_S,
            proc,
            logs / "prefect-server.log",
        )

        report("starting MLflow tracking server")
        backend = (
            mlflow_backend_uri.get_secret_value()
            if mlflow_backend_uri
            else stores.mlflow_backend_uri
        )
        artifacts = mlflow_artifacts or stores.mlflow_artifacts_uri
        # Local artifacts: experiments the server creates get the plain folder as their
        # root, as those tasks/tracking.py creates without a server do, so a process
        # records into either way (an mlflow-artifacts: root needs the server to write).
        artifact_root = [] if mlflow_artifacts else ["--default-artifact-root", artifacts]
        # MLflow's server-side job runner (six queue consumers) serves nothing gpuflow uses.
        mlflow_env = {**base_env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        proc = launch(
            "mlflow-server",
            [
                _bin("mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(mlflow_port),
                "--backend-store-uri",
                backend,
                "--artifacts-destination",
                artifacts,
                *artifact_root,
                "--workers",
                "1",
            ],
            mlflow_env,
            plane.mlflow_url,
        )
        _wait_http(
            f"{plane.mlflow_url}/health", SERVER_START_TIMEOUT_S, proc, logs / "mlflow-server.log"
        )

        report(f"creating work pool {POOL}")
        prefect = _bin("prefect")
        _run(
            [
                prefect,
                "--no-prompt",
                "work-pool",
                "create",
                POOL,
                "--type",
                "process",
                "--overwrite",
            ],
            base_env,
            project_dir,
            "creating the work pool",
        )
        report("registering and saving Blocks")
        _run(
            [prefect, "--no-prompt", "block", "register", "-m", "gpuflow.blocks"],
            base_env,
            project_dir,
            "registering blocks",
        )
        _run(
            [sys.executable, "-m", "gpuflow.controlplane_blocks"],
            base_env,
            project_dir,
            "saving default blocks",
        )
        if deploy:
            report("applying every deployment of prefect.yaml")
            _run(
                [prefect, "--no-prompt", "deploy", "--all"],
                base_env,
                project_dir,
                "prefect deploy --all",
                600,
            )
            plane.deployments = deployment_names(project_dir)
        for i in range(workers):
            report(f"starting worker {i + 1}/{workers}")
            launch(
                f"worker-{i + 1}",
                [
                    prefect,
                    "worker",
                    "start",
                    "--pool",
                    POOL,
                    "--name",
                    f"gpuflow-worker-{i + 1}",
                    "--work-queue",
                    "default",
                ],
                base_env,
            )
        for node in node_workers:
            # A worker that owns one node: it takes runs from that node's queue only, and
            # the train flow refuses a placement on another node (GPUFLOW_NODE).
            report(f"starting the worker of node {node}")
            _run(
                [
                    prefect,
                    "--no-prompt",
                    "work-queue",
                    "create",
                    node_queue_name(node),
                    "--pool",
                    POOL,
                ],
                base_env,
                project_dir,
                f"creating the work queue of node {node}",
            )
            launch(
                f"worker-{node}",
                [
                    prefect,
                    "worker",
                    "start",
                    "--pool",
                    POOL,
                    "--name",
                    f"gpuflow-{node}",
                    "--work-queue",
                    node_queue_name(node),
                ],
                {**base_env, "GPUFLOW_NODE": node},
            )
        time.sleep(1.0)
        dead = [s.name for s, p in zip(plane.services, procs, strict=True) if p.poll() is not None]
        if dead:
            raise ControlPlaneError(f"{', '.join(dead)} exited right after start (logs in {logs})")
    except BaseException:
        report("start-up failed: stopping what was started")
        down(home, report=lambda _msg: None)
        raise
    state_path(home).write_text(json.dumps(plane.to_dict(), indent=2))
    return plane


def node_queue_name(node: str) -> str:
    """The work queue whose worker owns ``node`` (see tasks/worker_queues.py)."""
    from gpuflow.tasks.worker_queues import node_queue_name as name

    return name(node)


def deployment_names(project_dir: Path) -> list[str]:
    import yaml

    doc = yaml.safe_load((project_dir / "prefect.yaml").read_text())
    return [f"{d['entrypoint'].rsplit(':', 1)[1]}/{d['name']}" for d in doc.get("deployments", [])]


def down(home: Path | None = None, timeout_s: float = 20.0, report: Report = print) -> list[str]:
    """Stop the services `up` started (and only those); return their names."""
    home = home or gpuflow_home()
    plane = read_state(home)
    if plane is None:
        report("no control plane recorded here; nothing to stop")
        return []
    stopped = []
    for service in reversed(plane.services):  # workers first, the server last
        if not _alive(service):
            continue
        try:
            os.killpg(service.pid, signal.SIGTERM)  # its own session: the whole group
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout_s
        while _alive(service) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(service):
            os.killpg(service.pid, signal.SIGKILL)
        _reap(service.pid)
        report(f"stopped {service.name} (pid {service.pid})")
        stopped.append(service.name)
    state_path(home).unlink(missing_ok=True)
    return stopped


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (started by another `gpuflow up` process)


def status(home: Path | None = None) -> list[dict[str, Any]]:
    plane = read_state(home)
    if plane is None:
        return []
    return [
        {"name": s.name, "pid": s.pid, "alive": _alive(s), "url": s.url, "log": s.log}
        for s in plane.services
    ]
