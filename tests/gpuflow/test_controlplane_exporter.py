"""The telemetry exporter `gpuflow up` and `gpuflow join` start for their host: the real
`gpuflow telemetry serve` process, started the way up starts it (its own session and log,
recorded, /metrics awaited), scoped to the host's nodes, and stopped by `gpuflow down`.
(The whole of `up`, servers and all, is tests/gpuflow/test_controlplane.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuflow import controlplane
from gpuflow.controlplane_address import check_port, listen_address
from gpuflow.controlplane_procs import alive
from tests.helpers.telemetry import scrape

ROOT = Path(__file__).parents[2]


@pytest.mark.timeout(300)
def test_the_hosts_exporter_serves_its_nodes_until_down(gpuflow_home: Path) -> None:
    address = listen_address("127.0.0.1")
    port = check_port(address, 0)
    plane = controlplane.ControlPlane(
        home=str(gpuflow_home),
        project_dir=str(ROOT),
        pool=controlplane.POOL,
        **controlplane.local_urls(1, 2, address),
    )
    launch = controlplane._Launcher(plane, gpuflow_home)
    env = {**os.environ, "GPUFLOW_HOME": str(gpuflow_home), "GPUFLOW_BACKEND": "sim"}
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
