"""The tour's size knob (gpuflow/tour/__init__.py); the whole tour runs, `--quick`, in
tests/gpuflow/test_controlplane.py before `gpuflow up` shows what it recorded."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError

from gpuflow.tour import TourSize


def test_quick_is_smaller_in_every_step() -> None:
    full, quick = TourSize(), TourSize.quick()
    assert quick.compare_steps < full.compare_steps
    assert quick.compare_batch_size < full.compare_batch_size
    assert quick.remediation_steps < full.remediation_steps
    assert quick.edge_requests < full.edge_requests
    # the full tour's champion learns from the production fleet at its real fault rate, the
    # smoke run's from the small raised-hazard fleet
    assert full.health_real_rate and not quick.health_real_rate


def test_a_health_fleet_that_is_not_a_bool_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="TourSize.health_real_rate must be a bool"):
        TourSize(health_real_rate="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("compare_steps", 0),
        ("compare_batch_size", 0),
        ("remediation_steps", 5),
        ("edge_requests", True),
        ("compare_steps", 2.5),
    ],
)
def test_a_size_that_cannot_run_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError, match=f"TourSize.{field} must be an int"):
        TourSize(**{field: value})


def test_the_champion_panel_shows_each_candidate_at_its_chosen_horizon_best_first() -> None:
    from gpuflow.tour.health import validation_line

    def row(model: str, horizon: str, saved: float) -> dict:
        return {"model": model, "horizon": horizon, "saved_gpu_h_per_1000_dd": saved}

    rows = [
        row("rules", "1h", 196.35),
        row("rules", "6h", 196.35),
        row("gbt", "1h", -155.0),
        row("gbt", "24h", -2748.0),
        row("lstm", "1h", -937.0),
        row("lstm", "24h", -783.4),
    ]
    chosen = {"rules": "1h", "gbt": "1h", "lstm": "24h"}
    assert validation_line(rows, chosen) == "rules +196 (1h), gbt -155 (1h), lstm -783 (24h)"
    # the horizon shown is the pipeline's choice, and a learned model that saves more is first
    assert validation_line([*rows, row("lstm", "72h", 250.0)], {**chosen, "lstm": "72h"}) == (
        "lstm +250 (72h), rules +196 (1h), gbt -155 (1h)"
    )
