"""deploy/prometheus/prometheus.yml: the scrape config docs/telemetry.md shows, checked for
what Prometheus needs of it: unique job names, host:port targets on the exporter's port and
path, and a scrape no faster than the exporter's refresh is useful."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import yaml
from gpuflow.tasks.telemetry.settings import DEFAULT_PORT, MIN_INTERVAL_S

CONFIG = Path(__file__).parents[1] / "deploy" / "prometheus" / "prometheus.yml"
DOC = Path(__file__).parents[1] / "docs" / "telemetry.md"
DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")
UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    found = DURATION.match(text)
    assert found, f"{text!r} is not a Prometheus duration"
    return int(found.group(1)) * UNIT_S[found.group(2)]


def test_jobs_scrape_the_exporters_port_and_path() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert set(config) == {"global", "scrape_configs"}
    interval = _seconds(config["global"]["scrape_interval"])
    assert _seconds(config["global"]["scrape_timeout"]) < interval
    jobs = config["scrape_configs"]
    names = [j["job_name"] for j in jobs]
    assert names == ["gpuflow-local", "gpuflow-fleet"] and len(set(names)) == len(names)
    for job in jobs:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        assert _seconds(job.get("scrape_interval", config["global"]["scrape_interval"])) >= (
            MIN_INTERVAL_S
        )
        targets = [t for group in job["static_configs"] for t in group["targets"]]
        assert targets, job["job_name"]
        for target in targets:
            host, _, port = target.rpartition(":")
            ipaddress.ip_address(host)  # an address, as `gpuflow up --host` prints it
            assert int(port) == DEFAULT_PORT, target
    local = [t for g in jobs[0]["static_configs"] for t in g["targets"]]
    assert local == [f"127.0.0.1:{DEFAULT_PORT}"]  # where `gpuflow up` serves by default


def test_the_doc_shows_this_very_file() -> None:
    assert CONFIG.read_text().strip() in DOC.read_text()
