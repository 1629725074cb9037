"""Choose a power limit (or a locked SM clock) for one workload on one device from a few
measured points, instead of profiling every setting.

The objective, one of two (Objective):

* ``slowdown`` S (default 0.10): the least energy per unit of work (a step, an epoch) whose
  time per unit is at most (1 + S) times the time at the highest setting;
* ``eta`` (Zeus, NSDI'23): the least eta * E + (1 - eta) * P_max * T, P_max the highest
  setting in watts (for clocks: the power measured at the highest clock).

The search is ask/tell (``next_probe`` / ``tell``), so the same object drives a trace
replay, the in-training tuner (a probe is a few steps) and the DVFS controller (a probe is
a sampling interval). It starts at the highest setting, which gives the reference time T0
and the power the workload draws there, P0. Below P0 a power limit binds and the clock
falls; the time model is the power law

    T(p) / T0 = max(1, P0 / p) ** k        (clocks: max(1, f_max / f) ** k)

with k fitted through the origin on log-log axes to every point measured below the knee
(k = 0.6, the median of the Zeus traces, before there is one). A workload that draws less
than a limit is not slowed by it, which is why the knee is P0 and not the highest limit:
the light workloads of the traces lose nothing down to their draw, and the fitted k is
how memory-bound the rest is (k -> 0: nothing scales with the clock).

Slowdown objective, "boundary search": probe the lowest untried setting that lies below the
lowest setting measured within the bound and above the highest one measured outside it,
and whose predicted time is within the bound plus ``margin`` (the model is a power law
fitted to noisy single runs: the margin lets it try a setting it thinks slightly too slow);
refit after each probe; stop when no setting qualifies or after ``max_probes``. The choice
is the measured point with the least energy among those measured within the bound, so a
choice never breaks the bound on what was measured.

Eta objective: descend from the highest setting below the knee (above it a limit does not
bind), one grid step at a time, until PATIENCE steps in a row find nothing cheaper than the best
so far (Zeus's cost is unimodal in the limit on its traces, up to
single-run noise).

Plain Python, no Prefect; numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

POWER_LIMIT_W = "power_limit_w"
SM_CLOCK_MHZ = "sm_clock_mhz"
Knob = Literal["power_limit_w", "sm_clock_mhz"]

DEFAULT_SLOWDOWN = 0.10
DEFAULT_MARGIN = 0.06  # docs/energy.md: the margin sweep on the four Zeus traces
PATIENCE = 2  # eta descent: steps without a cheaper point before it stops
PRIOR_EXPONENT = 0.6  # k before any point below the knee is measured
# A comparison of two windows is only as sure as their noise: a setting counts within the
# bound when its measured slowdown clears it by GUARD_Z standard deviations of a two-window
# ratio (sqrt(2) * one window's relative spread). Without it, the least-energy point
# "measured within the bound" is the one whose window happened to run fast (the winner's
# curse): on the twin's V100 on a 2-core host, 225 and 200 W (+10 % and +15 % on the twin)
# were chosen from 2-second windows that read them at -0.1 % (docs/energy.md).
GUARD_Z = 1.0
# A window at the chosen setting has drifted when it differs by more than DRIFT_Z standard
# deviations of a two-window ratio (or the caller's tolerance, if larger): host noise alone
# must not start a new search.
DRIFT_Z = 3.0


@dataclass(frozen=True)
class Measurement:
    """One setting, measured: time and energy per unit of work (a step, an epoch)."""

    setting: float  # W (power limit) or MHz (locked clock)
    time_s: float
    energy_j: float

    def __post_init__(self) -> None:
        for name in ("setting", "time_s", "energy_j"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"Measurement.{name} must be a positive number, got {v!r}")

    @property
    def power_w(self) -> float:
        return self.energy_j / self.time_s


@dataclass(frozen=True)
class Objective:
    """Minimise energy under a slowdown bound, or Zeus's cost with ``eta``."""

    slowdown: float | None = DEFAULT_SLOWDOWN
    eta: float | None = None

    def __post_init__(self) -> None:
        if (self.slowdown is None) == (self.eta is None):
            raise ValueError("give exactly one of slowdown and eta")
        if self.slowdown is not None and not 0.0 <= self.slowdown <= 10.0:
            raise ValueError(f"slowdown must be in [0, 10] (0.10 = 10 %), got {self.slowdown!r}")
        if self.eta is not None and not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {self.eta!r}")

    def describe(self) -> str:
        if self.slowdown is not None:
            return f"least energy within {self.slowdown:.0%} slowdown"
        return f"least Zeus cost, eta={self.eta:g}"


