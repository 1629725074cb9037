"""`gpuflow up` and `gpuflow join` refuse bad input before anything starts, and hand the
servers their database URLs through the environment, never argv (without starting them:
tests/gpuflow/test_two_hosts.py reads the running servers' /proc/<pid>/cmdline)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from typer.testing import CliRunner

from gpuflow import controlplane
from gpuflow.cli import app
from gpuflow.controlplane_address import listen_address

ROOT = Path(__file__).parents[2]
SECRET = "s3cret-pw-0123"
PG_URL = f"postgresql+psycopg://gpuflow:{SECRET}@db.example:5432/mlflow"


def _nothing_started(home: Path) -> None:
    assert not (home / "controlplane.json").exists() and not (home / "logs").exists()
    assert not list(home.glob("join-*.json"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"host": "no-such-host.invalid"}, "--host 'no-such-host.invalid'"),
        ({"host": "203.0.113.7"}, "on 203.0.113.7 cannot be bound"),
        ({"node_workers": ("a100-0", "bad node")}, r"node names \['bad node'\]"),
        ({"workers": -1}, "workers must be >= 0, got -1"),
        ({"prefect_port": 70000}, "port 70000 is not in 1..65535"),
        ({"exporter_port": 70000}, "port 70000 is not in 1..65535"),
    ],
)
def test_up_refuses_bad_input_before_starting_anything(
    gpuflow_home: Path, kwargs: dict, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        controlplane.up(ROOT, report=lambda _m: None, **kwargs)
    _nothing_started(gpuflow_home)


def test_up_names_a_project_without_prefect_yaml(gpuflow_home: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="has no prefect.yaml"):
        controlplane.up(tmp_path, report=lambda _m: None)
    _nothing_started(gpuflow_home)


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ("ftp://control:4200/api", "is not a Prefect API URL"),
        ("control:4200", "is not a Prefect API URL"),
        ("http://127.0.0.1:1/api", r"no Prefect API answers at --control http://127.0.0.1:1/api"),
    ],
)
def test_join_refuses_a_control_plane_it_cannot_reach(
    gpuflow_home: Path, control: str, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        controlplane.join(control, "a100-1", ROOT, report=lambda _m: None)
    _nothing_started(gpuflow_home)


def test_join_refuses_a_bad_exporter_address_before_registering(gpuflow_home: Path) -> None:
    # The control URL answers nothing: refused on the exporter's address before it is asked.
    with pytest.raises(InvalidRequestError, match="--host 'no-such-host.invalid'"):
        controlplane.join(
            "http://127.0.0.1:1/api",
            "a100-1",
            ROOT,
            report=lambda _m: None,
            exporter_host="no-such-host.invalid",
        )
    _nothing_started(gpuflow_home)


def test_join_refuses_a_bad_node_name(gpuflow_home: Path) -> None:
    result = CliRunner().invoke(
        app, ["join", "--control", "http://127.0.0.1:1/api", "--node", "a/b"]
    )
    assert result.exit_code == 2 and "node names ['a/b']" in result.output
    _nothing_started(gpuflow_home)


def test_down_of_a_node_that_never_joined_stops_nothing(gpuflow_home: Path) -> None:
    result = CliRunner().invoke(app, ["down", "--node", "a100-1"])
    assert result.exit_code == 0 and "no join of node a100-1 recorded here" in result.output


def test_database_urls_reach_the_servers_through_their_environment() -> None:
    address = listen_address("127.0.0.2")
    argv, env = controlplane._mlflow_server(
        address, 5000, PG_URL, "s3://bucket/mlflow", None, {"PATH": "/bin"}
    )
    assert SECRET not in " ".join(argv)
    assert env["MLFLOW_BACKEND_STORE_URI"] == PG_URL
    assert env["MLFLOW_ARTIFACTS_DESTINATION"] == "s3://bucket/mlflow"
    assert "MLFLOW_DEFAULT_ARTIFACT_ROOT" not in env  # proxied artifacts
    assert argv[argv.index("--host") + 1] == "127.0.0.2"
    assert "127.0.0.2:*" in env["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")

    prefect_url = PG_URL.replace("psycopg", "asyncpg")
    argv, env = controlplane._prefect_server(
        address, 4200, prefect_url, "http://127.0.0.2:4200/api", {"PREFECT_API_URL": "x"}
    )
    assert SECRET not in " ".join(argv) and "PREFECT_API_URL" not in env
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"] == prefect_url
    assert env["PREFECT_UI_API_URL"] == "http://127.0.0.2:4200/api"
    assert argv[argv.index("--host") + 1] == "127.0.0.2"
