"""SimBackend's tenant calls: run, report, clear and list workloads on the twin, how long
a tenant's work takes at the clock its device runs (``device_delay_s``), and an
application fatal error with the co-tenants it takes down. The sharing rules (who shares a
fate with whom) are hardware.sim.workloads's job."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gpuflow.hardware.backend import HardwareError, InvalidRequestError
from gpuflow.hardware.sim import dvfs_model, fleet, physics, workloads
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim.core import SimCore, is_int, is_number


def fatal_error(state: dict[str, Any], now: float, owner: str, source: str) -> list[str]:
    """Fail ``owner`` and the co-tenants its fatal error takes down; returns them all."""
    w = state["workloads"][owner]
    dev = state["devices"][fleet.device_key(w["node"], w["index"])]
    if not workloads.is_running(w):
        return []
    scope = workloads.fatal_error_scope(state, owner)
    failed = workloads.fail(state, [owner], "application fatal error (XID 13)")
    where = "same partition" if w["partition"] else "shared device, no isolation"
    failed += workloads.fail(
        state, scope[1:], f"fatal error in co-tenant {owner!r} ({where}, XID 13)"
    )
    fleet.emit_xid(state, dev, now, F.APP_FATAL_XID)
    fleet.log_event(
        state,
        dev,
        now,
        "app-fatal",
        "app-fatal",
        source,
        xid=F.APP_FATAL_XID,
        tenant=owner,
        partition=w["partition"],
        tenants=failed,
    )
    return failed


class TenantsApi(SimCore):
    """Tenants on the twin's devices and partitions, and their fate."""

    def set_workload(
        self,
        node: str,
        index: int,
        owner: str,
        utilization_ratio: float,
        memory_mb: int = 0,
        partition_uuid: str | None = None,
        *,
        memory_bound_ratio: float | None = None,
        activity: float | None = None,
    ) -> None:
        """Run (or update) tenant ``owner`` on a device or one of its partitions.

        ``memory_bound_ratio`` and ``activity`` are its character (hardware.sim.dvfs_model);
        None: the cluster spec's default. Each call sets them afresh.
        """
        dvfs_model.check_character(memory_bound_ratio, activity)
        if not isinstance(owner, str) or not owner.strip():
            raise InvalidRequestError(f"owner must be a non-empty string, got {owner!r}")
        if not is_number(utilization_ratio) or not 0.0 <= utilization_ratio <= 1.0:
            raise InvalidRequestError(
                f"utilization_ratio must be in [0, 1], got {utilization_ratio!r}"
            )
        if not is_int(memory_mb) or memory_mb < 0:
            raise InvalidRequestError(f"memory_mb must be an integer >= 0, got {memory_mb!r}")
        with self._txn() as (state, now):
            dev = self._live(state, node, index)
            label = self._label(dev)
            if dev["health"] == "failed":
                raise HardwareError(
                    f"{label} has failed ({dev['failure']['reason']}); repair it first"
                )
            previous = state["workloads"].get(owner)
            if previous is not None and not workloads.is_running(previous):
                # Its process is dead (as a CUDA context is after a fatal error): a report
                # must not quietly revive it; a restart registers afresh.
                raise HardwareError(
                    f"tenant {owner!r} has {previous['status']}; clear it (clear_workload / "
                    "end_workload) before starting it again"
                )
            s = fleet.sku_of(dev)
            parts = {p["uuid"]: p for p in dev["partitions"]}
            if partition_uuid is not None:
                if partition_uuid not in parts:
                    raise InvalidRequestError(
                        f"{label}: no partition {partition_uuid!r}; partitions: {list(parts) or 'none'}"
                    )
                capacity = parts[partition_uuid]["memory_mb"]
            else:
                if parts or (s.supports_mig and dev["partition_mode"]):
                    raise InvalidRequestError(
                        f"{label} is partitioned (MIG / vDCU mode): run on a partition "
                        f"({list(parts) or 'none created yet'})"
                    )
                capacity = s.memory_total_mb
            others = sum(
                w["memory_mb"]
                for o, w in workloads.tenants_of(state, dev["node"], dev["index"]).items()
                if o != owner and w["partition"] == partition_uuid
            )
            if others + memory_mb > capacity:
                raise InvalidRequestError(
                    f"{label}: out of memory: {memory_mb} MiB requested, {capacity - others} MiB "
                    f"free of {capacity} MiB{' on ' + partition_uuid if partition_uuid else ''}"
                )
            state["workloads"][owner] = {
                "node": dev["node"],
                "index": dev["index"],
                "partition": partition_uuid,
                "utilization_ratio": float(utilization_ratio),
                "memory_mb": int(memory_mb),
                "status": workloads.RUNNING,
                "since_s": now,
                "memory_bound_ratio": _opt_float(memory_bound_ratio),
                "activity": _opt_float(activity),
            }

    def report_workload(
        self,
        node: str,
        index: int,
        owner: str,
        utilization_ratio: float,
        memory_mb: int = 0,
        partition_uuid: str | None = None,
        *,
        memory_bound_ratio: float | None = None,
        activity: float | None = None,
    ) -> None:
        """Backend hook: on the twin, reporting a workload is running it (set_workload)."""
        self.set_workload(
            node,
            index,
            owner,
            utilization_ratio,
            memory_mb,
            partition_uuid,
            memory_bound_ratio=memory_bound_ratio,
            activity=activity,
        )

    def device_delay_s(self, node: str, index: int, owner: str, busy_s: float) -> float:
        """Extra seconds ``busy_s`` of host-timed work takes at the clock the device runs
        now: busy_s * (T(f) / T(f_max) - 1) for ``owner``'s character (dvfs_model).

        The clock is the controller's decision now - power limit, locked and application
        clocks, temperature. A tenant not registered yet (its first report is still to
        come) counts with the spec's default character; on an idle device the clock is the
        one it would pick with that tenant's kernel running (not the idle clock).
        """
        if not is_number(busy_s) or not math.isfinite(busy_s) or busy_s < 0:
            raise InvalidRequestError(f"busy_s must be a number >= 0, got {busy_s!r}")
        return float(busy_s) * (self.device_time_ratio(node, index, owner) - 1.0)

    def device_time_ratio(self, node: str, index: int, owner: str) -> float:
        """T(f) / T(f_max) for ``owner``'s character at the clock the device runs now (see
        device_delay_s): what the training loop's pacing stretches a step's work by."""
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            if dev["health"] == "failed":
                raise HardwareError(
                    f"{self._label(dev)} has failed ({dev['failure']['reason']}); repair it first"
                )
            w = state["workloads"].get(owner)
            if w is not None:
                if (w["node"], w["index"]) != (dev["node"], dev["index"]):
                    raise InvalidRequestError(
                        f"tenant {owner!r} runs on {w['node']}:{w['index']}, not {node}:{index}"
                    )
                if not workloads.is_running(w):
                    raise HardwareError(f"tenant {owner!r} has {w['status']}")
            m, activity = workloads.character(state, w)
            s = fleet.sku_of(dev)
            c = fleet.controls(state, dev, dev["last_s"])
            if c.load <= 0.0:
                c = dataclasses.replace(c, load=1.0, activity=activity)
            op = physics.decide(s, fleet.power_model(s.name), c, dev["temperature_c"])
            return float(dvfs_model.time_ratio(op.clock_mhz, s.sm_clock_max_mhz, m))

    def end_workload(self, owner: str) -> None:
        """Backend hook: the job ended (clear_workload)."""
        self.clear_workload(owner)

    def clear_workload(self, owner: str) -> bool:
        """Remove a tenant (finished or failed); False if there was none."""
        with self._txn() as (state, _):
            return state["workloads"].pop(owner, None) is not None

    def workload_status(self, owner: str) -> str:
        """ "running", "failed: <reason>" or "absent"."""
        with self._txn() as (state, _):
            w = state["workloads"].get(owner)
            return "absent" if w is None else str(w["status"])

    def tenants(
        self, node: str | None = None, index: int | None = None
    ) -> dict[str, dict[str, Any]]:
        """Every tenant (optionally of one node / device) with its placement and status."""
        with self._txn() as (state, _):
            return {
                o: dict(w)
                for o, w in sorted(state["workloads"].items())
                if (node is None or w["node"] == node) and (index is None or w["index"] == index)
            }

    def tenant_fatal_error(self, owner: str) -> list[str]:
        """An application fatal error in ``owner``; returns the tenants it took down."""
        with self._txn() as (state, now):
            if owner not in state["workloads"]:
                raise InvalidRequestError(
                    f"no tenant {owner!r}; tenants: {sorted(state['workloads']) or 'none'}"
                )
            return fatal_error(state, now, owner, "injected")


def _opt_float(v: float | None) -> float | None:
    return None if v is None else float(v)
