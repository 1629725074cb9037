"""The seed document's claim, checked: "holding the core clock near 1.2 GHz cut power per
TOPS by 42 %".

Power per unit of throughput is energy per unit of work: P(f) * T(f), so per epoch it is
time_per_epoch * average_power. Two checks:

* on the twin (``seed_claim_on_twin``): the SM clock locked at 1.2 GHz against the SKU's
  max clock, per SKU and workload character, with the twin's physics;
* on a measured trace (``seed_claim_on_trace``): the Zeus power-limit sweeps. The traces
  record no clocks, only power limits; the clock a limit holds is the one the twin fit
  (tasks.energy.twin_fit.fit_twin) gives that workload under that limit. Per workload the
  limit whose fitted clock is nearest 1.2 GHz is compared with the highest traced limit.

``verdict_rows`` folds both into one row per SKU that a CLI prints.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gpuflow.hardware.sim import physics
from gpuflow.hardware.sim.dvfs_model import time_ratio
from gpuflow.hardware.skus import SkuSpec, sku
from gpuflow.tasks.energy.traces import read_trace
from gpuflow.tasks.energy.twin_fit import (
    TRACE_DEVICES,
    TWIN_SKUS,
    V100_TRACE_DEVICE,
    FitReport,
    TraceDevice,
    clock_ratio,
    fit_twin,
)

SEED_CLOCK_MHZ = 1200
SEED_CLAIM_PCT = -42.0


# -- on the twin ----------------------------------------------------------------------------


def _locked_point(
    s: SkuSpec, pm: physics.PowerModel, f_mhz: int, m: float, activity: float
) -> tuple[int, float, float]:
    """(clock, power mW, time ratio) of full load with the SM clock locked at ``f_mhz``."""
    c = physics.Controls(
        load=1.0,
        power_limit_mw=s.power_default_limit_mw,
        ambient_c=25.0,
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w,
        locked_min_mhz=f_mhz,
        locked_max_mhz=f_mhz,
        activity=activity,
    )
    op = physics.decide(s, pm, c, 25.0)  # a cool device: no thermal throttling
    return op.clock_mhz, op.power_mw, time_ratio(op.clock_mhz, s.sm_clock_max_mhz, m)


def seed_claim_on_twin(
    clock_mhz: int = SEED_CLOCK_MHZ,
    memory_bound_ratios: tuple[float, ...] = (0.1, 0.6),
    activity: float = 1.0,
) -> list[dict[str, Any]]:
    """The seed's "~1.2 GHz cut power per TOPS by 42 %" on the twin, per SKU and workload.

    Power per unit of throughput is energy per unit of work: P(f) * T(f). Each row compares
    the SM clock locked at ``clock_mhz`` with the SKU's max clock, at the default power
    limit and a cool device; the best clock is the twin's own optimum over 15 MHz steps.
    (At the default limit the power cap may still hold the "max" clock lower: the row's
    ``max_clock_mhz`` is the clock the twin actually runs.)
    """
    rows = []
    for name in TWIN_SKUS:
        s = sku(name)
        pm = physics.PowerModel.from_sku(s)
        fmax = s.sm_clock_max_mhz
        for m in memory_bound_ratios:
            f_hi, p_hi, t_hi = _locked_point(s, pm, fmax, m, activity)
            f_lo, p_lo, t_lo = _locked_point(s, pm, clock_mhz, m, activity)
            ratio = (p_lo * t_lo) / (p_hi * t_hi)
            sweep = [
                _locked_point(s, pm, f, m, activity)
                for f in range(s.sm_clock_min_mhz, fmax + 1, 15)
            ]
            best = min(sweep, key=lambda q: q[1] * q[2])
            best_ratio = best[1] * best[2] / (p_hi * t_hi)
            rows.append(
                {
                    "sku": s.name,
                    "shape": "fitted" if pm.shape.fitted else "estimate",
                    "memory_bound_ratio": m,
                    "activity": activity,
                    "clock_mhz": f_lo,
                    "max_clock_mhz": f_hi,
                    "power_ratio": p_lo / p_hi,
                    "time_ratio": t_lo / t_hi,
                    "power_per_throughput_ratio": ratio,
                    "change_pct": 100.0 * (ratio - 1.0),
                    "seed_claim_pct": SEED_CLAIM_PCT,
                    "best_clock_mhz": best[0],
                    "best_power_per_throughput_ratio": best_ratio,
                    "best_change_pct": 100.0 * (best_ratio - 1.0),
                }
            )
    return rows


# -- on a measured trace --------------------------------------------------------------------


class TraceClaim(NamedTuple):
    """``rows``: one dict per workload; ``summary``: the claim over all of them."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]


def fitted_clocks_mhz(fit: FitReport, activity: float, limits_w: Iterable[float]) -> list[float]:
    """The clock the fit gives a workload of ``activity`` under each power limit (MHz).

    The traces record no clocks: this is the fit's clock (twin_fit.clock_ratio with the
    fitted curve, static share and cap headroom), not a measurement.
    """
    dev = fit.device
    lim = np.asarray([float(w) for w in limits_w]) / dev.power_max_limit_w
    x = clock_ratio(
        fit.cap_headroom * lim,
        np.full_like(lim, activity),
        fit.v_min_v / fit.v_max_v,
        fit.knee_ratio,
        fit.static_share,
        dev.sm_clock_min_mhz / dev.sm_clock_max_mhz,
    )
    return [float(v) * dev.sm_clock_max_mhz for v in x]


