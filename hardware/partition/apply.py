"""Apply a plan: bring every selected device to its layout, all or nothing.

As mig-parted does it, in phases over all selected devices: the MIG mode of every device
whose (current, pending) mode differs from the plan, then one reset of the devices whose
change NVML left pending, then the partitions. mig-parted's hooks run around them
(hooks.py): apply-start, pre-apply-mode (stop what holds the GPUs, so the reset can
happen), pre-apply-config, and apply-exit always.

Before any device changes: the whole plan is validated (select.py), devices with compute
processes or tenants are refused, and the guard (guard.py: the inventory) refuses leased
devices and cordons the rest. Devices already in their layout are not touched; when a
step fails, every device the apply changed gets back the exact layout it had (placements
and its pending mode too). Afterwards, whatever happened, the guard re-syncs the
inventory and requeues jobs placed on partitions that no longer exist.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuflow.hardware.backend import (
    Backend,
    DeviceBusyError,
    DeviceInfo,
    HardwareError,
    PartitionModeState,
)
from gpuflow.hardware.partition.hooks import NO_HOOKS, ApplyHooks
from gpuflow.hardware.partition.layout import DeviceLayout, current_layout, exactly_same
from gpuflow.hardware.partition.select import plan_layouts, select_devices
from gpuflow.hardware.partition.spec import PartitionPlan

if TYPE_CHECKING:
    from gpuflow.hardware.partition.guard import ChangeGuard

log = logging.getLogger(__name__)


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
        self.settled: dict[str, Any] = {}


@dataclass(frozen=True)
class DeviceChange:
    node: str
    index: int
    sku: str
    changed: bool
    before: DeviceLayout
    after: DeviceLayout
    pending_reset: bool = False  # its mode change waits for a GPU reset (skip_reset)

    @property
    def before_summary(self) -> str:
        return self.before.describe()

    @property
    def after_summary(self) -> str:
        text = self.after.describe()
        return text + " (MIG mode change pending a GPU reset)" if self.pending_reset else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "index": self.index,
            "sku": self.sku,
            "changed": self.changed,
            "pending_reset": self.pending_reset,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
        }


@dataclass(frozen=True)
class ApplyReport:
    config: str
    devices: tuple[DeviceChange, ...]
    reset: tuple[str, ...] = ()  # devices reset so their pending mode took effect
    settled: dict[str, Any] = field(default_factory=dict)  # what the guard found after
    skipped_lost: tuple[str, ...] = ()  # devices that fell off the bus, left out

    @property
    def changed(self) -> list[DeviceChange]:
        return [d for d in self.devices if d.changed]

    @property
    def unchanged(self) -> list[DeviceChange]:
        return [d for d in self.devices if not d.changed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "devices": [d.to_dict() for d in self.devices],
            "reset": list(self.reset),
            "settled": self.settled,
            "skipped_lost": list(self.skipped_lost),
        }


def _mode_state(backend: Backend, dev: DeviceInfo) -> PartitionModeState | None:
    """None for a device without hard partitioning (nothing to switch)."""
    if not backend.partition_profiles(dev.node, dev.index):
        return None
    return backend.partition_mode_state(dev.node, dev.index)


def _label(dev: DeviceInfo) -> str:
    return f"{dev.node}:{dev.index} ({dev.sku})"


@dataclass
class _Touched:
    dev: DeviceInfo
    layout: DeviceLayout
    mode: PartitionModeState | None


class _Apply:
    """One apply: its plan, what it touched (for the rollback) and the step under way."""

    def __init__(
        self,
        backend: Backend,
        config: str,
        desired: list[DeviceLayout],
        devs: dict[tuple[str, int], DeviceInfo],
        hooks: ApplyHooks,
        envs: Mapping[str, str],
        skip_reset: bool,
    ) -> None:
        self.backend = backend
        self.config = config
        self.desired = desired
        self.devs = devs
        self.hooks = hooks
        self.envs = envs
        self.skip_reset = skip_reset
        self.befores = {k: current_layout(backend, d) for k, d in devs.items()}
        self.modes = {k: _mode_state(backend, d) for k, d in devs.items()}
        self.touched: dict[tuple[str, int], _Touched] = {}
        self.step = "starting"
        self.at: DeviceInfo | None = None

    @staticmethod
    def key(w: DeviceLayout) -> tuple[str, int]:
        return (w.node, w.index)

    def needs_mode(self, w: DeviceLayout) -> bool:
        mode = self.modes[self.key(w)]
        return mode is not None and (mode.current, mode.pending) != (w.mig_enabled, w.mig_enabled)

    def needs_change(self, w: DeviceLayout) -> bool:
        return self.needs_mode(w) or not self.befores[self.key(w)].same_as(w)

    def touch(self, w: DeviceLayout) -> DeviceInfo:
        k = self.key(w)
        dev = self.devs[k]
        if k not in self.touched:
            self.touched[k] = _Touched(dev, self.befores[k], self.modes[k])
        self.at = dev
        return dev

    def hook(self, name: str) -> None:
        self.step, self.at = f"running the {name} hook", None
        self.hooks.run(name, self.envs)

    # -- the phases --------------------------------------------------------------------
    def run(self, todo: list[DeviceLayout]) -> tuple[list[DeviceChange], list[str]]:
        mode_todo = [w for w in todo if self.needs_mode(w)]
        waiting: set[tuple[str, int]] = set()
        reset: list[str] = []
        if mode_todo:
            self.hook("pre-apply-mode")
            for w in mode_todo:
                dev = self.touch(w)
                if self.backend.partitions(dev.node, dev.index):
                    self.step = "destroying its partitions"
                    self.backend.destroy_partitions(dev.node, dev.index)
                self.step = f"{'enabling' if w.mig_enabled else 'disabling'} MIG mode"
                self.backend.set_partition_mode(dev.node, dev.index, w.mig_enabled)
                if self.backend.partition_mode_state(dev.node, dev.index).reset_pending:
                    waiting.add(self.key(w))
            if waiting and not self.skip_reset:
                held = [self.devs[k] for k in sorted(waiting)]
                self.step = "resetting " + ", ".join(_label(d) for d in held)
                self.at = held[0]
                self.backend.reset_devices([(d.node, d.index) for d in held])
                for d in held:
                    state = self.backend.partition_mode_state(d.node, d.index)
                    if state.reset_pending:
                        raise HardwareError(f"{_label(d)}: MIG mode still pending after the reset")
                reset = [f"{d.node}:{d.index}" for d in held]
                waiting.clear()
        config_todo = [
            w
            for w in todo
            if self.key(w) not in waiting
            and not current_layout(self.backend, self.devs[self.key(w)]).same_as(w)
        ]
        if config_todo:
            self.hook("pre-apply-config")
            for w in config_todo:
                dev = self.touch(w)
                if self.backend.partitions(dev.node, dev.index):
                    self.step = "destroying its partitions"
                    self.backend.destroy_partitions(dev.node, dev.index)
                if w.partitions:
                    self.step = "creating " + w.describe().removeprefix("on: ")
                    self.backend.create_partitions(dev.node, dev.index, list(w.partitions))
                self.step = "verifying the new layout"
                after = current_layout(self.backend, dev)
                if not after.same_as(w):
                    raise HardwareError(
                        f"the device reports {after.describe()}, wanted {w.describe()}"
                    )
        changes = []
        for w in self.desired:
            k = self.key(w)
            dev = self.devs[k]
            before = self.befores[k]
            if k not in self.touched:
                changes.append(DeviceChange(dev.node, dev.index, dev.sku, False, before, before))
                continue
            after = current_layout(self.backend, dev)
            changes.append(
                DeviceChange(dev.node, dev.index, dev.sku, True, before, after, k in waiting)
            )
        return changes, reset

    # -- the rollback ------------------------------------------------------------------
    def restore(self, t: _Touched) -> None:
        """Put one device back: its partitions (placements too) and (current, pending)."""
        dev, be = t.dev, self.backend
        now = current_layout(be, dev)
        state = _mode_state(be, dev)
        if exactly_same(now, t.layout) and state == t.mode:
            return
        if now.partitions:
            be.destroy_partitions(dev.node, dev.index)
        if t.mode is not None and state is not None:
            if state.current != t.mode.current:
                be.set_partition_mode(dev.node, dev.index, t.mode.current)
                if be.partition_mode_state(dev.node, dev.index).reset_pending:
                    be.reset_devices([(dev.node, dev.index)])
            elif state.pending != state.current:
                be.set_partition_mode(dev.node, dev.index, state.current)  # cancel ours
        if t.layout.partitions:
            be.create_partitions(dev.node, dev.index, list(t.layout.partitions))
        if t.mode is not None and t.mode.reset_pending:
            be.set_partition_mode(dev.node, dev.index, t.mode.pending)  # as it was: pending

    def rollback(self, exc: BaseException) -> PlanApplyError:
        restored: list[str] = []
        failures: dict[str, str] = {}
        for t in reversed(list(self.touched.values())):
            did = f"{t.dev.node}:{t.dev.index}"
            try:
                self.restore(t)
                restored.append(did)
            except Exception as rb_exc:  # keep going: restore as many devices as we can
                failures[did] = f"{type(rb_exc).__name__}: {rb_exc}"
        label = _label(self.at) if self.at is not None else "the node"
        msg = (
            f"applying partition config {self.config!r} failed on {label} while {self.step}: "
            f"{type(exc).__name__}: {exc}; "
        )
        if restored:
            msg += (
                f"rolled back {len(restored)} device(s) to their previous layout "
                f"({', '.join(reversed(restored))})"
            )
        elif not failures:
            msg += "no device had been changed"
        if failures:
            msg += (
                ("; " if restored else "")
                + "ROLLBACK FAILED on "
                + "; ".join(f"{d}: {why}" for d, why in failures.items())
            )
        return PlanApplyError(
            msg,
            device=label,
            step=self.step,
            rolled_back=list(reversed(restored)),
            rollback_failures=failures,
        )


def _check_not_busy(backend: Backend, devs: Sequence[DeviceInfo]) -> None:
    busy = {
        f"{d.node}:{d.index}": who
        for d in devs
        if (who := backend.device_processes(d.node, d.index))
    }
    if busy:
        raise DeviceBusyError(busy)


def apply_plan(
    backend: Backend,
    plan: PartitionPlan,
    config: str | None = None,
    nodes: Sequence[str] | None = None,
    *,
    hooks: ApplyHooks = NO_HOOKS,
    skip_reset: bool = False,
    guard: ChangeGuard | None = None,
    hook_envs: Mapping[str, str] | None = None,
) -> ApplyReport:
    """Bring every device ``config`` selects to its layout; all or nothing.

    Refused before anything changes (PlanError, DeviceBusyError) when the plan does not
    fit or a device to change is in use. If a step fails, every device this apply changed
    gets back the layout and mode it had and PlanApplyError says what failed and what was
    restored. ``skip_reset`` leaves mode changes NVML holds pending for a later reset (as
    mig-parted's --skip-reset); those devices get no partitions yet and say so.
    """
    name, _ = plan.config(config)
    lost: list[str] = []
    desired = plan_layouts(backend, plan, name, nodes, lost)  # validates the whole plan first
    by_key = {(d.node, d.index): d for d in select_devices(backend, nodes)}
    devs = {(w.node, w.index): by_key[(w.node, w.index)] for w in desired}
    work = _Apply(
        backend,
        name,
        desired,
        devs,
        hooks,
        {
            "MIG_PARTED_SELECTED_CONFIG": name,
            "MIG_PARTED_SKIP_RESET": str(skip_reset).lower(),
            **(hook_envs or {}),
        },
        skip_reset,
    )
    todo = [w for w in desired if work.needs_change(w)]
    changing = [devs[(w.node, w.index)] for w in todo]
    _check_not_busy(backend, changing)
    reason = f"partition apply of config {name!r}"
    if guard is not None and changing:
        guard.reserve(backend, changing, reason)
    failure: BaseException | None = None
    try:
        try:
            work.hook("apply-start")
            changes, reset = work.run(todo)
        except Exception as exc:
            failure = work.rollback(exc)
            failure.__cause__ = exc
        try:
            work.hook("apply-exit")  # always, like mig-parted's deferred apply-exit
        except Exception as exc:
            if failure is None:
                raise HardwareError(
                    f"config {name!r} applied, but the apply-exit hook failed: {exc}"
                ) from exc
            log.error("apply-exit hook failed after a failed apply: %s", exc)
    finally:
        settled = guard.settle(backend, reason) if guard is not None and changing else {}
    if failure is not None:
        if isinstance(failure, PlanApplyError):
            failure.settled = settled
        raise failure
    return ApplyReport(
        config=name,
        devices=tuple(changes),
        reset=tuple(reset),
        settled=settled,
        skipped_lost=tuple(lost),
    )
