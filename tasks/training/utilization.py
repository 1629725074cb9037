"""Device utilization for AutoPrecision, read through the hardware layer.

The loop reports how busy it keeps its device (the twin turns that into utilization,
power and heat; real devices ignore it and measure themselves), then reads utilization
back the way NVML reports it. Readings are at most one per ``min_interval_s``: NVML's
figure is a share of time over a 1/6-1 s window, so faster polling only adds noise.

Pacing: on the twin a device's clock (power limit, locked clocks, heat) sets how long the
work takes, which a CPU cannot show by itself; ``pace`` sleeps inside the step's busy window
until the step has taken the device's time, max(host busy, reference x T(f)/T(f_max))
(tasks.training.pacing: the reference is a padded low running quantile of the host's busy
time, per precision), so a power limit that slows a real GPU slows the job on the twin too and the
host's jitter does not swamp it. Real devices (Backend.device_time_ratio None) are not
paced: their steps are already real; a backend that models only Backend.device_delay_s gets
that delay. The ratio is read at most once per ``PACE_REFRESH_S`` (a twin call costs
~1.5 ms), and at once after ``refresh_pace`` (a setting just changed).
"""

from __future__ import annotations

import time

from gpuflow.hardware.backend import Backend
from gpuflow.tasks.training.pacing import StepPacer, step_pad

PACE_REFRESH_S = 0.25


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

    def pace(self, busy_s: float, key: str = "") -> float:
        """No device to wait for: the host's time is the step's time."""
        return 0.0


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
        pad: float | None = None,
    ) -> None:
        self.backend, self.node, self.index = backend, node, index
        self.owner, self.partition_uuid, self.memory_mb = owner, partition_uuid, memory_mb
        self._share = BusyShare(min_interval_s)
        self.last_ratio: float | None = None
        self.pacer = StepPacer(step_pad() if pad is None else pad)
        self._time_ratio: float | None = None  # device_time_ratio, cached
        self._delay_per_busy_s = 0.0  # device_delay_s(busy_s=1), where there is no ratio
        self._read_at: float | None = None

    def pace(self, busy_s: float, key: str = "") -> float:
        """Sleep until a step of ``busy_s`` host-timed work under ``key`` (the precision in
        force) has taken the device's time; returns the seconds slept."""
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= PACE_REFRESH_S:
            self._time_ratio = self.backend.device_time_ratio(self.node, self.index, self.owner)
            if self._time_ratio is None:
                self._delay_per_busy_s = self.backend.device_delay_s(
                    self.node, self.index, self.owner, 1.0
                )
            self._read_at = now
        if self._time_ratio is None:
            delay_s = busy_s * self._delay_per_busy_s
        else:
            delay_s = self.pacer.step_s(busy_s, self._time_ratio, key) - busy_s
        if delay_s > 0:
            time.sleep(delay_s)
        return delay_s

    def refresh_pace(self) -> None:
        """Read the ratio again at the next step (a power limit or clock just changed)."""
        self._read_at = None

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
