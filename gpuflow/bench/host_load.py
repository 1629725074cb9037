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
