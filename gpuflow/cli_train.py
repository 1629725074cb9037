"""`gpuflow train` and `gpuflow compare-precision`: the train and compare_precision flows,
run in this process with a progress bar, their refusals as clean errors.

Registered as top-level verbs by gpuflow/cli.py (``app.command("train")(train_cmd)``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpuflow.cli_base import clean_errors, console, spec_from_options
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tables import comparison_table

StorageOpt = Annotated[str, typer.Option("--storage", help="local | s3")]


def storage_from_options(
    storage: str,
    path: Path | None,
    bucket: str | None,
    prefix: str,
    endpoint_url: str | None,
    block: str | None,
):
    """A CheckpointStorage from options; S3 credentials come from the usual AWS variables."""
    import os

    from pydantic import SecretStr, ValidationError

    from gpuflow.blocks.checkpoint_storage import CheckpointStorage

    if block:
        return CheckpointStorage.load(block)
    if storage not in ("local", "s3"):
        raise InvalidRequestError(f"--storage {storage!r}: use local or s3")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    try:
        return CheckpointStorage(
            kind=storage,
            path=str(path) if path else "",
            bucket=bucket or "",
            prefix=prefix,
            endpoint_url=endpoint_url,
            access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=SecretStr(secret) if secret else None,
        )
    except ValidationError as exc:
        raise InvalidRequestError(str(exc)) from None


def _train_spec(**fields: Any):
    from gpuflow.tasks.training.spec import TrainSpec

    return spec_from_options(TrainSpec, **fields)


class StepProgress:
    """A Rich progress bar fed by the training loop's step observers."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self.progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            "loss {task.fields[loss]}",
            "{task.fields[precision]}",
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, job_id: str, total: int, info: Any) -> None:
        if job_id not in self.tasks:
            self.tasks[job_id] = self.progress.add_task(job_id, total=total, loss="-", precision="")
        self.progress.update(
            self.tasks[job_id],
            completed=info.step,
            loss=f"{info.loss:.3f}",
            precision=info.precision,
        )

    def __enter__(self) -> StepProgress:
        from gpuflow.tasks.training import control

        self.progress.start()
        control.step_observers.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        from gpuflow.tasks.training import control

        control.step_observers.remove(self)
        self.progress.stop()


