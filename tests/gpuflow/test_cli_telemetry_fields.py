"""`gpuflow hw list --json` says, per device, which telemetry its backend cannot read."""

from __future__ import annotations

import json

from gpuflow.hardware.backend import TELEMETRY_FIELDS
from typer.testing import CliRunner

from gpuflow.cli import app

runner = CliRunner()


def test_hw_list_json_names_the_unreadable_fields() -> None:
    result = runner.invoke(app, ["hw", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    by_sku = {r["sku"]: r["telemetry_unreadable"] for r in rows}
    assert by_sku["Hygon DCU Z100"] == sorted(TELEMETRY_FIELDS)  # hy-smi: none of them
    assert by_sku["Tesla V100-SXM2-32GB"] == [
        "remapped_rows_correctable",
        "remapped_rows_failure",
        "remapped_rows_pending",
        "remapped_rows_uncorrectable",
    ]
    assert by_sku["NVIDIA A100-SXM4-40GB"] == ["retired_pages"]
    dcu = next(r for r in rows if r["vendor"] == "Hygon")
    assert dcu["health"] == "ok"  # nothing fired, and the row says why that is weak
