"""A step's time on the twin: the device's, not the host's jitter.

On a GPU a step's time is the device's (the host enqueues and waits), so the host's jitter
hides under it. On the twin the "device" is the host's CPU, whose step time varies by ~10 %
between 2-second windows (llama-tiny, one pinned thread: median 5.8 ms, p99 8.7 ms), more
than the 3-5 % a power limit changes it by. So a step is paced to what the device would take:

    step = max(host busy, reference x T(f) / T(f_max))

where T(f)/T(f_max) is the twin's time ratio at the clock the device runs now
(Backend.device_time_ratio) and the reference is ``pad`` x the running median of the host's
busy time over the last ``window`` steps. The host's work does not depend on the device's
clock, so its median is the work at f_max; padding to 1.5x the median puts nearly every step
under the device's time (2-s window CV 0.1 % where unpaced it is 9.9 %). The reference is
kept per key - the precision policy's dtype ("fp32", "bf16") - so a policy's measured
speedup of a reduced precision shows as it is (each dtype's steps are padded to their own
median), not padded away to one common time. A step whose host time exceeds the device's
is not padded: it takes what it took.
"""

from __future__ import annotations

import bisect
from collections import deque

PAD = 1.5  # reference = PAD x median host busy (see the module's docstring)
WINDOW = 255  # steps per key in the running median


class StepPacer:
    """Running per-key medians of the host's busy time, and the step time they imply."""

    def __init__(self, pad: float = PAD, window: int = WINDOW) -> None:
        if not pad >= 1.0 or window < 1:
            raise ValueError(f"pad must be >= 1 and window >= 1, got {pad!r}, {window!r}")
        self.pad, self.window = pad, window
        self._recent: dict[str, deque[float]] = {}
        self._sorted: dict[str, list[float]] = {}

    def observe(self, busy_s: float, key: str = "") -> None:
        """Add one step's host busy time under ``key``."""
        recent = self._recent.setdefault(key, deque())
        ordered = self._sorted.setdefault(key, [])
        recent.append(busy_s)
        bisect.insort(ordered, busy_s)
        if len(recent) > self.window:
            old = recent.popleft()
            del ordered[bisect.bisect_left(ordered, old)]

    def median_s(self, key: str = "") -> float | None:
        """The running median of ``key``'s host busy time; None before its first step."""
        ordered = self._sorted.get(key)
        if not ordered:
            return None
        n = len(ordered)
        mid = n // 2
        return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def reference_s(self, key: str = "") -> float | None:
        """The work's time at f_max under ``key``: pad x the running median."""
        median = self.median_s(key)
        return None if median is None else self.pad * median

    def step_s(self, busy_s: float, time_ratio: float, key: str = "") -> float:
        """Observe ``busy_s`` and return the step's time on the device at ``time_ratio``
        (T(f)/T(f_max)): max(busy_s, reference x time_ratio)."""
        self.observe(busy_s, key)
        reference = self.reference_s(key)
        assert reference is not None  # observed just now
        return max(busy_s, reference * time_ratio)
