"""A step's time on the twin: the device's, not the host's jitter.

On a GPU a step's time is the device's (the host enqueues and waits), so the host's jitter
hides under it. On the twin the "device" is the host's CPU, whose step time varies by ~10 %
between 2-second windows (llama-tiny, one pinned thread: median 5.8 ms, p99 8.7 ms), more
than the 3-5 % a power limit changes it by. So a step is paced to what the device would take:

    step = max(host busy, reference x T(f) / T(f_max))

where T(f)/T(f_max) is the twin's time ratio at the clock the device runs now
(Backend.device_time_ratio) and the reference is ``pad`` x a low running quantile of the
host's busy time over the last ``window`` steps. The host's work does not depend on the
device's clock, so its quantile is the work at f_max; padding puts nearly every step under
the device's time. Why a low quantile (the 10th percentile, padded 2x) and not the median
(padded 1.5x): the host's load from other processes comes and goes over seconds, and a
running median follows it into the step time; the fast steps' time barely moves with it.
Measured on the 2-core VM under load (load average 2.5, a GEMM unit, 2-s windows, docs/
energy.md): window CV 6.8 % with 1.5x the median over 255 steps, 3.6 % with 2x the 10th
percentile over 2047; on a quiet host, 1.5x the median already gave 0.1 %. The reference
is kept per key - the precision policy's dtype ("fp32", "bf16") - so a policy's measured
speedup of a reduced precision shows as it is (each dtype's steps are padded to their own
reference), not padded away to one common time. A step whose host time exceeds the
device's is not padded: it takes what it took.

Why the reference keeps running rather than being held once settled (tried 2026-12-04: held
after a key's first 256 steps): a process whose first seconds fall in a loaded moment holds
a high reference for its whole job: side by side, jobs at 250 W ran 13-15 % slower than
their neighbour at 300 W where the twin gives 3 % (docs/energy.md); a running one recovers.
"""

from __future__ import annotations

import bisect
import os
from collections import deque

PAD = 2.0  # reference = PAD x the QUANTILE of host busy (see the module's docstring)
# What a twin job's steps are padded by, unless its caller says: 1 by default, where only the
# steps faster than the running quantile wait (x T(f)/T(f_max)), so a job at full clock runs
# at the host's speed. PAD doubles every twin job's time (the suite took 1.5x as long): it
# is for what measures a power limit's few per cent side by side (`gpuflow bench energy`
# sets it; a DVFS deployment on the twin can, through this variable in its environment).
PAD_ENV = "GPUFLOW_TWIN_STEP_PAD"


def step_pad() -> float:
    """The twin's step padding from ``GPUFLOW_TWIN_STEP_PAD`` (default 1: no padding)."""
    raw = os.environ.get(PAD_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        pad = float(raw)
    except ValueError:
        pad = float("nan")
    if not pad >= 1.0:
        raise ValueError(f"{PAD_ENV} must be a number >= 1, got {raw!r}")
    return pad


QUANTILE = 0.1
WINDOW = 2047  # steps per key in the running quantile


class StepPacer:
    """Running per-key quantiles of the host's busy time, and the step time they imply."""

    def __init__(self, pad: float = PAD, window: int = WINDOW, quantile: float = QUANTILE) -> None:
        if not pad >= 1.0 or window < 1 or not 0.0 <= quantile <= 1.0:
            raise ValueError(
                f"pad must be >= 1, window >= 1 and quantile in [0, 1], got {pad!r}, "
                f"{window!r}, {quantile!r}"
            )
        self.pad, self.window, self.quantile = pad, window, quantile
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

    def level_s(self, key: str = "") -> float | None:
        """The running quantile of ``key``'s host busy time; None before its first step."""
        ordered = self._sorted.get(key)
        if not ordered:
            return None
        return ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]

    def reference_s(self, key: str = "") -> float | None:
        """The work's time at f_max under ``key``: pad x the running quantile."""
        level = self.level_s(key)
        return None if level is None else self.pad * level

    def step_s(self, busy_s: float, time_ratio: float, key: str = "") -> float:
        """Observe ``busy_s`` and return the step's time on the device at ``time_ratio``
        (T(f)/T(f_max)): max(busy_s, reference x time_ratio)."""
        self.observe(busy_s, key)
        reference = self.reference_s(key)
        assert reference is not None  # observed just now
        return max(busy_s, reference * time_ratio)
