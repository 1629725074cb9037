"""`gpuflow train` and `gpuflow compare-precision` on the twin, with local and S3 storage."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.storage import LocalStorage
from prefect.settings import PREFECT_API_URL

from tests.helpers.precision import cpu_reduced_policy

pytestmark = pytest.mark.integration


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class _Runner:
    """The real console script in its own process, against the session's Prefect server
    (CliRunner's swapped streams and Prefect's log handlers do not mix)."""

    def invoke(self, _app: object, args: list[str], env: dict[str, str] | None = None) -> Result:
        exe = Path(sys.executable).with_name("gpuflow")
        full_env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), **(env or {})}
        done = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=300, env=full_env
        )
        return Result(done.returncode, done.stdout, done.stderr)


runner = _Runner()
app = None


def test_train_cli_local_then_resume(tmp_path) -> None:
    args = [
        "train",
        "--model",
        "llama-tiny",
        "--steps",
        "20",
        "--checkpoint-interval",
        "10",
        "--job-id",
        "cli-local",
        "--checkpoint-dir",
        str(tmp_path),
        "--sku",
        "a100-40gb",
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "steps_done" in first.stdout
    ids = [c.checkpoint_id for c in CheckpointManager(LocalStorage(tmp_path), "cli-local").list()]
    assert ids[-1] == "step-000000020"
    more = runner.invoke(app, [*args[:4], "30", *args[5:]])  # same job, more steps: resumes
    assert more.exit_code == 0, more.output
    row = next(line for line in more.stdout.splitlines() if "resumed_from_step" in line)
    assert row.split()[-2] == "20"


def test_train_cli_s3(s3_server: str) -> None:
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(
        Bucket="cli-ckpt"
    )
    result = runner.invoke(
        app,
        [
            "train",
            "--steps",
            "10",
            "--checkpoint-interval",
            "5",
            "--job-id",
            "cli-s3",
            "--storage",
            "s3",
            "--s3-bucket",
            "cli-ckpt",
            "--s3-endpoint-url",
            s3_server,
        ],
        env={
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    )
    assert result.exit_code == 0, result.output
    keys = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").list_objects_v2(
        Bucket="cli-ckpt"
    )["Contents"]
    assert any(k["Key"].startswith("cli-s3/step-000000010/") for k in keys)


def test_train_cli_refuses_a_precision_the_device_lacks() -> None:
    no_bf16 = runner.invoke(app, ["train", "--precision", "bf16", "--sku", "v100", "--steps", "5"])
    assert no_bf16.exit_code == 2 and "bf16" in no_bf16.stderr


def test_train_cli_refuses_ranks_that_do_not_split_over_the_nodes() -> None:
    uneven = runner.invoke(app, ["train", "--gpus", "3", "--nodes", "2", "--steps", "5"])
    assert uneven.exit_code == 2 and "gpus 3 does not split evenly" in uneven.stderr


def test_compare_precision_cli_s3(s3_server: str) -> None:
    reduced = cpu_reduced_policy()  # bf16 where the CPU has it natively, else fp16
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(
        Bucket="cli-cmp"
    )
    result = runner.invoke(
        app,
        [
            "compare-precision",
            "--model",
            "llama-tiny",
            "--steps",
            "4",  # CPU fp16 is emulated (slow): enough steps for a checkpoint of each
            "--candidate",
            reduced,
            "--job-id",
            "cli-cmp",
            "--storage",
            "s3",
            "--s3-bucket",
            "cli-cmp",
            "--s3-endpoint-url",
            s3_server,
        ],
        env={
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        },
    )
    assert result.exit_code == 0, result.output
    assert reduced in result.stdout and "MLflow parent run" in result.stdout
    keys = [
        k["Key"]
        for k in boto3.client(
            "s3", endpoint_url=s3_server, region_name="us-east-1"
        ).list_objects_v2(Bucket="cli-cmp")["Contents"]
    ]
    assert any(k.startswith("cli-cmp-fp32/step-000000004/") for k in keys)
    assert any(k.startswith(f"cli-cmp-{reduced}/step-000000004/") for k in keys)
