"""Hard isolation on the twin: tenant interruptions under software sharing vs partitions.

The seed (section 2.1) claims that hard isolation "cuts multi-tenant failures by 82 %".
This study asks the twin what that figure depends on. GPUs each carry ``tenants`` tenants
for a horizon; two kinds of fatal events happen to them:

* device faults, drawn from the twin's hazard model (hardware.sim.hazard: its rate, class
  mix, lemons and repeat offenders, unchanged);
* application fatal errors of one tenant (XID 13, 31, 43, 45, 68, 109: illegal address,
  MMU fault, ...), a Poisson stream per tenant at a rate that is an ASSUMPTION:
  ``app_fatal_ratio`` times the device-fault rate per GPU-day the twin realizes on the
  same fleets (lemons and repeat offenders included: 2.2-2.5x the fresh-fleet rate over
  a year at the defaults), so the ratio means what the Llama 3 anchor below means.

Who an event interrupts (DESIGN.md section 4, "Sharing semantics"; NVIDIA's MPS, MIG and
A100 error-containment documentation; the same rules as hardware.sim.workloads):

==========================  ===========================  ==========================
event                       software sharing (MPS)       hard partitions (MIG/vDCU)
==========================  ===========================  ==========================
application fatal error     every tenant of the GPU      the tenant's own instance
contained ECC (XID 94)      every tenant of the GPU      the instance that hit it
other device faults         every tenant of the GPU      every tenant of the GPU
==========================  ===========================  ==========================

"Software sharing" is the shared-context case (MPS: its clients share one server context,
so a fatal exception reaches all of them); DESIGN.md puts HAMi-style slicing with it. Plain
time-slicing keeps one CUDA context per process, so application faults are expected to
stay in their context there: for it (a) would be an upper bound (scripts/isolation_check.py
--timeslice checks that on a real GPU; not run yet). Device faults are XID 79 (off the bus: GSP, faulty GPU), SRAM double-
bit errors (XID 48), thermal shutdowns, and HBM failures ending in XID 48/95/64; an HBM
failure ending in XID 94 is the contained one (its share: the twin's final-XID weights). A
vDCU reports no 94/95 (hardware.sim.faults.sku_final_xid): set ``contained_in_partition``
False for it.

Why a ratio: with d device faults per GPU-day, a share c of them contained, and r·d
application errors per tenant-day, N tenants per GPU see, per GPU-day,

    shared:       N·d + N·(N·r·d)                (every event reaches all N)
    partitioned:  N·d·(1 - c) + c·d + N·r·d      (contained and app errors reach one)

so the reduction 1 - partitioned/shared depends on N, r and c only, and is below
1 - 1/N whatever r is (50 % for 2 tenants, 75 % for 4, 85.7 % for 7).

The default ``app_fatal_ratio`` 0.225 is the only published anchor found: Llama 3 405B's
interruptions were 12.9 % software vs 57.3 % device-attributable (DESIGN.md section 4). It
counts a software failure once for a 16k-GPU job, so per tenant of a shared inference or
development GPU the true ratio is likely higher: the study sweeps it over 0..64.

Repairs and downtime are ignored: a tenant on a failed GPU could not fail again until the
GPU is back, so both modes are slightly overcounted (not measured here; at about one
device fault per 1,000 GPU-days the time spent failed is a small share, lemons aside).
Plain time-slicing also differs on XID 94: Ampere and later contain it per application
even without MIG (NVIDIA's A100 error-containment documentation).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from gpuflow.hardware.placement import MIG_COMPUTE_SLICES
from gpuflow.hardware.sim.hazard import (
    DAY_S,
    HBM_FINAL_WEIGHTS,
    HBM_FINAL_XIDS,
    LLAMA3_DEVICE_SHARE,
    HazardModel,
    fleet_schedule,
)

SHARED = "shared"  # software sharing, one context space: MPS (DESIGN.md puts HAMi here)
PARTITIONED = "partitioned"  # hard partitions: MIG instances, vDCUs
MODES = (SHARED, PARTITIONED)

# Event scopes: what an event can reach at most.
DEVICE = "device"  # the whole GPU, whatever the partitioning
CONTAINED = "contained"  # contained ECC error (XID 94): the partition that hit it
CONTEXT = "context"  # an application's fatal error: its own context / instance

CONTAINED_XID = 94
APP_FATAL_XIDS = (13, 31, 43, 45, 68, 109)  # NVIDIA's application errors (DESIGN.md 4)

# Llama 3 405B: software 12.9 % of interruptions vs 57.3 % device-attributable.
LLAMA3_SOFTWARE_SHARE = 0.129
LLAMA3_SOFTWARE_RATIO = LLAMA3_SOFTWARE_SHARE / LLAMA3_DEVICE_SHARE  # ~0.225

SEED_CLAIM = 0.82  # "hard isolation cut multi-tenant failures by 82 %" (seed section 2.1)
TENANT_SWEEP = (2, 4, 7)
RATIO_SWEEP = (0.0, LLAMA3_SOFTWARE_RATIO, 1.0, 4.0, 16.0, 64.0)


@dataclass(frozen=True)
class IsolationConfig:
    """One study: a fleet of GPUs shared by ``tenants`` tenants for ``horizon_days``."""

    tenants: int = 2
    n_gpus: int = 512
    horizon_days: float = 365.0
    # ASSUMPTION: application fatal errors per tenant-day / device faults per GPU-day (as
    # realized on the study's fleets).
    app_fatal_ratio: float = LLAMA3_SOFTWARE_RATIO
    # MIG contains XID 94 in the instance (A100 error containment); False: a vDCU's parts
    # report no 94, every uncorrectable error takes the device.
    contained_in_partition: bool = True
    hazard: HazardModel = field(default_factory=HazardModel)

    def __post_init__(self) -> None:
        if isinstance(self.tenants, bool) or not isinstance(self.tenants, int):
            raise ValueError(f"tenants must be an integer, got {self.tenants!r}")
        if not 1 <= self.tenants <= MIG_COMPUTE_SLICES:
            raise ValueError(
                f"tenants {self.tenants} must be in [1, {MIG_COMPUTE_SLICES}] "
                "(a MIG GPU has at most that many instances, one tenant each)"
            )
        if isinstance(self.n_gpus, bool) or not isinstance(self.n_gpus, int) or self.n_gpus < 1:
            raise ValueError(f"n_gpus must be an integer >= 1, got {self.n_gpus!r}")
        if not _finite(self.horizon_days) or self.horizon_days <= 0:
            raise ValueError(f"horizon_days must be a finite number > 0, got {self.horizon_days!r}")
        if not _finite(self.app_fatal_ratio) or self.app_fatal_ratio < 0:
            raise ValueError(
                f"app_fatal_ratio must be a finite number >= 0, got {self.app_fatal_ratio!r}"
            )

    def nominal_device_rate(self) -> float:
        """The hazard model's fresh-fleet device-fault rate per GPU-day (before repeats)."""
        return self.hazard.mean_device_rate_per_day()

    def tenant_days(self) -> float:
        return self.n_gpus * self.tenants * self.horizon_days


def mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): a t interval of the mean over seeds (one seed: no interval)."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    m = float(v.mean())
    if len(v) < 2 or float(v.std()) == 0.0:
        return m, m, m
    lo, hi = stats.t.interval(level, len(v) - 1, loc=m, scale=stats.sem(v))
    return m, float(lo), float(hi)


def reduction_ci(
    base: np.ndarray, other: np.ndarray, level: float = 0.95
) -> tuple[float, float, float]:
    """1 - mean(other)/mean(base) with a paired percentile bootstrap interval over seeds."""
    from scipy import stats

    b, o = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    if b.sum() <= 0:
        return math.nan, math.nan, math.nan
    point = float(1.0 - o.mean() / b.mean())
    if len(b) < 2:
        return point, point, point

    def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return 1.0 - y.mean(axis=axis) / x.mean(axis=axis)

    with warnings.catch_warnings():
        # Every resample giving the same ratio (e.g. a fixed share of events contained) is
        # an interval of zero width, not a problem.
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(
            (b, o),
            ratio,
            paired=True,
            vectorized=True,
            confidence_level=level,
            method="percentile",
            n_resamples=2000,
            rng=np.random.default_rng(0),
        )
    lo, hi = res.confidence_interval
    return point, float(lo), float(hi)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class DeviceEvent:
    """A device fault of the twin, as it reaches the tenants: when, which GPU, its class."""

    gpu: int
    time_s: float
    kind: str  # hazard class (hbm, thermal, xid79, ecc-uncorrectable)
    xid: int
    scope: str  # DEVICE or CONTAINED


@dataclass(frozen=True)
class Events:
    """One seed's fatal events: device faults and per-tenant application errors."""

    device: tuple[DeviceEvent, ...]
    app_gpu: np.ndarray  # one entry per application fatal error: its GPU,
    app_tenant: np.ndarray  # the tenant it started in,
    app_time_s: np.ndarray  # and when


def device_scope(xid: int, contained_in_partition: bool = True) -> str:
    """Scope of a device fault that ends with ``xid``."""
    return CONTAINED if xid == CONTAINED_XID and contained_in_partition else DEVICE


