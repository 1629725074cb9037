"""The DVFS controller: per device, probe a few power limits, apply the best, watch it.

One ``tick()`` per sampling interval (>= 5 s, the seed's advice: NVML's energy counter and
the power-capping loop need seconds to say anything). Each tick:

1. renews the settings ledger's hold (DeviceSettings.renew) and notices devices whose hold
   a restorer took over (the controller lapsed): it starts over on them;
2. finds the devices to control: each leased (wholly or by a partition) by exactly one
   job that is running and publishes progress (Inventory.report_progress,
   tasks.energy.progress); a device whose settings row belongs to another live holder is
   left alone, and the tick's report says why: the job pins its own setting or tunes
   itself (its row is held under its job id), or another controller runs there;
3. puts back the devices whose job ended or changed (its device goes to the next job's
   search from scratch);
4. moves each device's state machine one interval on:

       new job ─ the highest setting; ``warmup_s`` of the job unmeasured (its start is
                 not its pace; not after a drift: the job is warm by then)
                 ─ probe: apply the search's next setting ─ settle one interval
                 ─ measure one interval (the highest setting, the reference:
                   ``reference_intervals`` of them, whose spread is the noise that guards
                   every comparison) ─ tell the search ─ (next probe | closing)
       closing ─ the highest setting again, settle, measure one interval (A-B-A: the
                 job's pace may have moved while the probes ran, a warm-up say; the faster
                 of the two references judges the bound, optimizer.tell_closing_reference)
                 ─ choice
       choice ─ apply it ─ settle ─ watch: measure every interval at the chosen setting
       watch ─ drifted beyond ``hysteresis`` (or three standard deviations of the
             measured noise, if larger) for ``drift_intervals`` intervals in a row
             ─ a new search (one noisy interval resets nothing)

A measurement is per unit of work: the time per unit from the job's own progress
timestamps (so the controller's polling lag does not count), the average power from the
device's energy counter over the window, and energy per unit = power x time per unit.

``stop()`` puts every device back (restore_all). A controller killed without a stop leaves
rows that go stale by their TTL; the next run's ``restore_stale`` (run_controller does it
first) puts those devices back. Plain Python, no Prefect: flows/dvfs.py runs it.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from gpuflow.hardware.backend import Backend, HardwareError, InvalidRequestError
from gpuflow.hardware.inventory import Inventory, JobProgress, JobState, SettingsConflictError
from gpuflow.tasks.energy.controller_report import (
    Action,
    ControllerRun,
    Decision,
    DeviceEvent,
    TickReport,
    Totals,
)
from gpuflow.tasks.energy.optimizer import (
    DEFAULT_MARGIN,
    Choice,
    Measurement,
    Objective,
    SettingSearch,
)
from gpuflow.tasks.energy.settings import DeviceSettings, SettingsRestoreError, restore_stale
from gpuflow.tasks.energy.tuner import DEFAULT_GRID_STEP_W, power_limit_grid

MIN_INTERVAL_S = 5.0  # the seed's advice; the energy counter needs seconds
DEFAULT_HYSTERESIS = 0.10  # relative change of time or power per unit that counts as drift
DEFAULT_DRIFT_INTERVALS = 3  # drifted intervals in a row before a new search
# Intervals measured at the highest setting before the first lower one: their mean is the
# reference, their spread the noise that guards every comparison and the drift test
# (optimizer.GUARD_Z, DRIFT_Z). They cost the job no time: it runs at full speed.
DEFAULT_REFERENCE_INTERVALS = 3
# A new job runs this long at the highest setting before anything is measured: its first
# seconds (process and framework start, compilation, data loading, a device heating up, the
# twin's pacing filling its window) are not its pace. Measured on `gpuflow bench energy`:
# without it the pace moved 5-10 % during the search, more than the 3-10 % a limit changes
# it by, and the guard kept the maximum (docs/energy.md).
DEFAULT_WARMUP_S = 30.0
TTL_INTERVALS = 4  # the hold outlives this many missed ticks before it goes stale
Slot = tuple[str, int]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Reading:
    t_s: float  # controller clock
    energy_mj: int
    units: float
    units_at_s: float  # when the job reached ``units`` (its clock)


@dataclass
class _Device:
    job_id: str
    attempt: int
    reason: str
    search: SettingSearch
    totals: Totals
    setting_w: float = 0.0
    phase: str = "settle"  # warmup | settle | measure | watch-settle | watch
    warm_until_s: float = 0.0  # warmup: the controller's clock when measuring may start
    window: _Reading | None = None
    choice: Choice | None = None
    drift: int = 0
    reference: list[Measurement] = field(default_factory=list)  # the highest setting's windows
    closing: bool = False  # measuring the highest setting again after the last probe


def _check_number(value: object, what: str, lo: float, *, integer: bool = False) -> float:
    ok_type = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
        raise InvalidRequestError(
            f"{what} must be a {'whole ' if integer else ''}number, got {value!r}"
        )
    if value < lo:
        raise InvalidRequestError(f"{what} must be >= {lo:g}, got {value!r}")
    return float(value)


def check_interval_s(interval_s: object) -> float:
    """``interval_s`` if it is a sampling interval the controller accepts (>= 5 s)."""
    seconds = _check_number(interval_s, "interval_s", 0.0)
    if seconds < MIN_INTERVAL_S:
        raise InvalidRequestError(
            f"interval_s {seconds:g} s is below {MIN_INTERVAL_S:g} s: the energy counter and "
            "the power-capping loop need seconds per sample (the seed's advice)"
        )
    return seconds


class DvfsController:
    """Power limits per device and job (module docstring). ``clock`` is the time the
    device's energy counter integrates over (the twin's sim time on the twin)."""

    def __init__(
        self,
        backend: Backend,
        inventory: Inventory,
        settings: DeviceSettings,
        objective: Objective | None = None,
        *,
        interval_s: float = MIN_INTERVAL_S,
        hysteresis: float = DEFAULT_HYSTERESIS,
        drift_intervals: int = DEFAULT_DRIFT_INTERVALS,
        grid_step_w: float = DEFAULT_GRID_STEP_W,
        margin: float = DEFAULT_MARGIN,
        max_probes: int | None = None,
        reference_intervals: int = DEFAULT_REFERENCE_INTERVALS,
        warmup_s: float = DEFAULT_WARMUP_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.interval_s = check_interval_s(interval_s)
        self.warmup_s = _check_number(warmup_s, "warmup_s", 0.0)
        self.reference_intervals = int(
            _check_number(reference_intervals, "reference_intervals", 1, integer=True)
        )
        self.hysteresis = _check_number(hysteresis, "hysteresis", 0.0)
        self.drift_intervals = int(
            _check_number(drift_intervals, "drift_intervals", 1, integer=True)
        )
        self.grid_step_w = _check_number(grid_step_w, "grid_step_w", 1.0)
        if max_probes is not None:
            _check_number(max_probes, "max_probes", 2, integer=True)
        if settings.ttl_s <= 2 * self.interval_s:
            raise InvalidRequestError(
                f"the settings hold ({settings.ttl_s:g} s) must outlast two sampling intervals "
                f"({2 * self.interval_s:g} s), or it lapses between two ticks"
            )
        if not callable(clock):
            raise InvalidRequestError(f"clock must be a callable returning seconds, got {clock!r}")
        self.objective = objective or Objective()
        self.backend, self.inventory, self.settings = backend, inventory, settings
        self.margin, self.max_probes, self._clock = margin, max_probes, clock
        self._devices: dict[Slot, _Device] = {}
        self._unrestored: set[Slot] = set()  # restores that failed: retried each tick
        self.decisions: list[Decision] = []
        self.totals: list[Totals] = []

    # -- one sampling interval ---------------------------------------------------------
    def tick(self) -> TickReport:
        """Move every device one sampling interval on (module docstring)."""
        report = TickReport(self._clock())
        self.settings.renew()
        held = {(r.node, r.index) for r in self.settings.held()}
        for slot in sorted(self._unrestored):
            self._restore(slot, None, report, "retrying a failed restore")
        jobs = self._candidates(report)
        for slot, dev in list(self._devices.items()):
            now_job = jobs.get(slot)
            if now_job is None or now_job[:2] != (dev.job_id, dev.attempt):
                why = "its job ended" if now_job is None else f"its job is now {now_job[0]}"
                self._restore(slot, dev.job_id, report, why)
                self._forget(slot)
            elif dev.setting_w and slot not in held:
                self._event(report, slot, dev.job_id, "lost", "a restorer took our hold over")
                self._forget(slot)
        pinned = self._pinned(set(jobs))
        for slot, (job_id, attempt, progress) in sorted(jobs.items()):
            if slot in pinned:
                self._event(report, slot, job_id, "pinned", pinned[slot])
                self._forget(slot)
                continue
            try:
                self._step(slot, job_id, attempt, progress, report)
            except SettingsConflictError as exc:  # someone pinned it since we looked
                self._event(report, slot, job_id, "pinned", str(exc))
                self._forget(slot)
            except HardwareError as exc:
                self._event(report, slot, job_id, "error", str(exc))
                self._restore(slot, job_id, report, "after an error")
                self._forget(slot)
        return report

    def stop(self) -> list[dict[str, object]]:
        """Put every device this holder changed back (restore_all) and forget them."""
        for slot in list(self._devices):
            self._forget(slot)
        self._unrestored.clear()
        return [
            {"device": f"{o.node}:{o.index}", "status": o.status, "detail": o.detail}
            for o in self.settings.restore_all()
        ]

    # -- which devices -----------------------------------------------------------------
    def _candidates(self, report: TickReport) -> dict[Slot, tuple[str, int, JobProgress]]:
        """slot -> (job, attempt, progress) of the devices to control this tick."""
        nodes = {n.name for n in self.backend.discover()}
        running = {j.job_id: j for j in self.inventory.jobs(JobState.RUNNING)}
        owners: dict[Slot, set[str]] = {}
        for lease in self.inventory.leases():
            if lease.node in nodes and lease.device_index is not None:
                owners.setdefault((lease.node, lease.device_index), set()).add(lease.owner)
        out: dict[Slot, tuple[str, int, JobProgress]] = {}
        for slot, who in sorted(owners.items()):
            jobs = sorted(w for w in who if w in running)
            if not jobs:
                continue
            if len(who) > 1:  # a power limit is the whole device's: no one job to time
                self._event(report, slot, None, "skipped", f"shared by {', '.join(sorted(who))}")
                continue
            job = running[jobs[0]]
            progress = self.inventory.job_progress(job.job_id)
            if progress is None:
                self._event(report, slot, job.job_id, "skipped", "its job publishes no progress")
                continue
            out[slot] = (job.job_id, job.attempt, progress)
        return out

    def _pinned(self, slots: set[Slot]) -> dict[Slot, str]:
        """slot -> why, for the slots whose row another live holder owns."""
        rows = {(r.node, r.index): r for r in self.inventory.settings(nodes={n for n, _ in slots})}
        others = {s: r for s, r in rows.items() if s in slots and r.holder != self.settings.holder}
        if not others:
            return {}
        stale = {
            (r.node, r.index) for r in self.inventory.stale_settings(nodes={n for n, _ in others})
        }
        return {
            s: f"settings held by {r.holder!r} (a job pinning or tuning its own, or another "
            "controller): left alone"
            for s, r in others.items()
            if s not in stale  # a stale row is put back by the next apply (DeviceSettings)
        }

    # -- the state machine -------------------------------------------------------------
    def _step(
        self, slot: Slot, job_id: str, attempt: int, progress: JobProgress, report: TickReport
    ) -> None:
        dev = self._devices.get(slot)
        if dev is None:
            self._start(slot, job_id, attempt, "new job", report)
            return
        if dev.phase == "warmup":
            if report.at_s < dev.warm_until_s:
                left = dev.warm_until_s - report.at_s
                self._event(report, slot, job_id, "waiting", f"warm-up, {left:.0f} s left")
                return
            dev.phase = "settle"  # warm and at the highest setting: the window opens now
        reading = _Reading(
            report.at_s,
            self.backend.energy_mj(*slot),
            progress.units_done,
            progress.updated_at_s,
        )
        if dev.phase in ("settle", "watch-settle"):
            dev.window = reading
            dev.phase = "measure" if dev.phase == "settle" else "watch"
            self._event(report, slot, job_id, "measuring", "window opened", dev.setting_w)
            return
        m = self._measure(dev, reading)
        if m is None:
            self._event(report, slot, job_id, "waiting", "no progress in the window yet")
            return  # the window stays open: the next tick measures a longer one
        if dev.phase == "measure":
            self._event(report, slot, job_id, "measured", _describe(m), dev.setting_w)
            if dev.closing:
                dev.search.tell_closing_reference(m)
                self._choose(slot, dev, reading, report)
                return
            if dev.search.probes:
                dev.search.tell(m)
            else:  # the reference: several intervals at once, for its noise too
                dev.reference.append(m)
                if len(dev.reference) < self.reference_intervals:
                    dev.window = reading  # the same setting: the next window starts here
                    return
                dev.search.tell_reference(dev.reference)
            nxt = dev.search.next_probe()
            if nxt is not None:
                self._apply(slot, dev, nxt, "settle", reading)
                self._event(report, slot, job_id, "probe", "next probe", nxt)
                return
            if len(dev.search.probes) > 1:  # A-B-A: the highest setting once more
                dev.closing = True
                top = dev.search.grid[-1]
                self._apply(slot, dev, top, "settle", reading)
                self._event(report, slot, job_id, "probe", "closing reference", top)
                return
            self._choose(slot, dev, reading, report)
            return
        # watch: at the chosen setting, every interval
        assert dev.choice is not None
        drifted = dev.choice.drifted(m, self.hysteresis)
        dev.drift = dev.drift + 1 if drifted else 0
        dev.window = reading
        detail = f"{_describe(m)}; drifted {dev.drift}/{self.drift_intervals}"
        self._event(report, slot, job_id, "watch", detail, dev.setting_w)
        if dev.drift >= self.drift_intervals:
            self._event(report, slot, job_id, "redecide", f"drifted {dev.drift} intervals in a row")
            self._start(slot, job_id, attempt, "drift", report)

    def _start(
        self, slot: Slot, job_id: str, attempt: int, reason: str, report: TickReport
    ) -> None:
        grid = power_limit_grid(self.backend.power_limits(*slot), self.grid_step_w)
        search = SettingSearch(grid, self.objective, margin=self.margin, max_probes=self.max_probes)
        old = self._devices.get(slot)
        totals = old.totals if old is not None else self._new_totals(slot, job_id)
        dev = _Device(job_id, attempt, reason, search, totals)
        self._devices[slot] = dev
        first = search.next_probe()
        assert first is not None  # a fresh search always has its highest setting to probe
        warm = reason == "new job" and self.warmup_s > 0
        self._apply(slot, dev, first, "warmup" if warm else "settle", None)
        dev.warm_until_s = report.at_s + self.warmup_s
        self._event(report, slot, job_id, "probe", f"search ({reason}) starts", first)

    def _choose(self, slot: Slot, dev: _Device, reading: _Reading, report: TickReport) -> None:
        choice = dev.search.choice()
        dev.choice, dev.drift = choice, 0
        dev.totals.setting_w = choice.chosen.setting
        settled = choice.chosen.setting == dev.setting_w  # measured last: no new settle
        self._apply(
            slot, dev, choice.chosen.setting, "watch" if settled else "watch-settle", reading
        )
        decision = Decision(*slot, dev.job_id, dev.reason, report.at_s, choice)
        self.decisions.append(decision)
        report.decisions.append(decision)
        detail = (
            f"{len(choice.probes)} probes of {len(dev.search.grid)} settings; saves "
            f"{choice.energy_saving:.1%} at {choice.slowdown:+.1%} time"
        )
        self._event(report, slot, dev.job_id, "chosen", detail, choice.chosen.setting)

    def _apply(
        self, slot: Slot, dev: _Device, setting_w: float, phase: str, reading: _Reading | None
    ) -> None:
        if setting_w != dev.setting_w:
            self.settings.apply_power_limit(*slot, int(round(setting_w * 1000)))
        dev.setting_w, dev.phase = setting_w, phase
        # Unchanged setting (the choice was the last probe): measure from here at once.
        dev.window = reading if phase == "watch" else None

    def _measure(self, dev: _Device, r: _Reading) -> Measurement | None:
        w = dev.window
        assert w is not None
        dt, du = r.t_s - w.t_s, r.units - w.units
        energy_j = (r.energy_mj - w.energy_mj) / 1000.0
        if du <= 0 or dt <= 0 or energy_j <= 0:
            return None
        job_dt = r.units_at_s - w.units_at_s
        per_unit_s = (job_dt if job_dt > 0 else dt) / du
        power_w = energy_j / dt
        dev.totals.add(energy_j, dt, dt / per_unit_s)
        return Measurement(dev.setting_w, per_unit_s, power_w * per_unit_s)

    # -- putting back ------------------------------------------------------------------
    def _restore(self, slot: Slot, job_id: str | None, report: TickReport, why: str) -> None:
        try:
            outcome = self.settings.restore(*slot)
        except SettingsRestoreError as exc:
            self._unrestored.add(slot)
            self._event(report, slot, job_id, "error", f"{why}: {exc}")
            return
        self._unrestored.discard(slot)
        if outcome is not None:
            self._event(report, slot, job_id, "restored", f"{why}: {outcome.status}")

    def _forget(self, slot: Slot) -> None:
        self._devices.pop(slot, None)

    def _new_totals(self, slot: Slot, job_id: str) -> Totals:
        totals = Totals(*slot, job_id)
        self.totals.append(totals)
        return totals

    @staticmethod
    def _event(
        report: TickReport,
        slot: Slot,
        job_id: str | None,
        action: Action,
        detail: str,
        setting_w: float | None = None,
    ) -> None:
        report.events.append(DeviceEvent(slot[0], slot[1], job_id, action, detail, setting_w))


def _describe(m: Measurement) -> str:
    return f"{m.time_s * 1000:.1f} ms and {m.energy_j:.2f} J per unit, {m.power_w:.0f} W"


def run_controller(
    backend: Backend,
    inventory: Inventory,
    *,
    objective: Objective | None = None,
    interval_s: float = MIN_INTERVAL_S,
    duration_s: float = 3600.0,
    holder: str | None = None,
    ttl_s: float | None = None,
    hysteresis: float = DEFAULT_HYSTERESIS,
    drift_intervals: int = DEFAULT_DRIFT_INTERVALS,
    warmup_s: float = DEFAULT_WARMUP_S,
    clock: Callable[[], float] | None = None,
    wait: Callable[[float], object] = time.sleep,
    on_tick: Callable[[TickReport], None] | None = None,
) -> ControllerRun:
    """Run the controller for ``duration_s`` (of ``clock``): put back first what a killed
    predecessor left (restore_stale), tick every ``interval_s``, and put every device back
    at the end, on an exception or a cancel too. ``clock``: default the twin's sim time
    where the backend has one (its energy counter integrates over it), else time.time;
    ``wait(seconds)`` between ticks (the twin's ``advance`` fast-forwards instead)."""
    interval = check_interval_s(interval_s)
    duration = _check_number(duration_s, "duration_s", 0.0)
    holder = holder or f"dvfs:{uuid.uuid4().hex[:12]}"
    ttl = TTL_INTERVALS * interval if ttl_s is None else ttl_s
    now = clock or getattr(backend, "now_s", None) or time.time
    settings = DeviceSettings(backend, inventory, holder, ttl_s=ttl)  # validates first
    controller = DvfsController(
        backend,
        inventory,
        settings,
        objective,
        interval_s=interval,
        hysteresis=hysteresis,
        drift_intervals=drift_intervals,
        warmup_s=warmup_s,
        clock=now,
    )
    cleaned = [_outcome(o) for o in restore_stale(inventory, backend)]
    ticks, restored = 0, []
    try:
        end = now() + duration
        while True:
            report = controller.tick()
            ticks += 1
            if on_tick is not None:
                on_tick(report)
            if now() + interval > end:
                break
            wait(interval)
    finally:
        restored = controller.stop()
    return ControllerRun(cleaned, controller.decisions, controller.totals, restored, ticks, holder)


def _outcome(o: object) -> dict[str, object]:
    d = asdict(o)  # type: ignore[call-overload]
    d.pop("record", None)
    return d
