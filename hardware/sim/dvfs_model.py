"""The voltage/frequency curve of each SKU, and what a lower SM clock does to a workload.

Voltage: flat at ``v_min_v`` up to a knee (``knee_ratio * f_max``), then rising linearly to
``v_max_v`` at f_max. nvidia-smi reports no voltage, so the curve is either fitted to
measured power-limit sweeps (``source`` says which trace) or this project's estimate.
Only V/V_max matters to the twin (C absorbs the scale), so fits keep V_MAX_V and move
``v_min_v`` and the knee.

A workload has a character (DESIGN.md section 4: compute-bound throughput scales with f,
memory-bound work does not):

* ``memory_bound_ratio`` m in [0, 1]: the share of its time at f_max that does not scale
  with the SM clock (memory stalls, and host time inside a step). Its time at clock f is
  T(f) / T(f_max) = m + (1 - m) * f_max / f.
* ``activity`` in (0, 1]: how much switching power it draws at full load, relative to the
  SKU's calibration point (1.0: the maximum power limit at f_max). Light workloads draw
  less than the cap at f_max and so are not slowed by a cap above what they draw.

Pure functions of numbers; no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuflow.hardware.backend import InvalidRequestError

V_MIN_V = 0.70  # estimate: typical 7 nm / 4 nm GPU floor voltage
V_MAX_V = 1.05  # estimate: typical boost voltage
KNEE_RATIO = 0.5  # estimate: V starts rising above half the max clock


@dataclass(frozen=True)
class DvfsShape:
    v_min_v: float
    v_max_v: float
    knee_ratio: float
    source: str  # "estimate: ..." or "fit: <trace> (<command>)"
    # Where the average power settles, as a share of a power limit that binds: the
    # controller holds short-window power under the limit, so the average over a step
    # (with its lighter phases) sits below it. 1.0: no trace to say otherwise.
    cap_headroom: float = 1.0

    @property
    def fitted(self) -> bool:
        return self.source.startswith("fit")

    def voltage_v(self, f_mhz: float, f_max_mhz: int) -> float:
        knee = self.knee_ratio * f_max_mhz
        if f_mhz <= knee:
            return self.v_min_v
        return self.v_min_v + (self.v_max_v - self.v_min_v) * (f_mhz - knee) / (f_max_mhz - knee)

    def switching(self, f_mhz: float, f_max_mhz: int) -> float:
        """V(f)^2 * f in V^2 * GHz: what switching power is proportional to."""
        v = self.voltage_v(f_mhz, f_max_mhz)
        return v * v * f_mhz / 1000.0


ESTIMATED_SHAPE = DvfsShape(
    V_MIN_V, V_MAX_V, KNEE_RATIO, "estimate: no public voltage or power-vs-clock sweep"
)

# Fitted to ../shared/data/zeus-traces/summary_power_v100.csv (Zeus, NSDI'23: 68 workloads
# x 7 power limits, 100-250 W) by least squares on log time ratio and log power, together
# with each workload's character; refit with
#   .venv/bin/python -c "from gpuflow.tasks.energy.twin_fit import fit_twin; \
#       print(fit_twin('../shared/data/zeus-traces/summary_power_v100.csv').to_dict())"
# The trace reports no clocks, so the curve is weakly identified (a flat voltage with more
# memory-bound time is a close second, cost 1.15 against 1.09; V_min / V_max = 0.83). The fitted static share,
# 0.132 of the top limit, matches the SXM2 calibration's 0.133, so C and P_static still
# come from the SKU's two points. The trace's GPU is a 250 W V100; the shape is relative
# to f_max and the maximum limit and is applied to the SXM2 part as it is.
V100_FITTED_SHAPE = DvfsShape(
    v_min_v=0.875,
    v_max_v=V_MAX_V,
    knee_ratio=0.75,
    source="fit: zeus-traces/summary_power_v100.csv (gpuflow.tasks.energy.twin_fit.fit_twin)",
    cap_headroom=0.91,
)

SHAPES: dict[str, DvfsShape] = {"Tesla V100-SXM2-32GB": V100_FITTED_SHAPE}


def shape_of(sku_name: str) -> DvfsShape:
    """The SKU's voltage curve: fitted where a trace exists, else the estimate."""
    return SHAPES.get(sku_name, ESTIMATED_SHAPE)


def time_ratio(f_mhz: float, f_max_mhz: float, memory_bound_ratio: float) -> float:
    """T(f) / T(f_max) of a workload whose share ``memory_bound_ratio`` does not scale."""
    if f_mhz <= 0:
        return math.inf
    m = memory_bound_ratio
    return m + (1.0 - m) * f_max_mhz / f_mhz


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def check_character(memory_bound_ratio: float | None, activity: float | None) -> None:
    """Raise InvalidRequestError, naming the value, unless each is None or in range."""
    if memory_bound_ratio is not None and (
        not _is_number(memory_bound_ratio) or not 0.0 <= memory_bound_ratio <= 1.0
    ):
        raise InvalidRequestError(
            f"memory_bound_ratio must be in [0, 1], got {memory_bound_ratio!r}"
        )
    if activity is not None and (not _is_number(activity) or not 0.0 < activity <= 1.0):
        raise InvalidRequestError(f"activity must be in (0, 1], got {activity!r}")
