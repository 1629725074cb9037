"""GPU reset, what applies a MIG mode change NVML left pending.

NVML has no public reset call; mig-parted resets with ``nvidia-smi -r -i <bus ids>``
(cmd/nvidia-mig-parted/util/device.go), and so do we: argv as a list, no shell. The reset
is refused while anything holds the GPU (compute processes, but also clients NVML does
not list as processes: nv-hostengine for DCGM, the exporter, persistenced in some
setups); the error then carries nvidia-smi's own words and the compute processes NVML
sees, so the operator knows what to stop (or which pre-apply-mode hook to write).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence

from gpuflow.hardware.backend import HardwareError, UnsupportedError
from gpuflow.hardware.nvml.device import NvmlDevice

RESET_TIMEOUT_S = 300.0  # a reset of 8 GPUs takes tens of seconds; never hang on one

CommandRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (argv[0] looked up on PATH), capturing its output."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise UnsupportedError(
            f"{argv[0]} is not on PATH: cannot reset GPUs to apply a pending MIG mode; "
            "reset them by hand (or reboot) and apply again"
        )
    try:
        return subprocess.run(  # noqa: S603 - fixed argv, no shell
            [exe, *argv[1:]], capture_output=True, text=True, timeout=RESET_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise HardwareError(f"{' '.join(argv)} did not finish in {RESET_TIMEOUT_S:.0f} s") from exc


def compute_processes(dev: NvmlDevice) -> list[str]:
    """ "pid 4242 (python)" for each compute process NVML lists on the GPU."""
    out = []
    for pid, _mib in dev.compute_processes():
        try:
            name = dev.process_name(pid)
        except HardwareError:
            name = "?"
        out.append(f"pid {pid} ({name})")
    return out


def reset_gpus(devs: Sequence[NvmlDevice], runner: CommandRunner) -> None:
    """One ``nvidia-smi -r -i`` for all of ``devs``; HardwareError naming what held them."""
    if not devs:
        return
    argv = ["nvidia-smi", "-r", "-i", ",".join(d.pci_bus_id() for d in devs)]
    done = runner(argv)
    if done.returncode == 0:
        return
    said = " ".join((done.stdout or "").split() + (done.stderr or "").split())[-600:]
    held = {d.where: compute_processes(d) for d in devs}
    procs = "; ".join(f"{where}: {', '.join(p)}" for where, p in held.items() if p)
    raise HardwareError(
        f"GPU reset refused ({' '.join(argv)} exited {done.returncode}): {said or 'no output'}"
        + (
            f"; compute processes: {procs}"
            if procs
            else "; no compute processes (a client such as DCGM holds it)"
        )
    )
