"""`gpuflow energy tune`: choose one device's power limit for a reference workload, once.

The device is leased for the tune (nothing else is placed on it meanwhile; a device that is
leased already is refused), a reference workload runs on it - a GEMM loop on the device's
torch device, which is the host CPU for the twin, whose units are paced to the device's
time as a training step is (tasks.training.pacing: max(host busy, padded reference x
T(f)/T(f_max))) - and the SettingSearch probes power limits with
the EnergyMeter. Every change goes through DeviceSettings under holder ``tune:<node>:<i>``:
without ``--keep`` the device goes back at the end; with it the chosen limit stays, held
for ``hold_s``, after which the next controller run (restore_stale) puts the default back.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.tasks.energy.optimizer import Choice, Objective, SettingSearch
from gpuflow.tasks.energy.settings import DeviceSettings
from gpuflow.tasks.energy.tuner import DEFAULT_GRID_STEP_W, EnergyMeter, power_limit_grid
from gpuflow.tasks.training.utilization import DeviceUtilization

TUNE_LEASE_TTL_S = 600.0


@dataclass
class TuneResult:
    node: str
    index: int
    choice: Choice
    kept: bool  # the chosen limit stays on the device
    default_limit_w: float


def parse_device(text: str) -> tuple[str, int]:
    """'NODE:INDEX' -> (node, index), with a clear error."""
    node, sep, index = text.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise InvalidRequestError(f"--device must be NODE:INDEX (e.g. v100-0:0), got {text!r}")
    return node, int(index)


def reference_work(size: int = 256) -> Callable[[], None]:
    """One unit of reference work: a chain of GEMMs on the torch device of the backend."""
    import torch

    a = torch.randn(size, size)
    b = torch.randn(size, size)

    def unit() -> None:
        c = a
        for _ in range(4):
            c = torch.tanh(c @ b)
        float(c[0, 0])

    return unit


def tune_device(
    backend: Backend,
    inventory: Any,
    node: str,
    index: int,
    objective: Objective | None = None,
    *,
    probe_s: float = 2.0,
    settle_s: float = 0.5,
    keep: bool = False,
    hold_s: float = 3600.0,
    grid_step_w: float = DEFAULT_GRID_STEP_W,
    work: Callable[[], None] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> TuneResult:
    """Lease node:index, run the search on the reference workload, leave or restore."""
    if not probe_s > 0 or not settle_s >= 0 or not hold_s > 0:
        raise InvalidRequestError(
            f"probe_s and hold_s must be > 0 and settle_s >= 0, got {probe_s!r}, {settle_s!r}, "
            f"{hold_s!r}"
        )
    dev = backend.device(node, index)  # refuses an unknown device, naming it
    if not inventory.devices():
        inventory.sync(backend)
    owner = f"tune-{uuid.uuid4().hex[:8]}"
    lease = inventory.acquire_lease(dev.uuid, owner, TUNE_LEASE_TTL_S)
    work = work or reference_work()
    limits = backend.power_limits(node, index)
    search = SettingSearch(power_limit_grid(limits, grid_step_w), objective)
    settings = DeviceSettings(backend, inventory, f"tune:{node}:{index}", ttl_s=hold_s)
    meter = EnergyMeter(backend, node, index)
    pacer = DeviceUtilization(backend, node, index, owner)
    kept = False
    try:
        backend.report_workload(node, index, owner, 1.0)
        while (setting := search.next_probe()) is not None:
            progress(f"{node}:{index}: probing {setting:g} W ({len(search.probes) + 1})")
            settings.apply_power_limit(node, index, round(setting * 1000))
            pacer.refresh_pace()
            _run_for(pacer, work, settle_s)
            meter.start()
            units = _run_for(pacer, work, probe_s)
            search.tell(meter.stop(setting, units))
        choice = search.choice()
        if keep:
            settings.apply_power_limit(node, index, round(choice.chosen.setting * 1000))
            kept = True
        return TuneResult(node, index, choice, kept, limits.default_limit_mw / 1000.0)
    finally:
        backend.end_workload(owner)
        if not kept:
            settings.restore_all()
        inventory.release_lease(lease.resource_id, owner)


def _run_for(pacer: DeviceUtilization, work: Callable[[], None], seconds: float) -> int:
    """Run work units, each paced by the device's clock (the training loop's pacing), for at
    least ``seconds``."""
    units = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or (seconds > 0 and units == 0):
        t = time.perf_counter()
        work()
        pacer.pace(time.perf_counter() - t)
        units += 1
    return units
