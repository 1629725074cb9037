"""Device utilization for AutoPrecision, read through the hardware layer.

The loop reports how busy it keeps its device (the twin turns that into utilization,
power and heat; real devices ignore it and measure themselves), then reads utilization
back the way NVML reports it. Readings are at most one per ``min_interval_s``: NVML's
figure is a share of time over a 1/6-1 s window, so faster polling only adds noise.
"""

from __future__ import annotations

import time

from gpuflow.hardware.backend import Backend


class BusyShare:
    """The loop's own share of wall time spent in compute, once per window."""

    def __init__(self, min_interval_s: float = 1.0) -> None:
        self.min_interval_s = min_interval_s
        self._busy_s = self._wall_s = 0.0
        self._window_start = time.monotonic()

    def observe_step(self, busy_s: float, wall_s: float) -> float | None:
        self._busy_s += busy_s
        self._wall_s += wall_s
        if time.monotonic() - self._window_start < self.min_interval_s or self._wall_s <= 0:
            return None
        ratio = min(1.0, self._busy_s / self._wall_s)
        self._busy_s = self._wall_s = 0.0
        self._window_start = time.monotonic()
        return ratio


class DeviceUtilization:
    """A UtilizationProbe over a Backend for one device (or one of its partitions)."""

    def __init__(
        self,
        backend: Backend,
        node: str,
        index: int,
        owner: str,
        partition_uuid: str | None = None,
        memory_mb: int = 0,
        min_interval_s: float = 0.5,
    ) -> None:
        self.backend, self.node, self.index = backend, node, index
        self.owner, self.partition_uuid, self.memory_mb = owner, partition_uuid, memory_mb
        self._share = BusyShare(min_interval_s)
        self.last_ratio: float | None = None

    def observe_step(self, busy_s: float, wall_s: float) -> float | None:
        share = self._share.observe_step(busy_s, wall_s)
        if share is None:
            return None
        self.backend.report_workload(
            self.node, self.index, self.owner, share, self.memory_mb, self.partition_uuid
        )
        self.last_ratio = self.backend.telemetry(self.node, self.index).utilization_ratio
        return self.last_ratio

    def close(self) -> None:
        self.backend.end_workload(self.owner)
