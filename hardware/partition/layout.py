"""Device layouts: what one device holds, or should hold (MIG mode and its partitions)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.backend import Backend, DeviceInfo, Partition, PartitionRequest


def _req_key(r: PartitionRequest) -> tuple[Any, ...]:
    if r.profile == "vdcu":
        return ("vdcu", r.compute_units, r.memory_mb)
    return ("mig", r.profile)


@dataclass(frozen=True)
class DeviceLayout:
    """One device's partition layout: MIG mode and its partitions (MIG with placements)."""

    node: str
    index: int
    sku: str
    mig_enabled: bool
    partitions: tuple[PartitionRequest, ...] = ()
    entry: int | None = field(default=None, compare=False)  # plan entry it came from

    @property
    def device_id(self) -> str:
        return f"{self.node}:{self.index}"

    @property
    def label(self) -> str:
        return f"{self.node}:{self.index} ({self.sku})"

    def mig_counts(self) -> dict[str, int]:
        return dict(
            sorted(Counter(r.profile for r in self.partitions if r.profile != "vdcu").items())
        )

    def vdcu_sizes(self) -> list[tuple[int, int]]:
        """(compute_units, memory_mb) of each vDCU, sorted."""
        return sorted(
            (r.compute_units or 0, r.memory_mb or 0) for r in self.partitions if r.profile == "vdcu"
        )

    def same_as(self, other: DeviceLayout) -> bool:
        """Same mode and same multiset of partitions; MIG placements need not match."""
        return self.mig_enabled == other.mig_enabled and Counter(
            map(_req_key, self.partitions)
        ) == Counter(map(_req_key, other.partitions))

    def describe(self) -> str:
        """Short and free of square brackets (Rich reads those as markup): 'off',
        'on (no partitions)', 'on: 3g.20gb@4, 2g.10gb@0, 2x 1g.5gb@2,3', 'on: 2x vdcu 20cu/8192MiB'.
        """
        if not self.mig_enabled:
            return "off"
        if not self.partitions:
            return "on (no partitions)"
        groups: dict[str, list[str]] = {}
        for r in self.partitions:
            if r.profile == "vdcu":
                groups.setdefault(f"vdcu {r.compute_units}cu/{r.memory_mb}MiB", []).append("")
            else:
                start = "" if r.placement_start is None else str(r.placement_start)
                groups.setdefault(r.profile, []).append(start)
        parts = []
        for name, starts in groups.items():
            where = ",".join(s for s in starts if s)
            text = f"{name}@{where}" if where else name
            parts.append(text if len(starts) == 1 else f"{len(starts)}x {text}")
        return "on: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "mig_enabled": self.mig_enabled,
            "mig_devices": self.mig_counts(),
            "vdcu_devices": [{"compute_units": c, "memory_mb": m} for c, m in self.vdcu_sizes()],
            "partitions": [
                {k: v for k, v in vars(r).items() if v is not None} for r in self.partitions
            ],
        }


def exactly_same(a: DeviceLayout, b: DeviceLayout) -> bool:
    """Same mode and same partitions including MIG placements (order aside)."""
    return a.mig_enabled == b.mig_enabled and Counter(a.partitions) == Counter(b.partitions)


def current_layout(backend: Backend, dev: DeviceInfo) -> DeviceLayout:
    """What the device holds now (a device with no partition profiles is 'disabled')."""
    if not backend.partition_profiles(dev.node, dev.index):
        return DeviceLayout(dev.node, dev.index, dev.sku, False, ())
    enabled = backend.partition_mode(dev.node, dev.index)
    parts = backend.partitions(dev.node, dev.index)
    return DeviceLayout(dev.node, dev.index, dev.sku, enabled, tuple(_as_request(p) for p in parts))


def _as_request(p: Partition) -> PartitionRequest:
    if p.kind == "vdcu":
        return PartitionRequest(
            profile="vdcu", compute_units=p.compute_units, memory_mb=p.memory_mb
        )
    return PartitionRequest(profile=p.profile, placement_start=p.placement_start)
