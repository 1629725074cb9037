"""Hygon DCU backend over the ``hy-smi`` command line.

Commands and where their syntax comes from (Hygon publishes no hy-smi manual; see
hardware/hygon_parse.py for the output shapes and their public samples):

- vDCU (HAMi's vDCU guide, Hygon's k8s device-plugin README): ``hy-smi virtual
  -show-device-info``, ``hy-smi virtual -create-vdevices N -d DEV -vdevice-compute-units
  a,b,.. -vdevice-memory-size x,y,..`` (MiB), ``hy-smi virtual -show-vdevice-info``,
  ``hy-smi virtual -d DEV -destroy-vdevice`` (destroys every vDCU of that DCU; there is no
  per-vDCU destroy). At most 4 vDCUs per physical DCU.
- Inventory and telemetry: rocm-smi-style ``--show*`` flags with ``--json``, as open-source
  collectors run them on real DCUs.
- MIG (newer drivers): ``hy-smi mig -cgi <gi profile id> -C -i DEV``; per GPUStack's Hygon
  runbook ``hy-smi mig`` mirrors ``nvidia-smi mig``, so ``-lgip``, ``-lgipp``, ``-lgi``,
  ``-dci``/``-dgi`` (``-gi ID`` for one instance) are used in that form. The MIG *mode*
  switch (``hy-smi -mig 0|1``) is node-wide and refused while any process holds /dev/kfd,
  and with it on and nothing carved every card is unusable, so it is an operator
  provisioning step: this backend never flips it.
- Clocks and power cap: rocm-smi's ``--showclkfrq``, ``--setsclk LEVEL..``,
  ``--resetclocks``, ``--showmaxpower``, ``--setpoweroverdrive WATTS``. Only
  ``--showmaxpower`` is seen in public hy-smi use, so the others are used only when
  ``hy-smi -h`` lists them; otherwise the call raises UnsupportedError naming the flag.

Creation of vDCUs: gpuflow creates a DCU's vDCUs as one set, in one ``-create-vdevices``
call, and refuses when the DCU already has some. Yunion's cloudpods calls
``-create-vdevices 1`` repeatedly on one DCU, which suggests some drivers append, but no
vendor document says so; refusing is the safe reading.

Not reported by hy-smi (left at the TelemetrySample defaults): ECC counts, retired pages,
remapped rows, clock-event reasons and XIDs. hy-smi has no energy counter that a public
sample shows, so ``energy_mj`` is an estimate: the trapezoidal integral of the power
readings this backend instance has taken; it starts at 0 and only grows.

Every command is an argv list (never a shell string) with a timeout; every id and size is
validated before any command that changes anything runs.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware import hygon_parse as hp
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
from gpuflow.hardware.placement import Occupied, fit_mig, fit_vdcu
from gpuflow.hardware.skus import SKUS, SkuSpec

log = logging.getLogger(__name__)

VDCU_MAX_COUNT = 4
VDCU_PREFIX = "vdcu-"

# Field names, newest first where drivers differ (see hygon_parse's docstring).
F_SERIES = ("Card Series", "Card SKU", "Card Model")
F_UNIQUE_ID = ("Unique ID", "Serial Number")
F_MEM_TOTAL_MIB = ("vram Total Memory (MiB)", "VRAM Total Memory (MiB)")
F_MEM_TOTAL_B = ("VRAM Total Memory (B)", "vram Total Memory (B)")
F_MEM_USED_MIB = ("vram Total Used Memory (MiB)", "VRAM Total Used Memory (MiB)")
F_MEM_USED_B = ("VRAM Total Used Memory (B)", "vram Total Used Memory (B)")
F_TEMP = (
    "Temperature (Sensor junction) (C)",
    "Temperature (Sensor edge) (C)",
    "Temperature (Sensor core) (C)",
)
F_POWER = (
    "Average Graphics Package Power (W)",
    "Current Socket Graphics Package Power (W)",
    "Average Package Power (W)",
)
F_USE = ("HCU use (%)", "DCU use (%)", "GPU use (%)")
F_POWER_CAP = ("Max Graphics Package Power (W)",)
F_SCLK = ("sclk clock speed:", "sclk clock speed")


def sku_name_for(series: str) -> str:
    """Map hy-smi's "Card Series" onto hardware/skus.py names; unknown ones stay raw."""
    s = series.upper()
    if "K100" in s:
        return "Hygon DCU K100"
    if "Z100" in s:
        return "Hygon DCU Z100"
    return series


