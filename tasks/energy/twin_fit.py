"""The twin's power and time under a power limit, fitted to a measured sweep (Zeus traces).

What is fitted (hardware.sim.physics and dvfs_model give the model): per SKU the voltage
curve's shape - V_min / V_max and the knee -, the static share of power and the cap
headroom; per workload its ``activity`` and ``memory_bound_ratio``. In units of the trace
GPU's maximum power limit P_ref and clock f_max (x = f / f_max, v = V / V_max):

    power(x) / P_ref = s + activity * (1 - s) * v(x)^2 * x
    T(x) / T(1)      = m + (1 - m) / x

Under a limit L the clock is the highest whose power fits under h * L (x = 1 when the
workload draws less at f_max); h, the cap headroom, is where a binding limit leaves the
measured average power. Least squares on log time ratio (to the workload's time at its
highest limit) and log average power, all points at once; the trace reports no clocks,
so several starts guard against the curve's weak identification. The fit works in ratios,
so its shape transfers to another board of the chip (the SXM2 V100 of the twin's table).

Errors are reported per workload class = network family (shufflenet, resnet, deepspeech,
ncf, bert): what sets a workload's character is its kernel mix, which is the network's;
the same BERT on squad and on sentiment140 runs the same GEMMs. Batch size is left inside
the class on purpose: it moves a network from host-bound to GPU-bound, and the class's
spread shows that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gpuflow.hardware.sim import physics
from gpuflow.hardware.sim.dvfs_model import (
    ESTIMATED_SHAPE,
    V_MAX_V,
    DvfsShape,
    shape_of,
    time_ratio,
)
from gpuflow.hardware.skus import SkuSpec, sku
from gpuflow.tasks.energy.traces import TracePoint, Workload, read_trace
from scipy.optimize import least_squares
from scipy.sparse import lil_matrix

TWIN_SKUS = ("v100", "a100-40gb", "h100", "h200")
FAMILIES = ("shufflenet", "resnet", "deepspeech", "ncf", "bert")
IDENTIFIED_BELOW = 0.97  # m is only seen where a traced limit pulls the clock below this
_STARTS = ((0.7, 0.3), (0.7, 0.6), (0.85, 0.6), (0.85, 0.8), (0.95, 0.3), (0.95, 0.6))
_NG = 4  # global parameters: r = V_min / V_max, knee, static share, cap headroom


@dataclass(frozen=True)
class TraceDevice:
    """The traced GPU, as the fit needs it: its limit at f_max and its clock range."""

    name: str
    power_max_limit_w: float
    sm_clock_min_mhz: int
    sm_clock_max_mhz: int


# The traced GPUs. Zeus swept every power limit each GPU allows (../shared/data/README.md),
# so the top traced limit is the board's maximum limit. Maximum SM clocks are the boost
# clocks of NVIDIA's datasheets; minimum SM clocks are estimates (nvidia-smi's lowest
# supported clock on these parts, not measured here). The fit only sees f_min / f_max, as
# the floor a limit can pull the clock to.
#
# V100: the trace's limits stop at 250 W, the top of a V100 PCIe's range (the SXM2 part goes
# to 300 W); clocks from NVIDIA's V100 PCIe datasheet (1380 MHz boost) and the SXM2 log (135).
V100_TRACE_DEVICE = TraceDevice("Tesla V100 250 W (Zeus trace)", 250.0, 135, 1380)
# A40: 300 W maximum board power and 1740 MHz boost (NVIDIA A40 datasheet); 210 MHz floor:
# estimate (the Ampere parts' idle clock, as on the A100 log of DESIGN.md section 4).
A40_TRACE_DEVICE = TraceDevice("NVIDIA A40 (Zeus trace)", 300.0, 210, 1740)
# Tesla P100 PCIe: 250 W and 1328 MHz boost (NVIDIA Tesla P100 PCIe datasheet); 544 MHz
# floor: estimate (the lowest graphics clock nvidia-smi lists for the P100).
P100_TRACE_DEVICE = TraceDevice("Tesla P100 PCIe (Zeus trace)", 250.0, 544, 1328)
# Quadro RTX 6000: 260 W is the top of the trace's limits; 1770 MHz boost (NVIDIA Quadro
# RTX 6000 datasheet); 300 MHz floor: estimate (Turing's idle clock).
RTX6000_TRACE_DEVICE = TraceDevice("Quadro RTX 6000 (Zeus trace)", 260.0, 300, 1770)
# By the <gpu> of summary_power_<gpu>.csv.
TRACE_DEVICES: dict[str, TraceDevice] = {
    "v100": V100_TRACE_DEVICE,
    "a40": A40_TRACE_DEVICE,
    "p100": P100_TRACE_DEVICE,
    "rtx6000": RTX6000_TRACE_DEVICE,
}


def workload_class(w: Workload) -> str:
    """The network family (see the module docstring); the network itself if unknown."""
    net = w.network.lower()
    return next((f for f in FAMILIES if net.startswith(f)), net)


@dataclass(frozen=True)
class WorkloadFit:
    workload: str  # Workload.name
    workload_class: str
    memory_bound_ratio: float
    activity: float
    identified: bool  # False: no traced limit slowed it, so its m is not seen at all


@dataclass(frozen=True)
class ClassError:
    """Absolute relative errors |model / measured - 1| over a class's trace points (time:
    the points below each workload's reference limit, which is exact by construction)."""

    workload_class: str
    workloads: int
    points: int
    time_median: float
    time_p90: float
    power_median: float
    power_p90: float


