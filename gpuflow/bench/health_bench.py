"""Health model: scoring throughput of a large fleet, and the test-split figures.

1. Scoring: 10,000 devices, one core (torch and the BLAS/OpenMP pools held to one
   thread). A round is what the monitor does per sample: fold 10,000 telemetry samples
   into the windows, assemble 10,000 windows, run the LSTM on them. The goal (issue 4):
   well under the 5 s sampling interval; reported as ``interval_s / round_s`` (how many
   rounds fit in one interval), median of several rounds, for a round inside a bucket and
   one that closes a bucket. Sampling the devices is the backend's cost, not included.
2. Figures: the default training run (quick: the small fleet) trained and evaluated on
   the test split against the baselines, recorded in MLflow (experiment gpuflow-health).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gpuflow.hardware.backend import TelemetrySample
from gpuflow.tasks.health.features import BUCKET_S, FleetWindows
from gpuflow.tasks.health.model import HealthLSTM, TrainConfig
from gpuflow.tasks.health.sampler import DEFAULT_INTERVAL_S

DEVICES = 10_000


def synthetic_round(n: int, t_s: float, rng: np.random.Generator) -> list[TelemetrySample]:
    """One sample of ``n`` A100-like devices at ``t_s`` (values in their usual ranges)."""
    temp = rng.uniform(35.0, 80.0, n)
    power = rng.uniform(60_000, 400_000, n).astype(int)
    util = rng.uniform(0.0, 1.0, n)
    ecc = rng.poisson(2.0, n)
    xid_dev = set(rng.choice(n, max(1, n // 1000), replace=False).tolist())
    return [
        TelemetrySample(
            node=f"n{i // 8:05d}",
            index=i % 8,
            timestamp_s=t_s,
            present=True,
            temperature_c=float(temp[i]),
            power_mw=int(power[i]),
            energy_mj=0,
            utilization_ratio=float(util[i]),
            memory_used_mb=int(util[i] * 30_000),
            memory_total_mb=40_960,
            sm_clock_mhz=1410,
            power_limit_mw=400_000,
            ecc_corrected_total=int(ecc[i]),
            clock_event_reasons=("SwPowerCap",) if power[i] > 390_000 else (),
            xids=(63,) if i in xid_dev else (),
        )
        for i in range(n)
    ]


def bench_scoring(
    n_devices: int = DEVICES,
    rounds: int = 5,
    hidden: int | None = None,
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time the monitor's per-round work for ``n_devices`` on one core."""
    hidden = hidden or TrainConfig().hidden
    model = HealthLSTM(hidden=hidden).eval()
    rng = np.random.default_rng(0)
    clocks = [1410.0] * n_devices
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            fw = FleetWindows(model.window)
            t0 = 1_700_000_000.0
            report(f"filling {n_devices} windows")
            for k in range(model.window):  # one sample per bucket fills the windows
                fw.update(synthetic_round(n_devices, t0 + k * BUCKET_S, rng), clocks)
            t = t0 + (model.window - 1) * BUCKET_S
            parts: dict[str, list[float]] = {
                "update": [],
                "windows": [],
                "predict": [],
                "round": [],
                "closing_round": [],
            }
            for r in range(rounds):
                report(f"scoring round {r + 1}/{rounds}")
                for closing in (False, True):
                    t += BUCKET_S if closing else DEFAULT_INTERVAL_S
                    samples = synthetic_round(n_devices, t, rng)
                    a = time.perf_counter()
                    fw.update(samples, clocks)
                    b = time.perf_counter()
                    win = fw.windows()
                    c = time.perf_counter()
                    risk = model.predict_risk(win)
                    d = time.perf_counter()
                    assert len(risk) == n_devices
                    if closing:
                        parts["closing_round"].append(d - a)
                    else:
                        parts["update"].append(b - a)
                        parts["windows"].append(c - b)
                        parts["predict"].append(d - c)
                        parts["round"].append(d - a)
    finally:
        torch.set_num_threads(before)
    med = {k: statistics.median(v) for k, v in parts.items()}
    return {
        "devices": n_devices,
        "threads": 1,
        "lstm_hidden": hidden,
        "update_s": round(med["update"], 4),
        "windows_s": round(med["windows"], 4),
        "predict_s": round(med["predict"], 4),
        "round_s": round(med["round"], 4),
        "closing_round_s": round(med["closing_round"], 4),
        "interval_s": DEFAULT_INTERVAL_S,
        "interval_to_round_ratio": round(DEFAULT_INTERVAL_S / med["round"], 1),
        "interval_to_closing_round_ratio": round(DEFAULT_INTERVAL_S / med["closing_round"], 1),
        "devices_per_s": round(n_devices / med["round"]),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(quick: bool = False, report: Callable[[str], None] = print) -> dict[str, Any]:
    from gpuflow.tasks.health.history import HistoryConfig
    from gpuflow.tasks.health.pipeline import log_outcome, train_and_evaluate

    machine = {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    scoring = bench_scoring(rounds=3 if quick else 7, report=report)
    report(f"scoring: {scoring['round_s']} s per round of {scoring['devices']} devices")
    hc = HistoryConfig.small() if quick else HistoryConfig()
    tc = TrainConfig.small() if quick else TrainConfig()
    outcome = train_and_evaluate(hc, tc, progress=lambda m, f: report(f"training: {m}"))
    recorded = log_outcome(outcome, register=False, run_name="bench-health")
    s = outcome.summary()
    keep = (
        "threshold",
        "precision",
        "recall",
        "recall_precursor_classes",
        "recall_abrupt_classes",
        "fa_per_1000_device_days",
        "pr_auc",
        "alert_rate",
        "lead_p10_s",
        "lead_p50_s",
        "lead_p90_s",
        "failures",
        "detected",
    )
    figures = {
        f"{name}{suffix}": {k: r[k] for k in keep if k in r}
        | {f"recall_{c}": m["recall"] for c, m in r["by_class"].items()}
        for key, suffix in (
            ("test_at_monitor_threshold", ""),
            ("test_at_tuned_threshold", "_tuned"),
        )
        for name, r in s[key].items()
    }
    return {
        "machine": machine,
        "scoring": scoring,
        "history": {
            k: s["history"][k]
            for k in ("devices", "days", "failures", "failures_by_class", "generate_s")
        }
        | {"test": s["history"]["splits"]["test"]},
        "lstm": {
            k: s["lstm"][k]
            for k in ("train_windows", "epochs_run", "val_pr_auc", "train_s", "parameters")
        },
        "test_split": figures,
        "thresholds": s["thresholds"],
        "timings_s": s["timings_s"],
        "mlflow_run_id": recorded["run_id"],
        "quick": quick,
    }
