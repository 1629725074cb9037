"""NvmlBackend: the local host's NVIDIA GPUs through NVML (nvidia-ml-py, module ``pynvml``).

One backend sees the local host as one node (``socket.gethostname()``) whose devices are
NVML's indexes. It checks the node and index of every request, opens the GPU
(device.py) and hands it to the module that knows the subject: mig.py, telemetry.py,
control.py.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
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
    PartitionModeState,
    PartitionProfile,
    PartitionRequest,
    PowerLimits,
    TelemetrySample,
)
from gpuflow.hardware.nvml import control, mig, mig_profiles, reset, telemetry
from gpuflow.hardware.nvml.device import NvmlDevice
from gpuflow.hardware.nvml.session import NvmlSession, describe, import_pynvml, probe
from gpuflow.hardware.nvml.telemetry import EccCounter, XidEvents

log = logging.getLogger(__name__)


class NvmlBackend(Backend):
    """The local host's NVIDIA GPUs.

    ``nvml`` lets tests inject a stand-in for the pynvml module. ECC totals are NVML's
    ``volatile`` counters (since the driver last loaded) unless ``ecc_counter`` says
    ``aggregate`` (the device's lifetime, kept in its infoROM).
    """

    name = "nvml"

    def __init__(
        self,
        node_name: str | None = None,
        region: str | None = None,
        nvml: Any | None = None,
        ecc_counter: EccCounter = "volatile",
        run_command: reset.CommandRunner = reset.run_command,
    ) -> None:
        if ecc_counter not in ("volatile", "aggregate"):
            raise InvalidRequestError(
                f"ecc_counter must be volatile or aggregate, not {ecc_counter!r}"
            )
        self.node = node_name or socket.gethostname()
        self.region = region or os.environ.get("GPUFLOW_REGION", "local")
        self.ecc_counter: EccCounter = ecc_counter
        self._run_command = run_command  # nvidia-smi, for resets (tests pass a stand-in)
        self._session = NvmlSession(nvml if nvml is not None else import_pynvml(), self.node)
        self._open = False
        self._session.init()
        self._open = True
        self._info: dict[int, DeviceInfo] = {}
        # NVML has no getter for locked clocks: remember what this process set.
        self._locked: dict[int, tuple[int, int]] = {}
        # The optional fields each GPU answers for, probed on first use: what a GPU
        # supports does not change while the driver is loaded.
        self._fields: dict[int, frozenset[str]] = {}
        self._xids = XidEvents(self._session)
        try:
            # Register at start so XIDs between now and the first sample are kept.
            for i in range(self._count()):
                self._xids.register(self.node, i)
        except BaseException:
            self.close()  # do not leak the nvmlInit reference
            raise

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def available(cls, nvml: Any | None = None) -> tuple[bool, str]:
        """(True, what answered) when an NVIDIA driver answers NVML, else (False, why)."""
        return probe(nvml)

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        """Free the event sets and shut NVML down; safe to call twice."""
        if not self._open:
            return
        self._xids.close()
        self._open = False
        try:
            self._session.shutdown()
        except HardwareError as e:
            log.warning("nvmlShutdown failed: %s", e)

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def driver_version(self) -> str:
        return self._session.driver_version()

    # -- devices ---------------------------------------------------------------------
    def _count(self) -> int:
        if not self._open:
            raise HardwareError("the NVML backend is closed")
        return self._session.device_count()

    def _check(self, node: str, index: int) -> None:
        if node != self.node:
            raise InvalidRequestError(
                f"node {node!r} is not this host ({self.node!r}); the NVML backend sees local GPUs only"
            )
        count = self._count()
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise InvalidRequestError(f"no GPU index {index!r} on {self.node} (NVML sees {count})")

    def _open_device(self, index: int) -> NvmlDevice:
        return NvmlDevice(self._session.nvml, self.node, index)

    def _device(self, node: str, index: int) -> NvmlDevice:
        self._check(node, index)
        return self._open_device(index)

    def discover(self) -> list[NodeInfo]:
        devices = []
        for i in range(self._count()):
            try:
                info = describe(self._open_device(i))
            except DeviceLostError as e:
                log.warning("%s:%d: leaving a lost GPU out of discovery: %s", self.node, i, e)
                continue
            self._info[i] = info
            devices.append(info)
        return [NodeInfo(name=self.node, region=self.region, role="active", devices=tuple(devices))]

    # -- MIG -------------------------------------------------------------------------
    def nvml_partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        """Only what NVML itself lists (MIG on or off), no SKU-table fallback."""
        return mig_profiles.nvml_partition_profiles(self._device(node, index))

    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        return mig_profiles.partition_profiles(self._device(node, index))

    def partitions(self, node: str, index: int) -> list[Partition]:
        return [p for p, _ in mig.list_partitions(self._device(node, index))]

    def gpu_instance_ids(self, node: str, index: int) -> dict[str, int]:
        """NVML's GPU instance id of each partition (nvmlGpuInstanceGetInfo().id)."""
        return {p.uuid: gi.gi_id for p, gi in mig.list_partitions(self._device(node, index))}

    def mig_mode(self, node: str, index: int) -> tuple[bool, bool]:
        """(current, pending) MIG mode; they differ while a change waits for a GPU reset."""
        return mig.mig_mode(self._device(node, index))

    def partition_mode(self, node: str, index: int) -> bool:
        mode = mig_profiles.mig_state(self._device(node, index))
        return bool(mode and mode[0])

    def partition_mode_state(self, node: str, index: int) -> PartitionModeState:
        mode = mig_profiles.mig_state(self._device(node, index))
        current, pending = mode or (False, False)
        return PartitionModeState(current=current, pending=pending)

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        mig.set_mig_mode(self._device(node, index), enabled)

    def device_processes(self, node: str, index: int) -> list[str]:
        return reset.compute_processes(self._device(node, index))

    def reset_devices(self, devices: Sequence[tuple[str, int]]) -> None:
        """``nvidia-smi -r -i`` the GPUs (see reset.py): a pending MIG mode takes effect."""
        reset.reset_gpus([self._device(n, i) for n, i in devices], self._run_command)

    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        return mig.create_partitions(self._device(node, index), requests)

    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        """Destroy partitions; a partition's whole GPU instance goes, compute instances first."""
        mig.destroy_partitions(self._device(node, index), uuids)

    # -- telemetry -------------------------------------------------------------------
    def _probed_fields(self, index: int) -> frozenset[str]:
        fields = self._fields.get(index)
        if fields is None:
            fields = telemetry.probe_fields(
                self._open_device(index), self.ecc_counter, self._xids.registered(index)
            )
            self._fields[index] = fields
        return fields

    def telemetry_fields(self, node: str, index: int) -> frozenset[str]:
        """What NVML answers for on this GPU (probed once; see telemetry.probe_fields)."""
        self._check(node, index)
        return self._probed_fields(index)

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        self._check(node, index)
        xids = self._xids.drain(index)
        now = time.time()
        try:
            fields = self._probed_fields(index)
            return telemetry.read_sample(
                self._open_device(index), self.ecc_counter, xids, now, fields
            )
        except DeviceLostError:
            known = self._info.get(index)
            total_mb = known.memory_total_mb if known else 0
            seen = xids if self._xids.registered(index) else None
            return telemetry.lost_sample(self.node, index, total_mb, seen, now)

    def energy_mj(self, node: str, index: int) -> int:
        return self._device(node, index).energy_mj()

    # -- clocks and power ------------------------------------------------------------
    def clocks(self, node: str, index: int) -> ClockState:
        return control.clock_state(self._device(node, index), self._locked.get(index))

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        lo = control.require_int("min_mhz", min_mhz)
        hi = control.require_int("max_mhz", max_mhz)
        dev = self._device(node, index)
        state = control.clock_state(dev, self._locked.get(index))
        control.check_locked_clocks(dev.where, state, lo, hi)
        dev.set_locked_clocks_mhz(lo, hi)
        self._locked[index] = (lo, hi)

    def reset_locked_clocks(self, node: str, index: int) -> None:
        self._device(node, index).reset_locked_clocks()
        self._locked.pop(index, None)

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        mem = control.require_int("mem_clock_mhz", mem_clock_mhz)
        sm = control.require_int("sm_clock_mhz", sm_clock_mhz)
        control.set_applications_clocks(self._device(node, index), mem, sm)

    def power_limits(self, node: str, index: int) -> PowerLimits:
        return control.power_limits(self._device(node, index))

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        limit = control.require_int("limit_mw", limit_mw)
        control.set_power_limit(self._device(node, index), limit)
