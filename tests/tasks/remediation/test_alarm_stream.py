"""The alarm-stream downtime study: a model's actual alarms and the actual failures on a
split drive the costs (tasks.remediation.alarm_stream)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gpuflow.tasks.health.features import N_FEATURES
from gpuflow.tasks.health.history import HistoryConfig, SplitData
from gpuflow.tasks.health.history_splits import split_of_nodes
from gpuflow.tasks.remediation.alarm_stream import (
    SeedStreams,
    StrategyRisk,
    alarm_stream,
    break_even_risk,
    device_rows,
    model_horizons,
    seed_streams,
    split_devices,
    study,
)
from gpuflow.tasks.remediation.downtime_sim import DowntimeCosts

HORIZON = 1800.0
FAIL_AT = 10_000.0
BG_WEIGHT = 50.0
COSTS = DowntimeCosts(gang_gpus=8, checkpoint_s=100.0, restart_s=600.0, migrate_s=300.0)


def tiny_split() -> SplitData:
    """Device 3 fails (HBM) at FAIL_AT: an incident segment of 10 windows, 3000 s to 300 s
    before it; device 5: a background segment of 4 windows, each standing for BG_WEIGHT."""
    inc_t = FAIL_AT - 300.0 * np.arange(10, 0, -1)
    bg_t = 50_000.0 + 300.0 * np.arange(4)
    n = 14
    return SplitData(
        name="test",
        buckets=np.zeros((n, N_FEATURES), np.float32),
        end_row=np.arange(n),
        t_end_s=np.concatenate([inc_t, bg_t]),
        ttf_s=np.concatenate([FAIL_AT - inc_t, np.full(4, np.inf)]),
        seg=np.array([0] * 10 + [1] * 4),
        weight=np.array([1.0] * 10 + [BG_WEIGHT] * 4),
        seg_ordinal=np.array([3, 5]),
        seg_kind=np.array([0, 1]),
        seg_fault=np.array([0, -1]),
        fail_ordinal=np.array([3]),
        fail_kind=np.array(["hbm"], dtype="U24"),
        fail_s=np.array([FAIL_AT]),
        fail_onset_s=np.array([0.0]),
        fail_lemon=np.array([False]),
        device_days=8.0,
        background_device_days=7.9,
        sampled_background_device_days=0.01,
        window=1,
    )


def seed_of(split: SplitData, **risks: np.ndarray) -> SeedStreams:
    return SeedStreams(
        devices=np.arange(8),
        device_days=split.device_days,
        fail_ordinal=split.fail_ordinal,
        fail_abrupt=np.array([False]),
        streams={"reactive": None}
        | {n: alarm_stream(split, r, 0.5, HORIZON) for n, r in risks.items()},
    )


def test_oracle_stream_beats_reactive() -> None:
    split = tiny_split()
    seed = seed_of(split, oracle=split.labels(HORIZON))
    ep = seed.streams["oracle"]
    assert ep is not None and ep.detected.all() and ep.true.all()
    assert ep.start_s[0] == FAIL_AT - HORIZON and ep.ordinal.tolist() == [3]
    res = study([seed], COSTS, resamples=50)
    every = COSTS.checkpoint_every_s(1 / 8.0)  # one failure in 8 device-days
    assert res.checkpoint_every_s == pytest.approx(every)
    reactive, oracle = res.table["reactive"], res.table["oracle"]
    # Reactive: the work since the last checkpoint ((T + C) / 2) plus R, whole gang.
    lost = 8 * ((every + 100.0) / 2 + 600.0)
    assert reactive["unplanned_gpu_h_per_1000_dd"] == pytest.approx(lost / 3600 / 8.0 * 1000)
    assert oracle["unplanned_gpu_h_per_1000_dd"] == 0.0 and oracle["reduction"] == 1.0
    assert oracle["planned_gpu_h_per_1000_dd"] == pytest.approx(8 * 400.0 / 3600 / 8.0 * 1000)
    assert oracle["ettr"] > reactive["ettr"] and oracle["recall_precursor_classes"] == 1.0


def test_only_false_alarms_cost_c_plus_m_each() -> None:
    split = tiny_split()
    noise = np.zeros(split.n_windows)
    noise[[10, 12]] = 1.0  # two separate background episodes on device 5
    noise[0] = 1.0  # and one in the incident, long before the horizon: false too
    seed = seed_of(split, noisy=noise)
    rows, cols = device_rows(seed, COSTS, COSTS.checkpoint_every_s(1 / 8.0))
    at = {c: i for i, c in enumerate(cols)}
    per_alarm = 8 * (100.0 + 300.0)
    assert rows[5, at["noisy:planned"]] == pytest.approx(2 * BG_WEIGHT * per_alarm)
    assert rows[5, at["noisy:false_alarms"]] == 2 * BG_WEIGHT
    assert rows[3, at["noisy:planned"]] == pytest.approx(per_alarm)
    # Nothing caught: the failure costs what it costs without alarms.
    assert rows[:, at["noisy:unplanned"]].sum() == rows[:, at["reactive:unplanned"]].sum() > 0
    assert rows[:, at["device_days"]].sum() == pytest.approx(8.0)


def test_bad_input_and_split_devices() -> None:
    split = tiny_split()
    with pytest.raises(ValueError, match="threshold"):
        alarm_stream(split, np.zeros(split.n_windows), 1.5, HORIZON)
    with pytest.raises(ValueError, match="scores for"):
        alarm_stream(split, np.zeros(3), 0.5, HORIZON)
    seed = seed_of(split)
    seed.devices = np.arange(2)  # the failing device 3 is not among them
    with pytest.raises(ValueError, match="outside the split"):
        device_rows(seed, COSTS, 3600.0)
    cfg = HistoryConfig.small(nodes=10)
    test_nodes = np.flatnonzero(split_of_nodes(cfg) == 2)
    devices = split_devices(cfg)
    assert len(devices) == len(test_nodes) * cfg.gpus_per_node
    assert set(devices // cfg.gpus_per_node) == set(test_nodes.tolist())


def test_each_stream_counts_detections_at_its_own_horizon() -> None:
    """A model's risk is P(fail within its chosen horizon): an alarm 3000 s before the
    failure detects it at a 1 h horizon, and is a false alarm with a miss at 30 min (the
    history's label horizon, which the study used to apply to every model)."""
    split = tiny_split()
    early = np.zeros(split.n_windows)
    early[0] = 1.0  # FAIL_AT - 3000 s
    history = SimpleNamespace(splits={"test": split}, config=HistoryConfig.small(nodes=10))
    seed = seed_streams(
        history,  # type: ignore[arg-type]
        {
            "at_1h": StrategyRisk(early, 0.5, 3600.0),
            "at_30min": StrategyRisk(early, 0.5, HORIZON),
        },
    )
    assert seed.horizons_s == {"at_1h": 3600.0, "at_30min": HORIZON}
    one_h, half_h = seed.streams["at_1h"], seed.streams["at_30min"]
    assert one_h is not None and one_h.detected.all() and one_h.true.all()
    assert half_h is not None and not half_h.detected.any() and not half_h.true.any()
    seed.devices = np.arange(8)
    res = study([seed], COSTS, resamples=20)
    assert res.table["at_1h"]["reduction"] == 1.0 and res.table["at_30min"]["reduction"] == 0.0
    assert res.horizon_summary() == {"at_1h": "1h x1", "at_30min": "0.5h x1"}


def test_models_run_at_the_pipelines_horizons() -> None:
    """trained_risks takes each model's horizon from the pipeline's choice on validation
    (the history's label horizon only for a model it chose none for), and its break-even
    risk is the decision rule's for that horizon."""
    outcome = SimpleNamespace(horizons={"rules": 3600.0, "gbt": 86_400.0, "lstm": 21_600.0})
    assert model_horizons(outcome, HORIZON) == {
        "rules": 3600.0,
        "gbt": 86_400.0,
        "lstm": 21_600.0,
    }
    assert model_horizons(SimpleNamespace(), HORIZON) == dict.fromkeys(
        ("rules", "gbt", "lstm"), HORIZON
    )
    every = COSTS.checkpoint_every_s(1 / 400.0)
    assert break_even_risk(COSTS, every, 86_400.0) != break_even_risk(COSTS, every, HORIZON)
