"""A training job's energy: what its device drew, and the power limit the job asked for.

TrainSpec.energy says who sets the job's power limit:

* ``managed`` (default): not the job; the DVFS controller may (flows/dvfs.py);
* ``tune``: the job itself, with the InTrainingTuner (tasks.energy.tuner) in its first steps;
* ``pinned``: the job runs at ``power_limit_w`` and holds the device's settings row, so the
  controller leaves the device alone.

Changes go through DeviceSettings under the job's id: the limit goes back when the job ends
(``close``, in the job's ``finally``), and restore_stale puts it back once the job's lease is
gone if the process died. Whatever the mode, the device's energy counter is read at the
start and the end, so every run records energy (J), average power, energy per sample and
time per step. Single-device jobs: a gang's ranks are managed by the controller.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuflow.hardware.backend import Backend, HardwareError
from gpuflow.tasks.energy.optimizer import Objective
from gpuflow.tasks.energy.settings import DeviceSettings
from gpuflow.tasks.energy.tuner import EnergyMeter, InTrainingTuner

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import StepInfo, TrainResult
    from gpuflow.tasks.training.spec import TrainSpec

# The job's rows are held while its lease lives (a job holder goes stale with its lease);
# the TTL is renewed from the step hook, well inside it.
SETTINGS_TTL_S = 600.0
RENEW_EVERY_S = SETTINGS_TTL_S / 4
# A job that sets its own limit waits this long for a controller's row on its device to go
# (the controller restores it at its next tick, 5 s apart; its rows lapse after 4 ticks).
CLAIM_TIMEOUT_S = 60.0
CLAIM_POLL_S = 0.5
# When the tuner searches again: this many windows in a row off by more than the tolerance.
TUNER_DRIFT: dict[str, float | int] = {"drift_tolerance": 0.25, "drift_windows": 3}
# Windows at the highest limit that make the tuner's reference and measure its noise.
TUNER_REFERENCE_WINDOWS = 3
# The tuner's phases, (at least steps, at least seconds) each (tasks.energy.tuner).
TUNER_PHASES: dict[str, tuple[int, float]] = {
    "warmup": (5, 2.0),
    "settle": (2, 0.5),
    "probe": (5, 2.0),
}


class JobEnergy:
    """Energy accounting and power-limit control of one single-device training attempt."""

    def __init__(
        self,
        spec: TrainSpec,
        backend: Backend,
        inventory: Any,
        node: str,
        index: int,
        on_setting_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec, self.backend, self.node, self.index = spec, backend, node, index
        self.inventory, self.sleep = inventory, sleep
        self.on_setting_change = on_setting_change
        self.clock = clock
        self.meter = EnergyMeter(backend, node, index)
        self.settings: DeviceSettings | None = None
        self.tuner: InTrainingTuner | None = None
        self.hooks: list[Callable[[StepInfo], None]] = []
        if spec.energy != "managed":
            self.settings = DeviceSettings(backend, inventory, spec.job_id, ttl_s=SETTINGS_TTL_S)
            self._renewed_at = clock()
            self.hooks.append(self._renew)
        if spec.energy == "tune":
            self.tuner = InTrainingTuner(
                backend,
                self.settings,  # type: ignore[arg-type]
                node,
                index,
                Objective(slowdown=spec.energy_slowdown),
                on_setting_change=on_setting_change,
                reference_windows=TUNER_REFERENCE_WINDOWS,
                **TUNER_PHASES,
                **TUNER_DRIFT,
            )
            self.hooks.append(self.tuner)

    def _wait_for_row(self) -> None:
        deadline = self.clock() + CLAIM_TIMEOUT_S
        while True:
            row = self.inventory.setting(self.node, self.index)
            if row is None or row.holder == self.spec.job_id:
                return
            if self.clock() >= deadline:
                raise HardwareError(
                    f"{self.node}:{self.index}: its power settings are held by {row.holder!r}; "
                    f"job {self.spec.job_id!r} (energy {self.spec.energy!r}) waited "
                    f"{CLAIM_TIMEOUT_S:g} s for them and changed nothing"
                )
            self.sleep(CLAIM_POLL_S)

    def _renew(self, info: StepInfo) -> None:
        if self.settings is not None and self.clock() - self._renewed_at >= RENEW_EVERY_S:
            self.settings.renew()
            self._renewed_at = self.clock()

    def start(self) -> None:
        if self.settings is not None:
            # Claim the device's row before the first step: a controller that still holds it
            # for the device's previous job puts it back at its next tick; once the row is
            # the job's, the controller leaves the device alone (it is pinned).
            self._wait_for_row()
            if self.spec.energy == "pinned":
                limit_mw = round((self.spec.power_limit_w or 0.0) * 1000)
            else:  # tune: its first probe is the highest limit anyway
                limit_mw = self.backend.power_limits(self.node, self.index).max_limit_mw
            self.settings.apply_power_limit(self.node, self.index, limit_mw)
            self.on_setting_change()
        try:
            self.meter.start()
        except HardwareError:
            pass  # a device without an energy counter: the run records no energy

    def finish(self, result: TrainResult, run_id: str | None = None) -> None:
        """Fill result.energy (and, with ``run_id``, log the tuner's evidence)."""
        steps = result.steps_done - result.resumed_from_step
        if not self.meter.running or steps <= 0:
            return
        limit_w = self.backend.power_limits(self.node, self.index).limit_mw / 1000.0
        try:
            m = self.meter.stop(limit_w, steps)
        except (HardwareError, ValueError):
            return  # nothing measurable (a counter that did not move)
        batch = self.spec.resolved_batch_size
        energy: dict[str, Any] = {
            "energy_j": m.energy_j * steps,
            "average_power_w": m.power_w,
            "energy_per_sample_j": m.energy_j / batch,
            "time_per_step_s": m.time_s,
            "power_limit_w": limit_w,
        }
        decisions = self.tuner.decisions if self.tuner is not None else []
        if decisions:
            c = decisions[-1]  # the latest (a drift may have searched again)
            energy.update(
                tune_decisions=float(len(decisions)),
                tuned_power_limit_w=c.chosen.setting,
                tuned_energy_saving=c.energy_saving,
                tuned_slowdown=c.slowdown,
                tune_probes=float(len(c.probes)),
                tuner=c.to_dict(),
            )
            if run_id:
                from gpuflow.tasks.energy.record import log_choice

                for i, d in enumerate(decisions):
                    log_choice(run_id, d, "tuner", where=f"energy/tuner/decision-{i}", step=i)
        result.energy = energy

    def close(self) -> None:
        if self.settings is not None:
            self.settings.restore_all()
            self.on_setting_change()
