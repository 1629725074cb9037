"""The telemetry exporter `gpuflow up` and `gpuflow join` start for their host: the real
`gpuflow telemetry serve` process, started the way up starts it (its own session and log,
recorded, /metrics awaited), scoped to the host's nodes, and stopped by `gpuflow down`.
(The whole of `up`, servers and all, is tests/gpuflow/test_controlplane.py.)"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gpuflow import controlplane
from gpuflow.controlplane_address import check_port, free_port, listen_address
from gpuflow.controlplane_procs import alive
from tests.helpers.telemetry import scrape

ROOT = Path(__file__).parents[2]


def _launcher(home: Path, address) -> tuple[controlplane._Launcher, dict[str, str]]:
    """An empty plane's launcher, as `up` has it, and the exporter's environment."""
    plane = controlplane.ControlPlane(
        home=str(home),
        project_dir=str(ROOT),
        pool=controlplane.POOL,
        **controlplane.local_urls(1, 2, address),
    )
    env = {**os.environ, "GPUFLOW_HOME": str(home), "GPUFLOW_BACKEND": "sim"}
    return controlplane._Launcher(plane, home), env


@pytest.mark.timeout(300)
def test_the_hosts_exporter_serves_its_nodes_until_down(gpuflow_home: Path) -> None:
    address = listen_address("127.0.0.1")
    port = check_port(address, 0)
    launch, env = _launcher(gpuflow_home, address)
    try:
        controlplane._start_exporter(launch, address, port, ("a100-0", "dcu-0"), env)
        launch.check()
        launch.save()
        recorded = controlplane.read_state(gpuflow_home)
        assert recorded is not None
        url = f"http://127.0.0.1:{port}/metrics"
        assert recorded.exporter_url == url
        (service,) = recorded.services
        assert service.name == controlplane.EXPORTER and alive(service)
        assert service.argv[1:] == [
            "telemetry", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--node", "a100-0", "--node", "dcu-0",
        ]  # fmt: skip
        got = scrape(url)
        hosts = {s.labels["Hostname"] for s in got.find("DCGM_FI_DEV_GPU_TEMP")}
        assert hosts == {"a100-0", "dcu-0"}  # this host's nodes, not the whole twin
        assert got.find("gpuflow_exporter_info")[0].labels["nodes"] == "a100-0,dcu-0"
    finally:
        stopped = controlplane.down(gpuflow_home, report=lambda _m: None)
    assert stopped == [controlplane.EXPORTER]
    assert not alive(service)


@pytest.mark.timeout(300)
def test_any_port_is_chosen_at_start_and_a_taken_one_is_left_for_another(
    gpuflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Port 0: the exporter's port is found free when it starts, not when `up` began; the
    first one found is taken by someone else before the exporter binds it (a socket this
    test holds), so it tries another, and only the one that serves is recorded."""
    address = listen_address("127.0.0.1")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    chosen = [taken.getsockname()[1]]

    def free_port_then_taken(addr) -> int:  # the first pick is the held socket's port
        port = chosen[0] if len(chosen) == 1 else free_port(addr)
        chosen.append(port)
        return port

    monkeypatch.setattr(controlplane, "free_port", free_port_then_taken)
    launch, env = _launcher(gpuflow_home, address)
    try:
        controlplane._start_exporter(launch, address, 0, ("a100-0",), env)
        launch.check()
        recorded = controlplane.read_state(gpuflow_home)
        assert recorded is not None
        assert chosen[1] == taken.getsockname()[1] and chosen[2] != chosen[1]
        (service,) = recorded.services  # the attempt on the taken port is not recorded
        assert recorded.exporter_url == f"http://127.0.0.1:{chosen[2]}/metrics"
        assert scrape(recorded.exporter_url).find("gpuflow_exporter_info")
    finally:
        taken.close()
        controlplane.down(gpuflow_home, report=lambda _m: None)
    assert not alive(service)
