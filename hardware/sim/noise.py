"""What a healthy device shows that looks like trouble: the twin's noise model. Pure.

Real fleets are not quiet between failures (DESIGN.md section 4): a pending row remap is
the A100's repair mechanism, applied at the next reset while the GPU carries on; corrected
errors come in bursts and alone do not predict uncorrectable ones; a few lemons carry most
of them; telemetry reads fail now and then. Without this, any precursor means "failure
coming" by construction and prediction is trivially easy.

Per device, as functions of (seed, device ordinal), like hardware.sim.hazard, so the fleet
history and the tests draw the same events:

* ``benign_remaps``: a row remap / page retirement becomes pending (XID 63) on a healthy
  device; a reset ``reset_median_s`` later (lognormal) applies it and the flag clears, for
  ``remap_cleared_by_reset`` of them; the others stay pending until the device is next
  repaired (the operator never reset it).
* ``error_bursts``: corrected-ECC bursts (compound Poisson: ``burst_per_day`` bursts of a
  lognormal size), independent of failures. They replace the even trickle of the old twin.
* ``dropouts``: stretches in which the optional telemetry fields (ECC, remaps, throttle
  reasons, XIDs) cannot be read: the features are missing (NaN), not zero.

A lemon's remap and burst rates are multiplied by its hazard multiplier (``lemon_factor``):
the Titan study's "98 % of single-bit errors on 10 cards". Every default is an assumption
(no public trace holds this telemetry); docs/health.md lists them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DAY_S = 86_400.0


@dataclass(frozen=True)
class NoiseModel:
    """Healthy-device noise; every field can be overridden (HistoryConfig.noise)."""

    # Assumption: ~4x the fleet's mean device-fault rate (4.7e-4 per device-day), so a
    # pending remap alone is a weak signal, as DESIGN.md section 4 says it is.
    benign_remap_per_day: float = 2e-3
    remap_cleared_by_reset: float = 0.9  # assumption: most are applied at the next reset
    reset_median_s: float = 12 * 3600.0  # assumption: the next reset (a job boundary, a drain)
    # Assumption: a burst every ~20 days on an ordinary device, lemons x lemon_factor; sizes
    # lognormal median 10, sigma 1.5 (p90 ~70): as large as an HBM precursor's early growth.
    burst_per_day: float = 0.05
    burst_median: float = 10.0
    burst_sigma: float = 1.5
    dropout_per_day: float = 0.02  # assumption: a failed read every ~50 device-days
    dropout_median_s: float = 1800.0  # assumption: lognormal, sigma 1

    def __post_init__(self) -> None:
        for name in (
            "benign_remap_per_day",
            "burst_per_day",
            "burst_sigma",
            "dropout_per_day",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} must be >= 0")
        for name in ("reset_median_s", "burst_median", "dropout_median_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} {getattr(self, name)} must be > 0")
        if not 0.0 <= self.remap_cleared_by_reset <= 1.0:
            raise ValueError(
                f"remap_cleared_by_reset {self.remap_cleared_by_reset} must be in [0, 1]"
            )


@dataclass(frozen=True)
class BenignRemap:
    t_s: float  # the remap becomes pending (XID 63)
    cleared_s: float  # a reset applies it (inf: pending until the next repair)


def _rng(seed: int, *parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in ("gpuflow-noise", seed, *parts)))


def _poisson_times(rng: random.Random, rate_per_day: float, until_s: float) -> list[float]:
    out: list[float] = []
    if rate_per_day <= 0:
        return out
    t = rng.expovariate(rate_per_day / DAY_S)
    while t < until_s:
        out.append(t)
        t += rng.expovariate(rate_per_day / DAY_S)
    return out


def benign_remaps(
    seed: int, ordinal: int, multiplier: float, model: NoiseModel, until_s: float
) -> list[BenignRemap]:
    """Benign pending remaps of one device over [0, until_s)."""
    rng = _rng(seed, "remap", ordinal)
    out = []
    for t in _poisson_times(rng, model.benign_remap_per_day * multiplier, until_s):
        cleared = rng.random() < model.remap_cleared_by_reset
        delay = rng.lognormvariate(math.log(model.reset_median_s), 1.0)
        out.append(BenignRemap(t, t + delay if cleared else math.inf))
    return out


def error_bursts(
    seed: int, ordinal: int, multiplier: float, model: NoiseModel, until_s: float
) -> tuple[list[float], list[int]]:
    """(times, sizes) of one device's corrected-error bursts over [0, until_s)."""
    rng = _rng(seed, "burst", ordinal)
    times = _poisson_times(rng, model.burst_per_day * multiplier, until_s)
    mu = math.log(model.burst_median)
    sizes = [max(1, int(rng.lognormvariate(mu, model.burst_sigma))) for _ in times]
    return times, sizes


def dropouts(
    seed: int, ordinal: int, model: NoiseModel, until_s: float
) -> list[tuple[float, float]]:
    """[start, end) stretches of one device's unreadable optional telemetry."""
    rng = _rng(seed, "dropout", ordinal)
    mu = math.log(model.dropout_median_s)
    return [
        (t, t + min(rng.lognormvariate(mu, 1.0), DAY_S))
        for t in _poisson_times(rng, model.dropout_per_day, until_s)
    ]
