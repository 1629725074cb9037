"""The seed's "~1.2 GHz cut power per TOPS by 42 %" on the twin and on the Zeus V100 sweep
(tasks/energy/seed_claim.py), recomputed here from the trace and the physics directly."""

from __future__ import annotations

import math
import statistics

import pytest
from gpuflow.hardware.sim import physics
from gpuflow.hardware.skus import sku
from gpuflow.tasks.energy.seed_claim import (
    SEED_CLAIM_PCT,
    TraceClaim,
    seed_claim_on_trace,
    seed_claim_on_twin,
    verdict_rows,
)
from gpuflow.tasks.energy.traces import read_trace
from gpuflow.tasks.energy.twin_fit import TWIN_SKUS, V100_TRACE_DEVICE, FitReport

from tests.helpers.traces import V100

needs_trace = pytest.mark.skipif(not V100.exists(), reason=f"no Zeus trace at {V100}")


@pytest.fixture(scope="module")
def claim(fit: FitReport) -> TraceClaim:
    return seed_claim_on_trace(V100, V100_TRACE_DEVICE, fit=fit)


def _fitted_clock(fit: FitReport, activity: float, limit_w: float) -> float:
    """The clock (MHz) the fit's model gives under a limit, by bisection on its power."""
    dev = fit.device
    fmin, fmax = dev.sm_clock_min_mhz, dev.sm_clock_max_mhz
    s = fit.static_share

    def power_rel(f: float) -> float:
        v = fit.shape.voltage_v(f, fmax) / fit.v_max_v
        return s + activity * (1 - s) * v * v * f / fmax

    cap = fit.cap_headroom * limit_w / dev.power_max_limit_w
    if power_rel(fmax) <= cap:
        return float(fmax)
    lo, hi = float(fmin), float(fmax)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if power_rel(mid) <= cap else (lo, mid)
    return lo


@needs_trace
def test_one_row_per_workload_and_a_median_recomputed_from_the_trace(
    fit: FitReport, claim: TraceClaim
) -> None:
    trace = read_trace(V100)
    rows, summary = claim
    assert [r["workload"] for r in rows] == [w.name for w in trace]
    assert summary["workloads"] == len(rows) == 68
    activity = {w.workload: w.activity for w in fit.workloads}
    changes, best = [], []
    for (w, points), row in zip(trace.items(), rows, strict=True):
        top = max(points, key=lambda p: p.power_limit_w)
        # The chosen limit: its fitted clock is nearest 1.2 GHz (ties: the higher limit).
        clocks = {
            p.power_limit_w: _fitted_clock(fit, activity[w.name], p.power_limit_w) for p in points
        }
        nearest = min(abs(c - 1200) for c in clocks.values())
        tied = [lim for lim, c in clocks.items() if abs(abs(c - 1200) - nearest) < 0.5]
        assert row["limit_w"] == max(tied), w.name
        assert row["clock_mhz"] == pytest.approx(clocks[row["limit_w"]], abs=0.5)
        (chosen,) = [p for p in points if p.power_limit_w == row["limit_w"]]
        e_top = top.time_per_epoch_s * top.average_power_w
        e = chosen.time_per_epoch_s * chosen.average_power_w
        changes.append(100.0 * (e / e_top - 1.0))
        best.append(
            100.0 * (min(p.time_per_epoch_s * p.average_power_w for p in points) / e_top - 1)
        )
        assert row["change_pct"] == pytest.approx(changes[-1])
        assert row["top_limit_w"] == 250.0
    median = statistics.median(changes)
    assert math.isfinite(median)
    assert summary["median_change_pct"] == pytest.approx(median)
    assert summary["median_best_change_pct"] == pytest.approx(statistics.median(best))
    reaching = sum(c <= SEED_CLAIM_PCT for c in changes) / len(changes)
    assert summary["share_reaching_claim"] == pytest.approx(reaching)
    assert summary["median_best_change_pct"] <= summary["median_change_pct"]
    assert "no clocks" in summary["clock_source"]


@needs_trace
def test_the_chosen_clocks_are_near_the_seed_clock(claim: TraceClaim) -> None:
    rows, summary = claim
    slowed = [r for r in rows if r["clock_mhz"] < V100_TRACE_DEVICE.sm_clock_max_mhz]
    assert len(slowed) > len(rows) / 2
    assert abs(summary["median_clock_mhz"] - 1200) < 150
    for r in rows:
        assert r["clock_mhz"] <= r["top_clock_mhz"]
        assert r["best_change_pct"] <= r["change_pct"] + 1e-9


def test_on_the_twin_per_sku_and_character() -> None:
    rows = seed_claim_on_twin(memory_bound_ratios=(0.1, 0.6))
    assert [(r["sku"], r["memory_bound_ratio"]) for r in rows] == [
        (sku(n).name, m) for n in TWIN_SKUS for m in (0.1, 0.6)
    ]
    a100 = sku("a100-40gb")  # estimated curve, no cap headroom: max clock at its default limit
    pm = physics.PowerModel.from_sku(a100)
    for r in (r for r in rows if r["sku"] == a100.name):
        m = r["memory_bound_ratio"]
        p = pm.power_mw(1200, 1.0, 1.0) / pm.power_mw(1410, 1.0, 1.0)
        t = m + (1 - m) * 1410 / 1200
        assert (r["clock_mhz"], r["max_clock_mhz"]) == (1200, 1410)
        assert r["power_ratio"] == pytest.approx(p)
        assert r["time_ratio"] == pytest.approx(t)
        assert r["change_pct"] == pytest.approx(100 * (p * t - 1))
        assert r["best_change_pct"] <= r["change_pct"]
    # A more memory-bound workload gains more from the lower clock.
    for name in TWIN_SKUS:
        lo, hi = (r for r in rows if r["sku"] == sku(name).name)
        assert hi["change_pct"] < lo["change_pct"]


@needs_trace
def test_verdict_rows_one_per_sku_twin_then_trace(claim: TraceClaim) -> None:
    twin = seed_claim_on_twin()
    rows = verdict_rows(twin, {"v100": claim})
    assert [r["source"] for r in rows] == ["twin"] * len(TWIN_SKUS) + ["trace"]
    assert len({tuple(r) for r in rows}) == 1  # the same columns in every row
    trace_row = rows[-1]
    assert trace_row["cases"] == 68
    assert trace_row["median_change_pct"] == claim.summary["median_change_pct"]
    for r in rows:
        assert (r["verdict"] == "holds") == (r["share_reaching_claim"] >= 0.5)
    for r, name in zip(rows, TWIN_SKUS, strict=False):
        mine = [t["change_pct"] for t in twin if t["sku"] == sku(name).name]
        assert r["median_change_pct"] == pytest.approx(statistics.median(mine))
    assert verdict_rows(twin, None) == rows[:-1]
