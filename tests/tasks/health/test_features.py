"""features.py's pure parts: XID classes and window shapes (the fleet's state: test_fleet_windows)."""

from __future__ import annotations

import numpy as np
from gpuflow.hardware.health import CRITICAL_XIDS
from gpuflow.tasks.health.features import (
    FEATURES,
    N_FEATURES,
    XID_BUS,
    XID_MEMORY,
    sliding_windows,
    summary_features,
    xid_class_counts,
)


def test_xid_classes_cover_the_critical_set() -> None:
    assert XID_MEMORY | XID_BUS == CRITICAL_XIDS
    assert xid_class_counts([48, 63, 79, 13, 31, 999]) == (2, 1, 2, 1)


def test_sliding_and_summary_shapes() -> None:
    b = np.arange(20 * N_FEATURES, dtype=np.float32).reshape(20, N_FEATURES)
    w = sliding_windows(b, 12)
    assert w.shape == (9, 12, N_FEATURES)
    assert np.array_equal(w[3], b[3:15])
    s = summary_features(w)
    assert s.shape == (9, 4 * len(FEATURES))
    assert np.array_equal(s[:, :N_FEATURES], b[11:20])
