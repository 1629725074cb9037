"""compare_precision's pin: every arm on the units the fp32 baseline ran on."""

from __future__ import annotations

from gpuflow.flows.compare_precision import pinned_to
from gpuflow.tasks.training.binding import DeviceRequest


def test_pinned_to_names_the_baselines_units_and_keeps_the_profile() -> None:
    one = pinned_to(
        {"units": ["MIG-1"], "sku": "NVIDIA A100-SXM4-40GB"}, DeviceRequest(profile="3g.20gb")
    )
    assert (one.resource_id, one.resource_ids, one.sku, one.profile) == (
        "MIG-1",
        None,
        "NVIDIA A100-SXM4-40GB",
        "3g.20gb",
    )
    gang = pinned_to({"units": ["GPU-a", "GPU-b"], "sku": "Tesla V100-SXM2-32GB"}, None)
    assert gang.pinned == ("GPU-a", "GPU-b") and gang.resource_id is None
