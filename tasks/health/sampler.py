"""The telemetry sampler: one sample of every device through the hardware layer, every 5 s.

Never faster than MIN_INTERVAL_S (5 s): field advice (DESIGN.md section 7) and NVML's own
averaging windows make faster sampling cost more than it tells. A device that is gone
(``present=False``, or DeviceLostError) is reported apart, as lost: the monitor scores it
risk 1.0 without a model. A device whose read fails otherwise is reported as unreadable
and skipped this round (a flaky read is not a lost device).

``wait`` is injectable: ``time.sleep`` for a live fleet, the twin's ``advance`` to run a
simulated fleet in fast-forward (the monitor's ``fast_forward`` option). It is given what
is left of the interval after sampling, so the period stays the interval either way (the
twin's clock also runs with the wall clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    DeviceLostError,
    HardwareError,
    TelemetrySample,
)
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.features import DEFAULT_MAX_CLOCK_MHZ

MIN_INTERVAL_S = 5.0
DEFAULT_INTERVAL_S = 5.0


def validate_interval_s(interval_s: float) -> float:
    """The sampling interval in seconds, refused when below MIN_INTERVAL_S."""
    if isinstance(interval_s, bool) or not isinstance(interval_s, int | float):
        raise ValueError(f"interval_s must be a number of seconds, got {interval_s!r}")
    if not interval_s >= MIN_INTERVAL_S or interval_s == float("inf"):
        raise ValueError(
            f"interval_s must be >= {MIN_INTERVAL_S:g} s (sampling faster costs more than it "
            f"tells), got {interval_s!r}"
        )
    return float(interval_s)


@dataclass(frozen=True)
class LostDevice:
    device: DeviceInfo
    reason: str
    # What it answered, if it did (present=False): the XIDs it left (79) are in there.
    sample: TelemetrySample | None = None


@dataclass(frozen=True)
class FleetSample:
    """One round: the samples of present devices, the lost ones, the unreadable ones."""

    taken_at_s: float  # wall clock (time.time) when the round started
    samples: list[TelemetrySample]
    devices: dict[tuple[str, int], DeviceInfo]
    lost: list[LostDevice] = field(default_factory=list)
    unreadable: list[tuple[DeviceInfo, str]] = field(default_factory=list)


class TelemetrySampler:
    """Samples every device a backend sees, every ``interval_s`` (>= 5 s)."""

    def __init__(
        self,
        backend: Backend,
        interval_s: float = DEFAULT_INTERVAL_S,
        wait: Callable[[float], object] = time.sleep,
    ) -> None:
        self.backend = backend
        self.interval_s = validate_interval_s(interval_s)
        self.wait = wait
        self._max_clock: dict[tuple[str, int], float] = {}

    def max_clock_mhz(self, device: DeviceInfo) -> float:
        """The device's maximum SM clock: from the SKU table, else asked once, else a default."""
        key = (device.node, device.index)
        if key not in self._max_clock:
            try:
                value = float(lookup_sku(device.sku).sm_clock_max_mhz)
            except (KeyError, ValueError):
                try:
                    value = float(self.backend.clocks(device.node, device.index).sm_clock_max_mhz)
                except HardwareError:
                    value = float(DEFAULT_MAX_CLOCK_MHZ)
            self._max_clock[key] = value
        return self._max_clock[key]

    def sample_all(self) -> FleetSample:
        """One sample of every device."""
        return self.sample_devices(self.backend.devices())

    def sample_devices(self, devices: list[DeviceInfo]) -> FleetSample:
        """One sample of each of ``devices`` (the telemetry exporter's scope)."""
        taken = time.time()
        samples: list[TelemetrySample] = []
        lost: list[LostDevice] = []
        unreadable: list[tuple[DeviceInfo, str]] = []
        for d in devices:
            try:
                s = self.backend.telemetry(d.node, d.index)
            except DeviceLostError as exc:
                lost.append(LostDevice(d, f"device lost: {exc}"))
                continue
            except HardwareError as exc:
                unreadable.append((d, str(exc)))
                continue
            if not s.present:
                lost.append(LostDevice(d, "device lost: not present (fell off the bus)", s))
                continue
            samples.append(s)
        return FleetSample(
            taken_at_s=taken,
            samples=samples,
            devices={(d.node, d.index): d for d in devices},
            lost=lost,
            unreadable=unreadable,
        )

    def rounds(self, count: int) -> Iterator[FleetSample]:
        """``count`` rounds, one every interval (the first at once; the wait is what is left
        of the interval after sampling, so a slow backend does not stretch the period)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
        for i in range(count):
            started = time.monotonic()
            yield self.sample_all()
            if i + 1 < count:
                spent = time.monotonic() - started
                self.wait(max(self.interval_s - spent, 0.0))
