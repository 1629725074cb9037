"""Train the LSTM and the baselines on a fleet history, evaluate all on the test split, and
record it: MLflow metrics, PR-curve and lead-time plots, the model in the registry.

Two operating points per model are evaluated: the monitor's threshold (0.85 by default,
the same for every model, since all risks are calibrated probabilities) and a threshold
tuned on the validation split (best event-level F1), so that a model whose calibrated
risk seldom reaches 0.85 is still compared where it works best.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gpuflow.tasks.health.baselines import (
    GbtConfig,
    GbtHealthModel,
    RuleModel,
    oracle_scores,
    random_scores,
    train_gbt,
)
from gpuflow.tasks.health.evaluate import (
    DEFAULT_LEAD_MIN_S,
    DEFAULT_THRESHOLD,
    EvalResult,
    evaluate_scores,
    plot_lead_times,
    plot_pr_curves,
    random_threshold_for,
)
from gpuflow.tasks.health.history import History, HistoryConfig, SplitData, load_or_generate
from gpuflow.tasks.health.model import (
    CHAMPION_ALIAS,
    EXPERIMENT,
    REGISTERED_MODEL,
    HealthLSTM,
    TrainConfig,
    train_lstm,
)
from prefect import task
from prefect.cache_policies import NONE
from threadpoolctl import threadpool_limits

Progress = Callable[[str, float], None]
# Calibrated risks of a 30-minute horizon are small: the grid is logarithmic below 0.1.
TUNE_GRID = tuple(
    float(x)
    for x in np.round(np.concatenate([np.logspace(-4, -1, 13), np.linspace(0.15, 0.95, 17)]), 6)
)


def score_split(model: Any, split: SplitData, batch: int = 100_000) -> np.ndarray:
    """Risk of every window of ``split``, in batches (a test split can hold millions)."""
    out = np.empty(split.n_windows, dtype=np.float32)
    for i in range(0, split.n_windows, batch):
        idx = np.arange(i, min(i + batch, split.n_windows))
        out[idx] = model.predict_risk(split.windows(idx))
    return out


def tune_threshold(
    split: SplitData, scores: np.ndarray, horizon_s: float, lead_min_s: float
) -> tuple[float, float]:
    """(threshold, event-level F1) maximizing F1 on ``split`` over TUNE_GRID."""
    best = (DEFAULT_THRESHOLD, -1.0)
    for t in TUNE_GRID:
        m = evaluate_scores(
            "tune", split, scores, float(t), horizon_s, lead_min_s, pr_curve=False
        ).metrics
        p, r = m["precision"], m["recall"]
        f1 = 0.0 if math.isnan(p) or math.isnan(r) or p + r == 0 else 2 * p * r / (p + r)
        if f1 > best[1]:
            best = (float(t), f1)
    return best


@dataclass
class TrainingOutcome:
    history_config: HistoryConfig
    train_config: TrainConfig
    gbt_config: GbtConfig
    lstm: HealthLSTM
    gbt: GbtHealthModel
    lstm_info: dict[str, Any]
    gbt_info: dict[str, Any]
    at_threshold: dict[str, EvalResult]  # the monitor's threshold
    tuned: dict[str, EvalResult]  # each model at its val-tuned threshold
    thresholds: dict[str, float]
    history_stats: dict[str, Any]
    history_cached: bool
    timings_s: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "history": self.history_stats,
            "history_cached": self.history_cached,
            "lstm": {k: v for k, v in self.lstm_info.items() if k != "val_pr_auc_by_epoch"},
            "gbt": self.gbt_info,
            "thresholds": self.thresholds,
            "test_at_monitor_threshold": {k: r.summary() for k, r in self.at_threshold.items()},
            "test_at_tuned_threshold": {k: r.summary() for k, r in self.tuned.items()},
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
        }

    def headline_metrics(self) -> dict[str, float]:
        """Flat metrics for MLflow: ``<model>_<metric>`` at the monitor threshold and
        ``tuned_<model>_<metric>`` at the val-tuned one."""
        out: dict[str, float] = {}
        for r in self.at_threshold.values():
            out.update(r.flat_metrics())
        for r in self.tuned.values():
            out.update({f"tuned_{k}": v for k, v in r.flat_metrics().items()})
        for k, v in self.thresholds.items():
            out[f"threshold_{k}"] = v
        out["lstm_val_pr_auc"] = float(self.lstm_info["val_pr_auc"])
        out["gbt_val_pr_auc"] = float(self.gbt_info["val_pr_auc"])
        for k, v in self.timings_s.items():
            out[f"time_{k}_s"] = v
        return {k: v for k, v in out.items() if not math.isnan(v)}


def train_and_evaluate(
    history_config: HistoryConfig | None = None,
    train_config: TrainConfig | None = None,
    gbt_config: GbtConfig | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    lead_min_s: float = DEFAULT_LEAD_MIN_S,
    cache: bool = True,
    history: History | None = None,
    progress: Progress | None = None,
) -> TrainingOutcome:
    """History (cached under GPUFLOW_HOME) -> LSTM + GBT -> test-split evaluation of the
    LSTM and every baseline."""
    say = progress or (lambda _m, _f: None)
    hc = history_config or (history.config if history else HistoryConfig())
    tc = train_config or TrainConfig()
    gc = gbt_config or GbtConfig()
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    cached = False
    if history is None:
        say("fleet history", 0.0)
        history, cached = load_or_generate(
            hc, cache=cache, progress=lambda m, f: say(f"history: {m}", 0.1 * f)
        )
    timings["history"] = time.perf_counter() - t
    horizon_s = history.config.horizon_s
    # One thread for the C/OpenMP pools (sklearn, numpy): two spin-waiting threads on a
    # busy 2-core machine ran ten times slower than one.
    with threadpool_limits(tc.threads) if tc.threads else contextlib.nullcontext():
        t = time.perf_counter()
        lstm, lstm_info = train_lstm(
            history, tc, progress=lambda m, f: say(f"LSTM: {m}", 0.1 + 0.5 * f)
        )
        timings["train_lstm"] = time.perf_counter() - t
        say("gradient-boosted trees", 0.6)
        t = time.perf_counter()
        gbt, gbt_info = train_gbt(history, tc, gc)
        timings["train_gbt"] = time.perf_counter() - t
        val, test = history.splits["val"], history.splits["test"]
        say("scoring the test split", 0.75)
        t = time.perf_counter()
        test_scores = {
            "lstm": score_split(lstm, test),
            "gbt": score_split(gbt, test),
            "rules": score_split(RuleModel(test.window), test),
        }
        timings["score_test"] = time.perf_counter() - t
        val_scores = {"lstm": score_split(lstm, val), "gbt": score_split(gbt, val)}
    say("evaluating", 0.85)
    t = time.perf_counter()
    thresholds = {"monitor": threshold}
    for name, s in val_scores.items():
        thresholds[name] = tune_threshold(val, s, horizon_s, lead_min_s)[0]
    at: dict[str, EvalResult] = {}
    tuned: dict[str, EvalResult] = {}
    for name in ("lstm", "gbt"):
        at[name] = evaluate_scores(name, test, test_scores[name], threshold, horizon_s, lead_min_s)
        tuned[name] = evaluate_scores(
            name, test, test_scores[name], thresholds[name], horizon_s, lead_min_s
        )
    at["rules"] = evaluate_scores("rules", test, test_scores["rules"], 0.5, horizon_s, lead_min_s)
    rand = random_scores(test.n_windows, seed=tc.seed)
    for target, bucket in ((at, "lstm"), (tuned, "lstm")):
        rate = target[bucket].metrics["alert_rate"]
        target["random"] = evaluate_scores(
            "random", test, rand, random_threshold_for(rate), horizon_s, lead_min_s
        )
    at["oracle"] = evaluate_scores(
        "oracle", test, oracle_scores(test, horizon_s), 0.5, horizon_s, lead_min_s
    )
    timings["evaluate"] = time.perf_counter() - t
    say("done", 1.0)
    return TrainingOutcome(
        hc,
        tc,
        gc,
        lstm,
        gbt,
        lstm_info,
        gbt_info,
        at,
        tuned,
        thresholds,
        history.stats,
        cached,
        timings,
    )


# -- MLflow ------------------------------------------------------------------------------------


def log_outcome(
    outcome: TrainingOutcome,
    experiment: str = EXPERIMENT,
    register: bool = True,
    model_name: str = REGISTERED_MODEL,
    alias: str = CHAMPION_ALIAS,
    run_name: str | None = None,
) -> dict[str, Any]:
    """One MLflow run: params, metrics, plots, summary; the LSTM logged and (optionally)
    registered as a new version of ``model_name`` with ``alias`` pointing at it."""
    import mlflow
    import torch
    from gpuflow.tasks.tracking import flat_params, tracking_uri, use_experiment
    from mlflow.tracking import MlflowClient

    experiment_id = use_experiment(experiment)
    uri = tracking_uri()
    mlflow.set_registry_uri(uri)  # the registry lives in the same store (see load_champion)
    client = MlflowClient(uri, registry_uri=uri)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name or "health-train") as run:
        run_id = run.info.run_id
        params = {
            **flat_params("history.", outcome.history_config.model_dump(mode="json")),
            **flat_params("train.", outcome.train_config.to_dict()),
            **flat_params("gbt.", outcome.gbt_config.to_dict()),
            "monitor_threshold": str(outcome.thresholds["monitor"]),
        }
        mlflow.log_params({k: v[:500] for k, v in params.items()})
        mlflow.log_metrics(outcome.headline_metrics())
        for step, ap in enumerate(outcome.lstm_info.get("val_pr_auc_by_epoch", [])):
            if not math.isinf(ap):
                mlflow.log_metric("lstm_val_pr_auc_epoch", ap, step=step)
        with tempfile.TemporaryDirectory() as tmp:
            tmp_p = Path(tmp)
            results = [outcome.at_threshold[k] for k in ("lstm", "gbt", "rules", "random")]
            plot_pr_curves(results, str(tmp_p / "pr_curve.png"))
            plot_lead_times(
                [outcome.at_threshold[k] for k in ("lstm", "gbt", "rules")],
                str(tmp_p / "lead_times.png"),
            )
            plot_pr_curves(
                [outcome.tuned[k] for k in ("lstm", "gbt", "random")],
                str(tmp_p / "pr_curve_tuned.png"),
            )
            plot_lead_times(
                [outcome.tuned[k] for k in ("lstm", "gbt")], str(tmp_p / "lead_times_tuned.png")
            )
            (tmp_p / "summary.json").write_text(
                json.dumps(outcome.summary(), indent=2, default=_json_default)
            )
            mlflow.log_artifacts(tmp, artifact_path="evaluation")
        model_info = mlflow.pytorch.log_model(
            outcome.lstm,
            name="model",
            serialization_format="pickle",  # a plain nn.Module of this package
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )
        mlflow.set_tags(
            {
                "gpuflow.capability": "health",
                "gpuflow.window_buckets": str(outcome.lstm.window),
                "gpuflow.horizon_s": str(outcome.lstm.horizon_s),
                "gpuflow.tuned_threshold": str(outcome.thresholds["lstm"]),
                # Which features each SKU lacked (its backend cannot read them); the full
                # lists are in evaluation/summary.json under history.
                "gpuflow.missing_features": json.dumps(
                    outcome.history_stats.get("missing_features_by_sku", {}), sort_keys=True
                )[:5000],
            }
        )
    result: dict[str, Any] = {"run_id": run_id, "model_uri": model_info.model_uri}
    if register:
        mv = mlflow.register_model(model_info.model_uri, model_name)
        client.set_registered_model_alias(model_name, alias, mv.version)
        client.set_model_version_tag(
            model_name, mv.version, "tuned_threshold", str(outcome.thresholds["lstm"])
        )
        result.update(
            {
                "model_name": model_name,
                "model_version": str(mv.version),
                "alias": alias,
                "registry_uri": f"models:/{model_name}@{alias}",
            }
        )
    return result


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


# -- Prefect tasks -----------------------------------------------------------------------------


load_history_task = task(load_or_generate, name="fleet-history", cache_policy=NONE)
train_and_evaluate_task = task(train_and_evaluate, name="train-and-evaluate", cache_policy=NONE)
log_outcome_task = task(
    log_outcome, name="record-in-mlflow", retries=2, retry_delay_seconds=2, cache_policy=NONE
)
