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
* Repeat offenders (fitted to the InfiniteHBD trace, tasks.health.trace_calibration: 43 %
  of its GPU faults fall on 5 % of its nodes, median 18 days between repeats on a node):
  ``lemon_fraction`` of devices get ``lemon_factor`` times the hazard for life (lemon
  status survives repair), and every fault raises the device's hazard by
  ``repeat_factor`` (compounding, at most ``repeat_cap``): a repair restores service, not
  a fresh part. The base hazard is scaled down so that a fresh fleet's average stays at
  the published rate; the repeats then add to it (the calibration reports how much).
* HBM failures: ``hbm_silent_share`` of them come with no precursor at all (an
  assumption after DESIGN.md section 4: "many failures have no precursor"); the others
  fail at a corrected-error level drawn per fault (lognormal, median
  ``hbm_errors_median``, sigma ``hbm_errors_sigma``: heavy-tailed, so no count means
  "about to fail"), and ``hbm_stall_share`` of them stall half-way for a lognormal pause
  (median ``hbm_stall_median_s``). For every HBM degradation that fails,
  ``hbm_heal_ratio`` others start the same way and stop on their own (``healed_schedule``).
  All assumptions: no public trace has telemetry.
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

# Repeat offenders, fitted on a fleet the InfiniteHBD trace's size (400 nodes x 8 GPUs, 349
# days, its realized GPU-fault rate; tasks.health.trace_calibration.simulate_repeats, which
# a test runs): ~45 % of GPU faults on the top 5 % of nodes (trace 43 %) and a median of
# ~30 days between repeats on a node (trace 18.3; its short gaps include re-reports within a
# day, which a renewal model does not make). A lower cap keeps a repeat offender at the
# twin's 5x higher default rate from failing every few days.
LEMON_FRACTION = 0.005
LEMON_FACTOR = 20.0
REPEAT_FACTOR = 4.0
REPEAT_CAP = 16.0


@dataclass(frozen=True)
class HazardModel:
    """Fleet-level calibration; every field can be overridden in the cluster spec."""

    rate_per_node_day: float = KOKOLIS_RSC1_PER_NODE_DAY
    gpus_per_node: int = 8
    device_share: float = LLAMA3_DEVICE_SHARE
    abrupt_share: float = (
        0.40  # DESIGN.md 4 ("roughly 40 %"); the trace's no-precursor share is 0.35
    )
    # Fitted to the InfiniteHBD trace's repeat offenders (tasks.health.trace_calibration.simulate_repeats):
    lemon_fraction: float = LEMON_FRACTION
    lemon_factor: float = LEMON_FACTOR
    repeat_factor: float = REPEAT_FACTOR
    repeat_cap: float = REPEAT_CAP
    # Assumptions (DESIGN.md 4: corrected errors alone do not predict uncorrectable ones;
    # many failures come without warning); no public trace has telemetry to fix them:
    hbm_silent_share: float = 0.30
    hbm_errors_median: float = 400.0
    hbm_errors_sigma: float = 1.2
    hbm_stall_share: float = 0.25
    hbm_stall_median_s: float = 1.5 * DAY_S
    hbm_heal_ratio: float = 0.5

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
        for name in ("hbm_silent_share", "hbm_stall_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} {getattr(self, name)} must be in [0, 1]")
        if self.repeat_factor < 1.0 or self.repeat_cap < 1.0:
            raise ValueError("repeat_factor and repeat_cap must be >= 1")
        if self.hbm_errors_median <= 0 or self.hbm_errors_sigma < 0:
            raise ValueError("hbm_errors_median must be > 0 and hbm_errors_sigma >= 0")
        if self.hbm_stall_median_s <= 0 or self.hbm_heal_ratio < 0:
            raise ValueError("hbm_stall_median_s must be > 0 and hbm_heal_ratio >= 0")

    def repeat_multiplier(self, k: int) -> float:
        """Hazard multiplier of a device's k-th fault (k earlier faults, each repaired)."""
        if k * math.log(self.repeat_factor) >= math.log(self.repeat_cap):
            return self.repeat_cap  # (and no float overflow for a long-lived lemon's k)
        return self.repeat_factor**k

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
    lead_s: float  # onset -> failure (stall included); 0 for abrupt classes and silent HBM
    final_xid: int
    errors_at_failure: float = 0.0  # HBM: corrected errors accumulated when it fails
    stall_at: float = 0.0  # HBM: progress at which the degradation pauses (0: no stall)
    stall_s: float = 0.0  # HBM: how long it pauses

    @property
    def failure_s(self) -> float:
        """When the device fails (a thermal fault may fail a little earlier under load)."""
        return self.onset_s + self.lead_s

    @property
    def abrupt(self) -> bool:
        """No precursor: an abrupt class, or a silent HBM failure (lead 0)."""
        return self.kind in ABRUPT_KINDS or self.lead_s == 0.0


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


