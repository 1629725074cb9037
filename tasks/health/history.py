"""Fleet history: months of labelled fleet telemetry from the twin's models, in fast-forward.

The twin's pure modules draw it: failure schedules from hardware.sim.hazard (the very
schedule a SimBackend with the same seed draws), how each class unfolds from
hardware.sim.faults (HBM: corrected-ECC growth, XID 63 remaps at 0.6 L and 0.8 L;
thermal: rising thermal resistance), and power/heat/throttling from hardware.sim.physics.
Failure times and classes are known, so every window gets its label: does the device
fail within the horizon after the window's end?

A year of 16,000 devices is 1.7 billion 5-minute buckets: far too many to build, and
nearly all of them healthy and alike. So the history is built as *segments*:

* an incident segment per failure: contiguous buckets from before the degradation began
  (or 24 h before an abrupt failure) up to the failure; every window of it is kept;
* background segments: contiguous stretches at random devices and times away from any
  incident (and from repair downtime), each window weighted by how many population
  windows it stands for (``weight``), so that rates per device-day and precision are
  estimated for the whole fleet, not for the sample.

Splits (DESIGN.md section 6: by node and by time): nodes are shuffled into train / val /
test groups, time into consecutive ranges; a split is its node group over its time
range, so the test split holds nodes the model never saw, later than anything it saw.

Between failures a device runs jobs: busy stretches (utilization 0.55..1) and idle ones
(estimates, lognormal durations). With a 60 s thermal time constant a 5-minute bucket is
near steady state, so healthy buckets take the steady state of their load (memoized per
SKU, ambient and load step); a thermal degradation is integrated bucket by bucket with
the exact RC solution. Sensors get a little noise (estimates: 0.3 C, 1 % power) so the
models cannot lean on exact values. After a failure the device is repaired after a
lognormal delay (median 12 h, an estimate): counters reset, as the twin's repair does.

This module is the entry point (``generate_history``, ``load_or_generate``) and re-exports
the public names of the parts it is built from: history_config (what to build),
history_fleet (the devices), history_schedule (each device's failures and repairs),
history_physics (workload and per-bucket physics), history_series (a segment's bucket
features), history_splits (segments and windows per split), history_dataset (the result
and its .npz form).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.features import FEATURES
from gpuflow.tasks.health.history_config import (
    ABRUPT_LOOKBACK_S,
    HISTORY_VERSION,
    POWER_NOISE_RATIO,
    PRECURSOR_MARGIN_S,
    SPLITS,
    TEMP_NOISE_C,
    U_STEP,
    HistoryConfig,
)
from gpuflow.tasks.health.history_dataset import History, SplitData
from gpuflow.tasks.health.history_fleet import Device, Fault, build_fleet
from gpuflow.tasks.health.history_noise import draw_noise
from gpuflow.tasks.health.history_physics import steady_state, thermal_start_s, workload
from gpuflow.tasks.health.history_schedule import draw_faults
from gpuflow.tasks.health.history_series import (
    Segment,
    counters_vec,
    simulate_segment,
    unreadable_columns,
)
from gpuflow.tasks.health.history_splits import build_split, split_of_nodes, split_time_ranges

__all__ = [
    "ABRUPT_LOOKBACK_S",
    "HISTORY_VERSION",
    "POWER_NOISE_RATIO",
    "PRECURSOR_MARGIN_S",
    "SPLITS",
    "TEMP_NOISE_C",
    "U_STEP",
    "Device",
    "Fault",
    "History",
    "HistoryConfig",
    "Segment",
    "SplitData",
    "build_fleet",
    "counters_vec",
    "draw_faults",
    "draw_noise",
    "generate_history",
    "history_path",
    "load_or_generate",
    "simulate_segment",
    "split_time_ranges",
    "steady_state",
    "thermal_start_s",
    "workload",
]


def generate_history(
    cfg: HistoryConfig, progress: Callable[[str, float], None] | None = None
) -> History:
    """Build the labelled history of ``cfg`` (see the module doc)."""
    started = time.perf_counter()
    say = progress or (lambda _msg, _frac: None)
    devices = build_fleet(cfg)
    say("drawing failure schedules", 0.02)
    for d in devices:
        draw_faults(cfg, d)
        draw_noise(cfg, d)
    node_split = split_of_nodes(cfg)
    ranges = split_time_ranges(cfg)
    all_faults = [f for d in devices for f in d.faults]
    splits: dict[str, SplitData] = {}
    for si, name in enumerate(SPLITS):
        t0, t1 = ranges[si]
        devs = [d for d in devices if node_split[d.node_idx] == si]
        say(f"{name}: simulating incidents", 0.05 + 0.3 * si)
        splits[name] = build_split(cfg, name, si, devs, t0, t1)
    stats = {
        "devices": len(devices),
        "nodes": cfg.nodes,
        "days": cfg.days,
        "failures": len(all_faults),
        "failures_by_class": _count_by(f.kind for f in all_faults),
        "lemons": sum(d.lemon for d in devices),
        "silent_hbm_failures": sum(f.kind == "hbm" and f.abrupt for f in all_faults),
        "repeat_failures": sum(max(len(d.faults) - 1, 0) for d in devices),
        "benign_remaps": sum(len(d.remaps) for d in devices),
        "healed_degradations": sum(len(d.heals) for d in devices),
        # What each SKU's real backend cannot read (NaN features): recorded with the run,
        # so a model's figures say which fleets had which signals.
        "missing_features_by_sku": {
            name: [FEATURES[j] for j in unreadable_columns(lookup_sku(name))]
            for name in sorted({d.sku for d in devices})
        },
        "generate_s": round(time.perf_counter() - started, 3),
        "splits": {
            n: {
                "failures": int(len(sp.fail_s)),
                "failures_by_class": _count_by(str(k) for k in sp.fail_kind),
                "windows": sp.n_windows,
                "positive_windows": int(sp.labels(cfg.horizon_s).sum()),
                "device_days": round(sp.device_days, 1),
                "background_device_days": round(sp.background_device_days, 1),
                "sampled_background_device_days": round(sp.sampled_background_device_days, 1),
            }
            for n, sp in splits.items()
        },
    }
    say("done", 1.0)
    return History(cfg, splits, stats)


def _count_by(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in items:
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def history_path(cfg: HistoryConfig, home: Path | None = None) -> Path:
    from gpuflow.hardware.home import gpuflow_home

    return (home or gpuflow_home()) / "health" / "history" / f"history-{cfg.cache_key()}.npz"


def load_or_generate(
    cfg: HistoryConfig,
    cache: bool = True,
    progress: Callable[[str, float], None] | None = None,
) -> tuple[History, bool]:
    """(history, loaded from cache?): the cached history of ``cfg`` under GPUFLOW_HOME, or
    a freshly generated one (saved there when ``cache``)."""
    path = history_path(cfg)
    if cache and path.exists():
        try:
            return History.load(path), True
        except (ValueError, KeyError, OSError):
            pass  # stale or damaged: build again
    h = generate_history(cfg, progress)
    if cache:
        h.save(path)
    return h, False
