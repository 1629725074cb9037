"""A training job's energy on the twin: every run records what its device drew; 'tune'
probes power limits in its first steps and keeps the best; 'pinned' holds its limit; the
device's limit goes back when the job ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.backend import HardwareError
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.energy import job_energy
from gpuflow.tasks.energy.job_energy import JobEnergy
from gpuflow.tasks.energy.settings import DeviceSettings
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.job import acquire, run_training
from gpuflow.tasks.training.loop import StepInfo
from gpuflow.tasks.training.spec import TrainSpec
from pydantic import ValidationError

from tests.helpers.cluster import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    inventory = Inventory(f"sqlite:///{tmp_path / 'inv.db'}")
    backend = SimBackend()
    inventory.sync(backend)
    yield Cluster(inventory, backend)
    inventory.close()


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(kind="local", path=str(tmp_path / "ckpt"))


def _limits_seen(cluster: Cluster, node: str, index: int, seen: list[int]):
    def hook(info: StepInfo) -> None:
        seen.append(cluster.backend.power_limits(node, index).limit_mw)

    return hook


def test_a_tuned_job_probes_then_keeps_one_limit_and_gives_it_back(
    cluster: Cluster, storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Short phases, so the test's job is seconds long; the logic is the same.
    monkeypatch.setattr(
        job_energy,
        "TUNER_PHASES",
        {"warmup": (5, 0.6), "settle": (1, 0.1), "probe": (5, 0.3)},
    )
    # Windows this short drift on a loaded host; one decision is what this test looks at
    # (re-deciding has its own test in test_tuner.py).
    monkeypatch.setattr(job_energy, "TUNER_DRIFT", {"drift_windows": 10**6})
    # One reference window: no noise estimate, so the search probes whatever this host's
    # jitter (the guard against it has its own test in test_tuner.py).
    monkeypatch.setattr(job_energy, "TUNER_REFERENCE_WINDOWS", 1)
    binding = acquire(cluster, DeviceRequest(sku="v100"), "tuned")
    node, index = binding.resource.node, binding.resource.device_index
    default = cluster.backend.power_limits(node, index).limit_mw
    seen: list[int] = []
    spec = TrainSpec(
        job_id="tuned", model="llama-tiny", steps=600, checkpoint_interval=600, energy="tune"
    )
    result = run_training(
        spec, storage, cluster, binding, extra_hooks=(_limits_seen(cluster, node, index, seen),)
    )
    e = result.energy
    assert e["energy_j"] > 0 and e["average_power_w"] > 0 and e["time_per_step_s"] > 0
    assert e["tune_probes"] < 9  # fewer than the 100..300 W grid's nine limits
    chosen_mw = round(e["tuned_power_limit_w"] * 1000)
    assert seen[-1] == chosen_mw  # kept for the rest of the run
    assert len(set(seen)) >= 2  # it did probe
    assert e["tuned_slowdown"] <= 0.10 + 1e-9  # on what it measured
    assert cluster.backend.power_limits(node, index).limit_mw == default
    assert cluster.inventory.setting(node, index) is None  # nothing left in the ledger


def test_a_pinned_job_runs_at_its_limit_and_holds_the_row(
    cluster: Cluster, storage: CheckpointStorage
) -> None:
    binding = acquire(cluster, DeviceRequest(sku="v100"), "pinned")
    node, index = binding.resource.node, binding.resource.device_index
    default = cluster.backend.power_limits(node, index).limit_mw
    seen: list[int] = []
    holders: list[str | None] = []

    def holder(info: StepInfo) -> None:
        row = cluster.inventory.setting(node, index)
        holders.append(row.holder if row else None)

    spec = TrainSpec(
        job_id="pinned", model="llama-tiny", steps=12, energy="pinned", power_limit_w=150
    )
    result = run_training(
        spec,
        storage,
        cluster,
        binding,
        extra_hooks=(_limits_seen(cluster, node, index, seen), holder),
    )
    assert set(seen) == {150_000}
    assert set(holders) == {"pinned"}  # the controller sees the device as the job's
    assert result.energy["power_limit_w"] == 150.0
    assert cluster.backend.power_limits(node, index).limit_mw == default


def test_a_managed_job_records_its_energy_and_changes_nothing(
    cluster: Cluster, storage: CheckpointStorage
) -> None:
    binding = acquire(cluster, DeviceRequest(sku="v100"), "plain")
    node, index = binding.resource.node, binding.resource.device_index
    seen: list[int] = []
    spec = TrainSpec(job_id="plain", model="llama-tiny", steps=10)
    result = run_training(
        spec, storage, cluster, binding, extra_hooks=(_limits_seen(cluster, node, index, seen),)
    )
    assert len(set(seen)) == 1
    assert result.energy["energy_j"] > 0
    assert result.energy["energy_per_sample_j"] == pytest.approx(
        result.energy["energy_j"] / 10 / spec.resolved_batch_size
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"energy": "pinned"}, "exactly when energy is 'pinned'"),
        ({"power_limit_w": 150}, "exactly when energy is 'pinned'"),
        ({"energy": "tune", "gpus": 2}, "single-device jobs"),
    ],
)
def test_energy_settings_are_checked_in_the_spec(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainSpec(model="llama-tiny", **kwargs)


def _other_holder_row(cluster: Cluster, node: str, index: int) -> DeviceSettings:
    other = DeviceSettings(cluster.backend, cluster.inventory, "dvfs:earlier", ttl_s=3600)
    other.apply_power_limit(node, index, 200_000)
    return other


def test_a_pinned_job_waits_for_a_controllers_row_then_claims_it(cluster: Cluster) -> None:
    node, index = "v100-0", 0
    other = _other_holder_row(cluster, node, index)
    spec = TrainSpec(job_id="waits", model="llama-tiny", energy="pinned", power_limit_w=150)
    slept: list[float] = []

    def controller_ticks(seconds: float) -> None:  # the controller's next tick, in the gap
        slept.append(seconds)
        other.restore_all()

    je = JobEnergy(spec, cluster.backend, cluster.inventory, node, index, sleep=controller_ticks)
    je.start()
    assert len(slept) == 1
    assert cluster.inventory.setting(node, index).holder == "waits"
    assert cluster.backend.power_limits(node, index).limit_mw == 150_000
    je.close()
    assert cluster.inventory.setting(node, index) is None


def test_a_pinned_job_gives_up_clearly_and_changes_nothing(cluster: Cluster) -> None:
    node, index = "v100-0", 0
    _other_holder_row(cluster, node, index)
    spec = TrainSpec(job_id="gives-up", model="llama-tiny", energy="pinned", power_limit_w=150)
    now = [0.0]
    je = JobEnergy(
        spec,
        cluster.backend,
        cluster.inventory,
        node,
        index,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    with pytest.raises(HardwareError, match="held by 'dvfs:earlier'.*changed nothing"):
        je.start()
    assert cluster.backend.power_limits(node, index).limit_mw == 200_000
    assert cluster.inventory.setting(node, index).holder == "dvfs:earlier"