@dataclass(frozen=True)
class CapCheck:
    """One SKU at half its maximum power limit, against its own f_max."""

    sku: str
    shape: str  # "fitted" or "estimate"
    memory_bound_ratio: float
    activity: float
    limit_w: float
    clock_mhz: int
    time_ratio: float
    energy_ratio: float


@dataclass(frozen=True)
class FitReport:
    trace: str
    device: TraceDevice
    v_min_v: float
    v_max_v: float
    knee_ratio: float
    static_share: float  # P_static / P_ref of the traced GPU
    cap_headroom: float
    cost: float  # 0.5 * sum of squared log residuals
    points: int
    median_memory_bound_ratio: float  # over identified workloads
    median_activity: float  # over identified workloads
    trace_half_cap_time_ratio: float  # measured median at the limit nearest half P_ref
    trace_half_cap_energy_ratio: float
    workloads: tuple[WorkloadFit, ...]
    errors: tuple[ClassError, ...]  # per class, then "all"
    half_cap: tuple[CapCheck, ...]  # V100 before / after the fit, other SKUs (estimates)

    @property
    def shape(self) -> DvfsShape:
        return DvfsShape(
            self.v_min_v, self.v_max_v, self.knee_ratio, f"fit: {self.trace}", self.cap_headroom
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the model, vectorised over trace points -------------------------------------------------


def _v(x: np.ndarray, r: float, k: float) -> np.ndarray:
    return np.where(x <= k, r, r + (1.0 - r) * (x - k) / (1.0 - k))


def _g(x: np.ndarray, r: float, k: float) -> np.ndarray:
    v = _v(x, r, k)
    return v * v * x


def clock_ratio(
    limit_rel: np.ndarray, activity: np.ndarray, r: float, k: float, s: float, x_min: float
) -> np.ndarray:
    """Highest x in [x_min, 1] whose power fits ``limit_rel`` (x_min when none does)."""
    target = (limit_rel - s) / (activity * (1.0 - s))
    lo, hi = np.full_like(target, x_min), np.ones_like(target)
    for _ in range(52):  # bisection to double precision; g is increasing
        mid = 0.5 * (lo + hi)
        fits = _g(mid, r, k) <= target
        lo, hi = np.where(fits, mid, lo), np.where(fits, hi, mid)
    return np.where(_g(np.ones_like(target), r, k) <= target, 1.0, lo)


@dataclass(frozen=True)
class _Points:
    w: np.ndarray  # workload index per point
    limit_rel: np.ndarray
    ref: np.ndarray  # index of the workload's reference point (its highest limit)
    time_ratio: np.ndarray
    power_rel: np.ndarray


def _flatten(trace: dict[Workload, list[TracePoint]], dev: TraceDevice) -> _Points:
    w, lim, ref, tr, pw = [], [], [], [], []
    for i, points in enumerate(trace.values()):
        top = max(points)
        first = len(w)
        for p in points:
            w.append(i)
            lim.append(p.power_limit_w / dev.power_max_limit_w)
            ref.append(first + points.index(top))
            tr.append(p.time_per_epoch_s / top.time_per_epoch_s)
            pw.append(p.average_power_w / dev.power_max_limit_w)
    return _Points(*(np.asarray(a) for a in (w, lim, ref, tr, pw)))


def _predict(
    theta: np.ndarray, n: int, pts: _Points, x_min: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, k, s, h = theta[:_NG]
    a, m = theta[_NG : _NG + n][pts.w], theta[_NG + n :][pts.w]
    x = clock_ratio(h * pts.limit_rel, a, r, k, s, x_min)
    t = m + (1.0 - m) / x
    return x, t / t[pts.ref], s + a * (1.0 - s) * _g(x, r, k)


def _fit(pts: _Points, n: int, x_min: float) -> Any:
    timed = pts.ref != np.arange(len(pts.w))  # the reference point's time ratio is 1 by definition

    def residuals(theta: np.ndarray) -> np.ndarray:
        _, t, p = _predict(theta, n, pts, x_min)
        return np.concatenate([np.log(t[timed] / pts.time_ratio[timed]), np.log(p / pts.power_rel)])

    # Each workload's two parameters touch only its own residuals: a sparse Jacobian makes
    # the finite differences ~30 evaluations per step instead of 2n + 3.
    rows = np.concatenate([pts.w[timed], pts.w])
    sparsity = lil_matrix((len(rows), _NG + 2 * n), dtype=int)
    sparsity[:, :_NG] = 1
    for row, i in enumerate(rows):
        sparsity[row, _NG + i] = 1
        sparsity[row, _NG + n + i] = 1 if row < timed.sum() else 0  # power does not see m
    lower = np.r_[0.4, 0.05, 0.0, 0.7, np.full(n, 1e-3), np.zeros(n)]
    upper = np.r_[1.0, 0.95, 0.4, 1.0, np.ones(n), np.ones(n)]
    best = None
    for r0, k0 in _STARTS:
        theta0 = np.r_[r0, k0, 0.13, 0.95, np.full(n, 0.6), np.full(n, 0.3)]
        res = least_squares(residuals, theta0, bounds=(lower, upper), jac_sparsity=sparsity)
        if best is None or res.cost < best.cost:
            best = res
    return best, timed


def _abs_rel(log_residuals: np.ndarray) -> np.ndarray:
    return np.abs(np.expm1(log_residuals))


def _class_error(name: str, mask_t: np.ndarray, mask_p: np.ndarray, et, ep, nw: int) -> ClassError:
    return ClassError(
        workload_class=str(name),
        workloads=nw,
        points=int(mask_p.sum()),
        time_median=float(np.median(et[mask_t])),
        time_p90=float(np.percentile(et[mask_t], 90)),
        power_median=float(np.median(ep[mask_p])),
        power_p90=float(np.percentile(ep[mask_p], 90)),
    )


# -- the fitted twin, per SKU ---------------------------------------------------------------


def cap_check(
    s: SkuSpec, shape: DvfsShape, memory_bound_ratio: float, activity: float, share: float = 0.5
) -> CapCheck:
    """The twin's clock, time and energy ratio at ``share`` of the SKU's maximum limit.

    The clock is physics.decide's on a cool device at full load, so the shape's cap
    headroom applies as it does on the twin (and in the fit).
    """
    pm = physics.PowerModel.from_sku(s, shape)
    limit_mw = max(s.power_min_limit_mw, int(share * s.power_max_limit_mw))
    c = physics.Controls(
        load=1.0,
        power_limit_mw=limit_mw,
        ambient_c=25.0,
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w,
        activity=activity,
    )
    f = physics.decide(s, pm, c, 25.0).clock_mhz
    tr = time_ratio(f, s.sm_clock_max_mhz, memory_bound_ratio)
    e = pm.power_mw(f, 1.0, activity) * tr / pm.power_mw(s.sm_clock_max_mhz, 1.0, activity)
    return CapCheck(
        sku=s.name,
        shape="fitted" if shape.fitted else "estimate",
        memory_bound_ratio=memory_bound_ratio,
        activity=activity,
        limit_w=limit_mw / 1000.0,
        clock_mhz=f,
        time_ratio=tr,
        energy_ratio=e,
    )


def fit_twin(trace_path: str | Path, device: TraceDevice = V100_TRACE_DEVICE) -> FitReport:
    """Fit the voltage curve and every workload's character to a Zeus power trace."""
    trace = read_trace(trace_path)
    keys = list(trace)
    n = len(keys)
    pts = _flatten(trace, device)
    x_min = device.sm_clock_min_mhz / device.sm_clock_max_mhz
    res, timed = _fit(pts, n, x_min)
    theta = res.x
    r, k, s, h = (float(v) for v in theta[:_NG])
    x, _, _ = _predict(theta, n, pts, x_min)
    nt = int(timed.sum())
    et, ep = _abs_rel(res.fun[:nt]), _abs_rel(res.fun[nt:])
    classes = np.array([workload_class(keys[i]) for i in pts.w])
    fits = tuple(
        WorkloadFit(
            workload=w.name,
            workload_class=workload_class(w),
            memory_bound_ratio=float(theta[_NG + n + i]),
            activity=float(theta[_NG + i]),
            identified=bool(x[pts.w == i].min() < IDENTIFIED_BELOW),
        )
        for i, w in enumerate(keys)
    )
    errors = []
    for name in sorted(set(classes)):
        mask = classes == name
        nw = sum(f.workload_class == name for f in fits)
        errors.append(_class_error(name, mask[timed], mask, et, ep, nw))
    errors.append(_class_error("all", np.ones(nt, bool), np.ones(len(ep), bool), et, ep, n))
    ident = [f for f in fits if f.identified]
    m_med = float(np.median([f.memory_bound_ratio for f in ident]))
    a_med = float(np.median([f.activity for f in ident]))
    tr_half, e_half = _trace_half_cap(trace, {f.workload for f in ident})
    fitted = DvfsShape(r * V_MAX_V, V_MAX_V, k, f"fit: {Path(trace_path).name}", h)
    v100 = sku("v100")
    half = [
        cap_check(v100, ESTIMATED_SHAPE, 0.0, 1.0),  # the twin before: no workload character
        cap_check(v100, fitted, 0.0, 1.0),  # the fitted curve alone
        cap_check(v100, fitted, m_med, a_med),  # the fitted curve, a median workload
    ]
    half += [cap_check(sku(name), shape_of(sku(name).name), m_med, a_med) for name in TWIN_SKUS]
    return FitReport(
        trace=str(trace_path),
        device=device,
        v_min_v=r * V_MAX_V,
        v_max_v=V_MAX_V,
        knee_ratio=k,
        static_share=s,
        cap_headroom=h,
        cost=float(res.cost),
        points=len(pts.w),
        median_memory_bound_ratio=m_med,
        median_activity=a_med,
        trace_half_cap_time_ratio=tr_half,
        trace_half_cap_energy_ratio=e_half,
        workloads=fits,
        errors=tuple(errors),
        half_cap=tuple(half),
    )


def _trace_half_cap(
    trace: dict[Workload, list[TracePoint]], names: set[str]
) -> tuple[float, float]:
    """Median measured time and energy ratio at the limit nearest half the top limit."""
    tr, er = [], []
    for w, points in trace.items():
        if w.name not in names:
            continue
        top = max(points)
        half = min(points, key=lambda p: abs(p.power_limit_w - top.power_limit_w / 2))
        tr.append(half.time_per_epoch_s / top.time_per_epoch_s)
        er.append(half.energy_j / top.energy_j)
    return float(np.median(tr)), float(np.median(er))
