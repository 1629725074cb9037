"""Train the LSTM and the baselines on a fleet history, choose the champion by the cost of
its decisions on validation, evaluate all on the test split, and record it: MLflow metrics,
PR-curve, lead-time and reliability plots, the champion in the registry.

Splits: train (fit), validation halved by node into *val* (early stopping, the champion's
choice) and *cal* (calibration, tasks.health.calibration), test (everything reported).

Per model, one horizon: the one at which its decisions cost least on val (tasks.health.
champion: the cost rule of tasks.health.decision for a reference job); the champion is the
cheapest (model, horizon) overall, whatever kind it is (rules included). On test, each
model at its horizon is evaluated at three operating points: the cost rule's break-even
risk (what the monitor does), the drain level (0.85, the same for every model since all
risks are calibrated probabilities) and a threshold tuned on val (best event-level F1);
plus Brier, ECE and reliability per horizon, and the cost table at every horizon.
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
from gpuflow.tasks.health.calibration import calibration_report, plot_reliability
from gpuflow.tasks.health.champion import (
    CostResult,
    best_by_model,
    challenger_of,
    champion_of,
    cost_table,
    decision_threshold,
    reference_costs,
)
from gpuflow.tasks.health.decision import CostDefaults
from gpuflow.tasks.health.evaluate import (
    DEFAULT_LEAD_MIN_S,
    DEFAULT_THRESHOLD,
    EvalResult,
    evaluate_scores,
    plot_lead_times,
    plot_pr_curves,
    random_threshold_for,
)
from gpuflow.tasks.health.features import N_FEATURES
from gpuflow.tasks.health.history import History, HistoryConfig, SplitData, load_or_generate
from gpuflow.tasks.health.history_splits import carve_calibration
from gpuflow.tasks.health.horizons import HORIZONS_S, horizon_label, multi_labels
from gpuflow.tasks.health.model import (
    CHAMPION_ALIAS,
    EXPERIMENT,
    HEALTH_PYFUNC_CODE,
    REGISTERED_MODEL,
    HealthLSTM,
    TrainConfig,
    save_health_model,
    train_lstm,
)
from gpuflow.tasks.health.registry import CHALLENGER_ALIAS, challenger_alias_for
from prefect import task
from prefect.cache_policies import NONE
from threadpoolctl import threadpool_limits

Progress = Callable[[str, float], None]
# Calibrated risks are small: the grid is logarithmic below 0.1.
TUNE_GRID = tuple(
    float(x)
    for x in np.round(np.concatenate([np.logspace(-4, -1, 13), np.linspace(0.15, 0.95, 17)]), 6)
)
LEARNED = ("lstm", "gbt")
# Failures each half of the validation split needs for the calibration split to be carved
# out of it; below, the whole validation split calibrates too (a tiny fleet's).
MIN_CARVE_FAILURES = 5
CANDIDATES = ("rules", "gbt", "lstm")


def score_split(model: Any, split: SplitData, batch: int = 100_000) -> np.ndarray:
    """Risk of every window of ``split`` at the model's horizon, in batches (a test split
    can hold millions)."""
    out = np.empty(split.n_windows, dtype=np.float32)
    for i in range(0, split.n_windows, batch):
        idx = np.arange(i, min(i + batch, split.n_windows))
        out[idx] = model.predict_risk(split.windows(idx))
    return out


def score_split_all(model: Any, split: SplitData, batch: int = 100_000) -> np.ndarray:
    """Risks [n, H] of every window of ``split`` at every horizon of the model."""
    out = np.empty((split.n_windows, len(model.horizons_s)), dtype=np.float32)
    for i in range(0, split.n_windows, batch):
        idx = np.arange(i, min(i + batch, split.n_windows))
        out[idx] = model.predict_risks(split.windows(idx))
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
    at_threshold: dict[str, EvalResult]  # the drain level (0.85)
    tuned: dict[str, EvalResult]  # each learned model at its val-tuned threshold
    thresholds: dict[str, float]
    history_stats: dict[str, Any]
    history_cached: bool
    timings_s: dict[str, float] = field(default_factory=dict)
    rules: RuleModel | None = None
    at_cost: dict[str, EvalResult] = field(default_factory=dict)  # the cost rule (monitor)
    horizons: dict[str, float] = field(default_factory=dict)  # each model's chosen horizon
    champion: str = "lstm"
    val_costs: list[CostResult] = field(default_factory=list)
    test_costs: list[CostResult] = field(default_factory=list)
    calibration: dict[str, dict[str, Any]] = field(default_factory=dict)  # test, per model
    calibration_split: str = ""
    costs: CostDefaults = field(default_factory=CostDefaults)  # what the champion was chosen by
    challenger: str | None = None  # the cheapest of another kind: scored in shadow

    def model(self, name: str) -> Any:
        return {"lstm": self.lstm, "gbt": self.gbt, "rules": self.rules}[name]

    @property
    def champion_model(self) -> Any:
        return self.model(self.champion)

    def champion_line(self) -> str:
        """Which model decides, at which horizon and threshold, and why."""
        return self.line_for(self.champion)

    def challenger_line(self) -> str | None:
        return None if self.challenger is None else self.line_for(self.challenger)

    def line_for(self, name: str) -> str:
        """``name`` at its horizon, with its validation figure by the cost rule."""
        h = self.horizons.get(name, HORIZONS_S[0])
        best = {r.model: r for r in self.val_costs if r.horizon_s == h}.get(name)
        why = (
            f"; on validation it saves {best.saved_gpu_h_per_1000_dd:.2f} GPU-h per 1,000 "
            f"device-days at break-even risk {best.threshold:.4f}"
            if best is not None
            else ""
        )
        return f"{name} within {horizon_label(h)}, by the cost rule{why}"

    def summary(self) -> dict[str, Any]:
        return {
            "history": self.history_stats,
            "history_cached": self.history_cached,
            "lstm": {k: v for k, v in self.lstm_info.items() if k != "val_pr_auc_by_epoch"},
            "gbt": self.gbt_info,
            "champion": self.champion,
            "champion_line": self.champion_line(),
            "challenger": self.challenger,
            "challenger_line": self.challenger_line(),
            "horizons": {k: horizon_label(v) for k, v in self.horizons.items()},
            "thresholds": self.thresholds,
            "val_costs": [r.to_dict() for r in self.val_costs],
            "test_costs": [r.to_dict() for r in self.test_costs],
            "test_at_cost_rule": {k: r.summary() for k, r in self.at_cost.items()},
            "test_at_monitor_threshold": {k: r.summary() for k, r in self.at_threshold.items()},
            "test_at_tuned_threshold": {k: r.summary() for k, r in self.tuned.items()},
            "calibration_split": self.calibration_split,
            "test_calibration": self.calibration,
            "timings_s": {k: round(v, 3) for k, v in self.timings_s.items()},
        }

    def headline_metrics(self) -> dict[str, float]:
        """Flat metrics for MLflow: ``<model>_<metric>`` at the drain level,
        ``tuned_<model>_<metric>`` at the val-tuned threshold, ``cost_<model>_<metric>`` at
        the cost rule, ``<model>_brier_<h>`` / ``<model>_ece_<h>`` on test."""
        out: dict[str, float] = {}
        for r in self.at_threshold.values():
            out.update(r.flat_metrics())
        for r in self.tuned.values():
            out.update({f"tuned_{k}": v for k, v in r.flat_metrics().items()})
        for r in self.at_cost.values():
            out.update({f"cost_{k}": v for k, v in r.flat_metrics().items()})
        for k, v in self.thresholds.items():
            out[f"threshold_{k}"] = v
        for name, rep in self.calibration.items():
            for h, m in rep.items():
                out[f"{name}_brier_{h}"] = m["brier"]
                out[f"{name}_ece_{h}"] = m["ece"]
        for r in self.val_costs:
            out[f"val_saved_gpu_h_{r.model}_{horizon_label(r.horizon_s)}"] = (
                r.saved_gpu_h_per_1000_dd
            )
        for r in self.test_costs:
            out[f"test_saved_gpu_h_{r.model}_{horizon_label(r.horizon_s)}"] = (
                r.saved_gpu_h_per_1000_dd
            )
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
    costs: CostDefaults | None = None,
) -> TrainingOutcome:
    """History (cached under GPUFLOW_HOME) -> LSTM + GBT -> the champion by cost on val ->
    test-split evaluation of every model and baseline (see the module doc)."""
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
    val, cal = carve_calibration(history.splits["val"], history.config)
    carved = min(len(val.fail_s), len(cal.fail_s)) >= MIN_CARVE_FAILURES
    if not carved:  # too small a validation split to halve: it does both (the summary says)
        val = cal = history.splits["val"]
    test = history.splits["test"]
    # One thread for the C/OpenMP pools (sklearn, numpy): two spin-waiting threads on a
    # busy 2-core machine ran ten times slower than one.
    with threadpool_limits(tc.threads) if tc.threads else contextlib.nullcontext():
        t = time.perf_counter()
        lstm, lstm_info = train_lstm(
            history, tc, lambda m, f: say(f"LSTM: {m}", 0.1 + 0.5 * f), val=val, cal=cal
        )
        timings["train_lstm"] = time.perf_counter() - t
        say("gradient-boosted trees", 0.6)
        t = time.perf_counter()
        gbt, gbt_info = train_gbt(history, tc, gc, val=val, cal=cal)
        timings["train_gbt"] = time.perf_counter() - t
        rules = RuleModel(test.window)
        models = {"rules": rules, "gbt": gbt, "lstm": lstm}
        say("scoring validation and test", 0.75)
        t = time.perf_counter()
        val_risks = {k: score_split_all(m, val) for k, m in models.items()}
        test_risks = {k: score_split_all(m, test) for k, m in models.items()}
        timings["score"] = time.perf_counter() - t
    say("choosing the champion by cost", 0.85)
    t = time.perf_counter()
    costs = costs or CostDefaults()
    val_costs = cost_table(models, val, val_risks, lead_min_s, costs)
    horizons = {k: r.horizon_s for k, r in best_by_model(val_costs).items()}
    for k, m in models.items():
        m.use_horizon(horizons[k])
    champion = champion_of(val_costs).model
    runner_up = challenger_of(val_costs, champion)
    test_costs = cost_table(models, test, test_risks, lead_min_s, costs)

    def at(name: str) -> np.ndarray:
        return test_risks[name][:, models[name].horizons_s.index(horizons[name])]

    thresholds: dict[str, float] = {"monitor": threshold}
    at_threshold: dict[str, EvalResult] = {}
    tuned: dict[str, EvalResult] = {}
    at_cost: dict[str, EvalResult] = {}
    for name in LEARNED:
        h = horizons[name]
        j = models[name].horizons_s.index(h)
        thresholds[name] = tune_threshold(val, val_risks[name][:, j], h, lead_min_s)[0]
        thresholds[f"{name}_cost"] = decision_threshold(h, reference_costs(costs))
        at_threshold[name] = evaluate_scores(name, test, at(name), threshold, h, lead_min_s)
        tuned[name] = evaluate_scores(name, test, at(name), thresholds[name], h, lead_min_s)
        at_cost[name] = evaluate_scores(
            name, test, at(name), thresholds[f"{name}_cost"], h, lead_min_s
        )
    h_rules = horizons["rules"]
    at_threshold["rules"] = evaluate_scores("rules", test, at("rules"), 0.5, h_rules, lead_min_s)
    at_cost["rules"] = at_threshold["rules"]
    rand = random_scores(test.n_windows, seed=tc.seed)
    h_lstm = horizons["lstm"]
    for target in (at_threshold, tuned):
        rate = target["lstm"].metrics["alert_rate"]
        target["random"] = evaluate_scores(
            "random", test, rand, random_threshold_for(rate), h_lstm, lead_min_s
        )
    h_champ = horizons[champion]
    at_threshold["oracle"] = evaluate_scores(
        "oracle", test, oracle_scores(test, h_champ), 0.5, h_champ, lead_min_s
    )
    y_test = multi_labels(test.ttf_s, HORIZONS_S)
    calibration = {
        name: calibration_report(y_test, test_risks[name], test.weight, HORIZONS_S)
        for name in LEARNED
    }
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
        at_threshold,
        tuned,
        thresholds,
        history.stats,
        cached,
        timings,
        rules=rules,
        at_cost=at_cost,
        horizons=horizons,
        champion=champion,
        challenger=runner_up.model if runner_up is not None else None,
        val_costs=val_costs,
        test_costs=test_costs,
        calibration=calibration,
        calibration_split="cal (half of val's nodes)"
        if carved
        else "val (too few failures to halve)",
        costs=costs,
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
    """One MLflow run: params, metrics, plots (PR curves, lead times, reliability),
    summary; the champion (whatever kind won on cost) logged as a pyfunc and (optionally)
    registered as a new version of ``model_name`` with ``alias`` pointing at it, tagged
    with its kind, horizon and decision threshold."""
    import mlflow
    from gpuflow.tasks.tracking import flat_params, tracking_uri, use_experiment
    from mlflow.tracking import MlflowClient

    experiment_id = use_experiment(experiment)
    uri = tracking_uri()
    mlflow.set_registry_uri(uri)  # the registry lives in the same store (see load_champion)
    client = MlflowClient(uri, registry_uri=uri)
    champ = outcome.champion_model
    champ_h = outcome.horizons.get(outcome.champion, champ.horizon_s)
    champ_costs = reference_costs(outcome.costs)
    champ_t = decision_threshold(champ_h, champ_costs) if outcome.champion != "rules" else 0.5
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name or "health-train") as run:
        run_id = run.info.run_id
        params = {
            **flat_params("history.", outcome.history_config.model_dump(mode="json")),
            **flat_params("train.", outcome.train_config.to_dict()),
            **flat_params("gbt.", outcome.gbt_config.to_dict()),
            **flat_params("costs.", outcome.costs.to_dict()),
            "monitor_threshold": str(outcome.thresholds["monitor"]),
            "horizons_s": json.dumps(list(HORIZONS_S)),
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
                [outcome.at_cost[k] for k in ("lstm", "gbt", "rules")],
                str(tmp_p / "lead_times.png"),
            )
            plot_pr_curves(
                [outcome.tuned[k] for k in ("lstm", "gbt", "random")],
                str(tmp_p / "pr_curve_tuned.png"),
            )
            plot_lead_times(
                [outcome.tuned[k] for k in ("lstm", "gbt")], str(tmp_p / "lead_times_tuned.png")
            )
            plot_reliability(outcome.calibration, str(tmp_p / "reliability.png"))
            (tmp_p / "summary.json").write_text(
                json.dumps(outcome.summary(), indent=2, default=_json_default)
            )
            mlflow.log_artifacts(tmp, artifact_path="evaluation")
        model_info = _log_pyfunc(champ, "model")
        challenger_info = (
            _log_pyfunc(outcome.model(outcome.challenger), CHALLENGER_ALIAS)
            if outcome.challenger is not None
            else None
        )
        tags = {
            "gpuflow.capability": "health",
            "gpuflow.champion": outcome.champion,
            "gpuflow.champion_line": outcome.champion_line(),
            "gpuflow.window_buckets": str(champ.window),
            "gpuflow.horizon_s": str(champ_h),
            "gpuflow.decision_threshold": str(champ_t),
            "gpuflow.tuned_threshold": str(outcome.thresholds.get(outcome.champion, champ_t)),
            # Which features each SKU lacked (its backend cannot read them); the full
            # lists are in evaluation/summary.json under history.
            "gpuflow.missing_features": json.dumps(
                outcome.history_stats.get("missing_features_by_sku", {}), sort_keys=True
            )[:5000],
        }
        mlflow.set_tags(tags)
    result: dict[str, Any] = {
        "run_id": run_id,
        "model_uri": model_info.model_uri,
        "champion": outcome.champion,
        "champion_line": outcome.champion_line(),
    }
    if register:
        mv = mlflow.register_model(model_info.model_uri, model_name)
        client.set_registered_model_alias(model_name, alias, mv.version)
        for key in ("champion", "champion_line", "horizon_s", "decision_threshold"):
            client.set_model_version_tag(model_name, mv.version, key, tags[f"gpuflow.{key}"])
        client.set_model_version_tag(model_name, mv.version, "role", "champion")
        result.update(
            {
                "model_name": model_name,
                "model_version": str(mv.version),
                "alias": alias,
                "registry_uri": f"models:/{model_name}@{alias}",
            }
        )
    if register and challenger_info is not None and outcome.challenger is not None:
        # Beside the champion, scored in shadow by the monitor (tasks.health.shadow).
        ch_alias = challenger_alias_for(alias)
        ch_h = outcome.horizons[outcome.challenger]
        ch_t = decision_threshold(ch_h, champ_costs) if outcome.challenger != "rules" else 0.5
        cv = mlflow.register_model(challenger_info.model_uri, model_name)
        client.set_registered_model_alias(model_name, ch_alias, cv.version)
        for key, value in (
            ("role", CHALLENGER_ALIAS),
            ("challenger", outcome.challenger),
            ("challenger_line", outcome.challenger_line() or ""),
            ("horizon_s", str(ch_h)),
            ("decision_threshold", str(ch_t)),
        ):
            client.set_model_version_tag(model_name, cv.version, key, value)
        result.update(
            {
                "challenger": outcome.challenger,
                "challenger_line": outcome.challenger_line(),
                "challenger_version": str(cv.version),
                "challenger_uri": f"models:/{model_name}@{ch_alias}",
            }
        )
    return result


def _log_pyfunc(model: Any, name: str) -> Any:
    """``model`` logged into the active run as a pyfunc under ``name``. Windows in, a
    risk per horizon out: stated (no type hint can say it), with an all-zero window as
    the example MLflow keeps beside it."""
    import mlflow
    from mlflow.models import infer_signature

    example = np.zeros((1, model.window, N_FEATURES), dtype=np.float32)
    signature = infer_signature(example, model.predict_risks(example))
    with tempfile.TemporaryDirectory() as tmp:
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=HEALTH_PYFUNC_CODE,
            artifacts=save_health_model(model, Path(tmp)),
            signature=signature,
            input_example=example,
            pip_requirements=_requirements(),
        )


def _requirements() -> list[str]:
    import sklearn
    import torch

    return [f"torch=={torch.__version__.split('+')[0]}", f"scikit-learn=={sklearn.__version__}"]


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
