"""What the train and compare_precision flows record, on a real SQLite MLflow store."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gpuflow.tasks.tracking import open_run, tracking_client
from gpuflow.tasks.training.autoprecision import Switch
from gpuflow.tasks.training.binding import Binding
from gpuflow.tasks.training.loop import TrainResult
from gpuflow.tasks.training.recording import (
    open_comparison_run,
    open_train_run,
    placement_tags,
    record_comparison,
    record_train_results,
)
from gpuflow.tasks.training.spec import TrainSpec


def _artifact(run_id: str, path: str, tmp_path: Path) -> str:
    return Path(tracking_client().download_artifacts(run_id, path, str(tmp_path))).read_text()


def test_train_run_and_results(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = TrainSpec(job_id="rec", model="llama-tiny", steps=30, precision="auto")
    parent = open_run("rec-test", "parent")
    run_id = open_train_run(spec, "rec-test", parent_run_id=parent)
    switch = Switch(step=12, from_dtype=torch.float32, to_dtype=torch.bfloat16, reason="stable")
    result = TrainResult(
        job_id="rec",
        model="llama-tiny",
        steps_done=30,
        resumed_from_step=0,
        stopped_by_request=False,
        final_loss=2.5,
        eval_loss=None,  # not logged
        wall_time_s=12.0,
        train_time_s=10.0,
        switches=[switch],
    )
    with caplog.at_level(logging.INFO):
        record_train_results(run_id, result, logging.getLogger("test"))
    run = tracking_client().get_run(run_id)
    assert run.info.run_name == "rec"
    assert run.data.params == {k: str(v) for k, v in spec.model_dump().items() if v is not None}
    assert run.data.tags["gpuflow.job_id"] == "rec"
    assert run.data.tags["gpuflow.precision_policy"] == "auto"
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.metrics == {
        "final_loss": 2.5,
        "wall_time_s": 12.0,
        "train_time_s": 10.0,
        "steps_done": 30.0,
        "resumed_from_step": 0.0,
        "precision_switches": 1.0,
    }
    assert json.loads(_artifact(run_id, "precision_switches.json", tmp_path)) == [
        {"step": 12, "from": "fp32", "to": "bf16", "reason": "stable"}
    ]
    assert "precision switch at step 12: fp32 -> bf16 (stable)" in caplog.text


def test_placement_tags() -> None:
    resource = SimpleNamespace(
        node="a100-0",
        device_index=3,
        sku="NVIDIA A100-SXM4-40GB",
        vendor="nvidia",
        resource_id="GPU-3",
        profile=None,
    )
    binding = Binding(resource, None, None, torch.device("cpu"), "sim")
    assert placement_tags(binding) == {
        "gpuflow.node": "a100-0",
        "gpuflow.device_index": "3",
        "gpuflow.sku": "NVIDIA A100-SXM4-40GB",
        "gpuflow.vendor": "nvidia",
        "gpuflow.resource_id": "GPU-3",
        "gpuflow.partition": "whole-device",
        "gpuflow.backend": "sim",
        "gpuflow.torch_device": "cpu",
    }
    resource.profile = "3g.20gb"
    assert placement_tags(binding)["gpuflow.partition"] == "3g.20gb"


def test_comparison_on_parent_and_children(tmp_path: Path) -> None:
    spec = TrainSpec(job_id="cmp", model="llama-tiny", steps=20)
    parent = open_comparison_run(spec, ["auto", "bf16"], 0.005, "cmp-test")
    children = {
        p: open_run("cmp-test", f"cmp-{p}", parent_run_id=parent) for p in ("fp32", "auto", "bf16")
    }
    results = {p: {"run_id": run_id} for p, run_id in children.items()}
    rows = [
        {"policy": "auto", "speedup": 1.5, "convergence_delta": 0.25, "verdict": "fail"},
        {"policy": "bf16", "speedup": 0.5, "convergence_delta": 0.001, "verdict": "pass"},
    ]
    record_comparison(parent, results, rows)

    client = tracking_client()
    run = client.get_run(parent)
    assert run.info.run_name == "cmp-compare"
    assert run.data.params == {
        "model": "llama-tiny",
        "steps": "20",
        "candidates": "auto,bf16",
        "threshold": "0.005",
    }
    assert run.data.tags["gpuflow.comparison"] == "precision"
    assert run.data.tags["gpuflow.baseline"] == "fp32"
    assert run.data.metrics == {
        "speedup_auto": 1.5,
        "convergence_delta_auto": 0.25,
        "speedup_bf16": 0.5,
        "convergence_delta_bf16": 0.001,
    }
    assert run.data.tags["gpuflow.verdict_auto"] == "fail"
    assert run.data.tags["gpuflow.verdict_bf16"] == "pass"
    expected = {"fp32": (1.0, 0.0, None), "auto": (1.5, 0.25, "fail"), "bf16": (0.5, 0.001, "pass")}
    for policy, (speedup, delta, verdict) in expected.items():
        data = client.get_run(children[policy]).data
        assert data.metrics == {"speedup": speedup, "convergence_delta": delta}
        assert data.tags.get("gpuflow.verdict") == verdict
    assert json.loads(_artifact(parent, "comparison.json", tmp_path)) == rows
