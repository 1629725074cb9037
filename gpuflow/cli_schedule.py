"""`gpuflow schedule ...`: submit jobs to the scheduler's queues, list, cancel, drain.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_schedule.app, name="schedule")``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from gpuflow.hardware.backend import HardwareError, InvalidRequestError

app = typer.Typer(
    help="The scheduler: homogeneous gangs, partitions, priorities, bounded queues.",
    no_args_is_help=True,
)
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, soft_wrap=True)  # a refusal stays one greppable line

F = TypeVar("F", bound=Callable[..., Any])


def _clean(fn: F) -> F:
    """Refusals end as one red line and a non-zero exit (2: bad input, 1: refused by the
    fleet), not a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors()
            )
            err_console.print(f"[red]error:[/red] {errors}")
            raise typer.Exit(2) from None
        except InvalidRequestError as exc:
            err_console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        except HardwareError as exc:
            err_console.print(f"[red]refused:[/red] {exc}")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _service(queue_depth: int | None = None, policy: str | None = None):
    from gpuflow.blocks.gpu_cluster import GpuCluster
    from gpuflow.tasks.scheduling.model import SchedulerConfig
    from gpuflow.tasks.scheduling.service import SchedulerService

    config = SchedulerConfig.from_env(queue_depth=queue_depth, policy=policy)
    return SchedulerService.for_cluster(GpuCluster(), config)


@app.command("submit")
@_clean
def submit(
    job_id: Annotated[
        str, typer.Argument(help="Job id (names its leases, checkpoints, control channel).")
    ],
    count: Annotated[int, typer.Option(help="Units wanted (the minimum for an elastic job).")] = 1,
    max_count: Annotated[int | None, typer.Option(help="Elastic: grow up to this many.")] = None,
    nodes: Annotated[
        int | None,
        typer.Option(help="Spread over exactly this many nodes, --count / --nodes on each."),
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="MIG profile (3g.20gb) or 'vdcu'; none: whole devices.")
    ] = None,
    compute_units: Annotated[int | None, typer.Option("--cu", help="vDCU compute units.")] = None,
    memory_mb: Annotated[int | None, typer.Option(help="vDCU memory in MiB.")] = None,
    sku: Annotated[
        list[str] | None, typer.Option(help="Accepted SKU (repeat; preferred first).")
    ] = None,
    region: Annotated[str | None, typer.Option(help="Region (pool); none: any.")] = None,
    spill: Annotated[
        bool, typer.Option(help="May run in another region when its own is full.")
    ] = False,
    priority: Annotated[int, typer.Option(help="Higher preempts lower.")] = 0,
    policy: Annotated[
        str | None, typer.Option(help="binpack | spread | first-fit for this job.")
    ] = None,
    start_in_s: Annotated[
        float | None, typer.Option(help="A reservation: start this many seconds from now.")
    ] = None,
    model: Annotated[str, typer.Option(help="What to train when placed.")] = "llama-tiny",
    steps: Annotated[int, typer.Option(help="Total optimizer steps.")] = 200,
    batch_size: Annotated[
        int | None,
        typer.Option(help="Global batch (split over the ranks); default: the model's."),
    ] = None,
    checkpoint_interval: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 50,
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16 | auto")] = "auto",
    external: Annotated[
        bool, typer.Option(help="No training spec: an outside runner uses the placement.")
    ] = False,
    queue_depth: Annotated[
        int | None, typer.Option(help="Queue depth to enforce (default 8, or GPUFLOW_QUEUE_DEPTH).")
    ] = None,
) -> None:
    """Queue a job. Refused at once if no fleet of this shape could run it, or the queue is full."""
    from gpuflow.tasks.scheduling.model import JobRequest

    request = JobRequest(
        job_id=job_id,
        count=count,
        max_count=max_count,
        nodes=nodes,
        profile=profile,
        compute_units=compute_units,
        memory_mb=memory_mb,
        skus=tuple(sku or ()),
        region=region,
        allow_spill=spill,
        priority=priority,
        policy=policy,
        start_at_s=time.time() + start_in_s if start_in_s is not None else None,
    )
    train = None
    if not external:
        from gpuflow.tasks.training.spec import TrainSpec

        spec = TrainSpec(
            job_id=job_id,
            model=model,
            steps=steps,
            batch_size=batch_size,
            checkpoint_interval=checkpoint_interval,
            precision=precision,
        )
        # gpus, nodes: the placement's (its size, the nodes it spans).
        train = spec.model_dump(exclude={"job_id", "gpus", "nodes"})
    service = _service(queue_depth=queue_depth)
    service.submit(request, train=train)
    view = next(v for v in service.jobs() if v.job_id == job_id)
    where = f"position {view.position}" if view.position is not None else view.state
    console.print(
        f"[green]queued[/green] {job_id}: {request.describe()}, priority {priority} ({where})"
    )