def interrupted(scope: str, tenants: int, mode: str) -> int:
    """How many of a GPU's ``tenants`` one event of ``scope`` interrupts under ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if scope not in (DEVICE, CONTAINED, CONTEXT):
        raise ValueError(f"scope must be device, contained or context, got {scope!r}")
    if mode == SHARED or scope == DEVICE:
        return tenants  # one shared context, or the whole GPU gone
    return 1  # a partition keeps it inside the instance that hit it


def draw_device_events(cfg: IsolationConfig, seed: int) -> tuple[DeviceEvent, ...]:
    """The twin's device faults on ``cfg.n_gpus`` GPUs, failing within the horizon."""
    horizon_s = cfg.horizon_days * DAY_S
    _lemons, schedule = fleet_schedule(seed, cfg.n_gpus, cfg.hazard, horizon_s)
    out = [
        DeviceEvent(
            gpu,
            d.failure_s,
            d.kind,
            d.final_xid,
            device_scope(d.final_xid, cfg.contained_in_partition),
        )
        for gpu, draws in schedule.items()
        for d in draws
        if d.failure_s < horizon_s
    ]
    return tuple(sorted(out, key=lambda e: (e.time_s, e.gpu)))


def realized_device_rate(cfg: IsolationConfig, device: list[tuple[DeviceEvent, ...]]) -> float:
    """Device faults per GPU-day the twin drew over the fleets ``device`` (one per seed):
    the fresh-fleet rate plus what lemons and repeat offenders add."""
    if not device:
        raise ValueError("realized_device_rate needs at least one fleet's events")
    return sum(len(d) for d in device) / (len(device) * cfg.n_gpus * cfg.horizon_days)


