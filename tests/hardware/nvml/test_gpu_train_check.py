"""scripts/gpu_train_check.py on the NVML fake: which GPUs become gang units, what it
hands the gang launcher, and when it says the check failed. The gang itself (torchelastic,
NCCL on real GPUs) runs on a GPU machine only; on the twin run_gang is tested in
tests/tasks/training/distributed/."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend_class_on, load_script, mig_on


def _load() -> Any:
    return load_script("gpu_train_check")


@pytest.fixture
def on_fake(monkeypatch):
    """The script, its NVML the fake: an A100 with MIG on and a V100 without."""
    mod = _load()
    fake = FakeNvml(["a100-40gb", "v100"])
    mig_on(fake, 0)
    monkeypatch.setattr(mod, "NvmlBackend", backend_class_on(fake))
    return mod, fake


def test_whole_gpus_become_units_named_by_uuid_and_a_mig_gpu_is_left_out(on_fake) -> None:
    mod, fake = on_fake
    units, found = mod.nvidia_units(None)
    assert [(u.resource_id, u.node, u.device_index, u.vendor, u.kind) for u in units] == [
        (fake.device(1).uuid, NODE, 1, "nvidia", "device")
    ]
    assert [d["mig_mode"] for d in found["devices"]] == [(True, True), None]


def _gang_answering(backend: str, calls: list[dict[str, Any]]):
    def run_gang(spec, storage, units, *, staging, **options):
        calls.append({"spec": spec, "units": list(units), **options})
        fast = spec.precision != "fp32"
        return {
            "steps_done": spec.steps,
            "train_time_s": 1.0 if fast else 2.0,
            "wall_time_s": 3.0,
            "final_loss": 1.5,
            "eval_loss": float("nan") if spec.parallel == "fsdp" else 1.6,
            "backend": backend,
            "world_size": len(units),
            "checkpoints": ["step-000000004"],
            "last_checkpoint": "step-000000004",
        }

    return run_gang


def test_each_arm_trains_on_every_unit_and_reports_its_speed_against_ddp_fp32(
    on_fake, monkeypatch, capsys
) -> None:
    mod, fake = on_fake
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(mod, "run_gang", _gang_answering("nccl", calls))
    code = mod.main(["--json", "--steps", "4", "--batch", "8"])
    summary = json.loads(capsys.readouterr().out)
    assert [(c["spec"].parallel, c["spec"].precision) for c in calls] == [
        ("ddp", "fp32"),
        ("ddp", "bf16"),
        ("fsdp", "bf16"),
        ("ddp", "auto"),
    ]
    assert all(c["device_backend"] == ("nvml", None) for c in calls)
    assert all([u.resource_id for u in c["units"]] == [fake.device(1).uuid] for c in calls)
    rows = {r["arm"]: r for r in summary["arms"]}
    assert rows["ddp-fp32"]["samples_per_s"] == 16.0 and rows["ddp-bf16"]["samples_per_s"] == 32.0
    assert rows["ddp-bf16"]["throughput_vs_ddp_fp32"] == 2.0
    # the FSDP arm's eval loss is not finite: that arm, and so the check, fails
    assert {c["check"]: c["ok"] for c in summary["checks"]} == {
        "ddp-fp32": True,
        "ddp-bf16": True,
        "fsdp-bf16": False,
        "ddp-auto": True,
    }
    assert code == 1


def test_a_gang_not_on_nccl_fails_and_a_failing_arm_does_not_stop_the_others(
    on_fake, monkeypatch, capsys
) -> None:
    mod, _ = on_fake
    calls: list[dict[str, Any]] = []
    answer = _gang_answering("gloo", calls)

    def run_gang(spec, *args, **kwargs):
        if spec.precision == "bf16" and spec.parallel == "ddp":
            raise RuntimeError("rank 0 died")
        return answer(spec, *args, **kwargs)

    monkeypatch.setattr(mod, "run_gang", run_gang)
    assert mod.main(["--json", "--steps", "4", "--batch", "8"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert [r["arm"] for r in summary["arms"]] == ["ddp-fp32", "ddp-bf16", "fsdp-bf16", "ddp-auto"]
    assert summary["arms"][1]["error"] == "RuntimeError: rank 0 died"
    assert not any(c["ok"] for c in summary["checks"])
