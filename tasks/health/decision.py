"""When a device's risk is worth acting on: a decision by cost, not by a bare threshold.

The health model says P(the device fails within ``horizon_s``). Acting (checkpoint the
device's jobs, move them elsewhere, cordon the device) costs the same whether or not the
device would have failed; not acting costs, if it fails, the work done since each job's
last checkpoint plus the unplanned restart. So, per device, summed over its jobs::

    expected loss  = risk x sum_jobs gang_gpus x (lost work + restart)
    cost of acting =        sum_jobs gang_gpus x (checkpoint save + relaunch)
    act            when expected loss > cost of acting
    break-even risk = cost of acting / (lost work + restart), summed the same way

Acting also cordons the device, and the remediate flow leaves the cordon to an operator:
if the device would not have failed, the fleet loses its time until it is cleared
(``cordon_gpu_s`` = the hold x the share of it the device would have run work; if it
fails it is out for repair anyway). With it::

    act when risk x F > A + (1 - risk) x K,  break-even risk = (A + K) / (F + K)

K is 0 unless a cluster sets ``cordon_hold_s`` and ``cordon_price`` (docs/health.md,
"What a cordon costs", measures what pricing it does to which model wins).

All costs are **GPU-seconds** (a MIG slice or a vDCU counts as one GPU of its job's gang):
a gang of 8 stalls 8 GPUs while it checkpoints. The gang size cancels out of the
break-even risk when every GPU of a job carries the same costs; it does not cancel
between jobs, and it sets how much is at stake (``expected_loss_gpu_s``).

Lost work is the time since the job's last checkpoint plus what it would still do before
the failure: the failure falls anywhere in the horizon (uniform: half the horizon on
average), and where the job's checkpoint period is known the work wraps at each periodic
checkpoint.

Three levels, whatever the costs:

* ``drain-now`` at or above ``drain_risk`` (0.85, the seed's alarm threshold), and for a
  device that is lost or has failed (risk 1.0): the device is drained at once. With a
  calibrated model and a 30-minute base rate near 1e-4, 0.85 means "this device will
  almost surely fail within the horizon" (DESIGN.md 4's failure rates);
* ``act`` where the cost rule says so (the break-even risk is about 1 % with this
  project's constants for a job at its Young/Daly checkpoint period);
* ``watch`` otherwise.

An idle device (no job on it) has nothing to save: its expected loss and cost of acting
are both zero, the cost rule never fires, and it is cordoned at the drain level only. A
device whose jobs are not known (the monitor runs without an inventory) is judged the
same way, and the decision says why.

Plain functions and frozen dataclasses: no Prefect, no inventory; tasks.remediation.costs
reads the numbers of a job from the inventory, the monitor (tasks.health.monitor) applies
the rule every round.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

ACT, DRAIN, WATCH = "act", "drain-now", "watch"
ACTIONS = (DRAIN, ACT, WATCH)  # most urgent first
REMEDIATING = frozenset({ACT, DRAIN})  # what starts remediation (the trigger's match)

DRAIN_RISK = 0.85  # the seed's threshold: drain at once, whatever the costs

# -- defaults, for a job with no measurement of its own (seconds of the gang's time) ------
# C: one synchronous checkpoint. DESIGN.md 4 gives no figure; 2 minutes is this project's
# assumption (both downtime studies use it, through tasks.remediation.downtime_sim).
DEFAULT_CHECKPOINT_SAVE_S = 120.0
# R: an unplanned restart (detect, reschedule, reload, warm up). DESIGN.md 4: "restart
# overhead 5-20 minutes per failure at scale"; 10 minutes, inside that range.
DEFAULT_RESTART_S = 600.0
# M: a planned relaunch on a device reserved ahead (no detection, no waiting for a slot):
# 5 minutes, the low end of DESIGN.md 4's range.
DEFAULT_RELAUNCH_S = 300.0
# Interruptions per GPU-day: Llama 3 405B, 419 unexpected interruptions on 16,384 H100
# in 54 days (DESIGN.md 4; about 3.8e-3 per 8-GPU node-day). Only used for a job whose
# last checkpoint time is unknown: it is then assumed at the middle of its Young/Daly
# period T = sqrt(2 MTBF C).
GPU_FAILURES_PER_DAY = 419.0 / (16_384 * 54.0)
DAY_S = 86_400.0


def check_seconds(name: str, value: object) -> float:
    """A cost or a time in seconds: a finite number >= 0, else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 s, got {value}")
    return float(value)


