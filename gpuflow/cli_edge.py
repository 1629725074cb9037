"""`gpuflow edge plan|deploy|status|teardown`: slice a model over edge nodes and serve it.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_edge.app, name="edge")``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Edge slicing: cut a model by measured cost, serve the shards as an OIP chain.",
    no_args_is_help=True,
)
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def _clean_errors(fn: F) -> F:
    """Bad input and failed deployments end as one red line and a non-zero exit."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpuflow.tasks.edge.deploy import EdgeDeployError
        from gpuflow.tasks.edge.manifest import ManifestError

        try:
            return fn(*args, **kwargs)
        except (ValueError, ManifestError) as exc:  # CutError, PartitionError are ValueErrors
            err_console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        except (EdgeDeployError, ConnectionError) as exc:
            err_console.print(f"[red]edge deploy failed:[/red] {exc}")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


ModelArg = Annotated[str, typer.Argument(help="Registry model, e.g. resnet50, resnet18-digits.")]
ShardsOpt = Annotated[
    int | None, typer.Option("--shards", "-k", help="Number of shards (default: every node).")
]
NodesOpt = Annotated[
    int, typer.Option("--nodes", help="Loopback nodes in the default fleet (no --fleet-block).")
]
FleetOpt = Annotated[
    str | None, typer.Option("--fleet-block", help="A saved EdgeFleet block to use instead.")
]
SpeedOpt = Annotated[
    list[float] | None,
    typer.Option("--speed", help="Speed factor per node, in chain order (repeatable)."),
]
LinkOpt = Annotated[
    float | None, typer.Option("--link-mb-s", help="Link bandwidth of every loopback node, MB/s.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _fleet(nodes: int, fleet_block: str | None, speed: list[float] | None, link: float | None):
    from gpuflow.blocks.edge_fleet import EdgeFleet, EdgeNode, load_fleet

    if fleet_block:
        return load_fleet(fleet_block)
    if nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {nodes}")
    speeds = list(speed or [])
    if speeds and len(speeds) != nodes:
        raise ValueError(f"--speed given {len(speeds)} times for {nodes} nodes; give one per node")
    return EdgeFleet(
        nodes=[
            EdgeNode(name=f"edge-{i}", speed=speeds[i] if speeds else 1.0, link_mb_s=link)
            for i in range(nodes)
        ]
    )


def plan_table(summary: dict, model: str) -> Table:
    table = Table(
        title=f"{model}: {summary['num_cut_points']} cut points, "
        f"{summary['total_ms']:.2f} ms profiled (batch {summary['batch']})",
        header_style="bold",
    )
    for col in ("split", "shard", "node", "ends at", "compute ms", "transfer ms", "weights MB"):
        table.add_column(col, justify="left" if col in ("split", "node", "ends at") else "right")
    for key, label in (("dp", "DP"), ("equal_ops", "equal ops")):
        plan = summary[key]
        ends = [*plan["cut_tensors"], "(output)"]
        for shard in plan["shards"]:
            table.add_row(
                f"{label} (balance {plan['balance']:.2f})" if shard["index"] == 0 else "",
                str(shard["index"]),
                shard["node"],
                ends[shard["index"]],
                f"{shard['compute_ms']:.3f}",
                f"{shard['transfer_ms']:.3f}",
                f"{shard['weight_bytes'] / 1e6:.1f}",
            )
    return table


@app.command("plan")
@_clean_errors
def plan_cmd(
    model: ModelArg,
    shards: ShardsOpt = None,
    nodes: NodesOpt = 4,
    fleet_block: FleetOpt = None,
    speed: SpeedOpt = None,
    link_mb_s: LinkOpt = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also package the shards into this folder.")
    ] = None,
    runs: Annotated[int, typer.Option(help="Profiled runs (median).")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """Export, profile and plan the cuts (no deployment); --out packages the shards too."""
    from gpuflow.tasks.edge.export import export_model
    from gpuflow.tasks.edge.package import package_plan
    from gpuflow.tasks.edge.planning import plan_shards
    from gpuflow.tasks.edge.profile import profile_nodes
    from gpuflow.tasks.training.models.registry import model_spec

    model_spec(model)
    fleet = _fleet(nodes, fleet_block, speed, link_mb_s)
    with tempfile.TemporaryDirectory(prefix="gpuflow-edge-plan-") as tmp:
        work = out / "model" if out else Path(tmp)
        with err_console.status(f"exporting {model}") as status:
            exported = export_model(model, work)
            status.update(f"profiling {model} ({runs} runs)")
            profile = profile_nodes(
                exported.onnx_path,
                exported.sample_inputs(),
                runs=runs,
                intra_op_threads=fleet.nodes[0].intra_op_threads,
            )
            status.update("planning")
            result = plan_shards(exported, profile, list(fleet.nodes), shards)
            summary = result.summary()
            if out:
                status.update(f"packaging into {out}")
                package_plan(
                    exported.onnx_path,
                    result.cuts,
                    result.dp,
                    out / "shards",
                    source_model=model,
                    opset=exported.opset,
                    segment_ms=result.segment_ms,
                )
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    console.print(plan_table(summary, model))
    if out:
        console.print(f"shards packaged under {out / 'shards'}")


@app.command("deploy")
@_clean_errors
def deploy_cmd(
    model: ModelArg = "resnet18-digits",
    shards: ShardsOpt = None,
    nodes: NodesOpt = 4,
    fleet_block: FleetOpt = None,
    speed: SpeedOpt = None,
    link_mb_s: LinkOpt = None,
    name: Annotated[str | None, typer.Option(help="Deployment name (default: model).")] = None,
    mode: Annotated[str, typer.Option(help="forward (servers pass it on) or driver.")] = "forward",
    atol: Annotated[float, typer.Option(help="Largest abs difference the check allows.")] = 1e-4,
    reprofile: Annotated[
        bool, typer.Option(help="Measure again even when the current version's export matches.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the edge-deploy flow: export, profile, cut, package, serve, check, record."""
    from gpuflow.flows.edge_deploy import edge_deploy

    fleet = _fleet(nodes, fleet_block, speed, link_mb_s)
    result = edge_deploy(
        model=model,
        shards=shards,
        fleet=fleet,
        name=name,
        mode=mode,
        atol=atol,  # type: ignore[arg-type]
        reprofile=reprofile,
    )
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    console.print(
        f"[green]{result['name']} {result['version']} active[/green]: "
        f"{len(result['addresses'])} shards, cuts at {', '.join(result['cut_tensors']) or '-'}"
    )
    console.print(
        f"  check max|diff| {result['check']['max_abs_diff']:.2e}  balance "
        f"{result['balance']:.2f} (equal ops {result['balance_equal_ops']:.2f})"
    )
    console.print(
        f"  latency p50 {result['latency_p50_ms']:.2f} ms, p99 {result['latency_p99_ms']:.2f} "
        f"ms; throughput {result['throughput_rps']:.1f} req/s "
        f"({int(result['in_flight'])} in flight)"
    )
    console.print(f"  entry: {result['model_names'][0]} at {result['addresses'][0]}")
    if result.get("endpoint"):
        console.print(
            f"  stable endpoint: {result['endpoint']} (every version of {result['name']})"
        )
    if result.get("profile_reused_from"):
        console.print(
            f"  profile reused from {result['profile_reused_from']} (--reprofile measures)"
        )


@app.command("status")
@_clean_errors
def status_cmd(
    name: Annotated[str | None, typer.Argument(help="Deployment name (default: all).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Every version of each deployment, and which shard processes are alive."""
    from gpuflow.tasks.edge.deploy import deployment_names, deployment_status

    names = [name] if name else deployment_names()
    rows = [row for n in names for row in deployment_status(n)]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if not rows:
        console.print("no edge deployments")
        return
    table = Table(title="edge deployments", header_style="bold")
    for col in ("name", "version", "status", "model", "mode", "shards", "check", "note"):
        table.add_column(col)
    for row in rows:
        alive = sum(s["alive"] for s in row["shards"])
        shards = ", ".join(f"{s['node']}@{s['address']}" for s in row["shards"]) or "-"
        check = row["check"] or {}
        table.add_row(
            row["name"],
            row["version"] + (" *" if row["current"] else ""),
            row["status"],
            row["model"],
            row["mode"],
            f"{alive}/{len(row['shards'])} alive: {shards}",
            "-"
            if not check
            else ("ok" if check["passed"] else "FAILED") + f" {check['max_abs_diff']:.1e}",
            row["note"],
        )
    console.print(table)


@app.command("supervise")
@_clean_errors
def supervise_cmd(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    passes: Annotated[int, typer.Option(min=1, help="Passes to run.")] = 1,
    interval_s: Annotated[float, typer.Option(min=1.0, help="Seconds between passes.")] = 10.0,
) -> None:
    """Restart dead shards of the current version where they were (the edge_supervise flow)."""
    from gpuflow.flows.edge_supervise import edge_supervise

    for result in edge_supervise(name, passes=passes, interval_s=interval_s):
        restarted = ", ".join(map(str, result["restarted"])) or "none"
        console.print(f"{name} {result['version']}: {result['status']}; restarted: {restarted}")


@app.command("rollback")
@_clean_errors
def rollback_cmd(name: Annotated[str, typer.Argument(help="Deployment name.")]) -> None:
    """Serve the standby version (the one promoted before the current) again, at the same
    endpoint; the current version is stopped."""
    from gpuflow.tasks.edge.rollout import rollback
    from gpuflow.tasks.edge.stable_endpoint import endpoint_record

    back = rollback(name)
    record = endpoint_record(name)
    where = f" at {record['address']}" if record else ""
    console.print(f"{name}: {back.version} serves again{where}")


@app.command("teardown")
@_clean_errors
def teardown_cmd(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    version: Annotated[str | None, typer.Option(help="Only this version.")] = None,
) -> None:
    """Stop the shard processes of a deployment (every version unless --version)."""
    from gpuflow.tasks.edge.deploy import teardown

    stopped = teardown(name, version)
    total = sum(n for _, n in stopped)
    console.print(
        f"stopped {total} shard process(es) of {name}: "
        + (", ".join(f"{v} ({n})" for v, n in stopped) or "none were running")
    )