@dataclass
class Choice:
    """What a search chose, and the evidence."""

    knob: str
    objective: Objective
    chosen: Measurement
    reference: Measurement  # the highest setting
    probes: list[Measurement] = field(default_factory=list)  # in the order measured
    exponent: float = PRIOR_EXPONENT
    noise: float = 0.0  # one window's relative spread at the reference (window_noise)
    # The highest setting measured again after the last probe, if it was (A-B-A): the
    # reference above is then the faster of the two (SettingSearch.reference).
    closing: Measurement | None = None

    @property
    def energy_saving(self) -> float:
        return 1.0 - self.chosen.energy_j / self.reference.energy_j

    @property
    def slowdown(self) -> float:
        return self.chosen.time_s / self.reference.time_s - 1.0

    def drift_tolerance(self, tolerance: float = 0.10) -> float:
        """What a later window may differ by before it counts as drifted: ``tolerance``, or
        DRIFT_Z times the noise of a two-window ratio measured at the reference if larger."""
        return max(tolerance, DRIFT_Z * math.sqrt(2.0) * self.noise)

    def drifted(self, m: Measurement, tolerance: float = 0.10) -> bool:
        """True when ``m``, measured later at the chosen setting, says the workload (or
        the device) changed: its time or power moved by more than ``drift_tolerance``."""
        if m.setting != self.chosen.setting:
            raise ValueError(f"{m.setting} is not the chosen setting {self.chosen.setting}")
        tol = self.drift_tolerance(tolerance)
        return abs(m.time_s / self.chosen.time_s - 1.0) > tol or (
            abs(m.power_w / self.chosen.power_w - 1.0) > tol
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "objective": self.objective.describe(),
            "chosen": asdict(self.chosen),
            "reference": asdict(self.reference),
            "probes": [asdict(p) for p in self.probes],
            "exponent": self.exponent,
            "noise": self.noise,
            "closing_reference": None if self.closing is None else asdict(self.closing),
            "energy_saving": self.energy_saving,
            "slowdown": self.slowdown,
        }


