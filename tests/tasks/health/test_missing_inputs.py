"""Telemetry a device's backend cannot read: missing features, not zeros, end to end."""

from __future__ import annotations

import numpy as np
import torch
from gpuflow.hardware.sim import SimBackend
from gpuflow.hardware.skus import sku
from gpuflow.hardware.telemetry_fields import HY_SMI, NVML_PAGE_RETIREMENT, NVML_ROW_REMAPPING
from gpuflow.tasks.health.baselines import RuleModel
from gpuflow.tasks.health.features import (
    BUCKET_S,
    FEATURE_INDEX,
    FEATURE_INPUTS,
    FEATURES,
    WINDOW_BUCKETS,
    missing_features,
    missing_in,
)
from gpuflow.tasks.health.fleet_windows import FleetWindows
from gpuflow.tasks.health.history import History, simulate_segment
from gpuflow.tasks.health.history_series import Segment
from gpuflow.tasks.health.model import HealthLSTM, feature_stats, mask_columns
from gpuflow.tasks.health.scoring import score_fleet

from tests.tasks.health.test_fleet_windows import T0, sample

FI = FEATURE_INDEX
XID_FEATURES = ("xid_memory_log", "xid_bus_log", "xid_app_log", "xid_other_log")
UNREADABLE_ALL = {
    "ecc_corrected_total": None,
    "ecc_uncorrected_total": None,
    "retired_pages": None,
    "remapped_rows_correctable": None,
    "remapped_rows_uncorrectable": None,
    "remapped_rows_pending": None,
    "remapped_rows_failure": None,
    "clock_event_reasons": None,
    "xids": None,
}
V100_UNREADABLE = {
    "remapped_rows_correctable": None,
    "remapped_rows_uncorrectable": None,
    "remapped_rows_pending": None,
    "remapped_rows_failure": None,
}


def test_missing_features_per_backend() -> None:
    assert missing_features(NVML_ROW_REMAPPING) == ()
    # V100: retired pages feed the remapped total; pending/failure flags do not exist.
    assert missing_features(NVML_PAGE_RETIREMENT) == ("remap_pending", "remap_failure")
    assert set(missing_features(HY_SMI)) == set(FEATURE_INPUTS)
    assert "temperature_c" not in missing_features(HY_SMI)


def test_windows_carry_nan_where_the_backend_cannot_read() -> None:
    fw = FleetWindows()
    fw.update([sample(T0, **UNREADABLE_ALL)], [1500.0])
    fw.update([sample(T0, node="a100", ecc_corrected_total=3)], [1410.0])
    fw.update([sample(T0 + 3 * BUCKET_S, **UNREADABLE_ALL)], [1500.0])  # a gap of 2 buckets
    w = fw.windows()
    dcu, a100 = w[0], w[1]
    missing = [FI[f] for f in FEATURE_INPUTS]
    assert np.isnan(dcu[:, missing]).all()  # padded and gap buckets stay missing too
    present = [i for i in range(len(FEATURES)) if i not in missing]
    assert np.isfinite(dcu[:, present]).all()
    assert np.isfinite(a100).all() and a100[-1, FI["ecc_corrected_total_log"]] > 0
    names = missing_in(w)
    assert set(names[0]) == set(FEATURE_INPUTS) and names[1] == ()


def test_v100_keeps_the_remapped_total_from_retired_pages() -> None:
    fw = FleetWindows()
    fw.update([sample(T0, retired_pages=2, **V100_UNREADABLE)], [1530.0])
    last = fw.windows()[0, -1]
    assert last[FI["remapped_rows_total_log"]] == np.float32(np.log1p(2.0))
    assert np.isnan(last[FI["remap_pending"]]) and np.isnan(last[FI["remap_failure"]])
    assert missing_in(fw.windows()) == [("remap_pending", "remap_failure")]


def test_models_read_missing_inputs_without_nan_risk() -> None:
    fw = FleetWindows()
    fw.update([sample(T0, **UNREADABLE_ALL), sample(T0, node="a100")], [1500.0, 1410.0])
    w = fw.windows()
    mean, std = feature_stats(w)
    assert np.isfinite(mean).all() and np.isfinite(std).all()
    torch.manual_seed(0)
    model = HealthLSTM(hidden=4)
    risk = model.predict_risk(w)
    assert np.isfinite(risk).all()
    # The mask channel tells a DCU's silence from an A100's clean counters.
    assert len(mask_columns(FEATURES)) == len(set(FEATURE_INPUTS.values()))
    assert risk[0] != risk[1]
    top = model.top_features(w, k=len(FEATURES))
    assert not set(top[0]) & set(FEATURE_INPUTS)  # a missing feature drove nothing
    # The rules cannot fire on what is missing.
    assert RuleModel(WINDOW_BUCKETS).predict_risk(w).tolist() == [0.0, 0.0]


def test_history_blanks_what_each_sku_cannot_read(tiny_history: History) -> None:
    by_sku = tiny_history.stats["missing_features_by_sku"]
    assert by_sku["Hygon DCU Z100"] == list(missing_features(HY_SMI))
    assert by_sku["Tesla V100-SXM2-32GB"] == ["remap_pending", "remap_failure"]
    assert by_sku["NVIDIA A100-SXM4-40GB"] == []
    from gpuflow.tasks.health.history import build_fleet

    devices = {d.sku: d for d in build_fleet(tiny_history.config)}
    dcu = devices[sku("dcu-z100").name]
    b = simulate_segment(tiny_history.config, dcu, Segment(dcu.ordinal, 0.0, 4, "background"))
    assert np.isnan(b[:, [FI[f] for f in XID_FEATURES]]).all()
    assert np.isfinite(b[:, FI["temperature_c"]]).all()


def test_scoring_names_the_missing_inputs_per_device() -> None:
    twin = SimBackend()
    risks = {(r.node, r.index): r for r in score_fleet(twin, RuleModel(WINDOW_BUCKETS))}
    dcu = next(d for d in twin.devices() if d.vendor == "Hygon")
    v100 = next(d for d in twin.devices() if d.sku.startswith("Tesla V100"))
    a100 = next(d for d in twin.devices() if "A100" in d.sku)
    assert set(risks[(dcu.node, dcu.index)].missing) == set(FEATURE_INPUTS)
    assert risks[(v100.node, v100.index)].missing == ("remap_pending", "remap_failure")
    assert risks[(a100.node, a100.index)].missing == ()
    assert risks[(dcu.node, dcu.index)].to_dict()["missing"]