def check_share(name: str, value: object, what: str = "a share") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be {what} in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return float(value)


def check_risk(name: str, value: object) -> float:
    return check_share(name, value, "a probability")


def check_horizon(value: object) -> float:
    h = check_seconds("horizon_s", value)
    if h <= 0:
        raise ValueError(f"horizon_s must be > 0 s, got {value}")
    return h


@dataclass(frozen=True)
class CostDefaults:
    """What a job without a measurement of its own is assumed to cost (seconds of the
    gang's time; see the module constants for where each comes from)."""

    checkpoint_save_s: float = DEFAULT_CHECKPOINT_SAVE_S
    restart_s: float = DEFAULT_RESTART_S
    relaunch_s: float = DEFAULT_RELAUNCH_S
    gpu_failures_per_day: float = GPU_FAILURES_PER_DAY
    # How long a cordon from a predicted risk holds the device, and the share of that time
    # it would have run work (0: the fleet has room to spare, 1: fully booked). No public
    # figure fixes either; 0 prices the move alone.
    cordon_hold_s: float = 0.0
    cordon_price: float = 0.0

    def __post_init__(self) -> None:
        for name in ("checkpoint_save_s", "restart_s", "relaunch_s", "cordon_hold_s"):
            check_seconds(name, getattr(self, name))
        check_share("cordon_price", self.cordon_price)
        rate = self.gpu_failures_per_day
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
            raise ValueError(f"gpu_failures_per_day must be a finite number, got {rate!r}")
        if rate <= 0:
            raise ValueError(f"gpu_failures_per_day must be > 0, got {rate}")

    @classmethod
    def of(cls, value: CostDefaults | Mapping[str, Any] | None) -> CostDefaults:
        """From a flow parameter or a CLI: None, a mapping of overrides, or the object;
        an unknown name or a bad value raises ValueError naming it."""
        if value is None:
            return cls()
        if isinstance(value, CostDefaults):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"costs must be a mapping of overrides, got {type(value).__name__}")
        unknown = sorted(set(value) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"unknown cost field(s) {unknown}: use {list(cls.__dataclass_fields__)}"
            )
        return cls(**dict(value))

    def cordon_gpu_s(self) -> float:
        """What a cordon costs the fleet when the device would not have failed (one device's
        GPU-seconds: a MIG slice's or vDCU's device is held whole)."""
        return self.cordon_hold_s * self.cordon_price

    def young_daly_s(self, gang_gpus: int) -> float:
        """T = sqrt(2 MTBF C) for a gang of ``gang_gpus`` (its MTBF: any GPU failing)."""
        mtbf_s = DAY_S / (self.gpu_failures_per_day * max(gang_gpus, 1))
        return math.sqrt(2.0 * mtbf_s * max(self.checkpoint_save_s, 1e-9))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class JobCosts:
    """One job on the device, in seconds of its gang's time. ``sources`` says where each
    number came from ("measured: ..." or "default: ..." with the reason)."""

    job_id: str
    gang_gpus: int
    since_checkpoint_s: float  # work lost if the device failed now
    checkpoint_save_s: float  # C: the gang stalls while it saves
    restart_s: float  # R: after an unplanned failure
    relaunch_s: float  # M: a planned move to a reserved device
    checkpoint_every_s: float | None = None  # its checkpoint period, where known
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        g = self.gang_gpus
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"gang_gpus must be an integer >= 1, got {g!r}")
        for name in ("since_checkpoint_s", "checkpoint_save_s", "restart_s", "relaunch_s"):
            check_seconds(name, getattr(self, name))
        if self.checkpoint_every_s is not None:
            if check_seconds("checkpoint_every_s", self.checkpoint_every_s) <= 0:
                raise ValueError(f"checkpoint_every_s must be > 0 s, got {self.checkpoint_every_s}")

    def lost_work_s(self, horizon_s: float) -> float:
        """Expected work lost (seconds of the gang) if the device fails within the horizon,
        the failure time uniform in it."""
        since, h, period = self.since_checkpoint_s, horizon_s, self.checkpoint_every_s
        if period is None:
            return since + h / 2.0

        # mean of ((since + t) mod period) for t in [0, h]: a periodic checkpoint saves
        # what came before it.
        def integral(x: float) -> float:  # of (u mod P) du from 0 to x
            k, r = divmod(x, period)
            return k * period * period / 2.0 + r * r / 2.0

        return (integral(since + h) - integral(since)) / h

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sources"] = dict(self.sources)
        return out