class SettingSearch:
    """Ask/tell search over a grid of settings (see the module docstring)."""

    def __init__(
        self,
        settings: Sequence[float],
        objective: Objective | None = None,
        *,
        knob: Knob = POWER_LIMIT_W,
        margin: float = DEFAULT_MARGIN,
        max_probes: int | None = None,
    ) -> None:
        grid = sorted({float(s) for s in settings})
        if len(grid) < 1 or any(not math.isfinite(s) or s <= 0 for s in grid):
            raise ValueError(f"settings must be positive numbers, got {list(settings)!r}")
        if knob not in (POWER_LIMIT_W, SM_CLOCK_MHZ):
            raise ValueError(f"knob must be {POWER_LIMIT_W!r} or {SM_CLOCK_MHZ!r}, got {knob!r}")
        if not 0.0 <= margin <= 1.0:
            raise ValueError(f"margin must be in [0, 1], got {margin!r}")
        self.grid = grid
        self.objective = objective or Objective()
        self.knob = knob
        self.margin = margin
        # Fewer probes than settings: the point of the search (the reference is one).
        self.max_probes = max(1, len(grid) - 1) if max_probes is None else max_probes
        if self.max_probes < 1:
            raise ValueError(f"max_probes must be >= 1, got {max_probes!r}")
        self.probes: list[Measurement] = []
        self.noise = 0.0  # set by tell_reference
        self.closing: Measurement | None = None  # set by tell_closing_reference

    # -- ask / tell ---------------------------------------------------------------------

    def next_probe(self) -> float | None:
        """The next setting to measure, or None when the search is done."""
        if not self.probes:
            return self.grid[-1]
        if len(self.probes) >= self.max_probes:
            return None
        if self.objective.slowdown is not None:
            return self._next_within_bound(self.objective.slowdown)
        return self._next_by_cost()

    def tell(self, m: Measurement) -> None:
        if m.setting not in self.grid:
            raise ValueError(f"{m.setting:g} is not one of the settings {self.grid}")
        if any(p.setting == m.setting for p in self.probes):
            raise ValueError(f"{m.setting:g} was measured already")
        if not self.probes and m.setting != self.grid[-1]:
            raise ValueError(f"measure the highest setting {self.grid[-1]:g} first")
        self.probes.append(m)

    def tell_reference(self, windows: Sequence[Measurement]) -> None:
        """The highest setting, measured in several windows: their mean is the reference,
        their spread the noise every later comparison is guarded by (GUARD_Z, DRIFT_Z)."""
        self.tell(pooled(windows))
        self.noise = window_noise(windows)

    def tell_closing_reference(self, m: Measurement) -> None:
        """The highest setting measured once more after the last probe (an A-B-A design).

        A workload's pace can move while the probes run - a job still warming up, a host's
        load, a device heating - and a probe then reads against a reference from another
        time: on the twin a job whose reference windows fell in its warm-up read 200 W as
        within 10 % and ran 11.7 % slower (docs/energy.md). From here on the reference is
        the faster of the two (``reference``), so a drift either way can only make the
        bound stricter and the saving smaller, never the other way."""
        if not self.probes:
            raise ValueError("measure the reference first")
        if m.setting != self.grid[-1]:
            raise ValueError(f"the closing reference is the highest setting {self.grid[-1]:g}")
        if self.closing is not None:
            raise ValueError("the closing reference was measured already")
        self.closing = m

    def reference(self) -> Measurement:
        """The reference every choice is judged by: the highest setting's measurement, or
        its closing one if that ran faster (tell_closing_reference)."""
        if not self.probes:
            raise ValueError("nothing measured yet")
        opening = self.probes[0]
        if self.closing is not None and self.closing.time_s < opening.time_s:
            return self.closing
        return opening

    def choice(self) -> Choice:
        ref = self.reference()
        if self.objective.slowdown is not None:
            chosen = min(self._within_bound(), key=lambda p: (p.energy_j, -p.setting))
        else:
            chosen = min(self.probes, key=lambda p: (self._cost(p), -p.setting))
        return Choice(
            self.knob,
            self.objective,
            chosen,
            ref,
            list(self.probes),
            self.exponent(),
            self.noise,
            self.closing,
        )

    def bound_ratio(self) -> float:
        """The time ratio to the reference a measured point must keep to count within the
        bound: 1 + slowdown, less the guard against the measured noise (GUARD_Z)."""
        slowdown = self.objective.slowdown or 0.0
        return (1.0 + slowdown) * math.exp(-GUARD_Z * math.sqrt(2.0) * self.noise)

    def _within_bound(self) -> list[Measurement]:
        """The reference (always: it is the bound's own point) and every probe that keeps
        the guarded bound."""
        ref = self.reference()
        bound = self.bound_ratio() * ref.time_s
        return [ref] + [p for p in self.probes[1:] if p.time_s <= bound]

    # -- the model ----------------------------------------------------------------------

    def knee(self) -> float:
        """Below this setting the time rises: P0 for power limits, f_max for clocks."""
        ref = self.probes[0]
        return ref.power_w if self.knob == POWER_LIMIT_W else ref.setting

    def exponent(self) -> float:
        """k of T/T0 = max(1, knee/p)^k, least squares through the origin in log-log."""
        if not self.probes:
            return PRIOR_EXPONENT
        knee, t0 = self.knee(), self.probes[0].time_s
        xs, ys = [], []
        for p in self.probes[1:]:
            if p.setting < knee:
                xs.append(math.log(knee / p.setting))
                ys.append(math.log(p.time_s / t0))
        sxx = sum(x * x for x in xs)
        if sxx <= 0:
            return PRIOR_EXPONENT
        return max(0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx)

    def predicted_time_ratio(self, setting: float) -> float:
        return max(1.0, self.knee() / setting) ** self.exponent()

    def _untried(self) -> list[float]:
        tried = {p.setting for p in self.probes}
        return [s for s in self.grid if s not in tried]

    def _next_within_bound(self, slowdown: float) -> float | None:
        ok = self._within_bound()
        lowest_ok = min(p.setting for p in ok)
        too_slow = [p.setting for p in self.probes if p not in ok and p.setting < lowest_ok]
        floor = max(too_slow, default=-math.inf)
        limit = self.bound_ratio() + self.margin
        for s in self._untried():  # ascending: the lowest that qualifies
            if floor < s < lowest_ok and self.predicted_time_ratio(s) <= limit:
                return s
        return None

    def _cost(self, m: Measurement) -> float:
        eta = self.objective.eta or 0.0
        return eta * m.energy_j + (1.0 - eta) * self._p_ref() * m.time_s

    def _p_ref(self) -> float:
        ref = self.probes[0]
        return ref.setting if self.knob == POWER_LIMIT_W else ref.power_w

    def _next_by_cost(self) -> float | None:
        # Descend from the knee (above it a limit does not bind: same time, same power)
        # while each step down lowers the measured cost; stop at the first that does not.
        below_knee = [s for s in self._untried() if s < self.knee()]
        if len(self.probes) == 1:
            return below_knee[-1] if below_knee else None
        # One step that does not improve may be a single run's noise: stop after two.
        last = self.probes[-1]
        best = min(self._cost(p) for p in self.probes)
        tail = self.probes[1:][-PATIENCE:]
        if len(tail) == PATIENCE and all(self._cost(p) > best for p in tail):
            return None
        lower = [s for s in self._untried() if s < last.setting]
        return lower[-1] if lower else None


def pooled(windows: Sequence[Measurement]) -> Measurement:
    """Several windows at one setting as one measurement: their mean per unit."""
    if not windows or len({w.setting for w in windows}) != 1:
        raise ValueError(f"windows must be one or more at one setting, got {list(windows)!r}")
    n = len(windows)
    return Measurement(
        windows[0].setting,
        sum(w.time_s for w in windows) / n,
        sum(w.energy_j for w in windows) / n,
    )


def window_noise(windows: Sequence[Measurement]) -> float:
    """One window's relative spread at one setting: the sample standard deviation of the
    log of time per unit over the windows (0 with fewer than two). Time, not energy: on a
    device whose power sits at its cap, energy per unit moves with time."""
    if len(windows) < 2:
        return 0.0
    logs = [math.log(w.time_s) for w in windows]
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def search(
    settings: Sequence[float],
    measure: Callable[[float], Measurement],
    objective: Objective | None = None,
    **kwargs: Any,
) -> Choice:
    """Run a SettingSearch to the end, measuring with ``measure(setting)``."""
    s = SettingSearch(settings, objective, **kwargs)
    while (setting := s.next_probe()) is not None:
        s.tell(measure(setting))
    return s.choice()
