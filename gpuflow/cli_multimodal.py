"""`gpuflow multimodal train|compare`: the CLIP-style dual encoder, its towers on
different devices (flows/train_multimodal.py), run in this process with a progress bar.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_multimodal.app, name="multimodal")``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpuflow.cli_base import clean_errors, console, spec_from_options
from gpuflow.cli_train import StepProgress, StorageOpt, run_flow, storage_from_options

app = typer.Typer(
    help="Multi-modal (CLIP-style) training: vision and text towers as parallel branches.",
    no_args_is_help=True,
)

Steps = Annotated[int, typer.Option(help="Optimizer steps.")]
Size = Annotated[str, typer.Option(help="clip-tiny | clip-small | clip-large")]
Batch = Annotated[int, typer.Option(help="Global batch (every sample a negative of the others).")]
MicroBatches = Annotated[
    int, typer.Option(help="Towers compute the batch in this many pieces (gradient caching).")
]
Checkpointing = Annotated[
    bool,
    typer.Option(
        "--checkpointing/--no-checkpointing", help="Gradient checkpointing of the vision tower."
    ),
]
TextInt8 = Annotated[
    bool,
    typer.Option(
        "--text-int8/--no-text-int8",
        help="The text tower's linear weights as frozen int8 (the rest trains).",
    ),
]
Head = Annotated[
    str, typer.Option(help="branch: the head on its own device (separate) or with vision.")
]
Sku = Annotated[str | None, typer.Option(help="Run on devices of this SKU.")]
JobId = Annotated[str | None, typer.Option(help="Job id (names checkpoints); default generated.")]
CheckpointDir = Annotated[Path | None, typer.Option(help="Local checkpoint root.")]
S3Bucket = Annotated[str | None, typer.Option(help="S3 bucket for checkpoints (--storage s3).")]
S3Prefix = Annotated[str, typer.Option(help="Key prefix in the bucket.")]
S3Endpoint = Annotated[str | None, typer.Option(help="Any S3-compatible endpoint.")]
StorageBlock = Annotated[str | None, typer.Option(help="A saved CheckpointStorage block.")]


def _spec(**fields: Any):
    from gpuflow.tasks.multimodal.spec import MultimodalSpec

    return spec_from_options(MultimodalSpec, **fields)


def _number(value: float | None, digits: int) -> str:
    """A figure, or "-" where the run had none (a job whose steps were all done before)."""
    return "-" if value is None else f"{value:.{digits}f}"


def _figures_table(title: str, result: dict[str, Any]) -> Table:
    table = Table(title=title)
    table.add_column("measure")
    table.add_column("value", justify="right")
    f, q, u = result["figures"], result["quality"], result["untrained"]
    table.add_row("ranks", ", ".join(result["roles"]))
    table.add_row("samples/s", _number(f["samples_per_s"], 1))
    table.add_row("final loss", _number(f["final_loss"], 4))
    table.add_row("max memory per device (MB)", f"{f['max_device_memory_mb']:.1f}")
    for key in ("zero_shot_acc", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5"):
        chance = q.get(f"{key}_chance", 0.1 if key == "zero_shot_acc" else None)
        extra = f" (chance {chance:.3f})" if chance is not None else ""
        table.add_row(key, f"{q[key]:.3f}  untrained {u[key]:.3f}{extra}")
    table.add_row("MLflow run", result["run_id"])
    return table


@clean_errors
def train_cmd(
    layout: Annotated[
        str, typer.Option(help="single (one device) | branch (a device per tower)")
    ] = "branch",
    steps: Steps = 100,
    size: Size = "clip-tiny",
    batch_size: Batch = 64,
    micro_batches: MicroBatches = 1,
    checkpointing: Checkpointing = False,
    text_int8: TextInt8 = False,
    head: Head = "separate",
    workers: Annotated[int, typer.Option(help="DataLoader workers per tower rank.")] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    job_id: JobId = None,
    sku: Sku = None,
    storage: StorageOpt = "local",
    checkpoint_dir: CheckpointDir = None,
    s3_bucket: S3Bucket = None,
    s3_prefix: S3Prefix = "",
    s3_endpoint_url: S3Endpoint = None,
    storage_block: StorageBlock = None,
) -> None:
    """Train the dual encoder (the `train_multimodal` flow): lease, train, evaluate, record."""
    from gpuflow.tasks.training.binding import DeviceRequest

    spec = _spec(
        layout=layout,
        steps=steps,
        size=size,
        batch_size=batch_size,
        micro_batches=micro_batches,
        checkpointing=checkpointing,
        text_int8=text_int8,
        head=head,
        workers=workers,
        seed=seed,
        job_id=job_id,
        checkpoint_interval=max(steps // 2, 1),
    )
    store = storage_from_options(
        storage, checkpoint_dir, s3_bucket, s3_prefix, s3_endpoint_url, storage_block
    )
    # Imported once the options are checked: a refusal comes before Prefect, MLflow and
    # the models load (seconds on a small machine).
    from gpuflow.flows.train_multimodal import train_multimodal

    with StepProgress():
        result = run_flow(train_multimodal, spec, device=DeviceRequest(sku=sku), storage=store)
    console.print(_figures_table(f"multimodal {spec.job_id} ({spec.layout})", result))


@clean_errors
def compare_cmd(
    steps: Steps = 100,
    size: Size = "clip-tiny",
    batch_size: Batch = 64,
    checkpointing: Checkpointing = False,
    text_int8: TextInt8 = False,
    head: Head = "separate",
    seed: Annotated[int, typer.Option()] = 0,
    job_id: JobId = None,
    sku: Sku = None,
    storage: StorageOpt = "local",
    checkpoint_dir: CheckpointDir = None,
    s3_bucket: S3Bucket = None,
    s3_prefix: S3Prefix = "",
    s3_endpoint_url: S3Endpoint = None,
    storage_block: StorageBlock = None,
) -> None:
    """The same job on one device and as branches: MLflow parent/child runs side by side."""
    from gpuflow.tasks.training.binding import DeviceRequest

    spec = _spec(
        steps=steps,
        size=size,
        batch_size=batch_size,
        checkpointing=checkpointing,
        text_int8=text_int8,
        head=head,
        seed=seed,
        job_id=job_id,
        checkpoint_interval=max(steps, 1),
    )
    store = storage_from_options(
        storage, checkpoint_dir, s3_bucket, s3_prefix, s3_endpoint_url, storage_block
    )
    from gpuflow.flows.train_multimodal import compare_multimodal

    with StepProgress():
        out = run_flow(compare_multimodal, spec, device=DeviceRequest(sku=sku), storage=store)
    table = Table(title=f"multimodal layouts ({spec.size}, batch {spec.batch_size})")
    columns = ("layout", "ranks", "samples_per_s", "speedup", "max_device_memory_mb", "i2t_r1")
    for column in columns:
        table.add_column(column, justify="right")
    for row in out["rows"]:
        table.add_row(
            *(
                f"{row[c]:.3f}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                for c in columns
            )
        )
    console.print(table)
    console.print(f"MLflow parent run: {out['parent_run_id']}")


app.command("train")(train_cmd)
app.command("compare")(compare_cmd)
