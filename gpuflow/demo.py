"""`gpuflow demo`: the tour on the digital twin, with no server.

It runs in its own GPUFLOW_HOME (``<home>/tour``, fresh each time) so it never disturbs a
twin or inventory you are using.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from gpuflow.hardware.home import gpuflow_home


def _tour_home() -> Path:
    home = gpuflow_home() / "tour"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    return home


def tour_plan_path() -> Path:
    return Path(str(resources.files("gpuflow") / "data" / "tour-plan.yaml"))


def run_demo(console: Console) -> dict[str, Any]:
    """Run the tour; return what it measured (the closing summary)."""
    from gpuflow.cli import fleet_table

    home = _tour_home()
    previous_home = os.environ.get("GPUFLOW_HOME")
    os.environ["GPUFLOW_HOME"] = str(home)
    summary: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        console.print(
            Panel.fit(
                "gpuflow tour on the digital twin (a mixed fleet: A100, V100, Hygon DCU)\n"
                f"state: {home}",
                title="gpuflow demo",
            )
        )
        steps: list[tuple[str, Callable[[], Any]]] = []
        from gpuflow.hardware.inventory import Inventory
        from gpuflow.hardware.partition_plan import (
            apply_plan,
            export_layout,
            load_plan,
            plan_layouts,
        )
        from gpuflow.hardware.placement import LayoutError
        from gpuflow.hardware.sim import SimBackend
        from gpuflow.tasks.fleet import fleet_rows

        twin = SimBackend()
        inventory = Inventory()
        plan = load_plan(tour_plan_path())
        results: dict[str, Any] = {}

        def discover() -> None:
            report = inventory.sync(twin)
            results["rows"] = fleet_rows(twin)
            results["sync"] = report

        def partition() -> None:
            results["apply"] = apply_plan(twin, plan, "tour")
            inventory.sync(twin)

        def refuse_impossible() -> None:
            before = export_layout(twin)
            try:
                plan_layouts(twin, plan, "impossible")
            except LayoutError as exc:
                results["refused"] = str(exc)
            else:  # pragma: no cover - the plan is impossible by construction
                results["refused"] = "NOT refused"
            results["unchanged"] = export_layout(twin) == before

        def compare() -> None:
            from gpuflow.blocks.checkpoint_storage import CheckpointStorage
            from gpuflow.flows.compare_precision import compare_precision
            from gpuflow.tasks.training.binding import DeviceRequest
            from gpuflow.tasks.training.spec import TrainSpec

            # The byte-level LM of DESIGN.md section 5, kept short for the tour.
            spec = TrainSpec(
                job_id="tour-compare", model="byte-lm", steps=40, checkpoint_interval=40
            )
            results["compare"] = compare_precision(
                spec,
                candidates=["auto"],
                device=DeviceRequest(sku="a100-40gb"),
                storage=CheckpointStorage(),
            )

        def predicted_fault() -> None:
            from gpuflow.tasks.remediation.demo import predicted_fault_tour

            results["fault"] = predicted_fault_tour(report=lambda _msg: None)

        def edge() -> None:
            from gpuflow.flows.edge_deploy import edge_deploy
            from gpuflow.tasks.edge.deploy import teardown

            try:
                results["edge"] = edge_deploy(
                    model="resnet18-digits", shards=3, measure_requests=20
                )
            finally:
                teardown("resnet18-digits")  # the tour leaves no shard server running

        steps = [
            ("discover the fleet", discover),
            ("apply partition plan 'tour'", partition),
            ("refuse an impossible plan", refuse_impossible),
            ("compare precision: fp32 vs auto (train flow x2, MLflow)", compare),
            ("predicted fault: HBM degradation -> monitor -> remediate", predicted_fault),
            ("edge deploy: slice resnet18-digits over 3 loopback nodes", edge),
        ]
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            overall = progress.add_task("tour", total=len(steps))
            for label, step in steps:
                progress.update(overall, description=label)
                step()
                progress.advance(overall)

        rows = results["rows"]
        console.print(fleet_table(rows, title="discovered fleet"))
        skus = sorted({r["sku"] for r in rows})
        console.print(f"{len(rows)} devices, {len(skus)} SKUs: {', '.join(skus)}")
        changed = [d for d in results["apply"].devices if d.changed]
        console.print(f"plan 'tour' changed {len(changed)} device(s)")
        console.print(fleet_table(fleet_rows(twin), title="partitioned layout"))
        console.print(f"[red]impossible plan refused:[/red] {results['refused']}")
        console.print(f"layout unchanged after the refusal: {results['unchanged']}")
        from gpuflow.cli import comparison_table

        auto = results["compare"]["rows"][0]
        console.print(comparison_table(results["compare"]["rows"]))
        fault = results["fault"]
        console.print(
            Panel.fit(
                "\n".join(f"{k}: {v}" for k, v in fault.items() if k != "timeline")
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
        summary.update(
            devices=len(rows),
            skus=len(skus),
            partitioned_devices=len(changed),
            impossible_refused=results["refused"] != "NOT refused",
            layout_unchanged=results["unchanged"],
            speedup_auto=round(auto["speedup"], 2),
            convergence_delta_auto=f"{100 * auto['convergence_delta']:.3f} %",
            steps_lost=fault.get("steps lost"),
            time_to_recover_s=fault.get("time to recover s"),
            job_moved_to=fault.get("moved to"),
            device_cordoned=fault.get("cordoned"),
            edge_balance=round(edge["balance"], 3),
            mlflow_parent_run=results["compare"]["parent_run_id"],
            seconds=round(time.perf_counter() - started, 1),
        )
        console.print(
            Panel.fit("\n".join(f"{k}: {v}" for k, v in summary.items()), title="tour summary")
        )
        console.print(
            "where to look: `gpuflow up` starts the Prefect UI (flow runs, artifacts) and the "
            "MLflow UI (experiments gpuflow-compare-precision, gpuflow-train, gpuflow-edge); "
            f"this tour's local MLflow store is {home / 'mlflow'}"
        )
    finally:
        if previous_home is None:
            os.environ.pop("GPUFLOW_HOME", None)
        else:
            os.environ["GPUFLOW_HOME"] = previous_home
    return summary
