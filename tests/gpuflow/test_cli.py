"""The `gpuflow` CLI on the default twin: what the foundation issue's 'Done when' asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gpuflow.cli import app
from gpuflow.tour import tour_plan_path

runner = CliRunner()


def _gpuflow(*args: str) -> subprocess.CompletedProcess[str]:
    """The real console script in a separate process (same GPUFLOW_HOME)."""
    exe = Path(sys.executable).with_name("gpuflow")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=120, env=os.environ.copy()
    )


def test_hw_list_json_lists_the_mixed_fleet() -> None:
    result = runner.invoke(app, ["hw", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 18
    assert len({r["sku"] for r in rows}) >= 3
    assert {r["vendor"] for r in rows} == {"NVIDIA", "Hygon"}
    for key in ("node", "index", "vendor", "sku", "memory_total_mb", "partitions"):
        assert all(key in r for r in rows)


def test_hw_list_table_shows_health() -> None:
    result = runner.invoke(app, ["hw", "list"])
    assert result.exit_code == 0
    assert "A100-SXM4-40GB" in result.stdout and "Hygon DCU" in result.stdout


def test_partition_apply_assert_export_round_trip(tmp_path: Path) -> None:
    plan = str(tour_plan_path())
    applied = runner.invoke(app, ["hw", "partition", "apply", "-f", plan, "-c", "tour"])
    assert applied.exit_code == 0, applied.output
    assert "4 device(s) changed" in applied.stdout
    again = runner.invoke(app, ["hw", "partition", "apply", "-f", plan, "-c", "tour"])
    assert "0 device(s) changed" in again.stdout  # idempotent
    assert (
        runner.invoke(app, ["hw", "partition", "assert", "-f", plan, "-c", "tour"]).exit_code == 0
    )
    out = tmp_path / "current.yaml"
    assert (
        runner.invoke(app, ["hw", "partition", "export", "--with-nodes", "-f", str(out)]).exit_code
        == 0
    )
    doc = yaml.safe_load(out.read_text())
    entries = doc["mig-configs"]["current"]
    a100_0 = next(e for e in entries if e.get("nodes") == ["a100-0"] and e["devices"] == [0])
    assert a100_0["mig-devices"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    # The inventory saw the new partitions (schedulers read it).
    from gpuflow.hardware.inventory import Inventory

    assert len(Inventory().partitions(node="dcu-0")) == 4


def test_assert_fails_on_an_unapplied_plan() -> None:
    result = runner.invoke(
        app, ["hw", "partition", "assert", "-f", str(tour_plan_path()), "-c", "tour"]
    )
    assert result.exit_code == 1
    assert "mismatch" in result.stderr


def test_impossible_plan_exits_nonzero_naming_device_and_rule() -> None:
    before = runner.invoke(app, ["hw", "partition", "export", "--with-nodes"]).stdout
    result = runner.invoke(
        app, ["hw", "partition", "apply", "-f", str(tour_plan_path()), "-c", "impossible"]
    )
    assert result.exit_code == 2
    assert "v100-0:0" in result.stderr and "Tesla V100-SXM2-32GB" in result.stderr
    assert "no-mig" in result.stderr or "MIG" in result.stderr
    assert runner.invoke(app, ["hw", "partition", "export", "--with-nodes"]).stdout == before
    # a100-1 was valid in the same plan, yet nothing was applied to it either.
    rows = json.loads(runner.invoke(app, ["hw", "list", "--json"]).stdout)
    assert all(not r["partitions"] for r in rows if r["node"] == "a100-1")


def test_bad_inputs_are_clean_errors(tmp_path: Path) -> None:
    missing = runner.invoke(
        app, ["hw", "partition", "apply", "-f", str(tmp_path / "nope.yaml"), "-c", "x"]
    )
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    bad_device = runner.invoke(app, ["sim", "inject", "--device", "a100-0", "--fault", "hbm"])
    assert bad_device.exit_code == 2 and "NODE:INDEX" in bad_device.stderr
    bad_kind = runner.invoke(app, ["sim", "inject", "--device", "a100-0:0", "--fault", "meteor"])
    assert bad_kind.exit_code == 2 and "xid79" in bad_kind.stderr
    bad_backend = runner.invoke(app, ["hw", "list", "--backend", "cuda"])
    assert bad_backend.exit_code == 2 and "not one of" in bad_backend.stderr


def test_train_refuses_bad_input_before_any_flow_runs() -> None:
    unknown = runner.invoke(app, ["train", "--model", "gpt-5"])
    assert unknown.exit_code == 2 and "unknown model" in unknown.stderr
    policy = runner.invoke(app, ["train", "--precision", "int4"])
    assert policy.exit_code == 2 and "precision" in policy.stderr
    s3_without_bucket = runner.invoke(app, ["train", "--storage", "s3"])
    assert s3_without_bucket.exit_code == 2 and "bucket" in s3_without_bucket.stderr
    from gpuflow.tasks.tracking import tracking_uri
    from mlflow.tracking import MlflowClient

    # Nothing recorded: the store (new, migrated) holds MLflow's Default experiment only.
    assert [e.name for e in MlflowClient(tracking_uri()).search_experiments()] == ["Default"]


def test_injected_fault_shows_in_another_process_telemetry() -> None:
    injected = _gpuflow("sim", "inject", "--device", "a100-1:2", "--fault", "remap-pending")
    assert injected.returncode == 0, injected.stderr
    lost = _gpuflow("sim", "inject", "--device", "v100-0:3", "--fault", "xid79")
    assert lost.returncode == 0, lost.stderr
    listed = _gpuflow("hw", "list", "--json")
    rows = {(r["node"], r["index"]): r for r in json.loads(listed.stdout)}
    assert rows[("a100-1", 2)]["health"] == "critical"
    assert "row remap pending" in rows[("a100-1", 2)]["health_reasons"]
    assert rows[("v100-0", 3)]["health"] == "lost"
    assert rows[("a100-1", 1)]["health"] == "ok"


def test_assert_tells_a_mismatch_from_a_failure_and_c_defaults_to_the_only_config(
    tmp_path: Path, monkeypatch
) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("version: v1\nmig-configs:\n  off:\n    - {devices: all, mig-enabled: false}\n")
    assert runner.invoke(app, ["hw", "partition", "apply", "-f", str(one)]).exit_code == 0
    assert runner.invoke(app, ["hw", "partition", "assert", "-f", str(one)]).exit_code == 0
    two = runner.invoke(app, ["hw", "partition", "assert", "-f", str(tour_plan_path())])
    assert two.exit_code == 2 and "name one" in two.stderr  # several configs: -c needed

    from gpuflow.hardware import partition
    from gpuflow.hardware.backend import HardwareError

    def broken(*args, **kwargs):
        raise HardwareError("NVML: the driver stopped answering")

    monkeypatch.setattr(partition, "assert_plan", broken)
    failed = runner.invoke(app, ["hw", "partition", "assert", "-f", str(one)])
    assert failed.exit_code == 2 and "driver stopped answering" in failed.stderr


def test_every_command_keeps_prefect_server_telemetry_off_unless_the_user_turned_it_on(
    monkeypatch,
) -> None:
    """A temporary Prefect server (a command run without `gpuflow up`) inherits this."""
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    assert runner.invoke(app, ["hw", "list", "--json"]).exit_code == 0
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")
    assert runner.invoke(app, ["hw", "list", "--json"]).exit_code == 0
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"
