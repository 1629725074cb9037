"""Suite-wide fixtures: every test gets its own GPUFLOW_HOME and the digital twin; an S3
server on loopback for the tests that need one; inventory databases on SQLite and on a
real PostgreSQL."""

from __future__ import annotations

import importlib.util
import logging
import os
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


# -- PostgreSQL ----------------------------------------------------------------------------
# The inventory's concurrency (leases, races, the scheduler's passes) runs on SQLite and on a
# real PostgreSQL: a throwaway server for the session (tests/helpers/postgres.py), or the
# database GPUFLOW_TEST_POSTGRES_URL names (its tables are dropped before each test).
# Without either the PostgreSQL tests fail with what to install: they never skip.
POSTGRES_URL_ENV = "GPUFLOW_TEST_POSTGRES_URL"
POSTGRES_SERVER = pytest.StashKey[str]()  # what the summary line says the server was
POSTGRES_PROPERTY = ("inventory_backend", "postgres")
POSTGRES_SERVER_PROPERTY = "postgres_server"  # rides on reports back from xdist workers


@pytest.fixture(scope="session")
def postgres_url(pytestconfig: pytest.Config) -> Iterator[str]:
    """SQLAlchemy URL of a PostgreSQL database for the whole session."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.fail(
            "the psycopg driver is missing: pip install -e '.[dev]' (or 'psycopg[binary]>=3.1')",
            pytrace=False,
        )
    external = os.environ.get(POSTGRES_URL_ENV)
    if external:
        pytestconfig.stash[POSTGRES_SERVER] = f"the PostgreSQL of {POSTGRES_URL_ENV}"
        yield _worker_schema(external)
        return
    from tests.helpers.postgres import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        unavailable = str(exc)  # failed outside the handler: no chained traceback
    else:
        unavailable = ""
    if unavailable:
        pytest.fail(f"no PostgreSQL for the tests: {unavailable}", pytrace=False)
    pytestconfig.stash[POSTGRES_SERVER] = (
        f"a throwaway PostgreSQL {server.version}, started in {server.started_in_s:.1f} s"
    )
    try:
        yield server.url
    finally:
        server.stop()


def _worker_schema(url: str) -> str:
    """``url`` for this xdist worker alone: one database, a schema per worker (each worker
    wipes its tables before every test), made on first use."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return url
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"gpuflow_test_{worker}"
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{name}"'))
    finally:
        engine.dispose()
    parsed = make_url(url)
    return parsed.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
        hide_password=False
    )


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real (temporary, local) Prefect server for the rest of the session, started once
    by whichever test needs one first (every test under tests/flows/ does); its database
    starts as a copy of a migrated empty one (tests/helpers/store_templates.py)."""
    from unittest import mock

    from prefect.testing import utilities as harness

    from tests.helpers.store_templates import seed

    # The harness makes its database "prefect-test.db" in a folder of its own (mkdtemp).
    folder = tmp_path_factory.mktemp("prefect-harness")
    seed(folder / "prefect-test.db")
    with (
        mock.patch.object(harness, "mkdtemp", return_value=str(folder)),
        harness.prefect_test_harness(server_startup_timeout=120),
    ):
        yield


@pytest.fixture(params=["sqlite", "postgres"])
def inventory_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty inventory database: a SQLite file, or the session's PostgreSQL wiped."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'inv.db'}"
    from sqlalchemy import MetaData, create_engine

    request.node.user_properties.append(POSTGRES_PROPERTY)  # counted even if no server
    url = request.getfixturevalue("postgres_url")
    server = request.config.stash.get(POSTGRES_SERVER, "")
    request.node.user_properties.append((POSTGRES_SERVER_PROPERTY, server))
    # Every table, not only the inventory's: the remediation ledger lives there too.
    engine = create_engine(url)
    try:
        tables = MetaData()
        tables.reflect(engine)
        tables.drop_all(engine)
    finally:
        engine.dispose()
    return url


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """One line saying how many tests ran against PostgreSQL, so a run shows they did."""
    outcomes: dict[str, int] = {}
    servers: set[str] = set()  # one per xdist worker
    for outcome in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            properties = list(getattr(report, "user_properties", ()))
            if POSTGRES_PROPERTY in properties:
                if report.when == "call" or outcome == "error":
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                servers |= {v for k, v in properties if k == POSTGRES_SERVER_PROPERTY and v}
    if outcomes:
        server = "; ".join(sorted(servers)) or "no server (see the errors)"
        counts = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())
        terminalreporter.write_line(f"PostgreSQL tests, {server}: {counts}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that start real servers first, the slow ones of them first of all: they
    are the longest, and xdist hands files out in this order (`make test` passes
    --no-loadscope-reorder: by default xdist sorts files by their number of tests, which
    sent the two slowest files, of two and five tests, to the end), so the two slowest
    start at once on the two workers and both end together (the same order in every
    worker: a stable sort)."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("integration") is None,
            item.get_closest_marker("slow") is None,
        )
    )
