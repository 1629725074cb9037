"""Assert a plan: how the devices differ from it (mig-parted's ``assert``); changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.partition.layout import current_layout
from gpuflow.hardware.partition.select import plan_layouts, select_devices
from gpuflow.hardware.partition.spec import PartitionPlan


@dataclass(frozen=True)
class Mismatch:
    node: str
    index: int
    sku: str
    key: str  # "mig-enabled" | "mig-devices" | "vdcu-devices"
    expected: Any
    actual: Any

    def __str__(self) -> str:
        return f"{self.node}:{self.index} ({self.sku}): {self.key} is {self.actual!r}, plan wants {self.expected!r}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "key": self.key,
            "expected": self.expected,
            "actual": self.actual,
        }


def assert_plan(
    backend: Backend,
    plan: PartitionPlan,
    config: str | None = None,
    nodes: Sequence[str] | None = None,
) -> list[Mismatch]:
    """How the devices differ from ``config``; empty when they match (placements aside)."""
    name, _ = plan.config(config)
    desired = plan_layouts(backend, plan, name, nodes)
    devs = {(d.node, d.index): d for d in select_devices(backend, nodes)}
    out: list[Mismatch] = []
    for want in desired:
        have = current_layout(backend, devs[(want.node, want.index)])
        if have.mig_enabled != want.mig_enabled:
            out.append(
                Mismatch(
                    want.node,
                    want.index,
                    want.sku,
                    "mig-enabled",
                    want.mig_enabled,
                    have.mig_enabled,
                )
            )
            if not want.mig_enabled:
                continue
        if have.mig_counts() != want.mig_counts():
            out.append(
                Mismatch(
                    want.node,
                    want.index,
                    want.sku,
                    "mig-devices",
                    want.mig_counts(),
                    have.mig_counts(),
                )
            )
        if have.vdcu_sizes() != want.vdcu_sizes():
            out.append(
                Mismatch(
                    want.node,
                    want.index,
                    want.sku,
                    "vdcu-devices",
                    want.vdcu_sizes(),
                    have.vdcu_sizes(),
                )
            )
    return out
