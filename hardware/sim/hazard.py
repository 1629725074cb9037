"""The twin's hazard model: when devices fail, how, and with what warning. Pure.

No state, no I/O, no clock: functions of (seed, device ordinal, k), so the twin, a
fleet-history generator (months of labelled telemetry in fast-forward) and the tests draw
the very same failure schedule from the same seed.

Calibration (facts in DESIGN.md section 4, "Failures"):

* Rate: Kokolis et al. (HPCA'25), Meta's RSC-1 (16k A100, 11 months): 6.50 failures per
  1000 node-days (RSC-2: 2.34); Llama 3 405B (16,384 H100 on 2,048 nodes, 54 days): 419
  interruptions, 3.8e-3 per node-day. Default: RSC-1's 6.50 (an A100 fleet, like the
  default twin), per node of 8 GPUs.
* Only the device-attributable share of interruptions becomes a device fault: the Llama 3
  categories faulty GPU incl. NVLink 30.1 %, HBM3 17.2 %, GPU SRAM 4.5 %, GSP 4.1 %,
  thermal interface/sensor 1.4 % (57.3 % together). Software, network, host maintenance
  and silent data corruption have no device signal the twin could show; they are left out.
* Class mapping: HBM3 -> "hbm" (precursors), thermal -> "thermal" (precursors), GPU SRAM
  -> "ecc-uncorrectable" (abrupt), GSP -> "xid79" (abrupt). "Faulty GPU" is split so that
  ``abrupt_share`` (default 40 %, DESIGN: "roughly 40 % or more of interruptions are
  abrupt") of device faults are abrupt: its abrupt part becomes "xid79", its other part
  the memory-error class "hbm" (DESIGN: usable precursors are repeat memory errors).
  The split is this project's estimate, not a published number.
* Lemons: a few devices carry most errors (Titan: 98 % of single-bit errors on 10 cards).
  ``lemon_fraction`` of devices get ``lemon_factor`` times the hazard; the base hazard is
  scaled down so the fleet average stays at the published rate. Both are estimates.
* Lead times (estimates, no public distribution): HBM degradation lognormal, median 36 h
  (2 h .. 14 days); thermal degradation lognormal, median 5 days (1 .. 30 days).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DAY_S = 86_400.0

# Published rates, failures per node-day.
KOKOLIS_RSC1_PER_NODE_DAY = 6.50e-3
KOKOLIS_RSC2_PER_NODE_DAY = 2.34e-3
LLAMA3_PER_NODE_DAY = 419 / ((16_384 / 8) * 54)  # ~3.79e-3

# Llama 3 405B interruption mix (share of all interruptions), device-attributable part only.
LLAMA3_DEVICE_MIX = {
    "faulty GPU incl. NVLink": 0.301,
    "HBM3": 0.172,
    "GPU SRAM": 0.045,
    "GSP": 0.041,
    "thermal interface/sensor": 0.014,
}
LLAMA3_DEVICE_SHARE = sum(LLAMA3_DEVICE_MIX.values())  # 0.573

ABRUPT_KINDS = ("xid79", "ecc-uncorrectable")
PRECURSOR_KINDS = ("hbm", "thermal")
NATURAL_KINDS = ("hbm", "thermal", "xid79", "ecc-uncorrectable")

# Final XID of an HBM degradation (double-bit 48, contained 94, uncontained 95, remap
# failure 64). Weights are estimates.
HBM_FINAL_XIDS = (48, 94, 95, 64)
HBM_FINAL_WEIGHTS = (0.3, 0.3, 0.2, 0.2)


@dataclass(frozen=True)
class HazardModel:
    """Fleet-level calibration; every field can be overridden in the cluster spec."""

    rate_per_node_day: float = KOKOLIS_RSC1_PER_NODE_DAY
    gpus_per_node: int = 8
    device_share: float = LLAMA3_DEVICE_SHARE
    abrupt_share: float = 0.40
    lemon_fraction: float = 0.05
    lemon_factor: float = 20.0

    def __post_init__(self) -> None:
        lo, hi = self.abrupt_share_range()
        if not lo <= self.abrupt_share <= hi:
            raise ValueError(
                f"abrupt_share {self.abrupt_share} is outside what the Llama 3 mix allows "
                f"[{lo:.3f}, {hi:.3f}]"
            )
        if not 0.0 <= self.device_share <= 1.0:
            raise ValueError(f"device_share {self.device_share} must be in [0, 1]")
        if not 0.0 <= self.lemon_fraction <= 1.0:
            raise ValueError(f"lemon_fraction {self.lemon_fraction} must be in [0, 1]")
        if self.lemon_factor < 1.0:
            raise ValueError(f"lemon_factor {self.lemon_factor} must be >= 1")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node {self.gpus_per_node} must be >= 1")
        if self.rate_per_node_day < 0:
            raise ValueError(f"rate_per_node_day {self.rate_per_node_day} must be >= 0")

    @staticmethod
    def abrupt_share_range() -> tuple[float, float]:
        m = LLAMA3_DEVICE_MIX
        always = m["GPU SRAM"] + m["GSP"]
        return always / LLAMA3_DEVICE_SHARE, (
            always + m["faulty GPU incl. NVLink"]
        ) / LLAMA3_DEVICE_SHARE

    def class_mix(self) -> dict[str, float]:
        """Probability of each fault class given a device fault."""
        m = LLAMA3_DEVICE_MIX
        total = LLAMA3_DEVICE_SHARE
        faulty_abrupt = self.abrupt_share * total - m["GPU SRAM"] - m["GSP"]
        faulty_abrupt = min(max(faulty_abrupt, 0.0), m["faulty GPU incl. NVLink"])
        raw = {
            "hbm": m["HBM3"] + m["faulty GPU incl. NVLink"] - faulty_abrupt,
            "thermal": m["thermal interface/sensor"],
            "xid79": m["GSP"] + faulty_abrupt,
            "ecc-uncorrectable": m["GPU SRAM"],
        }
        return {k: v / total for k, v in raw.items()}

    def mean_device_rate_per_day(self) -> float:
        """Fleet-average device-fault rate per device-day."""
        return self.rate_per_node_day * self.device_share / self.gpus_per_node

    def lemon_count(self, n_devices: int) -> int:
        if self.lemon_fraction <= 0 or n_devices <= 0:
            return 0
        return min(n_devices, max(1, round(self.lemon_fraction * n_devices)))

    def device_rates_per_day(self, n_devices: int, lemons: frozenset[int]) -> list[float]:
        """Per-device hazard (per day), lemons scaled up, fleet mean preserved."""
        if n_devices <= 0:
            return []
        share = len(lemons) / n_devices
        base = self.mean_device_rate_per_day() / (1.0 - share + share * self.lemon_factor)
        return [base * (self.lemon_factor if i in lemons else 1.0) for i in range(n_devices)]


@dataclass(frozen=True)
class FaultDraw:
    """One natural fault of one device: the k-th of its schedule."""

    k: int
    onset_s: float  # seconds since the fleet's epoch: degradation starts (abrupt: fails)
    kind: str
    lead_s: float  # onset -> failure; 0 for abrupt classes
    final_xid: int

    @property
    def failure_s(self) -> float:
        """When the device fails (a thermal fault may fail a little earlier under load)."""
        return self.onset_s + self.lead_s

    @property
    def abrupt(self) -> bool:
        return self.kind in ABRUPT_KINDS


def _rng(seed: int, *parts: object) -> random.Random:
    # A str seed is hashed with SHA-512 by random.Random: stable across runs and platforms.
    return random.Random(":".join(str(p) for p in ("gpuflow-hazard", seed, *parts)))


def pick_lemons(seed: int, n_devices: int, model: HazardModel) -> frozenset[int]:
    """Ordinals of the lemon devices of a fleet."""
    count = model.lemon_count(n_devices)
    return frozenset(_rng(seed, "lemons", n_devices).sample(range(n_devices), count))


def _clipped_lognormal(
    rng: random.Random, median_s: float, sigma: float, lo: float, hi: float
) -> float:
    return min(max(rng.lognormvariate(math.log(median_s), sigma), lo), hi)


def lead_time_s(kind: str, rng: random.Random) -> float:
    """Precursor lead time of a class (0 for abrupt classes)."""
    if kind == "hbm":
        return _clipped_lognormal(rng, 36 * 3600.0, 0.8, 2 * 3600.0, 14 * DAY_S)
    if kind == "thermal":
        return _clipped_lognormal(rng, 5 * DAY_S, 0.5, 1 * DAY_S, 30 * DAY_S)
    return 0.0


def final_xid(kind: str, rng: random.Random) -> int:
    if kind == "hbm":
        return rng.choices(HBM_FINAL_XIDS, weights=HBM_FINAL_WEIGHTS)[0]
    if kind == "ecc-uncorrectable":
        return 48
    return 79  # xid79; a thermal shutdown also ends with the GPU off the bus


def draw_fault(
    seed: int, ordinal: int, k: int, prev_onset_s: float, rate_per_day: float, model: HazardModel
) -> FaultDraw | None:
    """The k-th natural fault of device ``ordinal``, after ``prev_onset_s``; None if rate 0."""
    if rate_per_day <= 0:
        return None
    rng = _rng(seed, ordinal, k)
    onset = prev_onset_s + rng.expovariate(rate_per_day / DAY_S)
    mix = model.class_mix()
    kind = rng.choices(list(mix), weights=list(mix.values()))[0]
    return FaultDraw(
        k=k, onset_s=onset, kind=kind, lead_s=lead_time_s(kind, rng), final_xid=final_xid(kind, rng)
    )


def draw_injected(seed: int, counter: int, kind: str) -> tuple[float, int]:
    """(lead_s, final_xid) for an injected fault: deterministic from seed and counter."""
    rng = _rng(seed, "injected", counter, kind)
    return lead_time_s(kind, rng), final_xid(kind, rng)


def device_schedule(
    seed: int, ordinal: int, rate_per_day: float, model: HazardModel, until_s: float
) -> list[FaultDraw]:
    """Every natural fault of one device with onset before ``until_s`` (a renewal process)."""
    out: list[FaultDraw] = []
    prev = 0.0
    k = 0
    while True:
        d = draw_fault(seed, ordinal, k, prev, rate_per_day, model)
        if d is None or d.onset_s >= until_s:
            return out
        out.append(d)
        prev, k = d.onset_s, k + 1


def fleet_schedule(
    seed: int, n_devices: int, model: HazardModel, until_s: float
) -> tuple[frozenset[int], dict[int, list[FaultDraw]]]:
    """(lemon ordinals, schedule per ordinal) for a fleet: what the twin draws for itself.

    The twin skips a draw whose onset falls while the device is already failed or
    degrading; a generator that repairs at once can use this schedule as it is.
    """
    lemons = pick_lemons(seed, n_devices, model)
    rates = model.device_rates_per_day(n_devices, lemons)
    return lemons, {i: device_schedule(seed, i, rates[i], model, until_s) for i in range(n_devices)}
