"""`gpuflow remediate --device NODE:INDEX [--reason ...]`: move every job off a device now.

The `remediate` flow, run in this process: cordon, fail over, checkpoint-and-stop,
resume elsewhere, notify. `--history` lists the incidents the ledger holds instead.
Mounted by gpuflow/cli.py with ``app.add_typer(cli_remediate.app, name="remediate")``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpuflow.hardware.backend import HardwareError, InvalidRequestError

app = typer.Typer(
    help="Move every job off a device (checkpoint, resume elsewhere), cordon it, notify.",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
)
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, soft_wrap=True)


def _when(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _history(device: str | None) -> None:
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.tasks.remediation.devices import parse_device_ref
    from gpuflow.tasks.remediation.ledger import Ledger

    inventory = Inventory()
    uuid = None
    if device:
        ref = parse_device_ref(device)
        uuid = inventory.device(ref.node, ref.index).uuid
    table = Table(title="remediation incidents")
    for col in ("incident", "device", "trigger", "status", "opened (UTC)", "jobs", "last step"):
        table.add_column(col)
    for inc in Ledger(inventory.url).incidents(uuid):
        last = inc.timeline[-1]["what"] if inc.timeline else ""
        jobs = ", ".join(f"{j}:{o.get('status', '?')}" for j, o in inc.jobs.items()) or "-"
        table.add_row(
            inc.incident_id,
            inc.device,
            inc.trigger,
            inc.status,
            _when(inc.created_at_s),
            jobs,
            last,
        )
    console.print(table)


def _show(result: dict[str, Any]) -> None:
    head = (
        f"{result['device']} ({result.get('sku', '?')}): {result.get('status')}"
        f" - incident {result.get('incident_id', '-')}"
    )
    if result.get("duplicate"):
        head += f" (repeat signal: {result['duplicate']})"
    console.print(head)
    if result.get("spares_activated"):
        console.print(f"spare nodes activated: {', '.join(result['spares_activated'])}")
    for key, n in (result.get("short") or {}).items():
        console.print(f"[yellow]no capacity:[/yellow] {n} more {key} needed")
    table = Table(title="jobs")
    for col in ("job", "status", "checkpoint", "how", "now on", "detail"):
        table.add_column(col)
    for job_id, o in result.get("jobs", {}).items():
        table.add_row(
            job_id,
            o.get("status", ""),
            o.get("checkpoint_id") or "-",
            o.get("checkpoint_how", ""),
            o.get("target") or "-",
            o.get("detail", ""),
        )
    console.print(table if result.get("jobs") else "no jobs on the device")
    for owner in result.get("unmanaged", []):
        console.print(f"left alone (not a gpuflow job): {owner}")
    timeline = result.get("timeline") or []
    if timeline:
        t0 = timeline[0]["at_s"]
        tl = Table(title="timeline")
        for col in ("+s", "what", "job", "detail"):
            tl.add_column(col)
        for e in timeline:
            tl.add_row(f"{e['at_s'] - t0:.2f}", e["what"], e.get("job_id", ""), e.get("detail", ""))
        console.print(tl)
    console.print(f"operators notified: {'yes' if result.get('notified') else 'no (no channel)'}")


@app.callback()
def remediate_cmd(
    ctx: typer.Context,
    device: Annotated[str | None, typer.Option("--device", "-d", help="NODE:INDEX")] = None,
    reason: Annotated[
        str, typer.Option(help="Why (recorded on the cordon and timeline).")
    ] = "operator request",
    isolate: Annotated[
        str, typer.Option(help="Cordon the 'device' or its whole 'node'.")
    ] = "device",
    checkpoint_timeout_s: Annotated[
        float, typer.Option(help="How long a job gets to checkpoint.")
    ] = 120.0,
    notify_block: Annotated[
        str | None, typer.Option(help="Notification block, <type-slug>/<name>.")
    ] = None,
    cluster_block: Annotated[str | None, typer.Option(help="A saved GpuCluster block.")] = None,
    history: Annotated[bool, typer.Option("--history", help="List incidents instead.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Remediate one device now (the `remediate` flow), or list incidents (--history)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        if history:
            _history(device)
            return
        if device is None:
            raise InvalidRequestError("say which device: --device NODE:INDEX (or --history)")
        if isolate not in ("device", "node"):
            raise InvalidRequestError(f"--isolate must be 'device' or 'node', got {isolate!r}")
        from gpuflow.flows.remediate import remediate
        from gpuflow.tasks.remediation.steps import RemediationPolicy

        policy = RemediationPolicy(isolate=isolate, checkpoint_timeout_s=checkpoint_timeout_s)
        result = remediate(
            device=device,
            reason=reason,
            trigger="manual",
            policy=policy,
            notify_block=notify_block,
            cluster_block=cluster_block,
        )
    except InvalidRequestError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except (HardwareError, ValueError) as exc:
        err_console.print(f"[red]remediation failed:[/red] {exc}")
        raise typer.Exit(1) from None
    if as_json:
        console.print_json(json.dumps(result, default=str))
    else:
        _show(result)
    if result.get("status") == "waiting":
        raise typer.Exit(3)  # nothing lost, but not every job runs: scripts should know
