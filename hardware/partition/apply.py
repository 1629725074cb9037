"""Apply a plan: bring every selected device to its layout, all or nothing.

Devices already in their layout are not touched; when a step fails half-way, every device
the apply changed gets back the exact layout it had (placements too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import Backend, DeviceInfo, HardwareError
from gpuflow.hardware.partition.layout import DeviceLayout, current_layout, exactly_same
from gpuflow.hardware.partition.select import plan_layouts, select_devices
from gpuflow.hardware.partition.spec import PartitionPlan


class PlanApplyError(HardwareError):
    """A step failed half-way through an apply; the devices changed were rolled back."""

    def __init__(
        self,
        message: str,
        *,
        device: str,
        step: str,
        rolled_back: Sequence[str],
        rollback_failures: Mapping[str, str],
    ) -> None:
        super().__init__(message)
        self.device = device
        self.step = step
        self.rolled_back = list(rolled_back)
        self.rollback_failures = dict(rollback_failures)


@dataclass(frozen=True)
class DeviceChange:
    node: str
    index: int
    sku: str
    changed: bool
    before: DeviceLayout
    after: DeviceLayout

    @property
    def before_summary(self) -> str:
        return self.before.describe()

    @property
    def after_summary(self) -> str:
        return self.after.describe()

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "changed": self.changed,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
        }


@dataclass(frozen=True)
class ApplyReport:
    config: str
    devices: tuple[DeviceChange, ...]

    @property
    def changed(self) -> list[DeviceChange]:
        return [d for d in self.devices if d.changed]

    @property
    def unchanged(self) -> list[DeviceChange]:
        return [d for d in self.devices if not d.changed]

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "devices": [d.to_dict() for d in self.devices]}


def _set_layout(
    backend: Backend, dev: DeviceInfo, have: DeviceLayout, want: DeviceLayout, step: list[str]
) -> None:
    """Move one device from ``have`` to ``want``; ``step`` records the step under way."""
    if have.partitions:
        step[0] = "destroying its partitions"
        backend.destroy_partitions(dev.node, dev.index)
    if have.mig_enabled != want.mig_enabled:
        step[0] = f"{'enabling' if want.mig_enabled else 'disabling'} partitioning (MIG mode)"
        backend.set_partition_mode(dev.node, dev.index, want.mig_enabled)
    if want.partitions:
        step[0] = "creating " + want.describe().removeprefix("on: ")
        backend.create_partitions(dev.node, dev.index, list(want.partitions))


def apply_plan(
    backend: Backend,
    plan: PartitionPlan,
    config: str | None = None,
    nodes: Sequence[str] | None = None,
) -> ApplyReport:
    """Bring every device ``config`` selects to its layout; all or nothing.

    Devices already in their layout are not touched. If a step fails, every device this
    apply changed gets back the layout it had (same placements) and PlanApplyError says
    what failed and what was restored.
    """
    name, _ = plan.config(config)
    desired = plan_layouts(backend, plan, name, nodes)  # validates the whole plan first
    devs = {(d.node, d.index): d for d in select_devices(backend, nodes)}
    befores = {(w.node, w.index): current_layout(backend, devs[(w.node, w.index)]) for w in desired}

    touched: list[tuple[DeviceInfo, DeviceLayout]] = []  # (device, snapshot) in change order
    results: list[DeviceChange] = []
    for want in desired:
        dev = devs[(want.node, want.index)]
        before = befores[(want.node, want.index)]
        if before.same_as(want):
            results.append(DeviceChange(dev.node, dev.index, dev.sku, False, before, before))
            continue
        step = ["reading its layout"]
        touched.append((dev, before))
        try:
            _set_layout(backend, dev, before, want, step)
            step[0] = "verifying the new layout"
            after = current_layout(backend, dev)
            if not after.same_as(want):
                raise HardwareError(
                    f"the device reports {after.describe()}, wanted {want.describe()}"
                )
        except Exception as exc:
            raise _rollback(backend, name, dev, step[0], exc, touched) from exc
        results.append(DeviceChange(dev.node, dev.index, dev.sku, True, before, after))
    return ApplyReport(config=name, devices=tuple(results))


def _rollback(
    backend: Backend,
    config: str,
    failed: DeviceInfo,
    step: str,
    exc: BaseException,
    touched: list[tuple[DeviceInfo, DeviceLayout]],
) -> PlanApplyError:
    restored: list[str] = []
    failures: dict[str, str] = {}
    for dev, snapshot in reversed(touched):
        did = f"{dev.node}:{dev.index}"
        try:
            now = current_layout(backend, dev)
            if not exactly_same(now, snapshot):  # placements too: restore what was there
                _set_layout(backend, dev, now, snapshot, ["rollback"])
            restored.append(did)
        except Exception as rb_exc:  # keep going: restore as many devices as we can
            failures[did] = f"{type(rb_exc).__name__}: {rb_exc}"
    label = f"{failed.node}:{failed.index} ({failed.sku})"
    msg = (
        f"applying partition config {config!r} failed on {label} while {step}: "
        f"{type(exc).__name__}: {exc}; "
    )
    if restored:
        msg += f"rolled back {len(restored)} device(s) to their previous layout ({', '.join(reversed(restored))})"
    if failures:
        msg += (
            ("; " if restored else "")
            + "ROLLBACK FAILED on "
            + "; ".join(f"{d}: {why}" for d, why in failures.items())
        )
    return PlanApplyError(
        msg,
        device=label,
        step=step,
        rolled_back=list(reversed(restored)),
        rollback_failures=failures,
    )
