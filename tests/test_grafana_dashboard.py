"""deploy/grafana/gpuflow-fleet.json against the fields of Grafana's dashboard JSON model
(the classic model: grafana.com/docs/grafana/latest/visualizations/dashboards/
build-dashboards/view-dashboard-json-model/) that it uses, and every query against what the
exporter really serves: no Grafana installs here (none in PyPI or Debian main), so this is
what is checked instead (docs/telemetry.md)."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.telemetry.snapshot import catalogue, sample_name

from tests.helpers.telemetry import Scrape, busy_fleet, freeze_twin_clock, scrape, serving

DASHBOARD = Path(__file__).parents[1] / "deploy" / "grafana" / "gpuflow-fleet.json"
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "gauge"}  # core panel plugins used
GRID_COLUMNS = 24
METRIC = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|gpuflow_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|gpuflow_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
VARIABLE = re.compile(r"\$(\w+)")
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}
LABEL_VALUES = re.compile(r"^label_values\((\w+)(\{[^}]*\})?,\s*(\w+)\)$")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in dashboard["panels"] for t in p["targets"]]


def test_the_dashboard_has_the_fields_grafana_reads(dashboard: dict[str, Any]) -> None:
    assert isinstance(dashboard["uid"], str) and 0 < len(dashboard["uid"]) <= 40
    assert isinstance(dashboard["title"], str) and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert set(dashboard["time"]) == {"from", "to"}
    assert isinstance(dashboard["templating"]["list"], list)
    assert isinstance(dashboard["tags"], list) and isinstance(dashboard["refresh"], str)
    panels = dashboard["panels"]
    assert panels and len({p["id"] for p in panels}) == len(panels)
    assert len({p["title"] for p in panels}) == len(panels)
    for p in panels:
        assert p["type"] in PANEL_TYPES, p["title"]
        assert isinstance(p["title"], str) and p["title"].strip()
        assert p["datasource"] == DATASOURCE, p["title"]
        grid = p["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"} and all(isinstance(v, int) for v in grid.values())
        assert grid["h"] >= 1 and 1 <= grid["w"] <= GRID_COLUMNS
        assert grid["x"] >= 0 and grid["y"] >= 0 and grid["x"] + grid["w"] <= GRID_COLUMNS
        targets = p["targets"]
        assert targets, p["title"]
        assert len({t["refId"] for t in targets}) == len(targets)
        for t in targets:
            assert isinstance(t["expr"], str) and t["expr"].strip()
            assert t["datasource"] == DATASOURCE
    for a, b in itertools.combinations(panels, 2):  # no two panels cover the same cell
        ga, gb = a["gridPos"], b["gridPos"]
        apart = (
            ga["x"] + ga["w"] <= gb["x"]
            or gb["x"] + gb["w"] <= ga["x"]
            or ga["y"] + ga["h"] <= gb["y"]
            or gb["y"] + gb["h"] <= ga["y"]
        )
        assert apart, (a["title"], b["title"])


def test_its_variables_split_the_fleet_by_vendor_and_sku(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    queries = {}
    for name in ("vendor", "sku", "node"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == DATASOURCE
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        found = LABEL_VALUES.match(v["query"]["query"])
        assert found, v["query"]
        queries[name] = (found.group(1), found.group(3))
    assert queries["vendor"] == ("gpuflow_device_info", "vendor")
    assert queries["sku"] == ("gpuflow_device_info", "modelName")
    used = {m for _, t in _targets(dashboard) for m in VARIABLE.findall(t["expr"])}
    assert used - BUILTIN_VARIABLES <= set(variables)  # every $variable is defined
    assert {"vendor", "sku"} <= used


def test_every_query_names_a_metric_the_exporter_declares(dashboard: dict[str, Any]) -> None:
    declared = {sample_name(spec) for spec in catalogue()}
    for title, t in _targets(dashboard):
        names = set(METRIC.findall(t["expr"]))
        assert names, f"{title}: {t['expr']} names no gpuflow or DCGM metric"
        assert names <= declared, f"{title}: {names - declared} is not exported"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Scrape:
    """One scrape of the default twin with a MIG instance, a lease, a cordon and an XID."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUFLOW_HOME", str(tmp_path_factory.mktemp("dashboard-home")))
        freeze_twin_clock(mp, time.time())
        twin = SimBackend()
        inventory = Inventory()
        try:
            busy_fleet(twin, inventory)
            with serving(twin, inventory) as exporter:
                return scrape(exporter.url)
        finally:
            inventory.close()


def test_every_query_selects_series_and_labels_the_exporter_serves(
    dashboard: dict[str, Any], served: Scrape
) -> None:
    labels_of: dict[str, set[str]] = {}
    for s in served.samples:
        labels_of.setdefault(s.name, set()).update(s.labels)
    template_labels = {
        found.group(3)
        for v in dashboard["templating"]["list"]
        if v["type"] == "query" and (found := LABEL_VALUES.match(v["query"]["query"]))
    }
    assert template_labels <= labels_of["gpuflow_device_info"]
    for title, t in _targets(dashboard):
        expr = t["expr"]
        metrics = set(METRIC.findall(expr))
        missing = metrics - set(labels_of)
        assert not missing, f"{title}: no series of {missing} in a scrape of the twin"
        for metric, matchers in SELECTOR.findall(expr):
            unknown = set(MATCHER.findall(matchers)) - labels_of[metric]
            assert not unknown, f"{title}: {metric} has no label {unknown}"
        carried = set().union(*(labels_of[m] for m in metrics))
        grouped = {x.strip() for group in BY.findall(expr) for x in group.split(",") if x.strip()}
        assert grouped <= carried, f"{title}: by {grouped - carried}"
        legend = set(LEGEND.findall(t.get("legendFormat", "")))
        assert legend <= (grouped or carried), f"{title}: legend {legend}"