def hbm_shape(model: HazardModel, rng: random.Random) -> tuple[float, float, float]:
    """(errors at failure, stall progress, stall seconds) of one HBM degradation."""
    errors = _clipped_lognormal(rng, model.hbm_errors_median, model.hbm_errors_sigma, 5.0, 1e6)
    if rng.random() >= model.hbm_stall_share:
        return errors, 0.0, 0.0
    stall_at = rng.uniform(0.2, 0.7)
    return (
        errors,
        stall_at,
        _clipped_lognormal(rng, model.hbm_stall_median_s, 0.8, 3600.0, 30 * DAY_S),
    )


def draw_fault(
    seed: int, ordinal: int, k: int, prev_onset_s: float, rate_per_day: float, model: HazardModel
) -> FaultDraw | None:
    """The k-th natural fault of device ``ordinal``, after ``prev_onset_s``; None if rate 0.
    ``rate_per_day`` is the device's own rate before any fault; k earlier faults raise it
    by ``model.repeat_multiplier(k)``."""
    if rate_per_day <= 0:
        return None
    rng = _rng(seed, ordinal, k)
    onset = prev_onset_s + rng.expovariate(rate_per_day * model.repeat_multiplier(k) / DAY_S)
    mix = model.class_mix()
    kind = rng.choices(list(mix), weights=list(mix.values()))[0]
    lead, xid = lead_time_s(kind, rng), final_xid(kind, rng)
    if kind != "hbm":
        return FaultDraw(k=k, onset_s=onset, kind=kind, lead_s=lead, final_xid=xid)
    if rng.random() < model.hbm_silent_share:
        # No precursor: the uncorrectable error is the first sign (XID 48/94/95, no remap).
        return FaultDraw(
            k=k, onset_s=onset, kind=kind, lead_s=0.0, final_xid=48 if xid == 64 else xid
        )
    errors, stall_at, stall_s = hbm_shape(model, rng)
    return FaultDraw(k, onset, kind, lead + stall_s, xid, errors, stall_at, stall_s)


@dataclass(frozen=True)
class HealDraw:
    """An HBM degradation that stops on its own: errors and remaps as a failing one's, up to
    ``stop_at`` of its course, then nothing more; the device never fails from it."""

    onset_s: float
    lead_s: float  # the course it would have run (stall included)
    stop_at: float  # progress at which it stops, in (0, 1)
    errors_at_failure: float
    stall_at: float
    stall_s: float


def healed_schedule(
    seed: int, ordinal: int, rate_per_day: float, model: HazardModel, until_s: float
) -> list[HealDraw]:
    """Degradations of device ``ordinal`` that heal, onsets before ``until_s``: a Poisson
    stream at ``hbm_heal_ratio`` times the device's rate of HBM failures with a precursor."""
    mix = model.class_mix()
    rate = rate_per_day * mix["hbm"] * (1.0 - model.hbm_silent_share) * model.hbm_heal_ratio
    out: list[HealDraw] = []
    if rate <= 0:
        return out
    rng = _rng(seed, "heal", ordinal)
    t = 0.0
    while True:
        t += rng.expovariate(rate / DAY_S)
        if t >= until_s:
            return out
        lead = lead_time_s("hbm", rng)
        errors, stall_at, stall_s = hbm_shape(model, rng)
        out.append(HealDraw(t, lead + stall_s, rng.uniform(0.3, 0.95), errors, stall_at, stall_s))


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
