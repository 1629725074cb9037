"""Scored devices for the monitor's unit tests: ``risks(n_0=0.9, n_1="lost")``."""

from __future__ import annotations

from gpuflow.tasks.health.events import DEVICE_LOST_REASON, DeviceRisk


def risks(**by_key: float | str) -> list[DeviceRisk]:
    """One DeviceRisk per ``node_index`` key: a model risk, or "lost" (risk 1.0)."""
    out = []
    for key, v in by_key.items():
        node, index = key.split("_")
        if v == "lost":
            out.append(DeviceRisk(node, int(index), "sku", 1.0, {}, DEVICE_LOST_REASON))
        else:
            out.append(DeviceRisk(node, int(index), "sku", float(v), {"f": 1.0}))
    return out
