"""Declarative partition plans in NVIDIA mig-parted's config format: apply, assert, export.

mig-parted's shape, a declarative config and three verbs, one module each:

- ``spec``: the ``version: v1`` document (format, extensions, validation) and its errors;
- ``layout``: what a device holds (``DeviceLayout``, ``current_layout``);
- ``select``: which devices a config selects and the layout it asks of each;
- ``apply``, ``assert_layout``, ``export``: the verbs.

The whole plan is validated against every selected device's own profiles and placement
rules before any device is touched; an impossible plan raises :class:`PlanError` and
nothing changes. ``apply_plan`` skips devices already in the desired layout and restores
every device it changed when a step fails half-way.
"""

from gpuflow.hardware.partition.apply import ApplyReport, DeviceChange, PlanApplyError, apply_plan
from gpuflow.hardware.partition.assert_layout import Mismatch, assert_plan
from gpuflow.hardware.partition.export import export_layout
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
    "ApplyReport",
    "DeviceChange",
    "DeviceLayout",
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
    "load_plan",
    "normalize_profile",
    "parse_plan",
    "plan_layouts",
]
