"""The downtime simulation's accounting, its statistics, and the `downtime` benchmark."""

from __future__ import annotations

import dataclasses
import math
import random

import mlflow
import numpy as np
import pytest
from gpuflow.hardware.sim.hazard import DAY_S, HazardModel
from gpuflow.tasks.remediation.downtime_sim import (
    REACTIVE,
    FleetConfig,
    Outcome,
    Predictor,
    _Failure,
    _run_job,
    false_alarm_rate_for,
    mean_ci,
    oracle,
    reduction_ci,
    simulate,
    simulate_seed,
    summarize,
)
from gpuflow.tasks.tracking import tracking_uri, use_experiment

from gpuflow.bench import downtime_bench

HOUR = 3600.0


def _one_job(**kw) -> FleetConfig:
    return FleetConfig(
        n_gpus=8,
        gpus_per_job=8,
        horizon_days=10.0,
        checkpoint_cost_s=100.0,
        restart_overhead_s=600.0,
        migrate_cost_s=300.0,
        **kw,
    )


def test_young_daly_interval() -> None:
    cfg = FleetConfig()
    rate = cfg.hazard.mean_device_rate_per_day() * 8 / DAY_S
    assert cfg.young_daly_s() == pytest.approx(math.sqrt(2 * (1 / rate) * 120.0))
    assert cfg.jobs == 8 and cfg.precursor_fraction() == pytest.approx(0.6)
    with pytest.raises(ValueError, match="multiple"):
        FleetConfig(n_gpus=10, gpus_per_job=8)
    with pytest.raises(ValueError, match="precursor_share"):
        FleetConfig(precursor_share=1.5)
    with pytest.raises(ValueError, match="recall"):
        Predictor("x", {"hbm": 1.2})


def test_accounting_of_one_failure_and_one_alarm() -> None:
    cfg = _one_job()
    T, C, R, M, H = 3600.0, 100.0, 600.0, 300.0, 10 * DAY_S
    # An unpredicted failure 1000 s into the 3rd cycle: 1000 s of work lost, plus R.
    fail_at = 2 * (T + C) + 1000.0
    out = Outcome()
    _run_job(cfg, [_Failure(fail_at, "xid79", 0.0)], REACTIVE, T, random.Random(0), out)
    assert out.failures == 1 and out.predicted == 0
    assert out.lost_work_s == pytest.approx(1000.0) and out.restart_s == R
    assert out.wall_s == H
    assert out.productive_s + out.checkpoint_s + out.lost_work_s + out.restart_s == pytest.approx(H)

    # The same failure seen coming (HBM, caught, lead >= lead_min): no work lost, C + M.
    seer = Predictor("seer", {"hbm": 1.0}, 0.0, (1800.0, 1800.0, 1800.0))
    out = Outcome()
    _run_job(cfg, [_Failure(fail_at, "hbm", 36 * HOUR)], seer, T, random.Random(0), out)
    assert out.predicted == 1 and out.lost_work_s == 0 and out.restart_s == 0
    assert out.planned_s == M
    assert out.productive_s + out.checkpoint_s + out.planned_s == pytest.approx(H)
    # Too late to act (the fault's own lead is shorter than lead_min): handled as reactive.
    out = Outcome()
    _run_job(cfg, [_Failure(fail_at, "hbm", 60.0)], seer, T, random.Random(0), out)
    assert out.predicted == 0 and out.lost_work_s == pytest.approx(1000.0)


def test_without_failures_ettr_is_the_checkpoint_duty_cycle() -> None:
    idle = dataclasses.replace(_one_job(), hazard=HazardModel(rate_per_node_day=0.0))
    assert math.isinf(idle.young_daly_s())  # no failures: Young/Daly says never checkpoint
    out = simulate_seed(idle, [REACTIVE], seed=1)["reactive"]
    assert out.ettr == 1.0 and out.unplanned_s == 0 and out.checkpoint_s == 0
    out = Outcome()
    _run_job(_one_job(), [], REACTIVE, 3600.0, random.Random(0), out)
    assert out.ettr == pytest.approx(3600.0 / 3700.0, rel=1e-3) and out.unplanned_s == 0


