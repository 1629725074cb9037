"""The Rich tables that both the CLI verbs and the tour print: the fleet, and a precision
comparison."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def fleet_table(rows: list[dict[str, Any]], title: str = "gpuflow fleet") -> Table:
    """One row per device (rows of ``gpuflow.tasks.fleet.fleet_rows``), health in colour."""
    from gpuflow.tasks.fleet import partition_summary

    table = Table(title=title, header_style="bold")
    for col, justify in (
        ("node", "left"),
        ("idx", "right"),
        ("region", "left"),
        ("SKU", "left"),
        ("memory", "right"),
        ("partitions", "left"),
        ("temp", "right"),
        ("power", "right"),
        ("util", "right"),
        ("health", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    colours = {"ok": "green", "warn": "yellow", "critical": "red", "lost": "red"}
    for r in rows:
        node = r["node"] + (" (spare)" if r["role"] == "spare" else "")
        health = r["health"] + (
            f" ({', '.join(r['health_reasons'])})" if r["health_reasons"] else ""
        )
        table.add_row(
            node,
            str(r["index"]),
            r["region"],
            r["sku"],
            f"{r['memory_total_mb'] // 1024} GiB",
            partition_summary(r["partitions"]),
            "-" if r["temperature_c"] is None else f"{r['temperature_c']:.0f} C",
            "-" if r["power_mw"] is None else f"{r['power_mw'] / 1000:.0f} W",
            "-" if r["utilization_ratio"] is None else f"{r['utilization_ratio']:.0%}",
            f"[{colours.get(r['health'], 'white')}]{health}[/]",
        )
    return table


def comparison_table(rows: list[dict[str, Any]]) -> Table:
    """Each candidate policy against fp32 (rows of the compare_precision flow's result)."""
    table = Table(title="precision vs fp32")
    for col in ("policy", "speedup", "step speedup", "convergence delta", "switches", "verdict"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for r in rows:
        colour = "green" if r["verdict"] == "pass" else "red"
        table.add_row(
            r["policy"],
            f"{r['speedup']:.2f}x",
            f"{r['step_speedup']:.2f}x",
            f"{100 * r['convergence_delta']:.3f} %",
            str(r["switches"]),
            f"[{colour}]{r['verdict']}[/]",
        )
    return table
