"""The edge bench's figure of how well a machine repeats its own timing."""

import json
from pathlib import Path

import pytest

from gpuflow.bench.edge_bench import plan_repeat_error

MEASURED = Path(__file__).resolve().parents[3] / "docs/measurements/h200-host-2026-12-04"


def test_plan_repeat_error_compares_the_two_stage_sums() -> None:
    # Cut differently, the same model timed alike: no disagreement.
    assert plan_repeat_error([30.0, 50.0], [40.0, 40.0]) == pytest.approx(0.0)
    assert plan_repeat_error([30.0, 34.0], [48.0, 48.0]) == pytest.approx(0.5)
    assert plan_repeat_error([50.0, 50.0], [40.0, 35.0]) == pytest.approx(-0.25)


def test_plan_repeat_error_refuses_an_empty_timing() -> None:
    with pytest.raises(ValueError, match="stage sums must be > 0"):
        plan_repeat_error([], [10.0])


def test_the_16_core_guest_repeated_its_timing_worse_than_the_stage_goal() -> None:
    """docs/benchmarks.md's table, from the raw JSON kept in the repository."""
    run = json.loads((MEASURED / "edge-run1.json").read_text())
    chain = run["resnet50 2 shards"]
    error = plan_repeat_error(chain["fwd_stage_ms_predicted"], chain["drv_stage_ms_predicted"])
    assert error == pytest.approx(0.512, abs=0.001)
