"""`gpuflow schedule submit|list|cancel` on the twin's default fleet."""

from __future__ import annotations

from typer.testing import CliRunner

from gpuflow.cli_schedule import app

runner = CliRunner()


def test_submit_list_cancel() -> None:
    out = runner.invoke(
        app, ["submit", "job-a", "--count", "2", "--sku", "a100-40gb", "--steps", "10"]
    )
    assert out.exit_code == 0, out.output
    assert "queued job-a: 2 x device of NVIDIA A100-SXM4-40GB" in out.output
    out = runner.invoke(
        app, ["submit", "job-w", "--count", "2", "--nodes", "2", "--sku", "a100-40gb"]
    )
    assert out.exit_code == 0, out.output
    assert "queued job-w: 2 x device of NVIDIA A100-SXM4-40GB on 2 node(s)" in out.output
    out = runner.invoke(
        app, ["submit", "job-b", "--profile", "3g.20gb", "--priority", "5", "--external"]
    )
    assert out.exit_code == 0, out.output
    listing = runner.invoke(app, ["list"])
    assert listing.exit_code == 0
    assert "job-a" in listing.output and "job-b" in listing.output and "queued" in listing.output
    assert "*: 3/8" in listing.output  # the any-region queue: 3 of its depth 8
    out = runner.invoke(app, ["cancel", "job-a"])
    assert out.exit_code == 0 and "cancelled" in out.output
    assert "job-a" not in runner.invoke(app, ["list"]).output
    assert "cancelled" in runner.invoke(app, ["list", "--all"]).output


def test_refusals_are_one_line_and_exit_2() -> None:
    out = runner.invoke(app, ["submit", "huge", "--count", "64", "--sku", "v100"])
    assert out.exit_code == 2 and "at most 4" in out.output and "Traceback" not in out.output
    out = runner.invoke(app, ["submit", "bad", "--profile", "3g.20gb", "--sku", "v100"])
    assert out.exit_code == 2 and "no MIG" in out.output
    # One rank per unit: a batch of 4 (llama-tiny's) cannot split over 3, nor over 3 of 2-4.
    out = runner.invoke(app, ["submit", "odd", "--count", "3", "--sku", "a100-40gb"])
    assert out.exit_code == 2 and "global batch 4 does not split into 3 equal shares" in out.output
    out = runner.invoke(
        app, ["submit", "el", "--count", "2", "--max-count", "4", "--sku", "a100-40gb"]
    )
    assert out.exit_code == 2 and "split into 3 equal" in out.output
    out = runner.invoke(app, ["submit", "uneven", "--count", "4", "--nodes", "3"])
    assert out.exit_code == 2 and "count 4 does not split evenly" in out.output
    out = runner.invoke(app, ["submit", "x", "--model", "no-such-model"])
    assert out.exit_code == 2 and "unknown model" in out.output
    for i in range(2):
        assert runner.invoke(app, ["submit", f"q{i}", "--queue-depth", "2"]).exit_code == 0
    out = runner.invoke(app, ["submit", "q2", "--queue-depth", "2"])
    assert out.exit_code == 2 and "queue depth 2" in out.output
    out = runner.invoke(app, ["cancel", "nobody"])
    assert out.exit_code == 2 and "unknown scheduled job" in out.output


def test_list_names_a_job_whose_stored_request_no_longer_validates() -> None:
    from gpuflow.hardware.inventory import Inventory, schema
    from sqlalchemy import update

    out = runner.invoke(app, ["submit", "job-q", "--sku", "v100", "--external"])
    assert out.exit_code == 0, out.output
    assert runner.invoke(app, ["submit", "job-ok", "--sku", "v100", "--external"]).exit_code == 0
    inventory = Inventory()
    spec = inventory.job("job-q").spec
    spec["request"]["count"] = 0  # no longer a valid request
    with inventory._engine_here().begin() as conn:
        conn.execute(update(schema.jobs).where(schema.jobs.c.job_id == "job-q").values(spec=spec))
    listing = runner.invoke(app, ["list"])
    assert listing.exit_code == 0, listing.output  # the listing still works
    row = next(line for line in listing.output.splitlines() if "job-q" in line)
    assert "quarantined" in row
    assert "job-ok" in listing.output
