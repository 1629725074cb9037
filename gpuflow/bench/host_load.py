"""What else the machine did while a benchmark ran: load average and hypervisor steal.

A virtual machine's vCPU can be ready to run and not be run, because the host gave the
physical core to another guest; the guest's kernel counts that time as "steal" in
/proc/stat. A pinned server on a vCPU that loses a tenth of its time serves a tenth
slower than the profile taken a minute earlier, and nothing in the benchmark's own
figures says why. So the edge benchmarks report steal beside load, per core they pinned.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
PROC_CPUINFO = Path("/proc/cpuinfo")
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
# How long an idle vCPU of a KVM guest polls before it halts (cpuidle-haltpoll; 0: never).
HALT_POLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
# /proc/stat's cpu lines: user nice system idle iowait irq softirq steal guest guest_nice;
# guest time is already counted in user, so the total stops at steal.
_STEAL = 7
_FIELDS_IN_TOTAL = 8


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies per core (and "all") from /proc/stat: (steal, total) at one instant."""

    cores: dict[str, tuple[int, int]]

    @classmethod
    def now(cls, path: Path = PROC_STAT) -> CpuTimes:
        cores: dict[str, tuple[int, int]] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError:  # not Linux, or /proc not mounted: nothing to report
            return cls({})
        for line in lines:
            name, *fields = line.split()
            if not name.startswith("cpu") or len(fields) <= _STEAL:
                continue
            values = [int(v) for v in fields[:_FIELDS_IN_TOTAL]]
            cores["all" if name == "cpu" else name[3:]] = (values[_STEAL], sum(values))
        return cls(cores)


def steal_shares(before: CpuTimes, after: CpuTimes, cores: list[int]) -> dict[str, float]:
    """Share of each of ``cores``' time (and the whole machine's, "all") stolen between
    the two readings; cores /proc/stat did not list, or that did not tick, are left out."""
    out: dict[str, float] = {}
    for name in ["all", *(str(c) for c in cores)]:
        if name not in before.cores or name not in after.cores:
            continue
        steal = after.cores[name][0] - before.cores[name][0]
        total = after.cores[name][1] - before.cores[name][1]
        if total > 0:
            out[name] = steal / total
    return out


def load_report(before: CpuTimes, after: CpuTimes, cores: list[int]) -> dict[str, float]:
    """Flat keys for a benchmark's result: the 1-minute load now, the machine's steal share
    over the run and the highest share among the pinned ``cores``."""
    shares = steal_shares(before, after, cores)
    out = {"load_avg_1m_after": os.getloadavg()[0]}
    if "all" in shares:
        out["steal_share"] = shares["all"]
    pinned = [v for k, v in shares.items() if k != "all"]
    if pinned:
        out["steal_share_max_pinned_core"] = max(pinned)
    return out


def cpu_report(
    cpuinfo: Path = PROC_CPUINFO, cpuidle: Path = CPUIDLE, halt_poll_ns: Path = HALT_POLL_NS
) -> dict[str, str]:
    """The CPU's model name, the kernel's idle driver and governor and, in a KVM guest
    with cpuidle-haltpoll, how long an idle vCPU polls before it halts; where Linux says.

    Why: a hop wakes a server on another core, and a guest's vCPU that halted must be
    woken by the host (a VM exit and a host reschedule) unless the guest polled for a
    while first. On the 2-core EPYC guest, polling 200 us cut the empty round trip by a
    quarter and a 2-shard hop by 0.09 ms (docs/edge.md, "What was tried")."""
    out: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                out["cpu_model"] = value.strip()
                break
    except OSError:
        pass
    # Kernels before 5.x name the governor's file current_governor_ro.
    for key, names in (
        ("cpuidle_driver", ("current_driver",)),
        ("cpuidle_governor", ("current_governor", "current_governor_ro")),
    ):
        for name in names:
            try:
                out[key] = (cpuidle / name).read_text().strip()
                break
            except OSError:
                continue
    try:
        out["guest_halt_poll_ns"] = halt_poll_ns.read_text().strip()
    except OSError:
        pass
    return out
