"""What the downtime studies share (costs, bootstrap, verdict) and `gpuflow bench downtime`."""

from __future__ import annotations

import math

import mlflow
import numpy as np
import pytest
from gpuflow.tasks.remediation.alarm_stream import study as stream_study
from gpuflow.tasks.remediation.downtime_sim import (
    DowntimeCosts,
    claim_verdict,
    resample_totals,
    summarize,
)
from gpuflow.tasks.tracking import tracking_uri

from gpuflow.bench import downtime_bench
from tests.tasks.remediation.test_alarm_stream import COSTS, HORIZON, seed_of, tiny_split


def test_costs_young_daly_and_refusals() -> None:
    c = DowntimeCosts(gang_gpus=16, checkpoint_s=120.0)
    rate = 0.01  # failures per GPU-day
    mtbf = 86_400.0 / (rate * 16)
    assert c.checkpoint_every_s(rate) == pytest.approx(math.sqrt(2 * mtbf * 120.0))
    assert math.isinf(c.checkpoint_every_s(0.0)) and c.checkpoint_share(math.inf) == 0.0
    assert c.unplanned_gpu_s(1000.0, wait_s=50.0) == pytest.approx(
        16 * (560.0 + 50.0 + c.restart_s)
    )
    with pytest.raises(ValueError, match="gang_gpus"):
        DowntimeCosts(gang_gpus=0)
    with pytest.raises(ValueError, match="checkpoint_s"):
        DowntimeCosts(checkpoint_s=0.0)
    with pytest.raises(ValueError, match="failures_per_gpu_day"):
        c.checkpoint_every_s(-1.0)


def test_bootstrap_is_paired_and_two_level() -> None:
    rng = np.random.default_rng(3)
    base = rng.uniform(1, 10, size=(30, 1))
    groups = [np.hstack([base, 0.5 * base]), np.hstack([2 * base, base])]
    boot = resample_totals(groups, resamples=300, seed=1)
    assert boot.shape == (300, 2)
    assert np.allclose(boot[:, 1], 0.5 * boot[:, 0])  # the same draws for every column
    assert boot[:, 0].std() > 0
    point = {"reactive": {"u": 10.0}, "half": {"u": 5.0}}
    samples = {"reactive": {"u": boot[:, 0]}, "half": {"u": boot[:, 1]}}
    row = summarize(point, samples, key="u")["half"]
    assert row["reduction"] == 0.5
    assert row["reduction_lo"] == pytest.approx(0.5) and row["reduction_hi"] == pytest.approx(0.5)
    verdict = claim_verdict(summarize(point, samples, key="u"))
    assert verdict == "half 50.0% [50.0%, 50.0%]: short of 67%, CI excludes it"
    with pytest.raises(ValueError, match="group"):
        resample_totals([np.zeros(3)])


def test_bench_prints_both_studies_and_the_verdict(gpuflow_home, monkeypatch) -> None:
    split = tiny_split()
    streams = stream_study(
        [seed_of(split, rules=split.labels(HORIZON), oracle=split.labels(HORIZON))],
        COSTS,
        resamples=20,
    )
    monkeypatch.setattr(downtime_bench, "run_alarm_streams", lambda quick, report, n: streams)
    monkeypatch.setattr(downtime_bench, "QUICK_REPLAY_RESAMPLES", (5, 3))
    lines: list[str] = []
    out = downtime_bench.run(quick=True, report=lines.append)
    assert lines
    stream = out["alarm streams (twin, held-out test splits)"]
    assert stream["oracle: unplanned vs reactive"].startswith("100.0%")
    gpu = out["InfiniteHBD replay: gpu faults"]
    assert {"reactive: ETTR", "spares: ETTR", "predicted:rules: ETTR"} <= set(gpu)
    assert "predicted:precursor-bound: unplanned vs spares (prediction alone)" in gpu
    assert not any(
        "predicted" in k for k in out["InfiniteHBD replay: other faults (never foreseen)"]
    )
    verdict = out["verdict on -67 %"]
    assert verdict["alarm streams, oracle bound"].startswith("oracle 100.0%")
    assert "predicted:rules" in verdict["replay gpu, prediction alone (vs spares)"]
    client = mlflow.MlflowClient(tracking_uri())
    run = client.get_run(out["setup"]["mlflow run"])
    assert "replay_gpu_spares_reduction" in run.data.metrics
    assert "stream_oracle_ettr" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        "plots/downtime_strategies.png"
    }
