"""`gpuflow bench multimodal`'s pure parts: the overlap bound, the interval and the
verdict. The arms themselves are real jobs (tests/tasks/multimodal/test_job.py covers the
launcher they run on)."""

from __future__ import annotations

import pytest

from gpuflow.bench.figures import ci95, flat_metrics
from gpuflow.bench.multimodal_bench import SEED_CLAIM_SPEEDUP, overlap_bound, seed_claim


def test_overlap_bound_is_all_work_over_the_longer_branch_and_the_head() -> None:
    assert overlap_bound({"vision": 3.0, "text": 1.0, "head": 0.0}) == pytest.approx(4 / 3)
    assert overlap_bound({"vision": 1.0, "text": 1.0, "head": 1.0}) == pytest.approx(1.5)
    # Two equal towers and a free head: at most twice as fast, never the seed's 2.3.
    assert overlap_bound({"vision": 2.0, "text": 2.0, "head": 0.0}) == 2.0 < SEED_CLAIM_SPEEDUP


def test_ci95_is_the_t_interval_of_the_mean() -> None:
    assert ci95([1.0]) == 0.0
    # n = 3, sd = 1: t(0.975, 2) = 4.303 over sqrt(3).
    assert ci95([1.0, 2.0, 3.0]) == pytest.approx(4.3027 / 3**0.5, rel=1e-3)


def test_flat_metrics_keep_numbers_of_sections_only() -> None:
    out = {"machine": "x", "a": {"n": 2, "f": 0.5, "ok": True, "s": "text"}, "b": {"m": 1.0}}
    assert flat_metrics(out) == {"a.n": 2.0, "a.f": 0.5, "b.m": 1.0}


@pytest.mark.parametrize(
    ("speedup", "ci", "verdict"),
    [(1.4, 0.1, "not reproduced"), (2.25, 0.1, "reproduced"), (2.5, 0.0, "reproduced")],
)
def test_the_claim_is_reproduced_only_when_the_interval_reaches_it(
    speedup: float, ci: float, verdict: str
) -> None:
    out = seed_claim({"branch.speedup": speedup, "branch.speedup_ci95": ci, "overlap_bound": 1.8})
    assert out["verdict"] == verdict and out["claim_speedup"] == SEED_CLAIM_SPEEDUP