@dataclass(frozen=True)
class _Dcu:
    index: int
    series: str
    sku: str
    uuid: str
    memory_total_mb: int
    compute_units: int  # vDCU compute budget; 0 when `hy-smi virtual` does not list it
    vdcu_memory_mb: int  # vDCU memory budget ("Global memory")
    mig_profiles: tuple[PartitionProfile, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        out: list[str] = []
        if self.compute_units > 0:
            out.append("vdcu")
        if self.mig_profiles:
            out.append("mig")
        return tuple(out)


@dataclass
class _Energy:
    last_t: float | None = None
    last_power_mw: int = 0
    energy_mj: float = 0.0


@dataclass
class _Inventory:
    devices: dict[int, _Dcu]
    notes: list[str] = field(default_factory=list)  # why vDCU/MIG is absent, for humans


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
        if not isinstance(executable, str) or not executable.strip():
            raise InvalidRequestError(
                f"executable must be a non-empty path or name, got {executable!r}"
            )
        if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s <= 0:
            raise InvalidRequestError(f"timeout_s must be a positive number, got {timeout_s!r}")
        self.executable = executable
        self.node_name = node_name or socket.gethostname()
        self.region = region or "local"
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._inventory: _Inventory | None = None
        self._help: frozenset[str] | None = None
        self._energy: dict[int, _Energy] = {}
        self._locked: dict[int, tuple[int, int]] = {}

    # -- running hy-smi ------------------------------------------------------------------
    @classmethod
    def available(cls, executable: str = "hy-smi", timeout_s: float = 10.0) -> tuple[bool, str]:
        """(True, why) when ``executable`` is found and answers with at least one DCU."""
        path = shutil.which(executable)
        if path is None:
            return False, f"{executable!r} not found on PATH"
        try:
            backend = cls(executable=path, timeout_s=timeout_s)
            proc = backend._run(["--showproductname", "--json"])
            cards = hp.parse_card_json(proc.stdout, f"{path} --showproductname --json")
        except HardwareError as exc:
            return False, f"{path} did not answer: {exc}"
        return True, f"{path} sees {len(cards)} DCU(s)"

    def _resolve(self) -> str:
        path = shutil.which(self.executable)
        if path is None:
            raise HardwareError(
                f"hy-smi executable {self.executable!r} not found (is the DCU driver installed?)"
            )
        return path

    def _run(self, args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run hy-smi with ``args`` (an argv list, no shell); non-zero exit raises if check."""
        if not all(isinstance(a, str) for a in args):
            raise InvalidRequestError(f"hy-smi arguments must be strings, got {list(args)!r}")
        argv = [self._resolve(), *args]
        shown = " ".join(argv)
        try:
            # argv list, fixed executable, validated arguments: no shell is involved.
            proc = subprocess.run(  # noqa: S603
                argv,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,  # a confirmation prompt fails instead of hanging
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HardwareError(
                f"`{shown}` timed out after {self.timeout_s:g} s; output so far {hp.quote(exc.stdout)}"
            ) from None
        except OSError as exc:
            raise HardwareError(f"`{shown}` could not start: {exc}") from None
        if check and proc.returncode != 0:
            raise _status_error(proc)
        return proc

    def _help_flags(self) -> frozenset[str]:
        if self._help is None:
            proc = self._run(["-h"], check=False)
            self._help = (
                hp.parse_help_flags(proc.stdout + "\n" + proc.stderr)
                if proc.returncode == 0
                else frozenset()
            )
        return self._help

    def _require_flags(self, what: str, *flags: str) -> None:
        have = self._help_flags()
        missing = [f for f in flags if f not in have]
        if missing:
            raise UnsupportedError(
                f"{what} needs hy-smi option(s) {', '.join(missing)}, which `{self.executable} -h` "
                "does not list on this driver"
            )

    # -- inventory -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget the cached inventory (devices, budgets, MIG profiles) and help text."""
        self._inventory = None
        self._help = None

    def _load_inventory(self) -> _Inventory:
        if self._inventory is not None:
            return self._inventory
        args = ["--showproductname", "--showuniqueid", "--showmeminfo", "vram", "--json"]
        what = f"hy-smi {' '.join(args)}"
        proc = self._run(args)
        cards = hp.parse_card_json(proc.stdout, what)
        notes: list[str] = []
        virtual = self._virtual_devices(notes)
        mig = self._mig_profiles(notes)
        devices: dict[int, _Dcu] = {}
        for index, card in sorted(cards.items()):
            series = hp.card_text(card, F_SERIES)
            if series is None:
                raise hp.unexpected(
                    what, proc.stdout, f"card{index} has no product name ({F_SERIES[0]!r})"
                )
            memory = hp.card_memory_mb(card, F_MEM_TOTAL_MIB, F_MEM_TOTAL_B, what, proc.stdout)
            if memory is None:
                raise hp.unexpected(what, proc.stdout, f"card{index} has no total memory")
            uid = hp.card_text(card, F_UNIQUE_ID) or f"hygon-{self.node_name}-dcu{index}"
            v = virtual.get(index)
            devices[index] = _Dcu(
                index=index,
                series=series,
                sku=sku_name_for(series),
                uuid=uid,
                memory_total_mb=memory,
                compute_units=v.compute_units if v else 0,
                vdcu_memory_mb=v.memory_mb if v else 0,
                mig_profiles=tuple(mig.get(index, ())),
            )
        self._inventory = _Inventory(devices=devices, notes=notes)
        return self._inventory

    def _virtual_devices(self, notes: list[str]) -> dict[int, hp.VirtualInfo]:
        proc = self._run(["virtual", "-show-device-info"], check=False)
        if proc.returncode != 0:
            # Drivers before 6.2.26 ship `hy-virtual` instead; no vDCU through hy-smi then.
            notes.append(
                f"`hy-smi virtual` unavailable (status {proc.returncode}): {hp.quote(proc.stderr or proc.stdout, 200)}"
            )
            return {}
        infos = hp.parse_virtual_info(
            proc.stdout, virtual=False, what="hy-smi virtual -show-device-info"
        )
        return {i.actual_device: i for i in infos}

    def _mig_profiles(self, notes: list[str]) -> dict[int, list[PartitionProfile]]:
        proc = self._run(["mig", "-lgip"], check=False)
        if proc.returncode != 0 and not hp.mig_none_found(proc.stdout):
            notes.append(
                f"`hy-smi mig` unavailable (status {proc.returncode}): {hp.quote(proc.stderr or proc.stdout, 200)}"
            )
            return {}
        rows = hp.parse_mig_profiles(proc.stdout, "hy-smi mig -lgip")
        if not rows:
            notes.append("`hy-smi mig -lgip` lists no profiles (MIG mode off or no driver support)")
            return {}
        placements = hp.parse_mig_placements(
            self._run(["mig", "-lgipp"]).stdout, "hy-smi mig -lgipp"
        )
        out: dict[int, list[PartitionProfile]] = {}
        for r in rows:
            if (r.device, r.profile_id) not in placements:
                raise HardwareError(
                    f"hy-smi mig -lgipp gives no placements for profile {r.name} (id {r.profile_id}) "
                    f"on DCU {r.device}"
                )
            starts, size = placements[(r.device, r.profile_id)]
            out.setdefault(r.device, []).append(
                PartitionProfile(
                    name=r.name,
                    kind="mig",
                    profile_id=r.profile_id,
                    compute_slices=size,  # a Hygon slice carries compute and memory together
                    memory_mb=r.memory_mb,
                    max_count=r.total,
                    placement_starts=starts,
                    placement_size=size,
                )
            )
        return out

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

    def _dcu(self, node: str, index: int) -> _Dcu:
        """Validate node and index (types first, so bad input never reaches a command)."""
        if not isinstance(node, str) or node != self.node_name:
            raise InvalidRequestError(
                f"node {node!r} is not this host ({self.node_name!r}); hy-smi sees the local host only"
            )
        if not _is_int(index):
            raise InvalidRequestError(f"device index must be an int, got {index!r}")
        if index < 0:
            raise InvalidRequestError(f"device index must be >= 0, got {index}")
        devices = self._load_inventory().devices
        if index not in devices:
            raise InvalidRequestError(
                f"no DCU {index} on {self.node_name} (DCUs: {sorted(devices)})"
            )
        return devices[index]

    def _sku_spec(self, dcu: _Dcu) -> SkuSpec | None:
        return SKUS.get(dcu.sku)

    # -- telemetry -------------------------------------------------------------------------
    def telemetry(self, node: str, index: int) -> TelemetrySample:
        dcu = self._dcu(node, index)
        args = [
            "--showtemp",
            "--showpower",
            "--showuse",
            "--showmeminfo",
            "vram",
            "--showmaxpower",
            "--showclocks",
            "--json",
        ]
        what = f"hy-smi {' '.join(args)}"
        proc = self._run(args)
        cards = hp.parse_card_json(proc.stdout, what)
        now_wall = time.time()
        now = self._clock()
        if index not in cards:
            # hy-smi still answers for the others: this one fell off the bus.
            e = self._energy.get(index, _Energy())
            return TelemetrySample(
                node=self.node_name,
                index=index,
                timestamp_s=now_wall,
                present=False,
                temperature_c=0.0,
                power_mw=0,
                energy_mj=int(e.energy_mj),
                utilization_ratio=0.0,
                memory_used_mb=0,
                memory_total_mb=dcu.memory_total_mb,
                sm_clock_mhz=0,
                power_limit_mw=0,
            )
        card, raw = cards[index], proc.stdout

        def need(keys: tuple[str, ...]) -> float:
            v = hp.card_number(card, keys, what, raw)
            if v is None:
                raise hp.unexpected(what, raw, f"card{index} lacks {keys[0]!r}")
            return v

        temperature_c = need(F_TEMP)
        power_mw = int(round(need(F_POWER) * 1000))
        use_pct = need(F_USE)
        used = hp.card_memory_mb(card, F_MEM_USED_MIB, F_MEM_USED_B, what, raw)
        if used is None:
            raise hp.unexpected(what, raw, f"card{index} lacks {F_MEM_USED_MIB[0]!r}")
        total = (
            hp.card_memory_mb(card, F_MEM_TOTAL_MIB, F_MEM_TOTAL_B, what, raw)
            or dcu.memory_total_mb
        )
        cap_w = hp.card_number(card, F_POWER_CAP, what, raw)
        sclk = hp.card_text(card, F_SCLK)
        if not 0.0 <= use_pct <= 100.0:
            raise hp.unexpected(what, raw, f"card{index} utilisation {use_pct}% is outside 0..100")
        e = self._energy.setdefault(index, _Energy())
        if e.last_t is not None and now > e.last_t:
            # Trapezoid over the interval, mW * s = mJ.
            e.energy_mj += (e.last_power_mw + power_mw) / 2.0 * (now - e.last_t)
        e.last_t, e.last_power_mw = now, power_mw
        return TelemetrySample(
            node=self.node_name,
            index=index,
            timestamp_s=now_wall,
            present=True,
            temperature_c=temperature_c,
            power_mw=power_mw,
            energy_mj=int(e.energy_mj),
            utilization_ratio=use_pct / 100.0,
            memory_used_mb=used,
            memory_total_mb=total,
            sm_clock_mhz=hp.clock_mhz(sclk, what, raw) if sclk else 0,
            power_limit_mw=int(round(cap_w * 1000)) if cap_w is not None else 0,
        )

    # -- partitions ------------------------------------------------------------------------
    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        dcu = self._dcu(node, index)
        out: list[PartitionProfile] = []
        if dcu.compute_units > 0:
            out.append(
                PartitionProfile(
                    name="vdcu",
                    kind="vdcu",
                    profile_id=0,
                    compute_slices=dcu.compute_units,
                    memory_mb=dcu.vdcu_memory_mb,
                    max_count=VDCU_MAX_COUNT,
                )
            )
        out.extend(dcu.mig_profiles)
        return out

    def _vdcus(self, dcu: _Dcu) -> list[Partition]:
        what = "hy-smi virtual -show-vdevice-info"
        proc = self._run(["virtual", "-show-vdevice-info"])
        return [
            Partition(
                node=self.node_name,
                device_index=v.actual_device,
                uuid=f"{VDCU_PREFIX}{v.index}",
                profile="vdcu",
                kind="vdcu",
                memory_mb=v.memory_mb,
                compute_units=v.compute_units,
            )
            for v in hp.parse_virtual_info(proc.stdout, virtual=True, what=what)
            if v.actual_device == dcu.index
        ]

    def _mig_instances(self, dcu: _Dcu) -> list[hp.MigInstanceRow]:
        # nvidia-smi exits non-zero when there is no instance; the text says so.
        proc = self._run(["mig", "-lgi", "-i", str(dcu.index)], check=False)
        if proc.returncode != 0 and not hp.mig_none_found(proc.stdout):
            raise _status_error(proc)
        rows = hp.parse_mig_instances(proc.stdout, f"hy-smi mig -lgi -i {dcu.index}")
        return [r for r in rows if r.device == dcu.index]

    def _mig_partitions(self, dcu: _Dcu) -> list[Partition]:
        sizes = {p.profile_id: p.memory_mb for p in dcu.mig_profiles}
        return [
            Partition(
                node=self.node_name,
                device_index=dcu.index,
                uuid=_mig_uuid(dcu.index, r.instance_id),
                profile=r.name,
                kind="mig",
                memory_mb=sizes.get(r.profile_id, 0),
                placement_start=r.start,
                placement_size=r.size,
            )
            for r in self._mig_instances(dcu)
        ]

    def _partitions(self, dcu: _Dcu) -> list[Partition]:
        out: list[Partition] = []
        if "vdcu" in dcu.kinds:
            out.extend(self._vdcus(dcu))
        if "mig" in dcu.kinds:
            out.extend(self._mig_partitions(dcu))
        return out

    def partitions(self, node: str, index: int) -> list[Partition]:
        return self._partitions(self._dcu(node, index))

    def partition_mode(self, node: str, index: int) -> bool:
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
        vdcu = [r for r in reqs if r.profile == "vdcu"]
        if vdcu and len(vdcu) != len(reqs):
            raise InvalidRequestError("vDCUs and MIG instances cannot be created in one request")
        if vdcu:
            return self._create_vdcus(dcu, reqs)
        return self._create_mig(dcu, reqs)

    def _label(self, dcu: _Dcu) -> str:
        return f"{self.node_name}:{dcu.index} ({dcu.sku})"

    def _create_vdcus(self, dcu: _Dcu, reqs: list[PartitionRequest]) -> list[Partition]:
        if "vdcu" not in dcu.kinds:
            raise UnsupportedError(
                f"{self._label(dcu)} offers no vDCUs through `hy-smi virtual` ({'; '.join(self.notes())})"
            )
        for i, r in enumerate(reqs):
            for name, value in (("compute_units", r.compute_units), ("memory_mb", r.memory_mb)):
                if value is not None and not _is_int(value):
                    raise InvalidRequestError(
                        f"vDCU request {i}: {name} must be an int, got {value!r}"
                    )
            if r.placement_start is not None:
                raise InvalidRequestError(f"vDCU request {i}: placement_start applies to MIG only")
        fit_vdcu(self._label(dcu), VDCU_MAX_COUNT, dcu.compute_units, dcu.vdcu_memory_mb, reqs)
        # Only now read the device: everything static has passed.
        existing = self._partitions(dcu)
        if existing:
            raise InvalidRequestError(
                f"{self._label(dcu)} already has partitions {[p.uuid for p in existing]}; gpuflow "
                "creates a DCU's vDCUs as one set, so destroy them first (hy-smi destroys per DCU)"
            )
        cus = ",".join(str(r.compute_units) for r in reqs)
        mems = ",".join(str(r.memory_mb) for r in reqs)
        proc = self._run(
            [
                "virtual",
                "-create-vdevices",
                str(len(reqs)),
                "-d",
                str(dcu.index),
                "-vdevice-compute-units",
                cus,
                "-vdevice-memory-size",
                mems,
            ]
        )
        # Trust the listing, not the message: some tools print errors and exit 0.
        created = sorted(self._vdcus(dcu), key=lambda p: int(p.uuid.removeprefix(VDCU_PREFIX)))
        want = sorted((r.compute_units or 0, r.memory_mb or 0) for r in reqs)
        got = sorted((p.compute_units or 0, p.memory_mb) for p in created)
        if got != want:
            raise HardwareError(
                f"hy-smi virtual -create-vdevices on DCU {dcu.index} answered {hp.quote(proc.stdout)} "
                f"but the DCU now lists vDCUs (CUs, MiB) {got}, not the requested {want}"
            )
        return created

    def _create_mig(self, dcu: _Dcu, reqs: list[PartitionRequest]) -> list[Partition]:
        if "mig" not in dcu.kinds:
            raise UnsupportedError(
                f"{self._label(dcu)} offers no MIG profiles through `hy-smi mig` ({'; '.join(self.notes())})"
            )
        for i, r in enumerate(reqs):
            if r.compute_units is not None or r.memory_mb is not None:
                raise InvalidRequestError(
                    f"MIG request {i}: compute_units/memory_mb apply to vDCUs only"
                )
            if r.placement_start is not None:
                raise UnsupportedError(
                    f"MIG request {i}: hy-smi's documented `mig -cgi <id>` takes no placement; "
                    "the driver places the instance"
                )
        label = self._label(dcu)
        fit_mig(label, dcu.mig_profiles, reqs)  # static check before reading the device
        if "vdcu" in dcu.kinds and self._vdcus(dcu):
            raise InvalidRequestError(
                f"{label} has vDCUs; destroy them before creating MIG instances"
            )
        before = self._mig_instances(dcu)
        fit_mig(
            label,
            dcu.mig_profiles,
            reqs,
            existing=[Occupied(r.start, r.size, r.size) for r in before],
            existing_counts=Counter(r.name for r in before),
        )
        by_name = {p.name: p for p in dcu.mig_profiles}
        # Largest first: Hygon's placements are aligned power-of-two blocks, so placing the
        # biggest first always finds room when the layout fits (fit_mig proved it does).
        order = sorted(reqs, key=lambda r: -by_name[r.profile].placement_size)
        for r in order:
            self._run(
                ["mig", "-cgi", str(by_name[r.profile].profile_id), "-C", "-i", str(dcu.index)]
            )
        known = {r.instance_id for r in before}
        new = [p for p in self._mig_partitions(dcu) if _mig_gi(p.uuid) not in known]
        if sorted(p.profile for p in new) != sorted(r.profile for r in reqs):
            raise HardwareError(
                f"after hy-smi mig -cgi on DCU {dcu.index} the new instances are "
                f"{sorted(p.profile for p in new)}, not the requested {sorted(r.profile for r in reqs)}"
            )
        return new

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
        wanted_m = sorted(_mig_gi(u) for u in wanted if have[u].kind == "mig")
        all_m = len(wanted_m) == len(existing) - len(vdcus)
        if wanted_v:
            self._run(["virtual", "-d", str(dcu.index), "-destroy-vdevice"])
        if wanted_m and all_m:
            # Compute instances first, then their GPU instances (the driver refuses otherwise).
            self._run(["mig", "-dci", "-i", str(dcu.index)])
            self._run(["mig", "-dgi", "-i", str(dcu.index)])
        else:
            for gi in wanted_m:
                self._run(["mig", "-dci", "-gi", str(gi), "-i", str(dcu.index)])
                self._run(["mig", "-dgi", "-gi", str(gi), "-i", str(dcu.index)])
        left = sorted(wanted & {p.uuid for p in self._partitions(dcu)})
        if left:
            raise HardwareError(
                f"hy-smi reported success but {self._label(dcu)} still lists {left}"
            )

    # -- clocks and power --------------------------------------------------------------------
    def _clock_levels(self, dcu: _Dcu) -> hp.ClockLevels:
        self._require_flags("reading clock levels", "--showclkfrq")
        what = f"hy-smi -d {dcu.index} --showclkfrq"
        proc = self._run(["-d", str(dcu.index), "--showclkfrq"])
        levels = hp.parse_clock_levels(proc.stdout, what).get(dcu.index, {}).get("sclk")
        if levels is None or not levels.levels:
            raise hp.unexpected(what, proc.stdout, f"no sclk levels for DCU {dcu.index}")
        return levels

    def clocks(self, node: str, index: int) -> ClockState:
        dcu = self._dcu(node, index)
        levels = self._clock_levels(dcu)
        mhz = [m for _lvl, m in levels.levels]
        locked = self._locked.get(index)
        current = levels.current_mhz
        if current is None:
            raise HardwareError(f"hy-smi -d {index} --showclkfrq marks no current sclk level")
        return ClockState(
            sm_clock_mhz=current,
            sm_clock_min_mhz=min(mhz),
            sm_clock_max_mhz=max(mhz),
            locked_min_mhz=locked[0] if locked else None,
            locked_max_mhz=locked[1] if locked else None,
        )

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        """Allow only the sclk DPM levels in [min_mhz, max_mhz] (rocm-smi ``--setsclk``)."""
        dcu = self._dcu(node, index)
        if not _is_int(min_mhz) or not _is_int(max_mhz):
            raise InvalidRequestError(f"clocks must be ints in MHz, got {min_mhz!r}, {max_mhz!r}")
        if min_mhz <= 0 or min_mhz > max_mhz:
            raise InvalidRequestError(f"need 0 < min_mhz <= max_mhz, got {min_mhz}, {max_mhz}")
        self._require_flags("locking clocks", "--showclkfrq", "--setsclk")
        levels = self._clock_levels(dcu)
        table = ", ".join(f"{lvl}:{m}MHz" for lvl, m in levels.levels)
        chosen = [(lvl, m) for lvl, m in levels.levels if min_mhz <= m <= max_mhz]
        if not chosen:
            raise InvalidRequestError(
                f"no sclk level of DCU {index} lies in {min_mhz}..{max_mhz} MHz (levels {table})"
            )
        self._run(["-d", str(index), "--setsclk", *[str(lvl) for lvl, _m in chosen]])
        # What is enforced is the chosen levels' span, which is what we report back.
        self._locked[index] = (min(m for _l, m in chosen), max(m for _l, m in chosen))

    def reset_locked_clocks(self, node: str, index: int) -> None:
        self._dcu(node, index)
        self._require_flags("resetting clocks", "--resetclocks")
        self._run(["-d", str(index), "--resetclocks"])
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
        dcu = self._dcu(node, index)
        what = "hy-smi --showmaxpower --json"
        proc = self._run(["--showmaxpower", "--json"])
        cards = hp.parse_card_json(proc.stdout, what)
        if index not in cards:
            raise hp.unexpected(what, proc.stdout, f"no card{index}")
        cap_w = hp.card_number(cards[index], F_POWER_CAP, what, proc.stdout)
        if cap_w is None:
            raise hp.unexpected(what, proc.stdout, f"card{index} lacks {F_POWER_CAP[0]!r}")
        cap = int(round(cap_w * 1000))
        spec = self._sku_spec(dcu)
        if spec is None:
            return PowerLimits(
                limit_mw=cap, min_limit_mw=cap, max_limit_mw=cap, default_limit_mw=cap
            )
        return PowerLimits(
            limit_mw=cap,
            min_limit_mw=min(spec.power_min_limit_mw, cap),
            max_limit_mw=max(spec.power_max_limit_mw, cap),
            default_limit_mw=spec.power_default_limit_mw,
        )

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        self._dcu(node, index)
        if not _is_int(limit_mw):
            raise InvalidRequestError(f"limit_mw must be an int, got {limit_mw!r}")
        if limit_mw % 1000:
            raise InvalidRequestError(
                f"hy-smi takes whole watts; {limit_mw} mW is not a multiple of 1000"
            )
        self._require_flags("setting the power cap", "--showmaxpower", "--setpoweroverdrive")
        limits = self.power_limits(node, index)
        if not limits.min_limit_mw <= limit_mw <= limits.max_limit_mw:
            raise InvalidRequestError(
                f"power limit {limit_mw} mW is outside {limits.min_limit_mw}..{limits.max_limit_mw} mW "
                f"for DCU {index}"
            )
        proc = self._run(["-d", str(index), "--setpoweroverdrive", str(limit_mw // 1000)])
        after = self.power_limits(node, index).limit_mw
        if after != limit_mw:
            raise HardwareError(
                f"hy-smi --setpoweroverdrive answered {hp.quote(proc.stdout)} but the cap of DCU "
                f"{index} reads {after} mW, not {limit_mw} mW"
            )


def _status_error(proc: subprocess.CompletedProcess[str]) -> HardwareError:
    shown = " ".join(str(a) for a in proc.args)
    return HardwareError(
        f"`{shown}` exited with status {proc.returncode}: "
        f"stderr {hp.quote(proc.stderr)}, stdout {hp.quote(proc.stdout)}"
    )


def _mig_uuid(device: int, gi: int) -> str:
    # Hygon's own MIG identity lives in /etc/dmi_mig_config/ci/*.conf, which no CLI shows;
    # this name is gpuflow's, stable for the life of the GPU instance.
    return f"dcu{device}-mig-gi{gi}"


def _mig_gi(uuid: str) -> int:
    return int(uuid.rsplit("gi", 1)[1])
