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
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import physics
from gpuflow.hardware.sim.hazard import (
    DAY_S,
    FaultDraw,
    HazardModel,
    device_schedule,
    pick_lemons,
)
from gpuflow.hardware.skus import SkuSpec
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.features import (
    BUCKET_S,
    N_FEATURES,
    WINDOW_BUCKETS,
    bucket_matrix,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator

SPLITS = ("train", "val", "test")
ABRUPT_LOOKBACK_S = 24 * 3600.0  # incident segment of an abrupt failure: the day before
PRECURSOR_MARGIN_S = 3600.0  # an incident segment starts this long before the onset
U_STEP = 0.05  # load quantization of the steady-state table
TEMP_NOISE_C = 0.3  # estimate: sensor noise
POWER_NOISE_RATIO = 0.01  # estimate


class HistoryConfig(BaseModel):
    """What fleet, how long, how it is split and sampled. Defaults: the real run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(2048, ge=3, description="nodes in the fleet")
    gpus_per_node: int = Field(8, ge=1, le=16)
    days: float = Field(365.0, gt=1.0, le=3650.0)
    seed: int = 20261130
    sku_mix: dict[str, float] = Field(
        default_factory=lambda: {
            "NVIDIA A100-SXM4-40GB": 0.4,
            "NVIDIA A100-SXM4-80GB": 0.1,
            "NVIDIA H100 80GB HBM3": 0.3,
            "Tesla V100-SXM2-32GB": 0.1,
            "Hygon DCU Z100": 0.1,
        },
        description="share of nodes per SKU (a node holds one SKU)",
    )
    ambient_c: float = Field(30.0, description="mean inlet temperature; nodes vary +-2 C")
    rate_per_node_day: float | None = Field(None, ge=0, description="None: the twin's default")
    abrupt_share: float | None = None
    lemon_fraction: float | None = None
    lemon_factor: float | None = None
    repair_median_s: float = Field(12 * 3600.0, gt=0)
    app_xid_per_day: float = Field(0.05, ge=0, description="application XIDs (noise)")
    busy_median_s: float = Field(8 * 3600.0, gt=0)
    idle_median_s: float = Field(3600.0, gt=0)
    node_fractions: tuple[float, float, float] = (0.5, 0.2, 0.3)
    time_fractions: tuple[float, float, float] = (0.5, 0.2, 0.3)
    background_segments: tuple[int, int, int] = (4000, 1500, 3000)
    background_segment_s: tuple[float, float, float] = (2 * 3600.0, 6 * 3600.0, 24 * 3600.0)
    window: int = Field(WINDOW_BUCKETS, ge=2)
    horizon_s: float = Field(1800.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> HistoryConfig:
        for name in ("node_fractions", "time_fractions"):
            v = getattr(self, name)
            if any(x <= 0 for x in v) or abs(sum(v) - 1.0) > 1e-6:
                raise ValueError(f"{name} must be three positive shares summing to 1, got {v}")
        if not self.sku_mix or any(w < 0 for w in self.sku_mix.values()):
            raise ValueError(f"sku_mix must map SKU names to shares >= 0, got {self.sku_mix}")
        for name in self.sku_mix:
            try:
                lookup_sku(name)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"sku_mix: unknown SKU {name!r}") from exc
        if any(n < 1 for n in self.background_segments):
            raise ValueError("background_segments must be >= 1 per split")
        if any(s < BUCKET_S for s in self.background_segment_s):
            raise ValueError(f"background_segment_s must be >= {BUCKET_S} s")
        for i, split in enumerate(SPLITS):
            if self.days * self.time_fractions[i] * DAY_S < self.background_segment_s[i]:
                raise ValueError(f"the {split} time range is shorter than its background segment")
        if round(self.nodes * self.node_fractions[0]) < 1:
            raise ValueError("too few nodes for the train split")
        self.hazard()  # validates the hazard overrides
        return self

    def hazard(self) -> HazardModel:
        kw: dict[str, Any] = {"gpus_per_node": self.gpus_per_node}
        for name in ("rate_per_node_day", "abrupt_share", "lemon_fraction", "lemon_factor"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        return HazardModel(**kw)

    def cache_key(self) -> str:
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256((HISTORY_VERSION + text).encode()).hexdigest()[:16]

    @classmethod
    def small(cls, **overrides: Any) -> HistoryConfig:
        """A small fleet for tests and quick runs: 96 nodes, 120 days, a raised hazard."""
        base: dict[str, Any] = {
            "nodes": 96,
            "days": 120.0,
            "rate_per_node_day": 0.06,
            "background_segments": (300, 150, 300),
            "background_segment_s": (2 * 3600.0, 4 * 3600.0, 12 * 3600.0),
        }
        base.update(overrides)
        return cls(**base)


HISTORY_VERSION = "1"


# -- the fleet -------------------------------------------------------------------------------


@dataclass
class Fault:
    """One failure of one device, as the history sees it."""

    ordinal: int
    kind: str
    onset_s: float
    failure_s: float
    lead_s: float
    final_xid: int
    repaired_s: float
    k: int

    @property
    def abrupt(self) -> bool:
        return self.kind in ("xid79", "ecc-uncorrectable")

    def incident_start_s(self) -> float:
        if self.abrupt:
            return self.failure_s - ABRUPT_LOOKBACK_S
        return min(self.onset_s - PRECURSOR_MARGIN_S, self.failure_s - ABRUPT_LOOKBACK_S)


@dataclass
class Device:
    ordinal: int
    node: str
    node_idx: int
    index: int
    sku: str
    ambient_c: float
    lemon: bool
    rate_per_day: float
    faults: list[Fault] = field(default_factory=list)

    def repaired_before(self, t: float) -> float:
        """The last repair at or before ``t`` (0: the epoch): the counters' base."""
        base = 0.0
        for f in self.faults:
            if f.repaired_s <= t:
                base = f.repaired_s
        return base

    def blocked(self) -> list[tuple[float, float]]:
        """Time ranges that are not background: incidents through repairs."""
        return [(f.incident_start_s(), f.repaired_s) for f in self.faults]


def _rng(*parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in ("gpuflow-history", *parts)))