@dataclass(frozen=True)
class DeviceCosts:
    """What is at stake on one device: its jobs and the cluster's spare situation.

    ``jobs_known`` False: nobody looked (no inventory): the drain level alone decides.
    ``room_elsewhere``: free or spare units of the jobs' kind enough to move them now
    (None: not known). Without room, a planned move is no faster than an unplanned
    restart: the job waits for a slot either way, so relaunch costs the restart.
    ``cordon_gpu_s``: what cordoning it costs if it would not have failed (module doc)."""

    jobs: tuple[JobCosts, ...] = ()
    room_elsewhere: bool | None = None
    jobs_known: bool = True
    note: str = ""
    cordon_gpu_s: float = 0.0

    def __post_init__(self) -> None:
        check_seconds("cordon_gpu_s", self.cordon_gpu_s)


UNKNOWN_COSTS = DeviceCosts(jobs_known=False, note="jobs on the device not looked up")


@dataclass(frozen=True)
class Decision:
    """What the rule decided for one device, and the numbers it decided on."""

    action: str  # drain-now | act | watch
    risk: float
    horizon_s: float
    model: str
    drain_risk: float
    break_even_risk: float | None  # None: nothing to save (idle, or jobs unknown)
    expected_loss_gpu_s: float  # risk x what a failure within the horizon would cost
    act_cost_gpu_s: float  # checkpoint + relaunch of every job on the device
    failure_cost_gpu_s: float  # lost work + restart, if it fails
    decided_by: str  # "drain level", "cost rule", "device lost"/"device failed ..."
    why: str
    jobs: tuple[dict[str, Any], ...] = ()
    cordon_gpu_s: float = 0.0  # the cordon's cost if the device would not have failed

    @property
    def level(self) -> float:
        """The risk level this decision is measured against: the break-even risk where
        the cost rule applies, else the drain level."""
        if self.break_even_risk is None or self.break_even_risk >= self.drain_risk:
            return self.drain_risk
        return self.break_even_risk

    @property
    def remediates(self) -> bool:
        return self.action in REMEDIATING

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["jobs"] = [dict(j) for j in self.jobs]
        out["level"] = self.level
        return out

    def summary(self) -> str:
        """One line: which model, its risk at which horizon, and the rule's numbers."""
        be = "n/a" if self.break_even_risk is None else f"{self.break_even_risk:.4f}"
        return (
            f"{self.action} ({self.decided_by}): model {self.model or '?'} risk "
            f"{self.risk:.4f} within {self.horizon_s / 60:g} min; break-even {be}, drain "
            f"{self.drain_risk:g}; expected loss {self.expected_loss_gpu_s / 3600:.3f} "
            f"GPU-h vs acting {self.act_cost_gpu_s / 3600:.3f} GPU-h"
        )


