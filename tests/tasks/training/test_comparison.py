"""compare_results on hand-made results: every number below is worked out by hand.

The losses and times are chosen so the expected values are exact in binary floating
point (1.5, 2.5, 0.25), so the assertions compare with ==.
"""

from __future__ import annotations

import math

import pytest
from gpuflow.tasks.training.comparison import compare_results


def _result(eval_loss: float | None, wall_time_s: float, train_time_s: float, **kw) -> dict:
    return {"eval_loss": eval_loss, "wall_time_s": wall_time_s, "train_time_s": train_time_s, **kw}


BASE = _result(eval_loss=4.0, wall_time_s=120.0, train_time_s=100.0)


def test_speedup_step_speedup_and_delta() -> None:
    results = {
        "fp32": BASE,
        # |5 - 4| / 4 = 0.25; 120 / 80 = 1.5; 100 / 40 = 2.5
        "auto": _result(eval_loss=5.0, wall_time_s=80.0, train_time_s=40.0, switches=[{}, {}]),
        # |3 - 4| / 4 = 0.25 (the delta is absolute); 120 / 240 = 0.5; 100 / 400 = 0.25
        "bf16": _result(eval_loss=3.0, wall_time_s=240.0, train_time_s=400.0),
    }
    rows = compare_results(results, threshold=0.5)
    assert rows == [
        {
            "policy": "auto",
            "speedup": 1.5,
            "step_speedup": 2.5,
            "convergence_delta": 0.25,
            "baseline_eval_loss": 4.0,
            "eval_loss": 5.0,
            "switches": 2,
            "verdict": "pass",
        },
        {
            "policy": "bf16",
            "speedup": 0.5,
            "step_speedup": 0.25,
            "convergence_delta": 0.25,
            "baseline_eval_loss": 4.0,
            "eval_loss": 3.0,
            "switches": 0,
            "verdict": "pass",
        },
    ]


def test_only_the_baseline_gives_no_rows() -> None:
    assert compare_results({"fp32": BASE}, threshold=0.005) == []


@pytest.mark.parametrize(
    ("threshold", "verdict"),
    [
        (math.nextafter(0.25, math.inf), "pass"),  # the delta just below the threshold
        (0.25, "fail"),  # exactly at it: a pass needs delta < threshold
        (0.2, "fail"),  # above it
    ],
)
def test_verdict_against_threshold(threshold: float, verdict: str) -> None:
    results = {"fp32": BASE, "auto": _result(eval_loss=5.0, wall_time_s=80.0, train_time_s=40.0)}
    (row,) = compare_results(results, threshold)
    assert row["convergence_delta"] == 0.25
    assert row["verdict"] == verdict


@pytest.mark.parametrize("threshold", [0.0, -0.01])
def test_threshold_must_be_positive(threshold: float) -> None:
    with pytest.raises(ValueError, match=f"threshold must be > 0, got {threshold}"):
        compare_results({"fp32": BASE}, threshold)


def test_needs_the_fp32_baseline() -> None:
    with pytest.raises(ValueError, match="needs the fp32 baseline"):
        compare_results({"auto": _result(4.0, 80.0, 40.0)}, threshold=0.005)


@pytest.mark.parametrize("eval_loss", [None, 0.0])
def test_baseline_without_eval_loss(eval_loss: float | None) -> None:
    results = {"fp32": _result(eval_loss, 120.0, 100.0), "auto": _result(4.0, 80.0, 40.0)}
    with pytest.raises(ValueError, match="fp32 baseline has no eval loss"):
        compare_results(results, threshold=0.005)


def test_candidate_without_eval_loss() -> None:
    results = {"fp32": BASE, "auto": _result(4.0, 80.0, 40.0), "bf16": _result(None, 80.0, 40.0)}
    with pytest.raises(ValueError, match="candidate bf16 has no eval loss"):
        compare_results(results, threshold=0.005)


def test_arms_on_other_units_than_the_baseline_are_refused() -> None:
    here = {"units": ["GPU-a"], "sku": "NVIDIA A100-SXM4-40GB"}
    there = {"units": ["GPU-b"], "sku": "NVIDIA A100-SXM4-40GB"}
    results = {
        "fp32": _result(4.0, 120.0, 100.0, placement=here),
        "auto": _result(4.0, 80.0, 40.0, placement=here),
        "bf16": _result(4.0, 80.0, 40.0, placement=there),
    }
    with pytest.raises(ValueError, match=r"candidates \['bf16'\] ran elsewhere"):
        compare_results(results, threshold=0.005)
    del results["bf16"]
    assert [r["policy"] for r in compare_results(results, threshold=0.005)] == ["auto"]