def seed_claim_on_trace(
    trace_path: str | Path,
    device: TraceDevice = V100_TRACE_DEVICE,
    clock_mhz: int = SEED_CLOCK_MHZ,
    fit: FitReport | None = None,
) -> TraceClaim:
    """The seed's claim on a Zeus power trace, per workload and in summary.

    The traces record no clocks: a limit's clock is the one ``fit_twin`` (over this trace,
    with ``device``) gives the workload there; pass ``fit`` to reuse one. Per workload the
    traced limit whose fitted clock is nearest ``clock_mhz`` is chosen (on a tie, the
    higher limit: equal fitted clocks say the lower one buys nothing), and its measured
    energy per epoch (= power per unit of throughput) is compared with the highest limit's:
    ``change_pct``. ``best_change_pct`` is the lowest-energy traced limit's change. The
    summary gives the median change, the share of workloads reaching the claimed -42 %,
    and the median best change.
    """
    trace = read_trace(trace_path)
    fit = fit if fit is not None else fit_twin(trace_path, device)
    by_name = {w.workload: w for w in fit.workloads}
    rows = []
    for w, points in trace.items():
        wf = by_name[w.name]
        clocks = fitted_clocks_mhz(fit, wf.activity, [p.power_limit_w for p in points])
        top = max(points)
        i = min(
            range(len(points)),
            key=lambda j: (abs(clocks[j] - clock_mhz), -points[j].power_limit_w),
        )
        chosen = points[i]
        j_best = min(range(len(points)), key=lambda j: points[j].energy_j)
        best = points[j_best]
        change = 100.0 * (chosen.energy_j / top.energy_j - 1.0)
        rows.append(
            {
                "workload": w.name,
                "workload_class": wf.workload_class,
                "identified": wf.identified,
                "top_limit_w": top.power_limit_w,
                "top_clock_mhz": clocks[points.index(top)],
                "limit_w": chosen.power_limit_w,
                "clock_mhz": clocks[i],
                "power_ratio": chosen.average_power_w / top.average_power_w,
                "time_ratio": chosen.time_per_epoch_s / top.time_per_epoch_s,
                "energy_ratio": chosen.energy_j / top.energy_j,
                "change_pct": change,
                "reaches_claim": change <= SEED_CLAIM_PCT,
                "best_limit_w": best.power_limit_w,
                "best_clock_mhz": clocks[j_best],
                "best_change_pct": 100.0 * (best.energy_j / top.energy_j - 1.0),
            }
        )
    changes = [r["change_pct"] for r in rows]
    summary = {
        "trace": str(trace_path),
        "device": device.name,
        "clock_mhz": clock_mhz,
        "clock_source": "fit (the trace records no clocks)",
        "workloads": len(rows),
        "median_change_pct": statistics.median(changes),
        "share_reaching_claim": sum(r["reaches_claim"] for r in rows) / len(rows),
        "median_best_change_pct": statistics.median(r["best_change_pct"] for r in rows),
        "median_clock_mhz": statistics.median(r["clock_mhz"] for r in rows),
        "seed_claim_pct": SEED_CLAIM_PCT,
    }
    return TraceClaim(rows, summary)


# -- the verdict, one row per SKU -----------------------------------------------------------


def _verdict(median_change_pct: float, share: float) -> str:
    if share >= 0.5:
        return "holds"
    if median_change_pct < 0:
        return f"saves less ({median_change_pct:+.0f} % median, claim {SEED_CLAIM_PCT:+.0f} %)"
    return f"does not hold ({median_change_pct:+.0f} % median)"


def verdict_rows(
    twin_rows: list[dict[str, Any]] | None = None,
    trace_claims: Mapping[str, TraceClaim] | None = None,
) -> list[dict[str, Any]]:
    """One row per SKU, twin first then traces: median change at ~1.2 GHz, the share of
    workloads (twin: of the characters tried) reaching -42 %, the median best change, and
    a verdict ("holds" when at least half reach it). Columns are the same for every row,
    ready for a table."""
    out = []
    by_sku: dict[str, list[dict[str, Any]]] = {}
    for r in twin_rows or []:
        by_sku.setdefault(r["sku"], []).append(r)
    for name, rows in by_sku.items():
        med = statistics.median(r["change_pct"] for r in rows)
        share = sum(r["change_pct"] <= SEED_CLAIM_PCT for r in rows) / len(rows)
        out.append(
            {
                "source": "twin",
                "gpu": name,
                "clock": f"locked {rows[0]['clock_mhz']} MHz ({rows[0]['shape']} curve)",
                "cases": len(rows),
                "median_change_pct": med,
                "share_reaching_claim": share,
                "median_best_change_pct": statistics.median(r["best_change_pct"] for r in rows),
                "verdict": _verdict(med, share),
            }
        )
    for gpu, claim in (trace_claims or {}).items():
        s = claim.summary
        out.append(
            {
                "source": "trace",
                "gpu": f"{gpu}: {s['device']}",
                "clock": f"limit nearest {s['clock_mhz']} MHz (fitted clock)",
                "cases": s["workloads"],
                "median_change_pct": s["median_change_pct"],
                "share_reaching_claim": s["share_reaching_claim"],
                "median_best_change_pct": s["median_best_change_pct"],
                "verdict": _verdict(s["median_change_pct"], s["share_reaching_claim"]),
            }
        )
    return out


def seed_claim_report(traces_dir: str | Path | None) -> list[dict[str, Any]]:
    """verdict_rows over the twin and every ``summary_power_<gpu>.csv`` in ``traces_dir``
    whose <gpu> has a TraceDevice (None: the twin only)."""
    claims: dict[str, TraceClaim] = {}
    if traces_dir is not None:
        for gpu, dev in TRACE_DEVICES.items():
            path = Path(traces_dir) / f"summary_power_{gpu}.csv"
            if path.exists():
                claims[gpu] = seed_claim_on_trace(path, dev)
    return verdict_rows(seed_claim_on_twin(), claims)
