from __future__ import annotations

import pytest
from gpuflow.hardware.backend import DeviceLostError, TelemetrySample
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.health.baselines import RuleModel
from gpuflow.tasks.health.events import DEVICE_LOST_REASON
from gpuflow.tasks.health.features import WINDOW_BUCKETS
from gpuflow.tasks.health.sampler import MIN_INTERVAL_S, TelemetrySampler, validate_interval_s
from gpuflow.tasks.health.scoring import DEVICE_FAILED_REASON, FleetScorer, score_fleet


@pytest.mark.parametrize("bad", [4.99, 0, -5, True, "5", float("inf"), float("nan")])
def test_interval_never_below_five_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        validate_interval_s(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TelemetrySampler(SimBackend(), interval_s=bad)  # type: ignore[arg-type]
    assert validate_interval_s(MIN_INTERVAL_S) == 5.0 and validate_interval_s(60) == 60.0


def test_rounds_wait_the_rest_of_the_interval() -> None:
    waits: list[float] = []
    sampler = TelemetrySampler(SimBackend(), interval_s=7.5, wait=waits.append)
    rounds = list(sampler.rounds(3))
    assert len(rounds) == 3 and len(waits) == 2
    assert all(0 <= w <= 7.5 for w in waits)
    with pytest.raises(ValueError, match="count"):
        list(sampler.rounds(0))


def test_lost_and_unreadable_devices_are_apart() -> None:
    twin = SimBackend()
    twin.inject_fault("a100-0", 1, "xid79")
    fleet = TelemetrySampler(twin).sample_all()
    assert [(x.device.node, x.device.index) for x in fleet.lost] == [("a100-0", 1)]
    assert "device lost" in fleet.lost[0].reason
    assert len(fleet.samples) == len(fleet.devices) - 1
    assert all(s.present for s in fleet.samples)


class FlakyTwin(SimBackend):
    """NVML-like: a lost device raises; another one fails to read once."""

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        if (node, index) == ("v100-0", 0):
            raise DeviceLostError("v100-0:0 fell off the bus")
        if (node, index) == ("v100-0", 1):
            from gpuflow.hardware.backend import HardwareError

            raise HardwareError("NVML_ERROR_TIMEOUT")
        return super().telemetry(node, index)


def test_device_lost_error_is_lost_other_errors_unreadable() -> None:
    fleet = TelemetrySampler(FlakyTwin()).sample_all()
    assert [(x.device.node, x.device.index) for x in fleet.lost] == [("v100-0", 0)]
    assert [(d.node, d.index) for d, _ in fleet.unreadable] == [("v100-0", 1)]


def test_score_fleet_with_rules_on_the_twin() -> None:
    twin = SimBackend()
    twin.inject_fault("a100-0", 2, "remap-pending")
    twin.inject_fault("a100-1", 0, "xid79")
    twin.inject_fault("v100-0", 3, "ecc-uncorrectable")
    risks = {(r.node, r.index): r for r in score_fleet(twin, RuleModel(WINDOW_BUCKETS))}
    assert len(risks) == len(twin.devices())
    assert risks[("a100-0", 2)].risk == 1.0
    assert risks[("a100-0", 2)].top_features["remap_pending"] == 1.0
    assert risks[("a100-1", 0)].risk == 1.0 and risks[("a100-1", 0)].reason == DEVICE_LOST_REASON
    failed = risks[("v100-0", 3)]
    assert failed.risk == 1.0 and failed.reason.startswith(DEVICE_FAILED_REASON)
    assert risks[("a100-0", 0)].risk == 0.0 and risks[("a100-0", 0)].reason == "model"
    assert risks[("a100-0", 2)].sku == "NVIDIA A100-SXM4-40GB"


def test_scorer_refuses_mismatched_state() -> None:
    from gpuflow.tasks.health.fleet_windows import FleetWindows

    with pytest.raises(ValueError, match="window"):
        FleetScorer(RuleModel(WINDOW_BUCKETS), FleetWindows(window=6))
