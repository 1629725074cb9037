"""HygonBackend: the Hygon DCUs of this host, driven through the ``hy-smi`` command line.

Commands and where their syntax comes from (Hygon publishes no hy-smi manual; see
parse.py for the output shapes and their public samples):

- vDCU (HAMi's vDCU guide, Hygon's k8s device-plugin README): ``hy-smi virtual
  -show-device-info``, ``hy-smi virtual -create-vdevices N -d DEV -vdevice-compute-units
  a,b,.. -vdevice-memory-size x,y,..`` (MiB), ``hy-smi virtual -show-vdevice-info``,
  ``hy-smi virtual -d DEV -destroy-vdevice`` (destroys every vDCU of that DCU; there is no
  per-vDCU destroy). At most 4 vDCUs per physical DCU. See vdcu.py.
- Inventory and telemetry: rocm-smi-style ``--show*`` flags with ``--json``, as open-source
  collectors run them on real DCUs. See inventory.py and telemetry.py.
- MIG (newer drivers): ``hy-smi mig -cgi <gi profile id> -C -i DEV``; per GPUStack's Hygon
  runbook ``hy-smi mig`` mirrors ``nvidia-smi mig``, so ``-lgip``, ``-lgipp``, ``-lgi``,
  ``-dci``/``-dgi`` (``-gi ID`` for one instance) are used in that form. The node-wide MIG
  mode switch is left to the operator. See mig.py.
- Clocks and power cap: rocm-smi's flags, used only when ``hy-smi -h`` lists them. See
  control.py.

This module checks node and index (types first) and dispatches; every command is an argv
list with a timeout (command.py), and every id and size is validated before any command
that changes anything runs.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable, Sequence

from gpuflow.hardware.backend import (
    Backend,
    ClockState,
    DeviceInfo,
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
from gpuflow.hardware.hygon import control, mig, telemetry, vdcu
from gpuflow.hardware.hygon import parse as hp
from gpuflow.hardware.hygon.command import HySmi, is_int
from gpuflow.hardware.hygon.inventory import Dcu, Inventory, load_inventory


class HygonBackend(Backend):
    """Hygon DCUs of this host, driven through ``hy-smi``."""

    name = "hygon"

    def __init__(
        self,
        executable: str = "hy-smi",
        node_name: str | None = None,
        region: str | None = None,
        timeout_s: float = 30.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hy = HySmi(executable, timeout_s)
        self.node_name = node_name or socket.gethostname()
        self.region = region or "local"
        self._clock = clock
        self._inventory: Inventory | None = None
        self._energy: dict[int, telemetry.Energy] = {}
        self._locked: dict[int, tuple[int, int]] = {}

    @property
    def executable(self) -> str:
        return self._hy.executable

    @property
    def timeout_s(self) -> float:
        return self._hy.timeout_s

    @classmethod
    def available(cls, executable: str = "hy-smi", timeout_s: float = 10.0) -> tuple[bool, str]:
        """(True, why) when ``executable`` is found and answers with at least one DCU."""
        path = shutil.which(executable)
        if path is None:
            return False, f"{executable!r} not found on PATH"
        try:
            hy = HySmi(path, timeout_s)
            proc = hy.run(["--showproductname", "--json"])
            cards = hp.parse_card_json(proc.stdout, f"{path} --showproductname --json")
        except HardwareError as exc:
            return False, f"{path} did not answer: {exc}"
        return True, f"{path} sees {len(cards)} DCU(s)"

    # -- inventory -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget the cached inventory (devices, budgets, MIG profiles) and help text."""
        self._inventory = None
        self._hy.forget_help()

    def _load_inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self._hy, self.node_name)
        return self._inventory

    def notes(self) -> list[str]:
        """Why vDCU or MIG is missing on this host, as found during discovery."""
        return list(self._load_inventory().notes)

    def discover(self) -> list[NodeInfo]:
        inv = self._load_inventory()
        devices = tuple(
            DeviceInfo(
                node=self.node_name,
                index=d.index,
                vendor="Hygon",
                sku=d.sku,
                uuid=d.uuid,
                memory_total_mb=d.memory_total_mb,
                partition_kinds=d.kinds,  # type: ignore[arg-type]
            )
            for d in inv.devices.values()
        )
        return [NodeInfo(name=self.node_name, region=self.region, role="active", devices=devices)]

    def _dcu(self, node: str, index: int) -> Dcu:
        """Validate node and index (types first, so bad input never reaches a command)."""
        if not isinstance(node, str) or node != self.node_name:
            raise InvalidRequestError(
                f"node {node!r} is not this host ({self.node_name!r}); hy-smi sees the local host only"
            )
        if not is_int(index):
            raise InvalidRequestError(f"device index must be an int, got {index!r}")
        if index < 0:
            raise InvalidRequestError(f"device index must be >= 0, got {index}")
        devices = self._load_inventory().devices
        if index not in devices:
            raise InvalidRequestError(
                f"no DCU {index} on {self.node_name} (DCUs: {sorted(devices)})"
            )
        return devices[index]

    def _label(self, dcu: Dcu) -> str:
        return f"{self.node_name}:{dcu.index} ({dcu.sku})"

    # -- telemetry -------------------------------------------------------------------------
    def telemetry(self, node: str, index: int) -> TelemetrySample:
        dcu = self._dcu(node, index)
        return telemetry.sample(self._hy, self.node_name, dcu, self._energy, self._clock)

    def telemetry_fields(self, node: str, index: int) -> frozenset[str]:
        """hy-smi gives none of the optional fields (hardware.telemetry_fields.HY_SMI)."""
        self._dcu(node, index)
        return telemetry.HY_SMI

    # -- partitions ------------------------------------------------------------------------
    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        dcu = self._dcu(node, index)
        out: list[PartitionProfile] = []
        if dcu.compute_units > 0:
            out.append(vdcu.vdcu_profile(dcu))
        out.extend(dcu.mig_profiles)
        return out

    def _partitions(self, dcu: Dcu) -> list[Partition]:
        out: list[Partition] = []
        if "vdcu" in dcu.kinds:
            out.extend(vdcu.list_vdcus(self._hy, self.node_name, dcu))
        if "mig" in dcu.kinds:
            out.extend(mig.partitions(self._hy, self.node_name, dcu))
        return out

    def partitions(self, node: str, index: int) -> list[Partition]:
        return self._partitions(self._dcu(node, index))

    def gpu_instance_ids(self, node: str, index: int) -> dict[str, int]:
        """hy-smi's numbers: a MIG instance's GPU instance id (``hy-smi mig -lgi``), a
        vDCU's virtual device number (``vdcu-<N>``, host-wide)."""
        out: dict[str, int] = {}
        for p in self.partitions(node, index):
            if p.kind == "mig":
                out[p.uuid] = mig.mig_gi(p.uuid)
            elif p.uuid.startswith(vdcu.VDCU_PREFIX):
                out[p.uuid] = int(p.uuid.removeprefix(vdcu.VDCU_PREFIX))
        return out

    def partition_mode(self, node: str, index: int) -> bool:
        """True exactly while the DCU has vDCUs or MIG instances: hy-smi reports no per-DCU
        mode (vDCUs are carved with none; MIG mode is node-wide). The twin answers the same,
        and plans refuse "mig-enabled: true" with nothing to carve on a DCU
        (hardware/partition/select.py, rule no-partition-mode)."""
        return bool(self.partitions(node, index))

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        """vDCUs need no mode; Hygon's MIG mode is node-wide and left to the operator."""
        dcu = self._dcu(node, index)
        if not isinstance(enabled, bool):
            raise InvalidRequestError(f"enabled must be a bool, got {enabled!r}")
        if enabled:
            if not dcu.kinds:
                raise UnsupportedError(
                    f"DCU {index} offers neither vDCUs nor MIG through hy-smi "
                    f"({'; '.join(self.notes()) or 'no reason given'})"
                )
            return
        existing = self._partitions(dcu)
        if existing:
            raise InvalidRequestError(
                f"DCU {index} still has partitions {[p.uuid for p in existing]}; destroy them first"
            )

    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        dcu = self._dcu(node, index)
        if isinstance(requests, PartitionRequest | str) or not isinstance(requests, Sequence):
            raise InvalidRequestError(
                f"requests must be a list of PartitionRequest, got {requests!r}"
            )
        reqs = list(requests)
        if not reqs:
            raise InvalidRequestError("no partition requested")
        for r in reqs:
            if not isinstance(r, PartitionRequest):
                raise InvalidRequestError(f"not a PartitionRequest: {r!r}")
        vdcus = [r for r in reqs if r.profile == "vdcu"]
        if vdcus and len(vdcus) != len(reqs):
            raise InvalidRequestError("vDCUs and MIG instances cannot be created in one request")
        label = self._label(dcu)
        if vdcus:
            vdcu.check_requests(label, dcu, reqs, self.notes())
            # Only now read the device: everything static has passed.
            existing = self._partitions(dcu)
            return vdcu.create(self._hy, self.node_name, label, dcu, reqs, existing)
        mig.check_requests(label, dcu, reqs, self.notes())
        if "vdcu" in dcu.kinds and vdcu.list_vdcus(self._hy, self.node_name, dcu):
            raise InvalidRequestError(
                f"{label} has vDCUs; destroy them before creating MIG instances"
            )
        return mig.create(self._hy, self.node_name, label, dcu, reqs)

    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        dcu = self._dcu(node, index)
        if uuids is not None:
            if isinstance(uuids, str) or not isinstance(uuids, Sequence):
                raise InvalidRequestError(
                    f"uuids must be a list of partition ids or None, got {uuids!r}"
                )
            if not all(isinstance(u, str) for u in uuids):
                raise InvalidRequestError(f"partition ids must be strings, got {list(uuids)!r}")
        existing = self._partitions(dcu)
        have = {p.uuid: p for p in existing}
        wanted = set(have) if uuids is None else set(uuids)
        unknown = sorted(wanted - set(have))
        if unknown:
            raise InvalidRequestError(
                f"{self._label(dcu)} has no partitions {unknown} (it has {sorted(have)})"
            )
        vdcus = {u for u in have if have[u].kind == "vdcu"}
        wanted_v = wanted & vdcus
        if wanted_v and wanted_v != vdcus:
            raise UnsupportedError(
                f"hy-smi destroys all vDCUs of a DCU at once (`virtual -d {dcu.index} -destroy-vdevice`); "
                f"asked for {sorted(wanted_v)} of {sorted(vdcus)}. Destroy all and recreate the rest"
            )
        wanted_m = sorted(mig.mig_gi(u) for u in wanted if have[u].kind == "mig")
        if wanted_v:
            vdcu.destroy_all(self._hy, dcu)
        if wanted_m:
            mig.destroy(self._hy, dcu, wanted_m, every=len(wanted_m) == len(existing) - len(vdcus))
        left = sorted(wanted & {p.uuid for p in self._partitions(dcu)})
        if left:
            raise HardwareError(
                f"hy-smi reported success but {self._label(dcu)} still lists {left}"
            )

    # -- clocks and power --------------------------------------------------------------------
    def clocks(self, node: str, index: int) -> ClockState:
        dcu = self._dcu(node, index)
        return control.clock_state(self._hy, dcu, self._locked.get(index))

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        """Allow only the sclk DPM levels in [min_mhz, max_mhz] (rocm-smi ``--setsclk``)."""
        dcu = self._dcu(node, index)
        self._locked[index] = control.lock_clocks(self._hy, dcu, min_mhz, max_mhz)

    def reset_locked_clocks(self, node: str, index: int) -> None:
        control.reset_clocks(self._hy, self._dcu(node, index))
        self._locked.pop(index, None)

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        self._dcu(node, index)
        raise UnsupportedError(
            "applications clocks are an NVIDIA concept; hy-smi has no equivalent "
            "(use set_locked_clocks, which selects sclk DPM levels)"
        )

    def power_limits(self, node: str, index: int) -> PowerLimits:
        """The cap from ``--showmaxpower``; the range from the SKU table when the model is known.

        hy-smi shows no cap range that any public sample has; for an unknown model the range
        collapses to the current cap, so set_power_limit_mw accepts only that value.
        """
        return control.power_limits(self._hy, self._dcu(node, index))

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        control.set_power_limit(self._hy, self._dcu(node, index), limit_mw)
