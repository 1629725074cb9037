from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from gpuflow.hardware.sim import SimBackend
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim.hazard import DAY_S, device_schedule
from gpuflow.tasks.health.features import BUCKET_S, FEATURE_INDEX
from gpuflow.tasks.health.history import (
    ABRUPT_LOOKBACK_S,
    U_STEP,
    Device,
    History,
    HistoryConfig,
    build_fleet,
    counters_vec,
    draw_faults,
    generate_history,
    load_or_generate,
    split_time_ranges,
    steady_state,
)

from .conftest import TINY_HISTORY


def test_schedule_is_the_twins(tiny_history: History) -> None:
    cfg = TINY_HISTORY
    devices = build_fleet(cfg)
    for d in devices[:40]:
        draw_faults(cfg, d)
        draws = device_schedule(cfg.seed, d.ordinal, d.rate_per_day, cfg.hazard(), cfg.days * DAY_S)
        onsets = {round(x.onset_s, 6) for x in draws}
        # every fault is one of the hazard model's draws; skipped draws fell in downtime
        assert {round(f.onset_s, 6) for f in d.faults} <= onsets
        for prev, nxt in zip(d.faults, d.faults[1:], strict=False):
            assert nxt.onset_s >= prev.repaired_s
        for f in d.faults:
            assert f.onset_s <= f.failure_s <= f.onset_s + f.lead_s + 1e-6
            assert f.repaired_s > f.failure_s
            if f.abrupt:
                assert f.failure_s == f.onset_s


def test_splits_by_node_and_time(tiny_history: History) -> None:
    cfg = TINY_HISTORY
    nodes = {}
    ranges = split_time_ranges(cfg)
    for i, (name, sp) in enumerate(tiny_history.splits.items()):
        ordinals = set(sp.seg_ordinal.tolist())
        nodes[name] = {o // cfg.gpus_per_node for o in ordinals}
        t0, t1 = ranges[i]
        assert np.all((sp.fail_s >= t0) & (sp.fail_s < t1))
        bg = sp.seg_kind[sp.seg] == 1
        assert np.all(sp.t_end_s[bg] > t0) and np.all(sp.t_end_s[bg] <= t1 + 1e-6)
    assert not nodes["train"] & nodes["val"]
    assert not nodes["train"] & nodes["test"]
    assert not nodes["val"] & nodes["test"]


def test_labels_and_weights(tiny_history: History) -> None:
    cfg = TINY_HISTORY
    sp = tiny_history.splits["train"]
    y = sp.labels(cfg.horizon_s)
    assert y.sum() > 0
    assert np.all(sp.ttf_s[y == 1] <= cfg.horizon_s) and np.all(sp.ttf_s[y == 1] > 0)
    # every incident ends right before its failure: its last window is a positive
    for seg_id in np.flatnonzero(sp.seg_fault >= 0):
        w = np.flatnonzero(sp.seg == seg_id)
        assert 0 <= sp.ttf_s[w[-1]] < BUCKET_S
        assert np.all(np.diff(sp.t_end_s[w]) == BUCKET_S)
    # background windows stand for the split's healthy device-time
    bg = sp.seg_kind[sp.seg] == 1
    # ... and say how far the device's next failure is (inf: none), never inside an
    # incident: the labels of the longer horizons need it
    assert np.all(sp.ttf_s[bg] > ABRUPT_LOOKBACK_S - 1.0)
    assert np.isfinite(sp.ttf_s[bg]).any() and np.isinf(sp.ttf_s[bg]).any()
    assert sp.weight[bg].sum() == pytest.approx(
        sp.background_device_days * DAY_S / BUCKET_S, rel=1e-6
    )
    assert np.all(sp.weight[~bg] == 1.0)
    # an HBM incident's remaps show up before its failure (unless it is a silent one)
    hbm = np.flatnonzero((sp.fail_kind == "hbm") & (sp.fail_onset_s < sp.fail_s))
    assert len(hbm)
    seg_id = int(np.flatnonzero(sp.seg_fault == hbm[0])[0])
    last = sp.end_row[np.flatnonzero(sp.seg == seg_id)[-1]]
    assert sp.buckets[last, FEATURE_INDEX["remap_pending"]] == 1.0


def test_generation_is_deterministic_and_cached(tiny_history: History) -> None:
    again = generate_history(TINY_HISTORY)
    for name in ("train", "test"):
        assert np.array_equal(
            again.splits[name].buckets, tiny_history.splits[name].buckets, equal_nan=True
        )
    h, cached = load_or_generate(TINY_HISTORY)
    assert not cached
    h2, cached2 = load_or_generate(TINY_HISTORY)
    assert cached2
    assert np.array_equal(h2.splits["val"].ttf_s, h.splits["val"].ttf_s)
    assert h2.config == TINY_HISTORY


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="node_fractions"):
        HistoryConfig(node_fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="unknown SKU"):
        HistoryConfig(sku_mix={"NVIDIA B300": 1.0})
    with pytest.raises(ValueError, match="abrupt_share"):
        HistoryConfig(abrupt_share=0.99)
    with pytest.raises(ValueError):
        HistoryConfig(nodes=1)


