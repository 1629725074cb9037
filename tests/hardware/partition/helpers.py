"""Shared by the partition plan tests: plan files, the twin, and a backend proxy that
counts mutating calls and fails the Nth of a kind."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuflow.hardware.backend import Backend, HardwareError, Partition, PartitionRequest
from gpuflow.hardware.partition import current_layout

PLANS = Path(__file__).resolve().parents[1] / "plans"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "partition-plans"
A100_NODES = ["a100-0", "a100-1", "a100-spare-0"]


def make_backend(tmp_path: Path, nodes: dict[str, list[str]] | None = None) -> Backend:
    """The digital twin: the default fleet, or one node per entry of ``nodes``."""
    from gpuflow.hardware.sim import SimBackend

    if nodes is None:
        return SimBackend(home=tmp_path)
    import yaml

    spec = {
        "name": "plan-test",
        "seed": 1,
        "faults": {"natural": False},
        "nodes": [
            {
                "name": n,
                "region": "r",
                "role": "active",
                "devices": [{"sku": s, "count": 1} for s in skus],
            }
            for n, skus in nodes.items()
        ],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return SimBackend(home=tmp_path, spec_path=path)


class Proxy(Backend):
    """Passes everything to ``inner``; counts mutating calls; can fail the Nth of a kind.

    A failing create_partitions first creates half of its requests, so the device is left
    half-way, as a real driver error part-way through a batch would leave it.
    """

    name = "proxy"

    def __init__(
        self, inner: Backend, fail_create: int | None = None, fail_mode: int | None = None
    ):
        self.inner = inner
        self.fail_create = fail_create
        self.fail_mode = fail_mode
        self.creates = 0
        self.modes = 0
        self.destroys = 0
        self.resets = 0
        self.armed = True

    def discover(self):
        return self.inner.discover()

    def telemetry(self, node, index):
        return self.inner.telemetry(node, index)

    def partition_profiles(self, node, index):
        return self.inner.partition_profiles(node, index)

    def partitions(self, node, index):
        return self.inner.partitions(node, index)

    def partition_mode(self, node, index):
        return self.inner.partition_mode(node, index)

    def partition_mode_state(self, node, index):
        return self.inner.partition_mode_state(node, index)

    def device_processes(self, node, index):
        return self.inner.device_processes(node, index)

    def reset_devices(self, devices):
        self.resets += 1
        return self.inner.reset_devices(devices)

    def set_partition_mode(self, node, index, enabled):
        self.modes += 1
        if self.armed and self.modes == self.fail_mode:
            self.armed = False
            raise HardwareError(f"injected: MIG mode change failed on {node}:{index}")
        return self.inner.set_partition_mode(node, index, enabled)

    def create_partitions(
        self, node, index, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        self.creates += 1
        if self.armed and self.creates == self.fail_create:
            self.armed = False
            half = list(requests)[: max(1, len(requests) // 2)]
            self.inner.create_partitions(node, index, half)
            raise HardwareError(f"injected: create failed on {node}:{index}")
        return self.inner.create_partitions(node, index, requests)

    def destroy_partitions(self, node, index, uuids=None):
        self.destroys += 1
        return self.inner.destroy_partitions(node, index, uuids)

    def clocks(self, node, index):
        return self.inner.clocks(node, index)

    def set_locked_clocks(self, node, index, min_mhz, max_mhz):
        return self.inner.set_locked_clocks(node, index, min_mhz, max_mhz)

    def reset_locked_clocks(self, node, index):
        return self.inner.reset_locked_clocks(node, index)

    def set_applications_clocks(self, node, index, mem_clock_mhz, sm_clock_mhz):
        return self.inner.set_applications_clocks(node, index, mem_clock_mhz, sm_clock_mhz)

    def power_limits(self, node, index):
        return self.inner.power_limits(node, index)

    def set_power_limit_mw(self, node, index, limit_mw):
        return self.inner.set_power_limit_mw(node, index, limit_mw)

    @property
    def mutations(self) -> int:
        return self.creates + self.modes + self.destroys + self.resets


def exact_state(backend: Backend) -> dict[str, tuple]:
    """Every device's mode and partitions with placements (uuids aside)."""
    out = {}
    for d in backend.devices():
        lay = current_layout(backend, d)
        out[lay.device_id] = (lay.mig_enabled, sorted(map(repr, lay.partitions)))
    return out
