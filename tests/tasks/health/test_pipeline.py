"""Training outcome, MLflow record and registry, the champion the monitor loads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpuflow.tasks.health.features import N_FEATURES
from gpuflow.tasks.health.horizons import HORIZONS_S
from gpuflow.tasks.health.model import CHAMPION_ALIAS, REGISTERED_MODEL, load_champion
from gpuflow.tasks.health.monitor import RULES_URI, load_health_model
from gpuflow.tasks.health.pipeline import log_outcome, score_split
from gpuflow.tasks.health.registry import CHALLENGER_ALIAS, NO_CHALLENGER, load_challenger
from gpuflow.tasks.tracking import tracking_uri
from mlflow.tracking import MlflowClient


def test_outcome_compares_every_model(tiny_outcome, tiny_history) -> None:
    s = tiny_outcome.summary()
    at = s["test_at_monitor_threshold"]
    assert set(at) == {"lstm", "gbt", "rules", "random", "oracle"}
    assert set(s["test_at_tuned_threshold"]) == {"lstm", "gbt", "random"}
    oracle = at["oracle"]
    assert oracle["recall"] == 1.0 and oracle["precision"] == 1.0
    # the abrupt classes have no precursor: nothing but the oracle foresees them
    for name in ("rules", "lstm", "gbt"):
        for cls in ("xid79", "ecc-uncorrectable"):
            rec = at[name]["by_class"][cls]["recall"]
            assert math.isnan(rec) or rec == 0.0
    # The rules see every pending remap of an HBM degradation where the backend reads row
    # remaps (Ampere+); a V100's or a DCU's degradation gives them nothing to fire on, nor
    # does a silent HBM failure (no precursor), unless a benign remap happens to be pending.
    with_precursor, visible = _remap_visible_share(tiny_history)
    rules_hbm = at["rules"]["by_class"]["hbm"]["recall"]  # rounded to 6 places
    assert with_precursor - 1e-6 <= rules_hbm <= visible + 1e-6
    # random alarms are matched to the LSTM's alert rate
    tuned = tiny_outcome.tuned
    assert tuned["random"].threshold == pytest.approx(1 - tuned["lstm"].metrics["alert_rate"])
    metrics = tiny_outcome.headline_metrics()
    assert "lstm_pr_auc" in metrics and "tuned_gbt_recall" in metrics
    assert "lstm_brier_1h" in metrics and "gbt_ece_72h" in metrics
    assert all(not math.isnan(v) for v in metrics.values())


def test_champion_is_the_cheapest_on_validation(tiny_outcome) -> None:
    o = tiny_outcome
    assert {(r.model, r.horizon_s) for r in o.val_costs} == {
        (m, h) for m in ("rules", "gbt", "lstm") for h in HORIZONS_S
    }
    cheapest = min(r.cost_gpu_h_per_1000_dd for r in o.val_costs)
    mine = [
        r for r in o.val_costs if r.model == o.champion and r.horizon_s == o.horizons[o.champion]
    ]
    assert mine[0].cost_gpu_h_per_1000_dd == cheapest
    assert o.champion_model.horizon_s == o.horizons[o.champion]
    assert o.champion in o.champion_line() and "cost rule" in o.champion_line()
    # the challenger: the cheapest of the other kinds, at its own cheapest horizon
    others = [r for r in o.val_costs if r.model != o.champion]
    runner_up = min(others, key=lambda r: r.cost_gpu_h_per_1000_dd)
    assert o.challenger == runner_up.model != o.champion
    assert o.horizons[o.challenger] == runner_up.horizon_s
    # the rule's break-even risk is about 1 % for the reference job, at every horizon
    assert all(0.001 < r.threshold < 0.1 for r in o.val_costs)
    # doing nothing saves nothing: a model that never acts is at 0
    for r in o.val_costs:
        if r.alarms == 0:
            assert r.saved_gpu_h_per_1000_dd == pytest.approx(0.0, abs=1e-9)
    rep = o.calibration["lstm"]["1h"]
    assert 0.0 <= rep["brier"] <= 1.0 and 0.0 <= rep["ece"] <= 1.0 and rep["reliability"]


def _remap_visible_share(history) -> tuple[float, float]:
    """Shares of the test split's HBM failures on SKUs whose backend reads row remaps:
    those with a precursor, and all of them."""
    from gpuflow.hardware.sim.faults import uses_row_remapping
    from gpuflow.hardware.skus import sku
    from gpuflow.hardware.telemetry_fields import ROW_REMAP_FIELDS, real_backend_fields
    from gpuflow.tasks.health.history import build_fleet

    skus = {d.ordinal: sku(d.sku) for d in build_fleet(history.config)}
    test = history.splits["test"]
    hbm = np.flatnonzero(test.fail_kind == "hbm")
    assert len(hbm), "the tiny history has HBM failures in its test split"
    seen = np.array(
        [
            ROW_REMAP_FIELDS
            <= real_backend_fields(
                skus[int(test.fail_ordinal[i])].vendor,
                uses_row_remapping(skus[int(test.fail_ordinal[i])]),
            )
            for i in hbm
        ]
    )
    warned = test.fail_onset_s[hbm] < test.fail_s[hbm]  # silent ones fail at their onset
    assert not seen.all(), "the test split has HBM failures on a V100 or a DCU"
    return float(np.mean(seen & warned)), float(np.mean(seen))


def test_record_register_and_load_champion(tiny_outcome) -> None:
    with pytest.raises(LookupError, match="train one first"):
        load_champion()
    model, source = load_health_model(None)
    assert source.startswith(RULES_URI)  # no champion yet: the rules watch the fleet
    rec = log_outcome(tiny_outcome, run_name="test")
    assert rec["registry_uri"] == f"models:/{REGISTERED_MODEL}@{CHAMPION_ALIAS}"
    client = MlflowClient(tracking_uri())
    run = client.get_run(rec["run_id"])
    assert run.data.metrics["oracle_recall"] == 1.0
    assert "lstm_pr_auc" in run.data.metrics and "rules_precision" in run.data.metrics
    arts = {a.path for a in client.list_artifacts(rec["run_id"], "evaluation")}
    assert {
        "evaluation/pr_curve.png",
        "evaluation/lead_times.png",
        "evaluation/reliability.png",
        "evaluation/summary.json",
    } <= arts
    assert run.data.tags["gpuflow.champion"] == tiny_outcome.champion
    champion = load_champion()
    # the loaded champion is the trained one, at its horizon, and scores exactly like it
    trained = tiny_outcome.champion_model
    assert type(champion) is type(trained) and champion.horizon_s == trained.horizon_s
    w = np.random.default_rng(1).normal(size=(5, champion.window, N_FEATURES)).astype(np.float32)
    assert np.allclose(champion.predict_risk(w), trained.predict_risk(w), atol=1e-6)
    # Logged as code: MLflow's own loader serves it, windows in, a risk per horizon out,
    # by the signature it was logged with.
    import mlflow.pyfunc

    served = mlflow.pyfunc.load_model(rec["model_uri"])
    assert served.metadata.signature is not None
    assert served.metadata.flavors["python_function"].get("model_code_path")
    assert np.allclose(served.predict(w), trained.predict_risks(w), atol=1e-6)
    assert load_champion() is champion  # cached per version
    # a second registration moves the alias
    rec2 = log_outcome(tiny_outcome, run_name="test-2")
    assert rec2["model_version"] != rec["model_version"]
    assert load_champion() is not champion
    model, source = load_health_model(None)
    assert source == rec["registry_uri"]
    assert model.registry_version == rec2["model_version"]  # which version decided


def test_the_challenger_is_registered_beside_the_champion(tiny_outcome) -> None:
    assert load_challenger(None) == (None, None)  # nothing registered: no shadow
    rec = log_outcome(tiny_outcome, run_name="test")
    assert rec["challenger"] == tiny_outcome.challenger
    assert rec["challenger_uri"] == f"models:/{REGISTERED_MODEL}@{CHALLENGER_ALIAS}"
    model, source = load_challenger(None)
    trained = tiny_outcome.model(tiny_outcome.challenger)
    assert source == rec["challenger_uri"] and type(model) is type(trained)
    assert model.horizon_s == tiny_outcome.horizons[tiny_outcome.challenger]
    assert model.registry_version == rec["challenger_version"] != rec["model_version"]
    client = MlflowClient(tracking_uri())
    tags = client.get_model_version(REGISTERED_MODEL, rec["challenger_version"]).tags
    assert tags["role"] == CHALLENGER_ALIAS and tags["challenger"] == tiny_outcome.challenger
    assert client.get_model_version(REGISTERED_MODEL, rec["model_version"]).tags["role"] == (
        "champion"
    )
    # The champion named by URI brings its own challenger; rules, or "none", bring none.
    champion_uri = f"models:/{REGISTERED_MODEL}@{CHAMPION_ALIAS}"
    assert load_challenger(champion_uri)[1] == rec["challenger_uri"]
    assert load_challenger(RULES_URI) == (None, None)
    assert load_challenger(None, NO_CHALLENGER) == (None, None)
    assert load_challenger(None, RULES_URI)[1] == RULES_URI  # an explicit one is loaded
    with pytest.raises(ValueError, match="no-such"):
        load_challenger(None, "models:/no-such@champion")
    # Under another alias, its challenger beside it; a challenger watched has none.
    staged = log_outcome(tiny_outcome, run_name="staged", alias="staging")
    assert staged["challenger_uri"] == f"models:/{REGISTERED_MODEL}@staging-challenger"
    assert load_challenger(f"models:/{REGISTERED_MODEL}@staging")[1] == staged["challenger_uri"]
    assert load_challenger(staged["challenger_uri"]) == (None, None)


def test_score_split_batches(tiny_outcome, tiny_history) -> None:
    sp = tiny_history.splits["test"]
    full = tiny_outcome.lstm.predict_risk(sp.windows())
    assert np.allclose(score_split(tiny_outcome.lstm, sp, batch=1000), full, atol=1e-6)


def test_a_priced_cordon_raises_every_candidates_threshold(tiny_outcome, tiny_history) -> None:
    """The champion is chosen by the cluster's costs: priced cordons move every learned
    candidate's threshold up to (A + K) / (F + K) and cost each false alarm K more."""
    from gpuflow.tasks.health.champion import cost_table
    from gpuflow.tasks.health.decision import CostDefaults
    from gpuflow.tasks.health.pipeline import score_split_all

    val = tiny_history.splits["val"]
    models = {m: tiny_outcome.model(m) for m in ("rules", "gbt", "lstm")}
    risks = {m: score_split_all(x, val) for m, x in models.items()}
    free = cost_table(models, val, risks)
    dear = cost_table(
        models, val, risks, defaults=CostDefaults(cordon_hold_s=86_400.0, cordon_price=1.0)
    )
    for a, b in zip(free, dear, strict=True):
        assert (a.model, a.horizon_s) == (b.model, b.horizon_s)
        assert b.threshold > 5 * a.threshold
    assert tiny_outcome.costs == CostDefaults()  # chosen by the defaults unless told