def run_flow(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a flow in this process; its refusals become clean CLI errors."""
    from gpuflow.tasks.training.checkpoint import CheckpointError
    from gpuflow.tasks.training.precision import PrecisionError
    from gpuflow.tasks.training.storage import StorageError

    try:
        return fn(*args, **kwargs)
    except (PrecisionError, StorageError, CheckpointError, ValueError) as exc:
        raise InvalidRequestError(str(exc)) from None


@clean_errors
def train_cmd(
    model: Annotated[
        str, typer.Option(help="Model name (llama-tiny, byte-lm, resnet18-digits, ...).")
    ] = "llama-tiny",
    steps: Annotated[int, typer.Option(help="Total optimizer steps.")] = 200,
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16 | auto")] = "auto",
    job_id: Annotated[
        str | None, typer.Option(help="Job id (names checkpoints); default generated.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option()] = None,
    checkpoint_interval: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 50,
    seed: Annotated[int, typer.Option()] = 0,
    sku: Annotated[
        str | None, typer.Option(help="Run on a device of this SKU (a100-40gb, v100, ...).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="Run on a partition of this profile (3g.20gb, vdcu).")
    ] = None,
    storage: StorageOpt = "local",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Local checkpoint root.")] = None,
    s3_bucket: Annotated[str | None, typer.Option(help="S3 bucket for checkpoints.")] = None,
    s3_prefix: Annotated[str, typer.Option(help="Key prefix in the bucket.")] = "",
    s3_endpoint_url: Annotated[str | None, typer.Option(help="Any S3-compatible endpoint.")] = None,
    storage_block: Annotated[
        str | None, typer.Option(help="A saved CheckpointStorage block.")
    ] = None,
    gpus: Annotated[
        int,
        typer.Option(
            help="Units to train on as one gang: N ranks on torch.distributed (--parallel); "
            "on one node unless --nodes says more."
        ),
    ] = 1,
    nodes: Annotated[
        int | None,
        typer.Option(
            help="Nodes the gang spans, --gpus / --nodes units on each (one elastic agent "
            "per node); default: one node when the gang fits on one."
        ),
    ] = None,
    max_restarts: Annotated[
        int, typer.Option(help="A gang's restarts from its last checkpoint after a rank dies.")
    ] = 1,
    parallel: Annotated[
        str,
        typer.Option(
            help="A gang's ranks: ddp (each holds the whole model) or fsdp (FSDP2 shards "
            "parameters, gradients and optimizer state; needs --gpus 2 or more)."
        ),
    ] = "ddp",
    grad_clip_norm: Annotated[
        float | None,
        typer.Option(help="Clip the total gradient norm to this (positive); default: no clipping."),
    ] = None,
    compile_model: Annotated[
        bool,
        typer.Option(
            "--compile/--no-compile",
            help="torch.compile the model's forward (pays on long runs; see docs/training.md).",
        ),
    ] = False,
) -> None:
    """Train a model on the fleet (the `train` flow): lease, train, checkpoint, record in MLflow."""
    from gpuflow.tasks.training.binding import DeviceRequest

    spec = _train_spec(
        job_id=job_id,
        model=model,
        steps=steps,
        precision=precision,
        batch_size=batch_size,
        checkpoint_interval=checkpoint_interval,
        seed=seed,
        gpus=gpus,
        nodes=nodes,
        max_restarts=max_restarts,
        parallel=parallel,
        grad_clip_norm=grad_clip_norm,
        compile=compile_model,
    )
    store = storage_from_options(
        storage, checkpoint_dir, s3_bucket, s3_prefix, s3_endpoint_url, storage_block
    )
    # Imported once the options are checked: a refusal comes before Prefect, MLflow and
    # the models load (seconds on a small machine).
    from gpuflow.flows.train import train

    with StepProgress():
        result = run_flow(
            train, spec, device=DeviceRequest(sku=sku, profile=profile), storage=store
        )
    table = Table(title=f"train {spec.job_id}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "steps_done",
        "resumed_from_step",
        "final_loss",
        "eval_loss",
        "wall_time_s",
        "run_id",
    ):
        value = result[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("precision switches", str(len(result["switches"])))
    console.print(table)
    # auto's evidence, so the user sees why it runs in the dtype it does.
    for d in result.get("decisions", []):
        console.print(
            f"precision A/B, steps {d['first_step']}-{d['last_step']} ({d['trigger']}): "
            f"{d['reason']}"
        )


@clean_errors
def compare_precision_cmd(
    model: Annotated[str, typer.Option(help="Model name.")] = "byte-lm",
    steps: Annotated[int, typer.Option(help="Steps per run.")] = 300,
    candidate: Annotated[
        list[str] | None,
        typer.Option("--candidate", help="Candidate policy (repeatable); default auto."),
    ] = None,
    threshold: Annotated[
        float, typer.Option(help="Convergence delta threshold (0.005 = 0.5 %).")
    ] = 0.005,
    job_id: Annotated[str | None, typer.Option(help="Job id prefix.")] = None,
    sku: Annotated[str | None, typer.Option(help="Device SKU for every run.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    storage: StorageOpt = "local",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Local checkpoint root.")] = None,
    s3_bucket: Annotated[str | None, typer.Option()] = None,
    s3_prefix: Annotated[str, typer.Option()] = "",
    s3_endpoint_url: Annotated[str | None, typer.Option()] = None,
    storage_block: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Train the same job under fp32 and candidate policies; speedup and convergence delta."""
    from gpuflow.tasks.training.binding import DeviceRequest

    spec = _train_spec(
        job_id=job_id,
        model=model,
        steps=steps,
        seed=seed,
        checkpoint_interval=max(steps, 1),
    )
    store = storage_from_options(
        storage, checkpoint_dir, s3_bucket, s3_prefix, s3_endpoint_url, storage_block
    )
    from gpuflow.flows.compare_precision import compare_precision

    with StepProgress():
        out = run_flow(
            compare_precision,
            spec,
            candidates=candidate or ["auto"],
            device=DeviceRequest(sku=sku),
            storage=store,
            threshold=threshold,
        )
    console.print(comparison_table(out["rows"]))
    console.print(f"MLflow parent run: {out['parent_run_id']}")
