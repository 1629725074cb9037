"""`gpuflow edge plan` and `status` through Typer's CliRunner (deploy: tests/flows)."""

from __future__ import annotations

import json
from pathlib import Path

from gpuflow.tasks.edge.manifest import verify_shard
from typer.testing import CliRunner

from gpuflow.cli_edge import app


def test_plan_prints_both_splits_and_packages(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "pkg"
    result = runner.invoke(
        app,
        [
            "plan",
            "resnet18-digits",
            "--nodes",
            "3",
            "--speed",
            "1",
            "--speed",
            "2",
            "--speed",
            "1",
            "--runs",
            "3",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_cut_points"] == 20
    assert len(summary["dp"]["shards"]) == 3
    # Both splits, over the same nodes; which is faster is test_slice_serve's (here the
    # plan is settled on timings, which may run out of rounds: planning_settled says so).
    assert len(summary["equal_ops"]["shards"]) == 3 and summary["equal_ops"]["balance"] >= 1.0
    assert {s["node"] for s in summary["equal_ops"]["shards"]} == {
        s["node"] for s in summary["dp"]["shards"]
    }
    assert isinstance(summary["planning_settled"], bool)
    dp = summary["dp"]
    assert max(s["stage_ms"] for s in dp["shards"]) == dp["bottleneck_ms"]
    # The 2x node counts double in the ideal: total compute over a total speed of 4.
    assert (
        dp["ideal_ms"] * 4 == summary["total_ms"]
        or abs(dp["ideal_ms"] * 4 - summary["total_ms"]) < 1e-9
    )
    for i in range(3):
        assert verify_shard(out / "shards" / f"shard-{i}").shard_index == i


def test_plan_and_status_errors_are_one_line() -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["plan", "resnet18-digits", "--nodes", "2", "--speed", "1"])
    assert bad.exit_code == 2 and "one per node" in bad.output
    unknown = runner.invoke(app, ["plan", "resnet9000"])
    assert unknown.exit_code == 2 and "unknown model" in unknown.output
    assert "no edge deployments" in runner.invoke(app, ["status"]).output
    missing = runner.invoke(app, ["teardown", "ghost"])
    assert missing.exit_code == 1 and "no edge deployment named 'ghost'" in missing.output