def build_fleet(cfg: HistoryConfig) -> list[Device]:
    """Devices with SKUs, ambients, lemons, rates (the hazard model's own draws)."""
    model = cfg.hazard()
    n = cfg.nodes * cfg.gpus_per_node
    lemons = pick_lemons(cfg.seed, n, model)
    rates = model.device_rates_per_day(n, lemons)
    rng = _rng(cfg.seed, "fleet")
    names, weights = list(cfg.sku_mix), list(cfg.sku_mix.values())
    devices: list[Device] = []
    for node_idx in range(cfg.nodes):
        sku_name = lookup_sku(rng.choices(names, weights=weights)[0]).name
        ambient = round(cfg.ambient_c + rng.uniform(-2.0, 2.0), 1)
        for index in range(cfg.gpus_per_node):
            o = node_idx * cfg.gpus_per_node + index
            devices.append(
                Device(
                    o, f"n{node_idx:05d}", node_idx, index, sku_name, ambient, o in lemons, rates[o]
                )
            )
    return devices


def _repair_delay_s(cfg: HistoryConfig, seed: int, ordinal: int, k: int) -> float:
    rng = _rng(seed, "repair", ordinal, k)
    return min(max(rng.lognormvariate(math.log(cfg.repair_median_s), 0.7), 1800.0), 7 * DAY_S)


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
            failure = _thermal_failure_s(cfg, dev, d)
        repaired = failure + _repair_delay_s(cfg, cfg.seed, dev.ordinal, d.k)
        dev.faults.append(
            Fault(dev.ordinal, d.kind, d.onset_s, failure, d.lead_s, final_xid, repaired, d.k)
        )
        available = repaired


# -- per-bucket physics --------------------------------------------------------------------


@functools.cache
def _power_model(sku_name: str) -> physics.PowerModel:
    return physics.PowerModel.from_sku(lookup_sku(sku_name))


