"""Declarative partition plans in NVIDIA mig-parted's config format: apply, assert, export.

mig-parted's shape, a declarative config and three verbs, one module each:

- ``spec``: the ``version: v1`` document (format, extensions, validation) and its errors;
- ``layout``: what a device holds (``DeviceLayout``, ``current_layout``);
- ``select``: which devices a config selects and the layout it asks of each;
- ``apply``, ``assert_layout``, ``export``: the verbs;
- ``hooks``: mig-parted's hooks file around an apply; ``guard``: the inventory's part
  (devices in use refused, cordoned while changed, re-synced after).

The whole plan is validated against every selected device's own profiles and placement
rules before any device is touched; an impossible plan raises :class:`PlanError` and
nothing changes. ``apply_plan`` skips devices already in the desired layout and restores
every device it changed when a step fails half-way.

``guard`` is imported by name (``gpuflow.hardware.partition.guard``): it brings in the
inventory (SQLAlchemy), which plans alone do not need.
"""

from gpuflow.hardware.partition.apply import ApplyReport, DeviceChange, PlanApplyError, apply_plan
from gpuflow.hardware.partition.assert_layout import Mismatch, assert_plan
from gpuflow.hardware.partition.export import export_layout
from gpuflow.hardware.partition.hooks import NO_HOOKS, ApplyHooks, HookError, load_hooks
from gpuflow.hardware.partition.layout import DeviceLayout, current_layout
from gpuflow.hardware.partition.select import plan_layouts
from gpuflow.hardware.partition.spec import (
    PartitionPlan,
    PlanEntry,
    PlanError,
    PlanFormatError,
    VdcuSpec,
    dump_yaml,
    load_plan,
    normalize_profile,
    parse_plan,
)

__all__ = [
    "NO_HOOKS",
    "ApplyHooks",
    "ApplyReport",
    "DeviceChange",
    "DeviceLayout",
    "HookError",
    "Mismatch",
    "PartitionPlan",
    "PlanApplyError",
    "PlanEntry",
    "PlanError",
    "PlanFormatError",
    "VdcuSpec",
    "apply_plan",
    "assert_plan",
    "current_layout",
    "dump_yaml",
    "export_layout",
    "load_hooks",
    "load_plan",
    "normalize_profile",
    "parse_plan",
    "plan_layouts",
]
