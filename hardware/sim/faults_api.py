"""SimBackend's fault calls: inject a fault, repair a device, and the twin's ground truth
(fault log, device health, lemons) that a health model learns from. The fault classes are
hardware.sim.faults; their schedules hardware.sim.hazard."""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.backend import HardwareError, InvalidRequestError
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import fleet, workloads
from gpuflow.hardware.sim.core import SimCore, is_number
from gpuflow.hardware.sim.hazard import draw_injected
from gpuflow.hardware.sim.tenants_api import fatal_error


class FaultsApi(SimCore):
    """Faults injected into, and repairs of, the twin's devices."""

    def inject_fault(
        self, node: str, index: int, kind: str, lead_s: float | None = None
    ) -> dict[str, Any]:
        """Inject a fault of ``kind`` (see FAULT_KINDS) now; ``lead_s`` overrides the
        drawn lead time of a degradation ("hbm", "thermal")."""
        if kind not in F.FAULT_KINDS:
            raise InvalidRequestError(
                f"unknown fault kind {kind!r}; valid: {', '.join(F.FAULT_KINDS)}"
            )
        if lead_s is not None:
            if kind not in ("hbm", "thermal"):
                raise InvalidRequestError(
                    f"lead_s applies to 'hbm' and 'thermal' faults, not {kind!r}"
                )
            if not is_number(lead_s) or not 1.0 <= lead_s <= 365 * 86_400:
                raise InvalidRequestError(f"lead_s must be in [1 s, 365 days], got {lead_s!r}")
        with self._txn() as (state, now):
            dev = self._dev(state, node, index)
            label = self._label(dev)
            health = dev["health"]
            if health == "lost":
                raise HardwareError(f"{label} is already lost (off the bus); repair it first")
            if health == "failed" and kind != "app-fatal":
                raise HardwareError(
                    f"{label} has already failed ({dev['failure']['reason']}); repair it first"
                )
            if health == "degrading" and kind in ("hbm", "thermal"):
                raise HardwareError(f"{label} is already degrading ({dev['fault']['kind']})")
            seq_before = state["seq"]["xid"]
            result: dict[str, Any] = {
                "node": dev["node"],
                "index": dev["index"],
                "uuid": dev["uuid"],
                "kind": kind,
                "sim_time_s": now,
                "failed_tenants": [],
                "expected_failure_s": None,
            }
            if kind in ("hbm", "thermal"):
                state["seq"]["inject"] += 1
                drawn_lead, final = draw_injected(
                    state["spec"]["seed"], state["seq"]["inject"], kind
                )
                fault = fleet.start_fault(
                    state,
                    dev,
                    now,
                    kind,
                    "injected",
                    float(lead_s) if lead_s else drawn_lead,
                    final,
                )
                result["expected_failure_s"] = now + fault["lead_s"]
                result["lead_s"] = fault["lead_s"]
            elif kind == "xid79":
                result["failed_tenants"] = fleet.fail_abrupt(
                    state, dev, now, kind, "injected", F.LOST_XID
                )
                result["expected_failure_s"] = now
            elif kind == "ecc-uncorrectable":
                result["failed_tenants"] = fleet.fail_abrupt(state, dev, now, kind, "injected", 48)
                result["expected_failure_s"] = now
            elif kind == "remap-pending":
                fleet.apply_remap_pending(state, dev, now, kind, "injected")
            else:  # app-fatal: the first running tenant's fatal error, shared per the sharing mode
                running = workloads.tenants_of(state, dev["node"], dev["index"])
                if running:
                    result["failed_tenants"] = fatal_error(
                        state, now, next(iter(running)), "injected"
                    )
                else:
                    fleet.emit_xid(state, dev, now, F.APP_FATAL_XID)
                    fleet.log_event(
                        state,
                        dev,
                        now,
                        "app-fatal",
                        kind,
                        "injected",
                        xid=F.APP_FATAL_XID,
                        tenants=[],
                    )
            result["xids"] = [x for seq, _t, x in dev["xids"] if seq > seq_before]
            return result

    def repair(self, node: str, index: int) -> None:
        """Reset or replace the device: faults and error counters cleared, healthy again.

        Partitions, clocks and power settings are kept (as re-applied by the operator);
        tenants that failed stay failed until their owner clears or restarts them.
        """
        with self._txn() as (state, now):
            fleet.repair(state, self._dev(state, node, index), now)

    def fault_log(self, since_s: float | None = None) -> list[dict[str, Any]]:
        """Injected and natural fault events (onset, precursor, failure, repair, app-fatal)
        with sim time, class and device: the labels a health model learns from."""
        with self._txn() as (state, _):
            return [
                dict(e) for e in state["fault_log"] if since_s is None or e["sim_time_s"] >= since_s
            ]

    def device_health(self, node: str, index: int) -> dict[str, Any]:
        """The twin's ground truth for one device (not visible to a real backend)."""
        with self._txn() as (state, now):
            dev = self._dev(state, node, index)
            nxt = dev["natural_next"] if state["natural"] else None
            return {
                "health": dev["health"],
                "lemon": dev["lemon"],
                "rate_per_day": dev["rate_per_day"],
                "fault": dict(dev["fault"]) if dev["fault"] else None,
                "failure": dict(dev["failure"]) if dev["failure"] else None,
                "next_natural_onset_s": nxt["onset_s"] if nxt else None,
                "temperature_c": dev["temperature_c"],
                "sim_time_s": now,
            }

    def lemons(self) -> list[tuple[str, int]]:
        """The devices the hazard model made lemons (much higher hazard)."""
        with self._txn() as (state, _):
            return [(d["node"], d["index"]) for d in state["devices"].values() if d["lemon"]]
