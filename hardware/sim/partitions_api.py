"""SimBackend's partition calls: MIG (NVIDIA) and vDCU (Hygon) profiles, partition mode,
create and destroy. Fitting a request onto a device is hardware.placement's job."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    Partition,
    PartitionModeState,
    PartitionProfile,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.placement import Occupied, fit_mig, fit_vdcu
from gpuflow.hardware.sim import fleet, workloads
from gpuflow.hardware.sim.core import SimCore
from gpuflow.hardware.sim.maintenance_api import log_change
from gpuflow.hardware.skus import SkuSpec

VDCU_PROFILE = "vdcu"


class PartitionsApi(SimCore):
    """Partition profiles, mode and lifecycle on the twin's devices."""

    @staticmethod
    def _profiles(s: SkuSpec) -> list[PartitionProfile]:
        if s.supports_mig:
            return list(s.mig_profiles)
        if s.supports_vdcu:
            return [
                PartitionProfile(
                    name=VDCU_PROFILE,
                    kind="vdcu",
                    profile_id=0,
                    compute_slices=s.compute_units,
                    memory_mb=s.memory_total_mb,
                    max_count=s.vdcu_max_count,
                )
            ]
        return []

    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        with self._txn() as (state, _):
            return self._profiles(fleet.sku_of(self._live(state, node, index)))

    @staticmethod
    def _partition(dev: dict[str, Any], p: dict[str, Any]) -> Partition:
        return Partition(
            node=dev["node"],
            device_index=dev["index"],
            uuid=p["uuid"],
            profile=p["profile"],
            kind=p["kind"],
            memory_mb=p["memory_mb"],
            placement_start=p["placement_start"],
            placement_size=p["placement_size"],
            compute_units=p["compute_units"],
        )

    def partitions(self, node: str, index: int) -> list[Partition]:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            return [self._partition(dev, p) for p in dev["partitions"]]

    def partition_mode(self, node: str, index: int) -> bool:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            return bool(dev["partition_mode"] or dev["partitions"])

    def partition_mode_state(self, node: str, index: int) -> PartitionModeState:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            current = bool(dev["partition_mode"] or dev["partitions"])
            pending = dev.get("mode_pending")
            return PartitionModeState(current, current if pending is None else pending)

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        """MIG mode (NVIDIA) or virtual-device mode (Hygon): at once, unless a client holds
        the GPU (``hold_device``): then the MIG change waits for ``reset_devices``."""
        if not isinstance(enabled, bool):
            raise InvalidRequestError(f"enabled must be true or false, got {enabled!r}")
        with self._txn() as (state, now):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            if not (s.supports_mig or s.supports_vdcu):
                raise UnsupportedError(
                    f"{self._label(dev)} has no hard partitioning (no MIG, no vDCU)"
                )
            if enabled and not s.supports_mig:
                # Hygon, as hy-smi reports it (hardware/hygon/backend.py): no per-DCU mode,
                # a DCU reads as partitioned exactly while it has vDCUs; so "on" changes
                # nothing here either, and "off" only checks that none is left (below).
                return
            current = bool(dev["partition_mode"] or dev["partitions"])
            if enabled == current:
                if dev.get("mode_pending") is not None:  # asking for the current mode
                    dev["mode_pending"] = None  # cancels a pending change, as NVML does
                    log_change(
                        state, dev, now, "set_partition_mode", enabled=enabled, pending=False
                    )
                return
            tenants = workloads.tenants_of(state, dev["node"], dev["index"])
            if tenants:
                raise HardwareError(
                    f"{self._label(dev)}: cannot change partition mode while tenants run on it: "
                    f"{', '.join(tenants)}"
                )
            if not enabled and dev["partitions"]:
                raise HardwareError(
                    f"{self._label(dev)}: destroy its partitions first: "
                    f"{', '.join(p['uuid'] for p in dev['partitions'])}"
                )
            if s.supports_mig and (dev.get("holders") or dev.get("passthrough")):
                # As NVML does when a client (DCGM, the exporter) holds the GPU, or the GPU
                # is passed through to a VM: the change waits for a GPU reset.
                dev["mode_pending"] = enabled
                log_change(state, dev, now, "set_partition_mode", enabled=enabled, pending=True)
                return
            dev["partition_mode"] = enabled
            dev["mode_pending"] = None
            log_change(state, dev, now, "set_partition_mode", enabled=enabled, pending=False)

    def _new_partition_uuid(self, state: dict[str, Any], kind: str) -> str:
        state["seq"]["partition"] += 1
        u = fleet.stable_uuid(
            "gpuflow-partition", state["spec"]["seed"], kind, state["seq"]["partition"]
        )
        return f"{'MIG' if kind == 'mig' else 'VDCU'}-{u}"

    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        requests = list(requests)
        for r in requests:
            if not isinstance(r, PartitionRequest):
                raise InvalidRequestError(f"expected PartitionRequest objects, got {r!r}")
        with self._txn() as (state, now):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            label = self._label(dev)
            if s.supports_mig:
                created = self._create_mig(state, dev, s, label, requests)
            elif s.supports_vdcu:
                created = self._create_vdcu(state, dev, s, label, requests)
            else:
                raise UnsupportedError(f"{label} supports neither MIG nor vDCU partitions")
            dev["partitions"].extend(created)
            log_change(state, dev, now, "create_partitions", uuids=[p["uuid"] for p in created])
            return [self._partition(dev, p) for p in created]

    def _create_mig(
        self,
        state: dict[str, Any],
        dev: dict[str, Any],
        s: SkuSpec,
        label: str,
        requests: list[PartitionRequest],
    ) -> list[dict[str, Any]]:
        for r in requests:
            if r.compute_units is not None or r.memory_mb is not None:
                raise InvalidRequestError(
                    f"{label}: compute_units / memory_mb are vDCU fields; a MIG request names a profile"
                )
        if not dev["partition_mode"]:
            raise HardwareError(
                f"{label}: MIG mode is disabled; enable it first (set_partition_mode(..., True)) "
                "before creating GPU instances"
            )
        if not requests:
            return []
        existing = [
            Occupied(p["placement_start"], p["placement_size"], p["compute_slices"])
            for p in dev["partitions"]
        ]
        counts = Counter(p["profile"] for p in dev["partitions"])
        fitted = fit_mig(label, s.mig_profiles, requests, existing, counts)
        out = []
        for r in fitted:
            prof = s.mig_profile(r.profile)
            out.append(
                {
                    "uuid": self._new_partition_uuid(state, "mig"),
                    "profile": prof.name,
                    "kind": "mig",
                    "profile_id": prof.profile_id,
                    "memory_mb": prof.memory_mb,
                    "placement_start": r.placement_start,
                    "placement_size": prof.placement_size,
                    "compute_slices": prof.compute_slices,
                    "compute_units": None,
                }
            )
        return out

    def _create_vdcu(
        self,
        state: dict[str, Any],
        dev: dict[str, Any],
        s: SkuSpec,
        label: str,
        requests: list[PartitionRequest],
    ) -> list[dict[str, Any]]:
        for r in requests:
            if r.placement_start is not None:
                raise InvalidRequestError(
                    f"{label}: placement_start is a MIG field; vDCUs have none"
                )
        if not requests:
            return []
        existing = [
            PartitionRequest(
                profile=VDCU_PROFILE, compute_units=p["compute_units"], memory_mb=p["memory_mb"]
            )
            for p in dev["partitions"]
        ]
        fit_vdcu(label, s.vdcu_max_count, s.compute_units, s.memory_total_mb, existing + requests)
        # hy-smi needs no mode switch: a DCU is "on" while it has vDCUs, and no flag is
        # kept, so destroying the last one turns it "off" as on real hy-smi.
        dev["partition_mode"] = False
        return [
            {
                "uuid": self._new_partition_uuid(state, "vdcu"),
                "profile": VDCU_PROFILE,
                "kind": "vdcu",
                "profile_id": 0,
                "memory_mb": r.memory_mb,
                "placement_start": None,
                "placement_size": None,
                "compute_slices": None,
                "compute_units": r.compute_units,
            }
            for r in requests
        ]

    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        with self._txn() as (state, now):
            dev = self._live(state, node, index)
            have = [p["uuid"] for p in dev["partitions"]]
            if uuids is None:
                doomed = set(have)
            else:
                doomed = set(uuids)
                unknown = sorted(doomed - set(have))
                if unknown:
                    raise InvalidRequestError(
                        f"{self._label(dev)}: no partition(s) {unknown}; existing: {have or 'none'}"
                    )
            busy = [
                o
                for o, w in workloads.tenants_of(state, dev["node"], dev["index"]).items()
                if w["partition"] in doomed
            ]
            if busy:
                raise HardwareError(
                    f"{self._label(dev)}: partitions in use by tenants {', '.join(busy)}; stop them first"
                )
            dev["partitions"] = [p for p in dev["partitions"] if p["uuid"] not in doomed]
            if doomed:
                log_change(state, dev, now, "destroy_partitions", uuids=sorted(doomed))
            # Tenants that failed on a destroyed partition keep their status but lose the link.
            for w in state["workloads"].values():
                if (
                    w["node"] == dev["node"]
                    and w["index"] == dev["index"]
                    and w["partition"] in doomed
                ):
                    w["partition"] = None