@app.command("list")
@_clean
def list_jobs(
    all_jobs: Annotated[
        bool, typer.Option("--all", help="Include finished, failed and cancelled jobs.")
    ] = False,
) -> None:
    """Scheduled jobs: the queue in order, then running ones."""
    service = _service()
    views = service.jobs(include_done=all_jobs)
    table = Table(title="scheduled jobs")
    for col in ("pos", "job", "state", "prio", "request", "resources", "checkpoint", "preempted"):
        table.add_column(col, justify="right" if col in ("pos", "prio", "preempted") else "left")
    colours = {
        "queued": "yellow",
        "running": "green",
        "stopping": "magenta",
        "reserved": "cyan",
        "quarantined": "red",
    }
    for v in views:
        colour = colours.get(v.state, "dim")
        table.add_row(
            "-" if v.position is None else str(v.position),
            v.job_id,
            f"[{colour}]{v.state}[/]",
            str(v.priority),
            v.request,
            "\n".join(v.resource_ids) or "-",
            v.last_checkpoint_id or "-",
            str(v.preemptions),
        )
    console.print(table)
    pools = service.engine.queue.pools()
    depths = ", ".join(f"{p}: {n}/{service.config.depth(p)}" for p, n in sorted(pools.items()))
    console.print(f"queue depth per pool: {depths or 'all empty'}")


@app.command("cancel")
@_clean
def cancel(job_id: Annotated[str, typer.Argument(help="The job to cancel.")]) -> None:
    """Cancel a job: a waiting one at once, a running one through checkpoint-and-stop."""
    outcome = _service().cancel(job_id)
    if outcome == "stopping":
        console.print(f"{job_id}: asked to checkpoint and stop; it ends cancelled once it has")
    else:
        console.print(f"{job_id}: {outcome}")


@app.command("drain")
@_clean
def drain(
    launch: Annotated[str, typer.Option(help="auto | deployment | in-process | none")] = "auto",
    ack_timeout_s: Annotated[
        float, typer.Option(help="How long to wait for victims to checkpoint.")
    ] = 120.0,
    policy: Annotated[str | None, typer.Option(help="binpack | spread | first-fit")] = None,
) -> None:
    """Run the `schedule` flow once here: place, preempt, start what was placed."""
    from gpuflow.flows.schedule import schedule

    try:
        out = schedule(launch=launch, ack_timeout_s=ack_timeout_s, policy=policy)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    table = Table(title=f"schedule ({out['launch']})")
    table.add_column("pass")
    table.add_column("placed")
    table.add_column("preempted")
    table.add_column("requeued")
    table.add_column("waiting")
    for i, p in enumerate(out["passes"], 1):
        victims = [v["job_id"] for pre in p["preemptions"] for v in pre["victims"]]
        table.add_row(
            str(i),
            ", ".join(x["job_id"] for x in p["placed"]) or "-",
            ", ".join(victims) or "-",
            ", ".join(p["requeued"]) or "-",
            ", ".join(p["waiting"]) or "-",
        )
    console.print(table)
    for p in out["passes"]:
        for q in p.get("quarantined", []):
            console.print(f"[red]quarantined {q['job_id']}[/red]: {q['error']}")
        for error in p.get("errors", []):
            console.print(f"[yellow]{error}[/yellow]")
    for job_id, r in out["results"].items():
        console.print(
            f"{job_id}: {r['steps_done']} steps (resumed from {r['resumed_from_step']})"
            + (" - stopped on request" if r["stopped_by_request"] else "")
        )
