"""`gpuflow energy evaluate|tune` end to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from gpuflow.hardware.select import get_backend
from typer.testing import CliRunner

from gpuflow.cli import app
from tests.helpers.traces import V100

runner = CliRunner()
TRACE = V100
KEYS = {"workload", "method", "power_limit_w", "energy_saving", "slowdown", "probes"}


def test_evaluate_prints_every_method_and_json_rows() -> None:
    out = runner.invoke(app, ["energy", "evaluate", "--trace", str(TRACE), "--slowdown", "0.10"])
    assert out.exit_code == 0, out.output
    for method in ("optimizer", "seed-rule", "profile-all", "max"):
        assert method in out.output
    out = runner.invoke(app, ["energy", "evaluate", "--trace", str(TRACE), "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert len(rows) == 68 * 4
    assert all(KEYS | {"oracle_energy_saving"} <= set(r) for r in rows)


def test_evaluate_refusals_name_the_problem(tmp_path: Path) -> None:
    out = runner.invoke(app, ["energy", "evaluate", "--trace", str(tmp_path / "x.csv")])
    assert out.exit_code == 2 and "no such file" in out.output
    bad = tmp_path / "bad.csv"
    bad.write_text("dataset,network\nx,y\n")
    out = runner.invoke(app, ["energy", "evaluate", "--trace", str(bad)])
    assert out.exit_code == 2 and "missing column" in out.output
    out = runner.invoke(
        app, ["energy", "evaluate", "--trace", str(TRACE), "--slowdown", "0.1", "--eta", "0.5"]
    )
    assert out.exit_code == 2 and "not both" in out.output
    out = runner.invoke(app, ["energy", "evaluate", "--trace", str(TRACE), "--eta", "3"])
    assert out.exit_code == 2 and "eta must be in [0, 1]" in out.output


def test_tune_restores_the_device_unless_kept() -> None:
    b = get_backend("sim")
    before = b.power_limits("v100-0", 0).limit_mw
    out = runner.invoke(
        app, ["energy", "tune", "--device", "v100-0:0", "--probe-s", "0.3", "--json"]
    )
    assert out.exit_code == 0, out.output
    choice = json.loads(out.output[out.output.index("{") :])
    assert choice["kept"] is False
    assert len(choice["probes"]) < 9  # 100..300 W in 25 W steps
    assert b.power_limits("v100-0", 0).limit_mw == before
    out = runner.invoke(
        app, ["energy", "tune", "--device", "v100-0:0", "--probe-s", "0.3", "--keep", "--json"]
    )
    assert out.exit_code == 0, out.output
    kept = json.loads(out.output[out.output.index("{") :])
    assert b.power_limits("v100-0", 0).limit_mw == round(kept["chosen"]["setting"] * 1000)


def test_tune_refusals() -> None:
    out = runner.invoke(app, ["energy", "tune", "--device", "v100-0"])
    assert out.exit_code == 2 and "NODE:INDEX" in out.output
    out = runner.invoke(app, ["energy", "tune", "--device", "nowhere-0:0"])
    assert out.exit_code != 0 and "nowhere-0" in out.output


def test_fit_prints_the_error_per_class_and_refuses_unknown_traces(tmp_path: Path) -> None:
    out = runner.invoke(app, ["energy", "fit", "--trace", str(TRACE), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    classes = {e["workload_class"] for e in report["errors"]}
    assert {"bert", "resnet", "all"} <= classes
    other = tmp_path / "summary_power_x9.csv"
    other.write_text(TRACE.read_text())
    out = runner.invoke(app, ["energy", "fit", "--trace", str(other)])
    assert out.exit_code == 2 and "no device known for 'x9'" in out.output


def test_seed_claim_on_the_twin_alone(tmp_path: Path) -> None:
    out = runner.invoke(app, ["energy", "seed-claim", "--traces", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {r["source"] for r in rows} == {"twin"}
    assert all(isinstance(r["median_change_pct"], float) for r in rows)
    out = runner.invoke(app, ["energy", "seed-claim", "--traces", str(tmp_path / "none")])
    assert out.exit_code == 2 and "no such folder" in out.output
