"""The tour's first steps: discover the twin's fleet, apply the plan 'tour', and watch an
impossible plan be refused with nothing changed."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.partition import (
    ApplyReport,
    PartitionPlan,
    apply_plan,
    export_layout,
    plan_layouts,
)
from gpuflow.hardware.placement import LayoutError


def tour_plan_path() -> Path:
    """The tour's partition plan (configs 'tour' and 'impossible'), shipped with gpuflow."""
    return Path(str(resources.files("gpuflow") / "data" / "tour-plan.yaml"))


def discover(twin: Backend, inventory: Inventory) -> list[dict[str, Any]]:
    """Every device of the fleet (rows of ``fleet_rows``), the inventory brought in step."""
    from gpuflow.tasks.fleet import fleet_rows

    inventory.sync(twin)
    return fleet_rows(twin)


def partition(twin: Backend, inventory: Inventory, plan: PartitionPlan) -> ApplyReport:
    report = apply_plan(twin, plan, "tour")
    inventory.sync(twin)
    return report


@dataclass(frozen=True)
class Refusal:
    reason: str | None  # None: the plan was NOT refused (it is impossible by construction)
    layout_unchanged: bool


def refuse_impossible(twin: Backend, plan: PartitionPlan) -> Refusal:
    before = export_layout(twin, with_nodes=True)
    try:
        plan_layouts(twin, plan, "impossible")
    except LayoutError as exc:
        return Refusal(str(exc), export_layout(twin, with_nodes=True) == before)
    return Refusal(
        None, export_layout(twin, with_nodes=True) == before
    )  # pragma: no cover - see the plan