def draw_app_events(
    cfg: IsolationConfig, seed: int, device_rate: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gpu, tenant, time_s) of every application fatal error: a Poisson stream per tenant
    at ``cfg.app_fatal_ratio`` x ``device_rate`` (device faults per GPU-day)."""
    if not _finite(device_rate) or device_rate < 0:
        raise ValueError(f"device_rate must be a finite number >= 0, got {device_rate!r}")
    rng = np.random.default_rng([seed, cfg.tenants, cfg.n_gpus, round(cfg.app_fatal_ratio * 1e6)])
    horizon_s = cfg.horizon_days * DAY_S
    lam = cfg.app_fatal_ratio * device_rate * cfg.horizon_days
    counts = rng.poisson(lam, cfg.n_gpus * cfg.tenants)
    owner = np.repeat(np.arange(cfg.n_gpus * cfg.tenants), counts)
    return owner // cfg.tenants, owner % cfg.tenants, rng.uniform(0.0, horizon_s, len(owner))


def tenant_interruptions(events: Events, tenants: int, mode: str) -> int:
    """Tenant interruptions the events cause on GPUs of ``tenants`` tenants under ``mode``."""
    total = sum(interrupted(e.scope, tenants, mode) for e in events.device)
    return total + len(events.app_gpu) * interrupted(CONTEXT, tenants, mode)


def multi_tenant_incidents(events: Events, tenants: int, mode: str) -> int:
    """Events that interrupt two tenants or more (another reading of "multi-tenant
    failures": incidents that reach beyond the tenant that caused them)."""
    device = sum(1 for e in events.device if interrupted(e.scope, tenants, mode) >= 2)
    app = len(events.app_gpu) if interrupted(CONTEXT, tenants, mode) >= 2 else 0
    return device + app


@dataclass(frozen=True)
class StudyResult:
    """Per-seed figures of one configuration, and their summary with 95 % intervals."""

    cfg: IsolationConfig
    seeds: int
    device_rate: float  # realized device faults per GPU-day (all seeds)
    per_1000: dict[str, np.ndarray]  # mode -> tenant interruptions per 1,000 tenant-days
    incidents: dict[str, np.ndarray]  # mode -> multi-tenant incidents per seed
    device_events: np.ndarray  # per seed
    app_events: np.ndarray  # per seed

    def summary(self) -> dict[str, float]:
        row: dict[str, float] = {}
        for mode in MODES:
            row[mode], row[f"{mode}_lo"], row[f"{mode}_hi"] = mean_ci(self.per_1000[mode])
        row["reduction"], row["reduction_lo"], row["reduction_hi"] = reduction_ci(
            self.per_1000[SHARED], self.per_1000[PARTITIONED]
        )
        (
            row["incident_reduction"],
            row["incident_reduction_lo"],
            row["incident_reduction_hi"],
        ) = reduction_ci(self.incidents[SHARED], self.incidents[PARTITIONED])
        row["device_events"] = float(self.device_events.mean())
        row["app_events"] = float(self.app_events.mean())
        row["device_rate_per_1000_gpu_days"] = 1000.0 * self.device_rate
        row["app_rate_per_1000_tenant_days"] = 1000.0 * self.cfg.app_fatal_ratio * self.device_rate
        c = contained_share(self.cfg)
        row["expected_reduction"] = expected_reduction(
            self.cfg.tenants, self.cfg.app_fatal_ratio, c
        )
        row["expected_incident_reduction"] = expected_incident_reduction(
            self.cfg.tenants, self.cfg.app_fatal_ratio, c
        )
        return row


def run_study(
    cfg: IsolationConfig,
    seeds: int,
    first_seed: int = 1,
    device_cache: dict[int, tuple[DeviceEvent, ...]] | None = None,
) -> StudyResult:
    """``seeds`` independent fleets; ``device_cache`` (seed -> device events) lets a sweep
    over tenants and ratios on the same fleets reuse the twin's draws."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    cache = {} if device_cache is None else device_cache
    ids = range(first_seed, first_seed + seeds)
    for seed in ids:
        if seed not in cache:
            cache[seed] = draw_device_events(cfg, seed)
    # The ratio is to device faults as the twin realizes them, as the Llama 3 anchor is.
    rate = realized_device_rate(cfg, [cache[s] for s in ids])
    per = {m: np.zeros(seeds) for m in MODES}
    inc = {m: np.zeros(seeds) for m in MODES}
    dev_n, app_n = np.zeros(seeds), np.zeros(seeds)
    for i, seed in enumerate(ids):
        events = Events(cache[seed], *draw_app_events(cfg, seed, rate))
        for mode in MODES:
            n = tenant_interruptions(events, cfg.tenants, mode)
            per[mode][i] = 1000.0 * n / cfg.tenant_days()
            inc[mode][i] = multi_tenant_incidents(events, cfg.tenants, mode)
        dev_n[i], app_n[i] = len(events.device), len(events.app_gpu)
    return StudyResult(cfg, seeds, rate, per, inc, dev_n, app_n)


def sweep(
    base: IsolationConfig,
    seeds: int,
    tenants: tuple[int, ...] = TENANT_SWEEP,
    ratios: tuple[float, ...] = RATIO_SWEEP,
) -> dict[tuple[int, float], dict[str, float]]:
    """(tenants, app_fatal_ratio) -> summary, on the same fleets (seeds) throughout."""
    cache: dict[int, tuple[DeviceEvent, ...]] = {}
    return {
        (n, r): run_study(
            dataclasses.replace(base, tenants=n, app_fatal_ratio=r), seeds, device_cache=cache
        ).summary()
        for n in tenants
        for r in ratios
    }


# -- the closed form (module docstring) and the verdict ---------------------------------------


def contained_share(cfg: IsolationConfig) -> float:
    """Share of device faults a partition contains: HBM failures ending in XID 94."""
    if not cfg.contained_in_partition:
        return 0.0
    p94 = HBM_FINAL_WEIGHTS[HBM_FINAL_XIDS.index(CONTAINED_XID)] / sum(HBM_FINAL_WEIGHTS)
    return cfg.hazard.class_mix()["hbm"] * p94


def expected_reduction(tenants: int, ratio: float, contained: float) -> float:
    """1 - partitioned/shared interruptions in expectation (module docstring)."""
    n = tenants
    shared = n + n * n * ratio
    parted = n * (1.0 - contained) + contained + n * ratio
    return 1.0 - parted / shared


def reduction_ceiling(tenants: int) -> float:
    """The reduction as application errors dominate (ratio -> infinity): 1 - 1/N."""
    return 1.0 - 1.0 / tenants


def expected_incident_reduction(tenants: int, ratio: float, contained: float) -> float:
    """1 - partitioned/shared multi-tenant incidents: 1 - (1 - c)/(1 + N·r); nan for one
    tenant (no event reaches two)."""
    if tenants < 2:
        return float("nan")
    return 1.0 - (1.0 - contained) / (1.0 + tenants * ratio)


def ratio_needed(tenants: int, target: float, contained: float) -> float | None:
    """The smallest app_fatal_ratio at which the expected reduction reaches ``target``;
    None when no ratio does (the reduction stays below 1 - 1/N)."""
    n, keep = tenants, 1.0 - target
    if expected_reduction(n, 0.0, contained) >= target:
        return 0.0
    denom = keep * n * n - n  # > 0 exactly when 1 - 1/N > target
    if denom <= 0:
        return None
    return (n * (1.0 - contained) + contained - keep * n) / denom


def incident_ratio_needed(tenants: int, target: float, contained: float) -> float | None:
    """The same for multi-tenant incidents (1 - (1 - c)/(1 + N·r)); None for one tenant."""
    if tenants < 2:
        return None
    need = (1.0 - contained) / (1.0 - target) - 1.0
    return max(need / tenants, 0.0)
