"""`gpuflow bench service_pass`: section (c) of `gpuflow bench scheduler` alone, the full
service pass on 10,000 GPUs on SQLite and (with GPUFLOW_BENCH_POSTGRES_URL) PostgreSQL,
in minutes instead of the whole scheduler study's hour. What is measured, and how:
service_pass.py."""

from __future__ import annotations

from typing import Any

from gpuflow.bench.service_pass import PASS_GOAL_MS, Report, service_pass


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    result = service_pass(quick, report)
    sqlite, postgres = result["service_pass_sqlite"], result["service_pass_postgres"]
    result["goals"] = {
        "pass_p99_ms_sqlite": sqlite["pass_p99_ms"],
        "pass_p99_ms_postgres": postgres.get("pass_p99_ms", "not measured"),
        "pass_goal_ms": PASS_GOAL_MS,
        "pass_goal_met_sqlite": sqlite["pass_p99_ms"] <= PASS_GOAL_MS,
        "quick": quick,
    }
    return result
