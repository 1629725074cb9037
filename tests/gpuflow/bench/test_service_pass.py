"""`gpuflow bench scheduler`'s service-pass section on a small fleet: real passes over a
real inventory, on SQLite always and on the PostgreSQL that GPUFLOW_BENCH_POSTGRES_URL
names."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.scheduling.trace import fleet_gpus, study_fleet
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from gpuflow.bench.service_pass import (
    NOT_MEASURED,
    POSTGRES_URL_ENV,
    StudyFleetBackend,
    service_pass,
)


def _table_names(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        return inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_the_study_fleet_backend_reports_every_gpu_once() -> None:
    devices = StudyFleetBackend(study_fleet()).devices()
    assert len(devices) == fleet_gpus(study_fleet()) == 10_000
    assert len({d.uuid for d in devices}) == len({(d.node, d.index) for d in devices}) == 10_000
    assert {d.vendor for d in devices} == {"NVIDIA", "Hygon"}


def _check_passes(section: dict, store: str) -> None:
    assert section["store"] == store and section["measured"] is True
    assert section["fleet_gpus"] == 200 and section["passes"] == 12
    # The queue was topped up to 40; the settle pass placed what of it fit at once.
    assert section["queued_at_start"] + section["settle_placed"] >= 40
    assert section["queued_at_start"] > 0 and section["running_jobs_at_start"] > 0
    assert section["rebuilds_in_timed_passes"] == 0  # the engine was kept across passes
    # Every pass had work: jobs finished before it (a pass may still place nothing, when
    # what they freed fits no queued job), and the passes placed some of the queue.
    assert section["finished_between_passes"] == 12 * 3
    assert section["placed_total"] > 0 and section["pass_errors"] == 0
    assert 0 < section["pass_p50_ms"] <= section["pass_p99_ms"] <= section["pass_max_ms"]
    assert section["read_p50_ms"] > 0 and section["write_p50_ms"] > 0


@pytest.mark.slow
def test_service_pass_on_sqlite_without_a_postgres_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POSTGRES_URL_ENV, raising=False)
    out = service_pass(quick=True, report=lambda _: None)
    _check_passes(out["service_pass_sqlite"], "sqlite")
    assert out["service_pass_sqlite"]["url"].startswith("sqlite:///")
    assert out["service_pass_postgres"] == {
        "store": "postgres",
        "measured": False,
        "note": NOT_MEASURED,
    }


@pytest.mark.slow
@pytest.mark.parametrize("inventory_url", ["postgres"], indirect=True)
def test_service_pass_uses_the_postgres_the_environment_names(
    inventory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POSTGRES_URL_ENV, inventory_url)
    out = service_pass(quick=True, report=lambda _: None)
    _check_passes(out["service_pass_postgres"], "postgres")
    assert out["service_pass_postgres"]["url"] == make_url(inventory_url).render_as_string(
        hide_password=True
    )
    assert _table_names(inventory_url) == []  # the bench dropped what it made
    # A database that already holds an inventory is refused before anything runs.
    Inventory(inventory_url).close()
    with pytest.raises(InvalidRequestError, match="empty throwaway database.*gf_jobs"):
        service_pass(quick=True, report=lambda _: None)
    assert "gf_jobs" in _table_names(inventory_url)  # and left as it was
