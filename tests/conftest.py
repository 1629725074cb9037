"""Suite-wide fixtures: every test gets its own GPUFLOW_HOME and the digital twin; an S3
server on loopback for the tests that need one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def gpuflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gpuflow-home"
    home.mkdir()
    monkeypatch.setenv("GPUFLOW_HOME", str(home))
    monkeypatch.setenv("GPUFLOW_BACKEND", "sim")
    # mlflow.set_tracking_uri also writes these into the environment; without this the
    # first test's store would leak into every later test of the process.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    return home


REGION = "us-east-1"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 (and IAM) server on 127.0.0.1 with a free port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    empty = tmp_path_factory.mktemp("aws-config") / "none"
    with pytest.MonkeyPatch.context() as env:
        # Dummy credentials, and nothing from the developer's own AWS setup.
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", REGION)
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        env.setenv("AWS_CONFIG_FILE", str(empty))
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
