"""SimBackend's maintenance calls: clients that hold a GPU, the GPU reset that makes a
pending MIG mode take effect, and the log of every call that changed a device's layout.

Real fleets, as mig-parted meets them: a MIG mode change on a GPU that a client keeps
open (nv-hostengine for DCGM, dcgm-exporter, a VM's hypervisor) is left pending by NVML;
``nvidia-smi -r`` then applies it, but refuses while any client or process still holds
the GPU ("in use by another client"); on a GPU passed through to a VM every mode change
waits for one. mig-parted's pre-apply-mode hook stops those clients first and its
apply-exit hook starts them again. The twin models exactly that: ``hold_device`` is such
a client, ``set_passthrough`` such a GPU, ``reset_devices`` refuses while a client holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import HardwareError, InvalidRequestError
from gpuflow.hardware.sim import fleet, workloads
from gpuflow.hardware.sim.core import SimCore

CHANGE_LOG_MAX = 20_000


def log_change(
    state: dict[str, Any], dev: dict[str, Any], t: float, call: str, **args: Any
) -> None:
    """Record one call that changed ``dev`` (mode, partitions, reset), bounded like the
    fault log: what tests and operators read to prove what an apply touched."""
    log = state.setdefault("change_log", [])
    state["seq"]["change"] = state["seq"].get("change", 0) + 1
    log.append(
        {
            "seq": state["seq"]["change"],
            "sim_time_s": t,
            "node": dev["node"],
            "index": dev["index"],
            "call": call,
            **args,
        }
    )
    if len(log) > CHANGE_LOG_MAX:
        del log[: len(log) - CHANGE_LOG_MAX]


def _check_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder.strip():
        raise InvalidRequestError(f"a holder is a non-empty name, got {holder!r}")
    return holder.strip()


class MaintenanceApi(SimCore):
    """Holders, resets and the change log of the twin's devices."""

    def hold_device(self, node: str, index: int, holder: str) -> None:
        """A client (e.g. "nv-hostengine") keeps the GPU open from now on."""
        name = _check_holder(holder)
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            holders = dev.setdefault("holders", [])
            if name not in holders:
                holders.append(name)

    def release_device(self, node: str, index: int, holder: str) -> bool:
        """The client stopped; False when it did not hold the GPU."""
        name = _check_holder(holder)
        with self._txn() as (state, _):
            dev = self._dev(state, node, index)
            holders = dev.get("holders") or []
            if name not in holders:
                return False
            holders.remove(name)
            return True

    def set_passthrough(self, node: str, index: int, passthrough: bool = True) -> None:
        """The GPU is passed through to a VM: every MIG mode change waits for a reset (the
        guest cannot activate it in place), even with no client holding it."""
        if not isinstance(passthrough, bool):
            raise InvalidRequestError(f"passthrough must be true or false, got {passthrough!r}")
        with self._txn() as (state, _):
            self._live(state, node, index)["passthrough"] = passthrough

    def holders(self, node: str, index: int) -> list[str]:
        """The clients holding the GPU open (``hold_device``)."""
        with self._txn() as (state, _):
            return list(self._dev(state, node, index).get("holders") or [])

    def device_processes(self, node: str, index: int) -> list[str]:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            return [f"tenant {t}" for t in workloads.tenants_of(state, dev["node"], dev["index"])]

    @staticmethod
    def _holders(state: dict[str, Any], dev: dict[str, Any]) -> list[str]:
        tenants = workloads.tenants_of(state, dev["node"], dev["index"])
        return [f"tenant {t}" for t in tenants] + list(dev.get("holders") or [])

    def reset_devices(self, devices: Sequence[tuple[str, int]]) -> None:
        """Reset GPUs (as ``nvidia-smi -r -i ...``): a pending MIG mode takes effect, MIG
        instances and locked or application clocks are gone. All or none: refused, naming
        every holder, while anything holds one of them."""
        with self._txn() as (state, now):
            devs = [self._live(state, n, i) for n, i in devices]
            held = {self._label(d): self._holders(state, d) for d in devs}
            busy = {label: who for label, who in held.items() if who}
            if busy:
                raise HardwareError(
                    "GPU reset refused: "
                    + "; ".join(
                        f"{label} is in use by {', '.join(who)}" for label, who in busy.items()
                    )
                    + " (stop them first, e.g. in a pre-apply-mode hook)"
                )
            for dev in devs:
                if not fleet.sku_of(dev).supports_mig:
                    raise InvalidRequestError(f"{self._label(dev)} has no GPU reset in the twin")
            for dev in devs:
                pending = dev.get("mode_pending")
                if pending is not None:
                    dev["partition_mode"] = pending
                dev["mode_pending"] = None
                dev["partitions"] = []
                dev["locked_min_mhz"] = dev["locked_max_mhz"] = None
                dev["applications_sm_mhz"] = dev["applications_mem_mhz"] = None
                log_change(state, dev, now, "reset", mode=dev["partition_mode"])

    def change_log(self, since_seq: int = 0) -> list[dict[str, Any]]:
        """Every mode change, create, destroy and reset, oldest first, after ``since_seq``."""
        with self._txn() as (state, _):
            return [dict(e) for e in state.get("change_log", []) if e["seq"] > since_seq]
