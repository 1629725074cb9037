"""What benches share about their figures: intervals, and a result as MLflow metrics."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95 % t interval of the mean (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    from scipy import stats

    t = float(stats.t.ppf(0.975, len(values) - 1))
    return t * statistics.stdev(values) / len(values) ** 0.5


def flat_metrics(out: Mapping[str, Any]) -> dict[str, float]:
    """A bench result's numbers as ``<section>.<key>`` metrics (flags and text left out)."""
    return {
        f"{section}.{key}": float(value)
        for section, values in out.items()
        if isinstance(values, dict)
        for key, value in values.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
