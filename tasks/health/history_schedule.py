"""The failure/repair schedule of each device: the hazard model's draws (the very schedule
a SimBackend with the same seed draws), a thermal failure's time from the physics, and a
repair delay after each failure drawn from the InfiniteHBD trace's repair-time deciles
(HistoryConfig.repair_deciles_s: median 17 h, from 4 minutes to 92 days).
"""

from __future__ import annotations

import math
from typing import Any

from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim.hazard import DAY_S, FaultDraw, device_schedule
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.features import BUCKET_S
from gpuflow.tasks.health.history_config import HistoryConfig, history_rng
from gpuflow.tasks.health.history_fleet import Device, Fault
from gpuflow.tasks.health.history_physics import thermal_run, thermal_start_s, workload


def _repair_delay_s(cfg: HistoryConfig, seed: int, ordinal: int, k: int) -> float:
    """An inverse-CDF draw, log-linear between the deciles; at least one bucket, so a
    repaired device's counters start from zero at a bucket of their own."""
    d = cfg.repair_deciles_s
    x = history_rng(seed, "repair", ordinal, k).random() * (len(d) - 1)
    i = min(int(x), len(d) - 2)
    lo, hi = math.log(d[i]), math.log(d[i + 1])
    return max(math.exp(lo + (hi - lo) * (x - i)), BUCKET_S)


def draw_faults(cfg: HistoryConfig, dev: Device) -> None:
    """The device's failures over the history, in order, as the twin would run them: a
    draw that lands while the device is degrading or down is skipped."""
    until = cfg.days * DAY_S
    available = 0.0
    for d in device_schedule(cfg.seed, dev.ordinal, dev.rate_per_day, cfg.hazard(), until):
        if d.onset_s < available:
            continue
        failure = d.failure_s
        final_xid = F.sku_final_xid(lookup_sku(dev.sku), d.final_xid)
        if d.kind == "thermal":
            failure = thermal_failure_s(cfg, dev, d)
        repaired = failure + _repair_delay_s(cfg, cfg.seed, dev.ordinal, d.k)
        dev.faults.append(
            Fault(
                dev.ordinal,
                d.kind,
                d.onset_s,
                failure,
                d.lead_s,
                final_xid,
                repaired,
                d.k,
                shape=F.hbm_shape_fields(d),
            )
        )
        available = repaired


def _thermal_fault_dict(d: FaultDraw | Fault) -> dict[str, Any]:
    return F.new_fault("thermal", "natural", d.onset_s, d.lead_s, 79)


def thermal_failure_s(cfg: HistoryConfig, dev: Device, d: FaultDraw) -> float:
    """When the thermal degradation shuts the device down under its workload (exact RC
    physics per bucket; the lead time is the twin's backstop)."""
    t0 = thermal_start_s(d.onset_s)
    n = int(math.ceil((d.failure_s - t0) / BUCKET_S)) + 1
    util, _ = workload(cfg, dev.ordinal, t0, n)
    sim = thermal_run(dev, _thermal_fault_dict(d), t0, util)
    return min(sim[5], d.failure_s) if sim[5] is not None else d.failure_s
