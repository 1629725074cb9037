"""The tour's health champion: `health_train` on a seed-pinned twin history, before the fault.

The tour's monitor runs the registered champion (tasks.health.registry), and a fresh
GPUFLOW_HOME has none, so before this step the threshold rules decided by default and
the tour could not say whether a learned model would have. Now it trains the candidates
the production flow trains - the LSTM, gradient-boosted trees and the rules - registers
whichever saves the most GPU-hours on validation by the cost rule, and the fault step's
monitor loads that. Whichever wins is shown with every candidate's validation figure, so
the tour says what decided and why.

Which history: the tour trains on the production run's own fleet (``HistoryConfig()``:
2,048 nodes x 365 days at the twin's real fault rate), with the small LSTM and 50 trees
(about 1.5 minutes on 2 cores). ``HistoryConfig.small()`` raises the fault rate ninefold
so that 96 nodes fail often enough, while benign pending remaps stay at their real rate;
a pending remap is then far likelier to precede a failure than on a real fleet, which
hands the threshold rules a precision no real fleet gives them (docs/health.md, "At the
fleet's real fault rate"). The quick tour, a smoke run, still trains on it (about 25 s),
and there the rules win.

It registers under a name of its own (TOUR_MODEL): the tour records into the MLflow store
`gpuflow up` serves, and moving ``gpuflow-health@champion`` there would change what the
platform's own monitor runs.
"""

from __future__ import annotations

from typing import Any

TOUR_MODEL = "gpuflow-health-tour"


def validation_line(val_costs: list[dict[str, Any]], horizons: dict[str, str]) -> str:
    """'rules +196 (1h), gbt -155 (1h), lstm -783 (24h)', best first: each candidate's
    validation figure at the horizon the pipeline chose for it (champion.best_by_model),
    both from ``TrainingOutcome.summary()``."""
    chosen = [r for r in val_costs if r["horizon"] == horizons.get(r["model"])]
    ranked = sorted(chosen, key=lambda r: -r["saved_gpu_h_per_1000_dd"])
    return ", ".join(
        f"{r['model']} {r['saved_gpu_h_per_1000_dd']:+.0f} ({r['horizon']})" for r in ranked
    )


REAL_RATE_FLEET = "2,048 nodes x 365 days at the real fault rate (HistoryConfig())"
SMALL_FLEET = "96 nodes x 120 days at a 9x raised fault rate (HistoryConfig.small())"


def train_champion(real_rate: bool = True) -> dict[str, Any]:
    """Run the health_train flow (small models, registering the champion as TOUR_MODEL) on
    the production fleet at its real fault rate, or (``real_rate=False``, the quick tour)
    on the small raised-hazard fleet; what it chose, and under "registered" the URI the
    fault step's monitor loads."""
    from gpuflow.flows.health_train import health_train
    from gpuflow.tasks.health.history_config import HistoryConfig

    # quick=True: the small LSTM and 50 trees; an explicit history wins over its fleet.
    out = health_train(
        history=HistoryConfig() if real_rate else None, quick=True, model_name=TOUR_MODEL
    )
    summary = out["summary"]
    return {
        "history": REAL_RATE_FLEET if real_rate else SMALL_FLEET,
        "champion": out["champion"],
        "decided by": out["champion_line"],
        "validation net GPU-h saved / 1,000 device-days": validation_line(
            summary["val_costs"], summary["horizons"]
        ),
        "validation failures": summary["history"].get("splits", {}).get("val", {}).get("failures"),
        "registered": out.get("registry_uri"),
        "mlflow run": out["run_id"],
    }
