"""`gpuflow multimodal train` and the compare_multimodal flow on the twin: leased as one
gang, trained in three rank processes, evaluated, and recorded in MLflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpuflow.flows.train_multimodal import compare_multimodal
from gpuflow.hardware.skus import sku
from gpuflow.tasks.multimodal.spec import MultimodalSpec
from gpuflow.tasks.tracking import tracking_client
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.storage import LocalStorage
from prefect.settings import PREFECT_API_URL

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _gpuflow(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("gpuflow")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=400, env=env)


def test_cli_trains_three_ranks_to_a_clear_recall_gain(tmp_path: Path) -> None:
    done = _gpuflow(
        "multimodal", "train", "--layout", "branch", "--steps", "100",
        "--job-id", "mm-cli", "--checkpoint-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "head, vision, text" in done.stdout
    client = tracking_client()
    [run] = client.search_runs(
        [client.get_experiment_by_name("gpuflow-multimodal").experiment_id],
        "tags.`gpuflow.job_id` = 'mm-cli'",
    )
    m = run.data.metrics
    assert run.data.tags["gpuflow.roles"] == "head,vision,text"
    assert len(run.data.tags["gpuflow.resource_ids"].split(",")) == 3
    for key in ("i2t_r1", "t2i_r1", "zero_shot_acc"):
        assert m[key] > m[f"untrained.{key}"] + 0.1, (key, m)
        assert m[key] > 2 * m.get(f"{key}_chance", 0.1), (key, m)
    assert {"head.compute_s_per_step", "vision.activation_peak_mb", "text.state_mb"} <= set(m)
    assert m["samples_per_s"] > 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"quality.png", "ranks.json"} <= artifacts
    steps = [c.step for c in CheckpointManager(LocalStorage(tmp_path), "mm-cli").list()]
    assert steps[-1] == 100


def test_cli_refuses_a_batch_that_does_not_split() -> None:
    done = _gpuflow("multimodal", "train", "--batch-size", "10", "--micro-batches", "3")
    assert done.returncode != 0
    assert "does not split into 3" in done.stdout + done.stderr


def test_compare_puts_single_and_branch_side_by_side(s3_server: str) -> None:
    """Both layouts checkpoint to S3 (every rank opens its own client; rank 0 commits)."""
    import boto3
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from pydantic import SecretStr

    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    s3.create_bucket(Bucket="mm-ckpt")
    storage = CheckpointStorage(
        kind="s3",
        bucket="mm-ckpt",
        endpoint_url=s3_server,
        region_name="us-east-1",
        access_key_id="testing",
        secret_access_key=SecretStr("testing"),
    )
    spec = MultimodalSpec(
        job_id="mm-cmp", steps=2, batch_size=32, checkpoint_interval=1, head="vision"
    )
    out = compare_multimodal(spec, device=DeviceRequest(sku="a100-40gb"), storage=storage)
    keys = {k["Key"] for k in s3.list_objects_v2(Bucket="mm-ckpt")["Contents"]}
    for layout in ("single", "branch"):
        assert any(k.startswith(f"mm-cmp-{layout}/step-000000002/") for k in keys), keys
    rows = {row["layout"]: row for row in out["rows"]}
    assert rows["single"]["ranks"] == 1 and rows["branch"]["ranks"] == 2
    assert rows["single"]["speedup"] == 1.0
    assert rows["branch"]["speedup"] > 0
    # Same seed, batch and steps: the two layouts train the same model.
    single, branch = out["runs"]["single"], out["runs"]["branch"]
    assert branch["figures"]["final_loss"] == pytest.approx(
        single["figures"]["final_loss"], abs=1e-4
    )
    assert single["sku"] == branch["sku"] == sku("a100-40gb").name
    client = tracking_client()
    parent = client.get_run(out["parent_run_id"])
    assert {"single.samples_per_s", "branch.samples_per_s", "branch.speedup"} <= set(
        parent.data.metrics
    )
    for name in ("single", "branch"):
        child = client.get_run(out["runs"][name]["run_id"])
        assert child.data.tags["mlflow.parentRunId"] == out["parent_run_id"]
