"""The one small interface every device backend implements.

A backend answers for the nodes it can see: NVML and hy-smi see the local host, the
digital twin sees a whole fleet. Everything above hardware/ talks to devices through
this class only, so a new vendor is one new module, not a rewrite.

Units are in every name: memory_mb, clock_mhz, power_mw, energy_mj, temperature_c.
This module never imports Prefect (nor anything heavier than the standard library).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Vendor = Literal["NVIDIA", "Hygon"]
PartitionKind = Literal["mig", "vdcu"]
NodeRole = Literal["active", "spare"]


class HardwareError(RuntimeError):
    """A device or its tool refused or failed an operation."""


class InvalidRequestError(HardwareError, ValueError):
    """A request was rejected before any device was touched (bad id, size, profile...)."""


class UnsupportedError(HardwareError):
    """The device or backend cannot do this at all (MIG on a V100, clocks on a vDCU...)."""


class DeviceLostError(HardwareError):
    """The device no longer answers (fell off the bus, XID 79)."""


class DeviceBusyError(InvalidRequestError):
    """A change was refused before anything was touched: these devices are in use.
    ``busy`` maps "node:index" to who uses it (processes, tenants, leases)."""

    def __init__(self, busy: dict[str, list[str]]) -> None:
        self.busy = {k: list(v) for k, v in busy.items()}
        super().__init__(
            "refused before any device was changed: in use: "
            + "; ".join(f"{d} by {', '.join(who)}" for d, who in self.busy.items())
        )


@dataclass(frozen=True)
class DeviceInfo:
    node: str
    index: int
    vendor: Vendor
    sku: str
    uuid: str
    memory_total_mb: int
    pci_device_id: str | None = None  # mig-parted style, e.g. "0x20B010DE"
    partition_kinds: tuple[PartitionKind, ...] = ()  # what hard partitioning it offers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    region: str
    role: NodeRole
    devices: tuple[DeviceInfo, ...]


@dataclass(frozen=True)
class PartitionProfile:
    """One kind of hard partition a device offers.

    For MIG: a GPU-instance profile. ``profile_id`` is the id NVML returns in the
    profile info (what nvidia-smi shows, e.g. 19 for 1g.5gb) - not the NVML enum.
    ``placement_starts`` are the memory-slice offsets where an instance may start and
    ``placement_size`` the number of memory slices it covers.
    For vDCU: one profile named "vdcu" whose budgets (compute units, memory) are on
    the device; ``max_count`` is the per-device limit of virtual devices.
    """

    name: str
    kind: PartitionKind
    profile_id: int
    compute_slices: int
    memory_mb: int
    max_count: int
    placement_starts: tuple[int, ...] = ()
    placement_size: int = 0


@dataclass(frozen=True)
class PartitionRequest:
    """What to create: a MIG profile (optionally at a placement) or a vDCU of a size."""

    profile: str  # "1g.5gb", "3g.20gb", ... or "vdcu"
    placement_start: int | None = None  # MIG only
    compute_units: int | None = None  # vDCU only
    memory_mb: int | None = None  # vDCU only


@dataclass(frozen=True)
class Partition:
    node: str
    device_index: int
    uuid: str  # MIG-... for NVIDIA, the vDCU id for Hygon
    profile: str
    kind: PartitionKind
    memory_mb: int
    placement_start: int | None = None
    placement_size: int | None = None
    compute_units: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PartitionModeState:
    """Partitioning (MIG) mode as NVML reports it: ``current`` is in force now, ``pending``
    is what the next GPU reset brings (they differ while a change waits for the reset,
    e.g. when DCGM or a VM's hypervisor holds the GPU)."""

    current: bool
    pending: bool

    @property
    def reset_pending(self) -> bool:
        return self.current != self.pending


@dataclass(frozen=True)
class ClockState:
    sm_clock_mhz: int
    sm_clock_min_mhz: int
    sm_clock_max_mhz: int
    locked_min_mhz: int | None = None
    locked_max_mhz: int | None = None
    applications_sm_clock_mhz: int | None = None
    applications_mem_clock_mhz: int | None = None


@dataclass(frozen=True)
class PowerLimits:
    limit_mw: int
    min_limit_mw: int
    max_limit_mw: int
    default_limit_mw: int


# Clock-event (throttle) reason names, as NVML's nvmlClocksEventReason* constants.
CLOCK_EVENT_REASONS = (
    "GpuIdle",
    "ApplicationsClocksSetting",
    "SwPowerCap",
    "HwSlowdown",
    "SyncBoost",
    "SwThermalSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
)


# The optional telemetry fields: what a backend may be unable to read on a device (no
# ECC on a card with ECC off, no row remapping before Ampere, nothing of the sort from
# hy-smi). A backend declares which of them it reads per device (Backend.telemetry_fields)
# and leaves the others None in its samples: absent, not zero, so that a health model
# never learns "no errors" from a fleet that cannot report errors at all.
TELEMETRY_FIELDS: frozenset[str] = frozenset(
    {
        "ecc_corrected_total",
        "ecc_uncorrected_total",
        "retired_pages",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "clock_event_reasons",
        "xids",
    }
)


@dataclass(frozen=True)
class TelemetrySample:
    """One reading of a device. The fields up to ``power_limit_mw`` are always read; the
    rest (TELEMETRY_FIELDS) are None where this device's backend cannot read them. Their
    defaults describe a field that was read and showed nothing, so a backend that cannot
    read one must say None explicitly."""

    node: str
    index: int
    timestamp_s: float
    present: bool  # False once a device fell off the bus
    temperature_c: float
    power_mw: int
    energy_mj: int
    utilization_ratio: float  # share of time a kernel ran (NVML's "GPU utilization")
    memory_used_mb: int
    memory_total_mb: int
    sm_clock_mhz: int
    power_limit_mw: int
    ecc_corrected_total: int | None = 0
    ecc_uncorrected_total: int | None = 0
    retired_pages: int | None = 0
    remapped_rows_correctable: int | None = 0
    remapped_rows_uncorrectable: int | None = 0
    remapped_rows_pending: bool | None = False
    remapped_rows_failure: bool | None = False
    clock_event_reasons: tuple[str, ...] | None = ()
    xids: tuple[int, ...] | None = field(default=())  # XID events seen since the last sample

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def unreadable_fields(self) -> frozenset[str]:
        """The optional fields (TELEMETRY_FIELDS) this sample does not carry (None)."""
        return frozenset(f for f in TELEMETRY_FIELDS if getattr(self, f) is None)


class Backend(abc.ABC):
    """Discovery, telemetry, hard partitions and clock/power control of devices."""

    name: str = "abstract"

    # -- discovery -------------------------------------------------------------------
    @abc.abstractmethod
    def discover(self) -> list[NodeInfo]:
        """Every node this backend sees, with its devices."""

    def devices(self) -> list[DeviceInfo]:
        return [d for n in self.discover() for d in n.devices]

    def device(self, node: str, index: int) -> DeviceInfo:
        for d in self.devices():
            if d.node == node and d.index == index:
                return d
        raise InvalidRequestError(f"no device {node}:{index} on backend {self.name!r}")

    # -- telemetry -------------------------------------------------------------------
    @abc.abstractmethod
    def telemetry(self, node: str, index: int) -> TelemetrySample:
        """One telemetry sample; XIDs are those seen since the previous sample."""

    def energy_mj(self, node: str, index: int) -> int:
        """The device's energy counter in millijoules; it only grows."""
        return self.telemetry(node, index).energy_mj

    def telemetry_fields(self, node: str, index: int) -> frozenset[str]:
        """The optional fields (TELEMETRY_FIELDS) this backend reads on this device; the
        others are None in its samples. The default is a backend that reads them all."""
        self.device(node, index)  # an unknown device is an error here too
        return TELEMETRY_FIELDS

    # -- hard partitions -------------------------------------------------------------
    @abc.abstractmethod
    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        """The partition profiles this device offers ([] when it has none)."""

    @abc.abstractmethod
    def partitions(self, node: str, index: int) -> list[Partition]:
        """The partitions that exist on the device now."""

    def gpu_instance_ids(self, node: str, index: int) -> dict[str, int]:
        """The id the driver gave each partition's GPU instance, by partition UUID (what
        DCGM exporter labels GPU_I_ID): NVML's GPU instance id, hy-smi's instance or
        virtual-device number. {} where a backend has no such numbers of its own (the
        twin); gpuflow.hardware.dcgm_mapping derives stable ones from placements then."""
        self.device(node, index)  # an unknown device is an error here too
        return {}

    @abc.abstractmethod
    def partition_mode(self, node: str, index: int) -> bool:
        """Whether hard partitioning (MIG / virtual devices) is enabled."""

    @abc.abstractmethod
    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        """Ask for hard partitioning (MIG mode) on or off. The change may be left pending
        until a GPU reset (see ``partition_mode_state`` and ``reset_devices``)."""

    def partition_mode_state(self, node: str, index: int) -> PartitionModeState:
        """(current, pending) partitioning mode; backends without pending modes answer
        the current mode twice."""
        mode = self.partition_mode(node, index)
        return PartitionModeState(current=mode, pending=mode)

    def reset_devices(self, devices: Sequence[tuple[str, int]]) -> None:
        """Reset devices (``nvidia-smi -r``) so pending mode changes take effect; refused,
        naming who holds them, while anything still uses one of them."""
        raise UnsupportedError(f"backend {self.name!r} cannot reset devices")

    def device_processes(self, node: str, index: int) -> list[str]:
        """What computes on the device or its partitions now (NVML's compute processes,
        the twin's tenants): changing its layout would break them. [] when nothing does.
        Clients that only keep it open (DCGM) are not listed: they block a reset only."""
        return []

    @abc.abstractmethod
    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        """Create partitions on one device, in order. Validates all before creating any."""

    @abc.abstractmethod
    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        """Destroy the given partitions, or all of them when ``uuids`` is None."""

    # -- clocks and power ------------------------------------------------------------
    @abc.abstractmethod
    def clocks(self, node: str, index: int) -> ClockState: ...

    @abc.abstractmethod
    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None: ...

    @abc.abstractmethod
    def reset_locked_clocks(self, node: str, index: int) -> None: ...

    @abc.abstractmethod
    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None: ...

    @abc.abstractmethod
    def power_limits(self, node: str, index: int) -> PowerLimits: ...

    @abc.abstractmethod
    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None: ...

    # -- workloads -------------------------------------------------------------------
    def report_workload(  # noqa: B027 - optional hook
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
        """Tell the backend what a job runs on a device and how busy it keeps it.

        Real devices measure this themselves, so the default does nothing; the digital
        twin derives utilization, power and heat from it. Callers report unconditionally,
        so the same training loop runs unchanged on the twin and on real hardware.
        ``memory_bound_ratio`` (share of the job's time at max clock that does not scale
        with the SM clock, in [0, 1]) and ``activity`` (its switching power at full load
        relative to the device's maximum, in (0, 1]) are the job's character; None leaves
        it to the twin's default. The twin rejects values out of range
        (InvalidRequestError) before anything changes.
        """

    def device_delay_s(self, node: str, index: int, owner: str, busy_s: float) -> float:
        """Extra seconds the device needs beyond ``busy_s`` of host-timed work at its
        current clock.

        Real devices return 0: their step time is already real. The twin returns
        busy_s * (T(f) / T(f_max) - 1) for the owner's workload (report_workload's
        character) at the clock it runs now - power limit, locked clocks and thermal state
        all apply. A training loop sleeps that long inside the step, so the same loop shows
        real slowdowns on the twin.
        """
        return 0.0

    def device_time_ratio(self, node: str, index: int, owner: str) -> float | None:
        """T(f) / T(f_max): how much longer the owner's work takes at the device's current
        clock than at its highest, where the backend models it (the twin); None where the
        step's time is already real (real devices), so nothing paces it."""
        return None

    def end_workload(self, owner: str) -> None:  # noqa: B027 - optional hook
        """The job ``owner`` no longer runs (see report_workload)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles (NVML shutdown); the default has nothing to release."""
