"""What the tour shows at the end: each step's outcome, one summary panel, and where its
records are to be looked at."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from gpuflow.tables import comparison_table, fleet_table
from gpuflow.tour.fleet import Refusal
from gpuflow.tour.record import Recording


def show(
    console: Console,
    results: dict[str, Any],
    partitioned_rows: list[dict[str, Any]],
    recording: Recording,
    seconds: float,
) -> dict[str, Any]:
    """Print every step's outcome; return the summary (what the tour measured)."""
    rows = results["rows"]
    console.print(fleet_table(rows, title="discovered fleet"))
    skus = sorted({r["sku"] for r in rows})
    console.print(f"{len(rows)} devices, {len(skus)} SKUs: {', '.join(skus)}")
    changed = [d for d in results["apply"].devices if d.changed]
    console.print(f"plan 'tour' changed {len(changed)} device(s)")
    console.print(fleet_table(partitioned_rows, title="partitioned layout"))
    refusal: Refusal = results["refusal"]
    console.print(f"[red]impossible plan refused:[/red] {refusal.reason or 'NOT refused'}")
    console.print(f"layout unchanged after the refusal: {refusal.layout_unchanged}")

    auto = results["compare"]["rows"][0]
    console.print(comparison_table(results["compare"]["rows"]))
    champion = results["health"]
    console.print(
        Panel.fit(
            "\n".join(f"{k}: {escape(str(v))}" for k, v in champion.items()),
            title="health champion (health_train on a twin history)",
        )
    )
    fault = results["fault"]
    console.print(
        Panel.fit(
            # escape: the operators' subject starts with "[gpuflow]", not Rich markup
            "\n".join(f"{k}: {escape(str(v))}" for k, v in fault.items() if k != "timeline")
            + "\ntimeline: "
            + " -> ".join(fault.get("timeline", [])),
            title="predicted fault and its remediation",
        )
    )
    edge = results["edge"]
    console.print(
        f"edge: {len(edge['addresses'])} shards at {', '.join(edge['addresses'])}, cut at "
        f"{', '.join(edge['cut_tensors'])}; balance {edge['balance']:.3f} "
        f"(equal-op split {edge['balance_equal_ops']:.3f}); chain matches the whole model: "
        f"{edge['check']['passed']} (max abs diff {edge['check']['max_abs_diff']:.1e})"
    )
    summary = {
        "devices": len(rows),
        "skus": len(skus),
        "partitioned_devices": len(changed),
        "impossible_refused": refusal.reason is not None,
        "layout_unchanged": refusal.layout_unchanged,
        "speedup_auto": round(auto["speedup"], 2),
        "convergence_delta_auto": f"{100 * auto['convergence_delta']:.3f} %",
        "health_champion": champion["champion"],
        "steps_lost": fault.get("steps lost"),
        "time_to_recover_s": fault.get("time to recover s"),
        "job_moved_to": fault.get("moved to"),
        "device_cordoned": fault.get("cordoned"),
        "edge_balance": round(edge["balance"], 3),
        "mlflow_parent_run": results["compare"]["parent_run_id"],
        "seconds": round(seconds, 1),
    }
    console.print(
        Panel.fit("\n".join(f"{k}: {v}" for k, v in summary.items()), title="tour summary")
    )
    console.print(where_to_look(recording))
    return summary


def where_to_look(recording: Recording) -> str:
    """The UIs that show what the tour recorded: running now, or once `gpuflow up` runs."""
    from gpuflow.flows.compare_precision import EXPERIMENT as COMPARE
    from gpuflow.flows.edge_deploy import EXPERIMENT as EDGE
    from gpuflow.tasks.health.model import EXPERIMENT as HEALTH
    from gpuflow.tasks.training.job import EXPERIMENT as TRAIN

    what = (
        f"Prefect UI {recording.prefect_ui_url} (flow runs compare_precision, train, "
        f"health_train, remediate, edge_deploy and their artifacts), MLflow UI "
        f"{recording.mlflow_url} (experiments {COMPARE}, {TRAIN}, {HEALTH}, {EDGE})"
    )
    if recording.plane is not None:
        return f"where to look: the tour recorded through the control plane that is up: {what}"
    return (
        f"where to look: the tour recorded into {recording.prefect} (Prefect) and "
        f"{recording.mlflow} (MLflow); `gpuflow up` serves them: {what}"
    )
