"""Repartitioning proposals: when no existing MIG/vDCU partition fits, which device to cut.

A proposal is a list of steps, one per device: partitions to destroy (only free ones) and
partitions to create. Each step also renders as a partition plan in mig-parted's format
(hardware.partition), scoped to that one device, so an operator can review it or
apply it with ``gpuflow hw partition apply``. Fitting uses the same exact placement search
as the partition plans (hardware.placement.fit_mig), memoised per (SKU, layout, profile):
a fleet of thousands of devices has only a handful of distinct layouts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpuflow.hardware.backend import PartitionRequest
from gpuflow.hardware.placement import LayoutError, Occupied, fit_mig
from gpuflow.hardware.skus import SkuSpec

Signature = tuple[tuple[int, int, int, str], ...]


@dataclass(frozen=True)
class RepartitionStep:
    """Cut one device for ``job_id``: destroy ``destroy`` (free partitions), then create."""

    job_id: str
    node: str
    index: int
    device_uuid: str
    sku: str
    kind: str  # mig | vdcu
    destroy: tuple[str, ...]
    create: tuple[PartitionRequest, ...]
    keep: tuple[tuple[str, int | None, int | None], ...] = ()  # (profile, CUs, MiB) left as is

    def desired_layout(self) -> dict[str, Any]:
        """The device's whole layout after the step, as a mig-parted plan entry."""
        entry: dict[str, Any] = {
            "device-filter": [self.sku],
            "devices": [self.index],
            "nodes": [self.node],
            "mig-enabled": True,
        }
        if not self.create and not self.keep:
            # A merge: the device goes back to whole (MIG off; no vDCUs).
            entry["mig-enabled"] = False
            entry["mig-devices"] = {}
            return entry
        if self.kind == "mig":
            counts = Counter(p for p, _, _ in self.keep) + Counter(r.profile for r in self.create)
            entry["mig-devices"] = dict(sorted(counts.items()))
        else:
            entry["mig-devices"] = {}
            entry["vdcu-devices"] = [
                {"compute-units": cu, "memory-mb": mb} for _, cu, mb in self.keep
            ] + [{"compute-units": r.compute_units, "memory-mb": r.memory_mb} for r in self.create]
        return entry

    def plan_document(self) -> dict[str, Any]:
        """A one-device partition plan (mig-parted ``version: v1``)."""
        return {"version": "v1", "mig-configs": {f"gpuflow-{self.job_id}": [self.desired_layout()]}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "node": self.node,
            "index": self.index,
            "device_uuid": self.device_uuid,
            "sku": self.sku,
            "kind": self.kind,
            "destroy": list(self.destroy),
            "create": [{k: v for k, v in vars(r).items() if v is not None} for r in self.create],
            "plan": self.plan_document(),
        }


def plan_for(steps: list[RepartitionStep] | tuple[RepartitionStep, ...]) -> dict[str, Any]:
    """All steps of one proposal as a single plan document."""
    entries = [s.desired_layout() for s in steps]
    name = f"gpuflow-{steps[0].job_id}" if steps else "gpuflow-empty"
    return {"version": "v1", "mig-configs": {name: entries}}


@lru_cache(maxsize=4096)
def mig_fit(
    spec: SkuSpec, layout: Signature, profile: str, want: int
) -> tuple[PartitionRequest, ...]:
    """The most instances of ``profile`` (up to ``want``) that fit beside ``layout``, with
    their placements; () when none does or the SKU lacks the profile."""
    if not spec.supports_mig or all(p.name != profile for p in spec.mig_profiles):
        return ()
    existing = [Occupied(start, size, slices) for start, size, slices, _ in layout]
    counts = Counter(name for _, _, _, name in layout)
    best: tuple[PartitionRequest, ...] = ()
    for m in range(1, want + 1):
        try:
            fitted = fit_mig(
                spec.name, spec.mig_profiles, [PartitionRequest(profile)] * m, existing, counts
            )
        except LayoutError:
            break
        best = tuple(fitted)
    return best