def test_oracle_with_no_precursors_is_reactive_and_never_worse() -> None:
    none = FleetConfig(precursor_share=0.0)
    per = simulate(none, [REACTIVE, oracle(none)], seeds=20)
    assert np.array_equal(per["reactive"]["unplanned_h"], per["oracle"]["unplanned_h"])
    cfg = FleetConfig()
    per = simulate(cfg, [REACTIVE, oracle(cfg)], seeds=40)
    assert (per["oracle"]["unplanned_h"] <= per["reactive"]["unplanned_h"] + 1e-9).all()
    table = summarize(per)
    # Its reduction cannot beat the share of failures that have a precursor (0.6) by much.
    assert 0.3 < table["oracle"]["reduction"] < 0.75
    assert (
        table["oracle"]["reduction_lo"]
        <= table["oracle"]["reduction"]
        <= table["oracle"]["reduction_hi"]
    )
    # Relabelling classes keeps the failure times: reactive does not change.
    shifted = simulate(dataclasses.replace(cfg, precursor_share=0.9), [REACTIVE], seeds=40)
    assert np.array_equal(shifted["reactive"]["unplanned_h"], per["reactive"]["unplanned_h"])


def test_false_alarms_cost_planned_time_only() -> None:
    cfg = FleetConfig(precursor_share=0.0)
    noisy = Predictor("noisy", {}, 50.0)
    per = simulate(cfg, [REACTIVE, noisy], seeds=10)
    assert (per["noisy"]["false_alarms"] > 0).all()
    assert (per["noisy"]["planned_h"] > 0).all()
    assert false_alarm_rate_for(0.5, {"hbm": 1.0}, cfg) == 0.0  # no hbm failures at share 0
    rate = false_alarm_rate_for(0.5, {"hbm": 1.0}, FleetConfig())
    mix = FleetConfig().class_mix()["hbm"]
    assert rate == pytest.approx(1000 * FleetConfig().hazard.mean_device_rate_per_day() * mix)


def test_intervals() -> None:
    m, lo, hi = mean_ci(np.array([1.0, 2.0, 3.0, 4.0]))
    assert (
        m == 2.5
        and lo < m < hi
        and hi - m == pytest.approx(1.96 * np.std([1, 2, 3, 4], ddof=1) / 2)
    )
    base = np.array([10.0, 12.0, 8.0, 11.0])
    point, lo, hi = reduction_ci(base, base * 0.5)
    assert point == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)


def test_bench_uses_measured_health_figures_and_logs_to_mlflow(gpuflow_home) -> None:
    # A health evaluation as tasks.health.pipeline logs it (only the metrics we read).
    exp = use_experiment("gpuflow-health")
    with mlflow.start_run(experiment_id=exp, run_name="health-train"):
        mlflow.log_metrics(
            {
                "lstm_recall": 0.5,
                "lstm_recall_hbm": 0.75,
                "lstm_recall_thermal": 0.5,
                "lstm_recall_xid79": 0.01,
                "lstm_fa_per_1000_device_days": 0.2,
                "lstm_lead_p10_s": 400.0,
                "lstm_lead_p50_s": 900.0,
                "lstm_lead_p90_s": 1700.0,
            }
        )
    preds, sources = downtime_bench.predictors(FleetConfig())
    lstm = next(p for p in preds if p.name == "lstm")
    assert lstm.recall["hbm"] == 0.75 and lstm.false_alarms_per_1000_device_days == 0.2
    assert lstm.lead_quantiles_s == (400.0, 900.0, 1700.0) and sources["lstm"].startswith(
        "measured"
    )
    assert sources["rules"].startswith("assumed")

    lines: list[str] = []
    out = downtime_bench.run(quick=True, report=lines.append)
    assert lines and {"setup", "reactive", "rules", "lstm", "oracle", "precursor sweep"} <= set(out)
    assert out["lstm"]["reduction vs reactive"] > 0
    assert out["precursor sweep"]["oracle p=0.0"] == 0.0
    claim = out["seed claim: 67 % less unplanned downtime"]
    assert isinstance(claim["claim inside the lstm CI"], bool)
    run = mlflow.MlflowClient(tracking_uri()).get_run(out["setup"]["mlflow run"])
    assert "reduction_lstm" in run.data.metrics and "ettr_reactive" in run.data.metrics
    artifacts = {
        a.path for a in mlflow.MlflowClient(tracking_uri()).list_artifacts(run.info.run_id, "plots")
    }
    assert artifacts == {"plots/downtime_comparison.png", "plots/precursor_sweep.png"}
    children = mlflow.MlflowClient(tracking_uri()).search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'"
    )
    assert sorted(c.data.tags["gpuflow.strategy"] for c in children) == [
        "lstm",
        "oracle",
        "reactive",
        "rules",
    ]