def _twin_device(home: Path, key: str) -> dict:
    return json.loads((home / "twin" / "state.json").read_text())["devices"][key]


def test_counters_match_the_twin(gpuflow_home: Path) -> None:
    """The history's HBM precursor counters are the twin's: same growth, same remaps. (The
    live twin's background errors are still an even trickle, the history's are bursts
    (history_noise): the trickle is added back here.)"""
    twin = SimBackend()
    lead_s = 4 * 3600.0
    twin.inject_fault("a100-0", 0, "hbm", lead_s=lead_s)
    rec = _twin_device(gpuflow_home, "a100-0:0")
    fault = dict(rec["fault"])
    base = rec["ecc_base_s"]
    # history times count from the counters' base; the twin's are absolute
    fault_rel = {**fault, "onset_s": fault["onset_s"] - base}
    dev = Device(
        rec["ordinal"],
        "a100-0",
        0,
        0,
        rec["sku"],
        rec["ambient_c"],
        rec["lemon"],
        rec["rate_per_day"],
    )
    for _ in range(8):
        twin.advance(1700.0)
        s = twin.telemetry("a100-0", 0)
        if not s.present or s.ecc_uncorrected_total:
            break
        c, pending, _ = counters_vec(dev, fault_rel, np.array([s.timestamp_s - base]))
        assert c[0, 0] + F.background_corrected(rec, s.timestamp_s) == s.ecc_corrected_total
        # An A100 remaps rows and retires no pages (retired_pages is None: NVML has none).
        assert s.retired_pages is None
        remapped = s.remapped_rows_correctable + s.remapped_rows_uncorrectable
        assert c[0, 2] == remapped
        assert bool(pending[0]) == s.remapped_rows_pending
    assert s.remapped_rows_pending  # it went past 0.8 L


@pytest.mark.parametrize(
    "shape", [{}, {"errors_at_failure": 3000.0, "stall_at": 0.4, "stall_s": DAY_S}]
)
def test_counters_vec_matches_faults_module(shape: dict) -> None:
    """Vectorized precursor (errors, remaps, pending) = hardware.sim.faults' scalar one,
    with and without a per-fault error level and a stall."""
    dev = Device(3, "n", 0, 3, "NVIDIA A100-SXM4-40GB", 30.0, True, 0.01)
    fault = F.new_fault("hbm", "natural", 5 * DAY_S, 3 * DAY_S, 48) | shape
    stages = []
    f2 = dict(fault)
    while (st := F.next_stage(f2)) is not None:
        stages.append(st)
        f2["done"] += 1
    for t in np.linspace(0, 9 * DAY_S, 55):
        c, pending, _ = counters_vec(dev, fault, np.array([t]))
        assert c[0, 0] == F.hbm_corrected(fault, float(t))
        remaps = sum(1 for when, name in stages if name == "remap" and when <= t)
        assert c[0, 2] == remaps and pending[0] == (remaps > 0)
    assert F.hbm_corrected(fault, 9 * DAY_S) == int(shape.get("errors_at_failure", 400))
    if shape:  # nothing grows during the stall
        t_stall = F.time_at_progress(fault, 0.4)
        assert F.hbm_corrected(fault, t_stall) == F.hbm_corrected(fault, t_stall + 0.9 * DAY_S)
        assert stages[-1][0] == pytest.approx(fault["onset_s"] + fault["lead_s"])


def test_steady_state_matches_the_twin(gpuflow_home: Path) -> None:
    twin = SimBackend()
    twin.set_workload("a100-1", 2, "job", 0.8, 1000)
    twin.advance(1800.0)
    s = twin.telemetry("a100-1", 2)
    rec = _twin_device(gpuflow_home, "a100-1:2")
    temp, power, clock, _, _ = steady_state(rec["sku"], rec["ambient_c"], round(0.8 / U_STEP))
    assert s.temperature_c == pytest.approx(temp, abs=0.05)
    assert s.power_mw == pytest.approx(power, rel=0.01)
    assert s.sm_clock_mhz == clock


def test_thermal_failures_happen_under_physics() -> None:
    cfg = HistoryConfig.small(nodes=400, days=200.0, sku_mix={"NVIDIA A100-SXM4-40GB": 1.0})
    devices = build_fleet(cfg)
    thermal = []
    for d in devices:
        draw_faults(cfg, d)
        thermal += [f for f in d.faults if f.kind == "thermal"]
    assert thermal, "expected a thermal fault in this fleet"
    # the physics shuts the device down at or before the lead time's backstop
    assert all(f.failure_s <= f.onset_s + f.lead_s for f in thermal)
    assert any(f.failure_s < f.onset_s + f.lead_s - BUCKET_S for f in thermal)
    assert not math.isnan(thermal[0].failure_s)