@functools.cache
def steady_state(
    sku_name: str, ambient_c: float, u_idx: int
) -> tuple[float, float, float, int, int]:
    """(temperature_c, power_mw, clock_mhz, thermal throttle 0/1, power cap 0/1) of a healthy
    device held at load ``u_idx * U_STEP`` long enough to settle (the twin's physics)."""
    s = lookup_sku(sku_name)
    pm = _power_model(sku_name)
    c = _controls(s, ambient_c, u_idx * U_STEP, 1.0)
    t0 = ambient_c + s.thermal_resistance_c_per_w * s.power_idle_mw / 1000.0
    r = physics.advance(s, pm, c, t0, 0.0, 20 * s.thermal_time_constant_s)
    op = physics.decide(s, pm, c, r.temperature_c)
    return (
        r.temperature_c,
        op.power_mw,
        float(op.clock_mhz),
        int(bool(set(op.reasons) & _THERMAL)),
        int("SwPowerCap" in op.reasons),
    )


_THERMAL = {"SwThermalSlowdown", "HwSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}


def _controls(s: SkuSpec, ambient_c: float, load: float, multiplier: float) -> physics.Controls:
    return physics.Controls(
        load=load,
        power_limit_mw=s.power_default_limit_mw,
        ambient_c=ambient_c,
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w * multiplier,
    )


def workload(cfg: HistoryConfig, ordinal: int, t0: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(utilization, memory share) of ``n`` buckets from ``t0``: alternating busy and idle
    stretches. A function of absolute time (drawn per device and day), so every segment
    that covers a bucket sees the same load there."""
    first = int(t0 // DAY_S)
    last = int((t0 + n * BUCKET_S - 1e-6) // DAY_S)
    days = [_workload_day(cfg, ordinal, d) for d in range(first, last + 1)]
    util = np.concatenate([u for u, _ in days])
    mem = np.concatenate([m for _, m in days])
    k0 = int(round((t0 - first * DAY_S) / BUCKET_S))
    return util[k0 : k0 + n], mem[k0 : k0 + n]


_PER_DAY = int(round(DAY_S / BUCKET_S))


def _workload_day(cfg: HistoryConfig, ordinal: int, day: int) -> tuple[np.ndarray, np.ndarray]:
    rng = _rng(cfg.seed, "work", ordinal, day)
    util = np.zeros(_PER_DAY)
    mem = np.zeros(_PER_DAY)
    i = 0
    busy = rng.random() < cfg.busy_median_s / (cfg.busy_median_s + cfg.idle_median_s)
    while i < _PER_DAY:
        median = cfg.busy_median_s if busy else cfg.idle_median_s
        length = max(1, int(rng.lognormvariate(math.log(median), 1.0) / BUCKET_S))
        if busy:
            util[i : i + length] = round(rng.uniform(0.55, 1.0) / U_STEP) * U_STEP
            mem[i : i + length] = rng.uniform(0.3, 0.95)
        i += length
        busy = not busy
    return util, mem


def _thermal_fault_dict(d: FaultDraw | Fault) -> dict[str, Any]:
    return F.new_fault("thermal", "natural", d.onset_s, d.lead_s, 79)


def thermal_start_s(onset_s: float) -> float:
    """Where a thermal degradation's physics is integrated from: the same point for the
    failure time and for every segment, so both see the same temperatures."""
    return _align_down(onset_s - PRECURSOR_MARGIN_S)


def _thermal_failure_s(cfg: HistoryConfig, dev: Device, d: FaultDraw) -> float:
    """When the thermal degradation shuts the device down under its workload (exact RC
    physics per bucket; the lead time is the twin's backstop)."""
    t0 = thermal_start_s(d.onset_s)
    n = int(math.ceil((d.failure_s - t0) / BUCKET_S)) + 1
    util, _ = workload(cfg, dev.ordinal, t0, n)
    sim = _thermal_run(dev, _thermal_fault_dict(d), t0, util)
    return min(sim[5], d.failure_s) if sim[5] is not None else d.failure_s


def _thermal_run(
    dev: Device, fault: dict[str, Any], t0: float, util: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float | None]:
    """Per bucket: (temperature max, mean power, clock, thermal flag, power flag) and the
    shutdown time if one happened (arrays stop there)."""
    s = lookup_sku(dev.sku)
    pm = _power_model(dev.sku)
    n = len(util)
    temp = np.empty(n)
    power = np.empty(n)
    clock = np.empty(n)
    thr = np.zeros(n)
    cap = np.zeros(n)
    u0 = int(round(util[0] / U_STEP)) if n else 0
    t_c = steady_state(dev.sku, dev.ambient_c, u0)[0]
    for k in range(n):
        a = t0 + k * BUCKET_S
        m = F.thermal_multiplier(fault, a + BUCKET_S / 2, s, dev.ambient_c)
        c = _controls(s, dev.ambient_c, float(util[k]), m)
        r = physics.advance(s, pm, c, t_c, 0.0, BUCKET_S)
        if r.shutdown_after_s is not None:
            return temp[:k], power[:k], clock[:k], thr[:k], cap[:k], a + r.shutdown_after_s
        op = physics.decide(s, pm, c, r.temperature_c)
        temp[k] = max(t_c, r.temperature_c)
        power[k] = r.energy_mj / BUCKET_S
        clock[k] = op.clock_mhz
        thr[k] = 1.0 if set(op.reasons) & _THERMAL else 0.0
        cap[k] = 1.0 if "SwPowerCap" in op.reasons else 0.0
        t_c = r.temperature_c
    return temp, power, clock, thr, cap, None


# -- segments ------------------------------------------------------------------------------


@dataclass
class Segment:
    """Contiguous buckets of one device: [t0_s, t0_s + n * BUCKET_S)."""

    ordinal: int
    t0_s: float
    n: int
    kind: str  # "incident" | "background"
    fault: Fault | None = None


def simulate_segment(cfg: HistoryConfig, dev: Device, seg: Segment) -> np.ndarray:
    """The segment's bucket features [n, F] (FEATURES order)."""
    s = lookup_sku(dev.sku)
    n = seg.n
    t_end = seg.t0_s + BUCKET_S * (np.arange(n) + 1)
    util, mem = workload(cfg, dev.ordinal, seg.t0_s, n)
    u_idx = np.rint(util / U_STEP).astype(int)
    table = np.array([steady_state(dev.sku, dev.ambient_c, i) for i in range(int(1 / U_STEP) + 1)])
    temp = table[u_idx, 0].copy()
    power = table[u_idx, 1].copy()
    clock = table[u_idx, 2].copy()
    thr = table[u_idx, 3].copy()
    cap = table[u_idx, 4].copy()
    f = seg.fault
    fault = None
    if f is not None and not f.abrupt:
        fault = F.new_fault(f.kind, "natural", f.onset_s, f.lead_s, f.final_xid)
    if fault is not None and fault["kind"] == "thermal":
        # Healthy (table) before the canonical start, integrated physics from there on.
        ts = thermal_start_s(fault["onset_s"])
        k0 = max(0, int(round((ts - seg.t0_s) / BUCKET_S)))
        n_run = int(math.ceil((seg.t0_s + n * BUCKET_S - ts) / BUCKET_S))
        u_run, _ = workload(cfg, dev.ordinal, ts, n_run)
        tt, pp, cc, th, cp, _ = _thermal_run(dev, fault, ts, u_run)
        skip = max(0, int(round((seg.t0_s - ts) / BUCKET_S)))  # run buckets before t0
        tt, pp, cc, th, cp = (x[skip : skip + n - k0] for x in (tt, pp, cc, th, cp))
        k1 = k0 + len(tt)
        temp[k0:k1], power[k0:k1], clock[k0:k1], thr[k0:k1], cap[k0:k1] = tt, pp, cc, th, cp
        if k1 < n:  # the segment ends at the shutdown; hold the last state up to it
            for arr in (temp, power, clock, thr, cap):
                arr[k1:] = arr[k1 - 1] if k1 > 0 else arr[k1:]
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(f"{cfg.seed}:{dev.ordinal}:{seg.t0_s}".encode()).digest()[:8])
    )
    temp = temp + rng.normal(0.0, TEMP_NOISE_C, n)
    power = power * (1.0 + rng.normal(0.0, POWER_NOISE_RATIO, n))
    power_w = power / 1000.0
    means = np.stack(
        [
            (temp - 25.0) / np.maximum(power_w, 1.0),
            power / s.power_default_limit_mw,
            clock / s.sm_clock_max_mhz,
            thr,
            cap,
            util,
            mem,
        ],
        axis=1,
    )
    t_start = t_end - BUCKET_S
    counters_end, pending, failure = counters_vec(dev, fault, t_end)
    counters_start, _, _ = counters_vec(dev, fault, t_start)
    xids = _xids(cfg, seg, fault, n, rng)
    return bucket_matrix(
        temperature_c=temp,
        means=means,
        counters_start=counters_start,
        counters_end=counters_end,
        remap_pending=pending,
        remap_failure=failure,
        xid_counts=xids,
    )


def _remap_times(fault: dict[str, Any] | None) -> list[float]:
    if fault is None or fault["kind"] != "hbm":
        return []
    return [fault["onset_s"] + f * fault["lead_s"] for f, name in F.HBM_STAGES if name == "remap"]


def counters_vec(
    dev: Device, fault: dict[str, Any] | None, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counters [n, 3] = corrected, uncorrected, remapped total; remap pending; remap
    failure) at times ``t`` within one stretch between repairs: hardware.sim.faults'
    counters_at and stages, vectorized (tests check they agree)."""
    t = np.asarray(t, dtype=np.float64)
    base = dev.repaired_before(float(t.max())) if len(t) else 0.0
    rate = F.LEMON_SBE_PER_DAY if dev.lemon else F.BACKGROUND_SBE_PER_DAY
    phase = (dev.ordinal * 0.618034) % 1.0
    corrected = np.floor(np.maximum(t - base, 0.0) / DAY_S * rate + phase)
    remaps = np.zeros(len(t))
    if fault is not None and fault["kind"] == "hbm":
        progress = np.minimum(np.maximum((t - fault["onset_s"]) / fault["lead_s"], 0.0), 1.0)
        corrected += np.floor(F.HBM_CORRECTED_AT_FAILURE * progress**2)
        for rt in _remap_times(fault):
            remaps += t >= rt
    counters = np.stack([corrected, np.zeros(len(t)), remaps], axis=1)
    return counters, (remaps > 0).astype(np.float64), np.zeros(len(t))


def _xids(
    cfg: HistoryConfig,
    seg: Segment,
    fault: dict[str, Any] | None,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """XIDs per bucket by class (memory, bus, app, other): the remaps' XID 63, and
    application XIDs as noise the models must learn to ignore."""
    xids = np.zeros((n, 4))
    for rt in _remap_times(fault):
        k = int(math.ceil((rt - seg.t0_s) / BUCKET_S)) - 1
        if 0 <= k < n:
            xids[k, 0] += 1
    if cfg.app_xid_per_day > 0:
        xids[:, 2] += rng.poisson(cfg.app_xid_per_day * BUCKET_S / DAY_S, n)
    return xids


# -- splits --------------------------------------------------------------------------------


@dataclass
class SplitData:
    """One split: bucket rows, windows over them, the failures they hold, population sizes.

    Window arrays (one entry per window): ``end_row`` (row of its newest bucket in
    ``buckets``), ``t_end_s``, ``ttf_s`` (seconds from the window's end to the device's
    next failure in the segment; inf when none), ``seg`` (segment number), ``weight``
    (population windows it stands for). Segment arrays: ``seg_ordinal``, ``seg_kind``
    (0 incident, 1 background), ``seg_fault`` (row in the failure table or -1).
    Failure table: ``fail_ordinal``, ``fail_kind`` (class name), ``fail_s``, ``fail_onset_s``,
    ``fail_lemon``.
    """

    name: str
    buckets: np.ndarray
    end_row: np.ndarray
    t_end_s: np.ndarray
    ttf_s: np.ndarray
    seg: np.ndarray
    weight: np.ndarray
    seg_ordinal: np.ndarray
    seg_kind: np.ndarray
    seg_fault: np.ndarray
    fail_ordinal: np.ndarray
    fail_kind: np.ndarray
    fail_s: np.ndarray
    fail_onset_s: np.ndarray
    fail_lemon: np.ndarray
    device_days: float  # the split's devices x its time range, less repair downtime
    background_device_days: float  # of which away from incidents (what bg segments sample)
    sampled_background_device_days: float
    window: int

    def windows(self, idx: np.ndarray | None = None) -> np.ndarray:
        """[len(idx), window, F] float32 (all windows when idx is None)."""
        rows = self.end_row if idx is None else self.end_row[idx]
        offsets = np.arange(-self.window + 1, 1)
        return self.buckets[rows[:, None] + offsets[None, :]]

    def labels(self, horizon_s: float) -> np.ndarray:
        return ((self.ttf_s > 0) & (self.ttf_s <= horizon_s)).astype(np.float32)

    @property
    def n_windows(self) -> int:
        return len(self.end_row)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        out = {}
        for k, v in self.__dict__.items():
            if isinstance(v, np.ndarray):
                out[prefix + k] = v
        out[prefix + "scalars"] = np.array(
            [
                self.device_days,
                self.background_device_days,
                self.sampled_background_device_days,
                self.window,
            ],
            dtype=np.float64,
        )
        return out

    @classmethod
    def from_arrays(cls, name: str, z: Any, prefix: str) -> SplitData:
        kw = {
            k[len(prefix) :]: z[k]
            for k in z.files
            if k.startswith(prefix) and k != prefix + "scalars"
        }
        dd, bdd, sbdd, w = z[prefix + "scalars"]
        return cls(
            name=name,
            device_days=float(dd),
            background_device_days=float(bdd),
            sampled_background_device_days=float(sbdd),
            window=int(w),
            **kw,
        )


@dataclass
class History:
    config: HistoryConfig
    splits: dict[str, SplitData]
    stats: dict[str, Any]

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        for name, sp in self.splits.items():
            arrays.update(sp.to_arrays(f"{name}__"))
        meta = {
            "config": self.config.model_dump(mode="json"),
            "stats": self.stats,
            "version": HISTORY_VERSION,
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> History:
        with np.load(Path(path), allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("version") != HISTORY_VERSION:
                raise ValueError(
                    f"{path}: history version {meta.get('version')!r}, expected {HISTORY_VERSION}"
                )
            splits = {s: SplitData.from_arrays(s, z, f"{s}__") for s in SPLITS}
        return cls(HistoryConfig(**meta["config"]), splits, meta["stats"])


def _split_of_nodes(cfg: HistoryConfig) -> np.ndarray:
    """Split number (0 train, 1 val, 2 test) per node: a seeded shuffle."""
    order = np.random.default_rng(cfg.seed).permutation(cfg.nodes)
    n_train = max(1, round(cfg.nodes * cfg.node_fractions[0]))
    n_val = max(1, round(cfg.nodes * cfg.node_fractions[1]))
    out = np.full(cfg.nodes, 2, dtype=np.int64)
    out[order[:n_train]] = 0
    out[order[n_train : n_train + n_val]] = 1
    return out


def split_time_ranges(cfg: HistoryConfig) -> list[tuple[float, float]]:
    total = cfg.days * DAY_S
    edges = np.concatenate([[0.0], np.cumsum(cfg.time_fractions)]) * total
    return [(float(edges[i]), float(edges[i + 1])) for i in range(3)]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _align_down(t: float) -> float:
    return math.floor(t / BUCKET_S) * BUCKET_S


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
    node_split = _split_of_nodes(cfg)
    ranges = split_time_ranges(cfg)
    all_faults = [f for d in devices for f in d.faults]
    splits: dict[str, SplitData] = {}
    for si, name in enumerate(SPLITS):
        t0, t1 = ranges[si]
        devs = [d for d in devices if node_split[d.node_idx] == si]
        say(f"{name}: simulating incidents", 0.05 + 0.3 * si)
        splits[name] = _build_split(cfg, name, si, devs, t0, t1)
    stats = {
        "devices": len(devices),
        "nodes": cfg.nodes,
        "days": cfg.days,
        "failures": len(all_faults),
        "failures_by_class": _count_by(f.kind for f in all_faults),
        "lemons": sum(d.lemon for d in devices),
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


def _build_split(
    cfg: HistoryConfig, name: str, si: int, devs: list[Device], t0: float, t1: float
) -> SplitData:
    w = cfg.window
    warm = (w - 1) * BUCKET_S
    segments: list[Segment] = []
    faults: list[Fault] = []
    by_ordinal = {d.ordinal: d for d in devs}
    # Incidents: failures inside the split's time range.
    for d in devs:
        prev_repair = 0.0
        for f in d.faults:
            if t0 <= f.failure_s < t1:
                start = _align_down(max(f.incident_start_s(), prev_repair) - warm)
                start = max(start, _align_down(prev_repair))
                n = int((f.failure_s - start) // BUCKET_S)
                if n >= w:
                    faults.append(f)
                    segments.append(Segment(d.ordinal, start, n, "incident", f))
            prev_repair = f.repaired_s
    # Population: device-time in range, less repair downtime; background: less incidents.
    span = t1 - t0
    device_s = len(devs) * span
    background_s = device_s
    for d in devs:
        for f in d.faults:
            device_s -= _overlap(f.failure_s, f.repaired_s, t0, t1)
            background_s -= _overlap(f.incident_start_s(), f.repaired_s, t0, t1)
    # Background segments: random devices and times clear of incidents and downtime.
    seg_s = cfg.background_segment_s[si]
    n_bg = cfg.background_segments[si]
    rng = _rng(cfg.seed, "background", name)
    n_bucket = int(seg_s // BUCKET_S)
    placed = tries = 0
    while placed < n_bg and tries < n_bg * 50:
        tries += 1
        d = devs[rng.randrange(len(devs))]
        start = _align_down(rng.uniform(t0, t1 - seg_s))
        a, b = start - warm, start + n_bucket * BUCKET_S
        if any(_overlap(a, b, x, y) > 0 for x, y in d.blocked()):
            continue
        segments.append(Segment(d.ordinal, a, n_bucket + w - 1, "background"))
        placed += 1
    # Simulate every segment and lay out its windows.
    fault_row = {id(f): i for i, f in enumerate(faults)}
    bucket_parts: list[np.ndarray] = []
    end_rows, t_ends, ttfs, segs, kinds = [], [], [], [], []
    row = 0
    for si_, seg in enumerate(segments):
        b = simulate_segment(cfg, by_ordinal[seg.ordinal], seg)
        bucket_parts.append(b)
        k = np.arange(w - 1, seg.n)
        end_rows.append(row + k)
        t_end = seg.t0_s + (k + 1) * BUCKET_S
        t_ends.append(t_end)
        if seg.fault is not None:
            ttfs.append(seg.fault.failure_s - t_end)
        else:
            ttfs.append(np.full(len(k), np.inf))
        segs.append(np.full(len(k), si_))
        kinds.append(0 if seg.kind == "incident" else 1)
        row += seg.n
    buckets = (
        np.concatenate(bucket_parts).astype(np.float32)
        if bucket_parts
        else np.zeros((0, N_FEATURES), np.float32)
    )
    end_row = np.concatenate(end_rows) if end_rows else np.zeros(0, np.int64)
    seg_arr = np.concatenate(segs) if segs else np.zeros(0, np.int64)
    seg_kind = np.asarray(kinds, dtype=np.int64)
    is_bg = seg_kind[seg_arr] == 1 if len(seg_arr) else np.zeros(0, bool)
    sampled_bg_s = placed * n_bucket * BUCKET_S
    weight = np.ones(len(end_row), dtype=np.float64)
    if placed:
        weight[is_bg] = max(background_s, 0.0) / sampled_bg_s
    return SplitData(
        name=name,
        buckets=buckets,
        end_row=end_row.astype(np.int64),
        t_end_s=np.concatenate(t_ends) if t_ends else np.zeros(0),
        ttf_s=np.concatenate(ttfs) if ttfs else np.zeros(0),
        seg=seg_arr.astype(np.int64),
        weight=weight,
        seg_ordinal=np.asarray([s.ordinal for s in segments], dtype=np.int64),
        seg_kind=seg_kind,
        seg_fault=np.asarray(
            [fault_row[id(s.fault)] if s.fault is not None else -1 for s in segments],
            dtype=np.int64,
        ),
        fail_ordinal=np.asarray([f.ordinal for f in faults], dtype=np.int64),
        fail_kind=np.asarray([f.kind for f in faults], dtype="U24"),
        fail_s=np.asarray([f.failure_s for f in faults], dtype=np.float64),
        fail_onset_s=np.asarray([f.onset_s for f in faults], dtype=np.float64),
        fail_lemon=np.asarray([by_ordinal[f.ordinal].lemon for f in faults], dtype=bool),
        device_days=device_s / DAY_S,
        background_device_days=max(background_s, 0.0) / DAY_S,
        sampled_background_device_days=sampled_bg_s / DAY_S,
        window=w,
    )


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