def decide(
    risk: float,
    horizon_s: float,
    costs: DeviceCosts | None = None,
    *,
    model: str = "",
    drain_risk: float = DRAIN_RISK,
    forced: str | None = None,
) -> Decision:
    """The decision for one device at ``risk`` = P(fail within ``horizon_s``).

    ``costs`` None: the device's jobs are unknown (the drain level alone decides).
    ``forced``: the device is already lost or failed (the reason): drain now.
    Every input is checked first; a bad one raises ValueError naming it."""
    risk = check_risk("risk", risk)
    horizon_s = check_horizon(horizon_s)
    drain_risk = check_risk("drain_risk", drain_risk)
    if drain_risk <= 0:
        raise ValueError(f"drain_risk must be in (0, 1], got {drain_risk}")
    costs = UNKNOWN_COSTS if costs is None else costs
    move_cost = {}
    fail_cost = {}
    rows = []
    for job in costs.jobs:
        relaunch = job.relaunch_s
        relaunch_source = job.sources.get("relaunch_s", "")
        if costs.room_elsewhere is False and relaunch < job.restart_s:
            relaunch = job.restart_s
            relaunch_source = "no free or spare unit to move to: waits like a restart"
        move_cost[job.job_id] = job.gang_gpus * (job.checkpoint_save_s + relaunch)
        fail_cost[job.job_id] = job.gang_gpus * (job.lost_work_s(horizon_s) + job.restart_s)
        rows.append(
            job.to_dict()
            | {
                "relaunch_s": relaunch,
                "lost_work_s": round(job.lost_work_s(horizon_s), 3),
                "sources": {**dict(job.sources), "relaunch_s": relaunch_source},
            }
        )
    act_cost = float(sum(move_cost.values()))
    failure_cost = float(sum(fail_cost.values()))
    loss = risk * failure_cost
    # An idle device has nothing to move and nothing to save: its cordon is not weighed.
    cordon = costs.cordon_gpu_s if failure_cost > 0 else 0.0
    break_even = (act_cost + cordon) / (failure_cost + cordon) if failure_cost > 0 else None
    acting = act_cost + (1.0 - risk) * cordon

    def made(action: str, decided_by: str, why: str) -> Decision:
        return Decision(
            action=action,
            risk=risk,
            horizon_s=horizon_s,
            model=model,
            drain_risk=drain_risk,
            break_even_risk=None if break_even is None else round(break_even, 6),
            expected_loss_gpu_s=round(loss, 3),
            act_cost_gpu_s=round(act_cost, 3),
            failure_cost_gpu_s=round(failure_cost, 3),
            decided_by=decided_by,
            why=why,
            jobs=tuple(rows),
            cordon_gpu_s=round(cordon, 3),
        )

    if forced:
        return made(DRAIN, forced, f"{forced}: drain now")
    if risk >= drain_risk:
        return made(DRAIN, "drain level", f"risk {risk:.4f} >= drain level {drain_risk:g}")
    if break_even is None:
        if not costs.jobs_known:
            why = f"{costs.note or 'jobs unknown'}: only the drain level ({drain_risk:g}) acts"
        else:
            why = f"idle: nothing to save; cordoned only at the drain level ({drain_risk:g})"
        return made(WATCH, "drain level", why)
    with_cordon = f", the cordon's {(1.0 - risk) * cordon:.0f} in it" if cordon else ""
    if loss > acting:
        return made(
            ACT,
            "cost rule",
            f"risk {risk:.4f} > break-even {break_even:.4f}: expected loss "
            f"{loss:.0f} GPU-s > acting {acting:.0f} GPU-s{with_cordon}",
        )
    return made(
        WATCH,
        "cost rule",
        f"risk {risk:.4f} <= break-even {break_even:.4f}: acting ({acting:.0f} GPU-s"
        f"{with_cordon}) costs more than the expected loss ({loss:.0f} GPU-s)",
    )


def most_urgent(decisions: Iterable[Decision]) -> Decision:
    """Of one device's decisions at several horizons (a multi-horizon model scores each),
    the one to follow: the most urgent action, then the largest risk over its level."""
    ranked = sorted(
        decisions, key=lambda d: (ACTIONS.index(d.action), -d.risk / max(d.level, 1e-12))
    )
    if not ranked:
        raise ValueError("no decision to choose from")
    return ranked[0]


__all__ = [
    "ACT",
    "DRAIN",
    "DRAIN_RISK",
    "REMEDIATING",
    "WATCH",
    "CostDefaults",
    "Decision",
    "DeviceCosts",
    "JobCosts",
    "decide",
    "most_urgent",
]
