"""`gpuflow hw ...` (devices: list, partition) and `gpuflow sim ...` (the digital twin).

Mounted by gpuflow/cli.py with ``app.add_typer(cli_hw.hw_app, name="hw")`` and
``app.add_typer(cli_hw.sim_app, name="sim")``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuflow.cli_base import BackendOpt, backend_named, clean_errors, console, err_console
from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.tables import fleet_table

hw_app = typer.Typer(help="Devices: list them, partition them.", no_args_is_help=True)
partition_app = typer.Typer(
    help="Hard partitions from a mig-parted plan: apply, assert, export.", no_args_is_help=True
)
sim_app = typer.Typer(
    help="The digital twin: inject faults, repair, fast-forward.", no_args_is_help=True
)
hw_app.add_typer(partition_app, name="partition")


def _sync_inventory(backend: Backend) -> None:
    """Keep the inventory in step after a change to devices (it is what schedulers read)."""
    from gpuflow.hardware.inventory import Inventory

    Inventory().sync(backend)


# --- hw ---------------------------------------------------------------------------------


@hw_app.command("list")
@clean_errors
def hw_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    backend: BackendOpt = None,
) -> None:
    """List every device: node, index, SKU, memory, partitions, temperature, power, health."""
    from gpuflow.tasks.fleet import fleet_rows

    rows = fleet_rows(backend_named(backend))
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    console.print(fleet_table(rows))


PlanFile = Annotated[
    Path, typer.Option("--file", "-f", help="Partition plan (mig-parted v1 format).")
]
ConfigName = Annotated[
    str | None,
    typer.Option(
        "--config", "-c", help="The mig-config to use from the plan (default: its only one)."
    ),
]
NodesOpt = Annotated[
    list[str] | None,
    typer.Option("--node", "-n", help="Only these nodes (repeatable); default all."),
]


def _read_plan(path: Path) -> Any:
    from gpuflow.hardware.partition import load_plan

    if not path.is_file():
        raise InvalidRequestError(f"plan file {str(path)!r} does not exist")
    return load_plan(path)


HooksFile = Annotated[
    Path | None,
    typer.Option(
        "--hooks-file",
        help="mig-parted hooks file (version v1): apply-start, pre-apply-mode, "
        "pre-apply-config, apply-exit commands (e.g. stop and start DCGM around a reset).",
    ),
]


@partition_app.command("apply")
@clean_errors
def partition_apply(
    file: PlanFile,
    config: ConfigName = None,
    node: NodesOpt = None,
    backend: BackendOpt = None,
    hooks_file: HooksFile = None,
    skip_reset: Annotated[
        bool,
        typer.Option(
            "--skip-reset",
            help="Leave MIG mode changes a GPU reset must apply pending (reset later).",
        ),
    ] = False,
) -> None:
    """Validate the whole plan and check no device to change is in use, then bring every
    selected device to it: MIG modes, one reset where NVML left a change pending, then
    partitions (idempotent; all or nothing). The inventory is re-synced afterwards."""
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.hardware.partition import NO_HOOKS, apply_plan, load_hooks
    from gpuflow.hardware.partition.guard import InventoryGuard

    plan = _read_plan(file)
    config, _ = plan.config(config)
    hooks = load_hooks(hooks_file) if hooks_file is not None else NO_HOOKS
    be = backend_named(backend)
    envs = {"MIG_PARTED_CONFIG_FILE": str(file)}
    if hooks_file is not None:
        envs["MIG_PARTED_HOOKS_FILE"] = str(hooks_file)
    report = apply_plan(
        be,
        plan,
        config,
        nodes=node or None,
        hooks=hooks,
        skip_reset=skip_reset,
        guard=InventoryGuard(Inventory()),
        hook_envs=envs,
    )
    changed = [d for d in report.devices if d.changed]
    console.print(
        f"applied config [bold]{config}[/bold]: {len(changed)} device(s) changed, "
        f"{len(report.devices) - len(changed)} already matched"
    )
    for d in changed:
        console.print(f"  {d.node}:{d.index}  {d.before_summary} -> {d.after_summary}")
    if report.skipped_lost:
        err_console.print(
            f"[yellow]skipped (fell off the bus)[/yellow]: {', '.join(report.skipped_lost)}"
        )
    if report.reset:
        console.print(f"reset (pending MIG mode applied): {', '.join(report.reset)}")
    requeued = report.settled.get("jobs_requeued") or []
    if requeued:
        console.print(f"requeued (their partitions are gone): {', '.join(requeued)}")


@partition_app.command("assert")
@clean_errors(hardware_exit=2)
def partition_assert(
    file: PlanFile, config: ConfigName = None, node: NodesOpt = None, backend: BackendOpt = None
) -> None:
    """Exit 0 when every selected device matches the plan, 1 (listing mismatches) when
    one does not, 2 when it cannot say (a bad plan, a hardware error)."""
    from gpuflow.hardware.partition import assert_plan

    plan = _read_plan(file)
    config, _ = plan.config(config)
    mismatches = assert_plan(backend_named(backend), plan, config, nodes=node or None)
    if mismatches:
        for m in mismatches:
            err_console.print(f"[red]mismatch[/red] {m}")
        raise typer.Exit(1)
    console.print(f"[green]all selected devices match config {config}[/green]")


@partition_app.command("export")
@clean_errors
def partition_export(
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Write the plan here (default: stdout).")
    ] = None,
    node: NodesOpt = None,
    backend: BackendOpt = None,
    with_nodes: Annotated[
        bool,
        typer.Option(
            help="gpuflow's extended form: every selected node in one plan, entries with "
            "their nodes and vDCUs (default: plain mig-parted v1 of one node)."
        ),
    ] = False,
) -> None:
    """Write the current layout as a mig-parted plan (config "current")."""
    from gpuflow.hardware.partition import dump_yaml, export_layout

    text = dump_yaml(
        export_layout(backend_named(backend), nodes=node or None, with_nodes=with_nodes)
    )
    if file is None:
        sys.stdout.write(text)
    else:
        file.write_text(text)
        console.print(f"wrote {file}")


# --- sim --------------------------------------------------------------------------------


def _parse_device(text: str) -> tuple[str, int]:
    node, sep, index = text.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise InvalidRequestError(f"--device {text!r}: expected NODE:INDEX, e.g. a100-0:2")
    return node, int(index)


def _twin() -> Any:
    from gpuflow.hardware.sim import SimBackend

    return SimBackend()


@sim_app.command("inject")
@clean_errors
def sim_inject(
    device: Annotated[str, typer.Option("--device", "-d", help="NODE:INDEX, e.g. a100-0:2")],
    fault: Annotated[
        str, typer.Option("--fault", "-k", help="Fault kind (see `gpuflow sim faults`).")
    ],
) -> None:
    """Inject a fault into a twin device now; every process reading the twin sees it."""
    node, index = _parse_device(device)
    record = _twin().inject_fault(node, index, fault)
    console.print(
        f"injected [bold]{fault}[/bold] on {node}:{index}: {json.dumps(record, default=str)}"
    )


@sim_app.command("faults")
def sim_faults() -> None:
    """List the fault kinds the twin can inject."""
    from gpuflow.hardware.sim import FAULT_KINDS

    for kind in FAULT_KINDS:
        console.print(kind)


@sim_app.command("repair")
@clean_errors
def sim_repair(device: Annotated[str, typer.Option("--device", "-d", help="NODE:INDEX")]) -> None:
    """Reset or replace a twin device: its faults are cleared."""
    node, index = _parse_device(device)
    _twin().repair(node, index)
    console.print(f"repaired {node}:{index}")


HolderArg = Annotated[
    str, typer.Argument(help="Who holds it, e.g. nv-hostengine (DCGM) or dcgm-exporter.")
]


@sim_app.command("hold")
@clean_errors
def sim_hold(
    device: Annotated[str, typer.Option("--device", "-d", help="NODE:INDEX")], holder: HolderArg
) -> None:
    """A client keeps a twin GPU open (as DCGM does): MIG mode changes wait for a reset,
    which it blocks until released."""
    node, index = _parse_device(device)
    _twin().hold_device(node, index, holder)
    console.print(f"{holder} holds {node}:{index}")


@sim_app.command("release")
@clean_errors
def sim_release(
    device: Annotated[str, typer.Option("--device", "-d", help="NODE:INDEX")], holder: HolderArg
) -> None:
    """The client stops holding the twin GPU (what a pre-apply-mode hook does)."""
    node, index = _parse_device(device)
    released = _twin().release_device(node, index, holder)
    console.print(f"{holder} {'released' if released else 'did not hold'} {node}:{index}")


@sim_app.command("advance")
@clean_errors
def sim_advance(
    seconds: Annotated[float, typer.Argument(help="Simulated seconds to fast-forward.")],
) -> None:
    """Fast-forward the twin's clock (physics and fault hazards run in between)."""
    if seconds <= 0:
        raise InvalidRequestError(f"seconds must be > 0, got {seconds}")
    twin = _twin()
    twin.advance(seconds)
    console.print(f"twin clock now at {twin.now_s():.0f} s")


@sim_app.command("reset")
@clean_errors
def sim_reset(
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Cluster spec YAML (default: the embedded fleet).")
    ] = None,
) -> None:
    """Re-create the twin's state from a cluster spec (all partitions and faults gone)."""
    from gpuflow.hardware.sim import SimBackend

    SimBackend.reset_state(spec_path=spec)
    console.print("twin reset")
