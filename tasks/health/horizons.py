"""The risk's horizons: P(fail within 1 h, 6 h, 24 h, 72 h), one consistent model.

Lead times run from minutes (abrupt classes: none) to days (HBM median 36 h, thermal 5 d),
so one 30-minute label (the old model's) rewarded only the last half hour of a precursor
that can be seen for days. A window's labels come from its time to failure (``ttf_s``):
``y[:, j] = ttf <= HORIZONS_S[j]``, nested by construction.

A discrete-time hazard makes the horizons consistent: per interval [0, 1 h), [1 h, 6 h),
[6 h, 24 h), [24 h, 72 h) a hazard h_j = P(fail in interval j | not before), and
P(T <= H_j) = 1 - prod_{i <= j} (1 - h_i), monotone in j whatever the hazards are. The LSTM
has such a head; the trees fit one classifier per horizon and take the running maximum.
"""

from __future__ import annotations

from typing import Any

import numpy as np

HOUR_S = 3600.0
HORIZONS_S: tuple[float, ...] = (HOUR_S, 6 * HOUR_S, 24 * HOUR_S, 72 * HOUR_S)
# An alarm counts only if it came this long before the failure: time to checkpoint.
DEFAULT_LEAD_MIN_S = 300.0


def horizon_label(h_s: float) -> str:
    return f"{h_s / HOUR_S:g}h"


def check_horizons(horizons_s: Any) -> tuple[float, ...]:
    """Strictly increasing positive horizons in seconds, else ValueError."""
    try:
        hs = tuple(float(h) for h in horizons_s)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"horizons_s must be numbers of seconds, got {horizons_s!r}") from exc
    if not hs or hs[0] <= 0 or any(b <= a for a, b in zip(hs, hs[1:], strict=False)):
        raise ValueError(f"horizons_s must be increasing and > 0, got {horizons_s!r}")
    return hs


def multi_labels(ttf_s: np.ndarray, horizons_s: tuple[float, ...] = HORIZONS_S) -> np.ndarray:
    """[n, H] float32: fails within each horizon (ttf in (0, H_j])."""
    ttf = np.asarray(ttf_s, dtype=np.float64)[:, None]
    h = np.asarray(horizons_s)[None, :]
    return ((ttf > 0) & (ttf <= h)).astype(np.float32)


def interval_index(ttf_s: np.ndarray, horizons_s: tuple[float, ...] = HORIZONS_S) -> np.ndarray:
    """The hazard interval each failure falls in (0..H-1); H: none within the last horizon."""
    ttf = np.asarray(ttf_s, dtype=np.float64)
    idx = np.searchsorted(np.asarray(horizons_s), ttf, side="left")
    return np.where(ttf > 0, idx, len(horizons_s)).astype(np.int64)


def cumulative_from_hazards(hazard: np.ndarray) -> np.ndarray:
    """[n, H] P(T <= H_j) from per-interval hazards [n, H] (numpy)."""
    return 1.0 - np.cumprod(1.0 - hazard, axis=-1)


def monotone(p: np.ndarray) -> np.ndarray:
    """Risks made non-decreasing across horizons (running maximum), clipped to [0, 1]."""
    return np.clip(np.maximum.accumulate(p, axis=-1), 0.0, 1.0)
