"""SimBackend: the digital twin of a mixed fleet behind the ordinary Backend interface.

Every call is one transaction on the shared state (hardware.sim.state): lock, read, run
every device forward to the present (hardware.sim.fleet), validate, change, write. So
separate processes - a flow, a monitor, the CLI - see one fleet, and a request that is
rejected changes nothing. Beyond the Backend methods the twin offers what a real fleet
does to you: tenants and their fate (``set_workload``, ``tenant_fatal_error``), faults
(``inject_fault``, natural ones from the hazard model, ``repair``), a fast-forward clock
(``advance``) and the labels a health model learns from (``fault_log``).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuflow.hardware.backend import (
    Backend,
    ClockState,
    DeviceInfo,
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    NodeInfo,
    Partition,
    PartitionProfile,
    PartitionRequest,
    PowerLimits,
    TelemetrySample,
    UnsupportedError,
)
from gpuflow.hardware.home import gpuflow_home
from gpuflow.hardware.placement import Occupied, fit_mig, fit_vdcu
from gpuflow.hardware.sim import clock as simclock
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import fleet, workloads
from gpuflow.hardware.sim.cluster_spec import ClusterSpec, load_cluster_spec
from gpuflow.hardware.sim.hazard import draw_injected
from gpuflow.hardware.sim.state import StateStore
from gpuflow.hardware.skus import SkuSpec

FIRST_READ_XID_WINDOW_S = 300.0  # a new reader sees XIDs from the last 5 sim-minutes
VDCU_PROFILE = "vdcu"


def _canonical(d: dict[str, Any]) -> Any:
    return json.loads(json.dumps(d, sort_keys=True))


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SimBackend(Backend):
    """The twin. ``home`` defaults to GPUFLOW_HOME; state lives in ``home/twin``.

    ``spec_path`` (a cluster spec YAML) is used when the twin is created; if a twin
    already exists from a different spec, construction fails and says how to reset.
    """

    name = "sim"

    def __init__(self, home: Path | None = None, spec_path: Path | None = None) -> None:
        self.home = Path(home) if home is not None else gpuflow_home()
        self.state_dir = self.home / "twin"
        self._store = StateStore(self.state_dir)
        self._spec_path = Path(spec_path) if spec_path is not None else None
        # Per-instance XID cursors, like an NVML event set is per process.
        self._xid_cursor: dict[tuple[str, str, int], int] = {}
        spec = load_cluster_spec(self._spec_path) if self._spec_path is not None else None
        with self._store.locked():
            try:
                state = self._store.read()
            except HardwareError:
                return  # corrupt: every call will say so, and reset() still works
            if state is None:
                self._store.write(fleet.new_state(spec or load_cluster_spec(None)))
                return
            if state.get("version") != fleet.STATE_VERSION:
                return  # every call will say so, and reset() still works
            if spec is not None and _canonical(spec.to_dict()) != _canonical(state["spec"]):
                raise HardwareError(
                    f"the twin in {self.state_dir} was created from {state['spec_source']} "
                    f"(cluster {state['spec']['name']!r}); {self._spec_path} describes a "
                    f"different fleet. To start over from it: "
                    f"SimBackend(home).reset(spec_path={str(self._spec_path)!r}) "
                    f"(or `gpuflow sim reset --spec {self._spec_path}`)"
                )

    def _check_version(self, state: dict[str, Any]) -> None:
        if state.get("version") != fleet.STATE_VERSION:
            raise HardwareError(
                f"the twin state in {self.state_dir} has version {state.get('version')!r}, "
                f"this code reads version {fleet.STATE_VERSION}; reset the twin "
                "(SimBackend(home).reset())"
            )

    # -- state plumbing ----------------------------------------------------------------

    def _create(self) -> dict[str, Any]:
        return fleet.new_state(load_cluster_spec(self._spec_path))

    @contextlib.contextmanager
    def _txn(self) -> Iterator[tuple[dict[str, Any], float]]:
        """The state, run forward to now; written back unless the block raises."""
        with self._store.transaction(self._create) as state:
            self._check_version(state)
            now = simclock.now_s(state["clock"])
            fleet.sync_all(state, now)
            yield state, now

    def reset(self, spec_path: Path | None = None) -> None:
        """Re-create the twin from ``spec_path`` (None: the packaged default fleet)."""
        self.reset_state(spec_path, self.home)
        self._spec_path = Path(spec_path) if spec_path is not None else None
        self._xid_cursor.clear()

    @classmethod
    def reset_state(cls, spec_path: Path | None = None, home: Path | None = None) -> None:
        """Re-create the twin in ``home`` (GPUFLOW_HOME) without opening the old state."""
        spec = load_cluster_spec(Path(spec_path) if spec_path is not None else None)
        store = StateStore((Path(home) if home is not None else gpuflow_home()) / "twin")
        with store.locked():
            store.write(fleet.new_state(spec))

    def spec(self) -> ClusterSpec:
        """The cluster spec the twin was created from."""
        with self._txn() as (state, _):
            return ClusterSpec.from_dict(state["spec"], source=state["spec_source"])

    # -- lookups -----------------------------------------------------------------------

    @staticmethod
    def _known_devices(state: dict[str, Any]) -> str:
        per_node: dict[str, list[int]] = {}
        for d in state["devices"].values():
            per_node.setdefault(d["node"], []).append(d["index"])
        return ", ".join(f"{n}:{min(ix)}..{max(ix)}" for n, ix in per_node.items())

    def _dev(self, state: dict[str, Any], node: str, index: int) -> dict[str, Any]:
        dev = state["devices"].get(fleet.device_key(str(node), index)) if _is_int(index) else None
        if dev is None:
            raise InvalidRequestError(
                f"no device {node}:{index} in the twin; devices: {self._known_devices(state)}"
            )
        return dev

    def _live(self, state: dict[str, Any], node: str, index: int) -> dict[str, Any]:
        dev = self._dev(state, node, index)
        if dev["health"] == "lost":
            raise DeviceLostError(
                f"{node}:{index} ({dev['uuid']}) fell off the bus (XID 79); repair it"
            )
        return dev

    @staticmethod
    def _label(dev: dict[str, Any]) -> str:
        return f"{dev['node']}:{dev['index']} ({dev['sku']})"

    # -- discovery ---------------------------------------------------------------------

    @staticmethod
    def _device_info(dev: dict[str, Any]) -> DeviceInfo:
        s = fleet.sku_of(dev)
        kinds: tuple[Any, ...] = (
            ("mig",) if s.supports_mig else ("vdcu",) if s.supports_vdcu else ()
        )
        return DeviceInfo(
            node=dev["node"],
            index=dev["index"],
            vendor=s.vendor,
            sku=s.name,
            uuid=dev["uuid"],
            memory_total_mb=s.memory_total_mb,
            pci_device_id=s.pci_device_id,
            partition_kinds=kinds,
        )

    def discover(self) -> list[NodeInfo]:
        with self._txn() as (state, _):
            return [
                NodeInfo(
                    name=n["name"],
                    region=n["region"],
                    role=n["role"],
                    devices=tuple(
                        self._device_info(d)
                        for d in state["devices"].values()
                        if d["node"] == n["name"]
                    ),
                )
                for n in state["nodes"]
            ]

    # -- telemetry ---------------------------------------------------------------------

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        with self._txn() as (state, now):
            dev = self._dev(state, node, index)
            s = fleet.sku_of(dev)
            key = (state["generation"], dev["node"], dev["index"])
            last = self._xid_cursor.get(key)
            if last is None:
                xids = [x for seq, t, x in dev["xids"] if t >= now - FIRST_READ_XID_WINDOW_S]
            else:
                xids = [x for seq, t, x in dev["xids"] if seq > last]
            if dev["xids"]:
                self._xid_cursor[key] = dev["xids"][-1][0]
            elif last is None:
                self._xid_cursor[key] = 0
            c = F.counters_at(dev, now)
            present = dev["health"] != "lost"
            op = fleet.operating(state, dev)
            if present:
                util = workloads.device_load(state, dev, s.compute_units)
                mem = workloads.memory_used_mb(state, dev)
            else:
                util, mem = 0.0, 0
            return TelemetrySample(
                node=dev["node"],
                index=dev["index"],
                timestamp_s=now,
                present=present,
                temperature_c=round(dev["temperature_c"], 2) if present else 0.0,
                power_mw=int(round(op.power_mw)),
                energy_mj=int(dev["energy_mj"]),
                utilization_ratio=round(util, 4),
                memory_used_mb=mem,
                memory_total_mb=s.memory_total_mb,
                sm_clock_mhz=op.clock_mhz,
                power_limit_mw=dev["power_limit_mw"],
                ecc_corrected_total=c["ecc_corrected"],
                ecc_uncorrected_total=c["ecc_uncorrected"],
                retired_pages=c["retired_pages"],
                remapped_rows_correctable=c["remap_correctable"],
                remapped_rows_uncorrectable=c["remap_uncorrectable"],
                remapped_rows_pending=c["remap_pending"],
                remapped_rows_failure=c["remap_failure"],
                clock_event_reasons=op.reasons,
                xids=tuple(xids),
            )

    # -- partitions --------------------------------------------------------------------

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

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        """MIG mode (NVIDIA) or virtual-device mode (Hygon); applied at once in the twin."""
        if not isinstance(enabled, bool):
            raise InvalidRequestError(f"enabled must be true or false, got {enabled!r}")
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            if not (s.supports_mig or s.supports_vdcu):
                raise UnsupportedError(
                    f"{self._label(dev)} has no hard partitioning (no MIG, no vDCU)"
                )
            current = bool(dev["partition_mode"] or dev["partitions"])
            if enabled == current:
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
            dev["partition_mode"] = enabled

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
        with self._txn() as (state, _):
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
        # hy-smi needs no mode switch: creating virtual devices is what enables them.
        dev["partition_mode"] = True
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
        with self._txn() as (state, _):
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
            # Tenants that failed on a destroyed partition keep their status but lose the link.
            for w in state["workloads"].values():
                if (
                    w["node"] == dev["node"]
                    and w["index"] == dev["index"]
                    and w["partition"] in doomed
                ):
                    w["partition"] = None

    # -- clocks and power --------------------------------------------------------------

    def clocks(self, node: str, index: int) -> ClockState:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            return ClockState(
                sm_clock_mhz=fleet.operating(state, dev).clock_mhz,
                sm_clock_min_mhz=s.sm_clock_min_mhz,
                sm_clock_max_mhz=s.sm_clock_max_mhz,
                locked_min_mhz=dev["locked_min_mhz"],
                locked_max_mhz=dev["locked_max_mhz"],
                applications_sm_clock_mhz=dev["applications_sm_mhz"],
                applications_mem_clock_mhz=dev["applications_mem_mhz"],
            )

    def _check_clock(self, dev: dict[str, Any], what: str, value: object) -> int:
        s = fleet.sku_of(dev)
        if not _is_int(value) or not s.sm_clock_min_mhz <= value <= s.sm_clock_max_mhz:  # type: ignore[operator]
            raise InvalidRequestError(
                f"{self._label(dev)}: {what} {value!r} MHz is outside the supported range "
                f"{s.sm_clock_min_mhz}..{s.sm_clock_max_mhz} MHz"
            )
        return int(value)  # type: ignore[arg-type]

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            lo = self._check_clock(dev, "locked min clock", min_mhz)
            hi = self._check_clock(dev, "locked max clock", max_mhz)
            if lo > hi:
                raise InvalidRequestError(
                    f"{self._label(dev)}: locked clock range {lo}..{hi} MHz has min > max"
                )
            dev["locked_min_mhz"], dev["locked_max_mhz"] = lo, hi

    def reset_locked_clocks(self, node: str, index: int) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            dev["locked_min_mhz"] = dev["locked_max_mhz"] = None

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            if mem_clock_mhz != s.mem_clock_mhz or not _is_int(mem_clock_mhz):
                raise InvalidRequestError(
                    f"{self._label(dev)}: memory clock {mem_clock_mhz!r} MHz is not supported; "
                    f"supported: [{s.mem_clock_mhz}]"
                )
            sm = self._check_clock(dev, "application SM clock", sm_clock_mhz)
            dev["applications_mem_mhz"], dev["applications_sm_mhz"] = mem_clock_mhz, sm

    def reset_applications_clocks(self, node: str, index: int) -> None:
        """Back to the default application clocks (NVML nvmlDeviceResetApplicationsClocks)."""
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            dev["applications_mem_mhz"] = dev["applications_sm_mhz"] = None

    def power_limits(self, node: str, index: int) -> PowerLimits:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            return PowerLimits(
                limit_mw=dev["power_limit_mw"],
                min_limit_mw=s.power_min_limit_mw,
                max_limit_mw=s.power_max_limit_mw,
                default_limit_mw=s.power_default_limit_mw,
            )

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            if (
                not _is_int(limit_mw)
                or not s.power_min_limit_mw <= limit_mw <= s.power_max_limit_mw
            ):
                raise InvalidRequestError(
                    f"{self._label(dev)}: power limit {limit_mw!r} mW is outside the supported range "
                    f"{s.power_min_limit_mw}..{s.power_max_limit_mw} mW"
                )
            dev["power_limit_mw"] = int(limit_mw)

    # -- the twin's clock --------------------------------------------------------------

    def now_s(self) -> float:
        """Sim time (Unix-like seconds; runs ahead of the wall clock after ``advance``)."""
        with self._txn() as (_, now):
            return now

    def advance(self, seconds: float) -> float:
        """Fast-forward every process's view of the fleet; returns the new sim time."""
        with self._store.transaction(self._create) as state:
            self._check_version(state)
            fleet.sync_all(state, simclock.now_s(state["clock"]))
            now = simclock.advance(state["clock"], seconds)
            fleet.sync_all(state, now)
            return now

    # -- tenants -----------------------------------------------------------------------

    def set_workload(
        self,
        node: str,
        index: int,
        owner: str,
        utilization_ratio: float,
        memory_mb: int = 0,
        partition_uuid: str | None = None,
    ) -> None:
        """Run (or update) tenant ``owner`` on a device or one of its partitions."""
        if not isinstance(owner, str) or not owner.strip():
            raise InvalidRequestError(f"owner must be a non-empty string, got {owner!r}")
        if not _is_number(utilization_ratio) or not 0.0 <= utilization_ratio <= 1.0:
            raise InvalidRequestError(
                f"utilization_ratio must be in [0, 1], got {utilization_ratio!r}"
            )
        if not _is_int(memory_mb) or memory_mb < 0:
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
            }

    def report_workload(
        self,
        node: str,
        index: int,
        owner: str,
        utilization_ratio: float,
        memory_mb: int = 0,
        partition_uuid: str | None = None,
    ) -> None:
        """Backend hook: on the twin, reporting a workload is running it (set_workload)."""
        self.set_workload(node, index, owner, utilization_ratio, memory_mb, partition_uuid)

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
            return self._fatal(state, now, owner, "injected")

    def _fatal(self, state: dict[str, Any], now: float, owner: str, source: str) -> list[str]:
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

    # -- faults ------------------------------------------------------------------------

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
            if not _is_number(lead_s) or not 1.0 <= lead_s <= 365 * 86_400:
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
                    result["failed_tenants"] = self._fatal(
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
